"""Per-head capture through hooks: attention patterns, their dataset average, per-head statistics.

Everything here reads ``blocks.{l}.attn.hook_pattern`` through ``run_with_hooks`` with hooks that
keep only the patterns, one batch at a time, so a dataset of any size is summarised without ever
holding all ``[n, head, q, k]`` patterns in memory.

Inputs (``data``) may be a :class:`~mhainterp.tasks.Task` (its fixed evaluation set,
``task.eval_batch(n_eval)``, and its relation templates), a :class:`~mhainterp.tasks.Batch`, or a
``[n, pos]`` token tensor with an optional ``padding_mask`` (``[n, pos]`` bool, True = real token).

Which queries count (the same rule everywhere in this module and in :mod:`mhainterp.similarity`):

- padding queries never count;
- a key is *visible* to a query when it is a real token and, in a causal model, ``k <= q``;
- the pattern statistics (entropy, confidence, self/first/offset mass) average over the real
  queries that see at least 2 keys. A query that sees a single key (position 0 of a causal model)
  has no choice to make: its weight is 1 whatever the head does, and its normalised entropy
  ``H / log(1)`` is undefined, so it is left out rather than reported as a fake certainty;
- the relation template mass averages over the real queries whose template row is non-empty
  (see :func:`head_statistics`).

Shapes: n sequences, B a batch of them, T positions (q query, k key), L layers, h heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.model import HookedMHATransformer, head_label
from mhainterp.tasks import Batch, Task
from mhainterp.validation import check_int

__all__ = [
    "MIN_VISIBLE_KEYS",
    "Data",
    "PatternBatch",
    "ActivationBatch",
    "Relations",
    "TemplateMass",
    "attention_patterns",
    "average_patterns",
    "average_relations",
    "capture_activations",
    "example_patterns",
    "head_statistics",
    "iter_activations",
    "iter_patterns",
    "offset_profile",
    "pattern_hook_names",
    "patterns_frame",
    "relations_frame",
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
    if not isinstance(model, HookedMHATransformer):
        raise TypeError(f"model must be a HookedMHATransformer, got {type(model).__name__}")


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
    names = pattern_hook_names(model) if isinstance(model, HookedMHATransformer) else []
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


def example_patterns(
    model: HookedMHATransformer,
    data: Data,
    *,
    index: int = 0,
    padding_mask: Tensor | None = None,
    n_eval: int = 1024,
) -> pd.DataFrame:
    """One sequence's attention patterns as a tidy table (real positions only).

    Args:
        model: The model.
        data: Task, Batch or tokens; sequence ``index`` of it is used.
        index: Which sequence.
        padding_mask: With a token tensor only.
        n_eval: Size of a task's evaluation set.

    Returns:
        DataFrame with one row per (head, query, key) over the sequence's real positions:
        ``layer, head, head_label, query, key, query_token, key_token, weight``. Keys a causal
        query may not see have weight 0.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> df = example_patterns(handbuilt_model(["previous"], d_head=48), torch.arange(3))
        >>> list(df.columns)
        ['layer', 'head', 'head_label', 'query', 'key', 'query_token', 'key_token', 'weight']
    """
    tokens, mask, _ = resolve_inputs(data, padding_mask, n_eval=n_eval)
    n = tokens.shape[0]
    if not isinstance(index, int) or not -n <= index < n:
        raise ValueError(f"index={index!r} is invalid: the data has {n} sequences (0..{n - 1})")
    tokens, mask = tokens[index : index + 1 or None], mask[index : index + 1 or None]
    length = int(mask[0].sum())
    patterns = attention_patterns(model, tokens, mask)[0, :, :, :length, :length]  # (L, h, q, k)
    toks = tokens[0, :length].cpu().numpy()
    frame = _with_head_labels(_tensor_frame(patterns, ["layer", "head", "query", "key"], "weight"))
    frame.insert(5, "query_token", toks[frame["query"].to_numpy()])
    frame.insert(6, "key_token", toks[frame["key"].to_numpy()])
    return frame


def _tensor_frame(values: Tensor, index_names: list[str], value_name: str) -> pd.DataFrame:
    """Long table of a tensor: one column per axis (named ``index_names``) plus the values."""
    array = values.detach().cpu().double().numpy()
    grid = np.indices(array.shape).reshape(array.ndim, -1)
    frame = pd.DataFrame(dict(zip(index_names, grid, strict=True)))
    frame[value_name] = array.reshape(-1)
    return frame


def _with_head_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """Lead with ``head_label, layer, head`` (the toolkit's per-head column order)."""
    labels = [head_label(lay, h) for lay, h in zip(frame["layer"], frame["head"], strict=True)]
    frame.insert(0, "head_label", labels)
    return frame


# ----------------------------------------------------------------------------- averages


def average_patterns(
    model: HookedMHATransformer,
    data: Data,
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = 1024,
    progress: bool = False,
) -> Float[Tensor, "L h T T"]:
    """Dataset-average pattern of every head, ``[layer, head, q, k]``, computed batch by batch.

    Entry ``[l, h, q, k]`` is the mean of ``pattern[l, h, q, k]`` over the sequences in which
    position ``q`` is a real token (so padding never dilutes it); a position that is never real
    has an all-zero row. Only running sums of shape ``[L, h, T, T]`` are kept, so the result is
    the same for every ``batch_size``.

    Args:
        model: The model.
        data: Task, Batch or tokens (see :func:`resolve_inputs`).
        padding_mask: With a token tensor only.
        batch_size: Sequences per forward pass.
        n_eval: Size of a task's evaluation set.
        progress: tqdm bar over batches.

    Returns:
        float32 ``[L, h, T, T]`` on the CPU.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> avg = average_patterns(handbuilt_model(["uniform"], d_head=48),
        ...                        torch.randint(0, 10, (8, 16)))
        >>> avg[0, 0, 3, :5].tolist()
        [0.25, 0.25, 0.25, 0.25, 0.0]
    """
    total: Tensor | None = None
    count: Tensor | None = None
    for part in iter_patterns(
        model, data, padding_mask, batch_size=batch_size, n_eval=n_eval, progress=progress
    ):
        batch_sum = part.patterns.double().sum(0)  # (L, h, T, T)
        batch_count = part.padding_mask.double().sum(0)  # (T,)
        total = batch_sum if total is None else total + batch_sum
        count = batch_count if count is None else count + batch_count
    assert total is not None and count is not None  # resolve_inputs guarantees n >= 1
    return (total / count.clamp(min=1)[:, None]).float().cpu()


def _relation_templates(
    relations: Relations, tokens: Tensor, padding_mask: Tensor, start: int
) -> dict[str, Tensor]:
    """The ``[B, q, k]`` templates of one batch of sequences starting at ``start``."""
    if isinstance(relations, Task):
        return dict(relations.relations(tokens.cpu(), padding_mask.cpu()))
    if isinstance(relations, Mapping):
        end = start + tokens.shape[0]
        out = {}
        for name, template in relations.items():
            if not isinstance(template, Tensor) or template.ndim != 3:
                raise ValueError(
                    f"relation {name!r} must be a [n, q, k] tensor aligned with the data's "
                    f"sequences, got {getattr(template, 'shape', type(template).__name__)}"
                )
            out[name] = template[start:end]
        return out
    if callable(relations):
        return dict(relations(tokens.cpu(), padding_mask.cpu()))
    raise TypeError(
        "relations must be a Task, a dict name -> [n, q, k] tensor, or a callable "
        f"(tokens, padding_mask) -> dict; got {type(relations).__name__}"
    )


def _check_template(name: str, template: Tensor, shape: tuple[int, ...]) -> Tensor:
    if tuple(template.shape) != shape:
        raise ValueError(
            f"relation {name!r} has shape {tuple(template.shape)} for this batch; expected "
            f"[batch, q, k] = {shape} (one template per sequence of the data)"
        )
    return template


def average_relations(
    relations: Relations,
    data: Data,
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 1024,
    n_eval: int = 1024,
) -> dict[str, Float[Tensor, "T T"]]:
    """Dataset-average relation templates, averaged like :func:`average_patterns`.

    Args:
        relations: A Task, a dict of ``[n, q, k]`` templates, or a callable (see ``Relations``).
        data: Task, Batch or tokens.
        padding_mask: With a token tensor only.
        batch_size: Sequences per chunk.
        n_eval: Size of a task's evaluation set.

    Returns:
        Relation name -> float32 ``[T, T]``: the fraction of sequences (with a real query ``q``)
        whose template marks ``(q, k)``.

    Example:
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("previous_token", seq_len=4)
        >>> average_relations(task, task)["previous"][1].tolist()
        [1.0, 0.0, 0.0, 0.0]
    """
    tokens, mask, _ = resolve_inputs(data, padding_mask, n_eval=n_eval)
    n, T = tokens.shape
    totals: dict[str, Tensor] = {}
    for start in range(0, n, batch_size):
        part, part_mask = tokens[start : start + batch_size], mask[start : start + batch_size]
        for name, template in _relation_templates(relations, part, part_mask, start).items():
            template = _check_template(name, template, (part.shape[0], T, T))
            template = template.double().cpu() * part_mask[:, :, None].cpu()
            totals[name] = totals.get(name, 0) + template.sum(0)
    count = mask.double().sum(0).clamp(min=1)[:, None].cpu()  # (T, 1)
    return {name: (total / count).float() for name, total in totals.items()}


def patterns_frame(average: Float[Tensor, "L h T T"]) -> pd.DataFrame:
    """Tidy table of :func:`average_patterns`' output.

    Returns:
        DataFrame with columns ``layer, head, head_label, query, key, weight``, one row per
        (head, query, key).

    Example:
        >>> patterns_frame(torch.ones(1, 2, 2, 2) / 2).shape
        (8, 6)
    """
    if not isinstance(average, Tensor) or average.ndim != 4:
        raise ValueError("average must be a [layer, head, q, k] tensor (from average_patterns)")
    return _with_head_labels(_tensor_frame(average, ["layer", "head", "query", "key"], "weight"))


def relations_frame(templates: Mapping[str, Float[Tensor, "T T"]]) -> pd.DataFrame:
    """Tidy table of :func:`average_relations`' output: columns ``relation, query, key, weight``.

    Example:
        >>> relations_frame({"self": torch.eye(2)}).weight.tolist()
        [1.0, 0.0, 0.0, 1.0]
    """
    frames = []
    for name, template in templates.items():
        frame = _tensor_frame(template, ["query", "key"], "weight")
        frame.insert(0, "relation", name)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["relation", "query", "key", "weight"])
    return pd.concat(frames, ignore_index=True)


# ----------------------------------------------------------------------------- statistics


class _StatAccumulator:
    """Running sums of per-head statistics over batches (float64)."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}  # metric -> (L, h)
        self.counts: dict[str, float] = {}  # metric -> number of queries

    def add(self, metric: str, value_sum: Tensor, count: float) -> None:
        self.sums[metric] = self.sums.get(metric, 0) + value_sum.double().cpu()
        self.counts[metric] = self.counts.get(metric, 0.0) + float(count)


def _pattern_metrics(
    acc: _StatAccumulator, patterns: Tensor, visible: Tensor, offsets: range
) -> None:
    """Add one batch's entropy, confidence, self/first/offset mass (over statistic queries)."""
    queries = statistic_queries(visible)  # (B, T)
    weight = queries.double()[:, None, None, :]  # (B, 1, 1, T) broadcast over (L, h)
    n = float(queries.sum())
    p = patterns.double()  # (B, L, h, T, T)
    n_keys = visible.sum(-1).double().clamp(min=2)  # (B, T); 2 avoids log(1) = 0 (masked anyway)
    entropy = -torch.special.xlogy(p, p).sum(-1) / torch.log(n_keys)[:, None, None, :]
    acc.add("entropy", (entropy * weight).sum((0, 3)), n)
    acc.add("confidence", (p.amax(-1) * weight).sum((0, 3)), n)
    acc.add("self_mass", (p.diagonal(dim1=-2, dim2=-1) * weight).sum((0, 3)), n)
    acc.add("first_mass", (p[..., 0] * weight).sum((0, 3)), n)
    T = p.shape[-1]
    for offset in offsets:
        # diagonal(offset) holds pattern[q, q + offset] for q in [max(0, -offset), T - offset).
        diag = p.diagonal(offset=offset, dim1=-2, dim2=-1)  # (B, L, h, T - |offset|)
        q_index = torch.arange(max(0, -offset), min(T, T - offset), device=p.device)
        acc.add(f"offset_mass:{offset}", (diag * weight[..., q_index]).sum((0, 3)), n)


class TemplateMass:
    """Running per-head sums of the attention that lands on relation templates (float64).

    The one template-mass accumulator: :func:`head_statistics`' ``relation_mass`` and the role
    scores of :mod:`mhainterp.specialization.roles` both read it. For each template ``name``
    it keeps, per head, ``sums[name]`` = the sum over counted queries of
    ``sum_k pattern[q, k] * template[q, k]`` and ``counts[name]`` = the number of counted
    queries, so :meth:`mean` is the share of attention on the template (TransformerLens's
    ``detect_head`` with ``error_measure="mul"``, over the counted queries). A query counts when
    the caller's ``queries`` mask holds it and its template row marks at least one key.

    Example:
        >>> p = torch.eye(3)[None, None, None]  # one head that attends to itself
        >>> mass = TemplateMass()
        >>> rows = mass.add_template("self", p, torch.eye(3)[None], torch.ones(1, 3).bool())
        >>> float(mass.mean("self")[0, 0]), mass.counts["self"]
        (1.0, 3.0)
    """

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}  # name -> (L, h)
        self.counts: dict[str, float] = {}  # name -> number of counted queries

    def add_values(
        self, name: str, values: Float[Tensor, "B L h T"], rows: Bool[Tensor, "B T"]
    ) -> None:
        """Add per-query values of every head over the counted ``rows``."""
        keep = rows.to(values.device).double()[:, None, None, :]
        total = (values.double() * keep).sum((0, 3))  # (L, h)
        self.sums[name] = self.sums[name] + total if name in self.sums else total
        self.counts[name] = self.counts.get(name, 0.0) + float(rows.sum())

    def add_template(
        self,
        name: str,
        patterns: Float[Tensor, "B L h T T"],
        template: Float[Tensor, "B T T"],
        queries: Bool[Tensor, "B T"],
    ) -> Bool[Tensor, "B T"]:
        """Add one batch's mass on ``template``; return the rows that counted."""
        B, _, _, T, _ = patterns.shape
        p = patterns.double()
        template = _check_template(name, template, (B, T, T)).to(p.device).double()
        rows = queries.to(p.device) & (template.sum(-1) > 0)  # (B, q)
        self.add_values(name, (p * template[:, None, None]).sum(-1), rows)
        return rows

    def add(
        self,
        patterns: Float[Tensor, "B L h T T"],
        templates: Mapping[str, Tensor],
        queries: Bool[Tensor, "B T"],
    ) -> None:
        """:meth:`add_template` for every template of one batch."""
        for name, template in templates.items():
            self.add_template(name, patterns, template, queries)

    def mean(self, name: str) -> Float[Tensor, "L h"]:
        """Per head: the mean over counted queries (NaN when no query counted)."""
        total = self.sums[name].cpu()
        return total / self.counts[name] if self.counts[name] else total * math.nan


def head_statistics(
    model: HookedMHATransformer,
    data: Data,
    padding_mask: Tensor | None = None,
    *,
    relations: Relations | None = None,
    batch_size: int = 256,
    n_eval: int = 1024,
    progress: bool = False,
) -> pd.DataFrame:
    """Per-head attention statistics over a dataset, computed batch by batch.

    Metrics (each head, averaged over the real queries that see >= 2 keys; see the module
    docstring for why single-key queries are left out):

    - ``entropy``: Shannon entropy of the query's attention distribution divided by the log of
      the number of keys it may see, so 0 = all weight on one key, 1 = uniform over the visible
      keys whatever the position;
    - ``confidence``: the maximum weight (Voita et al. 2019, "confidence");
    - ``self_mass``: weight on the query's own position;
    - ``first_mass``: weight on position 0;
    - ``offset_mass:{d}``: weight on the key at relative offset ``d = k - q``, for every
      ``d`` in ``[-(T-1), 0]`` (causal) or ``[-(T-1), T-1]`` (bidirectional); over ``d`` they
      sum to 1.

    And per relation template (TransformerLens ``detect_head`` with ``error_measure="mul"``):

    - ``relation_mass:{name}``: the mean of ``sum_k pattern[q, k] * template[q, k]`` over every
      real query whose template row is non-empty (:class:`TemplateMass`), i.e. the fraction of
      attention that lands on the template (a real query's weights sum to 1). Unlike
      ``detect_head``, queries the relation does not apply to (position 0 for ``previous``)
      are left out instead of counting as misses, so an exact head scores 1.

    Args:
        model: The model.
        data: Task, Batch or tokens (see :func:`resolve_inputs`).
        padding_mask: With a token tensor only.
        relations: Templates to score against; defaults to the task's when ``data`` is a Task,
            else none. A Task, a dict of ``[n, q, k]`` tensors aligned with the data, or a
            callable ``f(tokens, padding_mask) -> dict``.
        batch_size: Sequences per forward pass.
        n_eval: Size of a task's evaluation set.
        progress: tqdm bar over batches.

    Returns:
        Tidy DataFrame, one row per (head, metric): ``layer, head, head_label, metric, value,
        n_queries`` (the number of queries averaged over).

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
        >>> stats = head_statistics(handbuilt_model(["previous", "uniform"], d_head=18), task)
        >>> stats.query("metric == 'relation_mass:previous'").value.round(3).tolist()
        [1.0, 0.159]
    """
    if relations is None and isinstance(data, Task):
        relations = data
    acc, masses = _StatAccumulator(), TemplateMass()
    for part in iter_patterns(
        model, data, padding_mask, batch_size=batch_size, n_eval=n_eval, progress=progress
    ):
        T = part.tokens.shape[1]
        offsets = range(-(T - 1), 1 if model.cfg.causal else T)
        visible = visible_keys(part.padding_mask, model.cfg.causal)
        _pattern_metrics(acc, part.patterns, visible, offsets)
        if relations is not None:
            templates = _relation_templates(relations, part.tokens, part.padding_mask, part.start)
            masses.add(part.patterns, templates, part.padding_mask)  # every real query
    return _statistics_frame(acc, masses)


def _statistics_frame(acc: _StatAccumulator, masses: TemplateMass) -> pd.DataFrame:
    values: dict[str, tuple[Tensor, float]] = {}
    for metric, total in acc.sums.items():
        n = acc.counts[metric]
        values[metric] = (total / max(n, 1.0) if n else total * math.nan, n)
    for name in masses.sums:
        # No query the relation applies to: the mass is undefined (NaN), not 0.
        values[f"relation_mass:{name}"] = (masses.mean(name), masses.counts[name])
    frames = []
    for metric, (value, n) in values.items():
        frame = _with_head_labels(_tensor_frame(value, ["layer", "head"], "value"))
        frame.insert(3, "metric", metric)
        frame["n_queries"] = int(n)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(["layer", "head"], kind="stable", ignore_index=True)


def offset_profile(statistics: pd.DataFrame) -> pd.DataFrame:
    """The ``offset_mass:{d}`` rows of :func:`head_statistics` as ``layer, head, head_label,
    offset, mass`` (offset = k - q, an int).

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> prof = offset_profile(head_statistics(handbuilt_model(["previous"], d_head=48),
        ...                                       torch.randint(0, 10, (4, 16))))
        >>> prof.loc[prof.offset == -1, "mass"].round(3).tolist()
        [1.0]
    """
    missing = {"layer", "head", "head_label", "metric", "value"} - set(statistics.columns)
    if missing:
        raise ValueError(f"statistics is missing columns {sorted(missing)} (use head_statistics)")
    rows = statistics[statistics["metric"].str.startswith("offset_mass:")]
    out = rows[["head_label", "layer", "head"]].copy()
    out["offset"] = rows["metric"].str.split(":").str[1].astype(int)
    out["mass"] = rows["value"]
    return out.sort_values(["layer", "head", "offset"], ignore_index=True)
