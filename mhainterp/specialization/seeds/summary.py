"""The sweep-level summary of the specialization test: per (task, h) the verdict's graded
numbers over seeds, and the comparisons between head counts behind every "beyond the seed
spread" statement.

:func:`specialization_summary` is the table (:data:`SUMMARY_COLUMNS`);
:func:`trend_comparisons` compares the smallest and the largest head count of each task on
every graded number and yes/no outcome (:func:`mhainterp.stats.compare_seeds`: Welch, exact
permutation where no group varies, Fisher's exact test for yes/no outcomes), Holm-corrected over
the comparisons of the task's Findings block (:func:`mhainterp.stats.beyond_seed_spread`);
:func:`summary_notes` writes the findings from those rows. All of it is computed when the
sweep is specialized and saved (:meth:`~.over_sweep.SweepSpecialization.save`); the report reads
it.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from mhainterp.render import format_p
from mhainterp.specialization.verdict.sentences import UNDEFINED_INDEX, group_key
from mhainterp.specialization.whom.damage import AXES
from mhainterp.stats import beyond_seed_spread, compare_seeds, describe, holm_block, seed_power_note

__all__ = [
    "COMPARISON_COLUMNS",
    "SUMMARY_COLUMNS",
    "display_summary",
    "specialization_summary",
    "summary_notes",
    "trend_comparisons",
]

_GRADED = [  # run-table column -> summary prefix: mean and std over seeds of each
    ("accuracy", "accuracy"),
    ("n_relations", "n_relations"),  # a count
    ("heads_per_relation", "heads_per_relation"),  # a count, over seeds with a relation
    ("frac_needed", "frac_needed"),  # shares of all heads from here on
    ("frac_backed_up", "frac_backed_up"),
    ("frac_dead", "frac_dead"),
    ("frac_label_flips", "frac_label_flips"),
    ("causal_selectivity", "causal_selectivity"),
]
_DIVISION_STATS = ("mean", "std", "null", "n_measured", "n_defined", "n_beyond")
SUMMARY_COLUMNS = [
    "task",
    "n_heads",
    "n_seeds",
    *[f"{name}_{stat}" for _, name in _GRADED for stat in ("mean", "std")],
    "n_seeds_with_relation",
    *[f"division_{axis}_{stat}" for axis in AXES for stat in _DIVISION_STATS],
    "causal_null_mean",
    "consistency",
    "random_matching",
    "null_shuffled",
    "consistency_p",
    "consistency_p_floor",
]
"""Columns of :attr:`SweepSpecialization.summary`, one row per (task, n_heads): the graded
numbers of the verdict as seed mean and sample std (``_mean``, ``_std``; std NaN with one
seed). Counts and shares are separate columns, never mixed: ``n_relations`` (relations some
live head holds) and ``heads_per_relation`` (over the ``n_seeds_with_relation`` seeds that
have one) are counts; ``frac_*`` are shares of all heads (needed, backed up, dead,
labels that change with a threshold x 0.8 or x 1.25). ``division_{axis}_*`` per axis of the
division of labour: of the ``n_measured`` seeds where it was measured, the index's seed
``mean`` and ``std`` over the ``n_defined`` where it is defined (two or more heads do damage),
its label-permutation ``null`` (seed mean) and ``n_beyond``, the seeds whose index beats its
null (the verdict's "divided"). ``accuracy`` is the sweep's ``val_accuracy`` when
known; the consistency columns are NaN with fewer than 2 seeds."""


def display_summary(group: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """:data:`SUMMARY_COLUMNS` rows formatted for reading, as ``(caption, table)`` pairs of at
    most 8 columns each (a table wider than that scrolls in a report): counts, shares of
    heads, one column per measured division axis (``index ± std vs null (seeds beyond it /
    seeds)``), and the causal selectivity and cross-seed consistency.

    Example:
        >>> [caption for caption, _ in display_summary(spec.summary)]  # doctest: +SKIP
        ['Counts', 'Shares of all heads', 'Division of labour', 'Causal and consistency']
    """

    def pm(name: str) -> list[str]:
        mean, std = group[f"{name}_mean"], group[f"{name}_std"]
        return [_fmt(m, s) for m, s in zip(mean, std, strict=True)]

    h = {"h": group["n_heads"].to_numpy(), "seeds": group["n_seeds"].to_numpy()}
    tables = [
        (
            "Counts (mean ± sample std over seeds)",
            {
                **h,
                "accuracy": pm("accuracy"),
                "relations covered (count)": pm("n_relations"),
                "heads per relation (count)": pm("heads_per_relation"),
            },
        ),
        (
            "Shares of all heads (mean ± sample std over seeds)",
            {
                **h,
                "needed": pm("frac_needed"),
                "backed up": pm("frac_backed_up"),
                "dead": pm("frac_dead"),
                "labels that flip": pm("frac_label_flips"),
            },
        ),
    ]
    division = {
        f"by {axis}": [_division_cell(row, axis) for _, row in group.iterrows()]
        for axis in AXES
        if (group[f"division_{axis}_n_measured"] > 0).any()  # not measured at any h: no column
    }
    if division:
        tables.append(("Division index (seeds beyond the null / seeds)", {**h, **division}))
    other: dict[str, Any] = {}
    if group["causal_selectivity_mean"].notna().any():
        other["causal selectivity"] = pm("causal_selectivity")
        other["its null"] = group["causal_null_mean"].map(lambda v: f"{v:.2f}").to_numpy()
    if group["consistency"].notna().any():
        other["consistency"] = group["consistency"].to_numpy()
        other["random matching"] = group["random_matching"].to_numpy()
        other["margin"] = (group["consistency"] - group["random_matching"]).to_numpy()
        other["head-shuffled null"] = group["null_shuffled"].to_numpy()
        other["p"] = [
            format_p(p, floor)
            for p, floor in zip(group["consistency_p"], group["consistency_p_floor"], strict=True)
        ]
    if other:
        tables.append(("Causal selectivity and cross-seed consistency", {**h, **other}))
    return [(caption, pd.DataFrame(columns)) for caption, columns in tables]


def _division_cell(row: pd.Series, axis: str) -> str:
    """``0.25 ± 0.06 vs 0.00 (3/3 beyond)``, or why there is no index."""
    d = {stat: row[f"division_{axis}_{stat}"] for stat in _DIVISION_STATS}
    if not d["n_measured"]:
        return "not measured"
    if not d["n_defined"]:
        return UNDEFINED_INDEX
    return (
        f"{_fmt(d['mean'], d['std'])} vs {d['null']:.2f} "
        f"({int(d['n_beyond'])}/{int(d['n_measured'])} beyond)"
    )


def specialization_summary(
    runs: pd.DataFrame,
    consistency: dict[str, dict[str, float]] | None = None,
    division: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per (task, n_heads): the verdict's graded numbers over seeds (:data:`SUMMARY_COLUMNS`).

    Args:
        runs: The per-run table (:data:`~mhainterp.specialization.battery.RUN_COLUMNS`; with
            ``val_accuracy`` or ``accuracy``). Columns it lacks are NaN in the summary.
        consistency: ``"task/h"`` -> consistency summary (from the combined verdict).
        division: The division indices per run and axis (``run, by, index, null_index``, as
            :attr:`SpecializationResult.division`); the ``run`` names match ``runs``. Whether
            a run is beyond the null is read from its ``specialized_along``.

    Example:
        >>> runs = pd.DataFrame({"run": ["a", "b"], "task": ["t", "t"], "n_heads": [2, 2],
        ...     "n_relations": [1, 2], "frac_backed_up": [0.0, 0.5], "accuracy": [0.9, 0.8],
        ...     "specialized_along": ["token", ""]})
        >>> division = pd.DataFrame({"run": ["a", "b"], "by": ["token"] * 2,
        ...     "index": [0.3, 0.1], "null_index": [0.0, 0.02]})
        >>> row = specialization_summary(runs, division=division).iloc[0]
        >>> [float(row[c]) for c in ("n_relations_mean", "frac_backed_up_mean",
        ...                          "division_token_mean")]
        [1.5, 0.25, 0.2]
        >>> [int(row["division_token_n_defined"]), int(row["division_token_n_beyond"])]
        [2, 1]
    """
    consistency = consistency or {}
    runs = runs.copy()
    if "val_accuracy" in runs.columns:
        runs["accuracy"] = runs["val_accuracy"]
    for column, _ in _GRADED:
        if column not in runs.columns:
            runs[column] = math.nan
    division = division if division is not None and len(division) else None
    rows = []
    for (task, h), group in runs.groupby(["task", "n_heads"], sort=False):
        summary = consistency.get(group_key(task, int(h)), {})
        row: dict[str, Any] = {"task": task, "n_heads": int(h), "n_seeds": len(group)}
        for column, name in _GRADED:
            stats = describe(group[column].dropna())
            row[f"{name}_mean"], row[f"{name}_std"] = stats["mean"], stats["std"]
        row["n_seeds_with_relation"] = int((group["n_relations"].fillna(0) > 0).sum())
        row.update(_division_summary(group, division))
        row["causal_null_mean"] = (
            float(group["causal_null"].mean()) if "causal_null" in group else math.nan
        )
        row["consistency"] = summary.get("consistency", math.nan)
        row["random_matching"] = summary.get("random_matching", math.nan)
        row["null_shuffled"] = summary.get("null_shuffled", math.nan)
        row["consistency_p"] = summary.get("p_value", math.nan)
        row["consistency_p_floor"] = summary.get("p_floor", math.nan)
        rows.append(row)
    table = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return table.sort_values(["task", "n_heads"], kind="stable", ignore_index=True)


def _division_summary(group: pd.DataFrame, division: pd.DataFrame | None) -> dict[str, float]:
    """``division_{axis}_{mean,std,null,n,beyond}`` of one (task, h) group of runs."""
    out: dict[str, float] = {}
    mine = None if division is None else division[division["run"].isin(group["run"])]
    along = group.get("specialized_along", pd.Series([""] * len(group))).fillna("").astype(str)
    for axis in AXES:
        rows = pd.DataFrame() if mine is None else mine[mine["by"] == axis]
        index = rows["index"].dropna() if len(rows) else pd.Series(dtype=float)
        stats = describe(index)
        out[f"division_{axis}_mean"], out[f"division_{axis}_std"] = stats["mean"], stats["std"]
        null = rows["null_index"].dropna() if len(rows) else pd.Series(dtype=float)
        out[f"division_{axis}_null"] = float(null.mean()) if len(null) else math.nan
        out[f"division_{axis}_n_measured"] = int(rows["run"].nunique()) if len(rows) else 0
        out[f"division_{axis}_n_defined"] = len(index)
        out[f"division_{axis}_n_beyond"] = int(sum(axis in a.split(",") for a in along))
    return out


TRENDS = (
    ("accuracy", "accuracy", "graded"),
    ("n_relations", "relations covered (a count)", "graded"),
    ("heads_per_relation", "heads per relation (a count)", "graded"),
    ("frac_needed", "needed share", "graded"),
    ("frac_backed_up", "backed-up share", "graded"),
    ("frac_dead", "dead share", "graded"),
    ("causal_selectivity", "causal selectivity", "graded"),
)
"""``(run-table column, words, kind)`` of every number the Findings compare across h."""

COMPARISON_COLUMNS = [
    "task",
    "quantity",
    "kind",
    "n_heads_a",
    "n_heads_b",
    "mean_a",
    "std_a",
    "n_a",
    "mean_b",
    "std_b",
    "n_b",
    "diff",
    "test",
    "p",
    "p_holm",
    "beyond",
]
"""Columns of :func:`trend_comparisons`: one row per (task, quantity), the smallest head count
``a`` against the largest ``b``; ``diff = mean_b - mean_a``; ``p_holm`` Holm-corrected over the
task's rows; ``beyond`` = ``p_holm < alpha`` (None when no test could be made)."""


def _per_seed(runs: pd.DataFrame, division: pd.DataFrame | None) -> pd.DataFrame:
    """``runs`` with one column per division axis: ``division_{axis}`` (the index, NaN when
    undefined) and ``divided_{axis}`` (1.0 when the seed divides the work along it)."""
    runs = runs.copy()
    if "val_accuracy" in runs.columns:
        runs["accuracy"] = runs["val_accuracy"]
    along = runs.get("specialized_along", pd.Series([""] * len(runs), index=runs.index))
    along = along.fillna("").astype(str)
    for axis in AXES:
        rows = pd.DataFrame() if division is None else division[division["by"] == axis]
        index = dict(zip(rows.get("run", []), rows.get("index", []), strict=True))
        measured = runs["run"].isin(index)
        runs[f"division_{axis}"] = runs["run"].map(index).astype(float)
        runs[f"divided_{axis}"] = [
            float(axis in a.split(",")) if m else math.nan
            for a, m in zip(along, measured, strict=True)
        ]
    return runs


def trend_comparisons(
    runs: pd.DataFrame, division: pd.DataFrame | None = None, *, alpha: float = 0.05
) -> pd.DataFrame:
    """The smallest vs the largest head count of each task on every Findings quantity.

    Args:
        runs: The per-run table (``task, n_heads, run`` and the :data:`TRENDS` columns; those
            it lacks are skipped).
        division: Division indices per run and axis (``run, by, index``), or None.
        alpha: Family-wise error rate of one task's block of comparisons.

    Returns:
        One row per (task, quantity) with a defined value in both groups, columns
        :data:`COMPARISON_COLUMNS`.

    Example:
        >>> runs = pd.DataFrame({"task": ["t"] * 6, "n_heads": [1, 1, 1, 8, 8, 8],
        ...     "run": list("abcdef"), "accuracy": [0.5, 0.52, 0.51, 0.9, 0.91, 0.92]})
        >>> row = trend_comparisons(runs).iloc[0]
        >>> row["test"], bool(row["beyond"])
        ('Welch', True)
    """
    division = division if division is not None and len(division) else None
    runs = _per_seed(runs, division)
    quantities = [q for q in TRENDS if q[0] in runs.columns]
    quantities += [(f"division_{a}", f"division index by {a}", "graded") for a in AXES]
    quantities += [(f"divided_{a}", f"seeds divided by {a}", "yes/no") for a in AXES]
    rows = []
    for task, group in runs.groupby("task", sort=False):
        heads = sorted(group["n_heads"].unique())
        if len(heads) < 2:
            continue
        a, b = group[group["n_heads"] == heads[0]], group[group["n_heads"] == heads[-1]]
        block = []
        for column, words, kind in quantities:
            x, y = a[column].dropna().to_numpy(float), b[column].dropna().to_numpy(float)
            if not x.size or not y.size:
                continue
            da, db = describe(x), describe(y)
            block.append(
                {
                    "task": task,
                    "quantity": words,
                    "kind": kind,
                    "n_heads_a": int(heads[0]),
                    "n_heads_b": int(heads[-1]),
                    "mean_a": da["mean"],
                    "std_a": da["std"],
                    "n_a": da["n"],
                    "mean_b": db["mean"],
                    "std_b": db["std"],
                    "n_b": db["n"],
                    **compare_seeds(x, y, kind),
                }
            )
        p = [r["p"] for r in block]
        for row, adjusted, beyond in zip(
            block, holm_block(p), beyond_seed_spread(p, alpha), strict=True
        ):
            row["p_holm"] = math.nan if adjusted is None else adjusted
            row["beyond"] = beyond
        rows += block
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def comparison_text(row: pd.Series | dict[str, Any]) -> str:
    """``"accuracy 0.51 ± 0.01 (h=1) -> 0.91 ± 0.01 (h=8): beyond the seed spread (Welch p =
    3e-05, Holm p = 0.0002)"``.

    Example:
        >>> print(comparison_text({"quantity": "accuracy", "mean_a": 0.5, "std_a": 0.1,
        ...     "n_heads_a": 1, "mean_b": 0.6, "std_b": 0.1, "n_heads_b": 4, "test": "Welch",
        ...     "p": 0.3, "p_holm": 0.6, "beyond": False}))  # doctest: +NORMALIZE_WHITESPACE
        accuracy 0.50 ± 0.10 (h=1) -> 0.60 ± 0.10 (h=4): within the seed spread
        (Welch p = 0.3, Holm p = 0.6)
    """
    text = (
        f"{row['quantity']} {_fmt(row['mean_a'], row['std_a'])} (h={row['n_heads_a']}) -> "
        f"{_fmt(row['mean_b'], row['std_b'])} (h={row['n_heads_b']})"
    )
    if row["beyond"] is None or (isinstance(row["beyond"], float) and math.isnan(row["beyond"])):
        return text + " (too few seeds to compare)"
    where = "beyond" if bool(row["beyond"]) else "within"
    return (
        f"{text}: {where} the seed spread ({row['test']} {format_p(row['p'])}, Holm "
        f"{format_p(row['p_holm'])})"
    )


def summary_notes(
    summary: pd.DataFrame, comparisons: pd.DataFrame, *, alpha: float = 0.05
) -> list[str]:
    """The Findings of a sweep's specialization, one block per task, from the saved rows.

    Example:
        >>> notes = summary_notes(spec.summary, spec.comparisons)  # doctest: +SKIP
    """
    notes = []
    for task, group in summary.groupby("task", sort=False):
        if len(group) < 2:
            notes.append(f"{task}: a single head count (h={group['n_heads'].iloc[0]}); no trend.")
            continue
        mine = comparisons[comparisons["task"] == task]
        parts = [comparison_text(row) for _, row in mine.iterrows()]
        if parts:
            notes.append(
                f"{task} (smallest vs largest h; {len(parts)} comparisons, Holm-corrected "
                f"together at {alpha:g}): " + "; ".join(parts) + "."
            )
        for row in group.dropna(subset=["consistency"]).itertuples(index=False):
            margin = row.consistency - row.random_matching
            notes.append(
                f"{task}, h={row.n_heads}: role profiles match across {row.n_seeds} seeds at "
                f"{row.consistency:.2f}, {margin:+.2f} over a random matching "
                f"({row.random_matching:.2f}); against the null actually tested, heads "
                f"shuffled across seeds (each role's marginals kept), {row.null_shuffled:.2f} "
                f"({format_p(row.consistency_p, row.consistency_p_floor)})."
            )
    n = summary["n_seeds"]
    per_task = comparisons.groupby("task").size() if len(comparisons) else pd.Series([1])
    note = seed_power_note(int(n.min()), alpha, int(per_task.max()))
    if n.min() != n.max():
        note += f" Seeds per head count range from {n.min()} to {n.max()}."
    notes.append(note)
    return notes


def _fmt(mean: float, std: float) -> str:
    """``0.25 ± 0.06``; the mean alone when the std is undefined; empty when no mean."""
    if math.isnan(mean):
        return ""
    return f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"
