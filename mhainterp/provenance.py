"""Saved analyses belong to the weights they were computed from.

``run/analysis/source.json`` records the SHA-256 of the ``model.safetensors`` the results saved
beside it were computed from (:func:`record_analysis_source`). A reader reuses them only while
those are still the run's weights (:func:`analysis_is_current`); a writer first moves the
results of other weights into ``analysis/stale-<digest>/`` (:func:`set_aside_stale_analysis`), so
nothing is reused and nothing is lost. Split from :mod:`mhainterp.runs`, which knows the
folders; this module knows only which weights a folder's results are of.

Example:
    >>> analysis_is_current("runs/quickstart/reverse/runs/h4_seed0")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path
from typing import Any

from mhainterp.io import read_json, write_json
from mhainterp.runs import ANALYSIS_DIR, weights_digest

__all__ = [
    "SOURCE_FILE",
    "analysis_is_current",
    "record_analysis_source",
    "set_aside_stale_analysis",
]

SOURCE_FILE = "source.json"
"""In ``analysis/``: the digest of the weights the saved analyses were computed from."""


def _recorded_digest(run_dir: Path) -> str | None:
    path = run_dir / ANALYSIS_DIR / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        source = read_json(path)
    except ValueError:
        return ""  # damaged: matches no weights
    return source.get("weights_sha256", "") if isinstance(source, dict) else ""


def analysis_is_current(
    run_dir: str | os.PathLike[str], meta: dict[str, Any] | None = None
) -> bool:
    """Whether the analyses saved in ``run_dir/analysis`` were computed from the weights now
    in ``run_dir``: ``analysis/source.json`` and, when given, a saved result's own metadata
    (``meta["weights_sha256"]``) name their digest. Results saved before analyses recorded
    their weights count as current (nothing tells otherwise); a damaged record does not."""
    run_dir = Path(run_dir)
    current = weights_digest(run_dir)
    recorded = [_recorded_digest(run_dir)]
    if isinstance(meta, dict) and "weights_sha256" in meta:
        recorded.append(str(meta["weights_sha256"]))
    return all(r is None or r == current for r in recorded)


_DERIVED = (".csv", ".json", ".md", ".png", ".pdf", ".svg", ".html")


def set_aside_stale_analysis(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Move the results in ``run_dir/analysis`` that ``source.json`` says were computed from
    other weights into ``analysis/stale-<their digest>/`` (with a warning), so that nothing
    reuses them and nothing is lost; return the files moved. Call it before computing
    anything saved there; a current folder is not touched."""
    run_dir = Path(run_dir)
    folder = run_dir / ANALYSIS_DIR
    recorded = _recorded_digest(run_dir)
    if recorded is None or recorded == weights_digest(run_dir):
        return []
    aside = folder / f"stale-{(recorded or 'unknown')[:12]}"
    aside.mkdir(exist_ok=True)
    moved = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix in _DERIVED:
            moved.append(path.replace(aside / path.name))
    warnings.warn(
        f"{folder}: its {len(moved)} saved results were computed from other weights than "
        f"{run_dir / 'model.safetensors'} holds now; moved to {aside}, computing them again",
        stacklevel=2,
    )
    return moved


def record_analysis_source(run_dir: str | os.PathLike[str]) -> None:
    """Write ``run_dir/analysis/source.json``: the digest of the weights the results saved
    there were computed from (call it after saving them). A folder that cannot be written
    keeps what it has (the results in it were then saved by someone else)."""
    run_dir = Path(run_dir)
    digest = weights_digest(run_dir)
    if digest is None or _recorded_digest(run_dir) == digest:
        return
    record = {"weights_sha256": digest, "weights": "../model.safetensors"}
    try:
        write_json(run_dir / ANALYSIS_DIR / SOURCE_FILE, record)
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
