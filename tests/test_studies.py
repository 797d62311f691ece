"""The study scripts in analysis/ run end to end (tiny sizes) and write their tables and report."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd

ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ANALYSIS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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
        "--n-sequences",
        "32",
        "--quiet",
    ]
    assert study.main(args) == 0
    results = pd.read_csv(tmp_path / "reverse" / "results.csv")
    assert results[["n_heads", "seed"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
    assert (tmp_path / "report.md").is_file() and (tmp_path / "report.html").is_file()


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
        "--n-sequences",
        "32",
        "--quiet",
    ]
    assert study.main(args) == 0
    assert (tmp_path / "multi_relation" / "results.csv").is_file()
    assert "multi_relation" in (tmp_path / "report.md").read_text()
