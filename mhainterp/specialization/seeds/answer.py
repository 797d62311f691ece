"""The answer to "does h matter?" for one task, in one line a newcomer reads in a minute.

:func:`answer_line` turns a task's head-count comparisons
(:func:`~mhainterp.specialization.seeds.summary.head_count_comparisons`) into one sentence of
at most :data:`MAX_CHARS` characters: first the accuracy (does h change it, between which head
counts, every seed or not, its Holm p), then the other changes beyond the seed spread, in
this order: whether heads are needed or backed up (the largest effect the demo finds: every
head backed up from h = 4 on reverse; a share that moves at linked steps is one chain), how
they divide the work (one clause per span of head counts: an index that rises at each step
says every step's mean, ``0.00058 → 0.13 → 0.28 from h = 2 to 8``; a clause too long for the
line keeps its largest axes), where they look (counts); middle head counts included. Every
number in it is printed in the comparison table below it
(:func:`mhainterp.sweep.compare.comparison_display`) with the same formatting: the seed means
as :func:`~mhainterp.sweep.compare.format_number` writes them, the Holm p as ``.2g``, the
family's size. When the seeds cannot reach significance at all (3 seeds: the exact floor is
0.1), the line says so and says how many
would.

Example:
    >>> import pandas as pd
    >>> from mhainterp.specialization.seeds.summary import head_count_comparisons
    >>> runs = pd.DataFrame({"task": ["t"] * 12, "n_heads": [1] * 6 + [4] * 6,
    ...     "run": list("abcdefghijkl"),
    ...     "accuracy": [0.6, 0.62, 0.64, 0.66, 0.68, 0.7] + [0.99] * 6})
    >>> answer_line("t", head_count_comparisons(runs))
    't: more heads help: accuracy 0.65 → 0.99 from h = 1 to 4, every seed (Holm p = 0.0022 over 1)'
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mhainterp.specialization.settings import DivisionSettings
from mhainterp.stats import smallest_p
from mhainterp.sweep.compare import all_seeds_equal, format_number

__all__ = ["MAX_CHARS", "SOLVED", "answer_line", "comparison_grid"]

MAX_CHARS = 300
"""The longest answer line: what a reader takes in at a glance."""

MIN_INDEX = DivisionSettings().min_index
"""A division index change where both seed means stay below the division test's effect gate
is left out of the line: beyond the spread, but too small to call a division."""

SOLVED = 0.99
"""Accuracy at or above which a task counts as solved (every head count's seed mean)."""


def _p(row: pd.Series) -> str:
    """``Holm p = 0.0043 over 2``: the number in the comparison table's Holm column."""
    return f"Holm p = {row['p_holm']:.2g} over {int(row['n_holm'])}"


def _span(row: pd.Series) -> str:
    return f"from h = {row['n_heads_a']} to {row['n_heads_b']}"


def _means(row: pd.Series) -> str:
    """``0.62 → 0.99``; where both print alike (``1.00 → 1.00``), the difference instead, as
    the table's difference column prints it (``+0.00057``)."""
    a, b = format_number(row["mean_a"]), format_number(row["mean_b"])
    return f"{a} → {b}" if a != b else format_number(row["diff"], signed=True)


def _every_seed(row: pd.Series) -> str:
    return ", every seed" if row["separated"] else ""


def _beyond(rows: pd.DataFrame) -> pd.DataFrame:
    # as a bool array: an empty object Series would select columns, not rows
    shown = rows["beyond"].map(lambda v: v is True or v == True).to_numpy(dtype=bool)  # noqa: E712
    return rows[shown]


def _accuracy_clause(rows: pd.DataFrame) -> str:
    """Does h change the accuracy: the changes beyond the spread, or why none is."""
    if not len(rows):
        return "accuracy not compared"
    shown = _beyond(rows)
    if len(shown):
        chain = _chain(shown)
        if chain:
            return chain
        row = shown.loc[shown["diff"].abs().idxmax()]
        verb = "more heads help" if row["diff"] > 0 else "more heads hurt"
        text = f"{verb}: accuracy {_means(row)} {_span(row)}{_every_seed(row)} ({_p(row)})"
        others = shown.drop(index=row.name)
        for _, other in others.iterrows():
            text += f", {_means(other)} {_span(other)}{_every_seed(other)} ({_p(other)})"
        return text
    means = pd.concat([rows["mean_a"], rows["mean_b"]])
    if (means >= SOLVED).all():
        low, high = format_number(means.min()), format_number(means.max())
        level = low if low == high else f"{low} to {high}"
        return f"solved at every h (accuracy {level})"
    if rows.apply(all_seeds_equal, axis=1).all():
        return f"the accuracy is the same at every h ({format_number(rows['mean_a'].iloc[0])})"
    row = rows.loc[rows["diff"].abs().idxmax()]
    return (
        f"no accuracy change shown (largest: {_means(row)} {_span(row)}{_every_seed(row)}, "
        f"{_p(row)})"
    )


def _chain(shown: pd.DataFrame) -> str:
    """Every pair of adjacent head counts changes the accuracy the same way: one chain of seed
    means, ``accuracy 0.62 → 0.97 → 0.99 → 1.00 from h = 1 to 8``; "" otherwise."""
    rows = shown.sort_values("n_heads_a")
    linked = (rows["n_heads_a"].iloc[1:].to_numpy() == rows["n_heads_b"].iloc[:-1].to_numpy()).all()
    if len(rows) < 2 or not linked or (rows["diff"] > 0).nunique() != 1:
        return ""
    means = [format_number(rows["mean_a"].iloc[0]), *map(format_number, rows["mean_b"])]
    if len(set(means)) < len(means):  # a step too small to print: said pair by pair instead
        return ""
    verb = "more heads help" if rows["diff"].iloc[0] > 0 else "more heads hurt"
    seeds = ", every seed at every step" if rows["separated"].astype(bool).all() else ""
    span = f"from h = {rows['n_heads_a'].iloc[0]} to {rows['n_heads_b'].iloc[-1]}"
    return f"{verb} at every step: accuracy {' → '.join(means)} {span}{seeds} ({_holm_range(rows)})"


def _holm_range(rows: pd.DataFrame) -> str:
    """``Holm p = 0.0065 over 3``, or ``Holm p ≤ 0.0087 over 4`` for several rows of one
    family (the largest of their Holm p, as the table prints it)."""
    worst = rows.loc[rows["p_holm"].idxmax()]
    sign = "=" if rows["p_holm"].nunique() == 1 and len(rows) == 1 else "≤"
    return f"Holm p {sign} {worst['p_holm']:.2g} over {int(worst['n_holm'])}"


def _seeds(rows: pd.DataFrame) -> str:
    return ", every seed" if rows["separated"].astype(bool).all() else ""


def _division_clause(rows: pd.DataFrame) -> list[str]:
    """The division changes of one pair of head counts, in one clause: ``from h = 4 to 8
    the heads split the work more by position (index 0.13 → 0.28) and target_class
    (...)``. The division index is named once, at its first number, as "index": short enough
    that the clause still fits :data:`MAX_CHARS` beside the accuracy on the CPU grid's tasks.
    Returns the clause with every axis, then with the largest axes only (the shorter forms
    a line takes where the whole clause does not fit), each with its own rows' seeds and
    Holm p."""
    forms = []
    for k in range(len(rows), 0, -1):
        shown = rows.iloc[:k]
        first = shown.iloc[0]
        more = "more" if first["diff"] > 0 else "less"
        axes = [
            f"{str(r['measure']).removeprefix('division_')} ({'index ' * (i == 0)}{_means(r)})"
            for i, (_, r) in enumerate(shown.iterrows())
        ]
        forms.append(
            f"{_span(first)} the heads split the work {more} by {_listed(axes)}{_seeds(shown)}, "
            f"{_holm_range(shown)}"
        )
    return forms


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def _axis_chains(changes: pd.DataFrame) -> list[pd.DataFrame]:
    """Each measure's changes in one direction (a division axis, a share), linked head count
    to head count: rows ``2 → 4`` and ``4 → 8`` make one chain ``2 → 4 → 8``; a pair with no
    neighbour is a chain of one. A step whose two seed means print alike ends a chain (its
    numbers could not be read as a chain of means); so does a step in the other direction."""
    chains: list[pd.DataFrame] = []
    for _key, rows in changes.groupby([changes["measure"], changes["diff"] > 0], sort=False):
        rows = rows.sort_values("n_heads_a")
        start = 0
        for i in range(1, len(rows) + 1):
            linked = i < len(rows) and rows["n_heads_a"].iloc[i] == rows["n_heads_b"].iloc[i - 1]
            readable = all(" → " in _means(rows.iloc[j]) for j in (i - 1, i) if j < len(rows))
            if not (linked and readable):
                chains.append(rows.iloc[start:i])
                start = i
    return chains


def _division_clauses(whom: pd.DataFrame) -> list[list[str]]:
    """The division changes beyond the spread, one clause per span of head counts and
    direction: axes that change over the same steps share a clause, the largest change first;
    clauses in the order of their head counts. Each clause comes with its shorter forms (its
    largest axes only), longest first."""
    spans: dict[tuple, list[pd.DataFrame]] = {}
    for chain in _axis_chains(whom):
        heads = (*chain["n_heads_a"], chain["n_heads_b"].iloc[-1])
        spans.setdefault((heads, bool(chain["diff"].iloc[0] > 0)), []).append(chain)
    clauses = []
    for (heads, _more), chains in sorted(
        spans.items(), key=lambda kv: (kv[0][0][0], kv[0][0][-1], kv[0][1])
    ):
        if len(heads) == 2:  # one step: the pair's clause
            rows = pd.concat(chains).sort_values("diff", key=abs, ascending=False)
            clauses.append(_division_clause(rows))
        else:
            clauses.append(_chained_division_clause(heads, chains))
    return clauses


def _chained_division_clause(heads: tuple, chains: list[pd.DataFrame]) -> list[str]:
    """``from h = 2 to 8 the heads split the work more by position (index 0.00058 → 0.13 →
    0.28) and target_class (0.00076 → 0.07 → 0.23), every seed, Holm p ≤ 0.013 over 6``:
    every step's seed means, as the comparison table prints them (a chain says "at each
    step" by its numbers: the words would cost a clause its room in the line). Returns the
    clause, then its shorter forms with the largest chains only."""
    chains = sorted(chains, key=lambda c: -abs(c["mean_b"].iloc[-1] - c["mean_a"].iloc[0]))
    forms = []
    for k in range(len(chains), 0, -1):
        rows = pd.concat(chains[:k])
        more = "more" if rows["diff"].iloc[0] > 0 else "less"
        axes = []
        for i, chain in enumerate(chains[:k]):
            name = str(chain["measure"].iloc[0]).removeprefix("division_")
            axes.append(f"{name} ({'index ' * (i == 0)}{_chained_means(chain)})")
        forms.append(
            f"from h = {heads[0]} to {heads[-1]} the heads split the work {more} by "
            f"{_listed(axes)}{_seeds(rows)}, {_holm_range(rows)}"
        )
    return forms


def _chained_means(chain: pd.DataFrame) -> str:
    """``0.00 → 0.50 → 1.00``: the seed means of linked steps, as the table prints them."""
    means = [format_number(chain["mean_a"].iloc[0]), *map(format_number, chain["mean_b"])]
    return " → ".join(means)


def _needed_clause(rows: pd.DataFrame, stays: bool) -> str:
    """A change of the backed-up or needed share over one step or a chain of linked steps:
    ``from h = 4 every head is backed up (share 0.00 → 0.50 → 1.00 from h = 1, every seed,
    Holm p ≤ 0.013 over 6)``. ``stays``: whether the share keeps its last value at every
    larger head count compared ("from h = 4"; else "at h = 4")."""
    first, last = rows.iloc[0], rows.iloc[-1]
    chained = len(rows) > 1
    means = _chained_means(rows) if chained else _means(first)
    tested = f"{_seeds(rows)}, {_holm_range(rows) if chained else _p(first)}"
    since = f" from h = {first['n_heads_a']}" if chained else ""
    at = f"{'from' if stays else 'at'} h = {last['n_heads_b']}"
    if first["measure"] == "frac_backed_up" and last["mean_b"] == 1.0 and last["diff"] > 0:
        return f"{at} every head is backed up (share {means}{since}{tested})"
    if first["measure"] == "frac_needed" and last["mean_b"] == 0.0 and last["diff"] < 0:
        return f"{at} no head is needed alone (share {means}{since}{tested})"
    span = f"from h = {first['n_heads_a']} to {last['n_heads_b']}"
    return f"{span} the {first['quantity']} goes {means}{tested}"


def _stays(chain: pd.DataFrame, measure_rows: pd.DataFrame) -> bool:
    """Whether the measure's seed means at every head count above the chain's last equal its
    last mean (every comparison row of the measure, beyond the spread or not)."""
    last = chain.iloc[-1]
    later = measure_rows[measure_rows["n_heads_a"] >= last["n_heads_b"]]
    return bool((later["mean_b"] == last["mean_b"]).all())


def _complements(needed: pd.DataFrame, pair: tuple) -> bool:
    """Whether the needed and backed-up shares add up to 1 at both head counts of a pair
    (every head one or the other): then saying one says the other. Dead heads break it."""
    rows = needed[(needed["n_heads_a"] == pair[0]) & (needed["n_heads_b"] == pair[1])]
    if set(rows["measure"]) != {"frac_needed", "frac_backed_up"}:
        return False
    sums = rows[["mean_a", "mean_b"]].sum()
    return bool(np.allclose(sums.to_numpy(dtype=float), 1.0))


def _effect_clauses(compared: pd.DataFrame) -> list[list[str]]:
    """The changes beyond the spread other than the accuracy, in words: the needed family
    (backed-up share first, a share that moves the same way at linked steps as one chain;
    the needed share where it is not the backed-up share's complement), then the division
    (whom), then where heads look, largest first within each family. Each clause comes with
    its shorter forms, longest first (a division clause's largest axes).

    Args:
        compared: The task's comparison rows other than the accuracy, beyond the spread or
            not (whether a share stays at its last value is read from all of them).
    """
    shown = _beyond(compared)
    clauses: list[list[str]] = []
    every_needed = compared[compared["family"] == "needed"]
    needed = shown[shown["family"] == "needed"]
    said = set()
    for measure in ("frac_backed_up", "frac_needed"):
        rows = needed[needed["measure"] == measure]
        if measure == "frac_needed":  # a step whose complement is said is said
            unsaid = [
                not (pair in said and _complements(every_needed, pair))
                for pair in zip(rows["n_heads_a"], rows["n_heads_b"], strict=True)
            ]
            rows = rows[np.array(unsaid, dtype=bool)]
        said |= set(zip(rows["n_heads_a"], rows["n_heads_b"], strict=True))
        measure_rows = every_needed[every_needed["measure"] == measure]
        for chain in _axis_chains(rows):
            clauses.append([_needed_clause(chain, _stays(chain, measure_rows))])
    whom = shown[shown["family"] == "whom"]
    # an index change below the division test's effect gate divides nothing worth naming
    whom = whom[whom[["mean_a", "mean_b"]].max(axis=1) >= MIN_INDEX]
    clauses += _division_clauses(whom)
    where = shown[shown["family"] == "where"]
    for _, row in where.sort_values("diff", key=abs, ascending=False).iterrows():
        clauses.append(
            [f"{_span(row)} {row['quantity']} {_means(row)}{_every_seed(row)} ({_p(row)})"]
        )
    return clauses


def _reachable(family: pd.DataFrame, alpha: float) -> bool:
    """Whether some comparison of one Holm family could pass, whatever its size: Holm's first
    step asks for p below alpha over the family's size, and an exact test of n_a vs n_b seeds
    cannot go below :func:`~mhainterp.stats.smallest_p` (Welch, from 10 seeds a side, has no
    floor)."""
    for _, row in family.iterrows():
        n_a, n_b = int(row["n_a"]), int(row["n_b"])
        if min(n_a, n_b) >= 10 or smallest_p(n_a, n_b) * int(row["n_holm"]) < alpha:
            return True
    return False


def _power_clause(rows: pd.DataFrame, alpha: float) -> str:
    """What the seeds cannot show: when no comparison of any family (each Holm-corrected in
    its own question's family) can pass, whatever its size. Said with the accuracy family's
    numbers (else the smallest family's: the first that more seeds would open)."""
    tested = rows[rows["p"].notna()]
    if not len(tested):
        return ""
    if any(_reachable(family, alpha) for _, family in tested.groupby("family", sort=False)):
        return ""
    accuracy = tested[tested["measure"] == "accuracy"]
    counts = accuracy if len(accuracy) else tested
    n = int(pd.concat([counts["n_a"], counts["n_b"]]).min())
    family = int(counts["n_holm"].min())
    floor = smallest_p(n, n)
    need = next((k for k in range(n, 11) if smallest_p(k, k) * family < alpha), 10)
    return (
        f"{n} seeds per h cannot show a change (exact floor p = {floor:.2g}, Holm over "
        f"{family}); {need} can"
    )


def _underpowered_line(task: str, accuracy: pd.DataFrame, power: str) -> str:
    """Too few seeds for any test to pass: the largest accuracy change as the seeds show it,
    then that it cannot be shown."""
    if not len(accuracy):
        return f"{task}: {power}"
    row = accuracy.loc[accuracy["diff"].abs().idxmax()]
    seeds = _every_seed(row) if min(row["n_a"], row["n_b"]) > 1 else ""  # one seed is no "every"
    seen = f"accuracy {_means(row)} {_span(row)}{seeds}"
    if all_seeds_equal(row):
        seen = f"accuracy {format_number(row['mean_a'])} at every h"
    return f"{task}: {seen}, but {power}"


def answer_line(task: str, comparisons: pd.DataFrame, alpha: float = 0.05) -> str:
    """One line: does h change the accuracy, and what else changes beyond the seed spread.

    Args:
        task: The task's name (the line starts with it).
        comparisons: The task's rows of
            :func:`~mhainterp.specialization.seeds.summary.head_count_comparisons`.
        alpha: The family-wise error rate the rows were tested at.

    Returns:
        At most :data:`MAX_CHARS` characters; clauses are added largest effect first while
        they fit.
    """
    accuracy = comparisons[comparisons["measure"] == "accuracy"]
    if len(comparisons) and comparisons["p"].isna().all():  # 1 seed per h: nothing to test
        return _underpowered_line(
            task, accuracy, "with one seed per h no seed spread is known, so nothing can be tested"
        )
    power = _power_clause(comparisons, alpha)
    if power:  # nothing can pass: say what the seeds show, then why it cannot be a finding
        return _underpowered_line(task, accuracy, power)
    line = f"{task}: {_accuracy_clause(accuracy)}"
    clauses = _effect_clauses(comparisons[comparisons["measure"] != "accuracy"])
    if not clauses and len(comparisons) > len(accuracy):
        clauses = [["nothing else is shown to change with h"]]
    for forms in clauses:  # largest effect first: the first clause with no form that fits ends it
        fitting = [form for form in forms if len(line) + 2 + len(form) <= MAX_CHARS]
        if not fitting:
            break
        line += f"; {fitting[0]}"
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 1] + "…"


def comparison_grid(
    comparisons: pd.DataFrame, measures: tuple[str, ...], *, changes_only: bool = False
) -> str:
    """A Markdown table of adjacent head-count comparisons: one row per task and measure, one
    column per pair of head counts; each cell the difference of seed means and its Holm p,
    **bold** where it is beyond the seed spread. What the README's "Does h matter?" shows,
    written from the study's ``study_comparisons.csv`` (a test checks the README against it).

    Args:
        comparisons: Head-count comparisons of several tasks.
        measures: The measures to show (``accuracy``, ``division_position``, ...); a task's
            row is left out where it has no comparison of that measure.
        changes_only: Show a measure other than the accuracy only where some pair of head
            counts differs beyond the seed spread (the accuracy is always shown), and a
            division index only where that change reaches the division test's effect gate.

    Example:
        >>> from mhainterp.specialization.seeds.summary import head_count_comparisons
        >>> runs = pd.DataFrame({"task": ["t"] * 12, "n_heads": [1] * 6 + [4] * 6,
        ...     "run": list("abcdefghijkl"), "accuracy": [0.6, 0.62, 0.64] * 2 + [0.99] * 6})
        >>> print(comparison_grid(head_count_comparisons(runs), ("accuracy",)))
        | task, measure | h = 1 → 4 |
        |---|---|
        | t, accuracy | **+0.37** (p 0.0022) |
    """
    pairs = sorted(set(zip(comparisons["n_heads_a"], comparisons["n_heads_b"], strict=True)))
    header = "| task, measure | " + " | ".join(f"h = {a} → {b}" for a, b in pairs) + " |"
    lines = [header, "|" + "---|" * (len(pairs) + 1)]
    for task, rows in comparisons.groupby("task", sort=False):
        for measure in measures:
            mine = rows[rows["measure"] == measure]
            if not len(mine) or (changes_only and measure != "accuracy" and not _changes(mine)):
                continue
            cells = []
            for a, b in pairs:
                row = mine[(mine["n_heads_a"] == a) & (mine["n_heads_b"] == b)]
                cells.append(_grid_cell(row.iloc[0]) if len(row) else "—")
            name = str(mine["quantity"].iloc[0]).removeprefix("division index ")
            lines.append(f"| {task}, {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _changes(rows: pd.DataFrame) -> bool:
    """Whether a measure changes beyond the seed spread somewhere, by more than a negligible
    amount (a division index below the effect gate at both head counts divides nothing)."""
    shown = _beyond(rows)
    if str(rows["measure"].iloc[0]).startswith("division_"):
        shown = shown[shown[["mean_a", "mean_b"]].max(axis=1) >= MIN_INDEX]
    return len(shown) > 0


def _grid_cell(row: pd.Series) -> str:
    """``**+0.37** (p 0.0022)``: bold where the change is beyond the seed spread and, for a
    division index, reaches the effect gate at one of its head counts (below it at both,
    the change divides nothing, as the answer line and the README's footnote say)."""
    if pd.isna(row["p_holm"]):
        return "n < 2"
    if all_seeds_equal(row):
        return f"every seed {format_number(row['mean_a'])}"
    diff = format_number(row["diff"], signed=True)
    beyond = row["beyond"] is True or row["beyond"] == True  # noqa: E712
    if str(row["measure"]).startswith("division_"):
        beyond = beyond and max(row["mean_a"], row["mean_b"]) >= MIN_INDEX
    text = f"**{diff}**" if beyond else diff
    return f"{text} (p {row['p_holm']:.2g})"
