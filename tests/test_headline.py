"""Stability of the headline: every gate and the ablation method moved; the share of verdict
sentences that change, beside the share of labels that flip."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.specialization import (
    THRESHOLDS,
    DivisionSettings,
    SpecializationSettings,
    attach_division,
    specialization_test,
)
from mhainterp.specialization.headline import (
    compare_headlines,
    gate_perturbations,
    headline_stability,
    headline_summary,
)
from mhainterp.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=16, d_vocab=10)


def test_every_gate_and_the_method_is_moved():
    settings = SpecializationSettings()
    perturbations = gate_perturbations(settings)
    names = [p.name for p in perturbations]
    expected = [f"{t} x{f:g}" for t in (*THRESHOLDS, "alpha") for f in (0.8, 1.25)]
    expected += ["n_eval x0.5", "n_eval x2", "method=zero", "method=resample"]
    division = settings.division  # the labels' n_eval, alpha, method, ...: one family
    assert division == DivisionSettings(n_eval=settings.n_eval, method=settings.method)
    expected += [f"division {name}" for name, _ in division.perturbations()]
    assert names == expected
    moved = {p.name: p for p in perturbations}
    assert moved["alpha x1.25"].settings.alpha == pytest.approx(0.0625)
    assert moved["n_eval x2"].settings.n_eval == 2 * settings.n_eval
    assert moved["n_eval x2"].division.n_eval == 2 * settings.n_eval  # both tests see it
    assert moved["division serve_share x 1.25"].division.serve_share == pytest.approx(0.625)
    assert moved["division method=zero"].division.method == "zero"
    assert moved["method=zero"].settings.method == "zero"  # the labels' method, named as its field
    assert moved["min_effect x0.8"].division == division  # a label gate leaves the division


def test_compare_headlines_counts_sentences_and_labels(task):
    result = specialization_test(handbuilt_model(["previous", "dead"], d_head=18), task,
                                 n_eval=32, n_permutations=20)  # fmt: skip
    divided = pd.DataFrame({"by": ["position"], "index": [0.4], "null_index": [0.0],
                            "p": [0.001], "call": ["divided"]})  # fmt: skip
    base = attach_division(result, divided)
    same = attach_division(result, divided)
    flipped = attach_division(result, divided.assign(call=["not divided"]))
    heads = flipped.heads.copy()
    heads.loc[heads["head_label"] == "L0H1", "label"] = "unspecialized"
    flipped = dataclasses.replace(flipped, heads=heads)
    table = compare_headlines(base, [("same", same), ("flipped", flipped)])
    assert table["changed"].tolist() == [False, True]
    assert table["headline"].tolist() == [
        "the heads divide the work along position",
        "the heads do not divide the work along any axis tested",
    ]
    assert table["n_labels_changed"].tolist() == [0, 1]
    assert headline_summary(table) == {
        "n_perturbations": 2,
        "share_sentences_changed": 0.5,
        "share_labels_changed": 0.25,
    }


@pytest.mark.slow
def test_a_lone_previous_head_keeps_its_headline_under_every_gate(task):
    # One damaging head: the single-head index is undefined ("cannot tell") whatever the gates.
    model = handbuilt_model(["previous", "dead"], d_head=18)
    settings = SpecializationSettings(n_eval=64, n_permutations=50, n_init=2)
    table = headline_stability(model, task, settings, by=("position",))
    assert table.attrs["headline"].startswith("cannot tell")
    assert len(table) == len(gate_perturbations(settings)) and not table["changed"].any()
    assert headline_summary(table)["share_labels_changed"] == 0.0


def _run_folder(path, heads):
    from mhainterp.config import TrainConfig
    from mhainterp.training import evaluate, save_run

    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(heads, d_head=18)
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    saved = {**evaluate(model, task, n_eval=64), "status": "finished"}
    return save_run(model, task, path, TrainConfig(steps=1), metrics, saved)


def test_specialize_prints_the_headline_stability_when_asked(tmp_path, capsys, monkeypatch):
    from mhainterp.cli import main
    from mhainterp.specialization import headline

    run = _run_folder(tmp_path / "run", ["previous", "dead"])
    table = pd.DataFrame({"changed": [True, False, False, False], "n_labels": [2] * 4,
                          "n_labels_changed": [1, 0, 0, 0]})  # fmt: skip
    asked = []

    def fake(path, settings, *, by, progress):
        asked.append((path, by, progress))
        return [(path, table)]

    monkeypatch.setattr(headline, "headline_stability_folder", fake)
    args = ["specialize", str(run), "--by", "position", "--n-eval", "64", "--quiet"]
    assert main(args) == 0
    assert asked == [] and "Headline stability" not in capsys.readouterr().out  # opt-in
    assert main([*args, "--headline-stability"]) == 0
    out = capsys.readouterr().out
    assert asked == [(run, ("position",), False)]
    assert "  run: 1 of 4 perturbations change the sentence (25%); 12% of labels change" in out


@pytest.mark.slow
def test_headline_stability_folder_saves_the_table_and_the_shares(tmp_path):
    import json

    from mhainterp.specialization.headline import HEADLINE_FILE, headline_stability_folder

    run = _run_folder(tmp_path / "run", ["previous", "dead"])
    settings = SpecializationSettings(n_eval=64, n_permutations=50, n_init=2)
    [(folder, table)] = headline_stability_folder(run, settings, by=("position",), progress=False)
    assert folder == run and len(table) == len(gate_perturbations(settings))
    saved = pd.read_csv(run / "analysis" / HEADLINE_FILE)
    assert saved["perturbation"].tolist() == table["perturbation"].tolist()
    summary = json.loads((run / "analysis" / "headline_stability.json").read_text())
    assert summary["headline"].startswith("cannot tell")
    assert summary["share_sentences_changed"] == 0.0 and summary["share_labels_changed"] == 0.0


def test_halving_n_eval_never_asks_mean_ablation_for_one_sequence():
    """n_eval=2 halved was 1: mean ablation now refuses one sequence (its own z), so the
    perturbation failed after every other one had run (review). It stays at 2."""
    from mhainterp.specialization import SpecializationSettings
    from mhainterp.specialization.headline import gate_perturbations

    moved = {p.name: p for p in gate_perturbations(SpecializationSettings(n_eval=2))}
    assert moved["n_eval x0.5"].settings.n_eval == moved["n_eval x0.5"].division.n_eval == 2
    assert moved["n_eval x2"].settings.n_eval == 4
