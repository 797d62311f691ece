"""Atomic file writes: a temp file in the same folder, then ``os.replace``.

A run killed mid-write leaves either the old file or the new one, never half of one, so a
resumed sweep can trust every file it finds.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["atomic_path", "write_text", "write_json", "read_json", "write_csv"]


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it is renamed onto ``path``.

    Example:
        >>> with atomic_path(tmp / "fig.png") as tmp_file:  # doctest: +SKIP
        ...     fig.savefig(tmp_file)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


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
    """Read JSON, with a ``FileNotFoundError`` that names the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    return json.loads(path.read_text(encoding="utf-8"))


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
