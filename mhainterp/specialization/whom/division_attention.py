"""The attention-side view of the division of labour: where each head looks, per query value.

For each head, axis value (the query's token or position) and relation template of the task:
the share of the head's attention on the template at the scored queries with that value, over
the first ``n_attention`` sequences (patterns kept from the division's clean run, else from
:func:`mhainterp.capture.iter_patterns`).
It describes; the damage profiles of :mod:`~mhainterp.specialization.whom.division` decide.

Shapes: R relations, n sequences, T positions, L layers, h heads per layer, K values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from mhainterp.capture import iter_patterns, stack_patterns
from mhainterp.protocol import HookedModel
from mhainterp.specialization.whom.damage import TripleDamage
from mhainterp.specialization.whom.division_result import ATTENTION_COLUMNS, join_columns
from mhainterp.tasks import Batch, Task

__all__ = ["ATTENTION_AXES", "attention_view"]

ATTENTION_AXES: tuple[str, ...] = ("token", "position")
"""Axes of the attention-side view (a query has one token and one position)."""


def attention_view(
    model: HookedModel,
    batch: Batch,
    relations: Any,
    axes: Sequence[str],
    td: TripleDamage,
    patterns: Sequence[Tensor] | None = None,
) -> pd.DataFrame:
    """Share of attention on each relation template at the scored queries of each value.

    Args:
        model: The model.
        batch: The sequences (the division's batch, cut to ``n_attention``).
        relations: A Task, a dict of ``[n, T, T]`` templates aligned with the batch, or
            ``f(tokens, mask) -> dict``; None: an empty table.
        axes: The division's axes (those in :data:`ATTENTION_AXES` are used).
        td: The division's per-triple damage (for the heads and each axis's values).
        patterns: Every layer's clean ``hook_pattern`` of ``batch`` (``[n, h, T, T]`` each),
            when the caller kept them from a forward of its own; default a forward here.

    Returns:
        Columns :data:`~mhainterp.specialization.whom.division_result.ATTENTION_COLUMNS`, sorted by
        ``by, head_label, relation`` then value.
    """
    axes = [a for a in axes if a in ATTENTION_AXES]
    if relations is None or not axes:
        return pd.DataFrame(columns=ATTENTION_COLUMNS)
    tokens, mask = batch.tokens.cpu(), batch.padding_mask.cpu()
    if isinstance(relations, Task):
        templates = relations.relations(tokens, mask)
    elif callable(relations):
        templates = dict(relations(tokens, mask))
    else:  # aligned with the whole batch: keep the rows of the sequences used here
        templates = {name: t[: len(tokens)] for name, t in dict(relations).items()}
    if not templates:
        return pd.DataFrame(columns=ATTENTION_COLUMNS)
    names = list(templates)
    stacked = torch.stack([templates[n].float().cpu() for n in names])  # (R, n, T, T)
    queries = (batch.scored.any(-1) & batch.padding_mask).cpu()  # (n, T)
    # A query counts for a relation when it is scored and the template marks a key for it.
    rows = (queries[None] & (stacked.sum(-1) > 0)).float()  # (R, n, T)
    T = tokens.shape[1]
    device = tokens.device  # the statistics' device (the CPU)
    axis_of = {"token": tokens, "position": torch.arange(T, device=device).expand_as(tokens)}
    value_ids = {a: torch.tensor([int(v) for v in td.value_names[a]], device=device) for a in axes}
    # Every axis's values side by side (K_all = sum of the axes' K), so one einsum serves all.
    weights = (
        torch.cat([(axis_of[a][..., None] == value_ids[a]).float() for a in axes], -1)[None]
        * rows[..., None]
    )  # (R, n, T, K_all): the query's value, at the queries that count
    total = weights.new_zeros(len(names), model.cfg.n_layers, model.cfg.n_heads, weights.shape[-1])
    total = total.double()  # (R, L, h, K_all); float32 products, float64 sums over batches
    if patterns is None:
        parts = ((p.start, p.patterns) for p in iter_patterns(model, tokens, mask))
    else:
        parts = [(0, stack_patterns([p.cpu() for p in patterns], mask))]
    for start, part in parts:  # (b, L, h, T, T) patterns of sequences start, start + 1, ...
        window = slice(start, start + part.shape[0])
        on = torch.einsum("blhqk,rbqk->rblhq", part.float().cpu(), stacked[:, window])
        total += torch.einsum("rblhq,rbqv->rlhv", on, weights[:, window]).double()
    offsets = np.cumsum([0] + [len(value_ids[a]) for a in axes])
    span = {a: slice(offsets[i], offsets[i + 1]) for i, a in enumerate(axes)}
    counts_all = weights.sum((1, 2)).double()  # (R, K_all)
    sums = {a: total[..., span[a]] for a in axes}
    H = len(td.pairs)
    labels = np.array(td.heads, dtype=object)
    layers = np.array([layer for layer, _ in td.pairs], dtype=int)
    head_ids = np.array([head for _, head in td.pairs], dtype=int)
    label_rank = np.argsort(np.argsort(labels, kind="stable"), kind="stable")  # string order
    relation_rank = np.argsort(np.argsort(np.array(names, dtype=object), kind="stable"))
    parts = []
    for axis in sorted(axes):  # rows sorted by (by, head_label, relation), then value
        n_q = counts_all[:, span[axis]]  # (R, K)
        means = (sums[axis] / n_q.clamp(min=1)[:, None, None]).flatten(1, 2)  # (R, H, K)
        R, _, K = means.shape
        r, h, v = (n_q > 0)[:, None, :].expand(R, H, K).nonzero(as_tuple=True)
        r, h, v = r.numpy(), h.numpy(), v.numpy()
        order = np.lexsort((v, relation_rank[r], label_rank[h]))
        r, h, v = r[order], h[order], v[order]
        parts.append(
            {
                "head_label": labels[h],
                "layer": layers[h],
                "head": head_ids[h],
                "by": axis,
                "value": np.array(td.value_names[axis], dtype=object)[v],
                "relation": np.array(names, dtype=object)[r],
                "mass": means[r, h, v].numpy(),
                "n_queries": n_q[r, v].numpy().astype(int),
            }
        )
    return pd.DataFrame(join_columns(parts, ATTENTION_COLUMNS), columns=ATTENTION_COLUMNS)
