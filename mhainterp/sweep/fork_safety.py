"""Forked children get a progress-bar lock of their own.

tqdm guards its output with a lock that includes a ``multiprocessing`` lock, created in the
parent the first time a bar is made. A forked child (the batched executor's workers, or any
``os.fork`` of a process that runs sweeps) inherits that very lock, and every bar it makes takes
it, even a disabled one. A child killed while holding it (SIGKILL, the OOM killer, the workers
the executor kills on Ctrl-C) leaves it held forever, and the parent's next bar update waits
forever: measured as a hung test suite after a SIGKILLed forked sweep. Workers never draw bars,
so they need no cross-process coordination: after a fork, the child's tqdm uses a plain thread
lock of its own (tqdm's public ``set_lock``).
"""

from __future__ import annotations

import os
import threading

from tqdm import std as _tqdm_std
from tqdm.auto import tqdm as _tqdm_auto

__all__ = ["use_private_progress_lock"]


def use_private_progress_lock() -> None:
    """Give this process's tqdm bars a lock no other process holds (run after a fork)."""
    lock = threading.RLock()
    for cls in {_tqdm_std.tqdm, _tqdm_auto}:
        cls.set_lock(lock)


os.register_at_fork(after_in_child=use_private_progress_lock)
