"""A small, hookable multi-head attention transformer for synthetic sequence tasks.

Readable top to bottom: embeddings -> ``n_layers`` blocks (attention, optional MLP, optional
pre-LayerNorm) -> unembedding to per-position class logits. Hook names, shapes and values follow
TransformerLens (checked against TL 4.x's own model in ``tests/test_tl_parity.py``), so
``run_with_cache``, ``run_with_hooks``, ``cache["pattern", 0]``, the ``ActivationCache`` helpers
(``decompose_resid``, ``stack_head_results``, ``accumulated_resid``, ``logit_attrs``, with
``apply_ln`` either way), ``transformer_lens.patching`` and ``transformer_lens.head_detector``
work on it unchanged. The intentional differences are listed in the README ("Coming from
TransformerLens").

Shapes: B batch, T positions, h heads, d_head = d_model / h, V classes.

This is THE reference forward. Derived copies that must follow any change to it (each tested
equal to it; a commit that changes the forward names them): ``mhainterp.fast.stacked`` (many
models trained in one batched step) and ``mhainterp.fast.linear_readout`` (ablated copies scored
through ``W_O[h] @ W_U`` after the last layer's ``hook_z``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule
from transformer_lens.hook_points import HookPoint

from mhainterp.config import ModelConfig
from mhainterp.heads import head_label, parse_head_label
from mhainterp.scoring import mean_loss

__all__ = [
    "LayerNorm",
    "MultiHeadAttention",
    "TransformerBlock",
    "HookedMHATransformer",
    "split_heads",
    "merge_heads",
    "head_label",
    "parse_head_label",
]

ReturnType = Literal["logits", "loss", "both"] | None


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


def _init_linear(linear: nn.Linear, generator: torch.Generator) -> None:
    """nn.Linear's default init (U(-1/sqrt(fan_in), 1/sqrt(fan_in))), drawn from ``generator``."""
    bound = 1.0 / math.sqrt(linear.in_features)
    nn.init.uniform_(linear.weight, -bound, bound, generator=generator)
    if linear.bias is not None:
        nn.init.uniform_(linear.bias, -bound, bound, generator=generator)


class MultiHeadAttention(nn.Module):
    """All heads at once: fused ``d_model x d_model`` Q, K, V, O projections (bias included).

    The head count only decides how the projected vectors are split, so the parameter count,
    ``4 * (d_model**2 + d_model)``, is the same for every ``n_heads``.

    Per-head views in TransformerLens layout (``W_Q, W_K, W_V: [h, d_model, d_head]``,
    ``W_O: [h, d_head, d_model]``, ``b_Q, b_K, b_V: [h, d_head]``, ``b_O: [d_model]``) are
    computed from the fused weights. Assigning to them (``attn.W_Q = w``) writes through into the
    fused weights, which is how tests build models with hand-set heads.
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
            _init_linear(linear, generator)

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

    # ----- TransformerLens-layout per-head views of the fused weights -----------------------
    def _in_view(self, linear: nn.Linear) -> Float[Tensor, "h d_model d_head"]:
        # linear computes x @ weight.T; the columns of weight.T are grouped head by head.
        return linear.weight.T.reshape(self.cfg.d_model, self.n_heads, self.d_head).permute(1, 0, 2)

    def _set_in_view(self, linear: nn.Linear, value: Tensor) -> None:
        expected = (self.n_heads, self.cfg.d_model, self.d_head)
        _check_shape(value, expected, "W_Q/W_K/W_V")
        with torch.no_grad():
            linear.weight.copy_(value.permute(1, 0, 2).reshape(self.cfg.d_model, -1).T)

    def _set_bias_view(self, linear: nn.Linear, value: Tensor) -> None:
        _check_shape(value, (self.n_heads, self.d_head), "b_Q/b_K/b_V")
        with torch.no_grad():
            linear.bias.copy_(value.reshape(-1))

    @property
    def W_Q(self) -> Float[Tensor, "h d_model d_head"]:
        return self._in_view(self.q_proj)

    @W_Q.setter
    def W_Q(self, value: Tensor) -> None:
        self._set_in_view(self.q_proj, value)

    @property
    def W_K(self) -> Float[Tensor, "h d_model d_head"]:
        return self._in_view(self.k_proj)

    @W_K.setter
    def W_K(self, value: Tensor) -> None:
        self._set_in_view(self.k_proj, value)

    @property
    def W_V(self) -> Float[Tensor, "h d_model d_head"]:
        return self._in_view(self.v_proj)

    @W_V.setter
    def W_V(self, value: Tensor) -> None:
        self._set_in_view(self.v_proj, value)

    @property
    def W_O(self) -> Float[Tensor, "h d_head d_model"]:
        return self.o_proj.weight.T.reshape(self.n_heads, self.d_head, self.cfg.d_model)

    @W_O.setter
    def W_O(self, value: Tensor) -> None:
        _check_shape(value, (self.n_heads, self.d_head, self.cfg.d_model), "W_O")
        with torch.no_grad():
            self.o_proj.weight.copy_(value.reshape(-1, self.cfg.d_model).T)

    @property
    def b_Q(self) -> Float[Tensor, "h d_head"]:
        return self.q_proj.bias.reshape(self.n_heads, self.d_head)

    @b_Q.setter
    def b_Q(self, value: Tensor) -> None:
        self._set_bias_view(self.q_proj, value)

    @property
    def b_K(self) -> Float[Tensor, "h d_head"]:
        return self.k_proj.bias.reshape(self.n_heads, self.d_head)

    @b_K.setter
    def b_K(self, value: Tensor) -> None:
        self._set_bias_view(self.k_proj, value)

    @property
    def b_V(self) -> Float[Tensor, "h d_head"]:
        return self.v_proj.bias.reshape(self.n_heads, self.d_head)

    @b_V.setter
    def b_V(self, value: Tensor) -> None:
        self._set_bias_view(self.v_proj, value)

    @property
    def b_O(self) -> Float[Tensor, " d_model"]:
        return self.o_proj.bias

    @b_O.setter
    def b_O(self, value: Tensor) -> None:
        _check_shape(value, (self.cfg.d_model,), "b_O")
        with torch.no_grad():
            self.o_proj.bias.copy_(value)

    @property
    def QK(self) -> FactoredMatrix:
        """``W_Q @ W_K^T`` per head, ``[h, d_model, d_model]`` (a ``FactoredMatrix``)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """``W_V @ W_O`` per head, ``[h, d_model, d_model]`` (a ``FactoredMatrix``)."""
        return FactoredMatrix(self.W_V, self.W_O)


def _check_shape(value: Tensor, expected: tuple[int, ...], name: str) -> None:
    if not isinstance(value, Tensor) or tuple(value.shape) != expected:
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a tensor of shape {expected}, got {got}")


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
        _init_linear(self.fc_in, generator)
        _init_linear(self.fc_out, generator)

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


def _norm(cfg: ModelConfig) -> nn.Module:
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
        self.ln1 = _norm(cfg)
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
            self.ln2 = _norm(cfg)
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


class HookedMHATransformer(HookedRootModule):
    """Token + learned position embedding -> blocks -> per-position class logits.

    A ``transformer_lens.HookedRootModule``: ``run_with_hooks``, ``hooks()`` and
    ``run_with_cache`` (returning a ``transformer_lens.ActivationCache``) work, with
    TransformerLens's hook names (see DESIGN.md, "Model contract"). As in TransformerLens, the
    optional hooks fire only behind their ``cfg`` flags: ``attn.hook_result`` behind
    ``use_attn_result`` (a plain forward and ``run_with_cache`` take the same path either way),
    the per-head inputs behind ``use_split_qkv_input`` / ``use_attn_in``, ``hook_mlp_in`` behind
    ``use_hook_mlp_in``; set them in the config or with ``set_use_attn_result(True)`` etc.

    Example:
        >>> cfg = ModelConfig(d_model=64, n_heads=4, n_ctx=16, d_vocab=10, d_vocab_out=16)
        >>> model = HookedMHATransformer(cfg)
        >>> logits, cache = model.run_with_cache(torch.randint(0, 10, (2, 16)))
        >>> logits.shape, cache["pattern", 0].shape
        (torch.Size([2, 16, 16]), torch.Size([2, 4, 16, 16]))
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = _norm(cfg)
        self.unembed = Unembed(cfg.d_model, cfg.n_targets * cfg.d_vocab_out)
        self.hook_unembed = HookPoint()  # [batch, pos, n_targets * d_vocab_out], TL 4.x's alias
        self.reset_parameters(cfg.seed)
        self.setup()  # registers hook points by name (HookedRootModule)
        self.to(device=cfg.device, dtype=cfg.dtype)

    def reset_parameters(self, seed: int) -> None:
        """Re-initialise every weight from one seed, in a fixed order (bit-reproducible)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            nn.init.normal_(self.embed.weight, 0.0, 1.0, generator=generator)
            nn.init.normal_(self.pos_embed.weight, 0.0, 1.0, generator=generator)
            for block in self.blocks:
                block.attn.reset_parameters(generator)
                if not self.cfg.attn_only:
                    block.mlp.reset_parameters(generator)
            _init_linear(self.unembed, generator)
            for module in self.modules():
                if isinstance(module, LayerNorm):
                    module.reset_parameters()

    # ----- forward ----------------------------------------------------------------------------
    def forward(
        self,
        tokens: Int[Tensor, "B T"],
        padding_mask: Bool[Tensor, "B T"] | None = None,
        *,
        return_type: ReturnType = "logits",
        targets: Tensor | None = None,
        loss_mask: Tensor | None = None,
    ) -> Any:
        """Run the model.

        Args:
            tokens: Token ids ``[batch, pos]`` in ``[0, d_vocab)``, ``pos <= n_ctx``.
            padding_mask: ``[batch, pos]`` bool, True for real tokens. Padding keys are masked in
                every head; padding queries produce logits that the loss ignores.
            return_type: ``"logits"`` (default), ``"loss"``, ``"both"`` (logits, loss) or None.
            targets: Class ids ``[batch, pos]`` (or ``[batch, pos, n_targets]``), -100 = ignore.
                Required for the loss.
            loss_mask: Optional bool ``[batch, pos]``; False positions are ignored by the loss.

        Returns:
            Logits ``[batch, pos, d_vocab_out]`` (``[batch, pos, n_targets, d_vocab_out]`` when
            ``n_targets > 1``), the scalar loss, both, or None.
        """
        tokens, padding_mask = self.validate_inputs(tokens, padding_mask)
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(
                f"return_type={return_type!r} is invalid; allowed: 'logits', 'loss', 'both', None"
            )
        logits = self.logits(tokens, padding_mask)
        if return_type in ("logits", None):
            return logits if return_type == "logits" else None
        if targets is None:
            raise ValueError(f"return_type={return_type!r} needs targets= for the loss")
        loss = self.loss(logits, targets, loss_mask)
        return loss if return_type == "loss" else (logits, loss)

    def logits(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Forward pass without input checks (for training loops that already checked)."""
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device)
        resid = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(
            self.pos_embed(positions).expand(B, T, -1)
        )  # (B, T, d_model)
        for block in self.blocks:
            resid = block(resid, padding_mask)
        return self.logits_from_resid(resid)

    def logits_from_z(
        self,
        layer: int,
        resid_pre: Float[Tensor, "B T d_model"],
        z: Float[Tensor, "B T h d_head"],
        padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Finish a forward pass from layer ``layer``'s ``hook_z`` (e.g. an edited copy of it).

        ``resid_pre`` is that layer's ``hook_resid_pre``. Everything before ``hook_z`` is
        skipped, so many edits of one layer's heads cost one merge + W_O each, not a whole
        forward (this is how all single-head ablations are scored at once).
        """
        block = self.blocks[layer]
        resid = block.after_attention(resid_pre, block.attn.output_from_z(z))
        for later in self.blocks[layer + 1 :]:
            resid = later(resid, padding_mask)
        return self.logits_from_resid(resid)

    def logits_from_resid(self, resid: Float[Tensor, "B T d_model"]) -> Tensor:
        """The final LayerNorm and unembedding: logits from the last ``hook_resid_post``."""
        B, T, _ = resid.shape
        logits = self.hook_unembed(self.unembed(self.ln_final(resid)))  # (B, T, n_targets * V)
        if self.cfg.n_targets > 1:
            logits = logits.reshape(B, T, self.cfg.n_targets, self.cfg.d_vocab_out)
        return logits

    def loss(
        self, logits: Tensor, targets: Tensor, loss_mask: Tensor | None = None
    ) -> Float[Tensor, ""]:
        """Mean cross-entropy over scored (position, target) pairs (:func:`scoring.mean_loss`)."""
        return mean_loss(logits, targets, loss_mask)

    def validate_inputs(
        self, tokens: Any, padding_mask: Any = None
    ) -> tuple[Tensor, Tensor | None]:
        """Check tokens and padding mask; raise ``ValueError``/``TypeError`` a user can act on."""
        if not isinstance(tokens, Tensor):
            raise TypeError(
                f"tokens must be a torch.Tensor of int64 ids, got {type(tokens).__name__}; "
                "use model.to_tokens(...) to convert a string or list"
            )
        if tokens.is_floating_point() or tokens.dtype == torch.bool or tokens.is_complex():
            raise ValueError(
                f"tokens must be integer ids, got dtype {tokens.dtype}; convert with .long()"
            )
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
        if tokens.shape[1] > self.cfg.n_ctx or tokens.shape[1] == 0:
            raise ValueError(
                f"sequence length {tokens.shape[1]} is outside [1, n_ctx={self.cfg.n_ctx}]; "
                "use shorter sequences or a model with a larger n_ctx"
            )
        if tokens.numel():
            low, high = torch.aminmax(tokens)
            if low < 0 or high >= self.cfg.d_vocab:
                raise ValueError(
                    f"token ids must lie in [0, d_vocab={self.cfg.d_vocab}), got values in "
                    f"[{int(low)}, {int(high)}]"
                )
        if padding_mask is not None:
            if not isinstance(padding_mask, Tensor) or padding_mask.dtype != torch.bool:
                raise ValueError("padding_mask must be a bool tensor, True for real tokens")
            if padding_mask.ndim == 1 and tokens.shape[0] == 1:
                padding_mask = padding_mask[None]
            if padding_mask.shape != tokens.shape:
                raise ValueError(
                    f"padding_mask must have the tokens' shape {tuple(tokens.shape)} "
                    f"([batch, pos], True = real token), got {tuple(padding_mask.shape)}"
                )
        return tokens.long(), padding_mask

    def to_tokens(
        self, seq: str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]] | Tensor
    ) -> Int[Tensor, "B T"]:
        """Turn token ids in any common form into a ``[B, T]`` tensor on the model's device.

        Accepts ``"3 1 4 1"`` or ``"3,1,4,1"`` (one sequence), a list of such strings (one row
        each), a list of ints, a list of lists, or a tensor. There is no text tokenizer: the
        tasks' tokens are integers, and no BOS token is added. This is what TransformerLens's
        ``head_detector.detect_head`` calls with its ``seq`` argument.

        Raises:
            ValueError: For text that is not integers, an empty sequence, rows of different
                lengths (there is no padding here: build a ``Batch`` with a ``padding_mask``),
                or ids outside the vocabulary.

        Example:
            >>> model.to_tokens(["1 2 3", "3 2 1"]).shape  # doctest: +SKIP
            torch.Size([2, 3])
        """
        if isinstance(seq, str):
            seq = _parse_token_string(seq)
        elif isinstance(seq, Sequence) and seq and all(isinstance(row, str) for row in seq):
            seq = [_parse_token_string(row) for row in seq]
        if isinstance(seq, Sequence) and seq and all(isinstance(row, Sequence) for row in seq):
            lengths = sorted({len(row) for row in seq})
            if len(lengths) > 1:
                raise ValueError(
                    f"sequences have different lengths {lengths}; give equal-length sequences "
                    "(to pad, build a Batch with a padding_mask)"
                )
        tokens = torch.as_tensor(seq)
        tokens, _ = self.validate_inputs(tokens)
        return tokens.to(self.cfg.device)

    def to_single_token(self, token: str | int) -> int:
        """``"3"`` or ``3`` -> ``3``: one token id (TransformerLens's name, used by
        ``ActivationCache.logit_attrs`` when given a string)."""
        ids = _parse_token_string(token) if isinstance(token, str) else [token]
        if len(ids) != 1 or not 0 <= int(ids[0]) < self.cfg.d_vocab:
            raise ValueError(f"{token!r} is not one token id in [0, d_vocab={self.cfg.d_vocab})")
        return int(ids[0])

    def tokens_to_residual_directions(
        self, tokens: str | int | Int[Tensor, "..."]
    ) -> Float[Tensor, "... d_model"]:
        """The unembedding direction(s) ``W_U[:, tokens]`` in the residual stream.

        ``tokens`` are output class ids (columns of ``W_U``); with ``n_targets > 1`` the column
        of class ``c`` of target ``t`` is ``t * d_vocab_out + c``. As TransformerLens's method,
        which ``ActivationCache.logit_attrs`` calls.
        """
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if isinstance(tokens, Tensor) and tokens.numel() > 1:
            return self.W_U[:, tokens].movedim(0, -1)  # (..., d_model)
        index = int(tokens.item()) if isinstance(tokens, Tensor) else int(tokens)
        return self.W_U[:, index]

    # ----- TransformerLens conveniences -----------------------------------------------------------
    def run_with_cache(self, *model_args: Any, **kwargs: Any) -> tuple[Any, ActivationCache]:
        """Run and cache activations; returns ``(output, transformer_lens.ActivationCache)``."""
        remove_batch_dim = kwargs.get("remove_batch_dim", False)
        output, cache_dict = super().run_with_cache(*model_args, **kwargs)
        return output, ActivationCache(cache_dict, self, has_batch_dim=not remove_batch_dim)

    @property
    def head_labels(self) -> list[str]:
        """``["L0H0", "L0H1", ...]`` in layer-major order."""
        return [
            head_label(lay, h) for lay in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)
        ]

    @property
    def all_head_labels(self) -> list[str]:
        """TransformerLens's name for :attr:`head_labels` (the same ``"L0H0"`` labels)."""
        return self.head_labels

    # TransformerLens's setters for its optional hooks (they set the cfg flag of the same name).
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Compute and hook each head's residual write (``attn.hook_result``) or not."""
        self.cfg.use_attn_result = _flag("use_attn_result", use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give Q, K and V their own per-head copies of the input (``hook_q_input``...)."""
        if use_split_qkv_input and self.cfg.use_attn_in:
            raise ValueError("use_split_qkv_input and use_attn_in are mutually exclusive; "
                             "call set_use_attn_in(False) first")  # fmt: skip
        self.cfg.use_split_qkv_input = _flag("use_split_qkv_input", use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Give the attention one per-head copy of its input (``hook_attn_in``)."""
        if use_attn_in and self.cfg.use_split_qkv_input:
            raise ValueError("use_attn_in and use_split_qkv_input are mutually exclusive; "
                             "call set_use_split_qkv_input(False) first")  # fmt: skip
        self.cfg.use_attn_in = _flag("use_attn_in", use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Fire ``hook_mlp_in`` (the MLP input before ln2) or not."""
        self.cfg.use_hook_mlp_in = _flag("use_hook_mlp_in", use_hook_mlp_in)

    def _stack(self, name: str, part: str = "attn") -> Tensor:
        if part == "mlp" and self.cfg.attn_only:
            raise AttributeError(f"{name} is undefined: this model is attention-only (no MLP)")
        return torch.stack([getattr(getattr(block, part), name) for block in self.blocks])

    @property
    def W_Q(self) -> Float[Tensor, "n_layers h d_model d_head"]:
        return self._stack("W_Q")

    @property
    def W_K(self) -> Float[Tensor, "n_layers h d_model d_head"]:
        return self._stack("W_K")

    @property
    def W_V(self) -> Float[Tensor, "n_layers h d_model d_head"]:
        return self._stack("W_V")

    @property
    def W_O(self) -> Float[Tensor, "n_layers h d_head d_model"]:
        return self._stack("W_O")

    @property
    def b_Q(self) -> Float[Tensor, "n_layers h d_head"]:
        return self._stack("b_Q")

    @property
    def b_K(self) -> Float[Tensor, "n_layers h d_head"]:
        return self._stack("b_K")

    @property
    def b_V(self) -> Float[Tensor, "n_layers h d_head"]:
        return self._stack("b_V")

    @property
    def b_O(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stack("b_O")

    @property
    def W_in(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        return self._stack("W_in", "mlp")

    @property
    def b_in(self) -> Float[Tensor, "n_layers d_mlp"]:
        return self._stack("b_in", "mlp")

    @property
    def W_out(self) -> Float[Tensor, "n_layers d_mlp d_model"]:
        return self._stack("W_out", "mlp")

    @property
    def b_out(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stack("b_out", "mlp")

    @property
    def QK(self) -> FactoredMatrix:
        """``W_Q @ W_K^T`` of every head, ``[n_layers, h, d_model, d_model]``."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """``W_V @ W_O`` of every head, ``[n_layers, h, d_model, d_model]``."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.weight

    @property
    def W_E_pos(self) -> Float[Tensor, "d_vocab_plus_n_ctx d_model"]:
        """``[W_E; W_pos]`` stacked along the rows, as TransformerLens defines it."""
        return torch.cat([self.W_E, self.W_pos], dim=0)

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.pos_embed.weight

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab_out_total"]:
        """Unembedding in TransformerLens layout (``resid @ W_U + b_U``)."""
        return self.unembed.weight.T

    @property
    def b_U(self) -> Float[Tensor, " d_vocab_out_total"]:
        return self.unembed.bias

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is invalid: must be True or False.")
    return value


def _parse_token_string(text: str) -> list[int]:
    """``"3 1 4"`` or ``"3,1,4"`` -> ``[3, 1, 4]``."""
    parts = text.replace(",", " ").split()
    if not parts:
        raise ValueError("cannot make tokens from an empty string; give token ids")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"cannot read {text!r} as token ids; give integers separated by spaces or commas"
        ) from None
