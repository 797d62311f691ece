"""Shared test settings and fixtures.

The models under test are tiny: on a 2-core machine torch's default of 2 threads makes their
small matmuls several times slower (thread hand-off dominates), so tests run single-threaded.

``tiny_sweep`` is the one small trained sweep that the folder, reliability and report-kill
tests read (trained once per session): copy it (``shutil.copytree``) before writing into it.
"""

import os
import signal
import time
from pathlib import Path

# `auto` means the CPU in the suite even on a machine with a GPU, so its exact CPU tables stay
# exact; the tests marked `cuda` ask for the GPU by name (`make test-gpu`). Set
# MHAINTERP_DEVICE=cuda to run the whole suite on the GPU instead.
os.environ.setdefault("MHAINTERP_DEVICE", "cpu")

import torch

from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.sweep import run_sweep

torch.set_num_threads(1)

# A suite started in the background by a non-interactive shell (`make test-all &`, nohup)
# inherits SIGINT ignored, and so do the xdist workers and every command a test starts: the
# Ctrl-C tests then fail (a 100,000-step training ran to its end). They test how mhainterp
# answers Ctrl-C, so they get Python's own handler whatever started the suite.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ----- a user's own task, in a file of its own (for the plugin tests) ---------------------------
import pytest  # noqa: E402

USER_TASK_SOURCE = '''
"""A user's task, defined outside mhainterp: copy the token two positions back."""
import torch
from mhainterp.tasks import Task, register_task


class TwoBackTask(Task):
    """Copy the token two back (the extra class d_vocab for the first two positions)."""

    name = "two_back"
    causal = True

    @property
    def d_vocab_out(self):
        return self.d_vocab + 1

    def compute_targets(self, tokens, padding_mask):
        targets = torch.full_like(tokens, self.d_vocab)
        targets[:, 2:] = tokens[:, :-2]
        return targets, padding_mask

    def compute_relations(self, tokens, padding_mask):
        n, T = tokens.shape
        template = torch.zeros(n, T, T)
        query = torch.arange(2, T)
        template[:, query, query - 2] = 1.0
        return {"two_back": template}


register_task("two_back", TwoBackTask)
'''


@pytest.fixture
def user_task_file(tmp_path):
    """``tmp/user_tasks/two_back.py``, registering ``two_back``; unregistered afterwards."""
    from mhainterp.tasks import list_tasks, plugins, unregister_task

    path = tmp_path / "user_tasks" / "two_back.py"
    path.parent.mkdir()
    path.write_text(USER_TASK_SOURCE)
    yield path
    if "two_back" in list_tasks():
        unregister_task("two_back")
    plugins._loaded.clear()


@pytest.fixture
def user_task_source() -> str:
    """The source of :func:`user_task_file` (a module that defines and registers two_back)."""
    return USER_TASK_SOURCE


# ----- one small trained sweep, shared (read only) -----------------------------------------------
TINY_SWEEP = SweepConfig(
    task="reverse",
    task_params={"seq_len": 6, "d_vocab": 4},
    n_heads=[1, 2],
    seeds=[0, 1],
    model={"d_model": 8},
    train=TrainConfig(steps=12, batch_size=8, warmup_steps=2, log_every=4, n_eval=32),
)
"""Two head counts x two seeds of reverse, 12 steps: the runs ``h1_seed0 .. h2_seed1``."""


@pytest.fixture(scope="session")
def _tiny_sweep_timed(tmp_path_factory) -> tuple[Path, float]:
    out = tmp_path_factory.mktemp("tiny_sweep") / "rev"  # its parent folder is a study
    start = time.perf_counter()
    run_sweep(TINY_SWEEP, out, executor="local", progress=False)
    return out, time.perf_counter() - start


@pytest.fixture(scope="session")
def tiny_sweep(_tiny_sweep_timed) -> Path:
    """The sweep folder of :data:`TINY_SWEEP`, trained once (read only: copy it to write)."""
    return _tiny_sweep_timed[0]


@pytest.fixture(scope="session")
def tiny_sweep_seconds(_tiny_sweep_timed) -> float:
    """How long training :data:`TINY_SWEEP` took here (where a kill can land)."""
    return _tiny_sweep_timed[1]


# ----- tests that need a GPU ---------------------------------------------------------------------
def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip where torch sees no CUDA device (CI has none);
    ``make test-gpu`` runs just them."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
