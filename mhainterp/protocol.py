"""What the toolkit needs of a model: our own, or a TransformerLens 4 bridge of a pretrained one.

Every analysis (capture, similarity, ablation, attribution, the specialization battery) talks to
a model only through what :class:`HookedModel` lists, so the same code runs on a
:class:`~mhainterp.model.HookedMHATransformer` trained here and on a pretrained Hugging Face
model booted by TransformerLens 4's ``TransformerBridge`` and wrapped in :class:`BridgedModel`:

- ``cfg`` with ``n_layers, n_heads, d_head, d_model, d_vocab, d_vocab_out, n_ctx, n_targets,
  causal, device, attn_only, normalization_type``;
- ``hook_dict``, ``hooks(fwd_hooks=..., bwd_hooks=...)`` and ``run_with_hooks`` with
  TransformerLens's hook names (``blocks.{l}.attn.hook_pattern`` ``[B, h, q, k]``,
  ``blocks.{l}.attn.hook_z`` ``[B, T, h, d_head]``, ``blocks.{l}.hook_resid_pre``);
- ``forward(tokens, padding_mask=None, *, return_type="logits")``, ``logits(tokens,
  padding_mask)`` (no input checks), ``logits_from_z(layer, resid_pre, z, padding_mask)``
  (finish a forward from an edited ``hook_z``) and ``validate_inputs(tokens, padding_mask)``;
- ``head_labels`` / ``all_head_labels`` (``"L0H0"``, layer-major) and the per-query-head
  weights ``W_Q, W_K, W_V, W_O`` (grouped key/value heads repeated for each query head).

:class:`BridgedModel` adds to a bridge what it lacks: ``padding_mask`` is mapped to the
attention mask, unknown keywords raise (the bridge silently drops them), the key/value weights
of grouped-query attention are expanded per query head, and encoders without a trained output
head return their final hidden states (``objective="embedding"``) instead of a random MLM head.

Shapes: B batch, T positions, L layers, h query heads, g key/value heads, d_head.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

from mhainterp.heads import all_head_labels
from mhainterp.model import HookedMHATransformer, StopForward
from mhainterp.runtime import model_device
from mhainterp.validation import ParameterError, check_option, invalid

__all__ = [
    "OBJECTIVES",
    "BridgedConfig",
    "BridgedModel",
    "HookedModel",
    "check_model",
    "expand_kv_heads",
    "head_matrix",
    "scored_by_loss",
    "set_head_matrix",
]

Objective = Literal["next_token", "embedding"]
OBJECTIVES: tuple[Objective, ...] = ("next_token", "embedding")
"""What a model's output is scored as: next-token logits, or the (pooled) final hidden state."""

_FORWARD_KEYWORDS = ("padding_mask", "return_type")


@runtime_checkable
class HookedModel(Protocol):
    """The model interface every analysis of the toolkit uses (see the module docstring)."""

    cfg: Any

    @property
    def hook_dict(self) -> dict[str, Any]: ...

    @property
    def head_labels(self) -> list[str]: ...

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None, **kwargs: Any): ...

    def logits(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor: ...

    def logits_from_z(
        self, layer: int, resid_pre: Tensor, z: Tensor, padding_mask: Tensor | None = None
    ) -> Tensor: ...

    def validate_inputs(self, tokens: Any, padding_mask: Any = None) -> tuple[Tensor, Any]: ...

    def hooks(self, fwd_hooks: list = ..., bwd_hooks: list = ..., **kwargs: Any) -> Any: ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...


def check_model(model: object, name: str = "model") -> HookedModel:
    """``model`` if it satisfies :class:`HookedModel`, else a ``TypeError`` that says what does.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> check_model(handbuilt_model(["self"], d_head=48)).cfg.n_heads
        1
        >>> check_model("gpt2")
        Traceback (most recent call last):
        ...
        TypeError: model must be a HookedMHATransformer or a BridgedModel (load_pretrained), got str
    """
    if isinstance(model, (HookedMHATransformer, BridgedModel)) or (
        isinstance(model, nn.Module) and isinstance(model, HookedModel)
    ):
        return model
    raise TypeError(
        f"{name} must be a HookedMHATransformer or a BridgedModel (load_pretrained), "
        f"got {type(model).__name__}"
    )


def expand_kv_heads(weight: Tensor, n_heads: int) -> Tensor:
    """Repeat grouped key/value heads along axis 1 so query head ``h`` gets group ``h // (h/g)``.

    ``weight`` is ``[L, g, ...]``; the result is ``[L, n_heads, ...]`` (unchanged when g equals
    ``n_heads``). This is the grouping of Hugging Face's ``repeat_kv`` and TransformerLens's
    ``GroupedQueryAttention``.

    Example:
        >>> import torch
        >>> expand_kv_heads(torch.tensor([[10, 20]]), 4).tolist()
        [[10, 10, 20, 20]]
    """
    groups = weight.shape[1]
    if groups == n_heads:
        return weight
    if n_heads % groups:
        raise invalid("n_heads", n_heads, f"a multiple of the {groups} key/value heads")
    return weight.repeat_interleave(n_heads // groups, dim=1)


HEAD_MATRICES = ("W_Q", "W_K", "W_V", "W_O")
"""The per-head matrices :func:`head_matrix` reads and :func:`set_head_matrix` writes."""


def head_matrix(model: HookedModel, layer: int, name: str) -> Tensor:
    """Layer ``layer``'s stored per-head matrix ``name`` in TransformerLens layout.

    ``W_Q, W_K, W_V``: ``[heads, d_model, d_head]``; ``W_O``: ``[h, d_head, d_model]``. For a
    grouped-query model ``W_K, W_V`` have the ``g`` key/value heads as stored (not expanded):
    this is what the weights hold, so a change written back with :func:`set_head_matrix` is a
    change of the model. Our own model returns its views (``model.blocks[l].attn.W_Q``).

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> head_matrix(handbuilt_model(["self"], d_head=48), 0, "W_O").shape
        torch.Size([1, 48, 48])
    """
    check_option("name", name, HEAD_MATRICES)
    if isinstance(model, BridgedModel):
        return model.head_matrix(layer, name)
    return getattr(model.blocks[layer].attn, name)


def set_head_matrix(model: HookedModel, layer: int, name: str, value: Tensor) -> None:
    """Write ``value`` (the layout of :func:`head_matrix`) into the model's weights."""
    check_option("name", name, HEAD_MATRICES)
    if isinstance(model, BridgedModel):
        model.set_head_matrix(layer, name, value)
    else:
        setattr(model.blocks[layer].attn, name, value)


def scored_by_loss(model: HookedModel) -> bool:
    """Whether a head's damage on ``model`` is measured by its loss rather than its accuracy.

    A pretrained model's next-token accuracy over a 49k vocabulary moves in jumps of one
    argmax flip and says little; its cross-entropy (or, for an embedding model, the embedding
    metric) per scored position is the damage (issue 40). Our own models, trained to near
    100% on tasks with few classes, keep accuracy.
    """
    return isinstance(model, BridgedModel)


# ----------------------------------------------------------------------------- the bridge


@dataclass
class BridgedConfig:
    """The shape fields the toolkit reads from ``model.cfg``, for a bridged pretrained model.

    Attributes:
        n_layers, n_heads, d_head, d_model: The attention shape (``n_heads`` query heads).
        n_key_value_heads: Key/value heads per layer (``< n_heads`` for grouped-query models).
        d_vocab: Input vocabulary size.
        d_vocab_out: Output width: the vocabulary for next-token models, ``d_model`` for the
            embedding objective.
        n_ctx: Longest sequence.
        causal: Whether attention is causal (decoders) or bidirectional (encoders).
        objective: ``"next_token"`` or ``"embedding"``.
        device: Where the weights live.
        architecture: The Hugging Face architecture name (e.g. ``LlamaForCausalLM``).
    """

    n_layers: int
    n_heads: int
    n_key_value_heads: int
    d_head: int
    d_model: int
    d_vocab: int
    d_vocab_out: int
    n_ctx: int
    causal: bool
    objective: Objective
    device: str | torch.device | None = (
        None  # where the bridge was booted; model_device() is where it is now
    )
    architecture: str = ""
    n_targets: int = 1
    attn_only: bool = False
    normalization_type: str = "pretrained"
    use_attn_result: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class BridgedModel(nn.Module):
    """A ``TransformerBridge`` with what the toolkit needs (see the module docstring).

    Args:
        bridge: A booted ``transformer_lens.model_bridge.TransformerBridge``.
        objective: ``"next_token"`` (default for causal models: the bridge's logits) or
            ``"embedding"`` (default for encoders: the last block's output ``[B, T, d_model]``,
            which the embedding metric pools).
        provenance: Where the weights come from (source, package version, quantisation);
            :func:`mhainterp.pretrained.load_pretrained` fills it.

    Example:
        >>> model = BridgedModel(bridge)  # doctest: +SKIP
        >>> model(tokens, padding_mask=mask).shape  # doctest: +SKIP
        torch.Size([4, 12, 49152])
    """

    def __init__(
        self,
        bridge: Any,
        objective: Objective | None = None,
        provenance: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.bridge = bridge
        tl = bridge.cfg
        causal = getattr(tl, "attention_dir", "causal") == "causal"
        objective = check_option("objective", objective or _default_objective(causal), OBJECTIVES)
        d_vocab = int(tl.d_vocab)
        self.cfg = BridgedConfig(
            n_layers=int(tl.n_layers),
            n_heads=int(tl.n_heads),
            n_key_value_heads=int(getattr(tl, "n_key_value_heads", None) or tl.n_heads),
            d_head=int(tl.d_head),
            d_model=int(tl.d_model),
            d_vocab=d_vocab,
            d_vocab_out=d_vocab if objective == "next_token" else int(tl.d_model),
            n_ctx=int(tl.n_ctx),
            causal=causal,
            objective=objective,
            device=tl.device,
            architecture=str(getattr(tl, "architecture", "") or ""),
        )
        self.provenance = dict(provenance or {})

    # ----- the hook interface (TransformerLens's names, delegated) ---------------------------
    @property
    def hook_dict(self) -> dict[str, Any]:
        """The bridge's hook points by TransformerLens name."""
        return self.bridge.hook_dict

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer the bridge was booted with."""
        return self.bridge.tokenizer

    def hooks(self, fwd_hooks: list = (), bwd_hooks: list = (), **kwargs: Any) -> Any:
        """Context manager adding hooks for its block (the bridge's ``hooks``).

        The bridge serves some TransformerLens names as aliases (``blocks.0.hook_resid_pre``
        is ``blocks.0.hook_in``); a hook added under an alias sees ``hook.name`` as the alias,
        as on our own model, so code that files activations by ``hook.name`` works on both.
        """
        return self.bridge.hooks(
            fwd_hooks=[self._named(name, fn) for name, fn in fwd_hooks],
            bwd_hooks=[self._named(name, fn) for name, fn in bwd_hooks],
            **kwargs,
        )

    def _named(self, name: Any, fn: Any) -> tuple[Any, Any]:
        point = self.hook_dict.get(name) if isinstance(name, str) else None
        if point is None or point.name == name:
            return name, fn
        return name, partial(_call_as, fn=fn, name=name)

    def run_with_hooks(
        self,
        tokens: Tensor,
        padding_mask: Tensor | None = None,
        *,
        fwd_hooks: list = (),
        bwd_hooks: list = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **kwargs: Any,
    ) -> Any:
        """:meth:`forward` with hooks added for the call (TransformerLens's ``run_with_hooks``)."""
        context = self.hooks(
            fwd_hooks, bwd_hooks, reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts
        )
        with context:
            return self.forward(tokens, padding_mask, **kwargs)

    def run_with_cache(
        self, tokens: Tensor, padding_mask: Tensor | None = None, *, names_filter: Any = None
    ) -> tuple[Tensor, Any]:
        """Run and keep activations: ``(output, transformer_lens.ActivationCache)``.

        ``names_filter`` is a hook name, a list of names or a predicate (None keeps all).
        """
        from transformer_lens import ActivationCache

        names = [name for name in self.hook_dict if _wanted(name, names_filter)]
        store: dict[str, Tensor] = {}

        def keep(value: Tensor, hook: Any) -> None:
            store[hook.name] = value.detach()

        output = self.run_with_hooks(tokens, padding_mask, fwd_hooks=[(n, keep) for n in names])
        return output, ActivationCache(store, self.bridge)

    # ----- forward ----------------------------------------------------------------------------
    def forward(
        self, tokens: Tensor, padding_mask: Tensor | None = None, **kwargs: Any
    ) -> Tensor | None:
        """Run the model on ``tokens`` ``[B, T]``.

        Args:
            tokens: Token ids ``[B, T]`` of the model's tokenizer.
            padding_mask: ``[B, T]`` bool, True for real tokens; passed to the model as its
                attention mask (padding keys are masked in every head).
            **kwargs: Only ``return_type``: ``"logits"`` (default) or None. Anything else
                raises, where the bridge would silently ignore it.

        Returns:
            ``[B, T, d_vocab]`` next-token logits, or ``[B, T, d_model]`` final hidden states
            for the embedding objective; None for ``return_type=None``.
        """
        unknown = sorted(set(kwargs) - set(_FORWARD_KEYWORDS))
        if unknown:
            key = unknown[0]
            raise ParameterError(
                f"{key}=<{type(kwargs[key]).__name__}> is invalid: not a keyword of forward(); "
                f"allowed: {', '.join(_FORWARD_KEYWORDS)} (use padding_mask=, not attention_mask=)"
            )
        return_type = check_option(
            "return_type", kwargs.get("return_type", "logits"), ("logits", None)
        )
        tokens, padding_mask = self.validate_inputs(tokens, padding_mask)
        device = model_device(self)  # inputs follow the model, as on our own model
        tokens = tokens.to(device)
        padding_mask = None if padding_mask is None else padding_mask.to(device)
        output = self.logits(tokens, padding_mask)
        return output if return_type == "logits" else None

    def logits(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """The model's output without input checks (see :meth:`forward`)."""
        return self._run(tokens, padding_mask)

    def logits_from_z(
        self,
        layer: int,
        resid_pre: Float[Tensor, "B T d_model"],
        z: Float[Tensor, "B T h d_head"],
        padding_mask: Bool[Tensor, "B T"] | None = None,
    ) -> Tensor:
        """Finish a forward from layer ``layer``'s ``hook_z`` set to ``z``.

        ``resid_pre`` is that layer's ``hook_resid_pre``; the bridge re-enters the residual
        stream there (``start_at_layer``) and the hook puts ``z`` in place of the layer's own.
        The bridge would still run the blocks before ``layer`` and discard their output; here
        they pass their input through untouched for the call (:func:`_skipping_blocks`), so
        only the layers from ``layer`` on are computed, as on our own model.
        """

        def put(_: Tensor, hook: Any) -> Tensor:
            return z

        def enter(_: Tensor, hook: Any) -> Tensor:
            return resid_pre

        # The bridge swaps the residual in only where its block's name matches blocks/h/layers
        # (a BERT block, "encoder.layer.0", never matched: its input was the embedding of the
        # injected tensor, off by 0.05); hook_in puts it in place for every architecture.
        hooks = [(f"blocks.{layer}.hook_in", enter), (f"blocks.{layer}.attn.hook_z", put)]
        with (
            self.bridge.hooks(fwd_hooks=hooks),
            _skipping_blocks(self.bridge.blocks[:layer]),
        ):
            return self._run(resid_pre, padding_mask, start_at_layer=layer)

    def _run(self, inputs: Tensor, padding_mask: Tensor | None, **bridge_kwargs: Any) -> Tensor:
        attention_mask = None if padding_mask is None else padding_mask.long()
        if self.cfg.objective == "next_token":
            return self.bridge(inputs, attention_mask=attention_mask, **bridge_kwargs)
        store: dict[str, Tensor] = {}
        last = f"blocks.{self.cfg.n_layers - 1}.hook_out"
        stop = StopForward()  # ends this forward only: a caller's own stop passes through

        def keep(value: Tensor, hook: Any) -> None:
            store["out"] = value
            raise stop

        with self.bridge.hooks(fwd_hooks=[(last, keep)]), stop:
            self.bridge(inputs, attention_mask=attention_mask, **bridge_kwargs)
        return store["out"]

    def validate_inputs(self, tokens: Any, padding_mask: Any = None) -> tuple[Tensor, Any]:
        """Check tokens ``[B, T]`` and the padding mask as our own model does."""
        return HookedMHATransformer.validate_inputs(self, tokens, padding_mask)

    # ----- heads and weights --------------------------------------------------------------------
    @property
    def head_labels(self) -> list[str]:
        """``["L0H0", "L0H1", ...]`` in layer-major order (query heads)."""
        return all_head_labels(self.cfg.n_layers, self.cfg.n_heads)

    @property
    def all_head_labels(self) -> list[str]:
        """TransformerLens's name for :attr:`head_labels`."""
        return self.head_labels

    @property
    def W_Q(self) -> Float[Tensor, "L h d_model d_head"]:
        """Query weights per query head."""
        return self.bridge.W_Q

    @property
    def W_K(self) -> Float[Tensor, "L h d_model d_head"]:
        """Key weights, grouped key/value heads repeated for each query head."""
        return expand_kv_heads(self.bridge.W_K, self.cfg.n_heads)

    @property
    def W_V(self) -> Float[Tensor, "L h d_model d_head"]:
        """Value weights, grouped key/value heads repeated for each query head."""
        return expand_kv_heads(self.bridge.W_V, self.cfg.n_heads)

    @property
    def W_O(self) -> Float[Tensor, "L h d_head d_model"]:
        """Output weights per query head."""
        return self.bridge.W_O

    def head_linear(self, layer: int, name: str) -> nn.Linear:
        """The Hugging Face linear layer that holds ``name`` of layer ``layer``."""
        part = {"W_Q": "q", "W_K": "k", "W_V": "v", "W_O": "o"}[name]
        component = getattr(self.bridge.blocks[layer].attn, part)
        return getattr(component, "original_component", component)

    def head_matrix(self, layer: int, name: str) -> Tensor:
        """See :func:`mhainterp.protocol.head_matrix` (a copy; grouped heads as stored)."""
        weight = self.head_linear(layer, name).weight.detach()
        d_head = self.cfg.d_head
        if name == "W_O":  # (d_model, h * d_head) -> (h, d_head, d_model)
            return weight.reshape(weight.shape[0], -1, d_head).permute(1, 2, 0).clone()
        # (heads * d_head, d_model) -> (heads, d_model, d_head)
        return weight.reshape(-1, d_head, weight.shape[1]).transpose(1, 2).clone()

    def set_head_matrix(self, layer: int, name: str, value: Tensor) -> None:
        """See :func:`mhainterp.protocol.set_head_matrix`."""
        weight = self.head_linear(layer, name).weight
        if name == "W_O":
            flat = value.permute(2, 0, 1).reshape(weight.shape)
        else:
            flat = value.transpose(1, 2).reshape(weight.shape)
        with torch.no_grad():
            weight.copy_(flat.to(weight.dtype))


class _AliasedHook:
    """A hook point seen under the alias it was asked for (``.name``); all else delegated."""

    def __init__(self, point: Any, name: str):
        self._point, self.name = point, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._point, attr)


def _pass_through(*args: Any, **kwargs: Any) -> Tensor:
    """A block that returns its input hidden states (a Hugging Face decoder or encoder layer
    of ``transformers`` 5 returns a bare tensor)."""
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def _skipping_blocks(blocks: Any) -> Iterator[None]:
    """Inside it, ``blocks`` return their input unchanged (and fire none of their hooks): the
    blocks before a ``start_at_layer`` re-entry, whose output the bridge discards anyway."""
    blocks = list(blocks)
    for block in blocks:  # an instance attribute shadows the class's forward; the bridge's
        block.__dict__["forward"] = _pass_through  # __setattr__ would pass it to the HF layer
    try:
        yield
    finally:
        for block in blocks:
            block.__dict__.pop("forward", None)


def _call_as(value: Tensor, hook: Any, *, fn: Any, name: str) -> Any:
    return fn(value, hook=_AliasedHook(hook, name))


def _default_objective(causal: bool) -> Objective:
    return "next_token" if causal else "embedding"


def _wanted(name: str, names_filter: Any) -> bool:
    if names_filter is None:
        return True
    if isinstance(names_filter, str):
        return name == names_filter
    if callable(names_filter):
        return bool(names_filter(name))
    return name in names_filter
