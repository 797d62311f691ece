"""Dataset-level attention patterns: averages, relation templates, and their tidy tables.

:func:`average_patterns` and :func:`average_relations` average over the real queries of a
dataset batch by batch (from :func:`~mhainterp.capture.core.iter_patterns`); the ``*_frame``
functions and :func:`example_patterns` turn tensors into the long tables the figures draw.

Shapes: n sequences, B a batch of them, T positions (q query, k key), L layers, h heads.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from jaxtyping import Float
from torch import Tensor

from mhainterp.capture.core import (
    RelationSource,
    attention_patterns,
    iter_patterns,
)
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import Data, as_batch
from mhainterp.heads import head_label
from mhainterp.model import HookedMHATransformer
from mhainterp.runtime import uses_work_threads
from mhainterp.tasks import Task
from mhainterp.validation import ParameterError, invalid

__all__ = [
    "average_patterns",
    "average_relations",
    "check_template",
    "example_patterns",
    "patterns_frame",
    "relation_templates",
    "relations_frame",
    "tensor_frame",
    "with_head_labels",
]


def example_patterns(
    model: HookedMHATransformer,
    data: Data,
    *,
    index: int = 0,
    padding_mask: Tensor | None = None,
    n_eval: int = DEFAULT_N_EVAL,
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
        ``head_label, layer, head, query, key, query_token, key_token, weight``. Keys a causal
        query may not see have weight 0.

    Example:
        >>> import torch
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> df = example_patterns(handbuilt_model(["previous"], d_head=48), torch.arange(3))
        >>> list(df.columns)
        ['head_label', 'layer', 'head', 'query', 'key', 'query_token', 'key_token', 'weight']
    """
    batch = as_batch(data, n_eval=n_eval, padding_mask=padding_mask)
    tokens, mask = batch.tokens, batch.padding_mask
    n = tokens.shape[0]
    if not isinstance(index, int) or not -n <= index < n:
        raise invalid("index", index, f"an integer in [-{n}, {n}): the data has {n} sequences")
    tokens, mask = tokens[index : index + 1 or None], mask[index : index + 1 or None]
    length = int(mask[0].sum())
    patterns = attention_patterns(model, tokens, mask)[0, :, :, :length, :length]  # (L, h, q, k)
    toks = tokens[0, :length].cpu().numpy()
    frame = with_head_labels(tensor_frame(patterns, ["layer", "head", "query", "key"], "weight"))
    frame.insert(5, "query_token", toks[frame["query"].to_numpy()])
    frame.insert(6, "key_token", toks[frame["key"].to_numpy()])
    return frame


def tensor_frame(values: Tensor, index_names: list[str], value_name: str) -> pd.DataFrame:
    """Long table of a tensor: one column per axis (named ``index_names``) plus the values.

    Example:
        >>> import torch
        >>> tensor_frame(torch.tensor([[1.0, 2.0]]), ["layer", "head"], "value").to_dict("list")
        {'layer': [0, 0], 'head': [0, 1], 'value': [1.0, 2.0]}
    """
    array = values.detach().cpu().double().numpy()
    grid = np.indices(array.shape).reshape(array.ndim, -1)
    frame = pd.DataFrame(dict(zip(index_names, grid, strict=True)))
    frame[value_name] = array.reshape(-1)
    return frame


def with_head_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """Lead with ``head_label, layer, head`` (the toolkit's per-head column order).

    ``frame`` needs ``layer`` and ``head`` columns; the label column is inserted in place.

    Example:
        >>> with_head_labels(pd.DataFrame({"layer": [1], "head": [2]})).columns.tolist()
        ['head_label', 'layer', 'head']
    """
    labels = [head_label(lay, h) for lay, h in zip(frame["layer"], frame["head"], strict=True)]
    frame.insert(0, "head_label", labels)
    return frame


@uses_work_threads
def average_patterns(
    model: HookedMHATransformer,
    data: Data,
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = DEFAULT_N_EVAL,
    progress: bool = False,
) -> Float[Tensor, "L h T T"]:
    """Dataset-average pattern of every head, ``[layer, head, q, k]``, computed batch by batch.

    Entry ``[l, h, q, k]`` is the mean of ``pattern[l, h, q, k]`` over the sequences in which
    position ``q`` is a real token (so padding never dilutes it); a position that is never real
    has an all-zero row. Only running sums of shape ``[L, h, T, T]`` are kept, so the result is
    the same for every ``batch_size``.

    Args:
        model: The model.
        data: Task, Batch or tokens (see :func:`mhainterp.data.as_batch`).
        padding_mask: With a token tensor only.
        batch_size: Sequences per forward pass.
        n_eval: Size of a task's evaluation set.
        progress: tqdm bar over batches.

    Returns:
        float32 ``[L, h, T, T]`` on the CPU.

    Example:
        >>> import torch
        >>> from mhainterp.model.handbuilt import handbuilt_model
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
    assert total is not None and count is not None  # as_batch guarantees n >= 1
    return (total / count.clamp(min=1)[:, None]).float().cpu()


def relation_templates(
    relations: RelationSource, tokens: Tensor, padding_mask: Tensor, start: int
) -> dict[str, Tensor]:
    """The ``[B, q, k]`` templates of one batch of sequences starting at ``start``.

    ``relations`` is a Task (its ``relations``), a dict name -> ``[n, q, k]`` tensor over the
    whole data (sliced to this batch) or a callable ``(tokens, padding_mask) -> dict``.
    """
    if isinstance(relations, Task):
        return dict(relations.relations(tokens.cpu(), padding_mask.cpu()))
    if isinstance(relations, Mapping):
        end = start + tokens.shape[0]
        out = {}
        for name, template in relations.items():
            if not isinstance(template, Tensor) or template.ndim != 3:
                got = getattr(template, "shape", type(template).__name__)
                raise ParameterError(
                    f"relations[{name!r}] is invalid: a [n, q, k] tensor aligned with the "
                    f"data's sequences, got {got}"
                )
            out[name] = template[start:end]
        return out
    if callable(relations):
        return dict(relations(tokens.cpu(), padding_mask.cpu()))
    raise TypeError(
        "relations must be a Task, a dict name -> [n, q, k] tensor, or a callable "
        f"(tokens, padding_mask) -> dict; got {type(relations).__name__}"
    )


def check_template(name: str, template: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``template`` if its shape is ``shape`` (``[batch, q, k]``), else a ParameterError."""
    if tuple(template.shape) != shape:
        raise ParameterError(
            f"relations[{name!r}] is invalid: [batch, q, k] = {shape} for this batch (one "
            f"template per sequence of the data), got {tuple(template.shape)}"
        )
    return template


def average_relations(
    relations: RelationSource,
    data: Data,
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 1024,
    n_eval: int = DEFAULT_N_EVAL,
) -> dict[str, Float[Tensor, "T T"]]:
    """Dataset-average relation templates, averaged like :func:`average_patterns`.

    Args:
        relations: A Task, a dict of ``[n, q, k]`` templates, or a callable
            (see ``RelationSource``).
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
    batch = as_batch(data, n_eval=n_eval, padding_mask=padding_mask)
    tokens, mask = batch.tokens, batch.padding_mask
    n, T = tokens.shape
    totals: dict[str, Tensor] = {}
    for start in range(0, n, batch_size):
        part, part_mask = tokens[start : start + batch_size], mask[start : start + batch_size]
        for name, template in relation_templates(relations, part, part_mask, start).items():
            template = check_template(name, template, (part.shape[0], T, T))
            template = template.double().cpu() * part_mask[:, :, None].cpu()
            totals[name] = totals.get(name, 0) + template.sum(0)
    count = mask.double().sum(0).clamp(min=1)[:, None].cpu()  # (T, 1)
    return {name: (total / count).float() for name, total in totals.items()}


def patterns_frame(average: Float[Tensor, "L h T T"]) -> pd.DataFrame:
    """Tidy table of :func:`average_patterns`' output.

    Returns:
        DataFrame with columns ``head_label, layer, head, query, key, weight``, one row per
        (head, query, key).

    Example:
        >>> import torch
        >>> patterns_frame(torch.ones(1, 2, 2, 2) / 2).shape
        (8, 6)
    """
    if not isinstance(average, Tensor) or average.ndim != 4:
        got = getattr(average, "shape", type(average).__name__)
        raise ParameterError(
            f"average is invalid: a [layer, head, q, k] tensor (from average_patterns), got {got}"
        )
    return with_head_labels(tensor_frame(average, ["layer", "head", "query", "key"], "weight"))


def relations_frame(templates: Mapping[str, Float[Tensor, "T T"]]) -> pd.DataFrame:
    """Tidy table of :func:`average_relations`' output: columns ``relation, query, key, weight``.

    Example:
        >>> import torch
        >>> relations_frame({"self": torch.eye(2)}).weight.tolist()
        [1.0, 0.0, 0.0, 1.0]
    """
    frames = []
    for name, template in templates.items():
        frame = tensor_frame(template, ["query", "key"], "weight")
        frame.insert(0, "relation", name)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["relation", "query", "key", "weight"])
    return pd.concat(frames, ignore_index=True)
