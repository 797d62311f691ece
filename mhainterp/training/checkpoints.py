"""Checkpoints: the training state that lets an interrupted run resume.

:class:`Checkpoint` is what :func:`~mhainterp.training.train` keeps in ``run_dir/checkpoint.pt``
(every :data:`CHECKPOINT_SECONDS`, at a logged step); :func:`write_checkpoint` and
:func:`read_checkpoint` are the file format, shared with the stacked trainer
(:mod:`mhainterp.fast.stacked_checkpoint`). A resumed run ends equal to an uninterrupted one.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     write_checkpoint({"step": 7}, Path(folder, "checkpoint.pt"))
    ...     read_checkpoint(Path(folder, "checkpoint.pt"), "the run")
    {'step': 7}
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from mhainterp.config import TrainConfig
from mhainterp.errors import RunFolderError
from mhainterp.io import atomic_path, write_json
from mhainterp.model import HookedMHATransformer
from mhainterp.runs import CHECKPOINT_FILE
from mhainterp.tasks import Task
from mhainterp.training.identity import run_config, run_identity, saved_config_matches

__all__ = ["CHECKPOINT_SECONDS", "Checkpoint", "read_checkpoint", "write_checkpoint"]


CHECKPOINT_SECONDS = 30.0
"""How often :func:`~mhainterp.training.train` saves its state for a resume (at the first
logged step after this many seconds): at most this much training is lost to an interruption,
and a run shorter than this writes no checkpoint at all."""


class Checkpoint:
    """The training state of one run in ``run_dir/checkpoint.pt``: weights, optimizer moments,
    the data generator's state and the curve so far, with the run's config, so that a resumed
    run ends equal to an uninterrupted one. Written atomically; read back with
    ``torch.load(weights_only=True)`` (tensors, numbers and strings only). A checkpoint of
    another run is ignored and replaced; a damaged one is refused, naming the file.
    """

    def __init__(self, run_dir: Path, model: HookedMHATransformer, task: Task, config: TrainConfig):
        self.path = run_dir / CHECKPOINT_FILE
        self.run_dir, self.model, self.task, self.config = run_dir, model, task, config
        self.saved_at = time.monotonic()

    def begin(self) -> None:
        """Write ``config.json`` (unless it already records this run)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not saved_config_matches(self.run_dir, self.model, self.task, self.config):
            write_json(self.run_dir / "config.json", run_config(self.model, self.task, self.config))

    def restore(self, optimizer: Any, generator: torch.Generator) -> tuple[int, list[dict]]:
        """Load this run's checkpoint into the model, optimizer and generator; ``(step, rows)``
        to continue from, ``(0, [])`` when there is none (or it is another run's)."""
        if not self.path.is_file():
            return 0, []
        state = read_checkpoint(self.path, "the run")  # then loaded into the model where it is
        if state.get("config") != self._config():
            return 0, []  # another run's: this one starts over and replaces it
        self.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        return int(state["step"]), list(state["rows"])

    def save_if_due(
        self, step: int, optimizer: Any, generator: torch.Generator, rows: list
    ) -> None:
        """Save the state after ``step`` if :data:`CHECKPOINT_SECONDS` have passed."""
        if time.monotonic() - self.saved_at < CHECKPOINT_SECONDS:
            return
        state = {
            "format": 1,
            "config": self._config(),
            "step": step,
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": _to_cpu(optimizer.state_dict()),
            "generator": generator.get_state(),
            "rows": rows,
        }
        write_checkpoint(state, self.path)
        self.saved_at = time.monotonic()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _config(self) -> str:
        return run_identity(self.model, self.task, self.config)


def write_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Save a checkpoint's ``state`` (tensors, numbers, strings) to ``path`` atomically,
    through a Python file, so that a full disk is the OSError naming ``path`` (torch's own
    file writer says "unexpected pos")."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as file:
            torch.save(state, file)
    except OSError as error:  # a Python file's error names no file: name the checkpoint
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


def read_checkpoint(path: Path, what: str) -> dict[str, Any]:
    """The state :func:`write_checkpoint` saved at ``path``, on the CPU, tensors, numbers and
    strings only (``torch.load(weights_only=True)``).

    Args:
        path: the checkpoint file.
        what: what it trains, for the message when it is damaged: "the run", "its runs".

    Raises:
        RunFolderError: the file is damaged (truncated, not a torch file, foreign objects);
            one line naming it and saying to delete it to train ``what`` from the start.

    Example:
        >>> state = read_checkpoint(run_dir / "checkpoint.pt", "the run")  # doctest: +SKIP
    """
    try:
        # read on the CPU (where it was written); the caller copies it to its device
        return torch.load(path, map_location="cpu", weights_only=True)  # see above
    except Exception as error:  # truncated, not a torch file, foreign objects
        raise RunFolderError(
            f"{path} is damaged ({type(error).__name__}); delete it to train {what} from the start"
        ) from None


def _to_cpu(value: Any) -> Any:
    """An optimizer state dict with every tensor on the CPU (a checkpoint loads anywhere)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
