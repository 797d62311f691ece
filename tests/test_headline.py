"""Stability of the headline: every gate and the ablation method moved; the share of verdict
sentences that change, beside the share of labels that flip."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from mhainterp.handbuilt import handbuilt_model
from mhainterp.specialization import (
    THRESHOLDS,
    SpecializationSettings,
    attach_division,
    specialization_test,
)
from mhainterp.specialization.verdict.headline import (
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
    names = [p.name for p in gate_perturbations(SpecializationSettings())]
    expected = [f"{t} x{f:g}" for t in (*THRESHOLDS, "alpha") for f in (0.8, 1.25)]
    expected += ["n_eval x0.5", "n_eval x2", "ablation_method=zero", "ablation_method=resample"]
    expected += [f"division {g} x{f:g}" for g in ("min_gain", "min_loss_increase", "serve_share")
                 for f in (0.8, 1.25)]  # fmt: skip
    assert names == expected
    moved = {p.name: p for p in gate_perturbations(SpecializationSettings())}
    assert moved["alpha x1.25"].settings.alpha == pytest.approx(0.0625)
    assert moved["n_eval x2"].settings.n_eval == 512
    assert moved["division serve_share x1.25"].division == {"serve_share": 0.625}


def test_a_division_settings_object_names_its_own_perturbations():
    class Gates:  # what whom's DivisionSettings provides
        def perturbations(self):
            return [("min_gain x0.8", "A"), ("method=zero", "B")]

    tail = gate_perturbations(SpecializationSettings(), Gates())[-2:]
    assert [(p.name, p.division) for p in tail] == [
        ("division min_gain x0.8", {"settings": "A"}),
        ("division method=zero", {"settings": "B"}),
    ]


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
    assert len(table) == 28 and not table["changed"].any()
    assert headline_summary(table)["share_labels_changed"] == 0.0
