"""The figures of saved results: drawn by the step that computes the tables, read by the report.

:func:`save_folder_figures` draws, for a run, a sweep or a folder of sweeps, every figure that
:func:`mhainterp.report.write_report` embeds, from the tables that
:func:`~mhainterp.specialization.specialize_folder` and the sweep summary saved (each PNG beside
its CSV). ``mhainterp specialize``, ``mhainterp report`` and the demo call it right after
computing; the report then only embeds the PNGs, and names any that are missing.

Which figures a folder has is decided once, here, by the ``*_figures(..., draw=False)``
functions: the report asks them for the paths it should find, the saver for the paths to draw.

Example:
    >>> from mhainterp.specialization import specialize_folder
    >>> specialize_folder("runs/quickstart")  # doctest: +SKIP
    >>> paths = save_folder_figures("runs/quickstart")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from mhainterp.figures._common import save_figure
from mhainterp.figures.division import (
    PROFILE_FIGURE,
    SWEEP_FIGURE,
    division_vs_heads,
    save_division_figures,
)
from mhainterp.figures.headcount import plot_head_count_accuracy, plot_training_curves
from mhainterp.figures.specialization import (
    causal_matrix_figure,
    consistency_figure,
    role_heatmap,
    save_specialization_figures,
    specialization_figure_stems,
    specialization_vs_heads,
)
from mhainterp.provenance import analysis_is_current
from mhainterp.runs import folder_kind, read_results, sweep_folders
from mhainterp.specialization import SpecializationResult, saved_division, saved_specialization
from mhainterp.specialization.folders import SweepSpecialization
from mhainterp.specialization.whom.division_result import DivisionResult
from mhainterp.sweep import load_curves

__all__ = [
    "FIGURE_COMMAND",
    "example_runs",
    "OWN_FIGURES",
    "division_figures",
    "head_count_figures",
    "run_specialization_figures",
    "save_folder_figures",
    "saved_divisions",
    "sweep_specialization_figures",
]

FIGURE_COMMAND = "mhainterp specialize"
"""The command that computes the tables and draws these figures (``mhainterp report`` runs it)."""

OWN_FIGURES = ("role_scores", "causal_matrix", "consistency", "division_profiles")
"""Figure stems drawn here into a run's ``analysis/`` (not ``mhainterp analyze``'s figures)."""

HEAD_COUNT_FIGURES = ("head_count_accuracy.png", "training_curves.png")


def head_count_figures(
    results: pd.DataFrame, sweep_dir: str | os.PathLike[str], *, draw: bool = False
) -> list[Path]:
    """``head_count_accuracy.png`` and ``training_curves.png`` of a sweep; with ``draw``,
    drawn from ``results`` (``results.csv``) and the runs' ``metrics.csv`` where missing."""
    sweep_dir = Path(sweep_dir)
    accuracy, curves = (sweep_dir / name for name in HEAD_COUNT_FIGURES)
    if draw and not accuracy.is_file():
        data = results.drop(columns=["run_dir"], errors="ignore")
        save_figure(plot_head_count_accuracy(results), accuracy, data)
    if draw and not curves.is_file():
        table = load_curves(results)
        save_figure(plot_training_curves(table), curves, table)
    return [accuracy, curves]


def run_specialization_figures(
    result: SpecializationResult, analysis_dir: str | os.PathLike[str], *, draw: bool = False
) -> list[Path]:
    """A run's role scores, head x target damage and consistency figures (those that apply to
    ``result``) in ``analysis_dir``; drawn with ``draw``."""
    if draw:
        return save_specialization_figures(result, analysis_dir)
    return [Path(analysis_dir) / f"{stem}.png" for stem in specialization_figure_stems(result)]


def example_runs(runs: pd.DataFrame) -> list[str]:
    """Per head count (ascending), the run a sweep's figures show as its example: the one
    whose heads hold the most of the task's relations (``n_relations``), ties going to the
    lowest seed; a table without that column gives the first seed.

    The first seed was shown whatever it held: in an induction sweep, the one seed of three
    without an induction head illustrated the claim that the heads hold previous-token and
    induction roles.

    Example:
        >>> runs = pd.DataFrame({"run": ["h2_seed0", "h2_seed1", "h2_seed2"], "n_heads": 2,
        ...                      "seed": [0, 1, 2], "n_relations": [1, 2, 2]})
        >>> example_runs(runs)
        ['h2_seed1']
    """
    covered = runs["n_relations"].fillna(0) if "n_relations" in runs else 0
    ranked = runs.assign(_covered=covered).sort_values(
        ["n_heads", "_covered", "seed"], ascending=[True, False, True], kind="stable"
    )
    return ranked.groupby("n_heads", sort=True).head(1)["run"].tolist()


def sweep_specialization_figures(
    spec: SweepSpecialization, sweep_dir: str | os.PathLike[str], *, draw: bool = False
) -> list[Path]:
    """A sweep's specialization figures in ``sweep_dir``: ``specialization_vs_heads``,
    ``consistency`` (when the sweep has run pairs), ``role_scores`` and ``causal_matrix``
    (several targets) of the :func:`example_runs` of each head count; drawn with ``draw``."""
    sweep_dir = Path(sweep_dir)
    result = spec.result
    examples = example_runs(spec.runs)
    roles = result.roles[result.roles["run"].isin(examples)]
    causal = result.causal[result.causal["run"].isin(examples)]
    planned = [("specialization_vs_heads", lambda: specialization_vs_heads(spec.runs), spec.runs)]
    if len(result.consistency):
        table = result.consistency
        planned.append(("consistency", lambda: consistency_figure(table), table))
    alpha, n_runs = result.settings.alpha, len(examples)
    planned.append(
        ("role_scores", lambda: role_heatmap(roles, alpha=alpha, max_runs=n_runs), roles)
    )
    if len(causal) and causal["target"].nunique() > 1:
        planned.append(
            ("causal_matrix", lambda: causal_matrix_figure(causal, max_runs=n_runs), causal)
        )
    paths = []
    for stem, figure, data in planned:
        path = sweep_dir / f"{stem}.png"
        if draw:
            save_figure(figure(), path, data)
        paths.append(path)
    return paths


def saved_divisions(run_dirs: list[Path]) -> list[tuple[Path, DivisionResult]]:
    """The runs' saved division of labour results (current ones only), in order."""
    return [
        (d, r) for d in run_dirs if analysis_is_current(d) and (r := saved_division(d)) is not None
    ]


def _analysed(run_dir: Path) -> bool:
    """Whether ``mhainterp analyze`` wrote figures into the run's ``analysis/`` folder."""
    return any(p.stem not in OWN_FIGURES for p in (run_dir / "analysis").glob("*.png"))


def division_figures(
    saved: list[tuple[Path, DivisionResult]],
    sweep_dir: str | os.PathLike[str] | None = None,
    *,
    draw: bool = False,
) -> list[Path]:
    """Division figures of saved results (:func:`saved_divisions`): for a sweep, the index vs
    h (``division_sweep.png``, from ``division_sweep.csv``) and the head x value heatmap of
    its analysed runs (else of its last run: one per run would be 9+ per sweep); for a run
    (``sweep_dir`` None), its heatmap. Drawn with ``draw``.
    """
    paths: list[Path] = []
    if sweep_dir is not None and (Path(sweep_dir) / "division_sweep.csv").is_file():
        path = Path(sweep_dir) / SWEEP_FIGURE
        if draw:
            table = pd.read_csv(Path(sweep_dir) / "division_sweep.csv")
            save_figure(division_vs_heads(table), path)
        paths.append(path)
    shown = saved
    if sweep_dir is not None:
        shown = [(d, r) for d, r in saved if _analysed(d)] or saved[-1:]
    for run_dir, result in shown:
        if draw:
            paths += save_division_figures(result, run_dir / "analysis")
        elif len(result.profiles):
            paths.append(run_dir / "analysis" / PROFILE_FIGURE)
    return paths


def _sweep(sweep_dir: Path) -> list[Path]:
    results = read_results(sweep_dir)
    paths = head_count_figures(results, sweep_dir, draw=True)
    try:
        spec = SweepSpecialization.load(sweep_dir)
    except FileNotFoundError:
        spec = None
    if spec is not None:
        paths += sweep_specialization_figures(spec, sweep_dir, draw=True)
    run_dirs = [Path(r) for r in results["run_dir"]]
    return paths + division_figures(_shown_divisions(run_dirs), sweep_dir, draw=True)


def _shown_divisions(run_dirs: list[Path]) -> list[tuple[Path, DivisionResult]]:
    """The saved divisions :func:`division_figures` draws for a sweep, loading only those:
    the analysed runs' (current ones), else the last run's that is saved. The same choice
    as from :func:`saved_divisions` of every run, without reading every run's tables (the
    demo's figures read 36 runs' divisions to draw 2)."""
    analysed = [(d, saved_division(d)) for d in run_dirs if _analysed(d) and analysis_is_current(d)]
    shown = [(d, r) for d, r in analysed if r is not None]
    if shown:
        return shown
    for run_dir in reversed(run_dirs):
        result = saved_division(run_dir) if analysis_is_current(run_dir) else None
        if result is not None:
            return [(run_dir, result)]
    return []


def save_folder_figures(path: str | os.PathLike[str]) -> list[Path]:
    """Draw every figure a report of ``path`` embeds, from the results saved there.

    Args:
        path: A run folder, a sweep folder or a folder of sweeps, after
            :func:`~mhainterp.specialization.specialize_folder` (whatever is not saved yet is
            skipped; the report says it is missing).

    Returns:
        The PNG paths written (or, for the head-count figures, found).
    """
    path = Path(path)
    kind = folder_kind(path)
    if kind == "run":
        result = saved_specialization(path)
        analysis = path / "analysis"
        paths = [] if result is None else run_specialization_figures(result, analysis, draw=True)
        return paths + division_figures(saved_divisions([path]), draw=True)
    sweeps = [path] if kind == "sweep" else sweep_folders(path)
    return [p for sweep in sweeps for p in _sweep(sweep)]
