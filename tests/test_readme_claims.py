"""The README's "What a real run found", rerun on held-out seeds: the demo's protocol
(:func:`mhainterp.demo.run_demo`: count_previous and reverse, h = 1, 4, 8, 1,500 steps,
d_model 64, one attention-only layer) on seeds 3, 4, 5, and every claim of that section
checked against the tables the run saves. The README claims only what held on seeds 0-2
(``data/reference/quickstart/``) and on these; the pooled claims are checked on the reference
tables and these runs together.

Slow: 11 min 37 s for the three tests on this project's shared 2-core machine under load
(load average 7; the demo with its head analysis took 5 min 12 s there on a quieter machine).
The head analysis of one run (``analysis=False``) is skipped: the section claims nothing of it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from mhainterp.analyze import run_demo
from mhainterp.specialization.folders import SweepSpecialization
from mhainterp.stats import compare_head_counts, separation, smallest_p

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference" / "quickstart"
HELD_OUT = (3, 4, 5)


@pytest.fixture(scope="module")
def held_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("heldout")
    run_demo(out, seeds=HELD_OUT, analysis=False, progress=False)
    return out


def _index(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / "division_sweep.csv")


def _values(table: pd.DataFrame, h: int, by: str, column: str = "index") -> pd.Series:
    return table[(table["n_heads"] == h) & (table["by"] == by)][column]


def _accuracy(folder: Path, h: int) -> pd.Series:
    results = pd.read_csv(folder / "results.csv")
    return results.loc[results["n_heads"] == h, "val_accuracy"]


def _summary_row(folder: Path, h: int) -> pd.Series:
    summary = SweepSpecialization.load(folder).summary
    return summary.set_index("n_heads").loc[h]


def _divided(table: pd.DataFrame, h: int, by: str) -> int:
    return int((_values(table, h, by, "call") == "divided").sum())


@pytest.mark.slow
def test_count_previous_claims_hold_on_held_out_seeds(held_out):
    folder = held_out / "count_previous"
    index = _index(folder)
    # One head cannot learn the task (0.60-0.64); h = 4 and 8 reach 0.99 and 1.00.
    assert 0.55 < _accuracy(folder, 1).mean() < 0.70
    assert _accuracy(folder, 4).mean() >= 0.985 and _accuracy(folder, 8).mean() >= 0.995
    # Every seed at h = 4 beats every seed at h = 1, but 3 seeds cannot show it (floor 0.1).
    assert separation(_accuracy(folder, 1), _accuracy(folder, 4)) == 1
    spec = SweepSpecialization.load(folder)
    row = spec.comparisons.query("measure == 'accuracy' and n_heads_a == 1").iloc[0]
    assert row["p"] == pytest.approx(0.1) and not row["beyond"]
    assert row["verdict"] == "no difference shown (complete separation at the floor)"
    assert not any(b is True for b in spec.comparisons["beyond"])  # none beyond at n = 3
    # The heads divide the work by query token: 0.25-0.26 at h = 8, above its null's q95.
    token8 = _values(index, 8, "token")
    assert 0.20 <= token8.mean() <= 0.31
    assert _values(index, 8, "token", "null_high").mean() <= 0.05
    assert _divided(index, 8, "token") >= 2
    # Where a head looks says little: relations covered 0.33 ± 0.58 at h = 8.
    assert _summary_row(folder, 8)["n_relations_mean"] < 1.0
    # One head has no index, on every axis.
    assert _values(index, 1, "token").isna().all() and _values(index, 1, "position").isna().all()


@pytest.mark.slow
def test_reverse_claims_hold_on_held_out_seeds(held_out):
    folder = held_out / "reverse"
    index = _index(folder)
    for h in (1, 4, 8):
        assert _accuracy(folder, h).min() >= 0.999
    for h in (4, 8):  # every head backed up; kept-head profiles divide by position
        row = _summary_row(folder, h)
        assert row["frac_needed_mean"] == 0 and row["frac_backed_up_mean"] == 1
        assert _divided(index, h, "position") == 3
        assert _values(index, h, "token").max() < 0.01 and _divided(index, h, "token") == 0
    assert 0.25 <= _values(index, 8, "position").mean() <= 0.31
    assert _values(index, 8, "position", "null_high").mean() <= 0.02
    assert 0.15 <= _values(index, 8, "target_class").mean() <= 0.30
    # Every seed at h = 8 above every seed at h = 4, by position and by target class.
    for by in ("position", "target_class"):
        assert separation(_values(index, 4, by), _values(index, 8, by)) == 1


@pytest.mark.slow
def test_pooled_claims_hold_on_reference_and_held_out_seeds(held_out):
    """Seeds 0-5: 6 per head count, the exact floor 2 / C(12, 6) = 0.0022; a complete
    separation is beyond the spread after Holm over 13 comparisons (13 x 0.0022 = 0.028),
    whatever the other 12 give."""
    assert 13 * smallest_p(6, 6) < 0.05
    pooled = {}
    for task in ("count_previous", "reverse"):
        pooled[task] = {
            "index": pd.concat([_index(REFERENCE / task), _index(held_out / task)]),
            "accuracy": {
                h: pd.concat([_accuracy(REFERENCE / task, h), _accuracy(held_out / task, h)])
                for h in (1, 4, 8)
            },
        }
    accuracy = pooled["count_previous"]["accuracy"]
    assert len(accuracy[1]) == 6 and separation(accuracy[1], accuracy[4]) == 1
    reverse = pooled["reverse"]["index"]
    for by in ("position", "target_class"):
        assert separation(_values(reverse, 4, by), _values(reverse, 8, by)) == 1
    # count_previous by token rises from 4 to 8 heads, but not in every seed: no difference
    # shown (exact p 0.006; Holm over 13: third after the two accuracy separations, so at
    # least 11 x p = 0.07).
    token = pooled["count_previous"]["index"]
    runs = token[token["by"] == "token"].assign(task="count_previous")
    row = compare_head_counts(runs, [("index", "token")]).iloc[0]
    assert row["separated"] == 0 and 0.12 < row["diff"] < 0.18
    assert 0.003 < row["p"] < 0.02 and 11 * row["p"] > 0.05
    assert not math.isnan(row["ci_low"]) and row["ci_low"] > 0
