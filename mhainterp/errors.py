"""The toolkit's public error types, in one place that imports nothing heavy.

A caller (the CLI among them) can catch any of them without loading torch or pandas. The one
exception is :class:`~mhainterp.validation.ParameterError`, the bad-argument error, which lives
with the validator that raises it (:mod:`mhainterp.validation`, also light).

- :class:`TrainingDivergedError`: training's loss became NaN or infinite;
  :class:`BatchDivergedError`: some models of a stacked group diverged, the others finished;
- :class:`RunFolderError`: a saved file is damaged, or two files disagree;
  :class:`OutdatedResultError`: a saved result lacks what the current version writes;
- :class:`RunLockedError`: another process holds a run's lock;
- :class:`NotEnoughMemoryError`: the work asked for cannot fit in the memory this process may use;
- :class:`InvalidTaskError`: a task breaks the Task contract;
  :class:`TaskModuleError`: a task module failed to import;
- :class:`BadRequestError`: a request the explorer cannot answer;
  :class:`PortInUseError`: the explorer's port is taken.

Example:
    >>> issubclass(InvalidTaskError, ValueError), issubclass(BatchDivergedError, RuntimeError)
    (True, True)
"""

from __future__ import annotations

from typing import Any

from mhainterp.validation import ParameterError

__all__ = [
    "BadRequestError",
    "BatchDivergedError",
    "InvalidTaskError",
    "NotEnoughMemoryError",
    "OutdatedResultError",
    "PortInUseError",
    "RunFolderError",
    "RunLockedError",
    "TaskModuleError",
    "TrainingDivergedError",
]


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite; the model holds the last good weights."""


class BatchDivergedError(TrainingDivergedError):
    """Some models of a :func:`~mhainterp.fast.stacked.train_many` group diverged; the others
    finished.

    Attributes:
        results: One entry per model, in input order: its :class:`~mhainterp.training.Run`, or
            None for a model that diverged (its run folder, if any, holds the last good weights with
            ``eval.json`` status "diverged", exactly as :func:`~mhainterp.training.train`
            leaves it).
        messages: Input index -> the divergence message :func:`~mhainterp.training.train` would
            have raised.
    """

    # Any, not Run: errors.py sits below training and imports nothing of it, not even for
    # an annotation (tests/test_architecture.py)
    def __init__(self, results: list[Any], messages: dict[int, str]) -> None:
        self.results = results
        self.messages = messages
        lines = [f"model {i}: {message}" for i, message in sorted(messages.items())]
        super().__init__(f"{len(messages)} of {len(results)} models diverged:\n" + "\n".join(lines))


class RunFolderError(ValueError):
    """A saved file is damaged, or two files disagree (the message names them)."""


class OutdatedResultError(RunFolderError):
    """A saved analysis result lacks a table or column that the current version writes: an
    older mhainterp saved it. Analysis results are recomputed from the weights, so the readers
    that reuse saved results treat it as not saved; the message names the file and the command
    that rewrites it (:func:`mhainterp.runs.read_result_table`)."""


class RunLockedError(RuntimeError):
    """Another process holds the lock (see :func:`mhainterp.io.run_lock`)."""


class NotEnoughMemoryError(MemoryError, ValueError):
    """The work asked for needs more memory than this process may use (a ``ValueError`` too:
    the sizes asked for are what must change)."""


class InvalidTaskError(ParameterError):
    """A task breaks the Task contract; the message names the task, the member and the fault."""


class TaskModuleError(ValueError):
    """A task module (a ``--task-module`` file or module, an entry point) failed to import; the
    message names it and what it raised."""


class BadRequestError(ValueError):
    """A request the explorer cannot answer (unknown head, method, run or action); the server
    answers it with HTTP 400, the notebook view shows the message."""


class PortInUseError(OSError):
    """The explorer's port is taken; the message suggests ``--port``."""
