"""Per-head attention statistics over a dataset, and the template-mass accumulator.

:func:`head_statistics` (entropy, confidence, self/first/offset mass, relation mass) averages over
the queries of :func:`~mhainterp.capture.core.statistic_queries`; :class:`TemplateMass` is the one
accumulator of attention on relation templates, also used by
:mod:`mhainterp.specialization.where.roles`.

Shapes: n sequences, B a batch of them, T positions (q query, k key), L layers, h heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mhainterp.capture.core import (
    RelationSource,
    iter_patterns,
    statistic_queries,
    visible_keys,
)
from mhainterp.capture.patterns import (
    check_template,
    relation_templates,
    tensor_frame,
    with_head_labels,
)
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import Data
from mhainterp.model import HookedMHATransformer
from mhainterp.runtime import uses_work_threads
from mhainterp.tasks import Task
from mhainterp.validation import ParameterError

__all__ = ["TemplateMass", "head_statistics", "offset_profile"]


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
    scores of :mod:`mhainterp.specialization.where.roles` both read it. For each template ``name``
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
        template = check_template(name, template, (B, T, T)).to(p.device).double()
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


@uses_work_threads
def head_statistics(
    model: HookedMHATransformer,
    data: Data,
    padding_mask: Tensor | None = None,
    *,
    relations: RelationSource | None = None,
    batch_size: int = 256,
    n_eval: int = DEFAULT_N_EVAL,
    progress: bool = False,
) -> pd.DataFrame:
    """Per-head attention statistics over a dataset, computed batch by batch.

    Metrics (each head, averaged over the real queries that see >= 2 keys; see
    :mod:`mhainterp.capture` for why single-key queries are left out):

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
        data: Task, Batch or tokens (see :func:`mhainterp.data.as_batch`).
        padding_mask: With a token tensor only.
        relations: Templates to score against; defaults to the task's when ``data`` is a Task,
            else none. A Task, a dict of ``[n, q, k]`` tensors aligned with the data, or a
            callable ``f(tokens, padding_mask) -> dict``.
        batch_size: Sequences per forward pass.
        n_eval: Size of a task's evaluation set.
        progress: tqdm bar over batches.

    Returns:
        Tidy DataFrame, one row per (head, metric): ``head_label, layer, head, metric, value,
        n_queries`` (the number of queries averaged over).

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
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
            templates = relation_templates(relations, part.tokens, part.padding_mask, part.start)
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
        frame = with_head_labels(tensor_frame(value, ["layer", "head"], "value"))
        frame.insert(3, "metric", metric)
        frame["n_queries"] = int(n)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(["layer", "head"], kind="stable", ignore_index=True)


def offset_profile(statistics: pd.DataFrame) -> pd.DataFrame:
    """The ``offset_mass:{d}`` rows of :func:`head_statistics` as ``head_label, layer, head,
    offset, mass`` (offset = k - q, an int).

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> prof = offset_profile(head_statistics(handbuilt_model(["previous"], d_head=48),
        ...                                       torch.randint(0, 10, (4, 16))))
        >>> prof.loc[prof.offset == -1, "mass"].round(3).tolist()
        [1.0]
    """
    missing = {"layer", "head", "head_label", "metric", "value"} - set(statistics.columns)
    if missing:
        raise ParameterError(
            "statistics is invalid: the table from head_statistics, but it is missing columns "
            f"{sorted(missing)}"
        )
    rows = statistics[statistics["metric"].str.startswith("offset_mass:")]
    out = rows[["head_label", "layer", "head"]].copy()
    out["offset"] = rows["metric"].str.split(":").str[1].astype(int)
    out["mass"] = rows["value"]
    return out.sort_values(["layer", "head", "offset"], ignore_index=True)
