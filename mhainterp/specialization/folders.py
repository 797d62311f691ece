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

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from mhainterp.errors import OutdatedResultError
from mhainterp.io import FileSet, read_json, write_csv
from mhainterp.provenance import (
    analysis_is_current,
    record_analysis_source,
    set_aside_stale_analysis,
)
from mhainterp.render import markdown_table
from mhainterp.runs import (
    find_runs,
    folder_kind,
    migrate_settings,
    read_result_table,
    read_results,
    read_saved_meta,
    sweep_folders,
)
from mhainterp.runtime import uses_work_threads
from mhainterp.specialization.battery import specialization_test
from mhainterp.specialization.seeds.combine import (
    FLAG_EVIDENCE,
    attach_division,
    combine_results,
)
from mhainterp.specialization.seeds.summary import (
    answers,
    display_summary,
    head_count_comparisons,
    specialization_summary,
    summary_columns,
    summary_notes,
)
from mhainterp.specialization.settings import DivisionSettings, SpecializationSettings
from mhainterp.specialization.verdict.result import RUN_COLUMNS, SpecializationResult
from mhainterp.specialization.verdict.stability import DIVISION_THRESHOLD
from mhainterp.specialization.whom.division import division_of_labour, division_request
from mhainterp.specialization.whom.division_result import DivisionResult, saved_division
from mhainterp.sweep.compare import HEAD_COUNT_COLUMNS
from mhainterp.sweep.summary import summarize
from mhainterp.tasks import AXES
from mhainterp.training import Run, load_run

__all__ = [
    "SweepSpecialization",
    "cached_specialization",
    "division_folder",
    "saved_folder_settings",
    "saved_specialization",
    "specialize_folder",
    "sweep_specialization",
]

RESULT_PREFIX = "specialization"
"""File prefix of a run's saved result in its ``analysis/`` folder."""
SWEEP_PREFIX = "specialization_sweep"
"""File prefix of a sweep's stacked result in the sweep folder."""
NOTES_FILE = "specialization_notes.json"
COMPARISONS_FILE = "specialization_comparisons.csv"

LoadRun = Callable[[str | os.PathLike[str]], Run]
"""How a run folder is loaded here: :func:`~mhainterp.training.load_run`, or
:func:`_loading_once`'s."""


def _loading_once() -> LoadRun:
    """``load_run`` that loads each run folder once and keeps it: :func:`specialize_folder`
    computes a run's division of labour and its labels from one load. The runs are held until
    the loader is let go (one per sweep: a sweep's models are small beside its analyses)."""
    loaded: dict[Path, Run] = {}

    def load(run_dir: str | os.PathLike[str]) -> Run:
        key = Path(run_dir)
        if key not in loaded:
            loaded[key] = load_run(key)
        return loaded[key]

    return load


@dataclass
class SweepSpecialization:
    """What :func:`sweep_specialization` returns.

    Attributes:
        runs: One row per run (:data:`~mhainterp.specialization.verdict.result.RUN_COLUMNS` plus
            ``run_dir``, relative to the first sweep folder, and ``val_accuracy``).
        summary: One row per (task, n_heads), columns
            :func:`~mhainterp.specialization.seeds.summary.summary_columns`.
        result: The stacked :class:`~mhainterp.specialization.battery.SpecializationResult`.
        notes: The evidence behind the answers in words, generated from the numbers
            (:func:`~.seeds.summary.summary_notes`).
        comparisons: The head-count comparisons behind the answers
            (:func:`~.seeds.summary.head_count_comparisons`, columns
            :data:`mhainterp.sweep.compare.HEAD_COUNT_COLUMNS`).
    """

    runs: pd.DataFrame
    summary: pd.DataFrame
    result: SpecializationResult
    notes: list[str]
    comparisons: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    answers: dict[str, str] = dataclasses.field(default_factory=dict)
    """Per task compared over head counts, the one-line answer
    (:func:`~.seeds.summary.answers`): what the Findings and the terminal lead with."""

    def to_markdown(self) -> str:
        """The answers, the summary table per task, then the notes."""
        parts = [f"- {line}" for line in self.answers.values()] + ([""] if self.answers else [])
        for task, group in self.summary.groupby("task", sort=False):
            parts += [f"## {task}", ""]
            for caption, table in display_summary(group, self.result.settings.alpha):
                parts += [f"*{caption}*", "", markdown_table(table), ""]
        parts += [f"- {note}" for note in self.notes]
        return "\n".join(parts) + "\n"

    def save(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """Write ``specialization_runs.csv``, ``specialization_summary.csv``,
        ``specialization_comparisons.csv``, ``specialization_summary.md``, the stacked result
        (``specialization_sweep*``, see :meth:`SpecializationResult.save`) and the notes
        (``specialization_notes.json``) to ``out_dir``: everything :meth:`load` reads back.
        The notes file is written last, so its presence means the set is complete."""
        out_dir = Path(out_dir)
        files = FileSet(out_dir / NOTES_FILE)  # a killed save reads as not saved
        return [
            files.write_csv(out_dir / "specialization_runs.csv", self.runs),
            files.write_csv(out_dir / "specialization_summary.csv", self.summary),
            files.write_csv(out_dir / "specialization_comparisons.csv", self.comparisons),
            files.write_text(out_dir / "specialization_summary.md", self.to_markdown()),
            *self.result.save(out_dir, SWEEP_PREFIX, files=files),
            files.finish({"notes": self.notes, "answers": self.answers}),
        ]

    @classmethod
    def load(cls, out_dir: str | os.PathLike[str]) -> SweepSpecialization:
        """Read back what :meth:`save` wrote (no computation).

        Raises:
            FileNotFoundError: If a file is missing, naming it and the command that writes it.
            OutdatedResultError: If a table lacks a column this version writes (an older
                mhainterp saved it; :func:`sweep_specialization` recomputes it).
            RunFolderError: If a file is damaged, naming it.
        """
        out_dir = Path(out_dir)
        names = ("specialization_runs.csv", "specialization_summary.csv", COMPARISONS_FILE)
        for name in (NOTES_FILE, *names):
            if not (out_dir / name).is_file():
                raise FileNotFoundError(
                    f"{out_dir / name} is missing: the specialization test has not been saved "
                    f"for this sweep; run `mhainterp specialize {out_dir}`"
                )
        result = SpecializationResult.load(out_dir, SWEEP_PREFIX)
        runs = read_result_table(out_dir / "specialization_runs.csv", RUN_COLUMNS)
        bases = [f"division_{axis}_basis" for axis in AXES]  # "" (no basis) reads as NaN
        summary = read_result_table(
            out_dir / "specialization_summary.csv", summary_columns(), text=bases
        )
        comparisons = read_result_table(out_dir / COMPARISONS_FILE, HEAD_COUNT_COLUMNS)
        # True / False, None where not tested
        comparisons["beyond"] = comparisons["beyond"].map(
            lambda v: None if pd.isna(v) else str(v) == "True"
        )
        saved = read_json(out_dir / NOTES_FILE)
        if "answers" not in saved:
            raise OutdatedResultError(
                f"{out_dir / NOTES_FILE} has no one-line answers: an older mhainterp saved it; "
                f"run `mhainterp specialize {out_dir}` to recompute it"
            )
        return cls(runs, summary, result, list(saved["notes"]), comparisons, saved["answers"])


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
    return _cached_specialization(run_dir, settings, reuse, save, progress, load_run)


def _cached_specialization(
    run_dir: str | os.PathLike[str],
    settings: SpecializationSettings,
    reuse: bool,
    save: bool,
    progress: bool,
    load: LoadRun,
) -> SpecializationResult:
    """:func:`cached_specialization`, loading the run (when not saved) with ``load``."""
    set_aside_stale_analysis(run_dir)  # results of other weights are not reused
    saved = saved_specialization(run_dir, settings) if reuse else None
    result = saved or specialization_test(load(run_dir), settings=settings, progress=progress)
    # Whom the heads serve enters the verdict when the run's division of labour is saved:
    # "specialized" then means dividing the work, along the axes whose index beats its null.
    division = saved_division(run_dir)
    attach = division is not None and _needs_division(result, division)
    if attach:
        result = attach_division(result, division)
    if save and (saved is None or attach):
        result.save(Path(run_dir) / "analysis", RESULT_PREFIX)
    return result


def _needs_division(result: SpecializationResult, division: DivisionResult) -> bool:
    """Whether the saved division must be (re)attached: other indices, head findings that
    do not yet say whom each head serves, or a stability table without the division's gate
    (saved before it was, from a division that has the flags' evidence)."""
    finding = result.heads.get("finding", pd.Series(dtype=str)).fillna("").astype(str)
    unmeasured = finding.str.contains("not measured").any() or not len(finding)
    thresholds = set(result.stability.get("threshold", pd.Series(dtype=str)))
    movable = set(division.heads.columns) >= FLAG_EVIDENCE and len(result.stability) > 0
    unmoved = movable and DIVISION_THRESHOLD not in thresholds
    return unmeasured or unmoved or not _same_division(result, division.index)


def _same_division(result: SpecializationResult, index: pd.DataFrame) -> bool:
    """Whether ``result`` already carries these division indices."""
    have = result.division
    if have is None or have.empty:
        return False
    columns = ["by", "index", "null_index", "p"]
    columns += [c for c in ("call", "basis") if c in index.columns]  # the calibrated call too
    if not set(columns) <= set(have.columns):
        return False
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
    if settings is not None and migrate_settings(meta["settings"]) != settings.to_dict():
        return None
    try:
        return SpecializationResult.load(analysis, RESULT_PREFIX)
    except (FileNotFoundError, OutdatedResultError):  # saved in part, or by an older version
        return None


def saved_folder_settings(
    path: str | os.PathLike[str],
) -> tuple[SpecializationSettings, DivisionSettings | None] | None:
    """The settings every run under ``path`` was labelled with, and divided with (None: no
    run divided), when every run has a saved result and they all agree; else None.

    ``mhainterp report`` without settings options uses them, so that it reads what the demo
    or a study saved instead of recomputing it with the defaults (the demo labels on 256
    sequences and divides on 1,024; the defaults label on 1,024 too, so a report made with
    them would replace every run's labels).

    Example:
        >>> saved_folder_settings("runs/quickstart")[0].n_eval  # doctest: +SKIP
        256
    """
    labels: set[str] = set()
    divisions: set[str] = set()
    runs = find_runs(path)
    for run_dir in runs:
        analysis = Path(run_dir) / "analysis"
        label_meta = analysis / f"{RESULT_PREFIX}.json"
        if not label_meta.is_file():
            return None
        saved = migrate_settings(read_saved_meta(label_meta, ("settings",))["settings"])
        labels.add(json.dumps(saved, sort_keys=True))
        division_meta = analysis / "division.json"
        if division_meta.is_file():
            divided = read_saved_meta(division_meta, ("settings",))["settings"]
            known = DivisionSettings.from_dict(divided).to_dict()
            divisions.add(json.dumps(known, sort_keys=True))
    if not runs or len(labels) != 1 or len(divisions) > 1:
        return None
    settings = SpecializationSettings.from_dict(json.loads(labels.pop()))
    division = DivisionSettings.from_dict(json.loads(divisions.pop())) if divisions else None
    return settings, division


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


@uses_work_threads
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
    return _sweep_specialization(sweeps, settings, reuse, save, progress, load_run)


def _sweep_specialization(
    sweeps: list[str | os.PathLike[str]],
    settings: SpecializationSettings,
    reuse: bool,
    save: bool,
    progress: bool,
    load: LoadRun,
) -> SweepSpecialization:
    """:func:`sweep_specialization`, loading the runs (those not saved) with ``load``."""
    results = _load_results(sweeps)
    singles, ids = [], []
    rows = list(results.itertuples(index=False))
    for row in tqdm(rows, desc="specialization", disable=not progress):
        run_id = f"{row.sweep}/{Path(row.run_dir).name}"
        single = _cached_specialization(row.run_dir, settings, reuse, save, False, load)
        singles.append(_renamed(single, run_id))
        ids.append(run_id)
    combined = combine_results(singles) if len(singles) > 1 else singles[0]
    runs = combined.runs.copy()
    # Paths in a saved table are relative to the folder that holds it (the first sweep).
    home = Path(sweeps[0]).resolve()
    runs["run_dir"] = [
        Path(os.path.relpath(Path(r.run_dir).resolve(), home)).as_posix() for r in rows
    ]
    runs["val_accuracy"] = results["val_accuracy"].to_numpy()
    summary = specialization_summary(runs, combined.verdict.consistency, combined.division)
    comparisons = head_count_comparisons(runs, combined.division, alpha=settings.alpha)
    notes = summary_notes(summary, comparisons, alpha=settings.alpha)
    lines = answers(comparisons, alpha=settings.alpha)
    return SweepSpecialization(runs, summary, combined, notes, comparisons, lines)


@uses_work_threads
def specialize_folder(
    path: str | os.PathLike[str],
    settings: SpecializationSettings | None = None,
    *,
    reuse: bool = True,
    progress: bool = True,
    by: Sequence[str] | str = AXES,
    division_settings: SpecializationSettings | DivisionSettings | None = None,
    **overrides: Any,
) -> list[tuple[Path, SpecializationResult | SweepSpecialization]]:
    """Compute and save every specialization result a report of ``path`` reads.

    A run folder gets its ``analysis/specialization*`` (:func:`cached_specialization`); a sweep
    folder, or each sweep of a folder of sweeps, gets its seed table and comparisons
    (:func:`mhainterp.sweep.summarize`, saved), its runs' results and the sweep-level tables
    (:func:`sweep_specialization`, then :meth:`SweepSpecialization.save`). Results saved
    with the same settings are reused. :func:`mhainterp.report.write_report` then only reads.

    Args:
        path: A run folder, a sweep folder or a folder of sweep folders.
        settings: :class:`SpecializationSettings` (``**overrides`` replace fields).
        reuse: Reuse a run's saved result made with the same settings.
        progress: tqdm bars.
        by: Axes of the division of labour saved for every run (:func:`division_folder`);
            empty: none (a division saved before is attached).
        division_settings: The division's own settings when they differ from the labels'
            (the study divides on more sequences than it labels on); None: ``settings``.
        **overrides: Settings fields.

    Returns:
        ``(folder, result)`` per run or sweep: a SpecializationResult for a run folder, a
        SweepSpecialization per sweep.

    Example:
        >>> specialize_folder("runs/quickstart")  # doctest: +SKIP
    """
    settings = _with_overrides(settings, overrides)
    dividing = settings if division_settings is None else division_settings
    path = Path(path)
    kind = folder_kind(path)
    # Each run is loaded once for its division and its labels (those not saved), and its
    # model let go with its sweep's loader.
    if kind == "run":
        load = _loading_once()
        if by:
            _division_folder(path, dividing, by, reuse, progress, load)
        return [(path, _cached_specialization(path, settings, reuse, True, progress, load))]
    out: list[tuple[Path, SpecializationResult | SweepSpecialization]] = []
    for sweep in [path] if kind == "sweep" else sweep_folders(path):
        load = _loading_once()
        if by:
            _division_folder(sweep, dividing, by, reuse, progress, load)
        results = read_results(sweep)
        summarize(results, alpha=settings.alpha).save(sweep)  # the seed table the report reads
        spec = _sweep_specialization([sweep], settings, reuse, True, progress, load)
        spec.save(sweep)
        out.append((sweep, spec))
    return out


def division_folder(
    path: str | os.PathLike[str],
    settings: SpecializationSettings | DivisionSettings | None = None,
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
    return _division_folder(path, settings, by, reuse, progress, load_run)


def _division_folder(
    path: str | os.PathLike[str],
    settings: SpecializationSettings | DivisionSettings | None,
    by: Sequence[str] | str,
    reuse: bool,
    progress: bool,
    load: LoadRun,
) -> list[tuple[Path, DivisionResult]]:
    """:func:`division_folder`, loading the runs (those not saved) with ``load``."""
    path = Path(path)
    kind = folder_kind(path)
    request = division_request(settings, by)
    if kind == "run":
        return [(path, _cached_division(path, settings, request, reuse, progress, load))]
    out = []
    for sweep in [path] if kind == "sweep" else sweep_folders(path):
        results = read_results(sweep)
        frames = []
        for row in tqdm(
            list(results.itertuples(index=False)), desc="division", disable=not progress
        ):
            run_dir = Path(row.run_dir)
            result = _cached_division(run_dir, settings, request, reuse, False, load)
            meta = {"task": row.task, "n_heads": row.n_heads, "seed": row.seed, "run": run_dir.name}
            frames.append(result.index.assign(**meta)[[*meta, *result.index.columns]])
            out.append((run_dir, result))
        if frames:
            write_csv(sweep / "division_sweep.csv", pd.concat(frames, ignore_index=True))
    return out


def _cached_division(
    run_dir: Path,
    settings: SpecializationSettings | DivisionSettings | None,
    request: dict[str, Any],
    reuse: bool,
    progress: bool,
    load: LoadRun,
) -> DivisionResult:
    set_aside_stale_analysis(run_dir)  # results of other weights are not reused
    saved = saved_division(run_dir, request) if reuse else None
    if saved is not None:
        return saved
    run = load(run_dir)
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
