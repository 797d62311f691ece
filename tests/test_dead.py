"""Dead by function: quiet AND costing nothing when removed, alone and with the other quiet
heads; never dead and needed together; one vocabulary ("backed up", never "redundant")."""

from __future__ import annotations

import pandas as pd
import pytest

from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.specialization import SpecializationSettings, label_stability, specialization_test
from mhainterp.specialization.needed.dead import candidates, dead_heads
from mhainterp.tasks import get_task


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=16, d_vocab=10)


def test_a_low_norm_needed_head_is_needed_not_dead(task):
    # Its write is 0.1% of the residual stream (weights tiny) but the readout's argmax follows
    # it: removing it costs 79% accuracy. The old rule (norm alone) called it dead AND needed.
    model = handbuilt_model(["previous", "dead"], d_head=18, copy_weights=[0.002, 1.0])
    result = specialization_test(model, task, n_eval=64, n_permutations=50)
    heads = result.heads.set_index("head_label")
    assert heads.loc["L0H0", "output_ratio"] < SpecializationSettings().dead_tol  # quiet ...
    assert heads.loc["L0H0", "total_damage"] == pytest.approx(0.789, abs=0.01)
    assert (heads.loc["L0H0", "label"], bool(heads.loc["L0H0", "dead"])) == ("previous", False)
    assert bool(heads.loc["L0H0", "needed"])
    assert (heads.loc["L0H1", "label"], bool(heads.loc["L0H1", "dead"])) == ("dead", True)
    # Its finding says only that (not "looks at ...; serves no subset shown; dead"), and it
    # holds no relation although its attention, with no weights, is exactly uniform.
    assert (heads.loc["L0H1", "finding"], heads.loc["L0H1", "holds"]) == ("dead", "")
    assert not (result.heads["dead"].astype(bool) & result.heads["needed"].astype(bool)).any()
    assert result.quiet["heads"].tolist() == ["L0H1"]  # only the costless quiet head
    assert label_stability(result)["n_untested"].sum() == 0  # every variant's set was removed


def test_quiet_heads_that_back_each_other_up_are_not_dead(task):
    # Two quiet copies of one previous head: either alone can go, both together cost.
    model = handbuilt_model(
        ["previous", "previous", "dead"], d_head=18, copy_weights=[0.002, 0.002, 1.0]
    )
    result = specialization_test(model, task, n_eval=64, n_permutations=50)
    heads = result.heads.set_index("head_label")
    assert heads["dead"].astype(bool).tolist() == [False, False, True]
    assert heads["needed"].astype(bool).tolist() == [False, False, False]
    cost = result.quiet.set_index("heads")["accuracy_drop"]
    assert cost["L0H0,L0H1,L0H2"] > 0.5  # removing the candidates together costs ...
    assert cost["L0H0,L0H1"] == pytest.approx(cost["L0H0,L0H1,L0H2"])  # ... not L0H2's part
    assert cost["L0H1,L0H2"] == pytest.approx(0.0)
    assert heads["label"].tolist() == ["previous", "previous", "dead"]


def test_copies_are_backed_up_in_one_vocabulary(task):
    result = specialization_test(
        handbuilt_model(["previous", "previous"], d_head=18), task, n_eval=64, n_permutations=50
    )
    assert result.heads["label"].tolist() == ["backed up", "backed up"]
    assert result.heads["backed_up"].astype(bool).all()
    assert "redundant" not in result.verdict.text


def test_dead_heads_rule_from_saved_evidence():
    settings = SpecializationSettings()
    ratio = {"L0H0": 0.001, "L0H1": 0.001, "L0H2": 0.5}
    damage = {"L0H0": 0.5, "L0H1": 0.0, "L0H2": 0.0}
    assert candidates(ratio, damage, settings) == ["L0H1"]
    costless = pd.DataFrame({"heads": ["L0H1"], "loss_increase": [0.0], "accuracy_drop": [0.0]})
    costly = costless.assign(loss_increase=[0.2])
    assert dead_heads(ratio, damage, costless, settings) == ({"L0H1"}, 0)
    assert dead_heads(ratio, damage, costly, settings) == (set(), 0)
    assert dead_heads(ratio, damage, costless.iloc[:0], settings) == ({"L0H1"}, 1)  # untested
    # Two candidates that back each other up: the pair costs, each alone-with-the-other not.
    ratio, damage = {"L0H0": 0.001, "L0H1": 0.001}, {"L0H0": 0.0, "L0H1": 0.0}
    pair = pd.DataFrame(
        {
            "heads": ["L0H0,L0H1", "L0H0", "L0H1"],
            "loss_increase": [0.3, 0.0, 0.0],
            "accuracy_drop": [0.5, 0.0, 0.0],
        }
    )
    assert dead_heads(ratio, damage, pair, settings) == (set(), 0)
