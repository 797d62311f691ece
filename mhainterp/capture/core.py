"""The capture primitives: inputs, and one forward pass per batch that keeps only named hooks.

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
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import HookedModel, check_model
from mhainterp.tasks import Batch, Task
from mhainterp.validation import check_int

__all__ = [
    "MIN_VISIBLE_KEYS",
    "Data",
    "PatternBatch",
    "ActivationBatch",
    "Relations",
    "attention_patterns",
    "capture_activations",
    "iter_activations",
    "iter_patterns",
    "pattern_hook_names",
    "resolve_inputs",
    "run_patterns",
    "statistic_queries",
    "visible_keys",
]

MIN_VISIBLE_KEYS = 2
"""A query must see at least this many keys to count in the pattern statistics."""

Data = Task | Batch | Tensor
Relations = Task | Mapping[str, Tensor] | Callable[[Tensor, Tensor], Mapping[str, Tensor]]
"""Where relation templates come from: a Task (``task.relations``), a dict of ``[n, q, k]``
templates aligned with the data's sequences, or a callable ``f(tokens, padding_mask) -> dict``."""


# ----------------------------------------------------------------------------- inputs


def resolve_inputs(
    data: Data, padding_mask: Tensor | None = None, *, n_eval: int = 1024
) -> tuple[Int[Tensor, "n T"], Bool[Tensor, "n T"], Task | None]:
    """Turn a Task, Batch or token tensor into ``(tokens, padding_mask, task_or_None)``.

    Args:
        data: A Task (uses ``task.eval_batch(n_eval)``), a Batch, or ``[n, pos]`` integer tokens
            (``[pos]`` is one sequence).
        padding_mask: Only with a token tensor: ``[n, pos]`` bool, True for real tokens.
            None means every token is real.
        n_eval: Size of a task's fixed evaluation set.

    Returns:
        int64 tokens ``[n, T]``, a full bool padding mask ``[n, T]`` and the task (or None).

    Raises:
        TypeError: If ``data`` is none of the above, or ``padding_mask`` is not bool.
        ValueError: If shapes disagree or ``padding_mask`` is given with a Task/Batch.

    Example:
        >>> tokens, mask, task = resolve_inputs(torch.tensor([[1, 2, 3]]))
        >>> mask.tolist(), task is None
        ([[True, True, True]], True)
    """
    if isinstance(data, (Task, Batch)) and padding_mask is not None:
        raise ValueError(
            f"padding_mask is only used with a token tensor; a {type(data).__name__} carries "
            "its own padding mask. Pass padding_mask=None."
        )
    if isinstance(data, Task):
        batch = data.eval_batch(n_eval)
        return batch.tokens, batch.padding_mask, data
    if isinstance(data, Batch):
        return data.tokens, data.padding_mask, None
    if not isinstance(data, Tensor):
        raise TypeError(
            f"data must be a Task, a Batch or a [n, pos] token tensor, got {type(data).__name__}"
        )
    if data.is_floating_point() or data.dtype == torch.bool:
        raise TypeError(f"tokens must be integer ids, got dtype {data.dtype}; use .long()")
    tokens = data[None] if data.ndim == 1 else data
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ValueError(f"tokens must be [n, pos] with n >= 1, got shape {tuple(data.shape)}")
    if padding_mask is None:
        return tokens.long(), torch.ones_like(tokens, dtype=torch.bool), None
    if not isinstance(padding_mask, Tensor) or padding_mask.dtype != torch.bool:
        raise TypeError("padding_mask must be a bool tensor [n, pos], True for real tokens")
    padding_mask = padding_mask[None] if padding_mask.ndim == 1 else padding_mask
    if padding_mask.shape != tokens.shape:
        raise ValueError(
            f"padding_mask must have the tokens' shape {tuple(tokens.shape)}, "
            f"got {tuple(padding_mask.shape)}"
        )
    return tokens.long(), padding_mask, None


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


def _check_model(model: Any) -> None:
    check_model(model)


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
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> acts = capture_activations(handbuilt_model(["self"], d_head=48),
        ...                            torch.arange(4)[None], None, ["blocks.0.attn.hook_z"])
        >>> acts["blocks.0.attn.hook_z"].shape
        torch.Size([1, 4, 1, 48])
    """
    unknown = [name for name in names if name not in model.hook_dict]
    if unknown:
        raise ValueError(f"unknown hook names {unknown}; e.g. 'blocks.0.attn.hook_pattern'")
    store: dict[str, Tensor] = {}
    wanted = set(names)

    def keep(activation: Tensor, hook: Any) -> None:
        store[hook.name] = activation.detach()
        if len(store) == len(wanted):
            raise _CapturedAllError

    with suppress(_CapturedAllError):
        model.run_with_hooks(
            tokens,
            padding_mask=padding_mask,
            return_type=None,
            fwd_hooks=[(n, keep) for n in wanted],
        )
    return store


class _CapturedAllError(Exception):
    """Raised by :func:`capture_activations`' hook once every named activation is stored."""


def run_patterns(
    model: HookedMHATransformer, tokens: Tensor, padding_mask: Tensor | None
) -> Float[Tensor, "B L h T T"]:
    """One forward pass keeping only the attention patterns of every layer, ``[B, L, h, T, T]``."""
    names = pattern_hook_names(model)
    store = capture_activations(model, tokens, padding_mask, names)
    return torch.stack([store[name] for name in names], dim=1)  # (B, L, h, T, T)


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
    n_eval: int = 1024,
    progress: bool = False,
    desc: str = "capture",
) -> Iterator[ActivationBatch]:
    """Run every model on the same batches of ``data``, keeping only the named activations.

    The one streaming loop of the toolkit's hook-based statistics: patterns, similarity and role
    scores all read their batches from here, so a dataset of any size is summarised one batch at
    a time. A model listed twice (e.g. compared with itself) runs once per batch.

    Args:
        models: The models (they must all accept the tokens).
        data: Task, Batch or ``[n, pos]`` tokens (see :func:`resolve_inputs`).
        names: Per model, the hook names to keep.
        padding_mask: With a token tensor only: True for real tokens.
        batch_size: Sequences per forward pass.
        n_eval: Size of a task's evaluation set.
        progress: Show a tqdm bar over batches.
        desc: The bar's label.

    Yields:
        :class:`ActivationBatch` per batch, in order.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> model = handbuilt_model(["self"], d_head=48)
        >>> parts = iter_activations([model], torch.zeros(3, 4).long(),
        ...                          [["blocks.0.attn.hook_z"]], batch_size=2)
        >>> [p.activations[0]["blocks.0.attn.hook_z"].shape[0] for p in parts]
        [2, 1]
    """
    for model in models:
        _check_model(model)
    _check_batch_size(batch_size)
    tokens, mask, _ = resolve_inputs(data, padding_mask, n_eval=n_eval)
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
            device = model.cfg.device
            run_mask = part_mask.to(device) if has_padding else None
            captured[key] = capture_activations(model, part.to(device), run_mask, sorted(wanted))
        yield ActivationBatch(start, part, part_mask, [captured[id(m)] for m in models])


def iter_patterns(
    model: HookedMHATransformer,
    data: Data,
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = 1024,
    progress: bool = False,
) -> Iterator[PatternBatch]:
    """Yield the attention patterns of every head, one batch of sequences at a time.

    Args:
        model: The model.
        data: Task, Batch or ``[n, pos]`` tokens (see :func:`resolve_inputs`).
        padding_mask: With a token tensor only: True for real tokens.
        batch_size: Sequences per forward pass (memory ~ ``batch_size * L * h * T * T`` floats).
        n_eval: Size of a task's evaluation set.
        progress: Show a tqdm bar over batches.

    Yields:
        :class:`PatternBatch` per batch, in order.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> model = handbuilt_model(["previous", "uniform"], d_head=18)
        >>> [b.patterns.shape for b in iter_patterns(model, torch.zeros(3, 16).long(),
        ...                                           batch_size=2)]
        [torch.Size([2, 1, 2, 16, 16]), torch.Size([1, 1, 2, 16, 16])]
    """
    # A non-model gets no hook names here; iter_activations refuses it with a clear TypeError.
    names = pattern_hook_names(model) if isinstance(model, HookedModel) else []
    run = dict(batch_size=batch_size, n_eval=n_eval, progress=progress, desc="capture patterns")
    for part in iter_activations([model], data, [names], padding_mask, **run):
        device = model.cfg.device
        tokens, mask = part.tokens.to(device), part.padding_mask.to(device)
        patterns = torch.stack([part.activations[0][name] for name in names], dim=1)
        # Padding queries attend to real keys like any other; their rows are meaningless.
        yield PatternBatch(part.start, tokens, mask, patterns * mask[:, None, None, :, None])


def attention_patterns(
    model: HookedMHATransformer, data: Data, padding_mask: Tensor | None = None
) -> Float[Tensor, "n L h T T"]:
    """All patterns at once, ``[n, layer, head, q, k]`` on the CPU: for a few sequences only.

    Rows of padding queries are 0. For a dataset use :func:`average_patterns` or
    :func:`iter_patterns`.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> p = attention_patterns(handbuilt_model(["previous"], d_head=48),
        ...                        torch.arange(4)[None])
        >>> p[0, 0, 0, 2].round().tolist()
        [0.0, 1.0, 0.0, 0.0]
    """
    parts = [b.patterns.cpu() for b in iter_patterns(model, data, padding_mask)]
    return torch.cat(parts)
