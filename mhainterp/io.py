"""Atomic file writes, file-naming read errors, per-run locks and the memory a command may use.

Every file the toolkit writes goes through :func:`atomic_path`: a temp file in the same folder,
created with the mode the umask allows (0666 & ~umask, as ``open()`` would), written, flushed to
disk (``fsync``), renamed onto the target, and the folder's entry flushed too. A run killed
mid-write, or a power cut, leaves either the old file or the new one, never half of one, so a
resumed sweep can trust every file it finds. The temp file is named ``.<name>.<pid>.<hex>.tmp``;
one left by a process that was killed (its pid no longer runs) is removed by
:func:`remove_stale_temps`, which :func:`atomic_path` runs on a folder the first time this
process writes there (so no writer can forget it: a killed ``report`` left one in the sweep).

:func:`require_memory` refuses, before allocating, work that cannot fit in the memory this
process may still use (RAM available, the cgroup's limit, ``RLIMIT_AS``);
:func:`allocation_failures` turns an allocation that fails anyway into the same one-line error.

:func:`run_lock` is an OS-level lock (POSIX ``fcntl.lockf``) on a small file beside a run folder:
the kernel releases it when its process dies, even by SIGKILL, so a stale lock never blocks a
later sweep. Forked worker processes do not inherit it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import resource
import secrets
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhainterp.errors import NotEnoughMemoryError, RunLockedError

if TYPE_CHECKING:  # a DataFrame is only written (df.to_csv): no pandas at import
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
    "FileSet",
    "json_text",
    "ensure_writable_dir",
    "describe_os_error",
    "RunLock",
    "run_lock",
    "available_memory",
    "allocation_failure",
    "allocation_failures",
    "format_bytes",
    "remove_stale_temps",
    "require_memory",
]


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it is flushed to disk and renamed onto
    ``path``. On any error (a full disk, Ctrl-C) the temp file is removed and ``path`` is left
    as it was.

    A folder that cannot be written (read-only, permissions) fails only when the content
    differs: the temp file then lives in the system's temp folder, and a ``path`` that already
    holds exactly what was written is left as it is (a read-only sweep whose results are all
    saved can be reported elsewhere).

    Example:
        >>> with atomic_path(tmp / "fig.png") as tmp_file:  # doctest: +SKIP
        ...     fig.savefig(tmp_file)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps_once(path.parent)
    try:
        tmp = _create_temp(path)
    except OSError as error:
        if error.errno not in _READ_ONLY or not path.is_file():
            raise
        with _unchanged_or(error, path) as elsewhere:
            yield elsewhere
        return
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


_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


@contextmanager
def _unchanged_or(error: OSError, path: Path) -> Iterator[Path]:
    """A temp path outside ``path``'s folder; afterwards, ``error`` unless what was written
    there equals ``path``'s content."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    elsewhere = Path(name)
    try:
        yield elsewhere
        if not _same_bytes(elsewhere.read_bytes(), path):
            raise error
    finally:
        elsewhere.unlink(missing_ok=True)


def _same_bytes(data: bytes, path: Path) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def _create_temp(path: Path) -> Path:
    """An empty new file beside ``path``, mode 0666 & ~umask (``mkstemp`` would force 0600)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"could not create a temp file beside {path}")  # pragma: no cover


_SWEPT_FOLDERS: set[tuple[int, Path]] = set()  # (pid, folder): a forked worker sweeps anew
_SWEPT_LOCK = threading.Lock()


def _remove_stale_temps_once(folder: Path) -> None:
    """:func:`remove_stale_temps` on ``folder`` the first time this process writes there."""
    key = (os.getpid(), folder.resolve())
    with _SWEPT_LOCK:
        if key in _SWEPT_FOLDERS:
            return
        _SWEPT_FOLDERS.add(key)
    with contextlib.suppress(OSError):  # a folder we cannot list or clean still gets its write
        remove_stale_temps(folder)


_TEMP_NAME = re.compile(r"^\..+?(?:\.(?P<pid>\d+))?\.[0-9a-f]{8}\.tmp$")


def remove_stale_temps(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temp files of :func:`atomic_path` in ``folder`` whose writer is gone (a
    killed process: its pid no longer runs), and those of older versions (no pid in the
    name); return them. Temp files of live processes, and other files, are left alone.

    Example:
        >>> remove_stale_temps("runs/rev_h4/analysis")  # doctest: +SKIP
        [PosixPath('runs/rev_h4/analysis/.average_patterns.png.4242.9f0c1a2b.tmp')]
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for path in folder.iterdir():
        match = _TEMP_NAME.match(path.name)
        if not match or not path.is_file():
            continue
        pid = match.group("pid")
        if pid is not None and _pid_runs(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def _pid_runs(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
    """Atomically write ``text`` (UTF-8); a file that already holds exactly it is left
    untouched (nothing is written, so this works in a read-only folder)."""
    data = text.encode("utf-8")
    if _same_bytes(data, Path(path)):
        return Path(path)
    return _write_with(path, lambda tmp: tmp.write_bytes(data))


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Atomically write ``obj`` as indented, key-sorted JSON."""
    return write_text(path, json_text(obj))


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
    """Atomically write a DataFrame as CSV without its index (see :func:`write_text`)."""
    return write_text(path, df.to_csv(index=False))


def json_text(obj: Any) -> str:
    """``obj`` as the indented, key-sorted JSON text :func:`write_json` writes."""
    return json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n"


class FileSet:
    """Files that are complete only together, with a marker file that says so.

    A save that a kill interrupts must read as "not saved", never as a mix of old and new
    files: the marker is removed before the first file that changes and written last. A save
    whose every file already holds the same bytes writes nothing at all (so a read-only folder
    whose results are saved can be reported from).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> files = FileSet(folder / "done.json")
        >>> _ = files.write_text(folder / "a.txt", "a")
        >>> _ = files.finish({"complete": True})
        >>> sorted(p.name for p in folder.iterdir())
        ['a.txt', 'done.json']
    """

    def __init__(self, marker: str | os.PathLike[str]) -> None:
        self.marker = Path(marker)
        self._changing = False

    def _change(self) -> None:
        if not self._changing:
            self.marker.unlink(missing_ok=True)
            self._changing = True

    def write_text(self, path: str | os.PathLike[str], text: str) -> Path:
        """Like :func:`write_text`, inside the set."""
        if not _same_bytes(text.encode("utf-8"), Path(path)):
            self._change()
        return write_text(path, text)

    def write_csv(self, path: str | os.PathLike[str], df: pd.DataFrame) -> Path:
        """Like :func:`write_csv`, inside the set."""
        return self.write_text(path, df.to_csv(index=False))

    def remove(self, path: str | os.PathLike[str]) -> None:
        """Remove a file of an earlier save that this one does not write."""
        if Path(path).exists():
            self._change()
            Path(path).unlink()

    def finish(self, marker_content: Any) -> Path:
        """Write the marker (JSON) last: the set is complete."""
        return write_text(self.marker, json_text(marker_content))


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


def reported_os_error(error: Exception, path: str | Path) -> Exception:
    """The :class:`OSError` that a library reported as its own error type (safetensors
    writes Rust's ``... (os error 28)``), naming ``path``; ``error`` itself when its message
    names no OS error.

    Example:
        >>> found = reported_os_error(
        ...     RuntimeError("I/O error: No space left on device (os error 28)"), "w.bin"
        ... )
        >>> describe_os_error(found)[:32]
        'disk full: cannot write w.bin (N'
    """
    code = re.search(r"\(os error (\d+)\)", str(error))
    if code is None:
        return error
    number = int(code.group(1))
    return OSError(number, os.strerror(number), str(path))


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


# ----- memory ------------------------------------------------------------------------------------
def format_bytes(n: float) -> str:
    """``1.5 GiB``-style sizes for messages.

    Example:
        >>> format_bytes(3 * 2**30)
        '3.0 GiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def available_memory() -> int:
    """Bytes this process may still allocate: the least of the RAM available
    (``MemAvailable``), what the cgroup's ``memory.max`` leaves, and what ``RLIMIT_AS``
    leaves of the address space (Linux; elsewhere the limits that can be read)."""
    limits = [_meminfo_available(), _cgroup_left(), _address_space_left()]
    known = [limit for limit in limits if limit is not None]
    return max(0, min(known)) if known else 2**63 - 1


def _meminfo_available() -> int | None:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo", encoding="ascii") as handle:
            line = next(line for line in handle if line.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    return None


def _cgroup_left() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            return int(limit) - used
    return None


def _address_space_left() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as handle:
            line = next(line for line in handle if line.startswith("VmSize:"))
        return soft - int(line.split()[1]) * 1024
    return soft


def require_memory(needed: int, what: str) -> None:
    """Refuse ``what`` (e.g. ``"training with --batch-size 100000"``) when it needs more than
    :func:`available_memory`.

    Raises:
        NotEnoughMemoryError: one line with both amounts and the sizes to lower.

    Example:
        >>> require_memory(2**50, "this")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        mhainterp.errors.NotEnoughMemoryError: this needs about 1024.0 TiB of memory, but ...
    """
    available = available_memory()
    if needed > available:
        raise NotEnoughMemoryError(
            f"{what} needs about {format_bytes(needed)} of memory, but {format_bytes(available)} "
            "are available; lower the sizes asked for"
        )


@contextmanager
def allocation_failures(what: str) -> Iterator[None]:
    """Inside, an allocation that fails (torch's "can't allocate memory", ``MemoryError``)
    raises :class:`NotEnoughMemoryError` naming ``what``: the estimate of
    :func:`require_memory` is a lower bound, this is the backstop."""
    try:
        yield
    except NotEnoughMemoryError:
        raise
    except (MemoryError, RuntimeError) as error:
        message = allocation_failure(error, what)
        if message is None:
            raise
        raise NotEnoughMemoryError(message) from None


def allocation_failure(error: BaseException, what: str) -> str | None:
    """The one line for ``error`` when it is a failed allocation (torch's "can't allocate
    memory" or "out of memory", ``MemoryError``), else None. The CLI's backstop for any
    command: an allocation no estimate foresaw still ends in one line, not a traceback.

    Example:
        >>> allocation_failure(KeyError("x"), "this") is None
        True
    """
    if isinstance(error, NotEnoughMemoryError):
        return str(error)
    if isinstance(error, MemoryError):
        return _failed(what, None)
    text = str(error)
    if not isinstance(error, RuntimeError) or not (
        "can't allocate memory" in text or "out of memory" in text
    ):
        return None
    asked = re.search(r"allocate (\d+) bytes", text)
    return _failed(what, int(asked.group(1)) if asked else None)


def _failed(what: str, asked: int | None) -> str:
    size = f" ({format_bytes(asked)} at once)" if asked else ""
    return (
        f"{what} ran out of memory{size}; {format_bytes(available_memory())} are available; "
        "lower the sizes asked for"
    )


# ----- per-run locks ------------------------------------------------------------------------------
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
