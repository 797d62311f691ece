"""Capture primitives: which queries count, and a forward per batch that keeps only named hooks.

Every statistic of :mod:`mhainterp.capture` (and of :mod:`mhainterp.similarity` and the role
scores) reads its activations from :func:`iter_activations`: ``run_with_hooks`` with hooks that
keep only the named activations, one batch at a time, so a dataset of any size is summarised
without ever holding all ``[n, head, q, k]`` patterns in memory. :func:`visible_keys` and
:func:`statistic_queries` implement the package's rule of which queries count (see
:mod:`mhainterp.capture`).

Shapes: n sequences, B a batch of them, T positions (q query, k key), L layers, h heads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import Data, as_batch
from mhainterp.model import HookedMHATransformer, StopForward
from mhainterp.protocol import HookedModel, check_model
from mhainterp.runtime import model_device
from mhainterp.tasks import Task
from mhainterp.validation import check_int, invalid

__all__ = [
    "MIN_VISIBLE_KEYS",
    "PatternBatch",
    "ActivationBatch",
    "RelationSource",
    "attention_patterns",
    "capture_activations",
    "iter_activations",
    "iter_patterns",
    "stack_patterns",
    "pattern_hook_names",
    "statistic_queries",
    "visible_keys",
]

MIN_VISIBLE_KEYS = 2
"""A query must see at least this many keys to count in the pattern statistics."""

RelationSource = Task | Mapping[str, Tensor] | Callable[[Tensor, Tensor], Mapping[str, Tensor]]
"""Where relation templates come from: a Task (``task.relations``), a dict of ``[n, q, k]``
templates aligned with the data's sequences, or a callable ``f(tokens, padding_mask) -> dict``."""


# ----------------------------------------------------------------------------- inputs


def visible_keys(padding_mask: Bool[Tensor, "B T"], causal: bool) -> Bool[Tensor, "B T T"]:
    """Which keys each real query may attend to: real keys, and ``k <= q`` when ``causal``.

    Rows of padding queries are all False.

    Example:
        >>> visible_keys(torch.tensor([[True, True, False]]), causal=True)[0].int().tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 0]]
    """
    T = padding_mask.shape[-1]
    visible = padding_mask[:, None, :] & padding_mask[:, :, None]  # (B, q, k)
    if causal:
        visible = visible & torch.ones(T, T, dtype=torch.bool, device=padding_mask.device).tril()
    return visible


def statistic_queries(visible: Bool[Tensor, "B T T"]) -> Bool[Tensor, "B T"]:
    """The queries the pattern statistics average over: real and seeing >= 2 keys."""
    return visible.sum(-1) >= MIN_VISIBLE_KEYS


# ----------------------------------------------------------------------------- capture


@dataclass(frozen=True)
class PatternBatch:
    """One batch of captured patterns.

    Attributes:
        start: Index of the batch's first sequence in the whole input.
        tokens: ``[B, T]`` token ids (on the model's device).
        padding_mask: ``[B, T]`` bool, True for real tokens.
        patterns: ``[B, L, h, T, T]`` attention weights of every head (rows of padding queries
            are 0 when the input has padding).
    """

    start: int
    tokens: Int[Tensor, "B T"]
    padding_mask: Bool[Tensor, "B T"]
    patterns: Float[Tensor, "B L h T T"]


def pattern_hook_names(model: HookedMHATransformer) -> list[str]:
    """``["blocks.0.attn.hook_pattern", ...]``, one per layer."""
    return [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]


def _check_batch_size(batch_size: int) -> None:
    check_int("batch_size", batch_size, minimum=1)


@torch.no_grad()
def capture_activations(
    model: HookedMHATransformer, tokens: Tensor, padding_mask: Tensor | None, names: list[str]
) -> dict[str, Tensor]:
    """One forward pass that keeps only the named activations (``run_with_hooks``).

    Unlike ``run_with_cache`` nothing else is stored, and the hooks are removed afterwards.
    The pass stops once the last named activation is known: what comes after it (for patterns,
    the value mixing, the MLP and the unembedding) would be computed for nothing.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> acts = capture_activations(handbuilt_model(["self"], d_head=48),
        ...                            torch.arange(4)[None], None, ["blocks.0.attn.hook_z"])
        >>> acts["blocks.0.attn.hook_z"].shape
        torch.Size([1, 4, 1, 48])
    """
    unknown = [name for name in names if name not in model.hook_dict]
    if unknown:
        raise invalid(
            "names", unknown, "hook names of the model, e.g. 'blocks.0.attn.hook_pattern'"
        )
    store: dict[str, Tensor] = {}
    wanted = set(names)
    stop = StopForward()

    def keep(activation: Tensor, hook: Any) -> None:
        store[hook.name] = activation.detach()
        if len(store) == len(wanted):
            raise stop

    with stop:
        model.run_with_hooks(
            tokens,
            padding_mask=padding_mask,
            return_type=None,
            fwd_hooks=[(n, keep) for n in wanted],
        )
    return store


@dataclass(frozen=True)
class ActivationBatch:
    """One batch of the activations of one or more models on the same sequences.

    Attributes:
        start: Index of the batch's first sequence in the whole input.
        tokens: ``[B, T]`` token ids (CPU).
        padding_mask: ``[B, T]`` bool, True for real tokens (CPU).
        activations: Per model (in the order given), hook name -> activation (on the model's
            device).
    """

    start: int
    tokens: Int[Tensor, "B T"]
    padding_mask: Bool[Tensor, "B T"]
    activations: list[dict[str, Tensor]]


def iter_activations(
    models: Sequence[HookedMHATransformer],
    data: Data,
    names: Sequence[Sequence[str]],
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = DEFAULT_N_EVAL,
    progress: bool = False,
    desc: str = "capture",
) -> Iterator[ActivationBatch]:
    """Run every model on the same batches of ``data``, keeping only the named activations.

    The one streaming loop of the toolkit's hook-based statistics: patterns, similarity and role
    scores all read their batches from here, so a dataset of any size is summarised one batch at
    a time. A model listed twice (e.g. compared with itself) runs once per batch.

    Args:
        models: The models (they must all accept the tokens).
        data: Task, Batch or ``[n, pos]`` tokens (see :func:`mhainterp.data.as_batch`).
        names: Per model, the hook names to keep.
        padding_mask: With a token tensor only: True for real tokens.
        batch_size: Sequences per forward pass.
        n_eval: Size of a task's evaluation set.
        progress: Show a tqdm bar over batches.
        desc: The bar's label.

    Yields:
        :class:`ActivationBatch` per batch, in order.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> model = handbuilt_model(["self"], d_head=48)
        >>> parts = iter_activations([model], torch.zeros(3, 4).long(),
        ...                          [["blocks.0.attn.hook_z"]], batch_size=2)
        >>> [p.activations[0]["blocks.0.attn.hook_z"].shape[0] for p in parts]
        [2, 1]
    """
    for model in models:
        check_model(model)
    _check_batch_size(batch_size)
    batch = as_batch(data, n_eval=n_eval, padding_mask=padding_mask)
    tokens, mask = batch.tokens, batch.padding_mask
    for model in models:
        model.validate_inputs(tokens, mask)
    has_padding = not bool(mask.all())
    unique: dict[int, tuple[HookedMHATransformer, set[str]]] = {}
    for model, wanted in zip(models, names, strict=True):
        unique.setdefault(id(model), (model, set()))[1].update(wanted)
    starts = range(0, tokens.shape[0], batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, leave=False):
        part, part_mask = tokens[start : start + batch_size], mask[start : start + batch_size]
        captured: dict[int, dict[str, Tensor]] = {}
        for key, (model, wanted) in unique.items():
            device = model_device(model)
            run_mask = part_mask.to(device) if has_padding else None
            captured[key] = capture_activations(model, part.to(device), run_mask, sorted(wanted))
        yield ActivationBatch(start, part, part_mask, [captured[id(m)] for m in models])


def iter_patterns(
    model: HookedMHATransformer,
    data: Data,
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = DEFAULT_N_EVAL,
    progress: bool = False,
) -> Iterator[PatternBatch]:
    """Yield the attention patterns of every head, one batch of sequences at a time.

    Args:
        model: The model.
        data: Task, Batch or ``[n, pos]`` tokens (see :func:`mhainterp.data.as_batch`).
        padding_mask: With a token tensor only: True for real tokens.
        batch_size: Sequences per forward pass (memory ~ ``batch_size * L * h * T * T`` floats).
        n_eval: Size of a task's evaluation set.
        progress: Show a tqdm bar over batches.

    Yields:
        :class:`PatternBatch` per batch, in order.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> model = handbuilt_model(["previous", "uniform"], d_head=18)
        >>> [b.patterns.shape for b in iter_patterns(model, torch.zeros(3, 16).long(),
        ...                                           batch_size=2)]
        [torch.Size([2, 1, 2, 16, 16]), torch.Size([1, 1, 2, 16, 16])]
    """
    # A non-model gets no hook names here; iter_activations refuses it with a clear TypeError.
    names = pattern_hook_names(model) if isinstance(model, HookedModel) else []
    run = dict(batch_size=batch_size, n_eval=n_eval, progress=progress, desc="capture patterns")
    for part in iter_activations([model], data, [names], padding_mask, **run):
        device = model_device(model)
        tokens, mask = part.tokens.to(device), part.padding_mask.to(device)
        patterns = stack_patterns([part.activations[0][name] for name in names], mask)
        yield PatternBatch(part.start, tokens, mask, patterns)


def stack_patterns(
    layers: Sequence[Float[Tensor, "B h T T"]], padding_mask: Bool[Tensor, "B T"]
) -> Float[Tensor, "B L h T T"]:
    """Every layer's ``hook_pattern`` as one ``[B, layer, head, q, k]`` tensor, with the rows
    of padding queries set to 0 (they attend to real keys like any other query; their rows are
    meaningless).

    Example:
        >>> p = stack_patterns([torch.ones(1, 1, 2, 2)], torch.tensor([[True, False]]))
        >>> p[0, 0, 0].tolist()
        [[1.0, 1.0], [0.0, 0.0]]
    """
    layers = list(layers)
    if not layers:
        raise invalid("layers", layers, "one [B, h, T, T] hook_pattern per layer, at least one")
    patterns = torch.stack(layers, dim=1)
    if patterns.ndim != 5 or tuple(padding_mask.shape) != tuple(patterns.shape[0:4:3]):
        raise invalid(
            "padding_mask",
            tuple(padding_mask.shape),
            f"[B, T] = {tuple(patterns.shape[0:4:3])} for patterns of shape "
            f"{tuple(patterns.shape)}",
        )
    return patterns * padding_mask[:, None, None, :, None]


def attention_patterns(
    model: HookedMHATransformer, data: Data, padding_mask: Tensor | None = None
) -> Float[Tensor, "n L h T T"]:
    """All patterns at once, ``[n, layer, head, q, k]`` on the CPU: for a few sequences only.

    Rows of padding queries are 0. For a dataset use :func:`average_patterns` or
    :func:`iter_patterns`.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> p = attention_patterns(handbuilt_model(["previous"], d_head=48),
        ...                        torch.arange(4)[None])
        >>> p[0, 0, 0, 2].round().tolist()
        [0.0, 1.0, 0.0, 0.0]
    """
    parts = [b.patterns.cpu() for b in iter_patterns(model, data, padding_mask)]
    return torch.cat(parts)
