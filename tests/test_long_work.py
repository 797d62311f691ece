"""Issue 33 item 7: long work says what is about to run, then an estimate measured on its
first unit, and counts its units on a bar (quiet in tests).

``mhainterp specialize --headline-stability`` ran 8 min 52 s on the first of 9 runs with
nothing said. The analyses are replaced here by a stand-in and the clock by a fake one, so
the lines are checked exactly (no timing is measured).
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

import mhainterp.specialization.headline as headline
from mhainterp.cli.specialize import HEADLINE_ANALYSES
from mhainterp.config import TrainConfig
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.render import estimate_line, format_duration
from mhainterp.specialization import SpecializationSettings
from mhainterp.tasks import get_task
from mhainterp.training import evaluate, save_run


def _run_folder(path):
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "uniform"], d_head=18)
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    saved = {**evaluate(model, task, n_eval=16), "status": "finished"}
    save_run(model, task, path, TrainConfig(steps=1), metrics, saved)
    return path


def test_durations_read_as_people_say_them():
    assert [format_duration(s) for s in (0.4, 14.2, 125, 532, 4264, 7200)] == [
        "0 s", "14 s", "2 min 5 s", "8 min 52 s", "1 h 11 min", "2 h 0 min",
    ]  # fmt: skip
    assert estimate_line("demo", "task", 2, 90) == (
        "demo: the first of 2 tasks took 1 min 30 s; about 3 min 0 s in all (extrapolated "
        "from the first)"
    )


def test_headline_stability_announces_then_estimates_from_the_first_analysis(tmp_path, monkeypatch):
    runs = [_run_folder(tmp_path / "sweep" / "runs" / f"h2_seed{s}") for s in (0, 1)]
    said: list[str] = []
    clock = iter(range(0, 10_000, 12))  # every reading 12 s after the last
    monkeypatch.setattr(headline, "time", SimpleNamespace(perf_counter=lambda: next(clock)))

    def analyses(model, data, settings=None, *, by, on_analysis):
        for i in range(headline.n_analyses(settings)):
            said.append(f"analysis {i}")
            on_analysis()
        table = pd.DataFrame({c: [] for c in headline.HEADLINE_COLUMNS})
        table.attrs["headline"] = "h"
        return table

    monkeypatch.setattr(headline, "headline_stability", analyses)
    found = headline.headline_stability_folder(
        tmp_path / "sweep" / "runs" / "h2_seed0", progress=False, echo=said.append
    )
    assert [p for p, _ in found] == runs[:1]
    n = headline.n_analyses(SpecializationSettings())
    assert n == HEADLINE_ANALYSES == 41  # the CLI's help says the same number
    assert said[0] == (
        f"headline stability: 1 run(s) x {n} analyses (the specialization test and the "
        "division of labour, once unperturbed and once per moved gate or method); the first "
        "analysis is timed to estimate the rest"
    )
    # the estimate comes right after the first analysis, before the second
    assert said[1:3] == ["analysis 0", estimate_line("headline stability", "analysis", n, 12)]
    assert said[3] == "analysis 1"
    assert "about 8 min 12 s in all" in said[2]


def test_quiet_headline_stability_says_nothing(tmp_path, monkeypatch, capsys):
    _run_folder(tmp_path / "run")

    def one(model, data, settings=None, *, by, on_analysis):
        on_analysis()
        table = pd.DataFrame({c: [] for c in headline.HEADLINE_COLUMNS})
        table.attrs["headline"] = "h"
        return table

    monkeypatch.setattr(headline, "headline_stability", one)
    headline.headline_stability_folder(tmp_path / "run", progress=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
