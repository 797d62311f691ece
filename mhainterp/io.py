"""Atomic file writes, file-naming read errors and per-run locks.

Every file the toolkit writes goes through :func:`atomic_path`: a temp file in the same folder,
created with the mode the umask allows (0666 & ~umask, as ``open()`` would), written, flushed to
disk (``fsync``), renamed onto the target, and the folder's entry flushed too. A run killed
mid-write, or a power cut, leaves either the old file or the new one, never half of one, so a
resumed sweep can trust every file it finds.

:func:`run_lock` is an OS-level lock (POSIX ``fcntl.lockf``) on a small file beside a run folder:
the kernel releases it when its process dies, even by SIGKILL, so a stale lock never blocks a
later sweep. Forked worker processes do not inherit it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

try:  # POSIX; elsewhere run_lock falls back to a process-local lock (see run_lock)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "atomic_path",
    "write_text",
    "write_json",
    "read_json",
    "write_csv",
    "ensure_writable_dir",
    "describe_os_error",
    "RunLock",
    "run_lock",
    "RunLockedError",
]


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it is flushed to disk and renamed onto
    ``path``. On any error (a full disk, Ctrl-C) the temp file is removed and ``path`` is left
    as it was.

    Example:
        >>> with atomic_path(tmp / "fig.png") as tmp_file:  # doctest: +SKIP
        ...     fig.savefig(tmp_file)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temp(path)
    mode = stat.S_IMODE(tmp.stat().st_mode)  # what the umask allows
    try:
        yield tmp
        if stat.S_IMODE(tmp.stat().st_mode) != mode:  # a writer that made its own file
            os.chmod(tmp, mode)
        _fsync_file(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def _create_temp(path: Path) -> Path:
    """An empty new file beside ``path``, mode 0666 & ~umask (``mkstemp`` would force 0600)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"could not create a temp file beside {path}")  # pragma: no cover


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """Flush the folder entry of a rename (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def _write_with(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> Path:
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Atomically write ``text`` (UTF-8)."""
    return _write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Atomically write ``obj`` as indented, key-sorted JSON."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read JSON; a missing, unreadable or invalid file raises an error that names it.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is not valid UTF-8 JSON (the message names the file and the place).

    Example:
        >>> read_json("runs/rev/config.json")["model"]["n_heads"]  # doctest: +SKIP
        4
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        what = "is empty" if not error.doc.strip() else "is not valid JSON"
        raise ValueError(
            f"{path} {what} ({error.msg}: line {error.lineno} column {error.colno})"
        ) from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not valid JSON (not UTF-8 text)") from None


def write_csv(path: str | os.PathLike[str], df: pd.DataFrame) -> Path:
    """Atomically write a DataFrame as CSV without its index."""
    return _write_with(path, lambda tmp: df.to_csv(tmp, index=False))


def _json_default(obj: Any) -> Any:
    # numpy scalars and tuples show up in configs and metrics.
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


# ----- output folders and OS errors ---------------------------------------------------------------
def ensure_writable_dir(path: str | os.PathLike[str], what: str = "output folder") -> Path:
    """Create ``path`` (and parents) and check a file can be written in it, before any work.

    Raises:
        NotADirectoryError: ``path``, or a folder above it, is a file.
        PermissionError: the folder cannot be written (read-only file system, permissions).

    Example:
        >>> ensure_writable_dir("runs/rev")  # doctest: +SKIP
        PosixPath('runs/rev')
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{what} {path} is a file, not a folder")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{what} {path} is inside a file ({parent})")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = _create_temp(path / "write-test")
        probe.unlink()
    except OSError as error:
        raise type(error)(error.errno, f"cannot write in {what} {path}: {_reason(error)}") from None
    return path


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def describe_os_error(error: OSError) -> str:
    """One line for an OS error: what failed, on which file, and what to do.

    Example:
        >>> describe_os_error(OSError(errno.ENOSPC, "No space left on device", "x"))[:40]
        'disk full: cannot write x (No space left'
    """
    where = f" {error.filename}" if error.filename else ""
    reason = _reason(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"disk full: cannot write{where} ({reason}); free some space and run the same "
            "command again to resume"
        )
    if error.filename is None and error.strerror is not None:
        return error.strerror  # our own messages carry the path already
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied:{where} ({reason}); choose a folder you can write"
    return f"{reason}:{where}" if where else reason


# ----- per-run locks ------------------------------------------------------------------------------
class RunLockedError(RuntimeError):
    """Another process holds the lock (see :func:`run_lock`)."""


_held_here: set[str] = set()  # POSIX locks are per process: track our own to exclude threads
_held_here_guard = threading.Lock()


class RunLock:
    """An exclusive lock on ``<folder>/.<run name>.lock``, the lock file beside a run folder.

    The lock is a POSIX record lock (``fcntl.lockf``): the kernel drops it when the holding
    process exits or is killed, so a lock left by a SIGKILLed sweep is free again at once.
    Locks are not inherited by forked workers. Inside one process a second ``RunLock`` on the
    same run counts as held. The lock file stays behind (removing it would race with a process
    about to lock it); it records the holder's pid for messages.

    Example:
        >>> lock = RunLock("runs/rev/runs/h4_seed0")  # doctest: +SKIP
        >>> if lock.acquire():  # doctest: +SKIP
        ...     try: train_it()
        ...     finally: lock.release()
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        run_dir = Path(run_dir)
        self.path = run_dir.parent / f".{run_dir.name}.lock"
        self._key = str(self.path.absolute())
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock if it is free; True when this object now holds it."""
        if self._fd is not None:
            return True
        with _held_here_guard:
            if self._key in _held_here:
                return False
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            if fcntl is not None:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as error:
                    os.close(fd)
                    if error.errno in (errno.EACCES, errno.EAGAIN):
                        return False
                    raise
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            _held_here.add(self._key)
            self._fd = fd
            return True

    def release(self) -> None:
        """Release the lock (closing the file releases a POSIX lock)."""
        if self._fd is None:
            return
        with _held_here_guard:
            os.close(self._fd)
            self._fd = None
            _held_here.discard(self._key)

    def holder(self) -> str:
        """The pid written by the last holder, or "another process"."""
        if self._key in _held_here:
            # Opening the file here would drop this process's own POSIX lock on it.
            return "this process"
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.path.read_text().strip())
            return f"process {pid}"
        return "another process"

    def __enter__(self) -> RunLock:
        if not self.acquire():
            raise RunLockedError(
                f"{self.path.parent / self.path.name[1:-5]} is in use by {self.holder()}"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def run_lock(run_dir: str | os.PathLike[str]) -> RunLock:
    """The lock of one run folder (see :class:`RunLock`); ``with run_lock(d):`` raises
    :class:`RunLockedError` when another process holds it."""
    return RunLock(run_dir)
