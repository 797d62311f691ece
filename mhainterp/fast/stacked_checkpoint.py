"""The checkpoint of one :func:`~mhainterp.fast.stacked.train_many` group, so that an
interrupted batched sweep resumes where it stopped, as :func:`~mhainterp.training.train` does.

A group trains several runs at once, so its state is one file beside their run folders,
``.batched-<digest>.pt`` (the digest names the group's runs): the stacked weights, both AdamW
moments, each model's data generator state, the curves so far and the step, with each run's
config. It is saved at a logged step once :data:`~mhainterp.training.CHECKPOINT_SECONDS` have
passed, atomically, and removed once the group's run folders are written. A checkpoint of
another group (other runs, or a config that changed) is ignored and replaced; a damaged one
is refused, naming the file. A resumed group ends byte-equal to an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import torch

from mhainterp.training import checkpoints, read_checkpoint, run_identity, write_checkpoint

__all__ = ["GroupCheckpoint", "GROUP_CHECKPOINT_GLOB"]

GROUP_CHECKPOINT_GLOB = ".batched-*.pt"
"""The names group checkpoints take in a sweep's ``runs/`` folder."""


class GroupCheckpoint:
    """Save and restore one group's training state (see the module docstring); inert when a
    model of the group has no run folder (nothing to resume into)."""

    def __init__(self, group: Any) -> None:  # a fast.stacked group (it imports this module)
        self.group = group
        dirs = [group.run_dirs[i] for i in group.index]
        self.path: Path | None = None
        if dirs and all(d is not None for d in dirs):
            names = "\n".join(sorted(str(Path(d).resolve()) for d in dirs))
            digest = hashlib.sha256(names.encode()).hexdigest()[:16]
            self.path = Path(dirs[0]).resolve().parent / f".batched-{digest}.pt"
        self.saved_at = time.monotonic()

    def _identity(self) -> list[str]:
        g = self.group
        return [run_identity(g.models[i], g.task, g.configs[i]) for i in g.index]

    def restore(self) -> int:
        """Load the saved state into the group; the step to continue from (0: none, or
        another group's)."""
        if self.path is None or not self.path.is_file():
            return 0
        state = read_checkpoint(self.path, "its runs")  # on the CPU, copied to the device below
        g = self.group
        if state.get("index") != g.index or state.get("configs") != self._identity():
            return 0  # another group's: this one starts over and replaces it
        device = g.stack.flat.device
        with torch.no_grad():
            g.stack.flat.copy_(state["flat"].to(device))
            g.exp_avg.copy_(state["exp_avg"].to(device))
            g.exp_avg_sq.copy_(state["exp_avg_sq"].to(device))
            g.last_good.copy_(g.stack.flat)
        for generator, saved in zip(g.generators, state["generators"], strict=True):
            generator.set_state(saved)
        g.rows = {int(i): list(rows) for i, rows in state["rows"].items()}
        g.n_steps = int(state["step"])
        return int(state["step"])

    def save_if_due(self, step: int) -> None:
        """Save the state after ``step`` (a logged step: the interval sums are empty) if
        :data:`~mhainterp.training.CHECKPOINT_SECONDS` have passed and no model of the group has
        left it."""
        g = self.group
        if self.path is None or g.messages:
            return
        if time.monotonic() - self.saved_at < checkpoints.CHECKPOINT_SECONDS:
            return
        state: dict[str, Any] = {
            "format": 1,
            "index": list(g.index),
            "configs": self._identity(),
            "step": step,
            "flat": g.stack.flat.detach().cpu(),
            "exp_avg": g.exp_avg.cpu(),
            "exp_avg_sq": g.exp_avg_sq.cpu(),
            "generators": [generator.get_state() for generator in g.generators],
            "rows": {int(i): rows for i, rows in g.rows.items()},
        }
        write_checkpoint(state, self.path)
        self.saved_at = time.monotonic()

    def remove(self) -> None:
        """Forget the state (the group's run folders are written)."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
