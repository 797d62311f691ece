"""A click that answers at once: exact work per click, cancelled when a newer click comes.

On a pretrained model a click's exact answer is a forward of the model (SmolLM2 on 16
sentences: about a second), while its attribution estimate is a sum of numbers computed at
load. So the explorer answers a click with the estimate and a job id (:class:`ClickJobs`
hands them out), and computes the exact view when the page asks for that job. A job is
stale once a newer click (or any change of the ablated heads or the method) has come:

- asked for after that, it is skipped before its forward (:meth:`ClickJobs.is_stale`);
- running when that happens, it stops at its next layer (:meth:`ClickJobs.watching` adds a
  check at every layer's ``attn.hook_z`` that raises :class:`ClickCancelled`), so the newer
  click does not wait for a forward nobody will see.

Example:
    >>> jobs = ClickJobs()
    >>> first = jobs.new()
    >>> second = jobs.new()  # a newer click
    >>> jobs.is_stale(first), jobs.is_stale(second)
    (True, False)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # light: the server imports CANCELLABLE before any model is loaded
    from torch import Tensor

__all__ = ["CANCELLABLE", "ClickCancelled", "ClickJobs"]

CANCELLABLE = ("exact", "verify")
"""Explorer actions whose forward a newer click stops: the server and the widget answer them
from a thread, so that click is heard (and stops them) meanwhile; every other action is
answered where it arrives, as before."""


class ClickCancelled(Exception):  # noqa: N818 - a signal, as StopForward is, not an error
    """Raised inside a stale job's forward (a newer click came): it stops there."""


class ClickJobs:
    """A generation counter: each change of what is ablated starts a new generation, and a
    job is the generation it was made in (stale once another has started).

    Thread-safe: :meth:`new` is called by the request of a newer click while an older job's
    forward runs in another request's thread.
    """

    def __init__(self) -> None:
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> int:
        """The newest job's id."""
        return self._generation

    def new(self) -> int:
        """Start a new generation and return its job id; every older job is now stale."""
        with self._lock:
            self._generation += 1
            return self._generation

    def is_stale(self, job: int) -> bool:
        """Whether a newer job has started since ``job``."""
        return job != self._generation

    @contextmanager
    def watching(self, model: Any, job: int) -> Iterator[None]:
        """Within this context, a forward of ``model`` raises :class:`ClickCancelled` at the
        first layer it reaches after ``job`` went stale (a hook on every ``attn.hook_z``; it
        changes nothing while the job is current)."""

        def check(z: Tensor, hook: Any) -> None:
            if self.is_stale(job):
                raise ClickCancelled(f"job {job} was superseded by job {self.current}")

        hooks = [(f"blocks.{layer}.attn.hook_z", check) for layer in range(model.cfg.n_layers)]
        with model.hooks(fwd_hooks=hooks):
            yield
