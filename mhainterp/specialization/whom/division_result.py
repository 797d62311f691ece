"""What :func:`~mhainterp.specialization.whom.division.division_of_labour` returns: its tables'
columns, the result with its save and load, and the lookup of a run's saved result.

Shapes: H heads, K values of an axis.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mhainterp.ablation.replacement import METHODS, method_order
from mhainterp.errors import OutdatedResultError
from mhainterp.io import write_csv, write_json
from mhainterp.runs import read_result_table, read_saved_meta
from mhainterp.specialization.settings import DivisionSettings
from mhainterp.specialization.whom.damage import TripleDamage
from mhainterp.specialization.whom.division_calls import restated_axis, zero_artefact
from mhainterp.specialization.whom.pass_store import PassStore

__all__ = [
    "ATTENTION_COLUMNS",
    "BASIS_PROFILE_COLUMNS",
    "HEADS_COLUMNS",
    "PROFILE_COLUMNS",
    "DivisionResult",
    "index_columns",
    "join_columns",
    "saved_division",
    "table_columns",
    "text_columns",
]

HEADS_COLUMNS = [
    "head_label",
    "layer",
    "head",
    "by",
    "selectivity",
    "null_mean",
    "p_adj",
    "specialized",
    "serves",
    "total_damage",
    "loss_increase",
    "p",
    "null_init_mean",
    "n_values",
    "basis",
    "ci_low",
    "ci_high",
    "null_selectivity",
    "null_high",
    "served_share",
    "n_eff",
    "helped_share",
    "selectivity_gain",
    "kept_selectivity",
    "served_values",
    "kept_scope",
    "p_floor",
    "damage_alone",
    "damage_group",
    "group",
    "kept_contribution",
    "write_norm",
    "write_share",
]
"""Columns of :attr:`DivisionResult.heads`, one row per head and axis. ``selectivity`` is the
K-invariant ``1 - n_eff / K`` on the head's ``basis`` profile, ``ci_low, ci_high`` its
bootstrap interval; ``null_selectivity`` the selectivity of its scope's whole job (its layer's;
the model's for a head whose ``kept_scope`` is "model" or that is the only head of its layer
with a defined profile), ``null_mean`` the larger of that and
the shuffled null's mean, ``null_high`` the larger upper quantile; ``selectivity_gain =
selectivity - null_mean`` the effect; ``kept_selectivity`` the kept profile's selectivity where
a head has both profiles; ``p`` (normal approximation, no floor: ``p_floor`` NaN) and ``p_adj``
(corrected over every head and axis); ``specialized`` = ``p_adj < alpha``, ``selectivity_gain >=
min_selectivity_gain`` and a value spared, with both profiles where a head has both;
``helped_share`` the share of the profile's absolute damage that is negative (values on which
removing the head helps, which the selectivity clips at 0; given for undefined profiles too: 1
for a head whose removal only helps); ``served_values`` the values its
profile serves (damage at least ``serve_share`` of its
largest), ``serves`` the same where specialized and "" elsewhere; ``kept_scope`` "layer" or
"model" (kept alone in its layer, or across layers); ``null_init_mean`` is kept NaN for old
readers. ``damage_alone`` (= ``total_damage``),
``damage_group``, ``group``, ``kept_contribution``, ``write_norm`` and ``write_share`` are the
inputs of "dead by function"."""
_INDEX_LEADING = [
    "by",
    "index",
    "null_index",
    "p",
    "divided",
    "null_index_std",
    "null_init_index",
    "n_damaging",
    "n_values",
    "call",
    "basis",
    "reason",
    "ci_low",
    "ci_high",
    "null_high",
    "p_floor",
]
_PER_METHOD = ("index", "call", "null_index", "null_high")
_INDEX_TRAILING = [
    "index_single",
    "index_kept",
    "index_group",
    "n_kept",
    "n_groups",
    "explained_by",
    "index_explained",
]


def index_columns() -> list[str]:
    """Columns of :attr:`DivisionResult.index`, one row per axis: ``call`` (divided, not
    divided, cannot tell, method-dependent) on ``basis`` (single, kept, group; "" when no basis
    applies), ``index`` with its bootstrap ``ci_low, ci_high``, the same-function null
    (``null_index``, its upper quantile ``null_high``, ``null_index_std``), ``p`` against it with
    its floor ``p_floor``, the index and call under each registered method (the default method
    first) with that method's own same-function null (``null_index_<method>``,
    ``null_high_<method>``: the noisy copy scored under that method), the primary method's index
    on every basis, the counts of damaging heads, heads contributing kept alone and groups,
    and ``index_explained``: the largest index that another axis's profiles give this axis
    through the data alone (how the axes go together on the scored triples; ``explained_by``
    names that axis): an index near it may only restate that axis's division.
    ``divided`` is ``call == "divided"``; ``null_init_index`` is kept NaN for old readers.

    Example:
        >>> index_columns()[16:20]
        ['index_mean', 'index_zero', 'index_resample', 'call_mean']
    """
    methods = method_order(DivisionSettings().method)
    per_method = [f"{column}_{m}" for column in _PER_METHOD for m in methods]
    return [*_INDEX_LEADING, *per_method, *_INDEX_TRAILING]


PROFILE_COLUMNS = [
    "head_label",
    "layer",
    "head",
    "by",
    "value",
    "n_scored",
    "clean_accuracy",
    "ablated_accuracy",
    "damage",
    "loss_increase",
    "in_index",
]
"""Columns of :attr:`DivisionResult.profiles`: the head x value table (``damage`` unclipped)."""
ATTENTION_COLUMNS = ["head_label", "layer", "head", "by", "value", "relation", "mass", "n_queries"]
"""Columns of :attr:`DivisionResult.attention`."""
BASIS_PROFILE_COLUMNS = [
    "unit",
    "by",
    "basis",
    "value",
    "n_scored",
    "profile",
    "defined",
    "in_index",
]
"""Columns of :attr:`DivisionResult.basis_profiles`: per head its kept-alone contribution
(``basis`` "kept", ``unit`` the head) and per group its removal damage (``basis`` "group",
``unit`` the head set), per value, observed, unclipped."""

PREFIX = "division"


def table_columns() -> dict[str, list[str]]:
    """Each table of a :class:`DivisionResult` and its columns, in the order they are saved."""
    return {
        "heads": HEADS_COLUMNS,
        "index": index_columns(),
        "profiles": PROFILE_COLUMNS,
        "attention": ATTENTION_COLUMNS,
        "basis_profiles": BASIS_PROFILE_COLUMNS,
    }


def text_columns() -> tuple[str, ...]:
    """The text columns, read back as "" where CSV wrote an empty string."""
    calls = (f"call_{m}" for m in METHODS)
    return (
        "serves",
        "served_values",
        "kept_scope",
        "group",
        "basis",
        "reason",
        "explained_by",
        *calls,
    )


def join_columns(parts: list[dict[str, Any]], names: list[str]) -> dict[str, np.ndarray]:
    """Per-axis column dicts (arrays, or scalars repeated to the part's length) joined column
    by column, so that each table is one DataFrame construction (costly with pandas' string
    columns) instead of one per axis."""
    out = {}
    for name in names:
        pieces = []
        for part in parts:
            length = len(next(v for v in part.values() if isinstance(v, np.ndarray)))
            value = part[name]
            pieces.append(value if isinstance(value, np.ndarray) else np.full(length, value))
        out[name] = np.concatenate(pieces) if pieces else np.array([])
    return out


@dataclass
class DivisionResult:
    """What :func:`division_of_labour` returns (tables described in the module docstring).

    Attributes:
        heads: One row per head and axis, columns :data:`HEADS_COLUMNS`.
        index: One row per axis, columns :func:`index_columns`.
        profiles: Head x value damage, columns :data:`PROFILE_COLUMNS`.
        attention: Template mass per head, value and relation, :data:`ATTENTION_COLUMNS`.
        basis_profiles: Kept-head and group profiles, :data:`BASIS_PROFILE_COLUMNS`.
        settings: The thresholds used.
        skipped: Axes asked for that do not apply, and why.
        single_damage: In memory only, under the attribution screen (never saved): the
            primary method's single-head damage per scored triple, exact or estimated as the
            ``evidence`` column says; the specialization test of the same model and batch
            reads it instead of removing every head again.
        passes: In memory only (never saved): the engine rows, clean activations, estimates
            and noisy copies this division ran (:class:`~.pass_store.PassStore`); a division
            of the same model and data given them (``passes=``) reuses them.
    """

    heads: pd.DataFrame
    index: pd.DataFrame
    profiles: pd.DataFrame
    attention: pd.DataFrame
    basis_profiles: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=BASIS_PROFILE_COLUMNS)
    )
    settings: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    single_damage: TripleDamage | None = field(default=None, repr=False, compare=False)
    passes: PassStore | None = field(default=None, repr=False, compare=False)

    def summary_line(self) -> str:
        """``token 0.42 [0.38, 0.46] vs null 0.01 (single): divided; position ...``: per axis
        the index, its interval, the same-function null, the basis and the call."""
        parts = []
        for row in self.index.itertuples(index=False):
            call = row.call
            if math.isnan(row.index):
                parts.append(f"{row.by} n/a ({row.n_damaging} damaging head(s)): {call}")
                continue
            calls = {m: getattr(row, f"call_{m}", "") for m in METHODS}
            if zero_artefact(calls, row.by) and call != "method-dependent":
                call += " (zero ablation left out: the default-class artefact)"
            other = restated_axis(row._asdict())
            if other and call.startswith(("divided", "method-dependent")):
                call += f" (may only restate {other}: the axes go together in these data)"
            parts.append(
                f"{row.by} {row.index:.2f} [{row.ci_low:.2f}, {row.ci_high:.2f}] vs null "
                f"{row.null_high:.2f} ({row.basis}): {call}"
            )
        return "division index: " + ("; ".join(parts) if parts else self._none_applies())

    def _none_applies(self) -> str:
        """Why no axis was tested: each skipped axis's reason, and, where an axis had too
        few scored triples, the fix (a handful of sequences cannot divide anything)."""
        if not self.skipped:
            return "no axis applies"
        reasons = "; ".join(f"{axis}: {why}" for axis, why in self.skipped.items())
        few = any("scored triples" in why for why in self.skipped.values())
        fix = " (too few sequences: evaluate more, n_eval / --n-eval)" if few else ""
        return f"no axis applies ({reasons}){fix}"

    def save(self, folder: str | os.PathLike[str], prefix: str = PREFIX) -> list[Path]:
        """Write ``{prefix}_{table}.csv`` per table and ``{prefix}.json`` (settings, skipped
        axes) into ``folder``, atomically; the JSON is written last, so its presence means the
        set is complete."""
        folder = Path(folder)
        paths = [
            write_csv(folder / f"{prefix}_{name}.csv", getattr(self, name))
            for name in table_columns()
        ]
        meta = {"settings": self.settings, "skipped": self.skipped}
        return [*paths, write_json(folder / f"{prefix}.json", meta)]

    @classmethod
    def load(cls, folder: str | os.PathLike[str], prefix: str = PREFIX) -> DivisionResult:
        """Read back what :meth:`save` wrote.

        Raises:
            FileNotFoundError: A file is missing (the message names it and the command).
            OutdatedResultError: A table lacks a column this version writes (an older
                mhainterp saved it; :func:`saved_division` recomputes it).
            RunFolderError: A file is damaged (the message names it).
        """
        folder = Path(folder)
        meta_path = folder / f"{prefix}.json"
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"{meta_path} is missing: the division of labour has not been saved here; run "
                f"`mhainterp specialize {folder.parent}`"
            )
        meta = read_saved_meta(meta_path, ("settings",))
        text = text_columns()
        tables = {
            name: read_result_table(
                folder / f"{prefix}_{name}.csv",
                columns,
                text=text,
                dtype={"value": str, "unit": str},
            )
            for name, columns in table_columns().items()
        }
        return cls(**tables, settings=meta["settings"], skipped=meta.get("skipped", {}))


def saved_division(
    run_dir: str | os.PathLike[str], request: Mapping[str, Any] | None = None
) -> DivisionResult | None:
    """A run's saved division of labour (``run_dir/analysis/division_*``), or None when there
    is none or it was made otherwise than ``request``
    (:func:`~mhainterp.specialization.whom.division.division_request`; None: any).

    Example:
        >>> saved_division("runs/rev/runs/h4_seed0") is None  # doctest: +SKIP
        False
    """
    try:
        saved = DivisionResult.load(Path(run_dir) / "analysis")
    except (FileNotFoundError, OutdatedResultError):  # not saved, or saved by an older version
        return None
    if request is not None and any(saved.settings.get(k) != v for k, v in request.items()):
        return None
    return saved
