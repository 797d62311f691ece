"""A small, hookable multi-head attention transformer for synthetic sequence tasks.

Readable top to bottom: embeddings -> ``n_layers`` blocks (attention, optional MLP, optional
pre-LayerNorm) -> unembedding to per-position class logits. Hook names and shapes follow
TransformerLens, so ``run_with_cache``, ``run_with_hooks``, ``cache["pattern", 0]``,
``transformer_lens.patching`` and ``transformer_lens.head_detector`` work on it unchanged.

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
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from mhainterp.config import ModelConfig
from mhainterp.heads import head_label, parse_head_label
from mhainterp.scoring import mean_loss

__all__ = [
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

    def _project(self, linear: nn.Linear, x: Float[Tensor, "B T d_model"]) -> Tensor:
        B, T, _ = x.shape
        return linear(x).reshape(B, T, self.n_heads, self.d_head)  # (B, T, h, d_head)

    def forward(
        self,
        x: Float[Tensor, "B T d_model"],
        padding_mask: Bool[Tensor, "B T"] | None = None,
    ) -> Float[Tensor, "B T d_model"]:
        """Attend; ``padding_mask`` is True for real tokens, False for padding keys."""
        T = x.shape[1]
        q = self.hook_q(self._project(self.q_proj, x))  # (B, T, h, d_head)
        k = self.hook_k(self._project(self.k_proj, x))  # (B, T, h, d_head)
        v = self.hook_v(self._project(self.v_proj, x))  # (B, T, h, d_head)

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

    def output_from_z(self, z: Float[Tensor, "B T h d_head"]) -> Float[Tensor, "B T d_model"]:
        """Merge the heads and apply W_O (the part of the layer after ``hook_z``)."""
        if self.cfg.use_attn_result or self.hook_result.fwd_hooks:
            # Each head's own write to the residual stream: z_h @ W_O[h].
            result = torch.einsum("bthd,hdm->bthm", z, self.W_O)  # (B, T, h, d_model)
            result = self.hook_result(result)
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


def _check_shape(value: Tensor, expected: tuple[int, ...], name: str) -> None:
    if not isinstance(value, Tensor) or tuple(value.shape) != expected:
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a tensor of shape {expected}, got {got}")


class MLP(nn.Module):
    """Position-wise feed-forward: d_model -> d_mlp -> act -> d_model."""

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


def _norm(cfg: ModelConfig) -> nn.Module:
    return (
        nn.LayerNorm(cfg.d_model, eps=cfg.eps) if cfg.normalization_type == "LN" else nn.Identity()
    )


class TransformerBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(ln1(x))`` then, unless attn_only, ``+ mlp(ln2(.))``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.ln1 = _norm(cfg)
        self.attn = MultiHeadAttention(cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
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
        return self.after_attention(resid, self.attn(self.ln1(resid), padding_mask))

    def after_attention(
        self, resid_pre: Float[Tensor, "B T d_model"], attn_out: Float[Tensor, "B T d_model"]
    ) -> Float[Tensor, "B T d_model"]:
        """The rest of the block once the attention output is known."""
        resid = resid_pre + self.hook_attn_out(attn_out)
        if not self.cfg.attn_only:
            resid = self.hook_resid_mid(resid)
            resid = resid + self.hook_mlp_out(self.mlp(self.ln2(resid)))
        return self.hook_resid_post(resid)


class HookedMHATransformer(HookedRootModule):
    """Token + learned position embedding -> blocks -> per-position class logits.

    A ``transformer_lens.HookedRootModule``: ``run_with_hooks``, ``hooks()`` and
    ``run_with_cache`` (returning a ``transformer_lens.ActivationCache``) work, with
    TransformerLens's hook names (see DESIGN.md, "Model contract").

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
        self.unembed = nn.Linear(cfg.d_model, cfg.n_targets * cfg.d_vocab_out)
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
                if isinstance(module, nn.LayerNorm):
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
        logits = self.unembed(self.ln_final(resid))  # (B, T, n_targets * V)
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

    def to_tokens(self, seq: str | Sequence[int] | Sequence[Sequence[int]] | Tensor) -> Tensor:
        """Turn ``"3 1 4 1"``, ``"3,1,4,1"``, a list, nested lists or a tensor into ``[B, T]``.

        There is no text tokenizer: the tasks' tokens are integers. This is what TransformerLens's
        ``head_detector.detect_head`` calls with its ``seq`` argument.
        """
        if isinstance(seq, str):
            parts = seq.replace(",", " ").split()
            if not parts:
                raise ValueError("cannot make tokens from an empty string; give token ids")
            try:
                seq = [int(p) for p in parts]
            except ValueError:
                raise ValueError(
                    f"cannot read {seq!r} as token ids; give integers separated by spaces or commas"
                ) from None
        tokens = torch.as_tensor(seq)
        tokens, _ = self.validate_inputs(tokens)
        return tokens.to(self.cfg.device)

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

    def _stack(self, name: str) -> Tensor:
        return torch.stack([getattr(block.attn, name) for block in self.blocks])

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
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.weight

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
