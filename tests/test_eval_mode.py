"""eval_mode: evaluation inside the block, the caller's mode restored, no walk when not needed."""

import pytest
import torch

from mhainterp.eval_mode import eval_mode


def test_training_model_is_evaluated_and_restored_even_on_error():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    with pytest.raises(RuntimeError), eval_mode(model):
        assert not model.training and not model[1].training
        raise RuntimeError("inside")
    assert model.training and model[1].training


def test_model_already_in_eval_mode_is_not_walked(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2)).eval()

    def walk(*args):
        raise AssertionError("train()/eval() called on a model already in eval mode")

    monkeypatch.setattr(model, "train", walk)
    monkeypatch.setattr(model, "eval", walk)
    with eval_mode(model):
        assert not model.training
    assert not model.training
