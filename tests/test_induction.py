"""Induction needs two layers: the block length varies, so no positional head solves the task.

Known answers: a hand-set two-layer circuit (previous-token head, then induction head) is exact;
every one-layer head that copies from a fixed offset is right only on the sequences whose block
fits its offset; trained two-layer models grow a previous-token head in layer 0 and an induction
head in layer 1.
"""

from __future__ import annotations

import pytest
import torch

from mhainterp import TrainConfig, build_model, get_task, train
from mhainterp.model.handbuilt import induction_circuit_model, offset_head_model
from mhainterp.specialization import specialization_test
from mhainterp.training import evaluate


def test_two_layer_induction_circuit_is_exact() -> None:
    task = get_task("induction", seq_len=16, d_vocab=10)
    assert evaluate(induction_circuit_model(16, 10), task, n_eval=512)["accuracy"] == 1.0


def test_no_fixed_offset_head_solves_induction() -> None:
    task = get_task("induction", seq_len=16, d_vocab=10)
    batch = task.sample(1024, torch.Generator().manual_seed(0))
    B = task.block_length_of(batch.tokens)
    # The share of scored positions whose block length is offset + 1: the most an offset head
    # can get right (block lengths 4..8 hold 3..7 scored positions each).
    scored = (B - 1).double()
    for offset in range(1, 16):
        accuracy = evaluate(offset_head_model(offset, 16, 10), batch)["accuracy"]
        best = float(scored[offset + 1 == B].sum() / scored.sum())
        assert accuracy == pytest.approx(best, abs=1e-9)
        assert accuracy < 0.3


def test_a_fixed_block_lets_one_offset_head_solve_it() -> None:
    # The old task (one block length): the answer sits at a fixed offset.
    fixed = get_task("induction", seq_len=16, d_vocab=10, min_block=8)
    assert evaluate(offset_head_model(7, 16, 10), fixed, n_eval=256)["accuracy"] == 1.0


def test_one_layer_induction_model_is_refused_by_the_task() -> None:
    assert get_task("induction").min_layers == 2


@pytest.mark.slow
def test_trained_two_layer_models_have_previous_in_layer0_and_induction_in_layer1() -> None:
    task = get_task("induction", seq_len=16, d_vocab=10)
    found = []
    for seed in range(3):
        model = build_model(task, d_model=64, n_heads=4, n_layers=2, seed=seed)
        run = train(model, task, TrainConfig(steps=2000, seed=seed), progress=False)
        assert run.eval["accuracy"] > 0.95
        heads = specialization_test(model, task).heads
        holds = dict(zip(heads["head_label"], heads["holds"]))
        layer0 = {
            label
            for label, roles in holds.items()
            if label.startswith("L0") and "previous" in str(roles).split(",")
        }
        layer1 = {
            label
            for label, roles in holds.items()
            if label.startswith("L1") and "induction" in str(roles).split(",")
        }
        found.append(bool(layer0) and bool(layer1))
    assert sum(found) >= 2, found
