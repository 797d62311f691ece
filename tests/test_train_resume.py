"""An interrupted train() resumes from its checkpoint to the same files as an uninterrupted run
(issue 33: "Interrupting train ... loses all progress although the message says resume")."""

from __future__ import annotations

import pytest
import torch

from mhainterp import TrainConfig, build_model, get_task, train
from mhainterp.errors import RunFolderError
from mhainterp.runs import CHECKPOINT_FILE, run_status
from mhainterp.tasks.builtin import ReverseTask
from mhainterp.training import checkpoints

RUN_FILES = ("config.json", "model.safetensors", "metrics.csv", "eval.json")
CONFIG = TrainConfig(steps=40, batch_size=16, n_eval=32, log_every=5, seed=3)


class InterruptedReverse(ReverseTask):
    """Reverse, with a Ctrl-C before the training batch number ``stop_at``."""

    stop_at: int | None = None
    drawn = 0

    def sample(self, n, generator=None):
        if n == CONFIG.batch_size:
            InterruptedReverse.drawn += 1
            if InterruptedReverse.drawn == self.stop_at:
                raise KeyboardInterrupt
        return super().sample(n, generator)


def _task(stop_at=None):
    InterruptedReverse.stop_at, InterruptedReverse.drawn = stop_at, 0
    return InterruptedReverse(seq_len=6, d_vocab=4)


def _train(task, run_dir, **kwargs):
    model = build_model(task, d_model=8, n_heads=2, seed=1, device="cpu")
    return train(model, task, CONFIG, run_dir=run_dir, progress=False, **kwargs)


@pytest.fixture(autouse=True)
def checkpoint_at_every_logged_step(monkeypatch):
    monkeypatch.setattr(checkpoints, "CHECKPOINT_SECONDS", 0.0)


def test_an_interrupted_run_resumes_to_the_uninterrupted_files(tmp_path):
    _train(_task(), tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        _train(_task(stop_at=23), tmp_path / "cut")  # after the checkpoint of step 20
    assert run_status(tmp_path / "cut") == "unfinished"
    state = torch.load(tmp_path / "cut" / CHECKPOINT_FILE, weights_only=True)
    assert state["step"] == 20 and len(state["rows"]) == 4
    task = _task()
    _train(task, tmp_path / "cut")
    assert InterruptedReverse.drawn == 20  # resumed: only the last 20 batches were drawn
    for name in RUN_FILES:
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert not (tmp_path / "cut" / CHECKPOINT_FILE).exists()  # finished: nothing to resume


def test_resume_false_starts_over_and_another_runs_checkpoint_is_ignored(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _train(_task(stop_at=23), tmp_path / "cut")
    task = _task()
    _train(task, tmp_path / "cut", resume=False)
    assert InterruptedReverse.drawn == 40
    with pytest.raises(KeyboardInterrupt):
        _train(_task(stop_at=23), tmp_path / "other")
    other = get_task("reverse", seq_len=6, d_vocab=4)  # another task: not this checkpoint's run
    model = build_model(other, d_model=8, n_heads=2, seed=1, device="cpu")
    run = train(model, other, CONFIG, run_dir=tmp_path / "other", progress=False)
    assert len(run.metrics) == 8  # trained from step 0


def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _train(_task(stop_at=23), tmp_path / "cut")
    path = tmp_path / "cut" / CHECKPOINT_FILE
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(RunFolderError, match=f"{path} is damaged .*delete it"):
        _train(_task(), tmp_path / "cut")


def test_a_full_disk_at_a_checkpoint_is_an_os_error_naming_the_checkpoint(tmp_path, monkeypatch):
    """torch's own file writer reports a full disk as "unexpected pos"; through a Python file
    it is the ENOSPC the CLI turns into "disk full: ... resume", naming the checkpoint."""
    written = []

    def disk_full(state, file):
        file.write(b"\0" * 8)
        written.append(file.name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints.torch, "save", disk_full)
    with pytest.raises(OSError) as raised:
        _train(_task(), tmp_path / "run")
    assert raised.value.errno == 28
    assert raised.value.filename == str(tmp_path / "run" / CHECKPOINT_FILE)
    assert written and not (tmp_path / "run" / CHECKPOINT_FILE).exists()
    assert list((tmp_path / "run").glob("*.tmp")) == []  # the half-written file removed
