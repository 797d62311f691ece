"""Issue 33 items 1, 2, 3, 5 and 6: every label and finding agrees with the verdict and
carries its evidence.

- a head of a divided axis says whom it serves, and its label agrees ("serves token", not
  "unspecialized" beside "the heads divide the work along token");
- a subset served along an axis the heads do not divide says so, and "serves" needs the
  division's gated flag (significant, with an effect);
- the division's per-head effect gate moved x 0.8 / x 1.25 enters the stability table, the
  verdict's flips and the headline's qualifier;
- ``mhainterp.attach_division`` and ``specialization_test(..., division=True)`` give the
  finding the README's five-minute block promises;
- heads of different layers compared in a sentence are named with their layers.

Known answers: hand-set models (``previous`` / ``uniform`` / ``dead`` heads on
``previous_token``, the two-layer induction circuit) and hand-written division tables.
"""

from __future__ import annotations

import pandas as pd
import pytest

import mhainterp
from mhainterp.model.handbuilt import handbuilt_model, induction_circuit_model
from mhainterp.specialization import (
    attach_division,
    division_of_labour,
    label_stability,
    specialization_test,
    stability_summary,
)
from mhainterp.specialization.verdict.stability import DIVISION_THRESHOLD
from mhainterp.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=16, d_vocab=10)


@pytest.fixture(scope="module")
def model():
    return handbuilt_model(["previous", "uniform", "dead"], d_head=18)


@pytest.fixture(scope="module")
def result(model, task):
    return specialization_test(model, task, n_eval=32, n_permutations=20)


def _index_row(by: str, call: str, basis: str = "single") -> dict:
    return {
        "by": by, "call": call, "basis": basis, "index": 0.3, "ci_low": 0.25, "ci_high": 0.35,
        "null_index": 0.01, "null_high": 0.02, "p": 0.001, "p_floor": 0.001,
    }  # fmt: skip


def _head_row(head: str, by: str, served: str, gain: float) -> dict:
    """One head x axis row of a division heads table whose flag follows the gate (0.075)."""
    specialized = bool(served) and gain >= 0.075
    return {
        "head_label": head, "by": by, "basis": "single", "p_adj": 0.001, "n_values": 10,
        "selectivity_gain": gain, "served_values": served or "0,1,2,3,4,5,6,7,8,9",
        "specialized": specialized, "serves": served if specialized else "",
    }  # fmt: skip


INDEX = pd.DataFrame(
    [
        _index_row("token", "divided"),
        _index_row("position", "method-dependent"),
        _index_row("target_class", "not divided"),
    ]
)
HEADS = pd.DataFrame(
    [
        _head_row("L0H0", "token", "", 0.0),
        _head_row("L0H0", "position", "1,2,3", 0.3),
        _head_row("L0H0", "target_class", "", 0.0),
        _head_row("L0H1", "token", "1,2", 0.08),  # specialized; not with the gate x 1.25
        _head_row("L0H1", "position", "", 0.0),
        _head_row("L0H1", "target_class", "3", 0.2),
        _head_row("L0H2", "token", "", 0.0),
        _head_row("L0H2", "position", "", 0.0),
        _head_row("L0H2", "target_class", "", 0.0),
    ]
)


def test_a_head_of_a_divided_axis_is_labelled_by_whom_it_serves(result):
    assert result.heads["label"].tolist() == ["previous", "unspecialized", "dead"]
    attached = attach_division(result, INDEX, HEADS)
    assert attached.heads["label"].tolist() == ["previous", "serves token", "dead"]
    assert attached.heads["finding"].tolist() == [
        "looks at previous; serves position: 1,2,3 (method-dependent); needed",
        "looks at no known relation; serves token: 1,2; target_class: 3 (not divided: the "
        "heads alike); not needed",
        "dead",
    ]
    assert "the heads divide the work along token" in attached.verdict.text
    # where a head looks is still said as such
    assert "1 unspecialized in where they look (L0H1)" in attached.verdict.text


def test_serves_needs_the_gated_flag(result):
    # L0H1's token subset with an effect under the gate (0.05 < 0.075): no finding, no label.
    heads = HEADS.copy()
    row = (heads.head_label == "L0H1") & (heads.by == "token")
    heads.loc[row, ["selectivity_gain", "specialized", "serves"]] = [0.05, False, ""]
    attached = attach_division(result, INDEX, heads)
    assert attached.heads["label"].tolist()[1] == "unspecialized"
    assert "token" not in attached.heads["finding"].tolist()[1]


def test_the_division_gate_moves_in_the_stability_table_and_the_headline(result):
    attached = attach_division(result, INDEX, HEADS)
    moved = attached.stability[attached.stability["threshold"] == DIVISION_THRESHOLD]
    assert moved[["factor", "changed"]].values.tolist() == [[0.8, ""], [1.25, "L0H1"]]
    run = attached.verdict.runs[0]
    assert run.flips[DIVISION_THRESHOLD] == 1 and "L0H1" in run.flip_heads
    assert "labels rest on thresholds" in run.text and f"{DIVISION_THRESHOLD}: 1 " in run.text
    summary = stability_summary(attached.stability).set_index("threshold")
    assert summary.loc[DIVISION_THRESHOLD, "share_any"] == pytest.approx(1 / 3)
    assert attached.runs["n_label_flips"].tolist() == [len(run.flip_heads)]
    # The label thresholds' rows are re-decided from where the heads look: "serves token"
    # is not a flip of "unspecialized".
    labels = label_stability(attached)
    assert labels["n_changed"].sum() == result.stability["n_changed"].sum()


def test_attaching_twice_is_attaching_once(result):
    once = attach_division(result, INDEX, HEADS)
    twice = attach_division(once, INDEX, HEADS)
    assert twice.heads["label"].tolist() == once.heads["label"].tolist()
    pd.testing.assert_frame_equal(twice.stability, once.stability)


def test_the_five_minute_block_gets_its_finding(model, task):
    assert mhainterp.attach_division is attach_division
    division = division_of_labour(model, task, n_eval=64)
    by_hand = attach_division(specialization_test(model, task, n_eval=32), division)
    at_once = specialization_test(model, task, n_eval=32, division=division)
    computed = specialization_test(model, task, n_eval=32, division=True)
    for attached in (by_hand, at_once, computed):
        assert not attached.heads["finding"].str.contains("not measured").any()
        assert attached.heads["finding"].tolist()[2] == "dead"
    assert by_hand.heads["finding"].tolist() == at_once.heads["finding"].tolist()


def test_heads_of_two_layers_are_compared_with_their_layers_named():
    task = get_task("induction", seq_len=16, d_vocab=10)
    result = specialization_test(induction_circuit_model(16, 10), task, n_eval=64,
                                 division=True)  # fmt: skip
    text = result.verdict.text
    assert "previous: 1 head (L0H0 in layer 0)" in text
    assert "induction: 1 head (L1H0 in layer 1)" in text
    assert "by token not divided (" in text
    assert "on single-head profiles, comparing L0H0 (layer 0) and L1H0 (layer 1))" in text
