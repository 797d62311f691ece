"""The head-count sweep: exact statistics on known tables, resumption, refusal to mix sweeps."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_SWEEP

from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.errors import RunFolderError
from mhainterp.stats import describe, welch_test
from mhainterp.sweep import EXECUTORS, execute_run, run_sweep, summarize


def _results(acc: dict[int, list[float]], task="reverse") -> pd.DataFrame:
    rows = []
    for h, values in acc.items():
        for seed, value in enumerate(values):
            rows.append(
                {
                    "task": task,
                    "n_heads": h,
                    "seed": seed,
                    "d_model": 64,
                    "d_head": 64 // h,
                    "n_params": 20000,
                    "n_attn_params": 16640,
                    "final_train_loss": 1.0 - value,
                    "val_accuracy": value,
                }
            )
    return pd.DataFrame(rows)


def test_describe_uses_sample_std():
    assert describe([0.5, 0.7, 0.9]) == {
        "mean": pytest.approx(0.7),
        "std": pytest.approx(0.2),
        "n": 3,
    }
    assert math.isnan(describe([0.5])["std"])


def test_welch_matches_textbook_value():
    # a = [1,2,3] (mean 2, var 1), b = [4,5,6] (mean 5, var 1): t = -3 / sqrt(2/3), df = 4.
    t, p = welch_test([1, 2, 3], [4, 5, 6])
    assert t == pytest.approx(-3 / math.sqrt(2 / 3))
    assert p == pytest.approx(0.0213, abs=1e-4)
    assert welch_test([1, 1], [1, 1]) == (0.0, 1.0)


def test_summarize_exact_table_and_verdicts():
    summary = summarize(
        _results({1: [0.50, 0.52, 0.54], 4: [0.90, 0.91, 0.92], 8: [0.88, 0.93, 0.95]})
    )
    table = summary.table.set_index("n_heads")
    assert table.loc[1, "val_accuracy_mean"] == pytest.approx(0.52)
    assert table.loc[1, "val_accuracy_std"] == pytest.approx(0.02)
    assert table.loc[4, "val_accuracy_std"] == pytest.approx(0.01)
    assert table.loc[4, "d_head"] == 16 and table.loc[8, "n"] == 3
    assert table.loc[1, "final_train_loss_mean"] == pytest.approx(0.48)
    # Adjacent head counts only (sweep.compare.compare_head_counts); with 3 seeds each the exact
    # permutation test is used, whose floor 2 / C(6, 3) = 0.1 a complete separation reaches.
    cmp = summary.comparisons.set_index(["n_heads_a", "n_heads_b"])
    assert list(cmp.index) == [(1, 4), (4, 8)]
    assert cmp.loc[(1, 4), "diff"] == pytest.approx(0.39)
    assert cmp.loc[(1, 4), "test"] == "exact permutation"
    assert cmp.loc[(1, 4), "p"] == pytest.approx(0.1) and cmp.loc[(1, 4), "separated"] == 1
    assert cmp.loc[(1, 4), "p_holm"] == pytest.approx(0.2)  # Holm x 2 (smallest)
    assert bool(cmp.loc[(1, 4), "beyond"]) is False
    assert cmp.loc[(1, 4), "verdict"] == "no difference shown (complete separation at the floor)"
    # Welch's t interval of 1 -> 4 by hand: se = sqrt(0.02**2/3 + 0.01**2/3).
    t = 0.39 / math.sqrt((0.02**2 + 0.01**2) / 3)
    assert welch_test([0.90, 0.91, 0.92], [0.50, 0.52, 0.54])[0] == pytest.approx(t)
    assert cmp.loc[(1, 4), "ci_low"] < 0.39 < cmp.loc[(1, 4), "ci_high"]
    # 4 vs 8: diff 0.01 with std 0.01 and 0.036: no difference shown.
    assert cmp.loc[(4, 8), "verdict"] == "no difference shown (within the seed spread)"
    assert not any("too easy" in note for note in summary.notes)
    markdown = summary.to_markdown()
    assert "| 1 | 64 |" in markdown and "complete separation at the floor" in markdown
    # the training loss is the last logging window's mean, not the last step's: said so
    assert "train loss (last log window)" in markdown and "final train loss" not in markdown


def test_non_overlapping_bars_are_not_enough():
    # Every seed at h = 8 is above every seed at h = 4, but with n = 3 the exact test's floor
    # is 0.1: not beyond the seed spread, and the note says it is a complete separation at
    # that floor, never "within the seed spread".
    summary = summarize(_results({4: [0.9875, 0.9945, 0.994], 8: [0.9985, 0.9976, 0.9982]}))
    row = summary.comparisons.iloc[0]
    assert row["beyond"] == False and row["p"] > 0.05  # noqa: E712
    assert row["verdict"] == "no difference shown (complete separation at the floor)"
    assert any("the exact test's floor is p = 0.1" in note for note in summary.notes)


def test_zero_variance_groups_get_an_exact_p_not_zero():
    summary = summarize(_results({1: [0.5, 0.5, 0.5], 4: [1.0, 1.0, 1.0]}))
    row = summary.comparisons.iloc[0]
    assert row["test"] == "exact permutation" and row["p"] == pytest.approx(0.1)
    assert row["beyond"] == False  # noqa: E712 -- 3 vs 3 seeds cannot reach p < 0.05 without spread
    assert any("smallest p is 0.1" in note for note in summary.notes)


def test_saved_summary_reads_back(tmp_path):
    summary = summarize(_results({1: [0.50, 0.52, 0.54], 4: [0.90, 0.91, 0.92]}))
    summary.save(tmp_path)
    loaded = type(summary).load(tmp_path)
    assert loaded.notes == summary.notes and loaded.alpha == summary.alpha
    pd.testing.assert_frame_equal(loaded.comparisons, summary.comparisons, check_dtype=False)


def test_summarize_says_too_easy_and_no_difference():
    summary = summarize(_results({1: [1.0, 1.0, 0.995], 4: [1.0, 1.0, 1.0]}))
    assert any(
        "too easy" not in note and "cannot separate head counts" in note for note in summary.notes
    )
    # no untested hint (issue 19 item 16: the suggested settings separated nothing)
    assert not any("harder" in note or "fewer steps" in note for note in summary.notes)
    assert any("no accuracy difference between head counts" in note for note in summary.notes)


def test_summarize_with_one_seed_is_undetermined():
    summary = summarize(_results({1: [0.5], 4: [0.9]}))
    assert summary.comparisons["verdict"].tolist() == ["undetermined (n < 2)"]


def test_summarize_rejects_other_tables():
    with pytest.raises(ValueError, match="missing columns"):
        summarize(pd.DataFrame({"task": ["x"]}))


TINY = TINY_SWEEP  # the shared tiny sweep's config (tests/conftest.py)


def _numbers(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["run_dir"])


def test_sweep_table_rows_and_folders(tmp_path):
    df = run_sweep(TINY, tmp_path, progress=False)
    assert df[["n_heads", "seed"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
    assert df["n_attn_params"].tolist() == [4 * (8 * 8 + 8)] * 4
    assert df["n_params"].nunique() == 1  # the head count does not change the parameter count
    assert (tmp_path / "runs" / "h2_seed1" / "model.safetensors").is_file()
    saved = pd.read_csv(tmp_path / "results.csv")
    pd.testing.assert_frame_equal(_numbers(saved), _numbers(df), check_dtype=False)


def test_killed_sweep_resumes_to_the_identical_table(tmp_path, monkeypatch):
    reference = run_sweep(TINY, tmp_path / "clean", progress=False)

    def dies_after_two(specs, progress):
        for spec in specs[:2]:
            execute_run(spec)
        raise KeyboardInterrupt("killed")

    monkeypatch.setitem(EXECUTORS, "dies", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(TINY, tmp_path / "killed", executor="dies", progress=False)
    # A half-written run (no eval.json) must be redone, not trusted.
    (tmp_path / "killed" / "runs" / "h1_seed1" / "eval.json").unlink()
    finished_before = (tmp_path / "killed" / "runs" / "h1_seed0" / "model.safetensors").stat()

    trained = []
    monkeypatch.setitem(
        EXECUTORS,
        "counting",
        lambda specs, progress: [trained.append(s.run_dir.name) or execute_run(s) for s in specs],
    )
    resumed = run_sweep(TINY, tmp_path / "killed", executor="counting", progress=False)
    assert trained == ["h1_seed1", "h2_seed0", "h2_seed1"]
    after = (tmp_path / "killed" / "runs" / "h1_seed0" / "model.safetensors").stat()
    assert after.st_mtime_ns == finished_before.st_mtime_ns  # finished run kept untouched
    pd.testing.assert_frame_equal(_numbers(resumed), _numbers(reference))


def test_sweep_defaults_to_runs_task_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = SweepConfig(**{**TINY.__dict__, "n_heads": [2], "seeds": [0]})
    df = run_sweep(small, progress=False)
    assert df["run_dir"].tolist() == [str(Path("runs") / "reverse" / "runs" / "h2_seed0")]
    assert (tmp_path / "runs" / "reverse" / "results.csv").is_file()


def test_sweep_refuses_a_folder_of_another_sweep(tmp_path):
    run_sweep(TINY, tmp_path, progress=False)
    other = SweepConfig(**{**TINY.__dict__, "train": TrainConfig(steps=TINY.train.steps + 1)})
    with pytest.raises(RunFolderError, match=r"holds a different sweep \(train differ"):
        run_sweep(other, tmp_path, progress=False)


def test_more_seeds_grow_the_same_sweep(tmp_path, monkeypatch):
    """The README's advice ("run 5 or more seeds") works in the same folder: the runs already
    trained are kept, only the new seeds train, results.csv lists the seeds asked for."""
    from mhainterp.sweep import run as sweep_run

    run_sweep(TINY, tmp_path, progress=False)
    trained = []
    original = sweep_run.execute_run

    def recorded(spec, **kwargs):
        trained.append(spec.seed)
        return original(spec, **kwargs)

    monkeypatch.setattr(sweep_run, "execute_run", recorded)
    more = SweepConfig(**{**TINY.__dict__, "seeds": [*TINY.seeds, 7]})
    df = run_sweep(more, tmp_path, progress=False, executor="local")
    assert set(trained) == {7}
    assert sorted(set(df["seed"])) == sorted({*TINY.seeds, 7})


def test_sweep_config_errors():
    with pytest.raises(ValueError, match=r"\[3\] do not divide d_model=64"):
        SweepConfig(n_heads=[1, 3])
    with pytest.raises(ValueError, match="set per run by the sweep"):
        SweepConfig(model={"n_heads": 4})
    with pytest.raises(ValueError, match="executor='nope' is invalid: one of 'auto', 'local'"):
        run_sweep(TINY, "unused", executor="nope")


def test_a_sweep_trained_on_a_gpu_resumes_on_the_cpu(tiny_sweep, tmp_path):
    """A run's config.json records the device it was trained on; resuming never needs it (a
    sweep started on a GPU finishes on a CPU, and vice versa)."""
    folder = tmp_path / "rev"
    shutil.copytree(tiny_sweep, folder)
    runs = sorted(run for run in (folder / "runs").iterdir() if run.is_dir())  # not the locks
    for run in runs:  # as a GPU sweep leaves them
        config = json.loads((run / "config.json").read_text())
        assert config["model"]["device"] == "cpu"
        config["model"]["device"] = "cuda:0"
        (run / "config.json").write_text(json.dumps(config))
    (folder / "runs" / "h2_seed0" / "eval.json").unlink()  # killed before it finished
    kept = {run.name: (run / "model.safetensors").stat().st_mtime_ns for run in runs}
    table = run_sweep(TINY_SWEEP, folder, executor="local", progress=False, device="cpu")
    for run in runs:
        retrained = (run / "model.safetensors").stat().st_mtime_ns != kept[run.name]
        device = json.loads((run / "config.json").read_text())["model"]["device"]
        assert (retrained, device) == (
            (True, "cpu") if run.name == "h2_seed0" else (False, "cuda:0")
        )
    reference = pd.read_csv(tiny_sweep / "results.csv")
    pd.testing.assert_frame_equal(
        _numbers(pd.read_csv(folder / "results.csv")), _numbers(reference)
    )
    assert len(table) == 4


def test_one_head_count_and_one_seed_say_no_spread_is_known_not_std_nan():
    notes = " ".join(summarize(_results({4: [0.1172]})).notes)
    assert "one head count (h=4) and one seed" in notes and "no seed spread known" in notes
    assert "nan" not in notes
    two = " ".join(summarize(_results({4: [0.5, 0.6]})).notes)
    assert "over 2 seeds its validation accuracy is 0.5500 (std 0.0707)" in two
