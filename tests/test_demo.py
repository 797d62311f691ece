"""The README's main job: its plan (fast, the heavy steps recorded instead of run), and the
whole of it end to end at a tiny size (slow; the real one trains 1,000 steps)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import mhainterp.analyze.demo
import mhainterp.analyze.study
import mhainterp.figures.saved
import mhainterp.report
import mhainterp.specialization
import mhainterp.specialization.folders
from mhainterp.cli import main


class _Summary:
    def __init__(self, task: str) -> None:
        self.task = task
        self.table = pd.DataFrame(
            {"n_heads": [1, 2], "val_accuracy_mean": [0.5, 0.9], "val_accuracy_std": [0.1, 0.0],
             "n": [2, 2]}
        )  # fmt: skip


class _Spec:
    def __init__(self) -> None:
        self.answers = {
            "count_previous": "count_previous: the answer",
            "reverse": "reverse: the answer",
        }


def test_demo_plan_sweeps_and_analyses_each_task_then_specializes_then_reports(
    tmp_path, monkeypatch, capsys
):
    calls: list[tuple] = []

    def sweep(config, out, executor, progress):
        calls.append(("sweep", config.task, Path(out), executor))
        calls.append(("config", config.task_params, config.n_heads, config.seeds, config.model))
        calls.append(("steps", config.train.steps))
        return _Summary(config.task)

    def analyze(run_dir, *, reference, progress):
        calls.append(("analyze", Path(run_dir), reference))
        return []

    def specialize(path, settings=None, **options):
        division = options["division_settings"]
        calls.append(("specialize", Path(path), settings.n_eval, division.n_eval))
        return [(Path(path), _Spec())]

    def tables(path, sweeps):
        calls.append(("study tables", Path(path)))
        return []

    def report(path, out=None, **options):
        calls.append(("report", Path(path)))
        return Path(path) / "report.md", Path(path) / "report.html"

    # patched where run_study looks them up: in its own module
    monkeypatch.setattr(mhainterp.analyze.study, "run_sweep_with_figures", sweep)
    monkeypatch.setattr(mhainterp.analyze.study, "analyze_run", analyze)
    monkeypatch.setattr(mhainterp.analyze.study, "write_study_tables", tables)
    monkeypatch.setattr(mhainterp.specialization, "specialize_folder", specialize)
    figures = lambda path: calls.append(("figures", Path(path))) or []  # noqa: E731
    monkeypatch.setattr(mhainterp.figures.saved, "save_folder_figures", figures)
    monkeypatch.setattr(mhainterp.report, "write_report", report)
    out = tmp_path / "quick"
    args = ["demo", "--out", str(out), "--steps", "8", "--seeds", "0,1", "--n-heads", "1,2"]
    args += ["--executor", "local"]
    assert main(args) == 0
    runs = {task: out / task / "runs" for task in ("count_previous", "reverse")}
    params = {"seq_len": 16, "d_vocab": 10}
    model = {"d_model": 64, "n_layers": 1}
    assert calls == [
        ("sweep", "count_previous", out / "count_previous", "local"),
        ("config", params, [1, 2], [0, 1], model),
        ("steps", 8),
        # The run with the most heads (first seed) is analysed, the one-head run as reference.
        ("analyze", runs["count_previous"] / "h2_seed0", runs["count_previous"] / "h1_seed0"),
        ("sweep", "reverse", out / "reverse", "local"),
        ("config", params, [1, 2], [0, 1], model),
        ("steps", 8),
        ("analyze", runs["reverse"] / "h2_seed0", runs["reverse"] / "h1_seed0"),
        # The report only reads, so the specialization results are saved first: the division
        # on the default evaluation set and the labels on 256 sequences, each run loaded once.
        ("specialize", out, 256, 1024),
        # drawn beside the tables (the report only embeds them), one sweep at a time: a bar
        ("figures", out / "count_previous"),
        ("figures", out / "reverse"),
        ("study tables", out),
        ("report", out),
    ]
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    # Long work is announced: the plan before anything runs, the estimate after the first task.
    assert lines[0].startswith("demo* grid: 2 tasks x h in {1, 2} x 2 seeds (0-1) = 8 runs")
    assert "count_previous: val accuracy by head count (seed mean ± std, n)" in lines
    assert "  h=1   0.50 ± 0.10  n=2" in lines
    estimate = next(i for i, line in enumerate(lines) if line.startswith("training: the first"))
    assert "(extrapolated from the first)" in lines[estimate]
    # the answers, one line per task, then where the evidence is
    assert lines.index("- count_previous: the answer") < lines.index("- reverse: the answer")
    assert lines[-1].startswith(f"report: {out / 'report.md'} (evidence, figures, every test)")


def test_demo_defaults_are_the_study_protocol(tmp_path, monkeypatch):
    """The demo is the head-count study's demo grid: 6 seeds, the study's training."""
    seen = []
    monkeypatch.setattr(
        mhainterp.analyze.study,
        "run_sweep_with_figures",
        lambda config, out, executor, progress: seen.append(config) or _Summary(config.task),
    )
    monkeypatch.setattr(mhainterp.analyze.study, "write_study_tables", lambda *a: [])
    monkeypatch.setattr(mhainterp.specialization.folders, "division_folder", lambda *a, **k: [])
    monkeypatch.setattr(mhainterp.specialization, "specialize_folder", lambda *a, **k: [])
    monkeypatch.setattr(mhainterp.figures.saved, "save_folder_figures", lambda path: [])
    monkeypatch.setattr(mhainterp.report, "write_report", lambda *a, **k: (Path(), Path()))
    mhainterp.analyze.demo.run_demo(tmp_path, analysis=False, executor="local", progress=False)
    assert [c.task for c in seen] == ["count_previous", "reverse"]
    assert {(tuple(c.n_heads), tuple(c.seeds), c.train.steps) for c in seen} == {
        ((1, 4, 8), (0, 1, 2, 3, 4, 5), 1000)
    }
    study = mhainterp.analyze.study
    grid = study.GRIDS["demo"]
    assert [study.sweep_config(grid, task) for task in grid.tasks] == seen  # one code path


@pytest.mark.slow
def test_demo_runs_both_sweeps_analyses_heads_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "quick"
    args = ["demo", "--out", str(out), "--steps", "8", "--seeds", "0,1", "--n-heads", "1,2"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert len(printed.splitlines()) <= 40  # one screen: seed tables, answers, the report
    assert "count_previous: val accuracy by head count" in printed
    assert max(len(line) for line in printed.splitlines()) <= 320
    assert (out / "does_h_matter.png").is_file() and (out / "study_comparisons.csv").is_file()
    for task in ("count_previous", "reverse"):
        results = pd.read_csv(out / task / "results.csv")
        assert results[["n_heads", "seed"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
        assert results["n_params"].nunique() == 1
        assert (out / task / "head_count_accuracy.png").is_file()
        analysis = out / task / "runs" / "h2_seed0" / "analysis"
        assert (analysis / "similarity_separation.png").is_file()
        assert (analysis / "ablation_importance.csv").is_file()
        assert (out / task / "specialization_notes.json").is_file()  # saved before the report
    report = (out / "report.md").read_text()
    assert "Not in this report" not in report
    accuracy = pd.read_csv(out / "reverse" / "summary_table.csv")["val_accuracy_mean"].iloc[0]
    assert f"{accuracy:.3f}" in report  # the report states the measured numbers
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and 'src="http' not in html

    # Rerunning resumes: nothing is retrained and the tables are identical.
    before = pd.read_csv(out / "reverse" / "results.csv")
    assert main(args) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out / "reverse" / "results.csv"), before)
