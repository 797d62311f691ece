"""eval_mode: evaluation inside the block, the caller's mode restored, no walk when not needed."""

import pytest
import torch

from mhainterp.runtime import eval_mode


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


def test_resolve_device_names_what_exists():
    import torch

    from mhainterp.runtime import resolve_device
    from mhainterp.validation import ParameterError

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    for bad in ("gpu", "cuda:x", "", 3):
        with pytest.raises(ParameterError, match="is invalid: one of auto"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="no CUDA device.*--device cpu"):
            resolve_device("cuda:0")
        assert resolve_device("auto") == torch.device("cpu")


def test_auto_reads_the_environment_first(monkeypatch):
    import torch

    from mhainterp.runtime import DEVICE_ENV, resolve_device

    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")


def test_runtime_and_io_import_neither_torch_nor_pandas():
    """The CLI's --help imports them; torch and pandas load only when a command needs them."""
    import subprocess
    import sys

    code = (
        "import sys, mhainterp.runtime, mhainterp.io; "
        "print('torch' in sys.modules, 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
