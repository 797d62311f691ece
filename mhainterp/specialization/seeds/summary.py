"""The sweep-level summary of the specialization test: per (task, h) the verdict's graded
numbers over seeds, and the comparisons between head counts that answer "does h matter?".

- :func:`specialization_summary` is the table (:func:`summary_columns`);
- :func:`head_count_comparisons` compares *adjacent* head counts of each task on every
  measure of :func:`findings_measures` (accuracy, relations covered, heads per relation, the
  needed and backed-up shares, the division index per axis) with
  :func:`mhainterp.sweep.compare.compare_head_counts`: each difference of seed means with its 95%
  interval, the exact permutation test below 10 seeds per head count (its floor stated) and
  Welch from there, Holm over the task's block. A measure undefined at a head count (h = 1
  has no division index) is left out there, never counted as 0 or "no";
- :func:`answers` gives per task the one-line answer (:mod:`.answer`); :func:`summary_notes`
  writes the evidence behind it: what n would settle what is still open, every comparison in
  words, and the consistency notes.

All of it is computed when the sweep is specialized and saved
(:meth:`mhainterp.specialization.folders.SweepSpecialization.save`); the report reads it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from mhainterp.render import format_p
from mhainterp.specialization.nulls import HEADS_SHUFFLED_NULL, SAME_FUNCTION_NULL
from mhainterp.specialization.seeds.answer import MIN_INDEX, answer_line
from mhainterp.specialization.verdict.division_words import BASIS_NAMES, UNDEFINED_INDEX
from mhainterp.specialization.verdict.sentences import group_key
from mhainterp.stats import describe
from mhainterp.sweep.compare import (
    all_seeds_equal,
    compare_head_counts,
    comparison_sentence,
    seed_power_note,
)
from mhainterp.tasks import AXES

__all__ = [
    "BLOCK_MARK",
    "OPEN_MARK",
    "answers",
    "display_summary",
    "findings_measures",
    "head_count_comparisons",
    "open_note",
    "per_seed_measures",
    "specialization_summary",
    "summary_columns",
    "summary_notes",
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
_DIVISION_STATS = (
    "mean",
    "std",
    "null",
    "null_high",
    "n_measured",
    "n_defined",
    "n_beyond",
    "basis",
)


def summary_columns() -> list[str]:
    """Columns of :attr:`~mhainterp.specialization.SweepSpecialization.summary`, one row per (task,
    n_heads): the graded numbers of the verdict as seed mean and sample std (``_mean``, ``_std``;
    std NaN with one seed). Counts and shares are separate columns, never mixed: ``n_relations``
    (relations some live head holds) and ``heads_per_relation`` (over the ``n_seeds_with_relation``
    seeds that have one) are counts; ``frac_*`` are shares of all heads (needed, backed up, dead,
    labels that change with a threshold x 0.8 or x 1.25). ``division_{axis}_*`` per axis of the
    division of labour: of the ``n_measured`` seeds where it was measured, the index's seed ``mean``
    and ``std`` over the ``n_defined`` where it is defined (two or more heads or groups do the
    work), its null (same-function heads: noisy copies of the model compared on split halves of the
    sequences): ``null`` the seed mean of the null's mean, ``null_high`` the seed mean of its upper
    ``1 - alpha`` quantile, the line each seed's call uses, and ``n_beyond``, the seeds whose call
    is "divided". ``accuracy`` is the sweep's ``val_accuracy`` when known; the consistency columns
    are NaN with fewer than 2 seeds.

    Example:
        >>> summary_columns()[:3]
        ['task', 'n_heads', 'n_seeds']
    """
    return [
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


def display_summary(group: pd.DataFrame, alpha: float = 0.05) -> list[tuple[str, pd.DataFrame]]:
    """:func:`summary_columns` rows formatted for reading, as ``(caption, table)`` pairs of at
    most 8 columns each (a table wider than that scrolls in a report): counts, shares of
    heads, one column per measured division axis (``index ± std vs null q95 (seeds divided /
    seeds)``, the null's upper ``1 - alpha`` quantile, the line the call uses), and the causal
    selectivity and cross-seed consistency. One row per head count whatever the number of
    seeds: seeds enter as mean ± std and counts, never as columns.

    Example:
        >>> [caption for caption, _ in display_summary(spec.summary)]  # doctest: +SKIP
        ['Counts', 'Shares of all heads', 'Division of labour', 'Causal and consistency']
    """

    def pm(name: str, n_column: str | None = None) -> list[str]:
        """``mean ± std``, with ``(n = k)`` where the measure has fewer seeds than the row."""
        mean, std = group[f"{name}_mean"], group[f"{name}_std"]
        cells = [_fmt(m, s) for m, s in zip(mean, std, strict=True)]
        if n_column is None or n_column not in group:
            return cells
        return [
            cell + (f" (n = {k})" if cell and k != n else "")
            for cell, k, n in zip(cells, group[n_column], group["n_seeds"], strict=True)
        ]

    h = {"h": group["n_heads"].to_numpy(), "seeds": group["n_seeds"].to_numpy()}
    tables = [
        (
            "Counts (mean ± sample std over seeds)",
            {
                **h,
                "accuracy": pm("accuracy"),
                "relations covered (count)": pm("n_relations"),
                "heads per relation (count)": pm("heads_per_relation", "n_seeds_with_relation"),
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
        f"by {axis}": [_division_cell(row, axis, alpha) for _, row in group.iterrows()]
        for axis in AXES
        if (group[f"division_{axis}_n_measured"] > 0).any()  # not measured at any h: no column
    }
    if division:
        level = round(100 * (1 - alpha))
        caption = (
            f"Division index (seed mean ± std) vs q{level}, the seed mean of the null's upper "
            f"{level}% quantile, the line each seed's call must clear (the null: "
            f"{SAME_FUNCTION_NULL}); seeds divided / seeds measured"
        )
        tables.append((caption, {**h, **division}))
    other: dict[str, Any] = {}
    if group["causal_selectivity_mean"].notna().any():
        other["causal selectivity"] = pm("causal_selectivity")
        other["its null"] = group["causal_null_mean"].map(lambda v: f"{v:.2f}").to_numpy()
    if group["consistency"].notna().any():
        other["consistency"] = group["consistency"].to_numpy()
        other["random matching"] = group["random_matching"].to_numpy()
        other["margin"] = (group["consistency"] - group["random_matching"]).to_numpy()
        other["null: heads shuffled"] = group["null_shuffled"].to_numpy()
        other["p"] = [
            format_p(p, floor)
            for p, floor in zip(group["consistency_p"], group["consistency_p_floor"], strict=True)
        ]
    if other:
        tables.append(("Causal selectivity and cross-seed consistency", {**h, **other}))
    return [(caption, pd.DataFrame(columns)) for caption, columns in tables]


def _division_cell(row: pd.Series, axis: str, alpha: float = 0.05) -> str:
    """``0.25 ± 0.06 vs q95 0.03 (2/3 divided; 1 undefined)``: the index against the null's
    upper quantile the call uses (its mean, named so, where an old table lacks the quantile),
    or why there is no index."""
    d = {stat: row.get(f"division_{axis}_{stat}", math.nan) for stat in _DIVISION_STATS}
    if not d["n_measured"]:
        return "not measured"
    if not d["n_defined"]:
        return UNDEFINED_INDEX
    if isinstance(d["null_high"], float) and not math.isnan(d["null_high"]):
        null = f"q{round(100 * (1 - alpha))} {d['null_high']:.2f}"  # the line the call uses
    else:
        null = f"null mean {d['null']:.2f}"
    undefined = int(d["n_measured"]) - int(d["n_defined"])
    seeds = f"{int(d['n_beyond'])}/{int(d['n_measured'])} divided"
    text = f"{_fmt(d['mean'], d['std'])} vs {null} ({seeds}"
    text += f"; {undefined} undefined" if undefined else ""
    bases = [b for b in str(d["basis"]).split("/") if b in BASIS_NAMES]
    return text + (f"; {', '.join(BASIS_NAMES[b] for b in bases)})" if bases else ")")


def specialization_summary(
    runs: pd.DataFrame,
    consistency: dict[str, dict[str, float]] | None = None,
    division: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per (task, n_heads): the verdict's graded numbers over seeds (:func:`summary_columns`).

    Args:
        runs: The per-run table (:data:`~mhainterp.specialization.verdict.result.RUN_COLUMNS`; with
            ``val_accuracy`` or ``accuracy``). Columns it lacks are NaN in the summary.
        consistency: ``"task/h"`` -> consistency summary (from the combined verdict).
        division: The division indices per run and axis (``run, by, index, null_index``, as
            :attr:`~mhainterp.specialization.SpecializationResult.division`); the ``run`` names
            match ``runs``. Whether a run is beyond the null is read from its ``specialized_along``.

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
    table = pd.DataFrame(rows, columns=summary_columns())
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
        for stat, column in (("null", "null_index"), ("null_high", "null_high")):
            null = rows[column].dropna() if column in rows.columns else pd.Series(dtype=float)
            out[f"division_{axis}_{stat}"] = float(null.mean()) if len(null) else math.nan
        out[f"division_{axis}_n_measured"] = int(rows["run"].nunique()) if len(rows) else 0
        out[f"division_{axis}_n_defined"] = len(index)
        out[f"division_{axis}_n_beyond"] = int(sum(axis in a.split(",") for a in along))
        out[f"division_{axis}_basis"] = _bases(rows)
    return out


def _bases(rows: pd.DataFrame) -> str:
    """The bases an axis's calls rest on over the seeds (``kept``, ``single/kept``; "" for
    none: undefined everywhere, or a division table given without bases)."""
    if "basis" not in rows.columns:
        return ""
    bases = rows["basis"].fillna("").astype(str)
    return "/".join(sorted({b for b in bases if b}))


def findings_measures() -> tuple[tuple[str, str, str], ...]:
    """``(per-seed column, words, family)`` of every measure the Findings compare across h. Each
    family is one question (does h change the accuracy, where the heads look, whether they are
    needed, whom they serve), Holm-corrected on its own within the task. The dead share and the
    causal selectivity stay in the seed table but out of the tests: every measure added is one
    more Holm comparison per pair of head counts."""
    return (
        ("accuracy", "accuracy", "accuracy"),
        ("n_relations", "relations covered (a count)", "where"),
        ("heads_per_relation", "heads per relation (a count)", "where"),
        ("frac_needed", "needed share", "needed"),
        ("frac_backed_up", "backed-up share", "needed"),
        *((f"division_{axis}", f"division index by {axis}", "whom") for axis in AXES),
    )


OPEN_MARK = ": what more seeds would settle: "
"""In every :func:`open_note`, right after the task: how the report finds it."""
BLOCK_MARK = "adjacent head counts"
"""In the note that lists a task's comparisons: how the report finds it."""

_DIVISION_PREFIX = "division_"


def per_seed_measures(runs: pd.DataFrame, division: pd.DataFrame | None) -> pd.DataFrame:
    """``runs`` with ``accuracy`` and one ``division_{axis}`` column per measured axis: the
    seed's index, NaN where it is undefined (one head; "cannot tell")."""
    runs = runs.copy()
    if "val_accuracy" in runs.columns:
        runs["accuracy"] = runs["val_accuracy"]
    if division is None:
        return runs
    for axis in AXES:
        rows = division[division["by"] == axis]
        if len(rows):
            index = dict(zip(rows["run"], rows["index"], strict=True))
            runs[f"{_DIVISION_PREFIX}{axis}"] = runs["run"].map(index).astype(float)
    return runs


def head_count_comparisons(
    runs: pd.DataFrame, division: pd.DataFrame | None = None, *, alpha: float = 0.05
) -> pd.DataFrame:
    """Adjacent head counts of each task on every :func:`findings_measures` measure, Holm over
    the task's block (:func:`mhainterp.sweep.compare.compare_head_counts`).

    Args:
        runs: The per-run table (``task, n_heads, run`` and the measures' columns; those it
            lacks are skipped).
        division: Division indices per run and axis (``run, by, index``), or None.
        alpha: Family-wise error rate of one task's block.

    Returns:
        :data:`mhainterp.sweep.compare.HEAD_COUNT_COLUMNS`, one row per (task, measure,
        adjacent pair of head counts where the measure is defined at both).

    Example:
        >>> runs = pd.DataFrame({"task": ["t"] * 6, "n_heads": [1, 1, 1, 4, 4, 4],
        ...     "run": list("abcdef"), "accuracy": [0.5, 0.52, 0.51, 0.9, 0.91, 0.92]})
        >>> division = pd.DataFrame({"run": list("abcdef"), "by": ["token"] * 6,
        ...     "index": [float("nan")] * 3 + [0.1, 0.2, 0.15]})
        >>> table = head_count_comparisons(runs, division)
        >>> table["quantity"].tolist()  # h = 1 has no index: nothing to compare it with
        ['accuracy']
        >>> table.loc[0, "verdict"]
        'no difference shown (complete separation at the floor)'
    """
    division = division if division is not None and len(division) else None
    per_seed = per_seed_measures(runs, division)
    return gate_division_verdicts(compare_head_counts(per_seed, findings_measures(), alpha=alpha))


BELOW_GATE = f" (below the {MIN_INDEX:g} effect gate)"
"""Added to the verdict of a division index change beyond the seed spread whose seed means
both stay under the division test's effect gate: beyond the spread is not an effect."""


def gate_division_verdicts(comparisons: pd.DataFrame) -> pd.DataFrame:
    """``comparisons`` with :data:`BELOW_GATE` on the verdict of each division index change
    beyond the spread whose seed means both stay below the effect gate ("h=8 higher (below the
    0.02 effect gate)", reverse's index by token 0.001 -> 0.003): such an index divides
    nothing, as the answer line and the README's grid already treat it."""
    beyond = comparisons["beyond"].map(lambda v: v is True or v == True).astype(bool)  # noqa: E712
    small = comparisons[["mean_a", "mean_b"]].max(axis=1) < MIN_INDEX
    below = _is_division(comparisons) & beyond & small
    comparisons.loc[below, "verdict"] = comparisons.loc[below, "verdict"] + BELOW_GATE
    return comparisons


def _is_division(rows: pd.DataFrame) -> pd.Series:
    return rows["measure"].astype(str).str.startswith(_DIVISION_PREFIX)


def _family_size(family: str, rows: pd.DataFrame) -> str:
    """``where 3``: the comparisons Holm corrected together (those with a p); the untested
    ones, where there are, said apart (``where 3 (1 untested)``)."""
    tested = int(rows["p"].notna().sum())
    untested = len(rows) - tested
    return f"{family} {tested}" + (f" ({untested} untested)" if untested else "")


def _levels(rows: pd.DataFrame, alpha: float) -> str:
    """``α = 0.05/3``, or ``α = 0.05/m, m = 2 to 4 by question`` where the tested rows come
    from Holm families of different sizes."""
    sizes = rows.groupby("family")["n_holm"].max() if "family" in rows else rows["n_holm"]
    low, high = int(sizes.min()), int(sizes.max())
    return (
        f"α = {alpha:g}/{high}"
        if low == high
        else f"α = {alpha:g}/m, m = {low} to {high} by question"
    )


def open_note(rows: pd.DataFrame, alpha: float) -> str:
    """What n would settle the comparisons still open: tested, not beyond the spread, and not
    equal in every seed (nothing would settle those)."""
    tested = rows[rows["beyond"].notna()]
    not_shown = tested["beyond"].map(lambda v: not bool(v))
    equal = tested.apply(all_seeds_equal, axis=1).astype(bool)
    still = tested[not_shown & ~equal]
    n_to_settle = still["n_to_settle"].astype(float)
    finite = still[np.isfinite(n_to_settle)]
    rest = []
    if len(still) > len(finite):
        rest.append(f"{len(still) - len(finite)} show no difference of the seed means at all")
    if equal.any():
        rest.append(f"{int(equal.sum())} show every seed equal")
    tail = "".join(f"; {r}" for r in rest)
    if not len(finite):
        return f"no comparison is still open{tail}" if not len(still) else tail.lstrip("; ")
    worst = finite.loc[finite["n_to_settle"].astype(float).idxmax()]
    low, high = int(finite["n_to_settle"].min()), int(finite["n_to_settle"].max())
    span = f"n = {low}" if low == high else f"n = {low} to {high}"
    return (
        f"{len(finite)} of {len(tested)} comparisons still open{tail}; about {span} seeds per "
        f"head count would settle {'it' if len(finite) == 1 else 'them'} (80% power of a "
        f"two-sample t test at {_levels(finite, alpha)} on each observed difference and "
        "spread, with "
        f"an exact floor below that α; the most for {worst['quantity']} "
        f"h={worst['n_heads_a']} → {worst['n_heads_b']})"
    )


def answers(comparisons: pd.DataFrame, alpha: float = 0.05) -> dict[str, str]:
    """Per task compared over head counts, its one-line answer (:func:`answer_line`).

    Example:
        >>> runs = pd.DataFrame({"task": ["t"] * 6, "n_heads": [1, 1, 1, 4, 4, 4],
        ...     "run": list("abcdef"), "accuracy": [0.5, 0.52, 0.51, 0.9, 0.91, 0.92]})
        >>> answers(head_count_comparisons(runs))["t"]  # doctest: +NORMALIZE_WHITESPACE
        't: accuracy 0.51 → 0.91 from h = 1 to 4, every seed, but 3 seeds per h cannot show
        a change (exact floor p = 0.1, Holm over 1); 4 can'
    """
    return {
        str(task): answer_line(str(task), rows, alpha)
        for task, rows in comparisons.groupby("task", sort=False)
    }


def _undefined_at(group: pd.DataFrame) -> list[int]:
    """Head counts of a summary group where some axis was measured and no seed has an index."""
    out = []
    for row in group.itertuples(index=False):
        measured = [getattr(row, f"division_{a}_n_measured", 0) for a in AXES]
        defined = [getattr(row, f"division_{a}_n_defined", 0) for a in AXES]
        if any(m > 0 for m in measured) and not any(d > 0 for d in defined):
            out.append(int(row.n_heads))
    return out


def summary_notes(
    summary: pd.DataFrame, comparisons: pd.DataFrame, *, alpha: float = 0.05
) -> list[str]:
    """The evidence behind a sweep's answers (:func:`answers`), from the saved rows: per task
    where the division index is undefined, what n would settle what is open, the block of
    comparisons (every one in words, with the size of the Holm family it was corrected in)
    and the cross-seed consistency per head count; then what the number of seeds can show
    (:func:`mhainterp.sweep.compare.seed_power_note`).

    Example:
        >>> notes = summary_notes(spec.summary, spec.comparisons)  # doctest: +SKIP
    """
    notes = []
    for task, group in summary.groupby("task", sort=False):
        if len(group) < 2:
            notes.append(f"{task}: a single head count (h={group['n_heads'].iloc[0]}); no trend.")
            continue
        mine = comparisons[comparisons["task"] == task]
        undefined = _undefined_at(group)
        if undefined:
            notes.append(
                f"{task}: the division index is undefined at h = {', '.join(map(str, undefined))}"
                " (fewer than 2 heads or groups do the work: left out, not counted as 0)."
            )
        if len(mine):
            notes.append(f"{task}{OPEN_MARK}{open_note(mine, alpha)}.")
            parts = [comparison_sentence(row) for _, row in mine.iterrows()]
            families = ", ".join(
                _family_size(family, rows) for family, rows in mine.groupby("family", sort=False)
            )
            notes.append(
                f"{task} ({BLOCK_MARK}; Holm-corrected at {alpha:g} within each question's "
                f"family: {families}): " + "; ".join(parts) + "."
            )
        for row in group.dropna(subset=["consistency"]).itertuples(index=False):
            margin = row.consistency - row.random_matching
            notes.append(
                f"{task}, h={row.n_heads}: role profiles match across {row.n_seeds} seeds at "
                f"{row.consistency:.2f}, {margin:+.2f} over a random matching "
                f"({row.random_matching:.2f}); against the null actually tested, "
                f"{HEADS_SHUFFLED_NULL}, {row.null_shuffled:.2f} "
                f"({format_p(row.consistency_p, row.consistency_p_floor)})."
            )
    n = summary["n_seeds"]
    # every question of every task is its own Holm family: the note spans their sizes
    sizes = comparisons.groupby(["task", "family"])["n_holm"].max() if len(comparisons) else None
    largest = int(sizes.max()) if sizes is not None and sizes.notna().any() else 1
    smallest = int(sizes[sizes > 0].min()) if sizes is not None and (sizes > 0).any() else largest
    note = seed_power_note(int(n.min()), alpha, max(1, largest), smallest_family=smallest)
    if n.min() != n.max():
        note += f" Seeds per head count range from {n.min()} to {n.max()}."
    notes.append(note)
    return notes


def _fmt(mean: float, std: float) -> str:
    """``0.25 ± 0.06``; the mean alone when the std is undefined; empty when no mean."""
    if math.isnan(mean):
        return ""
    return f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"
