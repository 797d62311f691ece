"""Draw figures in a second process while this one goes on computing.

``mhainterp analyze`` computes on one torch thread (the toolkit's default for small models),
so a two-core machine has a core to spare; drawing and saving its dozen figures (PNG + PDF,
matplotlib: single-threaded Python) took a third of its time. :class:`FigureQueue` hands each
figure to one worker process as soon as its table is ready and collects them at the end, so the
drawing overlaps the computing.

The worker is **forked** from this process when the first figure is queued: it inherits the
imported modules, matplotlib's settings and the registries as they are, so a figure drawn there
has the same bytes as one drawn here (``tests/test_figure_worker.py`` checks it). It runs no
torch: a figure's inputs are tables. Figures are written atomically by
:func:`~mhainterp.figures._common.save_figure`, so a worker killed mid-figure leaves no
half-written file. The worker leaves Ctrl-C and SIGTERM to this process, which stops it, and
dies with this process (a SIGKILLed ``analyze`` leaves no orphan drawing).

Nothing is lost when the worker fails: a figure whose worker died is drawn again here, and a
figure that raised raises here, when the queue closes, with its file named. Without a second
core, off Linux (Windows has no ``fork``; macOS' frameworks may not survive one), with
``MHAINTERP_FIGURE_WORKER=0`` or with ``background=False``, every figure is drawn here, at
once, in order.

Example:
    >>> from mhainterp.figures.background import FigureQueue
    >>> with FigureQueue(background=False) as figures:
    ...     figures.draw(print, "drawn")
    drawn
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
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


def _draw(function: Callable, args: tuple, kwargs: dict) -> None:
    """In the worker: draw one figure (the figure object itself stays there)."""
    function(*args, **kwargs)


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

    def draw(self, function: Callable, *args: Any, **kwargs: Any) -> None:
        """Draw ``function(*args, **kwargs)``: in the worker, or here and now.

        ``function`` must be a module-level function (the worker receives it by name) whose
        result is not needed; its arguments are pickled to the worker.
        """
        if not self.background:
            function(*args, **kwargs)
            return
        if self._pool is None:
            gc.freeze()  # the worker's collections leave the inherited objects' pages shared
            self._pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("fork"),
                initializer=leave_signals_to_parent,  # dies with this process, no orphan
                initargs=(os.getpid(),),
            )
        future = self._pool.submit(_draw, function, args, kwargs)
        self._queued.append((future, function, args, kwargs))

    def wait(self) -> None:
        """Wait for every queued figure; raise the first one's error. A figure whose worker
        died is drawn here instead (with a warning), so none is lost."""
        queued, self._queued = self._queued, []
        error: BaseException | None = None
        redrawn = 0
        try:
            for future, function, args, kwargs in queued:
                try:
                    future.result()
                except BrokenProcessPool:
                    redrawn += 1
                    function(*args, **kwargs)
                except Exception as exc:  # the first is raised below
                    if error is None:
                        error = exc
                        _name_the_figure(exc, function, args, kwargs)
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
                gc.unfreeze()
        if redrawn:
            warnings.warn(
                f"the figure worker process died; {redrawn} figure(s) were drawn in this "
                f"process instead (set {WORKER_ENV}=0 to draw every figure here)",
                RuntimeWarning,
                stacklevel=2,
            )
        if error is not None:
            raise error

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
        """Drop the queued figures and stop the worker without waiting (a figure it was
        writing leaves no file: writes are atomic)."""
        self._queued = []
        if self._pool is not None:
            for process in list(getattr(self._pool, "_processes", {}).values()):
                process.terminate()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            gc.unfreeze()
