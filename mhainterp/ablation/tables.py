"""Ablation tables: thin wrappers over :func:`~mhainterp.ablation.engine.evaluate_head_sets`.

Every table here is one call to the engine plus a layout. Metric columns are ``loss, accuracy``
and, on multi-target models, ``accuracy/<target>``; ``delta_<metric>`` is the ablated minus the
clean value (a harmful ablation has ``delta_loss > 0`` and ``delta_accuracy < 0``) and
``baseline_<metric>`` the clean value. Per-head tables lead with ``head_label, layer, head``.

Example:
    >>> from mhainterp.model.handbuilt import handbuilt_model
    >>> from mhainterp.tasks import get_task
    >>> model = handbuilt_model(["previous", "uniform", "previous"])
    >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
    >>> head_importance(model, task)[["head_label", "accuracy"]].round(2).values.tolist()
    [['L0H0', 1.0], ['L0H1', 1.0], ['L0H2', 1.0]]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from mhainterp.ablation.engine import AblationResult, evaluate_head_sets
from mhainterp.ablation.replacement import DEFAULT_MAX_ROWS, CleanCache, Method
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import Data
from mhainterp.heads import HeadSpec, all_heads, format_heads, head_label, resolve_heads
from mhainterp.protocol import HookedModel
from mhainterp.runtime import uses_work_threads
from mhainterp.scoring import metric_names
from mhainterp.validation import invalid

__all__ = [
    "damage",
    "head_importance",
    "head_sets_table",
    "pairwise_ablation",
    "with_deltas",
]


def with_deltas(
    metrics: dict[str, float], baseline: dict[str, float], names: Sequence[str]
) -> dict[str, float]:
    """``metric``, then ``delta_metric = metric - baseline``, then ``baseline_metric``."""
    out = {name: metrics[name] for name in names}
    out.update({f"delta_{name}": metrics[name] - baseline[name] for name in names})
    out.update({f"baseline_{name}": baseline[name] for name in names})
    return out


def damage(metric: str, ablated: float, baseline: float) -> float:
    """Harm done: loss increase, or accuracy drop (positive = worse)."""
    return ablated - baseline if metric == "loss" else baseline - ablated


def _with_clean(
    model: HookedModel,
    data: Data,
    head_sets: list,
    method: Method,
    reference: Data | None,
    **options: Any,
) -> tuple[AblationResult, dict[str, float], list[dict[str, float]], list[str]]:
    """Evaluate the clean model followed by ``head_sets``; split off the clean metrics."""
    result = evaluate_head_sets(model, data, [[], *head_sets], method, reference, **options)
    metrics = result.metrics()
    return result, metrics[0], metrics[1:], metric_names(result.target_names)


EMBEDDING_MEASURE = (
    "embedding metric: loss = mean over real positions of 1 - cos(output, clean output); "
    "no accuracy (no targets)"
)
"""What :func:`head_importance` measures on an embedding model, in its ``measures`` column."""


@uses_work_threads
def head_importance(
    model: HookedModel,
    data: Data,
    method: Method = "zero",
    reference: Data | None = None,
    *,
    n_eval: int = DEFAULT_N_EVAL,
    generator: torch.Generator | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    progress: bool = False,
    cache: CleanCache | None = None,
) -> pd.DataFrame:
    """Loss and accuracy with each head ablated alone, all heads in one batched pass.

    Args:
        model: The model.
        data: A Task (its evaluation set of ``n_eval`` sequences) or a Batch.
        method: ``"zero"``, ``"mean"`` or ``"resample"``.
        reference: Where mean/resample activations come from; default: the evaluated batch.
        n_eval: Size of a Task's evaluation set.
        generator: The resample permutation (seed 0 when None).
        max_rows: Most rows (copies x sequences) per forward; bounds memory.
        progress: Show a progress bar.
        cache: A :class:`~mhainterp.ablation.replacement.CleanCache` shared with other
            tables of the same model, batch and reference: their clean forwards run once.

    Returns:
        One row per head (layer-major): ``head_label, layer, head, method``, the metrics, their
        ``delta_`` and ``baseline_`` columns. Equals ablating each head with
        :func:`~mhainterp.ablation.ablate` and calling ``training.evaluate`` (to rounding).
        For an embedding model (MiniLM: no output head, no targets) ``loss`` is the embedding
        metric, ``1 - cos`` of each position's output to the clean model's, averaged over the
        real positions (baseline 0), the accuracy columns are NaN and a ``measures`` column
        says so (:data:`EMBEDDING_MEASURE`).

    Example:
        >>> head_importance(model, task, method="mean")  # doctest: +SKIP
    """
    heads = all_heads(model.cfg.n_layers, model.cfg.n_heads)
    _, baseline, results, names = _with_clean(
        model,
        data,
        [[pair] for pair in heads],
        method,
        reference,
        n_eval=n_eval,
        generator=generator,
        max_rows=max_rows,
        progress=progress,
        desc=f"importance ({method})",
        cache=cache,
    )
    rows = [
        {
            "head_label": head_label(layer, head),
            "layer": layer,
            "head": head,
            "method": method,
            **with_deltas(metrics, baseline, names),
        }
        for (layer, head), metrics in zip(heads, results, strict=True)
    ]
    frame = pd.DataFrame(rows)
    if getattr(model.cfg, "objective", "next_token") == "embedding":
        # No targets: the engine scores the embedding metric in the loss columns
        # (scoring.damage_metric); accuracy means nothing there. The table says so.
        accuracy = [c for c in frame.columns if "accuracy" in c]
        frame[accuracy] = float("nan")
        frame["measures"] = EMBEDDING_MEASURE
    return frame


def head_sets_table(result: AblationResult) -> pd.DataFrame:
    """:func:`~mhainterp.ablation.engine.evaluate_head_sets`'s result as a table, one row per
    head set, with deltas against the result's clean model (its first empty set).

    Args:
        result: An :class:`~mhainterp.ablation.engine.AblationResult` whose head sets include
            the clean model (``[]``), e.g. ``evaluate_head_sets(model, data, [[], *sets])``.

    Returns:
        One row per set, in order (the clean one included): ``heads`` (``"L0H1,L0H3"``, the
        format every function accepts), ``n_ablated``, ``method``, the metrics, their
        ``delta_`` and ``baseline_`` columns.

    Raises:
        ParameterError: no head set of ``result`` is the clean model.

    Example:
        >>> from mhainterp.ablation.engine import evaluate_head_sets
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> model = handbuilt_model(["previous", "uniform", "previous"])
        >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
        >>> result = evaluate_head_sets(model, task, [[], ["L0H0", "L0H2"], "L0H1"])
        >>> table = head_sets_table(result)
        >>> table[["heads", "n_ablated", "delta_accuracy"]].round(2).values.tolist()
        [['', 0, 0.0], ['L0H0,L0H2', 2, -0.64], ['L0H1', 1, 0.0]]
    """
    if [] not in result.head_sets:
        raise invalid(
            "result",
            f"an AblationResult of the head sets {result.labels}",
            "one whose head sets include the clean model, []",
        )
    metrics = result.metrics()
    baseline = metrics[result.head_sets.index([])]
    names = metric_names(result.target_names)
    rows = [
        {
            "heads": label,
            "n_ablated": len(pairs),
            "method": result.method,
            **with_deltas(values, baseline, names),
        }
        for label, pairs, values in zip(result.labels, result.head_sets, metrics, strict=True)
    ]
    return pd.DataFrame(rows)


PAIRWISE_COLUMNS = [
    "head_a",
    "head_b",
    "layer_a",
    "layer_b",
    "method",
    "metric",
    "baseline",
    "ablated_a",
    "ablated_b",
    "ablated_joint",
    "damage_a",
    "damage_b",
    "damage_joint",
    "damage_sum",
    "interaction",
]


@uses_work_threads
def pairwise_ablation(
    model: HookedModel,
    data: Data,
    method: Method = "zero",
    reference: Data | None = None,
    *,
    heads: str | Sequence[HeadSpec] | None = None,
    pairs: Sequence[tuple[HeadSpec, HeadSpec]] | None = None,
    singles: Mapping[str, float] | None = None,
    n_eval: int = DEFAULT_N_EVAL,
    generator: torch.Generator | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    progress: bool = False,
    cache: CleanCache | None = None,
) -> pd.DataFrame:
    """Joint ablation of pairs of heads against the sum of their single ablations.

    Effects are *damage*: the loss increase or the accuracy drop, so positive means the
    ablation hurts. ``interaction = damage_joint - (damage_a + damage_b)``:

    - ``interaction >> 0``: removing both hurts far more than the two removals added up, i.e.
      each head can stand in for the other (redundancy, backup heads);
    - ``interaction << 0``: the heads' harms overlap (e.g. both are needed together);
    - ``interaction ~ 0``: the heads act independently.

    Args:
        model, data, method, reference, n_eval, generator, max_rows, progress, cache: As in
            :func:`head_importance`.
        heads: The heads to pair up (default: all heads of the model): every pair of them.
        pairs: Instead of ``heads``, exactly these pairs.
        singles: Head label -> the loss increase of removing it alone, already measured on
            this model, batch and method (the specialization test's single-head damage):
            those heads are not removed again; their other metrics are NaN.

    Returns:
        Tidy DataFrame, one row per pair (``head_a < head_b``, layer-major) and metric, with
        columns :data:`PAIRWISE_COLUMNS`.

    Example:
        >>> pairs = pairwise_ablation(model, task)  # doctest: +SKIP
        >>> pairs.query("metric == 'accuracy'").sort_values("interaction").tail(1)  # doctest: +SKIP
    """
    if pairs is not None and heads is not None:
        raise TypeError("give heads= or pairs=, not both")
    if pairs is None:
        chosen = (
            all_heads(model.cfg.n_layers, model.cfg.n_heads)
            if heads is None
            else resolve_heads(model, heads)
        )
        pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    else:
        pairs = sorted({tuple(resolve_heads(model, list(pair))) for pair in pairs})
        if any(len(pair) != 2 for pair in pairs):
            raise invalid("pairs", [format_heads(p) for p in pairs], "two different heads each")
        chosen = sorted({head for pair in pairs for head in pair})
    singles = singles or {}
    known = {h: float(singles[head_label(*h)]) for h in chosen if head_label(*h) in singles}
    removed = [head for head in chosen if head not in known]
    _, baseline, results, names = _with_clean(
        model,
        data,
        [[h] for h in removed] + [list(pair) for pair in pairs],
        method,
        reference,
        n_eval=n_eval,
        generator=generator,
        max_rows=max_rows,
        progress=progress,
        desc=f"pairwise ({method})",
        cache=cache,
    )
    single = dict(zip(removed, results[: len(removed)], strict=True))
    for head, loss_increase in known.items():  # measured before: the loss only
        single[head] = {m: baseline[m] + loss_increase if m == "loss" else math.nan for m in names}
    rows = []
    for (a, b), joint in zip(pairs, results[len(removed) :], strict=True):
        for metric in names:
            base = baseline[metric]
            damage_a = damage(metric, single[a][metric], base)
            damage_b = damage(metric, single[b][metric], base)
            damage_joint = damage(metric, joint[metric], base)
            rows.append(
                dict(
                    zip(
                        PAIRWISE_COLUMNS,
                        [
                            head_label(*a),
                            head_label(*b),
                            a[0],
                            b[0],
                            method,
                            metric,
                            base,
                            single[a][metric],
                            single[b][metric],
                            joint[metric],
                            damage_a,
                            damage_b,
                            damage_joint,
                            damage_a + damage_b,
                            damage_joint - (damage_a + damage_b),
                        ],
                        strict=True,
                    )
                )
            )
    return pd.DataFrame(rows, columns=PAIRWISE_COLUMNS)
