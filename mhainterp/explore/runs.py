"""Which runs the explorer can show: a run folder, or every run of a sweep (h x seed).

Example:
    >>> [entry.id for entry in explorable_runs("runs/quickstart/reverse")]  # doctest: +SKIP
    ['h1_seed0', 'h4_seed0', 'h8_seed0']
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mhainterp.io import read_json
from mhainterp.runs import find_runs, folder_kind

__all__ = ["RunEntry", "explorable_runs"]


@dataclass(frozen=True)
class RunEntry:
    """One run of the picker: its id (the path below the folder given), h and seed."""

    id: str
    path: Path
    n_heads: int | None
    seed: int | None


def explorable_runs(path: str | os.PathLike[str]) -> list[RunEntry]:
    """The finished runs at ``path`` (a run, a sweep, or a folder of sweeps), sorted by sweep,
    then (h, seed).

    Raises:
        FileNotFoundError: ``path`` is not a run or sweep folder (one line naming it and what
            a run or a sweep folder holds).
    """
    path = Path(path)
    folder_kind(path)  # raises the project's one-line message for anything else
    try:
        run_dirs = find_runs(path)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{path}: {error}") from None
    entries = [_entry(path, run_dir) for run_dir in run_dirs]
    return sorted(
        entries, key=lambda e: (str(Path(e.id).parent), e.n_heads or 0, e.seed or 0, e.id)
    )


def _entry(root: Path, run_dir: Path) -> RunEntry:
    run_id = run_dir.name if run_dir == root else run_dir.relative_to(root).as_posix()
    run_id = run_id.removeprefix("runs/").replace("/runs/", "/")
    try:
        config = read_json(run_dir / "config.json")
        n_heads, seed = config["model"]["n_heads"], config["train"]["seed"]
    except (OSError, ValueError, KeyError, TypeError):
        n_heads = seed = None
    return RunEntry(id=run_id, path=run_dir, n_heads=n_heads, seed=seed)


def default_run(runs: list[RunEntry]) -> RunEntry:
    """The run the explorer opens first: the largest head count of the first sweep (task),
    lowest seed among those; a run without a config counts as 0 heads.

    Example:
        >>> runs = [RunEntry(f"{sweep}/h{h}_seed0", Path("."), h, 0)
        ...         for sweep, h in [("a", 1), ("a", 8), ("b", 16)]]
        >>> default_run(runs).id
        'a/h8_seed0'
    """
    first = str(Path(runs[0].id).parent)
    same_sweep = [entry for entry in runs if str(Path(entry.id).parent) == first]
    return max(same_sweep, key=lambda e: (e.n_heads or 0, -(e.seed or 0)))
