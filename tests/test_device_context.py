"""Where the work runs: one order for "decide for me", a context variable set by the command,
and the environment written only in a sweep's worker processes (issue 41, item 2).

``meta`` tells the sources apart on a machine without a GPU: every machine has it, and no
source gives it unless a test put it there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import pytest
import torch

import mhainterp.sweep.executors as executors
from mhainterp.cli import main
from mhainterp.config import ModelConfig, SweepConfig, TrainConfig
from mhainterp.model.handbuilt import (
    handbuilt_model,
    induction_circuit_model,
    offset_head_model,
    selector_width_model,
    split_heads_model,
)
from mhainterp.runtime import (
    DEVICE_ENV,
    THREADS_ENV,
    device_context,
    resolve_device,
    threads_context,
    work_threads,
)
from mhainterp.sweep import plan_sweep
from mhainterp.validation import ParameterError

META, CPU = torch.device("meta"), torch.device("cpu")
DECIDED = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # what nothing else says


# ----------------------------------------------------------------------------- the order


def test_none_and_auto_are_one_spelling_decided_in_one_order(monkeypatch):
    """explicit argument > device_context > $MHAINTERP_DEVICE > CUDA when available > CPU."""
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert resolve_device(None) == resolve_device("auto") == resolve_device(" AUTO ") == DECIDED
    monkeypatch.setenv(DEVICE_ENV, "meta")  # the environment beats the machine's own choice
    assert resolve_device(None) == resolve_device("auto") == META
    with device_context("cpu"):  # the context beats the environment
        assert resolve_device(None) == resolve_device("auto") == CPU
        assert resolve_device("meta") == META  # an explicit argument beats the context
        assert resolve_device(torch.device("meta")) == META
    assert resolve_device(None) == META  # the environment again
    monkeypatch.setenv(DEVICE_ENV, "auto")  # says nothing: the machine decides
    assert resolve_device(None) == DECIDED


def test_a_bad_device_in_the_environment_says_where_it_came_from(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(ParameterError) as error:
        resolve_device(None)
    assert str(error.value) == (
        "device='tpu' (from $MHAINTERP_DEVICE) is invalid: one of auto|cpu|cuda|cuda:N|mps"
    )
    with device_context("cpu"):  # a context decides before the environment is read
        assert resolve_device(None) == CPU


def test_contexts_nest_and_reset_even_on_an_error(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    with device_context("meta"):
        with device_context("cpu"):
            assert resolve_device(None) == CPU
        assert resolve_device(None) == META  # the inner block's end restores the outer
        with device_context(None), device_context("auto"):  # decide for me: outer choice stays
            assert resolve_device(None) == META
        with pytest.raises(RuntimeError, match="inside"), device_context("cpu"):
            raise RuntimeError("inside")
        assert resolve_device(None) == META
    assert resolve_device(None) == CPU  # outside every block: the environment


def test_a_context_refuses_a_bad_device_before_the_block_runs():
    ran = []
    with (
        pytest.raises(ParameterError, match="device='tpu' is invalid: one of auto"),
        device_context("tpu"),
    ):
        ran.append(True)
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="no CUDA device"), device_context("cuda:0"):
            ran.append(True)
    assert ran == []


def test_threads_follow_the_same_order(monkeypatch):
    """explicit threads= > threads_context > $MHAINTERP_THREADS > 1."""
    monkeypatch.setenv(THREADS_ENV, "3")

    def inside(threads=None) -> int:
        with work_threads(threads):
            return torch.get_num_threads()

    assert inside() == 3
    with threads_context(2):
        assert inside() == 2
        assert inside(4) == 4
        with threads_context(None):
            assert inside() == 2
    monkeypatch.delenv(THREADS_ENV)
    assert inside() == 1
    with pytest.raises(ParameterError, match="threads=-1 is invalid"), threads_context(-1):
        pass


# ----------------------------------------------------------------------------- where it reaches


def test_model_config_decides_its_device_through_resolve_device(monkeypatch):
    """TransformerLens's own default (CUDA when available) ignored --device and the
    environment; None now decides as every other device= does. A name given stays as given."""
    monkeypatch.setenv(DEVICE_ENV, "meta")
    assert ModelConfig().device == "meta"
    with device_context("cpu"):
        assert ModelConfig().device == ModelConfig(device="auto").device == "cpu"
    assert ModelConfig(device="cpu").device == "cpu"
    assert ModelConfig(device=torch.device("meta")).device == "meta"
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert ModelConfig().device == "cpu"  # the suite's setting: as before on this machine


BUILDERS = {
    "handbuilt_model": lambda **kw: handbuilt_model(["previous", "uniform", "dead"], **kw),
    "split_heads_model": lambda **kw: split_heads_model([("all", None), ("query", [0])], **kw),
    "induction_circuit_model": lambda **kw: induction_circuit_model(**kw),
    "offset_head_model": lambda **kw: offset_head_model(2, **kw),
    "selector_width_model": lambda **kw: selector_width_model(**kw),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_hand_set_models_go_where_they_are_told(name, monkeypatch):
    build = BUILDERS[name]
    on_cpu = build(device="cpu")
    assert {p.device for p in on_cpu.parameters()} == {CPU} and on_cpu.cfg.device == "cpu"
    assert not on_cpu.training
    on_meta = build(device="meta")  # shapes only: the same shapes, no data
    assert {p.device for p in on_meta.parameters()} == {META} and on_meta.cfg.device == "meta"
    assert [p.shape for p in on_meta.parameters()] == [p.shape for p in on_cpu.parameters()]
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    with device_context("meta"):  # None decides, as everywhere
        assert build().cfg.device == "meta"
    assert all(torch.equal(a, b) for a, b in zip(build().parameters(), on_cpu.parameters()))


# ----------------------------------------------------------------------------- the environment


class _RecordingEnviron(MutableMapping):
    """``os.environ`` that remembers every name written or removed through it."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real, self.writes = real, []

    def __getitem__(self, name: str) -> str:
        return self.real[name]

    def __setitem__(self, name: str, value: str) -> None:
        self.writes.append(name)
        self.real[name] = value

    def __delitem__(self, name: str) -> None:
        self.writes.append(name)
        del self.real[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)

    def copy(self) -> dict[str, str]:
        return dict(self.real)


def test_commands_set_the_device_without_writing_the_environment(tmp_path, monkeypatch, capsys):
    """train and a sweep (its worker processes included: they write their own environment,
    not this one) with --device and --threads write none of the toolkit's variables into
    this process's environment (torch writes some of its own: not ours to judge)."""
    before = dict(os.environ)
    recording = _RecordingEnviron(os.environ)
    monkeypatch.setattr(os, "environ", recording)
    task = ["--task", "reverse", "--task-param", "seq_len=6", "--task-param", "d_vocab=4"]
    small = ["--d-model", "8", "--steps", "2", "--n-eval", "8", "--quiet"]
    where = ["--device", "cpu", "--threads", "1"]
    assert (
        main(["train", *task, "--n-heads", "2", *small, *where, "--out", str(tmp_path / "t")]) == 0
    )
    sweep = ["sweep", *task, "--n-heads", "1,2", "--seeds", "0", *small, *where]
    assert main([*sweep, "--executor", "batched", "--out", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    ours = [name for name in recording.writes if name.startswith("MHAINTERP_")]
    assert ours == []
    assert {k: v for k, v in recording.real.items() if k.startswith("MHAINTERP_")} == {
        k: v for k, v in before.items() if k.startswith("MHAINTERP_")
    }


def _report_environment(specs, progress=False, device=None, on_step=None):
    """Stands in for ``train_group`` in a pool worker: what the worker sees, one file a run."""
    seen = f"{os.environ.get(DEVICE_ENV)} {os.environ.get(THREADS_ENV)} {resolve_device(None)}"
    for spec in specs:
        Path(spec.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(spec.run_dir) / "seen.txt").write_text(seen)
    return {}


@pytest.mark.skipif(
    executors._mp_context().get_start_method() != "fork",
    reason="the stand-in reaches the workers by fork",
)
def test_pool_workers_start_with_the_planned_device_and_the_commands_threads(tmp_path, monkeypatch):
    """The parent's environment names no device and its context says meta: each worker's
    environment names the device the runs were planned for, and a context copied by fork does
    not outrank it."""
    monkeypatch.delenv(DEVICE_ENV)
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setattr(executors, "train_group", _report_environment)
    config = SweepConfig(
        task="reverse",
        task_params={"seq_len": 6, "d_vocab": 4},
        n_heads=[1, 2],
        seeds=[0],
        model={"d_model": 8},
        train=TrainConfig(steps=2, batch_size=8, warmup_steps=0, log_every=1, n_eval=8),
    )
    specs = plan_sweep(config, tmp_path, device="cpu")
    with device_context("meta"), threads_context(1):
        executors.run_batched(specs, progress=False, workers=2, chunk_size=1)
    seen = {(Path(s.run_dir) / "seen.txt").read_text() for s in specs}
    assert seen == {"cpu 1 cpu"}
    assert DEVICE_ENV not in os.environ and THREADS_ENV not in os.environ  # the parent's


# ----------------------------------------------------------------------------- threads


def test_the_explorers_threads_see_the_commands_device_and_threads(monkeypatch):
    """``mhainterp explore`` loads the model in one thread and serves in another; a new thread
    starts with an empty context, so each runs in the context it was made in."""
    pytest.importorskip("uvicorn")
    import urllib.request

    from mhainterp.explore.server import ExplorerLoader, ServerThread

    monkeypatch.setenv(DEVICE_ENV, "cpu")

    def seen() -> str:
        with work_threads():
            return f"{resolve_device(None)} {torch.get_num_threads()}"

    async def app(scope, receive, send):
        body = seen().encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    with device_context("meta"), threads_context(2):
        loader = ExplorerLoader(seen)
        server = ServerThread(app)
    assert loader.start().wait(30) and loader.error is None
    with server, urllib.request.urlopen(server.url, timeout=30) as response:
        served = response.read().decode()
    assert loader.explorer == served == "meta 2"
