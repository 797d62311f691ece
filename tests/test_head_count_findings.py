"""The head-count Findings of a sweep from per-run tables (no training): the answer sentence,
the block of comparisons and the seed table at n = 3 and n = 30, and every table, sentence and
figure at 100 seeds per head count."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from mhainterp.figures._common import plt
from mhainterp.figures.division import division_vs_heads
from mhainterp.figures.headcount import BOX_MIN_SEEDS, plot_head_count_accuracy
from mhainterp.specialization.seeds.answer import MAX_CHARS
from mhainterp.specialization.seeds.summary import (
    BLOCK_MARK,
    OPEN_MARK,
    answers,
    display_summary,
    head_count_comparisons,
    specialization_summary,
    summary_notes,
)
from mhainterp.sweep.compare import comparison_display

HEADS = (1, 4, 8)


def _tables(n: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-run and division tables shaped like the demo's reverse: accuracy 1.00 at every h,
    every head needed at h = 1 and backed up from h = 4, the index by position rising from
    0.13 (h = 4) to 0.28 (h = 8), undefined at h = 1; by token 0.001 everywhere."""
    rng = np.random.default_rng(seed)
    runs, division = [], []
    for h in HEADS:
        for s in range(n):
            run = f"h{h}_seed{s}"
            runs.append(
                {"run": run, "task": "reverse", "n_heads": h, "seed": s, "accuracy": 1.0,
                 "n_relations": 1, "heads_per_relation": float(h),
                 "frac_needed": 1.0 if h == 1 else 0.0, "frac_backed_up": 0.0 if h == 1 else 1.0,
                 "frac_dead": 0.0, "specialized_along": "" if h == 1 else "position"}
            )  # fmt: skip
            position = {1: math.nan, 4: 0.13, 8: 0.28}[h] + (0 if h == 1 else rng.normal(0, 0.02))
            token = math.nan if h == 1 else 0.001
            for by, index in (("position", position), ("token", token)):
                division.append(
                    {"run": run, "by": by, "index": index, "null_index": 0.005,
                     "null_high": 0.01, "p": 0.005}
                )  # fmt: skip
    return pd.DataFrame(runs), pd.DataFrame(division)


def _findings(n: int) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    runs, division = _tables(n)
    summary = specialization_summary(runs, division=division)
    comparisons = head_count_comparisons(runs, division)
    return summary, comparisons, summary_notes(summary, comparisons)


def _numbers(text: str) -> list[str]:
    """The numbers a sentence states (not the head counts of ``h = 1``, which every table row
    names in its ``heads`` column)."""
    text = re.sub(r"h = \d+( to \d+)?", "", text)
    return re.findall(r"\d+\.\d+(?:e-\d+)?|\d+", text)


def _displayed(comparisons: pd.DataFrame) -> str:
    """Every cell of the comparison table the report prints under the answer, and its header."""
    table = comparison_display(comparisons)
    return " ".join([*table.columns, *table.astype(str).to_numpy().ravel()])


def test_at_3_seeds_the_answer_says_what_the_seeds_show_and_that_they_cannot_show_it():
    _, comparisons, notes = _findings(3)
    line = answers(comparisons)["reverse"]
    assert line == (
        "reverse: accuracy 1.00 at every h, but 3 seeds per h cannot show a change (exact floor "
        "p = 0.1, Holm over 4); 5 can"
    )
    # one Holm family per question: accuracy, where, needed (2 pairs each), whom (h = 4 -> 8)
    sizes = comparisons.groupby("family")["n_holm"].max().to_dict()
    assert sizes == {"accuracy": 2, "where": 4, "needed": 4, "whom": 2}
    assert len(comparisons) == 12 and not comparisons["beyond"].any()
    (open_note,) = [n for n in notes if OPEN_MARK in n]
    assert "about n = 5 seeds per head count would settle them" in open_note  # 2/C(10,5)*4 < .05
    block = next(n for n in notes if BLOCK_MARK in n)
    assert "within each question's family: accuracy 2, where 4, needed 4, whom 2" in block


def test_at_6_seeds_the_answer_names_the_largest_effects_with_their_table_numbers():
    _, comparisons, _ = _findings(6)
    line = answers(comparisons)["reverse"]
    assert line.startswith("reverse: solved at every h (accuracy 1.00); from h = 4 every head is")
    assert "backed up (share 0.00 → 1.00, every seed, Holm p = 0.0087 over 4)" in line
    split = "from h = 4 to 8 the heads split the work more by position (index 0.13 → 0.28)"
    assert split in line
    assert "by token" not in line  # 0.001: beyond no spread, below the effect gate
    assert len(line) <= MAX_CHARS
    shown = _displayed(comparisons)
    assert all(number in shown for number in _numbers(line)), line


def test_at_30_seeds_the_answer_uses_welch_and_stays_one_line():
    _, comparisons, notes = _findings(30)
    line = answers(comparisons)["reverse"]
    assert "the heads split the work more by position (index 0.13 → 0.29)" in line
    assert len(line) <= MAX_CHARS
    assert all(number in _displayed(comparisons) for number in _numbers(line)), line
    row = comparisons[comparisons["measure"] == "division_position"].iloc[0]
    assert row["test"] == "Welch" and row["beyond"] and 0.13 < row["ci_low"] < row["ci_high"] < 0.17
    needed = comparisons[
        (comparisons["measure"] == "frac_needed") & (comparisons["n_heads_a"] == 1)
    ]
    # no spread in either group: the exact test, at its floor 2 / C(60, 30), beyond
    assert needed["test"].item() == "exact permutation" and needed["p"].item() < 1e-15
    assert "30 seeds per head count: differences between head counts use Welch's t" in notes[-1]


def test_a_number_the_table_does_not_print_fails_the_check():
    """The check above can fail: a line quoting a mean the table does not print."""
    _, comparisons, _ = _findings(6)
    assert "0.137" not in _displayed(comparisons)
    assert not all(n in _displayed(comparisons) for n in _numbers("index 0.137 → 0.28"))


def test_seed_table_prints_the_null_quantile_the_call_uses_and_names_it():
    summary, _, _ = _findings(3)
    tables = dict(display_summary(summary, alpha=0.05))
    (caption,) = [c for c in tables if c.startswith("Division index")]
    assert "q95, the seed mean of the null's upper 95% quantile" in caption
    assert "same-function heads" in caption
    cells = tables[caption]["by position"].tolist()
    assert cells[0].startswith("undefined") and cells[2].startswith("0.28 ± 0.0")
    assert cells[2].endswith(" vs q95 0.01 (3/3 divided)")


def test_100_seeds_stay_readable():
    summary, comparisons, notes = _findings(100)
    assert len(summary) == len(HEADS)  # one row per head count, never one per seed
    assert all(len(t.columns) <= 8 and len(t) == len(HEADS) for _, t in display_summary(summary))
    assert len(comparisons) == 12  # the blocks do not grow with n
    text = " ".join(notes)
    assert "seed 57" not in text and "h4_seed" not in text
    three = " ".join(_findings(3)[2])
    assert len(text) < 1.2 * len(three)  # the same sentences, other numbers


@pytest.mark.parametrize("n", [3, 100])
def test_figures_show_seeds_as_dots_or_boxes(n):
    runs, division = _tables(n)
    division = division.merge(runs[["run", "task", "n_heads", "seed"]], on="run")
    division["null_index_std"] = 0.002
    fig = division_vs_heads(division)
    ax = fig.axes[0]
    dots = [c for c in ax.collections if c.get_label().startswith("seeds")]
    assert len(dots) == 1 and dots[0].get_alpha() == (0.25 if n >= BOX_MIN_SEEDS else 0.8)
    boxes = [p for p in ax.patches if type(p).__name__ == "PathPatch"]
    assert len(boxes) == (2 if n >= BOX_MIN_SEEDS else 0)  # h = 4 and 8: h = 1 has no index
    # the null band runs from the null's mean to the upper quantile the call uses
    (band,) = [c for c in ax.collections if c.get_label() == "null: mean to upper quantile"]
    assert band.get_paths()[0].vertices[:, 1].max() == pytest.approx(0.01)
    plt.close(fig)
    accuracy = runs.assign(val_accuracy=runs["accuracy"] - 0.01 * runs["seed"] % 0.05)
    fig = plot_head_count_accuracy(accuracy)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(labels) == 2  # seeds and the mean, not one entry per seed
    plt.close(fig)


def test_an_undefined_call_is_not_counted_as_not_divided_in_the_headline():
    from mhainterp.specialization import RunVerdict, Verdict

    undefined = {"by": "token", "call": "cannot tell", "index": math.nan, "null_index": math.nan,
                 "p": math.nan, "basis": "", "reason": "fewer than 2 heads do damage"}  # fmt: skip
    divided = {**undefined, "call": "divided", "index": 0.3, "null_index": 0.01,
               "null_high": 0.02, "p": 0.005, "basis": "single"}  # fmt: skip
    runs = [
        RunVerdict(run=f"h1_s{s}", task="t", n_heads=1, n_layers=1, seed=s, division=[undefined])
        for s in range(3)
    ] + [
        RunVerdict(
            run=f"h4_s{s}",
            task="t",
            n_heads=4,
            n_layers=1,
            seed=s,
            division=[divided if s else undefined],
        )
        for s in range(3)
    ]
    one, four = Verdict(runs).headlines()["t"]
    assert "seeds divided" not in one  # h = 1: every seed undefined, no "0/3 divided"
    assert "2/3 seeds divided by token (1 undefined)" in four


def test_an_accuracy_that_rises_at_every_step_is_one_chain_of_table_numbers():
    """h = 1, 2, 4, 8 x 6 seeds, every seed above the last head count's: one chain of seed
    means (each one a number of the table), and the family of 3 accuracy comparisons."""
    levels = {1: 0.62, 2: 0.97, 4: 0.99, 8: 0.999}
    runs = pd.DataFrame(
        [
            {"task": "t", "n_heads": h, "run": f"h{h}_{s}", "accuracy": level + 0.0001 * s}
            for h, level in levels.items()
            for s in range(6)
        ]
    )
    comparisons = head_count_comparisons(runs)
    line = answers(comparisons)["t"]
    assert line.startswith("t: more heads help at every step: accuracy 0.62 → 0.97 → 0.99 → 1.00")
    assert "from h = 1 to 8, every seed at every step (Holm p ≤ 0.0065 over 3)" in line
    assert all(number in _displayed(comparisons) for number in _numbers(line)), line


def _doubling_tables(position_at: dict[int, float], n: int = 6) -> pd.DataFrame:
    """Head-count comparisons of a solved task at h = 1, 2, 4, 8 whose division index by
    position is ``position_at[h]`` (plus seed noise of 0.002), by token 0.001 everywhere, and
    nothing else changing (every head backed up at every h)."""
    rng = np.random.default_rng(0)
    runs, division = [], []
    for h in (1, 2, 4, 8):
        for s in range(n):
            run = f"h{h}_seed{s}"
            runs.append(
                {"run": run, "task": "t", "n_heads": h, "seed": s, "accuracy": 1.0,
                 "n_relations": 1, "heads_per_relation": float(h), "frac_needed": 0.0,
                 "frac_backed_up": 1.0, "frac_dead": 0.0, "specialized_along": ""}
            )  # fmt: skip
            position = position_at[h] + (0 if math.isnan(position_at[h]) else rng.normal(0, 0.002))
            for by, index in (("position", position), ("token", 0.001)):
                division.append(
                    {"run": run, "by": by, "index": index, "null_index": 0.005,
                     "null_high": 0.01, "p": 0.005}
                )  # fmt: skip
    return head_count_comparisons(pd.DataFrame(runs), pd.DataFrame(division))


def test_an_index_rising_at_each_doubling_is_said_as_one_chain_of_means():
    """The index by position rises 0.05 → 0.15 → 0.30 from h = 2 to 8, every seed apart at
    each step: one clause with every step's seed mean (the issue's "more at each doubling"),
    each number the comparison table's; the token index (0.001) stays below the effect gate."""
    comparisons = _doubling_tables({1: math.nan, 2: 0.05, 4: 0.15, 8: 0.30})
    line = answers(comparisons)["t"]
    assert line.startswith("t: solved at every h (accuracy 1.00); from h = 2 to 8 the heads")
    assert re.search(
        r"split the work more by position \(index 0\.05 → 0\.15 → 0\.3\d?\), every seed", line
    )
    assert "from h = 2 to 4" not in line and "by token" not in line
    assert all(number in _displayed(comparisons) for number in _numbers(line)), line
    assert len(line) <= MAX_CHARS


def test_a_step_within_the_seed_spread_breaks_the_chain():
    """The index rises from h = 4 to 8 only (0.15 at h = 2 and at h = 4): the line names that
    step alone, as one pair's clause."""
    comparisons = _doubling_tables({1: math.nan, 2: 0.15, 4: 0.15, 8: 0.30})
    line = answers(comparisons)["t"]
    assert re.search(
        r"from h = 4 to 8 the heads split the work more by position \(index 0\.15 → 0\.3\d?\)", line
    )
    assert "from h = 2" not in line


def _ladder_tables(backed_at: dict[int, float], index_at: dict[str, dict[int, float]]):
    """Head-count comparisons of a solved task at h = 1, 2, 4, 8 x 6 seeds: the backed-up share
    ``backed_at[h]`` at every seed (the needed share its complement), and per division axis
    the index ``index_at[axis][h]`` plus seed noise of 0.002."""
    rng = np.random.default_rng(0)
    runs, division = [], []
    for h in (1, 2, 4, 8):
        for s in range(6):
            run = f"h{h}_seed{s}"
            runs.append(
                {"run": run, "task": "t", "n_heads": h, "seed": s, "accuracy": 1.0,
                 "n_relations": 1, "heads_per_relation": float(h),
                 "frac_needed": 1 - backed_at[h], "frac_backed_up": backed_at[h],
                 "frac_dead": 0.0, "specialized_along": ""}
            )  # fmt: skip
            for by, levels in index_at.items():
                index = levels[h] + (0 if math.isnan(levels[h]) else rng.normal(0, 0.002))
                division.append(
                    {"run": run, "by": by, "index": index, "null_index": 0.005,
                     "null_high": 0.01, "p": 0.005}
                )  # fmt: skip
    return head_count_comparisons(pd.DataFrame(runs), pd.DataFrame(division))


def test_a_backed_up_share_rising_at_linked_steps_is_one_clause_of_table_numbers():
    """Backed-up share 0 → 0.5 → 1 from h = 1 to 4, every seed apart at each step: one clause
    with both steps' seed means (the needed share, its complement, is not said again); the
    division clause that two separate share clauses would have pushed out still fits."""
    nan = math.nan
    comparisons = _ladder_tables(
        {1: 0.0, 2: 0.5, 4: 1.0, 8: 1.0},
        {"target_class": {1: nan, 2: 0.01, 4: 0.11, 8: 0.30},
         "position": {1: nan, 2: 0.01, 4: 0.05, 8: 0.12}},
    )  # fmt: skip
    line = answers(comparisons)["t"]
    assert line.startswith(
        "t: solved at every h (accuracy 1.00); from h = 4 every head is backed up (share "
        "0.00 → 0.50 → 1.00 from h = 1, every seed, Holm p ≤ "
    ), line
    assert line.count("share") == 1 and "needed" not in line
    assert "from h = 2 to 8 the heads split the work more by target_class (index " in line
    assert all(number in _displayed(comparisons) for number in _numbers(line)), line
    assert len(line) <= MAX_CHARS


def test_a_division_clause_too_long_for_the_line_keeps_its_largest_axes():
    """Three axes rising at each doubling make a clause that does not fit beside the share
    clause (314 characters in all): the line keeps the clause with its two largest axes
    (target_class 0.01 → 0.40, token 0.02 → 0.20) and their own seeds and Holm p, instead of
    dropping the division."""
    nan = math.nan
    comparisons = _ladder_tables(
        {1: 0.0, 2: 0.5, 4: 0.5, 8: 0.5},
        {"target_class": {1: nan, 2: 0.01, 4: 0.15, 8: 0.40},
         "position": {1: nan, 2: 0.01, 4: 0.05, 8: 0.12},
         "token": {1: nan, 2: 0.02, 4: 0.08, 8: 0.20}},
    )  # fmt: skip
    line = answers(comparisons)["t"]
    assert "from h = 1 to 2 the backed-up share goes 0.00 → 0.50, every seed" in line
    assert re.search(
        r"from h = 2 to 8 the heads split the work more by target_class \(index 0\.0\d+ → "
        r"0\.15 → 0\.40\) and token \(0\.02 → 0\.08 → 0\.20\), every seed, Holm p ≤ ",
        line,
    ), line
    assert "position" not in line
    assert all(number in _displayed(comparisons) for number in _numbers(line)), line
    assert len(line) <= MAX_CHARS
