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
from mhainterp.specialization.seeds.answer import MAX_CHARS, comparison_grid
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
    """No family can pass (0.1 x 2 is above 0.05): the line says so with the accuracy
    family's size, the one its first clause is about."""
    _, comparisons, notes = _findings(3)
    line = answers(comparisons)["reverse"]
    assert line == (
        "reverse: accuracy 1.00 at every h, but 3 seeds per h cannot show a change (exact floor "
        "p = 0.1, Holm over 2); 5 can"
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


def _ladder_tables(
    backed_at: dict[int, float],
    index_at: dict[str, dict[int, float]],
    fixed: dict[str, float] | None = None,
) -> pd.DataFrame:
    """Head-count comparisons of a solved task at h = 1, 2, 4, 8 x 6 seeds: the backed-up share
    ``backed_at[h]`` at every seed (the needed share its complement), per division axis the
    index ``index_at[axis][h]`` plus seed noise of 0.002, and per ``fixed`` axis one index at
    every seed and h (no noise)."""
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
            indices = {
                by: levels[h] + (0 if math.isnan(levels[h]) else rng.normal(0, 0.002))
                for by, levels in index_at.items()
            } | (fixed or {})
            for by, index in indices.items():
                division.append(
                    {"run": run, "by": by, "index": index, "null_index": 0.005,
                     "null_high": 0.01, "p": 0.005}
                )  # fmt: skip
    return head_count_comparisons(pd.DataFrame(runs), pd.DataFrame(division))


def _doubling_tables(position_at: dict[int, float]) -> pd.DataFrame:
    """Head-count comparisons of a solved task at h = 1, 2, 4, 8 whose division index by
    position is ``position_at[h]`` (plus seed noise of 0.002), by token 0.001 everywhere, and
    nothing else changing (every head backed up at every h)."""
    every = dict.fromkeys((1, 2, 4, 8), 1.0)
    return _ladder_tables(every, {"position": position_at}, fixed={"token": 0.001})


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


def test_a_family_that_can_pass_is_answered_though_a_larger_one_cannot():
    """5 seeds at h = 1, 2, 4, 8: the accuracy family (3 comparisons, floor 0.0079 x 3 =
    0.024) can pass, the division's (8, 0.063) cannot. Each comparison is corrected in its
    own family, so the line answers the accuracy (every step passes), and the power note
    says the complete separation passes in the smaller families only."""
    rng = np.random.default_rng(0)
    runs, division = [], []
    for h, level in {1: 0.5, 2: 0.7, 4: 0.9, 8: 0.99}.items():
        for s in range(5):
            run = f"h{h}_seed{s}"
            runs.append(
                {"run": run, "task": "t", "n_heads": h, "seed": s, "accuracy": level + 0.005 * s,
                 "specialized_along": ""}
            )  # fmt: skip
            for by in ("position", "token", "target_class", "target"):
                index = math.nan if h == 1 else 0.2 + 0.05 * rng.standard_normal()
                division.append({"run": run, "by": by, "index": index})
    runs, division = pd.DataFrame(runs), pd.DataFrame(division)
    comparisons = head_count_comparisons(runs, division)
    sizes = comparisons.groupby("family")["n_holm"].max().to_dict()
    assert sizes == {"accuracy": 3, "whom": 8}
    line = answers(comparisons)["t"]
    assert line.startswith(
        "t: more heads help at every step: accuracy 0.51 → 0.71 → 0.91 → 1.00 from h = 1 to 8, "
        "every seed at every step (Holm p ≤ 0.024 over 3)"
    ), line
    notes = summary_notes(specialization_summary(runs, division=division), comparisons)
    power = notes[-1]
    assert "each question's family (3 to 8 comparisons)" in power
    assert "in the smaller families only (those of fewer than 7 comparisons)" in power


def test_one_seed_per_head_count_is_said_to_test_nothing_and_an_accuracy_table_alone_works():
    """1 seed per h: no p at all; the line says what the seed shows (no "every seed") and
    that nothing can be tested, instead of "Holm p = nan over 0". A table with only the
    accuracy (no other measure) is answered too."""
    runs = pd.DataFrame(
        {"task": ["t"] * 3, "n_heads": [1, 4, 8], "run": list("abc"), "accuracy": [0.55, 0.8, 0.97]}
    )
    line = answers(head_count_comparisons(runs))["t"]
    assert line == (
        "t: accuracy 0.55 → 0.80 from h = 1 to 4, but with one seed per h no seed spread is "
        "known, so nothing can be tested"
    )
    assert "nan" not in line and "every seed" not in line


def _share_runs(shares: dict[int, tuple[float, float]]) -> pd.DataFrame:
    """A solved task, 6 seeds per h, with ``shares[h] = (backed_up, needed)`` at every seed."""
    return pd.DataFrame(
        [
            {"task": "t", "n_heads": h, "run": f"h{h}_{s}", "accuracy": 1.0,
             "frac_backed_up": backed, "frac_needed": needed}
            for h, (backed, needed) in shares.items()
            for s in range(6)
        ]
    )  # fmt: skip


def test_every_head_backed_up_is_said_from_h_only_where_it_stays():
    """Backed-up share 0 → 1 (h = 4) → 0.5 (h = 8): every head is backed up *at* h = 4, not
    "from h = 4" (the line goes on to say the share falls to 0.50 at h = 8). Where it stays
    at 1, "from h = 4"."""
    falls = answers(head_count_comparisons(_share_runs({1: (0, 1), 4: (1, 0), 8: (0.5, 0.5)})))
    assert "; at h = 4 every head is backed up (share 0.00 → 1.00, every seed" in falls["t"]
    assert "from h = 4 to 8 the backed-up share goes 1.00 → 0.50" in falls["t"]
    stays = answers(head_count_comparisons(_share_runs({1: (0, 1), 4: (1, 0), 8: (1, 0)})))
    assert "; from h = 4 every head is backed up (share 0.00 → 1.00, every seed" in stays["t"]


def test_the_needed_share_is_said_where_dead_heads_keep_it_from_being_the_complement():
    """h = 4: a quarter of the heads backed up, a quarter needed, half dead: the needed share's
    fall (1.00 → 0.25) is not the backed-up share's rise (0.00 → 0.25) told backwards, so
    the line says both. Where every head is one or the other, it says the backed-up share
    alone."""
    dead = answers(head_count_comparisons(_share_runs({1: (0, 1), 4: (0.25, 0.25)})))["t"]
    assert "the backed-up share goes 0.00 → 0.25" in dead
    assert "the needed share goes 1.00 → 0.25" in dead
    complement = answers(head_count_comparisons(_share_runs({1: (0, 1), 4: (0.25, 0.75)})))["t"]
    assert "the backed-up share goes 0.00 → 0.25" in complement and "needed" not in complement


def test_the_notes_count_each_family_as_holm_did():
    """A comparison with no p (1 seed with a relation at one head count) is not in its Holm
    family: the block's family sizes are the tested ones, the untested said apart."""
    _, comparisons, _ = _findings(6)
    comparisons = comparisons.copy()
    where = comparisons.index[comparisons["family"] == "where"][0]
    comparisons.loc[where, ["p", "p_holm"]] = math.nan
    comparisons.loc[comparisons["family"] == "where", "n_holm"] -= 1
    runs, division = _tables(6)
    notes = summary_notes(specialization_summary(runs, division=division), comparisons)
    block = next(n for n in notes if BLOCK_MARK in n)
    assert "where 3 (1 untested)" in block, block[:300]


def test_the_grid_bolds_no_division_change_below_the_effect_gate():
    """The index by position rises 0.005 → 0.012 (h = 2 → 4, every seed apart: beyond the
    spread, but below the 0.02 gate at both) and then to 0.05: the grid shows the row, bolds
    the second change only, as the README's footnote says."""
    nan = math.nan
    comparisons = _ladder_tables(
        {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, {"position": {1: nan, 2: 0.005, 4: 0.012, 8: 0.05}}
    )
    row = next(
        line
        for line in comparison_grid(comparisons, ("division_position",)).splitlines()
        if line.startswith("| t, by position")
    )
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2].startswith("+0.00") and "**" not in cells[2], row
    assert cells[3].startswith("**+0.04"), row


def test_a_count_over_fewer_seeds_than_the_row_says_its_n():
    """Heads per relation is a mean over the seeds whose heads hold a relation: at h = 8 two
    of six seeds hold none, so its cell says n = 4 beside the row's 6 seeds; the other
    cells, over every seed, say nothing more."""
    runs, division = _tables(6)
    none = (runs["n_heads"] == 8) & (runs["seed"] < 2)
    runs.loc[none, ["n_relations", "heads_per_relation"]] = [0, math.nan]
    tables = dict(display_summary(specialization_summary(runs, division=division)))
    counts = next(t for caption, t in tables.items() if caption.startswith("Counts"))
    at8 = counts[counts["h"] == 8].iloc[0]
    assert at8["seeds"] == 6
    assert at8["heads per relation (count)"] == "8.00 ± 0.00 (n = 4)"
    assert "(n = " not in at8["accuracy"]
    assert "(n = " not in counts[counts["h"] == 4].iloc[0]["heads per relation (count)"]


def test_a_division_change_below_the_effect_gate_says_so_in_its_verdict():
    """Beyond the seed spread is not an effect: the index by position 0.005 → 0.012 (every
    seed apart, both below the 0.02 gate) is "h=4 higher (below the 0.02 effect gate)";
    0.012 → 0.05 reaches the gate and is "h=8 higher" alone."""
    nan = math.nan
    comparisons = _ladder_tables(
        {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, {"position": {1: nan, 2: 0.005, 4: 0.012, 8: 0.05}}
    )
    rows = comparisons[comparisons["measure"] == "division_position"].set_index("n_heads_b")
    assert rows.loc[4, "verdict"] == "h=4 higher (below the 0.02 effect gate)"
    assert rows.loc[8, "verdict"] == "h=8 higher"
