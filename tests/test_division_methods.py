"""Issue 31, items 3-5: each ablation method against its own same-function null, backup across
layers, and an effect gate on a head's "specialized" flag. Known answers by setting weights.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from mhainterp import division_of_labour
from mhainterp.model.handbuilt import (
    head_copies_model,
    induction_circuit_model,
    split_heads_model,
)
from mhainterp.specialization.settings import DivisionSettings
from mhainterp.specialization.verdict.stability import division_stability
from mhainterp.specialization.whom.division_calls import specialized_rule
from mhainterp.tasks import get_task, split_batch

AXES = "token,position,target_class"
POSITIONS = list(range(2, 12))  # the scored positions of split_batch(seq_len=12)


def _index(result, by: str) -> pd.Series:
    return result.index.set_index("by").loc[by]


# ----------------------------------------------------------------------------- own nulls


def test_each_method_is_judged_against_its_own_null():
    # Two heads that split the positions, judged by target class with zero ablation first.
    # Mean ablation's replacement keeps predicting some classes, so its class profiles differ
    # by 0.04; a mean-ablated noisy copy differs as much (its own null, 0.09), while zero's
    # null is 0.02. Against zero's null (the old rule) mean read "divided" and the axis
    # "method-dependent"; against its own it is not divided, like the others.
    model = split_heads_model([("position", POSITIONS[:5]), ("position", POSITIONS[5:])])
    result = division_of_labour(model, split_batch(256), "target_class", method="zero",
                                n_bootstrap=50)  # fmt: skip
    row = _index(result, "target_class")
    assert row.null_high == row.null_high_zero  # the primary method's null, as before
    assert row.null_high_zero < row.index_mean < row.null_high_mean
    assert row.index_mean == pytest.approx(0.039, abs=0.002)
    assert row.null_high_mean == pytest.approx(0.087, abs=0.005)
    assert (row.call_mean, row.call_zero, row.call_resample) == ("not divided",) * 3
    assert row.call == "not divided"


def test_a_negligible_index_is_never_a_division():
    # min_index: an index within 0.02 of identical profiles is no division whatever its
    # interval, so it never makes an axis "method-dependent".
    model = split_heads_model([("position", POSITIONS[:5]), ("position", POSITIONS[5:])])
    batch = split_batch(256)
    gated = division_of_labour(model, batch, "target_class", method="zero", methods=("zero",),
                               n_bootstrap=50, min_index=0.01)  # fmt: skip
    assert _index(gated, "target_class").index_zero < 0.01
    assert _index(gated, "target_class").call == "not divided"
    split = division_of_labour(model, batch, "position", n_bootstrap=50, min_index=0.99)
    row = _index(split, "position")
    assert row["index"] == pytest.approx(1.0) and row.ci_low > row.null_high
    assert row.call == "divided"  # 1.0 >= 0.99


# ----------------------------------------------------------------------------- across layers


def test_two_layers_of_same_job_heads_are_not_divided():
    # Every head of both layers copies the previous token: any one of the four does the job,
    # so no head damages alone and removing a whole layer costs nothing (the other layer does
    # it). Kept alone in its layer a head adds nothing; kept alone in the model it does all.
    model = split_heads_model([("all", None)] * 2, n_layers=2)
    result = division_of_labour(model, split_batch(256), AXES, n_bootstrap=50)
    assert result.settings["groups"] == ["L0H0,L0H1,L1H0,L1H1"]  # one cross-layer group
    heads = result.heads.query("by == 'position'").set_index("head_label")
    assert (heads.damage_alone == 0).all() and (heads.basis == "kept").all()
    assert (heads.kept_scope == "model").all()
    assert heads.kept_contribution.tolist() == pytest.approx([0.86] * 4, abs=0.02)
    assert not result.heads.specialized.any()
    for axis in ("token", "position", "target_class"):
        row = _index(result, axis)
        assert (row.basis, row.call) == ("kept", "not divided")
        assert (row.call_mean, row.call_zero) == ("not divided", "not divided")
        assert row["index"] == pytest.approx(0.0, abs=1e-9)


def test_the_serial_induction_circuit_is_not_a_backup():
    # L0H0 (previous token) feeds L1H0 (induction): each is needed, neither backs the other
    # up. Both damage alone, so the single basis decides; no group, kept profiles in their
    # own layers.
    task = get_task("induction", seq_len=16, d_vocab=10)
    result = division_of_labour(induction_circuit_model(16, 10), task, AXES, n_bootstrap=50)
    assert result.settings["groups"] == []
    heads = result.heads.query("by == 'token'").set_index("head_label")
    assert heads.basis.tolist() == ["single", "single"]
    assert heads.kept_scope.tolist() == ["layer", "layer"]
    assert heads.damage_alone.tolist() == pytest.approx([0.99, 0.88], abs=0.02)
    assert not result.heads.specialized.any()
    for axis in ("token", "position"):
        assert _index(result, axis).call == "not divided"


def test_zero_ablation_of_the_induction_head_falls_back_on_the_first_class():
    # The default-class artefact, stated: zero-ablating L1H0 leaves every logit at 0 (nothing
    # else writes the copy block) and argmax breaks the tie toward class 0, so the zero profile
    # of L1H0 spares class 0 exactly, and L0H0's does not: a target-class "split" that mean
    # and resample ablation, whose replacements keep the logits apart, do not show.
    task = get_task("induction", seq_len=16, d_vocab=10)
    result = division_of_labour(induction_circuit_model(16, 10), task, "target_class",
                                method="zero", n_bootstrap=50)  # fmt: skip
    profile = result.profiles.query("head_label == 'L1H0'").set_index("value")["damage"]
    assert profile["0"] == 0.0 and (profile.drop("0") == 1.0).all()
    row = _index(result, "target_class")
    assert (row.call_zero, row.call_mean, row.call_resample) == (
        "divided", "not divided", "not divided",
    )  # fmt: skip
    # Mean ablation, which differs from zero only by keeping each head's mean write, finds no
    # split: the default-class artefact, so zero is left out of the call (it was
    # "method-dependent"), and the reason says why.
    assert row.call == "not divided" and "zero ablation left out of the call" in row.reason
    assert "(zero ablation left out: the default-class artefact)" in result.summary_line()


def _constant_write_copies(noise: float, seed: int):
    """Two noisy copies of a previous-token head that also writes a constant the readout
    relies on (the unembedding's bias is lowered by it), each writing half: a head's mean
    write, as trained heads have. Zero-ablating one copy removes its half of the constant,
    which leaves the remaining copy near the bias of the never-correct BOS class; each copy's
    noise decides which classes then fall to BOS."""
    model = split_heads_model([("all", None), ("all", None)])
    V, T, d_head = 10, 12, 16
    copy = slice(V + T, 2 * V + T)
    attn = model.blocks[0].attn
    with torch.no_grad():
        W_V, W_O = attn.W_V.clone(), attn.W_O.clone()
        W_V[0, :V, d_head - 1] = 1.0  # every token gives the head a constant 1 in z
        W_O[0, d_head - 1, copy] = 0.9 * (torch.arange(V) < V - 1)  # written to every class
        attn.W_V, attn.W_O = W_V, W_O
        model.unembed.bias[: V - 1] -= 20.0 * 0.9  # the readout relies on the constant
    return head_copies_model(model, 0, noise, seed=seed)


@pytest.mark.parametrize(("noise", "seed"), [(0.05, 0), (0.1, 2)])
def test_noisy_copies_of_a_head_with_a_mean_write_are_not_divided(noise, seed):
    # The default-class artefact on two noisy copies of one head: zero ablation alone calls
    # the target classes divided (index 0.34 vs its own null's 0.10; 0.56 vs 0.15), mean and
    # resample ablation do not, and the combined call was "method-dependent". The known
    # answer is "not divided": zero is left out of the call, and the reason says so.
    batch = split_batch(512)
    result = division_of_labour(_constant_write_copies(noise, seed), batch, "target_class",
                                n_bootstrap=100)  # fmt: skip
    row = _index(result, "target_class")
    assert (row.call_zero, row.call_mean, row.call_resample) == (
        "divided", "not divided", "not divided",
    )  # fmt: skip
    assert row.index_zero > 0.3 and row.index_mean < 0.01
    assert row.call == "not divided" and "zero ablation left out of the call" in row.reason


def test_a_target_class_split_is_still_divided_with_zero_in_the_call():
    # Two heads that carry classes 0-3 and 4-8: every method divides them, zero included.
    model = split_heads_model([("target", [0, 1, 2, 3]), ("target", [4, 5, 6, 7, 8])])
    result = division_of_labour(model, split_batch(256), "target_class", n_bootstrap=50)
    row = _index(result, "target_class")
    assert (row.call, row.call_mean, row.call_zero, row.call_resample) == ("divided",) * 4
    assert row.index_zero == pytest.approx(1.0) and "left out" not in row.reason


# ----------------------------------------------------------------------------- effect gate


@pytest.mark.parametrize("method", ["mean", "zero", "resample"])
def test_exact_copies_have_no_specialized_row_under_any_method(method):
    model = head_copies_model(split_heads_model([("target", [0, 1, 2]), ("all", None)]), 0)
    result = division_of_labour(model, split_batch(256), AXES, method=method, n_bootstrap=50)
    assert not result.heads.specialized.any()
    assert (result.heads.serves == "").all()
    assert result.index["index"].abs().max() < 1e-9


def test_a_significant_but_negligible_selectivity_is_not_a_finding():
    # A position-split head under mean ablation: the replacement still predicts some classes,
    # so L0H1's class profile spares class 1 (selectivity 0.026, p_adj 0.002): significant,
    # but 0.014 above its null, below min_selectivity_gain (0.075).
    model = split_heads_model([("position", POSITIONS[:5]), ("position", POSITIONS[5:])])
    result = division_of_labour(model, split_batch(256), "target_class", n_bootstrap=50)
    row = result.heads.set_index("head_label").loc["L0H1"]
    assert row.selectivity == pytest.approx(0.026, abs=0.003) and row.p_adj < 0.05
    assert row.selectivity_gain < DivisionSettings().min_selectivity_gain
    assert row.served_values == "0,2,3,4,5,6,7,8" and row.serves == ""
    assert not result.heads.specialized.any()


def test_the_rule_needs_significance_an_effect_and_a_spared_value():
    # Two heads splitting classes 0-4 / 5-9 read 0.063 more selective over positions than
    # their layer in the audit (flat damage): below the gate. A 1-of-11 split reads 0.09.
    yes = np.array([True])
    rule = [
        specialized_rule(yes, np.array([p]), np.array([gain]), np.array([spares]), 0.05, 0.075)
        for p, gain, spares in [(0.001, 0.063, True), (0.001, 0.091, True), (0.104, 0.5, True),
                                (0.001, 0.5, False), (0.001, 0.5, True)]
    ]  # fmt: skip
    assert [bool(r[0]) for r in rule] == [False, True, False, False, True]


def test_the_gate_is_moved_in_the_stability_check():
    # One axis's heads table: a 1-of-11 position split (gains 0.89 and 0.09): x 1.25 moves the
    # gate to 0.094, which the 10-of-11 head no longer passes; x 0.8 changes nothing.
    positions = list(range(2, 13))
    model = split_heads_model([("position", positions[:1]), ("position", positions[1:])],
                              seq_len=13, d_head=17)  # fmt: skip
    result = division_of_labour(model, split_batch(256, seq_len=13), "position",
                                method="zero", methods=("zero",), n_bootstrap=50)  # fmt: skip
    heads = result.heads.set_index("head_label")
    assert heads.specialized.tolist() == [True, True]
    assert heads.selectivity.tolist() == pytest.approx([1 - 1 / 11, 1 - 10 / 11], abs=1e-6)
    # gain: above the larger null (the flat job's 0; the shuffled head's sampling noise)
    assert heads.selectivity_gain.tolist() == pytest.approx([0.89, 0.0907], abs=0.005)
    table = division_stability(result.heads)
    assert table[["threshold", "factor", "changed"]].values.tolist() == [
        ["min_selectivity_gain", 0.8, ""],
        ["min_selectivity_gain", 1.25, "L0H1"],
    ]
    assert table.value.tolist() == pytest.approx([0.06, 0.09375])
    assert "min_selectivity_gain x 1.25" in dict(DivisionSettings().perturbations())
    assert "min_index x 0.8" in dict(DivisionSettings().perturbations())
