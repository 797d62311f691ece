"""The head-count comparison: adjacent head counts of each task compared over seeds, and the
words that say it.

- :func:`compare_head_counts` compares adjacent head counts of each task on every measure
  (where the measure is defined at both), Holm-corrected within each family of the task
  (:func:`~mhainterp.stats.beyond_seed_spread`); its columns are :data:`HEAD_COUNT_COLUMNS`,
  each row's ``verdict`` in a few words;
- :func:`comparison_sentence` writes one row as a sentence and :func:`comparison_display` the
  rows as a table to read, with :func:`format_number` and :func:`difference_text`;
- :func:`seed_power_note` says in one sentence what ``n`` seeds per head count can and cannot
  show; :data:`POWER_NOTE_MARK` lets a reader (the report) find that note among others.

The numbers these rest on (tests, intervals, corrections, power) live in :mod:`mhainterp.stats`,
which writes no sentences. This module imports only the ground floor: :mod:`mhainterp.stats`,
:mod:`mhainterp.render` (how a p is printed) and :mod:`mhainterp.validation`. Its readers sit
above it: the sweep's summary, the Findings over seeds (``specialization.seeds``), the report.

Example:
    >>> runs = pd.DataFrame({"task": ["t"] * 6, "n_heads": [4, 4, 4, 8, 8, 8],
    ...                      "acc": [0.50, 0.52, 0.51, 0.90, 0.91, 0.92]})
    >>> compare_head_counts(runs, [("acc", "accuracy")]).iloc[0]["verdict"]
    'no difference shown (complete separation at the floor)'
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from mhainterp.render import format_p
from mhainterp.stats import (
    ASYMPTOTIC_MIN_SEEDS,
    CONFIDENCE,
    EXACT_TESTS,
    beyond_seed_spread,
    compare_seeds,
    defined_values,
    describe,
    holm_block,
    seeds_for_floor,
    seeds_to_settle,
    smallest_p,
)
from mhainterp.validation import check_float

__all__ = [
    "HEAD_COUNT_COLUMNS",
    "POWER_NOTE_MARK",
    "all_seeds_equal",
    "compare_head_counts",
    "comparison_display",
    "comparison_sentence",
    "defined_head_counts",
    "difference_text",
    "format_number",
    "seed_power_note",
]

HEAD_COUNT_COLUMNS = [
    "task",
    "family",
    "quantity",
    "measure",
    "n_heads_a",
    "n_heads_b",
    "n_a",
    "mean_a",
    "std_a",
    "n_b",
    "mean_b",
    "std_b",
    "diff",
    "ci_low",
    "ci_high",
    "ci_method",
    "test",
    "p",
    "p_floor",
    "p_holm",
    "n_holm",
    "beyond",
    "separated",
    "n_to_settle",
    "verdict",
]
"""Columns of :func:`compare_head_counts`, one row per (task, measure, adjacent pair of head
counts ``a < b`` where the measure is defined at both): ``family`` the question the measure
answers (its Holm family within the task); ``n_a, mean_a, std_a`` over the seeds
where it is defined (likewise ``b``); ``diff = mean_b - mean_a`` with its 95% interval
``ci_low, ci_high`` (``ci_method``: Welch t, bootstrap or none) ; ``test``, ``p`` and its
``p_floor`` (:func:`compare_seeds`); ``p_holm`` over the ``n_holm`` tested rows of the task's
family; ``beyond`` = ``p_holm < alpha`` (None when not tested); ``separated`` +1 / -1 when
every seed of ``b`` lies above / below every seed of ``a``; ``n_to_settle`` the seeds per head
count that would settle a comparison still open (:func:`seeds_to_settle`; inf when nothing
differs, NaN when settled or not tested); ``verdict`` in words."""


def defined_head_counts(per_seed: pd.DataFrame, column: str) -> list[int]:
    """The head counts at which ``column`` has a value for some seed, ascending (h = 1 has
    no division index: it is left out, never counted as 0).

    Example:
        >>> runs = pd.DataFrame({"n_heads": [1, 4, 8], "index": [float("nan"), 0.1, 0.3]})
        >>> defined_head_counts(runs, "index")
        [4, 8]
    """
    has_value = per_seed[column].notna()
    return sorted(int(h) for h in per_seed.loc[has_value, "n_heads"].unique())


def compare_head_counts(
    per_seed: pd.DataFrame,
    measures: Sequence[tuple[str, str] | tuple[str, str, str]],
    *,
    alpha: float = 0.05,
) -> pd.DataFrame:
    """Adjacent head counts of each task compared on every measure, Holm-corrected together
    within each *family*: the measures that answer one question (does h change the accuracy;
    whom the heads serve; ...). A measure given as ``(column, words)`` joins the family
    ``"all"``, so measures given without a family form one block per task.

    One family per question keeps each question's error rate at ``alpha`` however many
    questions a grid asks, and keeps a family small enough that a complete separation of 6
    vs 6 seeds (exact floor 0.0022) survives it up to 23 comparisons: one block over every
    measure of four head counts (24 and more) could never pass.

    Adjacent pairs (h = 1 vs 4 and 4 vs 8 of h in {1, 4, 8}) say *where* along h a measure
    changes, and keep the family at ``(#head counts - 1)`` per measure, so Holm stays
    usable; smallest vs largest would add one more per measure and say less. A measure
    undefined at a head count (no seed has a value there) skips it: the pair is formed with
    the next head count where it is defined.

    Args:
        per_seed: One row per run: ``task, n_heads`` and the ``measures`` columns (NaN where
            undefined for that seed; a column it lacks is skipped).
        measures: ``(column, words)`` or ``(column, words, family)``, in the order the block
            lists them.
        alpha: Family-wise error rate of one task's family.

    Returns:
        :data:`HEAD_COUNT_COLUMNS`.

    Example:
        >>> runs = pd.DataFrame({"task": ["t"] * 6, "n_heads": [4, 4, 4, 8, 8, 8],
        ...                      "index": [0.10, 0.11, 0.09, 0.26, 0.30, 0.22]})
        >>> row = compare_head_counts(runs, [("index", "division index")]).iloc[0]
        >>> row["test"], float(row["p"]), int(row["separated"]), row["verdict"]
        ('exact permutation', 0.1, 1, 'no difference shown (complete separation at the floor)')
    """
    check_float("alpha", alpha, minimum=0.0, maximum=1.0, inclusive=False)
    families: dict[str, list[tuple[str, str]]] = {}
    for column, words, *family in measures:
        families.setdefault(family[0] if family else "all", []).append((column, words))
    rows: list[dict[str, Any]] = []
    for task, group in per_seed.groupby("task", sort=False):
        for family, members in families.items():
            block = [
                row
                for column, words in members
                if column in group.columns
                for row in _adjacent_rows(str(task), family, group, column, words)
            ]
            rows += _holm_over(block, alpha)
    return pd.DataFrame(rows, columns=HEAD_COUNT_COLUMNS)


def _adjacent_rows(
    task: str, family: str, group: pd.DataFrame, column: str, words: str
) -> list[dict]:
    """One uncorrected row per adjacent pair of the head counts where ``column`` is defined."""
    heads = defined_head_counts(group, column)
    rows = []
    for h_a, h_b in itertools.pairwise(heads):
        a = defined_values(group.loc[group["n_heads"] == h_a, column])
        b = defined_values(group.loc[group["n_heads"] == h_b, column])
        result = compare_seeds(a, b, "graded", CONFIDENCE)
        da, db = describe(a), describe(b)
        rows.append(
            {
                "task": task,
                "family": family,
                "quantity": words,
                "measure": column,
                "n_heads_a": h_a,
                "n_heads_b": h_b,
                "mean_a": da["mean"],
                "std_a": da["std"],
                "mean_b": db["mean"],
                "std_b": db["std"],
                **result,
            }
        )
    return rows


def _holm_over(block: list[dict[str, Any]], alpha: float) -> list[dict[str, Any]]:
    """The rows of one block with ``p_holm, n_holm, beyond``, what n would settle each open
    one, and the verdict."""
    p = [row["p"] for row in block]
    tested = int(sum(not math.isnan(v) for v in p))
    for row, adjusted, beyond in zip(
        block, holm_block(p), beyond_seed_spread(p, alpha), strict=True
    ):
        row["p_holm"] = math.nan if adjusted is None else adjusted
        row["n_holm"] = tested
        row["beyond"] = beyond
        row["n_to_settle"] = (
            seeds_to_settle(row["diff"], row["std_a"], row["std_b"], alpha, tested)
            if beyond is False
            else math.nan
        )
        row["verdict"] = _verdict(row, alpha)
    return block


def all_seeds_equal(row: dict[str, Any] | pd.Series) -> bool:
    """Whether every seed of both groups of a :func:`compare_head_counts` row has the same
    value (up to floating-point noise): no difference, and nothing more seeds could settle.

    Example:
        >>> all_seeds_equal({"diff": 0.0, "std_a": 0.0, "std_b": 2e-19})
        True
    """
    tiny = 1e-12
    return abs(row["diff"]) <= tiny and row["std_a"] <= tiny and row["std_b"] <= tiny


def _at_floor(row: dict[str, Any] | pd.Series) -> bool:
    floor = row["p_floor"]
    return not math.isnan(floor) and row["p"] <= floor * (1 + 1e-9)


AFTER_HOLM = "no difference shown after Holm"
"""The verdict of a comparison whose own p passes alpha and whose Holm p over its family does
not: not "within the seed spread"."""


def _verdict(row: dict[str, Any] | pd.Series, alpha: float = 0.05) -> str:
    """A comparison in a few words: which head count is higher, or why none is shown."""
    if row["beyond"] is None or (isinstance(row["beyond"], float) and math.isnan(row["beyond"])):
        return "undetermined (n < 2)"
    if bool(row["beyond"]):
        return f"h={row['n_heads_b']} {'higher' if row['diff'] > 0 else 'lower'}"
    if all_seeds_equal(row):
        return "no difference (every seed equal)"
    if row["separated"]:
        at = " at the floor" if _at_floor(row) else ""
        return f"no difference shown (complete separation{at})"
    if row["p"] < alpha:
        return AFTER_HOLM
    return "no difference shown (within the seed spread)"


# ----------------------------------------------------------------------------- in words


def format_number(value: float, signed: bool = False) -> str:
    """Two decimals, or two significant digits for a small non-zero value: how every seed
    mean and difference of a head-count comparison is printed.

    Example:
        >>> format_number(0.6424), format_number(0.00089), format_number(0.35, signed=True)
        ('0.64', '0.00089', '+0.35')
    """
    sign = "+" if signed else ""
    if value != 0 and abs(value) < 0.01:
        return f"{value:{sign}.2g}"
    return f"{value:{sign}.2f}"


def _mean_std(mean: float, std: float) -> str:
    return (
        format_number(mean) if math.isnan(std) else f"{format_number(mean)} ± {format_number(std)}"
    )


def difference_text(row: dict[str, Any] | pd.Series) -> str:
    """The difference of a :func:`compare_head_counts` row with its interval.

    Example:
        >>> difference_text({"diff": 0.39, "ci_low": 0.35, "ci_high": 0.43,
        ...                  "ci_method": "Welch t"})
        '+0.39 [95% Welch t CI +0.35, +0.43]'
    """
    change = format_number(row["diff"], True)
    if math.isnan(row["ci_low"]):
        reason = str(row["ci_method"]).removeprefix("none (").rstrip(")")
        return f"{change} (no interval: {reason})"
    low, high = format_number(row["ci_low"], True), format_number(row["ci_high"], True)
    return f"{change} [{CONFIDENCE:.0%} {row['ci_method']} CI {low}, {high}]"


def _seeds_each(n_a: int, n_b: int) -> str:
    return f"{n_a} seeds each" if n_a == n_b else f"{n_a} and {n_b} seeds"


def _test_text(row: dict[str, Any] | pd.Series) -> str:
    """``Welch p = 2.3e-05``, or an exact p at its floor as the floor (``= 0.1, the smallest 3
    vs 3 seeds allow``)."""
    if _at_floor(row) and row["p"] < 1 and row["test"] in EXACT_TESTS:
        return (
            f"{row['test']} p = {row['p_floor']:.2g}, the smallest "
            f"{int(row['n_a'])} vs {int(row['n_b'])} seeds allow"
        )
    return f"{row['test']} {format_p(row['p'], row['p_floor'])}"


def comparison_sentence(row: dict[str, Any] | pd.Series) -> str:
    """One comparison of :func:`compare_head_counts` in words: the two seed means, the
    difference with its interval, and whether it is beyond the seed spread; a complete
    separation is said as such, with the test's floor.

    Example:
        >>> runs = pd.DataFrame({"task": ["t"] * 6, "n_heads": [1, 1, 1, 4, 4, 4],
        ...                      "needed": [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]})
        >>> print(comparison_sentence(compare_head_counts(runs, [("needed", "needed share")])
        ...     .iloc[0]))  # doctest: +NORMALIZE_WHITESPACE
        needed share 1.00 ± 0.00 (h=1, n=3) → 0.00 ± 0.00 (h=4, n=3): -1.00 (no interval: no
        seed spread); every seed at h=4 is below every seed at h=1, but with 3 seeds each the
        exact test's floor is p = 0.1 (Holm p = 0.1 over 1): no difference shown
    """
    h_a, h_b = row["n_heads_a"], row["n_heads_b"]
    head = (
        f"{row['quantity']} {_mean_std(row['mean_a'], row['std_a'])} (h={h_a}, n={row['n_a']}) "
        f"→ {_mean_std(row['mean_b'], row['std_b'])} (h={h_b}, n={row['n_b']})"
    )
    if math.isnan(row["p"]):
        return f"{head}: too few seeds to compare (n = {row['n_a']} and {row['n_b']})"
    holm = f"Holm {format_p(row['p_holm'])} over {int(row['n_holm'])}"
    change = difference_text(row)
    if bool(row["beyond"]):
        return f"{head}: {change}, beyond the seed spread ({_test_text(row)}; {holm})"
    if all_seeds_equal(row):
        return f"{head}: every seed equal, no difference ({_test_text(row)}; {holm})"
    if row["separated"]:
        where = "exceeds" if row["separated"] > 0 else "is below"
        text = f"{head}: {change}; every seed at h={h_b} {where} every seed at h={h_a}, "
        if _at_floor(row) and row["test"] in EXACT_TESTS:
            seeds = _seeds_each(int(row["n_a"]), int(row["n_b"]))
            return (
                f"{text}but with {seeds} the exact test's floor is p = "
                f"{row['p_floor']:.2g} ({holm}): no difference shown"
            )
        return f"{text}yet no difference is shown ({_test_text(row)}; {holm})"
    if row.get("verdict") == AFTER_HOLM:
        return (
            f"{head}: {change}; not shown after Holm (its own p passes, the family's does not: "
            f"{_test_text(row)}; {holm})"
        )
    return (
        f"{head}: {change}; no difference shown, within the seed spread ({_test_text(row)}; {holm})"
    )


def _test_cell(row: pd.Series) -> str:
    """``exact permutation p = 0.1 (the floor)``, or ``none (n < 2)``."""
    if math.isnan(row["p"]):
        return str(row["test"])
    exact = row["test"] in EXACT_TESTS
    return f"{row['test']} {format_p(row['p'], row['p_floor'], exact=exact)}"


def comparison_display(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`compare_head_counts` rows formatted for reading (7 columns: a report table does
    not scroll): the measure, the pair, the seed means ± std (n), the difference with its
    interval, the test's p (an exact p at its floor says so), the Holm p with the size of its
    family (in the header when every row shares one), and the verdict.

    Example:
        >>> runs = pd.DataFrame({"task": ["t"] * 6, "n_heads": [1, 1, 1, 4, 4, 4],
        ...                      "acc": [0.5, 0.52, 0.51, 0.9, 0.91, 0.92]})
        >>> table = comparison_display(compare_head_counts(runs, [("acc", "accuracy")]))
        >>> table.iloc[0].tolist()  # doctest: +NORMALIZE_WHITESPACE
        ['accuracy', 'h=1 → 4', '0.51 ± 0.01 → 0.91 ± 0.01 (n = 3, 3)',
         '+0.40 [95% Welch t CI +0.38, +0.42]', 'exact permutation p = 0.1 (the floor)', '0.1',
         'no difference shown (complete separation at the floor)']
    """
    m = int(rows["n_holm"].max()) if len(rows) else 0
    # one Holm family: its size in the header; several: each cell says its family's size
    one_family = rows["n_holm"].nunique() <= 1
    holm_header = f"Holm p (over {m})" if one_family else "Holm p (of the family's n)"
    return pd.DataFrame(
        {
            "measure": rows["quantity"].to_numpy(),
            "heads": [
                f"h={a} → {b}" for a, b in zip(rows["n_heads_a"], rows["n_heads_b"], strict=True)
            ],
            "seed means": [
                f"{_mean_std(r['mean_a'], r['std_a'])} → {_mean_std(r['mean_b'], r['std_b'])} "
                f"(n = {int(r['n_a'])}, {int(r['n_b'])})"
                for _, r in rows.iterrows()
            ],
            "difference": [difference_text(r) for _, r in rows.iterrows()],
            "test": [_test_cell(r) for _, r in rows.iterrows()],
            holm_header: [
                "" if math.isnan(p) else f"{p:.2g}" if one_family else f"{p:.2g} (of {int(n)})"
                for p, n in zip(rows["p_holm"].astype(float), rows["n_holm"], strict=True)
            ],
            "verdict": rows["verdict"].to_numpy(),
        }
    )


POWER_NOTE_MARK = " per head count: "
"""In every :func:`seed_power_note` sentence, right after ``n seed(s)``: how a reader that
states it once (the report) knows it among other notes."""


def seed_power_note(
    n_seeds: int,
    alpha: float = 0.05,
    n_comparisons: int = 1,
    *,
    smallest_family: int | None = None,
) -> str:
    """One sentence on what ``n_seeds`` seeds per head count can and cannot show: the test and
    interval used at that n, the exact test's floor, the level Holm over ``n_comparisons``
    asks for, and the n at which a complete separation would reach it.

    Args:
        n_seeds: Seeds per head count (the fewest, where they differ).
        alpha: The family-wise error rate.
        n_comparisons: The size of the (largest) Holm family.
        smallest_family: Where comparisons are Holm-corrected in families of different sizes
            (one per question), the smallest one's size: the note then gives the level of
            both ends, and says where a complete separation can pass in the smaller
            families only.

    Example:
        >>> seed_power_note(3)[:60]
        '3 seeds per head count: an exact test of 3 vs 3 seeds cannot'
        >>> "Welch's t test" in seed_power_note(30)
        True
        >>> note = seed_power_note(5, 0.05, 8, smallest_family=2)
        >>> "the smaller families only" in note
        True
    """
    if n_seeds < 2:
        return (
            f"{n_seeds} seed{POWER_NOTE_MARK}no seed spread is known, so no difference between "
            "head counts can be tested; rerun with 3 or more seeds."
        )
    floor = smallest_p(n_seeds, n_seeds)
    largest = max(1, n_comparisons)
    smallest = largest if smallest_family is None else max(1, min(smallest_family, largest))
    level, easiest = alpha / largest, alpha / smallest
    if smallest < largest:
        holm = (
            f"; with Holm over each question's family ({smallest} to {largest} comparisons) a "
            f"difference needs p below {easiest:.2g} to {level:.2g}"
        )
    elif largest > 1:
        holm = f"; with Holm over {largest} comparisons a difference needs p below {level:.2g}"
    else:
        holm = ""
    if n_seeds >= ASYMPTOTIC_MIN_SEEDS:
        return (
            f"{n_seeds} seeds{POWER_NOTE_MARK}differences between head counts use Welch's t "
            f"test and 95% percentile bootstrap intervals over seeds (from "
            f"{ASYMPTOTIC_MIN_SEEDS} seeds per head count; an exact test of {n_seeds} vs "
            f"{n_seeds} seeds could reach p = {floor:.2g}, so the floor no longer binds){holm}. "
            "A difference Welch does not find is not shown to be absent."
        )
    reach = "cannot" if floor >= alpha else "can"
    needed = seeds_for_floor(alpha, largest)
    if floor >= easiest:
        shown = "no difference between head counts can be shown at this n, whatever its size"
    elif floor >= level:
        shown = (
            "a complete separation of the seeds reaches that level in the smaller families "
            f"only (those of fewer than {math.ceil(alpha / floor)} comparisons)"
        )
    else:
        shown = "a complete separation of the seeds reaches that level"
    return (
        f"{n_seeds} seeds{POWER_NOTE_MARK}an exact test of {n_seeds} vs {n_seeds} seeds "
        f"{reach} reach p < {alpha:g} (its smallest p is {floor:.2g}); below "
        f"{ASYMPTOTIC_MIN_SEEDS} seeds per head count every difference is tested exactly (a "
        f"permutation test of the seed means){holm}, so {shown} (the exact test's floor falls "
        f"below {level:.2g} from {needed} seeds per head count). Intervals are Welch t "
        "intervals (they assume a normal seed spread); a difference not shown is not shown "
        "to be absent."
    )
