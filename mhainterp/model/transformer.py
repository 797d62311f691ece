"""A small, hookable multi-head attention transformer for synthetic sequence tasks.

Readable top to bottom: embeddings -> ``n_layers`` blocks (attention, optional MLP, optional
pre-LayerNorm) -> unembedding to per-position class logits. Hook names, shapes and values follow
TransformerLens (checked against TL 4.x's own model in ``tests/test_tl_parity.py``), so
``run_with_cache``, ``run_with_hooks``, ``cache["pattern", 0]``, the ``ActivationCache`` helpers
(``decompose_resid``, ``stack_head_results``, ``accumulated_resid``, ``logit_attrs``, with
``apply_ln`` either way), ``transformer_lens.patching`` and ``transformer_lens.head_detector``
work on it unchanged. The intentional differences are listed in the README ("Coming from
TransformerLens").

The layers (attention, MLP, LayerNorm, block, unembedding) are in :mod:`mhainterp.model.components`,
the TransformerLens-layout weight views (``W_E``, ``W_Q``, ``QK``, ...) in
:mod:`mhainterp.model.weight_views`; the package re-exports them.

Shapes: B batch, T positions, h heads, d_head = d_model / h, V classes.

This is THE reference forward (with its layers in :mod:`mhainterp.model.components`). Derived copies
that must follow any change to it (each tested equal to it; a commit that changes the forward
names them): ``mhainterp.fast.stacked`` (many models trained in one batched step) and
``mhainterp.fast.linear_readout`` (ablated copies scored through ``W_O[h] @ W_U`` after the last
layer's ``hook_z``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from mhainterp.config import ModelConfig
from mhainterp.model.components import (
    LayerNorm,
    TransformerBlock,
    Unembed,
    init_linear,
    norm_layer,
)
from mhainterp.model.loss import mean_loss
from mhainterp.model.weight_views import ModelWeightViews
from mhainterp.runtime import DRAW_DEVICE, reads_without_wait
from mhainterp.validation import ParameterError, check_bool, check_option, invalid

__all__ = ["HookedMHATransformer"]

ReturnType = Literal["logits", "loss", "both"] | None


class HookedMHATransformer(ModelWeightViews, HookedRootModule):
    """Token + learned position embedding -> blocks -> per-position class logits.

    A ``transformer_lens.HookedRootModule``: ``run_with_hooks``, ``hooks()`` and
    ``run_with_cache`` (returning a ``transformer_lens.ActivationCache``) work, with
    TransformerLens's hook names (see DESIGN.md, "Model contract"). As in TransformerLens, the
    optional hooks fire only behind their ``cfg`` flags: ``attn.hook_result`` behind
    ``use_attn_result`` (a plain forward and ``run_with_cache`` take the same path either way),
    the per-head inputs behind ``use_split_qkv_input`` / ``use_attn_in``, ``hook_mlp_in`` behind
    ``use_hook_mlp_in``; set them in the config or with ``set_use_attn_result(True)`` etc.

    The TransformerLens-layout weight views (``W_E``, ``W_Q`` ... ``W_U``, ``QK``/``OV``,
    ``all_head_labels``) come from :class:`~mhainterp.model.weight_views.ModelWeightViews`; the
    layers are in :mod:`mhainterp.model.components`.

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
        # The weights are drawn on the CPU from cfg.seed (the same model on every device, and
        # whatever torch's default device is), then moved to cfg.device. A config on torch's
        # meta device gives shapes only: nothing is allocated or drawn (sizes are counted so).
        shapes_only = torch.device(cfg.device).type == "meta"
        with torch.device("meta" if shapes_only else DRAW_DEVICE):
            self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
            self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model)
            self.hook_embed = HookPoint()  # [batch, pos, d_model]
            self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
            self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
            self.ln_final = norm_layer(cfg)
            self.unembed = Unembed(cfg.d_model, cfg.n_targets * cfg.d_vocab_out)
            self.hook_unembed = HookPoint()  # [batch, pos, n_targets * d_vocab_out], TL's alias
        if not shapes_only:
            self.reset_parameters(cfg.seed)
        self.setup()  # registers hook points by name (HookedRootModule)
        self.to(device=cfg.device, dtype=cfg.dtype)

    def reset_parameters(self, seed: int) -> None:
        """Re-initialise every weight from one seed, in a fixed order (bit-reproducible): drawn
        with a CPU generator, so a model on another device is re-drawn on the CPU and moved."""
        device = self.embed.weight.device
        if device != torch.device(DRAW_DEVICE):
            self.to(DRAW_DEVICE)
            self.reset_parameters(seed)
            self.to(device)
            return
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            nn.init.normal_(self.embed.weight, 0.0, 1.0, generator=generator)
            nn.init.normal_(self.pos_embed.weight, 0.0, 1.0, generator=generator)
            for block in self.blocks:
                block.attn.reset_parameters(generator)
                if not self.cfg.attn_only:
                    block.mlp.reset_parameters(generator)
            init_linear(self.unembed, generator)
            for module in self.modules():
                if isinstance(module, LayerNorm):
                    module.reset_parameters()

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """``.to()``, ``.cuda()``, ``.cpu()``, ``.half()`` all end here: keep ``cfg.device`` and
        ``cfg.dtype`` equal to where the parameters are (TransformerLens's ``cfg.device``
        habit), so a saved config records the device the run was trained on."""
        module = super()._apply(fn, recurse)
        weight = self.embed.weight
        self.cfg.device = str(weight.device)
        self.cfg.dtype = weight.dtype
        return module

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
        check_option("return_type", return_type, ("logits", "loss", "both", None))
        # Inputs follow the model, as in TransformerLens: CPU tokens work on a CUDA model.
        device = self.embed.weight.device
        tokens = tokens.to(device)
        padding_mask = None if padding_mask is None else padding_mask.to(device)
        logits = self.logits(tokens, padding_mask)
        if return_type in ("logits", None):
            return logits if return_type == "logits" else None
        if targets is None:
            raise invalid("targets", targets, f"a targets tensor when return_type={return_type!r}")
        loss_mask = None if loss_mask is None else loss_mask.to(device)
        loss = self.loss(logits, targets.to(device), loss_mask)
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
        """Mean cross-entropy over scored (position, target) pairs
        (:func:`~mhainterp.model.loss.mean_loss`)."""
        return mean_loss(logits, targets, loss_mask)

    def validate_inputs(
        self, tokens: Any, padding_mask: Any = None
    ) -> tuple[Tensor, Tensor | None]:
        """Check tokens and padding mask; raise a ``ParameterError`` a user can act on."""
        if not isinstance(tokens, Tensor):
            raise TypeError(
                f"tokens must be a torch.Tensor of int64 ids, got {type(tokens).__name__}; "
                "use model.to_tokens(...) to convert a string or list"
            )
        if tokens.is_floating_point() or tokens.dtype == torch.bool or tokens.is_complex():
            raise ParameterError(
                f"tokens is invalid: integer ids, got dtype {tokens.dtype}; convert with .long()"
            )
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2:
            raise ParameterError(
                f"tokens is invalid: [batch, pos], got shape {tuple(tokens.shape)}"
            )
        if tokens.shape[1] > self.cfg.n_ctx or tokens.shape[1] == 0:
            raise ParameterError(
                f"tokens is invalid: a sequence length in [1, n_ctx={self.cfg.n_ctx}], got "
                f"{tokens.shape[1]}; use shorter sequences or a model with a larger n_ctx"
            )
        if tokens.numel() and reads_without_wait(tokens.device):
            low, high = torch.aminmax(tokens)
            if low < 0 or high >= self.cfg.d_vocab:
                raise ParameterError(
                    f"tokens is invalid: ids in [0, d_vocab={self.cfg.d_vocab}), got values in "
                    f"[{int(low)}, {int(high)}]"
                )
        elif tokens.numel():
            # On a device, reading the ids back would stall every forward (two host syncs):
            # the device checks them itself, and a bad id stops the next sync with this error.
            low, high = torch.aminmax(tokens)
            torch._assert_async(
                (low >= 0) & (high < self.cfg.d_vocab),
                f"tokens is invalid: ids in [0, d_vocab={self.cfg.d_vocab}) (checked on the "
                f"device; move the tokens to the CPU to see the values)",
            )
        if padding_mask is not None:
            if not isinstance(padding_mask, Tensor) or padding_mask.dtype != torch.bool:
                raise ParameterError("padding_mask is invalid: a bool tensor, True for real tokens")
            if padding_mask.ndim == 1 and tokens.shape[0] == 1:
                padding_mask = padding_mask[None]
            if padding_mask.shape != tokens.shape:
                raise ParameterError(
                    f"padding_mask is invalid: the tokens' shape {tuple(tokens.shape)} "
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
            ParameterError: For text that is not integers, an empty sequence, rows of different
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
                raise ParameterError(
                    f"seq is invalid: equal-length sequences, got lengths {lengths} "
                    "(to pad, build a Batch with a padding_mask)"
                )
        tokens = torch.as_tensor(seq, device="cpu")  # parsed here, then moved to the model
        tokens, _ = self.validate_inputs(tokens)
        return tokens.to(self.embed.weight.device)

    def to_single_token(self, token: str | int) -> int:
        """``"3"`` or ``3`` -> ``3``: one token id (TransformerLens's name, used by
        ``ActivationCache.logit_attrs`` when given a string)."""
        ids = _parse_token_string(token) if isinstance(token, str) else [token]
        if len(ids) != 1 or not 0 <= int(ids[0]) < self.cfg.d_vocab:
            raise invalid("token", token, f"one token id in [0, d_vocab={self.cfg.d_vocab})")
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

    # TransformerLens's setters for its optional hooks (they set the cfg flag of the same name).
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Compute and hook each head's residual write (``attn.hook_result``) or not."""
        self.cfg.use_attn_result = check_bool("use_attn_result", use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give Q, K and V their own per-head copies of the input (``hook_q_input``...)."""
        if use_split_qkv_input and self.cfg.use_attn_in:
            raise invalid(
                "use_split_qkv_input",
                use_split_qkv_input,
                "False while use_attn_in is on; call set_use_attn_in(False) first",
            )
        self.cfg.use_split_qkv_input = check_bool("use_split_qkv_input", use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Give the attention one per-head copy of its input (``hook_attn_in``)."""
        if use_attn_in and self.cfg.use_split_qkv_input:
            raise invalid(
                "use_attn_in",
                use_attn_in,
                "False while use_split_qkv_input is on; call set_use_split_qkv_input(False) first",
            )
        self.cfg.use_attn_in = check_bool("use_attn_in", use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Fire ``hook_mlp_in`` (the MLP input before ln2) or not."""
        self.cfg.use_hook_mlp_in = check_bool("use_hook_mlp_in", use_hook_mlp_in)


def _parse_token_string(text: str) -> list[int]:
    """``"3 1 4"`` or ``"3,1,4"`` -> ``[3, 1, 4]``."""
    parts = text.replace(",", " ").split()
    if not parts:
        raise invalid("tokens", text, "token ids, not an empty string")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise invalid("tokens", text, "integer ids separated by spaces or commas") from None
