"""What :func:`~mhainterp.specialization.battery.specialization_test` returns: the columns of its
tables and :class:`SpecializationResult` with its save and load.

Example:
    >>> folder = "runs/quickstart/reverse/runs/h4_seed0/analysis"
    >>> result = SpecializationResult.load(folder)  # doctest: +SKIP
    >>> result.heads[["head_label", "label"]]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mhainterp.io import FileSet, json_text
from mhainterp.provenance import record_analysis_source
from mhainterp.runs import (
    HEAD_KEYS,
    migrate_settings,
    read_result_table,
    read_saved_meta,
    weights_digest,
)
from mhainterp.specialization.settings import SpecializationSettings
from mhainterp.specialization.verdict.sentences import Verdict

__all__ = [
    "DIVISION_COLUMNS",
    "HEAD_COLUMNS",
    "RUN_COLUMNS",
    "SpecializationResult",
]

HEAD_COLUMNS = [
    *HEAD_KEYS,
    "run",
    "task",
    "n_heads",
    "seed",
    "label",
    "role",
    "role_effect",
    "role_p_adj",
    "role_evenness",
    "roles",
    "mixed_roles",
    "top_role",
    "top_score",
    "top_effect",
    "top_p_adj",
    "explained",
    "unexplained",
    "explained_chance",
    "output_ratio",
    "holds",
    "needed",
    "backed_up",
    "dead",
    "harmful",
    "removal_gain",
    "redundant_with",
    "total_damage",
    "loss_increase",
    "causal_target",
    "causal_selectivity",
    "causal_p_adj",
    "causal_specialized",
    "causal_support",
    "serves",
    "finding",
]
"""Columns of :attr:`SpecializationResult.heads` (see
:func:`~mhainterp.specialization.label_heads`)."""

_TEXT_COLUMNS = (
    "role",
    "holds",
    "roles",
    "mixed_roles",
    "top_role",
    "redundant_with",
    "causal_target",
    "changed",
    "finding",
    "serves",
    "group",
    "basis",
    "call",
    "reason",
)
"""String columns whose empty values CSV reads back as NaN."""

RUN_COLUMNS = [
    "run",
    "task",
    "n_heads",
    "n_layers",
    "seed",
    "accuracy",
    "n_role",
    "n_redundant",
    "n_dead",
    "n_unspecialized",
    "n_weak",
    "n_relations",
    "heads_per_relation",
    "n_needed",
    "n_backed_up",
    "frac_role",
    "frac_redundant",
    "frac_dead",
    "frac_needed",
    "frac_backed_up",
    "n_label_flips",
    "frac_label_flips",
    "specialized_along",
    "roles_found",
    "mean_top_effect",
    "causal_selectivity",
    "causal_null",
    "causal_p",
    "verdict",
]
"""Columns of :attr:`SpecializationResult.runs`: one row per run, counts of each label
(``n_*``, counts) and shares (``frac_*`` = count / all heads), ``n_relations`` (relations some
live head holds, a count), ``heads_per_relation`` (a count), ``n_label_flips`` (heads whose
label changes with a threshold x 0.8 or x 1.25), ``specialized_along`` (axes whose division
index beats its null, ``,``-joined; empty when none or not measured), ``mean_top_effect``
(mean over heads of their best effect)."""

DIVISION_COLUMNS = ["run", "by", "index", "null_index", "p"]
"""Columns of :attr:`SpecializationResult.division` (one row per run and axis)."""

_REQUIRED_COLUMNS = {"heads": HEAD_COLUMNS, "runs": RUN_COLUMNS, "division": DIVISION_COLUMNS}
"""What a saved table must hold to be read as current (the others are checked by their use)."""


# ----------------------------------------------------------------------------- result


@dataclass
class SpecializationResult:
    """Everything :func:`specialization_test` found, as tidy tables plus the verdict.

    Attributes:
        heads: One row per (run, head), columns :data:`HEAD_COLUMNS`.
        roles: One row per (run, head, role), leading with ``head_label, layer, head, run,
            task, n_heads, seed``: role scores with both nulls (``score, chance,
            effect, perm_std, z_perm, p_perm, init_mean, init_std, init_n, z_init, p_init, p,
            p_adj, significant``; see :mod:`.roles` and :mod:`.nulls`).
        causal: Head x target damage matrix (``head_label, layer, head, run, task, n_heads,
            seed, target, baseline_accuracy, ablated_accuracy, damage``).
        redundancy: Head pairs (``run`` + :data:`.redundancy.REDUNDANCY_COLUMNS`).
        redundancy_groups: Groups of three or more similar heads, tested as a whole
            (``run`` + :data:`.redundancy.GROUP_COLUMNS`).
        consistency: Run pairs of the same task and head count
            (:data:`.consistency.CONSISTENCY_COLUMNS` + ``task``); empty for one run.
        init_null: The null models' role scores (``head_label, layer, head, run, task,
            n_heads, seed, init_seed, role, ...``).
        runs: One row per run, columns :data:`RUN_COLUMNS`.
        nested: Role pairs whose templates nest on the data (``run, inner, outer``): saved so
            labels can be re-decided without the data.
        stability: The labels re-decided with each threshold x 0.8 / x 1.25 (``run`` +
            :data:`.stability.STABILITY_COLUMNS`).
        verdict: The :class:`~mhainterp.specialization.Verdict`.
        settings: The settings used.
        division: Optional division indices per run and axis (``run, by, index,
            null_index, p``; empty when the division test was not run).
        quiet: The quiet heads removed as a whole, per run and distinct quiet set (``run`` +
            :data:`~mhainterp.specialization.needed.dead.QUIET_COLUMNS`): the evidence that a
            quiet head is dead by function.
    """

    heads: pd.DataFrame
    roles: pd.DataFrame
    causal: pd.DataFrame
    redundancy: pd.DataFrame
    redundancy_groups: pd.DataFrame
    consistency: pd.DataFrame
    init_null: pd.DataFrame
    runs: pd.DataFrame
    nested: pd.DataFrame
    stability: pd.DataFrame
    verdict: Verdict
    settings: SpecializationSettings
    division: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    quiet: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)

    TABLES = (
        "heads",
        "roles",
        "causal",
        "redundancy",
        "redundancy_groups",
        "consistency",
        "init_null",
        "runs",
        "nested",
        "stability",
    )
    OPTIONAL_TABLES = ("division", "quiet")

    def to_markdown(self) -> str:
        """The verdict, its caveats and the per-head table as Markdown."""
        from mhainterp.render import markdown_table

        # The finding (every axis) leads; the label says where a head looks and is named so,
        # or "unspecialized" reads as contradicting a headline that the heads divide the work.
        columns = ["run", "head_label", "finding", "label", "holds", "needed", "backed_up"]
        columns += ["dead", "top_role", "top_effect", "top_p_adj", "explained", "unexplained"]
        columns += ["total_damage", "causal_target", "causal_selectivity"]
        heads = self.heads.reindex(columns=columns).rename(columns={"label": "attention label"})
        lines = ["**Verdict.** " + line for line in self.verdict.lines]
        lines += ["", *[f"- {c}" for c in self.verdict.caveats], ""]
        lines.append(markdown_table(heads))
        return "\n".join(lines) + "\n"

    def save(
        self,
        out_dir: str | os.PathLike[str],
        prefix: str = "specialization",
        files: FileSet | None = None,
    ) -> list[Path]:
        """Write every table as ``{prefix}_{name}.csv``, ``{prefix}.json`` (settings and
        verdict) and ``{prefix}.md``; return the paths.

        The settings file says "this set is complete": it is removed before the first file
        that changes and written last, so a save killed half-way reads as not saved (and is
        recomputed), never as a mix; a save that changes nothing writes nothing. Inside a
        larger set (``files``), that set's marker plays this role for all of them.
        """
        out_dir = Path(out_dir)
        marker = out_dir / f"{prefix}.json"
        own = files is None
        files = FileSet(marker) if files is None else files
        paths = [
            files.write_csv(out_dir / f"{prefix}_{name}.csv", getattr(self, name))
            for name in self.TABLES
        ]
        for name in self.OPTIONAL_TABLES:
            path = out_dir / f"{prefix}_{name}.csv"
            if len(getattr(self, name)):
                paths.append(files.write_csv(path, getattr(self, name)))
            else:
                files.remove(path)  # not a stale table from an earlier save
        paths.append(files.write_text(out_dir / f"{prefix}.md", self.to_markdown()))
        meta = {"settings": self.settings.to_dict(), "verdict": self.verdict.to_dict()}
        digest = weights_digest(out_dir.parent)  # in a run's analysis/: the weights it is of
        if digest is not None:
            meta["weights_sha256"] = digest
        if own:
            paths.append(files.finish(meta))
        else:
            paths.append(files.write_text(marker, json_text(meta)))
        if digest is not None:
            record_analysis_source(out_dir.parent)
        return paths

    @classmethod
    def load(
        cls, out_dir: str | os.PathLike[str], prefix: str = "specialization"
    ) -> SpecializationResult:
        """Read back what :meth:`save` wrote.

        Raises:
            FileNotFoundError: A file is missing (the save was not finished).
            OutdatedResultError: A table lacks a column this version writes (an older
                mhainterp saved it); the readers that reuse saved results recompute it.
            RunFolderError: A file is damaged (the message names it).
        """
        out_dir = Path(out_dir)
        meta = read_saved_meta(out_dir / f"{prefix}.json", ("settings", "verdict"))
        tables = {
            name: read_result_table(
                out_dir / f"{prefix}_{name}.csv",
                _REQUIRED_COLUMNS.get(name, ()),
                text=_TEXT_COLUMNS,
            )
            for name in cls.TABLES
        }
        for name in cls.OPTIONAL_TABLES:
            path = out_dir / f"{prefix}_{name}.csv"
            tables[name] = (
                read_result_table(path, _REQUIRED_COLUMNS.get(name, ()), text=_TEXT_COLUMNS)
                if path.is_file()
                else pd.DataFrame()
            )
        return cls(
            **tables,
            verdict=Verdict.from_dict(meta["verdict"]),
            settings=SpecializationSettings.from_dict(migrate_settings(meta["settings"])),
        )
