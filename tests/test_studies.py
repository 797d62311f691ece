"""The study scripts in analysis/ run end to end (tiny sizes) and write their tables and report."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ANALYSIS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _printable() -> SimpleNamespace:
    return SimpleNamespace(to_markdown=lambda: "")


def _report(calls: list[tuple]):
    """A write_report that records its call."""

    def report(path, settings):
        calls.append(("report", path))
        return path / "report.md", path / "report.html"

    return report


def test_head_count_study_plan(tmp_path, monkeypatch):
    # The study's steps in order, the heavy ones recorded instead of run.
    study = _load("head_count_study")
    calls: list[tuple] = []

    def sweep(config, out, executor, progress):
        calls.append(("sweep", config.task, config.n_heads, config.seeds, config.train.steps, out))
        return _printable()

    def specialize(path, settings, progress):
        calls.append(("specialize", path, settings.n_eval))

    monkeypatch.setattr(study, "run_sweep_with_figures", sweep)
    monkeypatch.setattr(study, "specialize_folder", specialize)
    monkeypatch.setattr(study, "save_folder_figures", lambda path: calls.append(("figures", path)))
    monkeypatch.setattr(study, "write_report", _report(calls))
    assert study.main(["--out", str(tmp_path), "--quick", "--executor", "local", "--quiet"]) == 0
    assert calls == [
        ("sweep", "count_previous", [1, 4], [0, 1, 2], 150, tmp_path / "count_previous"),
        ("sweep", "reverse", [1, 4], [0, 1, 2], 150, tmp_path / "reverse"),
        ("specialize", tmp_path, 128),  # the report only reads: computed first
        ("figures", tmp_path),  # and drawn beside the tables
        ("report", tmp_path),
    ]


def test_specialization_study_plan(tmp_path, monkeypatch):
    study = _load("specialization_study")
    calls: list[tuple] = []

    def sweep(config, out, executor, progress):
        calls.append(("sweep", config.task, out))
        return _printable()

    def analyze(run_dir, n_eval, progress):
        calls.append(("analyze", run_dir.name, n_eval))

    def specialize(sweep, settings, progress):
        # specialize_folder computes the division of labour and saves the sweep's tables
        calls.append(("specialize", sweep.name, settings.n_eval))
        verdict = SimpleNamespace(lines=["a verdict"])
        spec = SimpleNamespace(to_markdown=lambda: "", result=SimpleNamespace(verdict=verdict))
        return [(sweep, spec)]

    monkeypatch.setattr(study, "run_sweep_with_figures", sweep)
    monkeypatch.setattr(study, "analyze_run", analyze)
    monkeypatch.setattr(study, "specialize_folder", specialize)
    monkeypatch.setattr(study, "save_folder_figures", lambda path: calls.append(("figures", path)))
    monkeypatch.setattr(study, "write_report", _report(calls))
    args = ["--out", str(tmp_path), "--tasks", "reverse", "--quick", "--executor", "local"]
    assert study.main([*args, "--quiet"]) == 0
    assert calls == [
        ("sweep", "reverse", tmp_path / "reverse"),
        ("analyze", "h4_seed0", 256),  # --quick: only the largest head count, seed 0
        ("specialize", "reverse", 128),  # computed and saved before the report reads it
        ("figures", tmp_path),  # drawn beside the tables
        ("report", tmp_path),
    ]


@pytest.mark.slow
def test_head_count_study_writes_seed_tables_and_report(tmp_path):
    study = _load("head_count_study")
    args = [
        "--out",
        str(tmp_path),
        "--tasks",
        "reverse",
        "--n-heads",
        "1,2",
        "--seeds",
        "0,1",
        "--steps",
        "6",
        "--d-model",
        "8",
        "--seq-len",
        "6",
        "--d-vocab",
        "4",
        "--executor",
        "local",
        "--n-eval",
        "32",
        "--quiet",
    ]
    assert study.main(args) == 0
    results = pd.read_csv(tmp_path / "reverse" / "results.csv")
    assert results[["n_heads", "seed"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
    assert (tmp_path / "report.md").is_file() and (tmp_path / "report.html").is_file()


@pytest.mark.slow
def test_specialization_study_writes_report(tmp_path):
    study = _load("specialization_study")
    args = [
        "--out",
        str(tmp_path),
        "--tasks",
        "multi_relation",
        "--n-heads",
        "1,2",
        "--seeds",
        "0,1",
        "--steps",
        "6",
        "--executor",
        "local",
        "--n-eval",
        "32",
        "--quiet",
    ]
    assert study.main(args) == 0
    assert (tmp_path / "multi_relation" / "results.csv").is_file()
    assert "multi_relation" in (tmp_path / "report.md").read_text()
