"""The README's main job: its plan (fast, the heavy steps recorded instead of run), and the
whole of it end to end at a tiny size (slow; the real one trains 1,500 steps)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import mhainterp.analyze.demo
import mhainterp.figures.saved
import mhainterp.report
import mhainterp.specialization
import mhainterp.specialization.folders
from mhainterp.cli import main


class _Summary:
    def __init__(self, task: str) -> None:
        self.task = task

    def to_markdown(self) -> str:
        return f"### {self.task}\n"


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

    def division(path, settings=None, **options):
        calls.append(("division", Path(path), settings))
        return []

    def specialize(path, settings=None, **options):
        calls.append(("specialize", Path(path), settings.n_eval, options["by"]))
        return []

    def report(path, out=None, **options):
        calls.append(("report", Path(path)))
        return Path(path) / "report.md", Path(path) / "report.html"

    # patched where run_demo looks them up: in its own module
    monkeypatch.setattr(mhainterp.analyze.demo, "run_sweep_with_figures", sweep)
    monkeypatch.setattr(mhainterp.analyze.demo, "analyze_run", analyze)
    monkeypatch.setattr(mhainterp.specialization.folders, "division_folder", division)
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
        # on the default evaluation set, then the labels on 256 sequences (it attaches it).
        ("division", out, None),
        ("specialize", out, 256, ()),
        # drawn beside the tables (the report only embeds them), one sweep at a time: a bar
        ("figures", out / "count_previous"),
        ("figures", out / "reverse"),
        ("report", out),
    ]
    printed = capsys.readouterr().out
    assert "### count_previous" in printed and "### reverse" in printed
    assert f"report: {out / 'report.md'}" in printed
    # Long work is announced: the plan before anything runs, the estimate after the first task.
    lines = printed.splitlines()
    assert lines[0].startswith("demo: count_previous and reverse, 4 runs each (h = 1, 2 x ")
    estimate = next(i for i, line in enumerate(lines) if line.startswith("demo: the first of 2"))
    assert "(extrapolated from the first)" in lines[estimate]
    assert lines.index("### count_previous") < estimate < lines.index("### reverse")
    assert any(line.startswith("figures: drawing each sweep's figures") for line in lines)


def test_demo_defaults_are_the_readme_protocol(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(
        mhainterp.analyze.demo,
        "run_sweep_with_figures",
        lambda config, out, executor, progress: seen.append(config) or _Summary(config.task),
    )
    monkeypatch.setattr(mhainterp.specialization.folders, "division_folder", lambda *a, **k: [])
    monkeypatch.setattr(mhainterp.specialization, "specialize_folder", lambda *a, **k: [])
    monkeypatch.setattr(mhainterp.figures.saved, "save_folder_figures", lambda path: [])
    monkeypatch.setattr(mhainterp.report, "write_report", lambda *a, **k: (Path(), Path()))
    mhainterp.analyze.demo.run_demo(tmp_path, analysis=False, executor="local", progress=False)
    assert [c.task for c in seen] == ["count_previous", "reverse"]
    assert {(tuple(c.n_heads), tuple(c.seeds), c.train.steps) for c in seen} == {
        ((1, 4, 8), (0, 1, 2), 1500)
    }


@pytest.mark.slow
def test_demo_runs_both_sweeps_analyses_heads_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "quick"
    args = ["demo", "--out", str(out), "--steps", "8", "--seeds", "0,1", "--n-heads", "1,2"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "### count_previous" in printed and "### reverse" in printed
    # each sweep's specialization answer is printed, counts apart from shares
    assert "### reverse: do the heads specialize?" in printed
    assert "| relations covered (count) |" in printed and "*Shares of all heads" in printed
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
