"""What every analysis function takes as ``data`` (README, "Every analysis function is
f(model, data, ...)"): a wrong kind is the toolkit's one error type, naming what to pass."""

from __future__ import annotations

import pytest

import mhainterp
from mhainterp import ParameterError, build_model, get_task


@pytest.fixture(scope="module")
def model_and_tokens():
    task = get_task("reverse")
    return task, build_model(task, d_model=32, n_heads=2, seed=0), task.eval_batch(8).tokens


@pytest.mark.parametrize("function", ["head_importance", "division_of_labour"])
def test_tokens_where_targets_are_needed_are_refused_as_a_parameter_error(
    model_and_tokens, function
):
    _, model, tokens = model_and_tokens
    with pytest.raises(ParameterError, match="no targets.*pass the Task or a Batch"):
        getattr(mhainterp, function)(model, tokens)


def test_the_specialization_test_asks_for_the_task_as_a_parameter_error(model_and_tokens):
    task, model, tokens = model_and_tokens
    with pytest.raises(ParameterError, match="needs the Task itself"):
        mhainterp.specialization_test(model, tokens)
    with pytest.raises(ParameterError, match="needs the Task itself"):
        mhainterp.specialization_test(model, task.eval_batch(8))
