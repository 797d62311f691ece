"""The model's layers with TransformerLens hooks: attention, MLP, LayerNorm, block, unembedding.

The layers of :class:`~mhainterp.model.HookedMHATransformer`, each an ``nn.Module`` with
TransformerLens's hook points and a forward with shape comments; the model
(:mod:`mhainterp.model.transformer`) embeds the tokens, runs the blocks and unembeds. Their
attribute names are the state_dict keys of saved runs (``blocks.0.attn.q_proj.weight``, ...)
and the fast paths read them by name, so they do not change.

These forwards are part of THE reference forward (see :mod:`mhainterp.model.transformer`); the
same fenced copies follow them: ``mhainterp.fast.stacked`` and ``mhainterp.fast.linear_readout``
(after ``hook_z``). A commit that changes a forward here names them.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from mhainterp.config import ModelConfig
from mhainterp.model.weight_views import AttentionWeightViews

__all__ = [
    "LayerNorm",
    "MLP",
    "MultiHeadAttention",
    "TransformerBlock",
    "Unembed",
    "init_linear",
    "merge_heads",
    "norm_layer",
    "split_heads",
]


def split_heads(x: Float[Tensor, "B T d_model"], n_heads: int) -> Float[Tensor, "B h T d_head"]:
    """Split the last axis into heads: ``reshape(B, T, h, d_head)`` then ``transpose(1, 2)``.

    The tempting ``x.reshape(B, h, T, d_head)`` has the right shape but mixes positions into
    heads; it raises no error and silently hurts training (seed 000, "beginner pitfalls").
    """
    B, T, d_model = x.shape
    return x.reshape(B, T, n_heads, d_model // n_heads).transpose(1, 2)


def merge_heads(x: Float[Tensor, "B h T d_head"]) -> Float[Tensor, "B T d_model"]:
    """Inverse of :func:`split_heads` (concatenate the heads along the last axis)."""
    B, h, T, d_head = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_head)


def init_linear(linear: nn.Linear, generator: torch.Generator) -> None:
    """nn.Linear's default init (U(-1/sqrt(fan_in), 1/sqrt(fan_in))), drawn from ``generator``.

    Example:
        >>> layer = nn.Linear(4, 1)
        >>> init_linear(layer, torch.Generator().manual_seed(0))
        >>> bool(layer.weight.abs().max() <= 0.5)
        True
    """
    bound = 1.0 / math.sqrt(linear.in_features)
    nn.init.uniform_(linear.weight, -bound, bound, generator=generator)
    if linear.bias is not None:
        nn.init.uniform_(linear.bias, -bound, bound, generator=generator)


class MultiHeadAttention(AttentionWeightViews, nn.Module):
    """All heads at once: fused ``d_model x d_model`` Q, K, V, O projections (bias included).

    The head count only decides how the projected vectors are split, so the parameter count,
    ``4 * (d_model**2 + d_model)``, is the same for every ``n_heads``.

    Per-head views in TransformerLens layout (``W_Q, W_K, W_V: [h, d_model, d_head]``,
    ``W_O: [h, d_head, d_model]``, ``b_Q, b_K, b_V: [h, d_head]``, ``b_O: [d_model]``) are
    computed from the fused weights (:class:`~mhainterp.model.weight_views.AttentionWeightViews`).
    Assigning to them (``attn.W_Q = w``) writes through into the fused weights, which is how
    tests build models with hand-set heads.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.n_heads = cfg.n_heads
        self.d_head = cfg.d_head
        d_model = cfg.d_model
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)
        if cfg.causal:
            future = torch.triu(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool), diagonal=1)
            self.register_buffer("future_mask", future, persistent=False)  # (n_ctx, n_ctx)
        else:
            self.future_mask = None

        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, head, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head, q_pos, k_pos], -inf where masked
        self.hook_pattern = HookPoint()  # [batch, head, q_pos, k_pos], rows sum to 1
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]

    def reset_parameters(self, generator: torch.Generator) -> None:
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            init_linear(linear, generator)

    def _project(self, linear: nn.Linear, x: Tensor) -> Float[Tensor, "B T h d_head"]:
        B, T = x.shape[:2]
        if x.ndim == 4:  # one input per head (use_split_qkv_input / use_attn_in): [B, T, h, d]
            weight = linear.weight.T.reshape(x.shape[-1], self.n_heads, self.d_head)
            bias = linear.bias.reshape(self.n_heads, self.d_head)
            return torch.einsum("bthm,mhd->bthd", x, weight) + bias  # (B, T, h, d_head)
        return linear(x).reshape(B, T, self.n_heads, self.d_head)  # (B, T, h, d_head)

    def forward(
        self,
        x: Float[Tensor, "B T d_model"] | Float[Tensor, "B T h d_model"],
        padding_mask: Bool[Tensor, "B T"] | None = None,
        *,
        key_input: Tensor | None = None,
        value_input: Tensor | None = None,
    ) -> Float[Tensor, "B T d_model"]:
        """Attend; ``padding_mask`` is True for real tokens, False for padding keys.

        ``x`` is the (normalised) query input, also used for keys and values unless
        ``key_input`` / ``value_input`` are given. Each may be ``[B, T, d_model]`` or, as with
        TransformerLens's ``use_split_qkv_input``, ``[B, T, h, d_model]`` (one copy per head).
        """
        T = x.shape[1]
        key_input = x if key_input is None else key_input
        value_input = x if value_input is None else value_input
        q = self.hook_q(self._project(self.q_proj, x))  # (B, T, h, d_head)
        k = self.hook_k(self._project(self.k_proj, key_input))  # (B, T, h, d_head)
        v = self.hook_v(self._project(self.v_proj, value_input))  # (B, T, h, d_head)

        # (B, h, T, d_head) @ (B, h, d_head, T) -> (B, h, T_q, T_k), scaled by sqrt(d_head)
        scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / math.sqrt(self.d_head)
        blocked = self._blocked_keys(T, padding_mask)  # (T, T) or (B, 1, T, T) or None
        if blocked is not None:
            scores = scores.masked_fill(blocked, float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = torch.softmax(scores, dim=-1)
        if padding_mask is not None:
            # A query that sees no key at all (only padding) would be NaN: attend nowhere.
            pattern = torch.nan_to_num(pattern, nan=0.0)
        pattern = self.hook_pattern(pattern)  # (B, h, T_q, T_k)

        z = self.hook_z((pattern @ v.transpose(1, 2)).transpose(1, 2))  # (B, T, h, d_head)
        return self.output_from_z(z)

    def head_results(self, z: Float[Tensor, "B T h d_head"]) -> Float[Tensor, "B T h d_model"]:
        """Each head's own write to the residual stream, ``z_h @ W_O[h]`` (what ``hook_result``
        holds when ``cfg.use_attn_result`` is on), computed from a ``hook_z`` value."""
        return torch.einsum("bthd,hdm->bthm", z, self.W_O)

    def output_from_z(self, z: Float[Tensor, "B T h d_head"]) -> Float[Tensor, "B T d_model"]:
        """Merge the heads and apply W_O (the part of the layer after ``hook_z``).

        As in TransformerLens, the per-head results (``hook_result``) are computed, and the hook
        fires, only when ``cfg.use_attn_result`` is True; otherwise the heads are merged first
        and one matmul applies W_O. Attaching a hook to ``hook_result`` does not switch paths:
        turn the flag on (``model.set_use_attn_result(True)``), or compute the results from
        ``hook_z`` with :meth:`head_results`.
        """
        if self.cfg.use_attn_result:
            result = self.hook_result(self.head_results(z))  # (B, T, h, d_model)
            return result.sum(dim=2) + self.o_proj.bias
        B, T = z.shape[:2]
        return self.o_proj(z.reshape(B, T, self.n_heads * self.d_head))  # merge, then W_O

    def _blocked_keys(self, T: int, padding_mask: Tensor | None) -> Tensor | None:
        """Boolean mask of the (query, key) pairs no head may attend to."""
        blocked = None if self.future_mask is None else self.future_mask[:T, :T]  # (T, T)
        if padding_mask is not None:
            pad_keys = ~padding_mask[:, None, None, :]  # (B, 1, 1, T_k)
            blocked = pad_keys if blocked is None else (blocked | pad_keys)  # (B, 1, T, T)
        return blocked


class MLP(nn.Module):
    """Position-wise feed-forward: d_model -> d_mlp -> act -> d_model.

    TransformerLens-layout views: ``W_in [d_model, d_mlp]``, ``b_in [d_mlp]``,
    ``W_out [d_mlp, d_model]``, ``b_out [d_model]`` (the weights stay ``fc_in``/``fc_out``).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.fc_out = nn.Linear(cfg.d_mlp, cfg.d_model)
        self.act = nn.ReLU() if cfg.act_fn == "relu" else nn.GELU()
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def reset_parameters(self, generator: torch.Generator) -> None:
        init_linear(self.fc_in, generator)
        init_linear(self.fc_out, generator)

    def forward(self, x: Float[Tensor, "B T d_model"]) -> Float[Tensor, "B T d_model"]:
        return self.fc_out(self.hook_post(self.act(self.hook_pre(self.fc_in(x)))))

    @property
    def W_in(self) -> Float[Tensor, "d_model d_mlp"]:
        return self.fc_in.weight.T

    @property
    def b_in(self) -> Float[Tensor, " d_mlp"]:
        return self.fc_in.bias

    @property
    def W_out(self) -> Float[Tensor, "d_mlp d_model"]:
        return self.fc_out.weight.T

    @property
    def b_out(self) -> Float[Tensor, " d_model"]:
        return self.fc_out.bias


class LayerNorm(nn.Module):
    """LayerNorm with TransformerLens's hooks; parameters named as ``torch.nn.LayerNorm``'s.

    ``hook_scale`` is ``sqrt(mean((x - mean(x))^2) + eps)`` ``[batch, pos, 1]`` and
    ``hook_normalized`` the centred input divided by it ``[batch, pos, d_model]``, before
    ``weight`` and ``bias`` are applied (as TransformerLens 4.x's normalization bridge and its
    ``LayerNormPre`` define them; this is what ``ActivationCache.apply_ln_to_stack`` divides
    by). The parameters keep ``nn.LayerNorm``'s names (``ln1.weight``, ``ln1.bias``) so saved
    runs and the stacked fast path read them unchanged; ``w``/``b`` are TransformerLens's names.

    Example:
        >>> ln = LayerNorm(ModelConfig(d_model=4))
        >>> ln(torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])).sum().abs() < 1e-6
        tensor(True)
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.eps = cfg.eps
        self.weight = nn.Parameter(torch.ones(cfg.d_model))
        self.bias = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        x = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.weight + self.bias

    def unhooked(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        """The same function without firing the hooks (for the per-head copies of the input)."""
        x = x - x.mean(dim=-1, keepdim=True)
        return x / (x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt() * self.weight + self.bias

    @property
    def w(self) -> Float[Tensor, " d_model"]:
        return self.weight

    @property
    def b(self) -> Float[Tensor, " d_model"]:
        return self.bias


def norm_layer(cfg: ModelConfig) -> nn.Module:
    """The normalisation ``cfg`` asks for: a :class:`LayerNorm` for ``"LN"``, else identity."""
    return LayerNorm(cfg) if cfg.normalization_type == "LN" else nn.Identity()


def _unhooked_norm(norm: nn.Module, x: Tensor) -> Tensor:
    return norm.unhooked(x) if isinstance(norm, LayerNorm) else norm(x)


class TransformerBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(ln1(x))`` then, unless attn_only, ``+ mlp(ln2(.))``.

    TransformerLens's optional hooks exist always and fire only behind its flags:
    ``hook_attn_in`` (``cfg.use_attn_in``) and ``hook_q_input``/``hook_k_input``/
    ``hook_v_input`` (``cfg.use_split_qkv_input``) hold the residual stream repeated per head,
    ``[batch, pos, head, d_model]``, before ln1; ``hook_mlp_in`` (``cfg.use_hook_mlp_in``) holds
    the MLP's input before ln2. With a per-head input, ln1's own hooks fire once on the shared
    ``hook_resid_pre`` (``[batch, pos, 1]``), as in TransformerLens 4.x.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1 = norm_layer(cfg)
        self.attn = MultiHeadAttention(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_in = HookPoint()  # [batch, pos, head, d_model], cfg.use_attn_in
        self.hook_q_input = HookPoint()  # [batch, pos, head, d_model], cfg.use_split_qkv_input
        self.hook_k_input = HookPoint()  # [batch, pos, head, d_model], cfg.use_split_qkv_input
        self.hook_v_input = HookPoint()  # [batch, pos, head, d_model], cfg.use_split_qkv_input
        self.hook_mlp_in = HookPoint()  # [batch, pos, d_model], cfg.use_hook_mlp_in (never
        # fires without an MLP; it exists, as in TransformerLens, so hooking it is no error)
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        if not cfg.attn_only:
            self.ln2 = norm_layer(cfg)
            self.mlp = MLP(cfg)
            self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
            self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]

    def forward(
        self, resid: Float[Tensor, "B T d_model"], padding_mask: Tensor | None = None
    ) -> Float[Tensor, "B T d_model"]:
        resid = self.hook_resid_pre(resid)
        cfg = self.cfg
        if not (cfg.use_attn_in or cfg.use_split_qkv_input):
            return self.after_attention(resid, self.attn(self.ln1(resid), padding_mask))
        attn_in = resid[:, :, None, :].repeat(1, 1, cfg.n_heads, 1)  # (B, T, h, d_model)
        if cfg.use_attn_in:
            attn_in = self.hook_attn_in(attn_in)
        q_in = k_in = v_in = attn_in
        if cfg.use_split_qkv_input:
            q_in = self.hook_q_input(attn_in.clone())
            k_in = self.hook_k_input(attn_in.clone())
            v_in = self.hook_v_input(attn_in.clone())
        self.ln1(resid)  # ln1's hooks see the shared residual stream once
        q_in, k_in, v_in = (_unhooked_norm(self.ln1, x) for x in (q_in, k_in, v_in))
        attn_out = self.attn(q_in, padding_mask, key_input=k_in, value_input=v_in)
        return self.after_attention(resid, attn_out)

    def after_attention(
        self, resid_pre: Float[Tensor, "B T d_model"], attn_out: Float[Tensor, "B T d_model"]
    ) -> Float[Tensor, "B T d_model"]:
        """The rest of the block once the attention output is known."""
        resid = resid_pre + self.hook_attn_out(attn_out)
        if not self.cfg.attn_only:
            resid = self.hook_resid_mid(resid)
            mlp_in = self.hook_mlp_in(resid.clone()) if self.cfg.use_hook_mlp_in else resid
            resid = resid + self.hook_mlp_out(self.mlp(self.ln2(mlp_in)))
        return self.hook_resid_post(resid)


class Unembed(nn.Linear):
    """The unembedding ``nn.Linear`` (keys ``unembed.weight``/``unembed.bias``) with
    TransformerLens's ``unembed.hook_in`` ``[batch, pos, d_model]`` and ``unembed.hook_out``
    ``[batch, pos, n_targets * d_vocab_out]``."""

    def __init__(self, d_model: int, n_out: int):
        super().__init__(d_model, n_out)
        self.hook_in = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, n_targets * d_vocab_out]

    def forward(self, x: Float[Tensor, "B T d_model"]) -> Float[Tensor, "B T n_out"]:
        return self.hook_out(super().forward(self.hook_in(x)))
