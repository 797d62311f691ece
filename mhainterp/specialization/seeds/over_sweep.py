"""Specialization across a head-count sweep: how the relations covered, the division of
labour, redundancy and accuracy change with ``h``, over seeds.

:func:`sweep_specialization` runs :func:`~mhainterp.specialization.battery.specialization_test`
on every run of one or more sweep folders (:mod:`mhainterp.sweep` layout), reusing a run's saved
result (``runs/h{h}_seed{s}/analysis/specialization.json``) when it was made with the same
settings, and saving new ones there. It then stacks the runs, adds cross-seed consistency per
task and head count, and summarises each (task, h) over seeds.

:func:`specialize_folder` computes and saves everything a report of a run, a sweep or a folder
of sweeps reads (:func:`mhainterp.report.write_report` computes nothing);
:func:`saved_specialization` and :meth:`SweepSpecialization.load` read it back.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from mhainterp.io import read_json, write_csv, write_json, write_text
from mhainterp.render import markdown_table
from mhainterp.runs import (
    analysis_is_current,
    folder_kind,
    read_results,
    read_saved_meta,
    record_analysis_source,
    set_aside_stale_analysis,
    sweep_folders,
)
from mhainterp.specialization.battery import (
    RUN_COLUMNS,
    SpecializationResult,
    SpecializationSettings,
    attach_division,
    combine_results,
    specialization_test,
)
from mhainterp.specialization.verdict.sentences import group_key
from mhainterp.specialization.whom.division import (
    AXES,
    DivisionResult,
    division_of_labour,
    division_request,
    saved_division,
)
from mhainterp.stats import describe, exceeds_seed_spread
from mhainterp.training import load_run

__all__ = [
    "SUMMARY_COLUMNS",
    "SweepSpecialization",
    "cached_specialization",
    "display_summary",
    "division_folder",
    "report_kind",
    "saved_specialization",
    "specialization_summary",
    "specialize_folder",
    "sweep_specialization",
]

RESULT_PREFIX = "specialization"
"""File prefix of a run's saved result in its ``analysis/`` folder."""
SWEEP_PREFIX = "specialization_sweep"
"""File prefix of a sweep's stacked result in the sweep folder."""
NOTES_FILE = "specialization_notes.json"
_GRADED = [  # run-table column -> summary prefix: mean and std over seeds of each
    ("accuracy", "accuracy"),
    ("n_relations", "n_relations"),  # a count
    ("heads_per_relation", "heads_per_relation"),  # a count, over seeds with a relation
    ("frac_needed", "frac_needed"),  # shares of all heads from here on
    ("frac_backed_up", "frac_backed_up"),
    ("frac_redundant", "frac_redundant"),
    ("frac_dead", "frac_dead"),
    ("frac_label_flips", "frac_label_flips"),
    ("causal_selectivity", "causal_selectivity"),
]
_DIVISION_STATS = ("mean", "std", "null", "n_measured", "n_defined", "n_beyond")
SUMMARY_COLUMNS = [
    "task",
    "n_heads",
    "n_seeds",
    *[f"{name}_{stat}" for _, name in _GRADED for stat in ("mean", "std")],
    "n_seeds_with_relation",
    *[f"division_{axis}_{stat}" for axis in AXES for stat in _DIVISION_STATS],
    "causal_null_mean",
    "consistency",
    "random_matching",
    "null_shuffled",
    "consistency_p",
]
"""Columns of :attr:`SweepSpecialization.summary`, one row per (task, n_heads): the graded
numbers of the verdict as seed mean and sample std (``_mean``, ``_std``; std NaN with one
seed). Counts and shares are separate columns, never mixed: ``n_relations`` (relations some
live head holds) and ``heads_per_relation`` (over the ``n_seeds_with_relation`` seeds that
have one) are counts; ``frac_*`` are shares of all heads (needed, backed up, redundant, dead,
labels that change with a threshold x 0.8 or x 1.25). ``division_{axis}_*`` per axis of the
division of labour: of the ``n_measured`` seeds where it was measured, the index's seed
``mean`` and ``std`` over the ``n_defined`` where it is defined (two or more heads do damage),
its label-permutation ``null`` (seed mean) and ``n_beyond``, the seeds whose index beats its
null (the verdict's "divided"). ``accuracy`` is the sweep's ``val_accuracy`` when
known; the consistency columns are NaN with fewer than 2 seeds."""


@dataclass
class SweepSpecialization:
    """What :func:`sweep_specialization` returns.

    Attributes:
        runs: One row per run (:data:`~mhainterp.specialization.battery.RUN_COLUMNS` plus
            ``run_dir`` and ``val_accuracy``).
        summary: One row per (task, n_heads), columns :data:`SUMMARY_COLUMNS`.
        result: The stacked :class:`~mhainterp.specialization.battery.SpecializationResult`.
        notes: Findings generated from the numbers, one per task (+ caveats).
    """

    runs: pd.DataFrame
    summary: pd.DataFrame
    result: SpecializationResult
    notes: list[str]

    def to_markdown(self) -> str:
        """The summary table per task, then the notes."""
        parts = []
        for task, group in self.summary.groupby("task", sort=False):
            parts += [f"#### {task}", "", markdown_table(display_summary(group)), ""]
        parts += [f"- {note}" for note in self.notes]
        return "\n".join(parts) + "\n"

    def save(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """Write ``specialization_runs.csv``, ``specialization_summary.csv``,
        ``specialization_consistency.csv``, ``specialization_summary.md``, the stacked result
        (``specialization_sweep*``, see :meth:`SpecializationResult.save`) and the notes
        (``specialization_notes.json``) to ``out_dir``: everything :meth:`load` reads back.
        The notes file is written last, so its presence means the set is complete."""
        out_dir = Path(out_dir)
        return [
            write_csv(out_dir / "specialization_runs.csv", self.runs),
            write_csv(out_dir / "specialization_summary.csv", self.summary),
            write_csv(out_dir / "specialization_consistency.csv", self.result.consistency),
            write_text(out_dir / "specialization_summary.md", self.to_markdown()),
            *self.result.save(out_dir, SWEEP_PREFIX),
            write_json(out_dir / NOTES_FILE, {"notes": self.notes}),
        ]

    @classmethod
    def load(cls, out_dir: str | os.PathLike[str]) -> SweepSpecialization:
        """Read back what :meth:`save` wrote (no computation).

        Raises:
            FileNotFoundError: If a file is missing, naming it and the command that writes it.
        """
        out_dir = Path(out_dir)
        for name in (NOTES_FILE, "specialization_runs.csv", "specialization_summary.csv"):
            if not (out_dir / name).is_file():
                raise FileNotFoundError(
                    f"{out_dir / name} is missing: the specialization test has not been saved "
                    f"for this sweep; run `mhainterp specialize {out_dir}`"
                )
        result = SpecializationResult.load(out_dir, SWEEP_PREFIX)
        runs = pd.read_csv(out_dir / "specialization_runs.csv")
        summary = pd.read_csv(out_dir / "specialization_summary.csv")
        return cls(runs, summary, result, list(read_json(out_dir / NOTES_FILE)["notes"]))


def display_summary(group: pd.DataFrame) -> pd.DataFrame:
    """:data:`SUMMARY_COLUMNS` rows formatted for reading: ``mean ± std`` strings, the counts
    first and labelled as counts, then the shares, then one column per measured division axis
    (``index ± std vs null (seeds beyond it / seeds)``).

    Example:
        >>> display_summary(spec.summary)  # doctest: +SKIP
    """

    def pm(name: str) -> list[str]:
        mean, std = group[f"{name}_mean"], group[f"{name}_std"]
        return [_fmt(m, s) for m, s in zip(mean, std, strict=True)]

    table: dict[str, Any] = {
        "h": group["n_heads"],
        "seeds": group["n_seeds"],
        "accuracy": pm("accuracy"),
        "relations covered (count)": pm("n_relations"),
        "heads per relation (count)": pm("heads_per_relation"),
        "needed (share)": pm("frac_needed"),
        "backed up (share)": pm("frac_backed_up"),
        "redundant (share)": pm("frac_redundant"),
        "dead (share)": pm("frac_dead"),
        "labels that flip (share)": pm("frac_label_flips"),
    }
    for axis in AXES:
        if not (group[f"division_{axis}_n_measured"] > 0).any():
            continue  # not measured at any h: no column
        table[f"division by {axis}"] = [_division_cell(row, axis) for _, row in group.iterrows()]
    if group["causal_selectivity_mean"].notna().any():
        table["causal selectivity"] = pm("causal_selectivity")
        table["selectivity null"] = group["causal_null_mean"].map(lambda v: f"{v:.2f}")
    table.update(
        {
            "consistency": group["consistency"],
            "random matching": group["random_matching"],
            "consistency p": group["consistency_p"],
        }
    )
    return pd.DataFrame(table)


def _division_cell(row: pd.Series, axis: str) -> str:
    """``0.25 ± 0.06 vs 0.00 (3/3 beyond)``, or why there is no index."""
    d = {stat: row[f"division_{axis}_{stat}"] for stat in _DIVISION_STATS}
    if not d["n_measured"]:
        return "not measured"
    if not d["n_defined"]:
        return "undefined (< 2 heads do damage)"
    return (
        f"{_fmt(d['mean'], d['std'])} vs {d['null']:.2f} "
        f"({int(d['n_beyond'])}/{int(d['n_measured'])} beyond)"
    )


def _fmt(mean: float, std: float) -> str:
    """``0.25 ± 0.06``; the mean alone when the std is undefined; empty when no mean."""
    if math.isnan(mean):
        return ""
    return f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"


def cached_specialization(
    run_dir: str | os.PathLike[str],
    settings: SpecializationSettings,
    *,
    reuse: bool = True,
    save: bool = True,
    progress: bool = False,
) -> SpecializationResult:
    """One run's result: read from ``run_dir/analysis/`` when saved with the same settings,
    else computed (and saved there when ``save``).

    Example:
        >>> result = cached_specialization("runs/rev/runs/h4_seed0",
        ...                                SpecializationSettings())  # doctest: +SKIP
    """
    set_aside_stale_analysis(run_dir)  # results of other weights are not reused
    saved = saved_specialization(run_dir, settings) if reuse else None
    result = saved or specialization_test(run_dir, settings=settings, progress=progress)
    # Whom the heads serve enters the verdict when the run's division of labour is saved:
    # "specialized" then means dividing the work, along the axes whose index beats its null.
    division = saved_division(run_dir)
    attach = division is not None and not _same_division(result, division.index)
    if attach:
        result = attach_division(result, division.index)
    if save and (saved is None or attach):
        result.save(Path(run_dir) / "analysis", RESULT_PREFIX)
    return result


def _same_division(result: SpecializationResult, index: pd.DataFrame) -> bool:
    """Whether ``result`` already carries these division indices."""
    have = result.division
    if have is None or have.empty:
        return False
    columns = ["by", "index", "null_index", "p"]
    mine = have[columns].reset_index(drop=True)
    theirs = index[columns].reset_index(drop=True)
    return mine.shape == theirs.shape and bool(
        ((mine == theirs) | (mine.isna() & theirs.isna())).all().all()
    )


def saved_specialization(
    run_dir: str | os.PathLike[str], settings: SpecializationSettings | None = None
) -> SpecializationResult | None:
    """One run's saved result (``run_dir/analysis/specialization*``), or None when there is
    none, it is incomplete, or it was made with other ``settings`` (None: any settings).

    Example:
        >>> saved_specialization("runs/rev/runs/h4_seed0") is None  # doctest: +SKIP
        False
    """
    analysis = Path(run_dir) / "analysis"
    meta_path = analysis / f"{RESULT_PREFIX}.json"
    if not meta_path.is_file():
        return None
    meta = read_saved_meta(meta_path, ("settings", "verdict"))
    if not analysis_is_current(run_dir, meta):  # computed from other weights
        return None
    saved = meta["settings"]
    # A result saved before a table was added lacks its file: it does not count as saved.
    complete = all(
        (analysis / f"{RESULT_PREFIX}_{name}.csv").is_file() for name in SpecializationResult.TABLES
    )
    if not complete or (settings is not None and saved != settings.to_dict()):
        return None
    result = SpecializationResult.load(analysis, RESULT_PREFIX)
    # Likewise a runs table saved before a column was added: recompute rather than guess.
    return result if set(RUN_COLUMNS) <= set(result.runs.columns) else None


def _renamed(result: SpecializationResult, run_id: str) -> SpecializationResult:
    """The same result with its (single) run called ``run_id`` everywhere."""
    tables = {}
    for name in (*SpecializationResult.TABLES, *SpecializationResult.OPTIONAL_TABLES):
        table = getattr(result, name).copy()
        if "run" in table.columns:
            table["run"] = run_id
        tables[name] = table
    for verdict in result.verdict.runs:
        verdict.run = run_id
    return SpecializationResult(**tables, verdict=result.verdict, settings=result.settings)


def _load_results(sweeps: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    frames = []
    for sweep in sweeps:
        frame = read_results(sweep)
        frame.insert(0, "sweep", Path(sweep).name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def sweep_specialization(
    sweep: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    settings: SpecializationSettings | None = None,
    *,
    reuse: bool = True,
    save: bool = True,
    progress: bool = True,
    **overrides: Any,
) -> SweepSpecialization:
    """Specialization, redundancy and accuracy against head count, over seeds.

    Args:
        sweep: A sweep folder (with ``results.csv``) or several.
        settings: :class:`SpecializationSettings` (``**overrides`` replace fields).
        reuse: Reuse a run's saved result made with the same settings.
        save: Save each newly computed run result under its ``analysis/`` folder.
        progress: tqdm bar over runs.
        **overrides: Settings fields.

    Returns:
        A :class:`SweepSpecialization`.

    Example:
        >>> spec = sweep_specialization("runs/quickstart/count_previous")  # doctest: +SKIP
        >>> print(spec.to_markdown())  # doctest: +SKIP
    """
    settings = _with_overrides(settings, overrides)
    sweeps = [sweep] if isinstance(sweep, (str, os.PathLike)) else list(sweep)
    results = _load_results(sweeps)
    singles, ids = [], []
    rows = list(results.itertuples(index=False))
    for row in tqdm(rows, desc="specialization", disable=not progress):
        run_id = f"{row.sweep}/{Path(row.run_dir).name}"
        single = cached_specialization(row.run_dir, settings, reuse=reuse, save=save)
        singles.append(_renamed(single, run_id))
        ids.append(run_id)
    combined = combine_results(singles) if len(singles) > 1 else singles[0]
    runs = combined.runs.copy()
    runs["run_dir"] = [str(r.run_dir) for r in rows]
    runs["val_accuracy"] = results["val_accuracy"].to_numpy()
    summary = specialization_summary(runs, combined.verdict.consistency, combined.division)
    return SweepSpecialization(runs, summary, combined, _notes(summary, runs))


def report_kind(path: str | os.PathLike[str]) -> str:
    """``"run"``, ``"sweep"`` or ``"sweeps"`` (a folder of sweep folders).

    Raises:
        FileNotFoundError: If ``path`` is none of these.

    Example:
        >>> report_kind("runs/quickstart")  # doctest: +SKIP
        'sweeps'
    """
    kind = folder_kind(path)
    return "sweeps" if kind == "study" else kind


def specialize_folder(
    path: str | os.PathLike[str],
    settings: SpecializationSettings | None = None,
    *,
    reuse: bool = True,
    progress: bool = True,
    by: Sequence[str] | str = AXES,
    **overrides: Any,
) -> list[tuple[Path, SpecializationResult | SweepSpecialization]]:
    """Compute and save every specialization result a report of ``path`` reads.

    A run folder gets its ``analysis/specialization*`` (:func:`cached_specialization`); a sweep
    folder, or each sweep of a folder of sweeps, gets its runs' results and the sweep-level
    tables (:func:`sweep_specialization`, then :meth:`SweepSpecialization.save`). Results saved
    with the same settings are reused. :func:`mhainterp.report.write_report` then only reads.

    Args:
        path: A run folder, a sweep folder or a folder of sweep folders.
        settings: :class:`SpecializationSettings` (``**overrides`` replace fields).
        reuse: Reuse a run's saved result made with the same settings.
        progress: tqdm bars.
        by: Axes of the division of labour saved for every run (:func:`division_folder`);
            empty: none.
        **overrides: Settings fields.

    Returns:
        ``(folder, result)`` per run or sweep: a SpecializationResult for a run folder, a
        SweepSpecialization per sweep.

    Example:
        >>> specialize_folder("runs/quickstart")  # doctest: +SKIP
    """
    settings = _with_overrides(settings, overrides)
    path = Path(path)
    kind = report_kind(path)
    if by:
        division_folder(path, settings, by=by, reuse=reuse, progress=progress)
    if kind == "run":
        return [(path, cached_specialization(path, settings, reuse=reuse, progress=progress))]
    out: list[tuple[Path, SpecializationResult | SweepSpecialization]] = []
    for sweep in [path] if kind == "sweep" else sweep_folders(path):
        spec = sweep_specialization(sweep, settings, reuse=reuse, progress=progress)
        spec.save(sweep)
        out.append((sweep, spec))
    return out


def division_folder(
    path: str | os.PathLike[str],
    settings: SpecializationSettings | None = None,
    *,
    by: Sequence[str] | str = AXES,
    reuse: bool = True,
    progress: bool = True,
) -> list[tuple[Path, DivisionResult]]:
    """:func:`~mhainterp.specialization.whom.division.division_of_labour` of every run of a run,
    sweep or sweeps folder, saved as ``analysis/division_*`` per run (reused when made with
    the same thresholds and axes), and per sweep the runs' index tables stacked into
    ``division_sweep.csv`` (``task, n_heads, seed, run`` + the index columns).

    Example:
        >>> for run_dir, result in division_folder("runs/quickstart"):  # doctest: +SKIP
        ...     print(run_dir.name, result.summary_line())
    """
    path = Path(path)
    kind = report_kind(path)
    request = division_request(settings, by)
    if kind == "run":
        return [(path, _cached_division(path, settings, request, reuse, progress))]
    out = []
    for sweep in [path] if kind == "sweep" else sweep_folders(path):
        results = read_results(sweep)
        frames = []
        for row in tqdm(
            list(results.itertuples(index=False)), desc="division", disable=not progress
        ):
            run_dir = Path(row.run_dir)
            result = _cached_division(run_dir, settings, request, reuse, False)
            meta = {"task": row.task, "n_heads": row.n_heads, "seed": row.seed, "run": run_dir.name}
            frames.append(result.index.assign(**meta)[[*meta, *result.index.columns]])
            out.append((run_dir, result))
        if frames:
            write_csv(sweep / "division_sweep.csv", pd.concat(frames, ignore_index=True))
    return out


def _cached_division(
    run_dir: Path,
    settings: SpecializationSettings | None,
    request: dict[str, Any],
    reuse: bool,
    progress: bool,
) -> DivisionResult:
    set_aside_stale_analysis(run_dir)  # results of other weights are not reused
    saved = saved_division(run_dir, request) if reuse else None
    if saved is not None:
        return saved
    run = load_run(run_dir)
    result = division_of_labour(
        run.model, run.task, request["by_asked"], settings=settings, progress=progress
    )
    result.save(run_dir / "analysis")
    record_analysis_source(run_dir)
    return result


def _with_overrides(
    settings: SpecializationSettings | None, overrides: dict[str, Any]
) -> SpecializationSettings:
    settings = settings or SpecializationSettings()
    if overrides:
        settings = SpecializationSettings.from_dict({**settings.to_dict(), **overrides})
    return settings


def specialization_summary(
    runs: pd.DataFrame,
    consistency: dict[str, dict[str, float]] | None = None,
    division: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per (task, n_heads): the verdict's graded numbers over seeds (:data:`SUMMARY_COLUMNS`).

    Args:
        runs: The per-run table (:data:`~mhainterp.specialization.battery.RUN_COLUMNS`; with
            ``val_accuracy`` or ``accuracy``). Columns it lacks are NaN in the summary.
        consistency: ``"task/h"`` -> consistency summary (from the combined verdict).
        division: The division indices per run and axis (``run, by, index, null_index``, as
            :attr:`SpecializationResult.division`); the ``run`` names match ``runs``. Whether
            a run is beyond the null is read from its ``specialized_along``.

    Example:
        >>> runs = pd.DataFrame({"run": ["a", "b"], "task": ["t", "t"], "n_heads": [2, 2],
        ...     "n_relations": [1, 2], "frac_redundant": [0.0, 0.5], "accuracy": [0.9, 0.8],
        ...     "specialized_along": ["token", ""]})
        >>> division = pd.DataFrame({"run": ["a", "b"], "by": ["token"] * 2,
        ...     "index": [0.3, 0.1], "null_index": [0.0, 0.02]})
        >>> row = specialization_summary(runs, division=division).iloc[0]
        >>> [float(row[c]) for c in ("n_relations_mean", "frac_redundant_mean",
        ...                          "division_token_mean")]
        [1.5, 0.25, 0.2]
        >>> [int(row["division_token_n_defined"]), int(row["division_token_n_beyond"])]
        [2, 1]
    """
    consistency = consistency or {}
    runs = runs.copy()
    if "val_accuracy" in runs.columns:
        runs["accuracy"] = runs["val_accuracy"]
    for column, _ in _GRADED:
        if column not in runs.columns:
            runs[column] = math.nan
    division = division if division is not None and len(division) else None
    rows = []
    for (task, h), group in runs.groupby(["task", "n_heads"], sort=False):
        summary = consistency.get(group_key(task, int(h)), {})
        row: dict[str, Any] = {"task": task, "n_heads": int(h), "n_seeds": len(group)}
        for column, name in _GRADED:
            stats = describe(group[column].dropna())
            row[f"{name}_mean"], row[f"{name}_std"] = stats["mean"], stats["std"]
        row["n_seeds_with_relation"] = int((group["n_relations"].fillna(0) > 0).sum())
        row.update(_division_summary(group, division))
        row["causal_null_mean"] = (
            float(group["causal_null"].mean()) if "causal_null" in group else math.nan
        )
        row["consistency"] = summary.get("consistency", math.nan)
        row["random_matching"] = summary.get("random_matching", math.nan)
        row["null_shuffled"] = summary.get("null_shuffled", math.nan)
        row["consistency_p"] = summary.get("p_value", math.nan)
        rows.append(row)
    table = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return table.sort_values(["task", "n_heads"], kind="stable", ignore_index=True)


def _division_summary(group: pd.DataFrame, division: pd.DataFrame | None) -> dict[str, float]:
    """``division_{axis}_{mean,std,null,n,beyond}`` of one (task, h) group of runs."""
    out: dict[str, float] = {}
    mine = None if division is None else division[division["run"].isin(group["run"])]
    along = group.get("specialized_along", pd.Series([""] * len(group))).fillna("").astype(str)
    for axis in AXES:
        rows = pd.DataFrame() if mine is None else mine[mine["by"] == axis]
        index = rows["index"].dropna() if len(rows) else pd.Series(dtype=float)
        stats = describe(index)
        out[f"division_{axis}_mean"], out[f"division_{axis}_std"] = stats["mean"], stats["std"]
        null = rows["null_index"].dropna() if len(rows) else pd.Series(dtype=float)
        out[f"division_{axis}_null"] = float(null.mean()) if len(null) else math.nan
        out[f"division_{axis}_n_measured"] = int(rows["run"].nunique()) if len(rows) else 0
        out[f"division_{axis}_n_defined"] = len(index)
        out[f"division_{axis}_n_beyond"] = int(sum(axis in a.split(",") for a in along))
    return out


def _trend(summary: pd.DataFrame, column: str, label: str) -> str | None:
    """A trend line over the head counts where ``column`` is defined, e.g. "redundant share
    0.00 (h=1) -> 0.50 ± 0.10 (h=8) — beyond the seed spread"; None with fewer than two."""
    defined = summary[summary[f"{column}_mean"].notna()]
    if len(defined) < 2:
        return None
    first, last = defined.iloc[0], defined.iloc[-1]
    mean_a, std_a = first[f"{column}_mean"], first[f"{column}_std"]
    mean_b, std_b = last[f"{column}_mean"], last[f"{column}_std"]
    text = (
        f"{label} {_fmt(mean_a, std_a)} (h={first['n_heads']}) -> {_fmt(mean_b, std_b)} "
        f"(h={last['n_heads']})"
    )
    rule = exceeds_seed_spread(mean_a, std_a, mean_b, std_b)
    if rule is None:
        return text + " (too few seeds to compare)"
    return text + (" — beyond the seed spread" if rule else " — within the seed spread")


_TRENDS = (
    ("n_relations", "relations covered (a count)"),
    ("heads_per_relation", "heads per relation (a count)"),
    ("frac_backed_up", "backed-up share"),
    ("frac_redundant", "redundant share"),
    ("frac_dead", "dead share"),
    ("accuracy", "accuracy"),
    ("causal_selectivity", "causal selectivity"),
)


def _notes(summary: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    notes = []
    for task, group in summary.groupby("task", sort=False):
        if len(group) < 2:
            notes.append(f"{task}: a single head count (h={group['n_heads'].iloc[0]}); no trend.")
            continue
        parts = [_trend(group, column, label) for column, label in _TRENDS]
        parts += [_trend(group, f"division_{axis}", f"division index by {axis}") for axis in AXES]
        notes.append(f"{task}: " + "; ".join(p for p in parts if p) + ".")
        for axis in AXES:
            measured = group[group[f"division_{axis}_n_measured"] > 0]
            if len(measured):
                per_h = ", ".join(
                    f"{int(r[f'division_{axis}_n_beyond'])}/{int(r[f'division_{axis}_n_measured'])}"
                    f" seeds at h={r['n_heads']}"
                    for _, r in measured.iterrows()
                )
                notes.append(f"{task}: division index by {axis} beyond its null in {per_h}.")
        with_consistency = group.dropna(subset=["consistency"])
        for row in with_consistency.itertuples(index=False):
            notes.append(
                f"{task}, h={row.n_heads}: role profiles match across {row.n_seeds} seeds at "
                f"{row.consistency:.2f} vs {row.random_matching:.2f} for a random matching "
                f"and {row.null_shuffled:.2f} for role-shuffled profiles (p = "
                f"{row.consistency_p:.2g})."
            )
    n = runs.groupby(["task", "n_heads"]).size()
    seeds = str(n.min()) if n.min() == n.max() else f"{n.min()}-{n.max()}"
    notes.append(
        f"Seeds per head count: {seeds}. '±' is the sample std over seeds; a change counts only "
        "when the mean ± std bars of the two head counts do not overlap. Counts (relations "
        "covered, heads per relation) and shares (of all heads) are reported apart."
    )
    return notes
