"""Draw figures in a second process while this one goes on computing.

``mhainterp analyze`` computes on one torch thread (the toolkit's default for small models),
so a two-core machine has a core to spare; drawing and saving its dozen figures (PNG + PDF,
matplotlib: single-threaded Python) took a third of its time. :class:`FigureQueue` hands each
figure to one worker process as soon as its table is ready and collects them at the end, so the
drawing overlaps the computing.

The worker is **forked** from this process when the first figure is queued: it inherits the
imported modules, matplotlib's settings and the registries as they are, so a figure drawn there
has the same bytes as one drawn here (``tests/test_figure_worker.py`` checks it). A figure's
inputs are pickled to it, except the objects given to :meth:`FigureQueue.keep` (a model, a
task), which it inherits by the fork. Torch runs there only in a job that computes its own
table (``analyze`` queues each similarity measure with its figure as one job), and only when
:meth:`FigureQueue.runs_torch`: on the CPU, where this process runs torch on one thread, and so
does the job. One thread never starts an OpenMP parallel region, which can hang in a forked
child; and the job's numbers have the same bits as here.

Figures are written atomically by :func:`~mhainterp.figures._common.save_figure`, so a worker
killed mid-figure leaves no half-written file. The worker leaves Ctrl-C and SIGTERM to this
process, which stops it, and dies with this process (a SIGKILLed ``analyze`` leaves no orphan
drawing).

Nothing is lost when the worker fails: a figure whose worker died is drawn again here, and a
figure that raised raises here, when the queue closes, with its file named. When the queue
closes, this process draws the figures the worker has not started yet, last first, while the
worker goes on with the first ones: the two meet in the middle instead of one waiting. Each
figure is drawn once: whoever starts it first claims it (a byte of memory shared with the
worker, set under a lock), and the other passes it by.

Without a second core, off Linux (Windows has no ``fork``; macOS' frameworks may not survive
one), with ``MHAINTERP_FIGURE_WORKER=0`` or with ``background=False``, every figure is drawn
here, at once, in order.

Example:
    >>> from mhainterp.figures.background import FigureQueue
    >>> with FigureQueue(background=False) as figures:
    ...     figures.draw(print, "drawn")
    drawn
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from mhainterp.runtime import available_cpus, leave_signals_to_parent
from mhainterp.validation import ParameterError

__all__ = ["FigureQueue", "background_figures"]

WORKER_ENV = "MHAINTERP_FIGURE_WORKER"
"""``0`` draws every figure in the calling process (``1``: in a worker even on one core)."""


def background_figures(background: bool | None = None) -> bool:
    """Whether figures go to a worker process: ``background`` when given, else
    ``$MHAINTERP_FIGURE_WORKER`` when set, else on Linux with a second core; never
    where ``fork`` is unavailable or in a daemonic process (a process pool's worker).

    Example:
        >>> background_figures(False)
        False
    """
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    if multiprocessing.current_process().daemon:  # a pool's worker may not have children
        return False
    if background is not None:
        return bool(background)
    setting = os.environ.get(WORKER_ENV, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    if setting:  # a typo must not silently mean "decide for me"
        raise ParameterError(
            f"{WORKER_ENV} is invalid: 0 (draw every figure in this process) or 1 (in a worker "
            f"process), or unset (a worker on Linux with two or more CPUs), got {setting!r}"
        )
    # Only Linux forks safely by default (macOS' system frameworks may not survive a fork)
    return sys.platform.startswith("linux") and len(available_cpus()) >= 2


@dataclass(frozen=True)
class Kept:
    """Stands for an object of :data:`_KEPT` in a queued figure's arguments: the worker receives
    this number and finds the object in its copy of the registry, made by the fork."""

    key: int


_KEPT: dict[int, Any] = {}
"""Objects handed to :meth:`FigureQueue.keep`, by key, until their queue closes."""
_KEYS = itertools.count()


def _kept(value: Any) -> Any:
    return _KEPT[value.key] if isinstance(value, Kept) else value


def _draw(function: Callable, args: tuple, kwargs: dict) -> None:
    """Draw one figure, in the worker or here (the figure object itself stays where it was
    drawn), with each :class:`Kept` argument replaced by its object."""
    function(*map(_kept, args), **{name: _kept(value) for name, value in kwargs.items()})


class _Claims:
    """Which queued figures a process has started: a byte each, in memory shared with the
    forked worker (anonymous: a killed process leaves nothing behind)."""

    SIZE = 1024
    """Figures this process can take over at the end; later ones are always the worker's."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("fork")
        self._taken = context.RawArray("b", self.SIZE)
        self._lock = context.Lock()

    def claim(self, index: int, *, here: bool) -> bool:
        """Claim figure ``index`` for this process (``here``) or the worker: False when the
        other has it. This process gives up after 5 s (a worker killed while claiming holds
        the lock forever; its figures are then drawn again here, as a dead worker's)."""
        if index >= self.SIZE:
            return not here
        if not self._lock.acquire(timeout=5.0 if here else None):
            return False
        try:
            if self._taken[index]:
                return False
            self._taken[index] = 1
            return True
        finally:
            self._lock.release()


def _draw_unless_taken(claims: Kept, index: int, function: Callable, args: tuple, kwargs: dict):
    """In the worker: draw queued figure ``index`` unless the queue's process has taken it."""
    if _kept(claims).claim(index, here=False):
        _draw(function, args, kwargs)


def _name_the_figure(error: Exception, function: Callable, args: tuple, kwargs: dict) -> None:
    """Add which figure raised ``error`` to its message (its path, where it has one)."""
    paths = [a for a in (*args, *kwargs.values()) if isinstance(a, (str, os.PathLike))]
    where = f" ({os.fspath(paths[-1])})" if paths else ""
    if hasattr(error, "add_note"):
        error.add_note(f"while drawing the figure {function.__name__}{where}")


class FigureQueue:
    """Figures drawn in one worker process, in the order queued; see the module docstring.

    Use it as a context manager: leaving it waits for every figure (also after an exception
    in the block, so no figure is left half-drawn) and raises the first figure's error.

    Args:
        background: Draw in a worker process (None: :func:`background_figures` decides).
    """

    def __init__(self, background: bool | None = None) -> None:
        self.background = background_figures(background)
        self._pool: ProcessPoolExecutor | None = None
        self._queued: list[tuple[Future, Callable, tuple, dict]] = []
        self._kept: list[int] = []
        self._claims: _Claims | None = None  # which figures someone has started
        self._shared_claims: Kept | None = None  # the same, as the worker receives it

    def runs_torch(self, device: Any) -> bool:
        """Whether a queued job may run torch on ``device`` in the worker: only on the CPU (a
        forked child cannot use CUDA) and only when this process runs torch on one thread.
        The worker inherits that one thread, which starts no OpenMP parallel region (a fork
        copies an OpenMP pool's bookkeeping but not its threads, and a child's parallel
        region can wait for them forever), and its numbers have the same bits."""
        import torch

        on_cpu = torch.device(device).type == "cpu"  # a forked child cannot start CUDA
        return self.background and on_cpu and torch.get_num_threads() == 1

    def keep(self, value: Any) -> Any:
        """``value`` as an argument of the figures queued from now on, handed to the worker by
        the fork instead of pickled (a model and its task: nothing copied, no tensor moved to
        shared memory). Only before the first :meth:`draw`: the worker is forked then.
        Without a worker, ``value`` itself."""
        if not self.background:
            return value
        if self._pool is not None:
            raise RuntimeError("FigureQueue.keep() must come before the first draw()")
        key = next(_KEYS)
        _KEPT[key] = value
        self._kept.append(key)
        return Kept(key)

    def draw(self, function: Callable, *args: Any, **kwargs: Any) -> None:
        """Draw ``function(*args, **kwargs)``: in the worker, or here and now.

        ``function`` must be a module-level function (the worker receives it by name) whose
        result is not needed; its arguments are pickled to the worker, but for those from
        :meth:`keep`. At the end this process may draw it instead (:meth:`wait`).
        """
        if not self.background:
            _draw(function, args, kwargs)
            return
        if self._pool is None:
            self._claims = _Claims()
            self._shared_claims = self.keep(self._claims)  # before the fork: shared with it
            gc.freeze()  # the worker's collections leave the inherited objects' pages shared
            self._pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("fork"),
                initializer=leave_signals_to_parent,  # dies with this process, no orphan
                initargs=(os.getpid(),),
            )
        index = len(self._queued)
        future = self._pool.submit(
            _draw_unless_taken, self._shared_claims, index, function, args, kwargs
        )
        self._queued.append((future, function, args, kwargs))

    def wait(self) -> None:
        """Wait for every queued figure; raise the first one's error. The figures the worker
        has not started are drawn here meanwhile, last first; a figure whose worker died is
        drawn here instead (with a warning), so none is lost."""
        queued, self._queued = self._queued, []
        errors: dict[int, Exception] = {}
        redrawn = 0
        try:
            drawn_here = self._draw_the_tail_here(queued, errors)
            for index, (future, function, args, kwargs) in enumerate(queued[:drawn_here]):
                try:
                    future.result()
                except BrokenProcessPool:
                    redrawn += 1
                    try:
                        _draw(function, args, kwargs)
                    except Exception as exc:  # the first is raised below
                        errors[index] = exc
                except Exception as exc:  # the first is raised below
                    errors[index] = exc
        except BaseException:
            self._abandon()  # Ctrl-C while waiting: stop the worker at once
            raise
        self._close()
        if redrawn:
            warnings.warn(
                f"the figure worker process died; {redrawn} figure(s) were drawn in this "
                f"process instead (set {WORKER_ENV}=0 to draw every figure here)",
                RuntimeWarning,
                stacklevel=2,
            )
        if errors:
            first = min(errors)
            _name_the_figure(errors[first], *queued[first][1:])
            raise errors[first]

    def _draw_the_tail_here(self, queued: list, errors: dict[int, Exception]) -> int:
        """Draw here, last first, each queued figure the worker has not started; stop at the
        first it has (it goes in order). Returns how many are left to the worker."""
        left = len(queued)
        while left and self._claims is not None and self._claims.claim(left - 1, here=True):
            left -= 1
            _, function, args, kwargs = queued[left]
            try:
                _draw(function, args, kwargs)
            except Exception as exc:  # the first in queue order is raised by wait()
                errors[left] = exc
        return left

    def _close(self, wait: bool = True) -> None:
        """Stop the worker and forget the kept objects."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None
            gc.unfreeze()
        self._claims = self._shared_claims = None
        for key in self._kept:
            _KEPT.pop(key, None)
        self._kept = []

    def __enter__(self) -> FigureQueue:
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, traceback: Any) -> None:
        if kind is None:
            self.wait()
        elif not issubclass(kind, Exception):  # Ctrl-C, exit: stop, draw nothing more
            self._abandon()
        else:
            # the block failed: finish what was queued, but its error is the one raised
            with contextlib.suppress(Exception):
                self.wait()

    def _abandon(self) -> None:
        """Drop the queued figures and stop the worker without waiting for its figures. A
        figure it was writing leaves no file, only its temp file (writes are atomic), which
        :func:`~mhainterp.io.remove_stale_temps` can remove once this returns: the worker is
        gone by then (SIGTERM ends it at once)."""
        self._queued = []
        processes = list(getattr(self._pool, "_processes", {}).values()) if self._pool else []
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=5.0)
        self._close(wait=False)
