"""Read what earlier commands saved in a run's ``analysis/`` folder, tolerating its absence.

The folder is a run folder or a pretrained model's verdict folder (``mhainterp specialize
--model NAME --out FOLDER``): both keep their tables under ``analysis/``. The explorer shows,
per head, what ``mhainterp specialize`` labelled it (``specialization_heads.csv``:
``head_label, label`` and, where saved, ``finding``: what the head does on every axis; a
table without a measured finding but with ``holds, needed, backed_up, dead`` gets one
composed from those and the division's per-head ``serves``), its single-head importance from
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
from mhainterp.specialization.verdict.labels import head_finding

__all__ = ["DIVISION_COLUMNS", "FLAG_COLUMNS", "SavedResults"]

DIVISION_COLUMNS = (
    "by",
    "selectivity",
    "null_mean",
    "p_adj",
    "helped_share",
    "specialized",
    "serves",
)

FLAG_COLUMNS = ("holds", "needed", "backed_up", "dead")
"""What a saved heads table needs for a finding to be composed when it has none measured."""

NOT_MEASURED = "not measured"
"""In a saved finding: a part the verdict did not measure (whom the head serves)."""


@dataclass
class SavedResults:
    """Per-head results found in a run folder (each empty when not saved).

    Attributes:
        labels: head label -> specialization label (``"previous"``, ``"backed up"``, ...).
        findings: head label -> what it does on every axis ("looks at previous; serves
            position: 1,2; needed").
        importance: method -> head label -> change in accuracy when the head alone is ablated.
        division: head label -> rows ``{by, selectivity, null_mean, p_adj, helped_share,
            specialized, serves}`` (the columns the file has).

    Example:
        >>> SavedResults(findings={"L0H0": "dead"}).has_verdict
        True
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
        division = _division(sorted(folder.glob("*division*.csv")))
        return cls(
            labels=_column(folder / "specialization_heads.csv", "label"),
            findings=_findings(folder / "specialization_heads.csv", division),
            importance=_importance(folder / "ablation_importance.csv"),
            division=division,
        )

    @property
    def has_verdict(self) -> bool:
        """Whether a verdict was saved: a label or a finding for some head."""
        return bool(self.labels or self.findings)


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


def _findings(path: Path, division: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """head label -> its one-line finding: the saved ``finding``; where that is missing or
    did not measure whom the head serves, composed from the saved flags (:data:`FLAG_COLUMNS`)
    and the division table's ``serves`` (:func:`head_finding`). Saved text only: nothing is
    recomputed, and a head without either has no finding."""
    saved = _column(path, "finding")
    table = _read(path, ("head_label", *FLAG_COLUMNS))
    if table is None:
        return saved
    out = dict(saved)
    for row in table.to_dict("records"):
        label = str(row["head_label"])
        serves = _serves(division[label]) if label in division else None
        if NOT_MEASURED not in saved.get(label, NOT_MEASURED) or (serves is None and label in out):
            continue  # the saved finding says all the saved files say
        holds = row["holds"] if isinstance(row["holds"], str) else ""
        flags = [_flag(row[name]) for name in ("needed", "backed_up", "dead")]
        # a table that has them says harmful and mixing heads as its own findings do
        harm = float(row["removal_gain"]) if _flag(row.get("harmful", False)) else None
        mixed = row.get("mixed_roles")
        mixed = mixed if isinstance(mixed, str) else ""
        out[label] = head_finding(holds, serves, *flags, harm=harm, mixed=mixed)
    return out


def _serves(rows: list[dict[str, Any]] | None) -> str:
    """Whom a head serves from its division rows: ``"position: 9,10; token: 3"`` over the
    axes it serves a subset of (flagged ``specialized``), "" for none.

    Example:
        >>> _serves([{"by": "position", "specialized": True, "serves": "9,10"},
        ...          {"by": "token", "specialized": False, "serves": "3"}])
        'position: 9,10'
    """
    parts = [
        f"{row['by']}: {row['serves']}"
        for row in rows or []
        if _flag(row.get("specialized")) and isinstance(row.get("serves"), str) and row["serves"]
    ]
    return "; ".join(parts)


def _flag(value: Any) -> bool:
    """A saved boolean (``True``, ``"True"``; NaN and anything else: False)."""
    return value is True or str(value) == "True"


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
