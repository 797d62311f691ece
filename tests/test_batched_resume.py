"""An interrupted group of :func:`train_many` (a batched sweep's unit of work) resumes from its
checkpoint to the files an uninterrupted group writes (issue 33 item 7: interrupting a batched
sweep lost all its progress although the message says "resume")."""

from __future__ import annotations

import pytest

from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.errors import RunFolderError
from mhainterp.fast.stacked import train_many
from mhainterp.fast.stacked_checkpoint import GROUP_CHECKPOINT_GLOB
from mhainterp.sweep import run_sweep
from mhainterp.tasks import get_task
from mhainterp.training import build_model, checkpoints

RUN_FILES = ("config.json", "model.safetensors", "metrics.csv", "eval.json")
STEPS = 40


@pytest.fixture(autouse=True)
def checkpoint_at_every_logged_step(monkeypatch):
    monkeypatch.setattr(checkpoints, "CHECKPOINT_SECONDS", 0.0)


def _group(folder, stop_after=None):
    """Three runs (h = 1, 2 and seed 0, 1) trained as one group; Ctrl-C after ``stop_after``
    steps. Returns the steps the call trained."""
    task = get_task("reverse", seq_len=6, d_vocab=4)
    specs = [(1, 0), (2, 0), (2, 1)]
    models = [build_model(task, d_model=8, n_heads=h, seed=s, device="cpu") for h, s in specs]
    configs = [TrainConfig(steps=STEPS, batch_size=16, n_eval=32, log_every=5, seed=s)
               for _, s in specs]  # fmt: skip
    dirs = [folder / f"h{h}_seed{s}" for h, s in specs]
    trained = []

    def step(_n_models):
        trained.append(1)
        if stop_after is not None and len(trained) == stop_after:
            raise KeyboardInterrupt

    train_many(models, task, configs, run_dirs=dirs, progress=False, on_step=step)
    return len(trained)


def test_an_interrupted_group_resumes_to_the_uninterrupted_files(tmp_path):
    assert _group(tmp_path / "whole") == STEPS
    with pytest.raises(KeyboardInterrupt):
        _group(tmp_path / "cut", stop_after=23)  # after the checkpoint of step 20
    assert len(list((tmp_path / "cut").glob(GROUP_CHECKPOINT_GLOB))) == 1
    assert not list((tmp_path / "cut").rglob("eval.json"))  # nothing finished yet
    assert _group(tmp_path / "cut") == STEPS - 20  # resumed: only the last 20 steps
    for run in ("h1_seed0", "h2_seed0", "h2_seed1"):
        for name in RUN_FILES:
            cut, whole = tmp_path / "cut" / run / name, tmp_path / "whole" / run / name
            assert cut.read_bytes() == whole.read_bytes(), (run, name)
    assert not list((tmp_path / "cut").glob(GROUP_CHECKPOINT_GLOB))  # done: nothing to resume


def test_another_groups_checkpoint_is_ignored_and_a_damaged_one_refused(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _group(tmp_path / "cut", stop_after=12)
    (saved,) = (tmp_path / "cut").glob(GROUP_CHECKPOINT_GLOB)
    saved.write_bytes(b"not a checkpoint")
    with pytest.raises(RunFolderError, match=r"\.batched-.*\.pt is damaged.*delete it"):
        _group(tmp_path / "cut")
    saved.unlink()
    assert _group(tmp_path / "cut") == STEPS  # no checkpoint: from the start


def test_a_finished_sweep_leaves_no_group_checkpoint(tmp_path):
    out = tmp_path / "sweep"
    stale = out / "runs" / ".batched-0123456789abcdef.pt"  # an interrupted group of other runs
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x")
    config = SweepConfig(
        task="reverse", task_params={"seq_len": 6, "d_vocab": 4}, model={"d_model": 8},
        n_heads=[1, 2], seeds=[0], train=TrainConfig(steps=10, batch_size=8, n_eval=16),
    )  # fmt: skip
    run_sweep(config, out, executor="local", progress=False)
    assert not list((out / "runs").glob(GROUP_CHECKPOINT_GLOB))
