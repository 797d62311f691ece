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


def test_head_count_study_picks_its_grid_by_device():
    study = _load("head_count_study")
    full = study.choose_grid(study.parse_args([]), on_gpu=True)
    assert full.tasks == ("count_previous", "histogram", "induction", "multi_relation",
                          "previous_token", "reverse", "sort")  # fmt: skip
    assert full.n_heads == (1, 2, 4, 8, 16, 32, 64) and full.seeds == tuple(range(30))
    assert full.n_runs == 7 * 7 * 30
    cpu = study.choose_grid(study.parse_args([]), on_gpu=False)
    assert cpu.name == "cpu" and cpu.n_heads == (1, 2, 4, 8) and len(cpu.seeds) == 6
    # every built-in task one layer can learn: all but induction
    assert cpu.tasks == ("count_previous", "histogram", "multi_relation", "previous_token",
                         "reverse", "sort")  # fmt: skip
    custom = study.choose_grid(study.parse_args(["--seeds", "0-99", "--grid", "cpu"]), False)
    assert custom.seeds == tuple(range(100)) and custom.name == "cpu*"
    demo = study.choose_grid(study.parse_args(["--grid", "demo"]), False)
    assert demo == study.GRIDS["demo"]  # the demo's grid, unchanged


def test_head_count_study_runs_the_demos_code_path(monkeypatch):
    """The script only picks a grid: run_study (the demo's path) does the rest."""
    study = _load("head_count_study")
    seen = []
    monkeypatch.setattr(study, "run_study", lambda grid, out, **options: seen.append((grid, out)))
    assert study.main(["--grid", "cpu", "--out", "x", "--quiet"]) == 0
    assert seen == [(study.GRIDS["cpu"], Path("x"))]


def test_specialization_study_plan(tmp_path, monkeypatch):
    study = _load("specialization_study")
    calls: list[tuple] = []

    def sweep(config, out, executor, progress):
        calls.append(("sweep", config.task, out))
        return _printable()

    def analyze(run_dir, n_eval, progress):
        calls.append(("analyze", run_dir.name, n_eval))

    def specialize(sweep, settings, progress, division_settings):
        # specialize_folder divides every run (on the default evaluation set, whatever
        # --n-eval says), labels the heads on --n-eval, attaches the division, saves the tables
        calls.append(("specialize", sweep.name, settings.n_eval, division_settings.n_eval))
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
        ("specialize", "reverse", 128, 1024),  # computed and saved before the report reads it
        ("figures", tmp_path),  # drawn beside the tables
        ("report", tmp_path),
    ]


@pytest.mark.slow
def test_head_count_study_writes_its_answer_and_resumes(tmp_path, monkeypatch):
    study = _load("head_count_study")
    monkeypatch.chdir(tmp_path.parent)  # a relative --out, as users give it
    args = ["--out", tmp_path.name, "--tasks", "reverse", "--n-heads", "1,2", "--seeds", "0-2",
            "--steps", "6", "--executor", "local", "--quiet", "--no-analysis"]  # fmt: skip
    assert study.main(args) == 0
    results = pd.read_csv(tmp_path / "reverse" / "results.csv")
    assert results[["n_heads", "seed"]].values.tolist() == [
        [1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [2, 2]
    ]  # fmt: skip
    division = pd.read_csv(tmp_path / "reverse" / "division_sweep.csv")
    assert sorted(set(division["seed"])) == [0, 1, 2] and set(division["n_heads"]) == {1, 2}
    table = pd.read_csv(tmp_path / "does_h_matter.csv")
    assert table[["n_heads", "n_seeds"]].values.tolist() == [[1, 3], [2, 3]]
    assert (tmp_path / "does_h_matter.png").is_file() and (tmp_path / "does_h_matter.pdf").is_file()
    report = (tmp_path / "report.md").read_text()
    assert report.splitlines()[4].startswith("- reverse: ")  # the answer leads the Findings
    # resumed: nothing is trained or divided again
    import mhainterp.specialization.folders as folders

    monkeypatch.setattr(folders, "division_of_labour", lambda *a, **k: pytest.fail("recomputed"))
    assert study.main(args) == 0


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


def test_replicate_seeds_runs_the_grid_again_and_names_what_does_not_replicate(
    tmp_path, monkeypatch, capsys
):
    """--replicate-seeds: the same grid on the held-out seeds, then replication.csv; a
    comparison beyond the spread on the first seeds but not the others is named."""
    study = _load("head_count_study")
    from mhainterp.specialization.seeds.summary import head_count_comparisons

    def comparisons(separated: bool) -> pd.DataFrame:
        high = [0.9, 0.91, 0.92, 0.93, 0.94, 0.95]
        low = (
            [0.5, 0.51, 0.52, 0.53, 0.54, 0.55] if separated else [0.9, 0.96, 0.91, 0.97, 0.9, 0.9]
        )
        runs = pd.DataFrame({"task": ["t"] * 12, "n_heads": [1] * 6 + [4] * 6,
                             "run": list("abcdefghijkl"), "accuracy": low + high})  # fmt: skip
        return head_count_comparisons(runs)

    seen = []

    def run_study(grid, out, **options):
        seen.append((grid.seeds, Path(out).name))
        Path(out).mkdir(parents=True, exist_ok=True)
        comparisons(Path(out).name != "held_out").to_csv(Path(out) / "study_comparisons.csv")

    monkeypatch.setattr(study, "run_study", run_study)
    argv = ["--grid", "demo", "--out", str(tmp_path), "--replicate-seeds", "6-11", "--quiet"]
    assert study.main(argv) == 0
    assert seen == [(tuple(range(6)), tmp_path.name), (tuple(range(6, 12)), "held_out")]
    table = pd.read_csv(tmp_path / "replication.csv")
    assert table["replicates"].tolist() == [False]
    printed = capsys.readouterr().out
    assert "replication: 0 of 1 comparisons beyond the seed spread replicate" in printed
    assert "does not replicate: t accuracy h = 1 → 4" in printed
