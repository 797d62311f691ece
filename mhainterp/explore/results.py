"""Read what earlier commands saved in a run's ``analysis/`` folder, tolerating its absence.

The explorer shows, per head, what ``mhainterp specialize`` labelled it
(``specialization_heads.csv``: ``head_label, label`` and, where saved, ``finding``: what the
head does on every axis), its single-head importance from
``mhainterp analyze`` (``ablation_importance.csv``: ``head_label, method, delta_accuracy``) and,
where a division-of-labour result was saved (a CSV under ``analysis/`` whose name contains
``division`` with columns ``head_label, by, selectivity``), whom the head serves. A missing,
unreadable or differently shaped file means "not saved": the explorer then shows no label,
computes importance itself, or shows no profile.

Example:
    >>> saved = SavedResults.load("runs/quickstart/reverse/runs/h4_seed0")  # doctest: +SKIP
    >>> saved.labels.get("L0H1"), saved.importance.get("mean", {}).get("L0H1")  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mhainterp.errors import RunFolderError
from mhainterp.provenance import analysis_is_current
from mhainterp.runs import read_result_table

__all__ = ["DIVISION_COLUMNS", "SavedResults"]

DIVISION_COLUMNS = ("by", "selectivity", "null_mean", "p_adj", "specialized", "serves")


@dataclass
class SavedResults:
    """Per-head results found in a run folder (each empty when not saved).

    Attributes:
        labels: head label -> specialization label (``"previous"``, ``"backed up"``, ...).
        findings: head label -> what it does on every axis ("looks at previous; serves
            position: 1,2; needed").
        importance: method -> head label -> change in accuracy when the head alone is ablated.
        division: head label -> rows ``{by, selectivity, null_mean, p_adj, specialized,
            serves}`` (the columns the file has).
    """

    labels: dict[str, str] = field(default_factory=dict)
    findings: dict[str, str] = field(default_factory=dict)
    importance: dict[str, dict[str, float]] = field(default_factory=dict)
    division: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> SavedResults:
        """Read ``run_dir/analysis``; a file that is missing or malformed is skipped, and so
        is everything saved there for other weights than the run's (stale)."""
        folder = Path(run_dir) / "analysis"
        if not analysis_is_current(run_dir):
            return cls()
        return cls(
            labels=_column(folder / "specialization_heads.csv", "label"),
            findings=_column(folder / "specialization_heads.csv", "finding"),
            importance=_importance(folder / "ablation_importance.csv"),
            division=_division(sorted(folder.glob("*division*.csv"))),
        )


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame | None:
    """The table at ``path`` in the current format (:func:`~mhainterp.runs.read_result_table`)
    if it exists, is undamaged and has ``columns``; else None: the page then shows what it
    computes itself, never a guess from a damaged or outdated file."""
    try:
        return read_result_table(path, columns)
    except (OSError, RunFolderError):  # missing or unreadable; damaged or outdated
        return None


def _column(path: Path, column: str) -> dict[str, str]:
    """head label -> ``column``'s text (heads without one left out)."""
    table = _read(path, ("head_label", column))
    if table is None:
        return {}
    pairs = zip(table["head_label"], table[column])
    return {str(h): str(v) for h, v in pairs if _present(v) and str(v)}


def _importance(path: Path) -> dict[str, dict[str, float]]:
    table = _read(path, ("head_label", "method", "delta_accuracy"))
    if table is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for method, rows in table.groupby("method"):
        out[str(method)] = dict(zip(rows["head_label"].astype(str), rows["delta_accuracy"]))
    return out


def _division(paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        table = _read(path, ("head_label", "by", "selectivity"))
        if table is None:
            continue
        columns = [c for c in DIVISION_COLUMNS if c in table.columns]
        for row in table.to_dict("records"):
            entry = {c: _json_value(row[c]) for c in columns}
            out.setdefault(str(row["head_label"]), []).append(entry)
        break  # the first readable division table wins
    return out


def _present(value: Any) -> bool:
    return not (isinstance(value, float) and math.isnan(value))


def _json_value(value: Any) -> Any:
    """NaN -> None and numpy scalars -> Python (the page gets JSON)."""
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value
