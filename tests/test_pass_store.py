"""A division given an earlier division's passes reuses every engine row it holds, and its
tables are the ones a fresh division gives (the rows depend on the model, the sequences, the
method and the head set only, never on the gates that chose to run them)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.specialization import division_of_labour
from mhainterp.specialization.whom.pass_store import PassStore
from mhainterp.tasks import get_task


@pytest.fixture(scope="module")
def model_and_task():
    task = get_task("previous_token", seq_len=12, d_vocab=8)
    return handbuilt_model(["previous", "uniform", "previous"], d_head=18), task


def _tables(result):
    return [result.index, result.heads, result.profiles, result.basis_profiles]


def test_the_same_division_again_runs_nothing_and_gives_the_same_tables(model_and_task):
    model, task = model_and_task
    first = division_of_labour(model, task, n_eval=64, n_bootstrap=20)
    ran = first.passes.n_run
    again = division_of_labour(model, task, n_eval=64, n_bootstrap=20, passes=first.passes)
    assert ran > 0 and again.passes is first.passes and first.passes.n_run == ran
    for a, b in zip(_tables(first), _tables(again), strict=True):
        pd.testing.assert_frame_equal(a, b)
    assert again.settings == first.settings


def test_a_moved_gate_with_the_passes_equals_a_fresh_division_under_it(model_and_task):
    model, task = model_and_task
    base = division_of_labour(model, task, n_eval=64, n_bootstrap=20)
    moved = division_of_labour(
        model, task, n_eval=64, n_bootstrap=20, min_damage=0.5, passes=base.passes
    )
    fresh = division_of_labour(model, task, n_eval=64, n_bootstrap=20, min_damage=0.5)
    for a, b in zip(_tables(moved), _tables(fresh), strict=True):
        pd.testing.assert_frame_equal(a, b)
    assert moved.index["call"].tolist() == fresh.index["call"].tolist()
    # the moved gate left some profile undefined: the rows it reads were all run before
    assert moved.passes.n_run == base.passes.n_run


def test_the_store_keys_rows_by_model_and_sequences():
    """Another batch of the same model, or another model on the same batch, misses."""
    task = get_task("previous_token", seq_len=12, d_vocab=8)
    one = handbuilt_model(["previous", "uniform"], d_head=18)
    two = handbuilt_model(["uniform", "previous"], d_head=18)
    store = PassStore()
    calls = []

    def engine(sets):
        calls.append(len(sets))
        return torch.zeros(len(sets), 3), torch.ones(len(sets), 3), "result"

    b64, b32 = task.eval_batch(64), task.eval_batch(32)
    store.run(one, b64, [[(0, 0)]], "mean", engine)
    store.run(one, b64, [[(0, 0)]], "mean", engine)  # kept
    store.run(one, b32, [[(0, 0)]], "mean", engine)  # other sequences
    store.run(two, b64, [[(0, 0)]], "mean", engine)  # another model
    store.run(one, b64, [[(0, 0)]], "zero", engine)  # another method
    assert calls == [1, 1, 1, 1] and store.n_run == 4


def test_a_refused_noisy_copy_is_checked_again_with_its_new_weights(model_and_task, monkeypatch):
    """The null's copy is one object reused at half the noise when its accuracy moves too far:
    each attempt's check must see that attempt's weights, never a row kept from the last."""
    from mhainterp.protocol import head_matrix, set_head_matrix
    from mhainterp.specialization.whom import division

    model, task = model_and_task
    real = division.noisy_copy

    def broken_above_half(original, noise, generator, twin=None):
        copy = real(original, noise, generator, twin)
        if noise > 0.5:  # writes nothing: its accuracy falls far
            for layer in range(original.cfg.n_layers):
                w_o = head_matrix(copy, layer, "W_O")
                set_head_matrix(copy, layer, "W_O", torch.zeros_like(w_o))
        return copy

    monkeypatch.setattr(division, "noisy_copy", broken_above_half)
    result = division_of_labour(model, task, n_eval=64, n_bootstrap=20, noise=0.9)
    assert result.settings["noise_used"] == pytest.approx(0.45)


def test_passes_that_are_not_a_store_are_refused_in_one_line(model_and_task):
    from mhainterp.validation import ParameterError

    model, task = model_and_task
    with pytest.raises(ParameterError, match="passes.*result.passes"):
        division_of_labour(model, task, n_eval=64, passes={"rows": {}})
