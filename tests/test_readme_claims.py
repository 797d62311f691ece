"""The README's results are the reference's, and they replicate on seeds they were not
derived from.

- "What a real run found" quotes the demo's one-line answers (seeds 0-5): they are regenerated
  here from ``data/reference/quickstart/*/specialization_comparisons.csv``, word for word.
- Its replication sentence (held-out seeds 6-11, ``mhainterp demo --seeds 6-11``) is recounted
  from the two comparison tables (``replication.csv``): how many claims replicate, and each one
  that does not, named in the README.
- "Does h matter?" shows the CPU study's grid (``data/reference/head_count_study``), regenerated
  from its ``study_comparisons.csv``, and states its replication on seeds 6-11 the same way.
- Slow: the held-out run is redone and gives the saved held-out comparisons.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from mhainterp.analyze.study import grid_measures
from mhainterp.specialization.seeds.answer import MAX_CHARS, MIN_INDEX, comparison_grid
from mhainterp.specialization.seeds.replication import replication
from mhainterp.specialization.seeds.summary import answers
from mhainterp.sweep.compare import HEAD_COUNT_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "data" / "reference" / "quickstart"
STUDY = ROOT / "data" / "reference" / "head_count_study"
HELD_OUT = tuple(range(6, 12))


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _comparisons(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    table["beyond"] = table["beyond"].map(lambda v: None if pd.isna(v) else str(v) == "True")
    return table[HEAD_COUNT_COLUMNS]


def _unwrapped(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_readme_quotes_the_reference_answers_word_for_word():
    section = _unwrapped(_readme_section("What a real run found"))
    for task in ("count_previous", "reverse"):
        line = answers(_comparisons(REFERENCE / task / "specialization_comparisons.csv"))[task]
        assert len(line) <= MAX_CHARS
        assert line in section, line


def test_the_cpu_grid_answers_keep_their_division_clause_within_the_line():
    """Every CPU-grid task whose division index changes beyond the seed spread says so in its
    one line, the index named (a clause that does not fit MAX_CHARS is left out: the words
    "division index" there dropped multi_relation's and sort's). previous_token's needs both
    fallbacks: its backed-up share as one chain (0.00 → 0.50 → 1.00, one clause instead of
    two), and its division clause by its largest axis alone (target_class; position's chain
    would take the line to 345 characters)."""
    comparisons = _comparisons(STUDY / "study_comparisons.csv")
    whom = comparisons[(comparisons["family"] == "whom") & (comparisons["beyond"] == True)]  # noqa: E712
    dividing = set(whom[whom[["mean_a", "mean_b"]].max(axis=1) >= MIN_INDEX]["task"])
    lines = answers(comparisons)
    named = {task for task in dividing if "the heads split the work" in lines[task]}
    assert named == dividing == {
        "count_previous", "histogram", "multi_relation", "previous_token", "reverse", "sort"
    }  # fmt: skip
    for task in named:
        assert "(index " in lines[task] and len(lines[task]) <= MAX_CHARS, lines[task]
    previous = lines["previous_token"]
    assert "every head is backed up (share 0.00 → 0.50 → 1.00 from h = 1, every seed" in previous
    assert "by target_class (index 0.0073 → 0.11 → 0.30), every seed" in previous
    assert "position" not in previous


@pytest.mark.parametrize(
    ("folder", "section"),
    [(REFERENCE, "What a real run found"), (STUDY, "Does h matter?")],
    ids=["demo", "cpu grid"],
)
def test_the_replication_the_readme_states_is_the_reference_tables(folder, section):
    reference = _comparisons(folder / "study_comparisons.csv")
    held_out = _comparisons(folder / "held_out_comparisons.csv")
    table = replication(reference, held_out)
    saved = pd.read_csv(folder / "replication.csv")
    assert table["replicates"].tolist() == saved["replicates"].tolist()
    text = _unwrapped(_readme_section(section))
    stated = f"{int(table['replicates'].sum())} of {len(table)} comparisons"
    assert stated in text
    for row in table[~table["replicates"]].itertuples(index=False):
        name = f"{row.task} {row.quantity} h = {row.n_heads_a} → {row.n_heads_b}"
        assert name in text, f"the README does not say that {name} fails to replicate"


def test_the_readme_grid_is_the_cpu_studys():
    comparisons = _comparisons(STUDY / "study_comparisons.csv")
    grid = comparison_grid(comparisons, grid_measures(), changes_only=True)
    assert grid in _readme_section("Does h matter?")
    tasks = set(comparisons["task"])
    assert len(tasks) >= 6  # every built-in task one layer can learn


@pytest.mark.slow
def test_the_held_out_seeds_give_the_saved_comparisons(tmp_path):
    """The held-out run, redone: the same comparisons (numbers to 1e-9, verdicts exactly)."""
    from mhainterp.analyze import run_demo

    run_demo(tmp_path, seeds=HELD_OUT, analysis=False, progress=False)
    redone = _comparisons(tmp_path / "study_comparisons.csv")
    saved = _comparisons(REFERENCE / "held_out_comparisons.csv")
    assert redone["verdict"].tolist() == saved["verdict"].tolist()
    assert redone["beyond"].tolist() == saved["beyond"].tolist()
    pd.testing.assert_series_equal(redone["diff"], saved["diff"], rtol=1e-9, atol=1e-12)
