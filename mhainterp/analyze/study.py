"""The head-count study: one protocol for ``mhainterp demo`` and ``analysis/head_count_study.py``.

Same d_model, data, steps, learning rate and initialisation seed for every head count; only
the number of heads changes, so the parameter count is identical (seed 000's protocol). A
:class:`Grid` says which tasks, head counts and seeds; :func:`run_study` runs any grid the same
way, and the demo is the grid ``demo``::

    OUT/
      report.md  report.html       the answer per task in one line, then the evidence
      does_h_matter.png/.pdf/.csv  per task and h: accuracy and division index, seed mean, 95% CI
      study_comparisons.csv        every comparison of adjacent head counts (Holm per question)
      {task}/                      one sweep folder per task (see mhainterp.sweep): results.csv,
        runs/h{h}_seed{s}/         seed tables, figures, its runs (one analysed: analysis/)

Steps, each resumable (rerun after an interruption and only what is missing is done):
train every task's sweep; analyse the run with the most heads of each task; the division of
labour of every run (on :data:`~mhainterp.config.DEFAULT_N_EVAL` sequences: the answer rests on
it); the specialization test of every run (on :data:`LABEL_N_EVAL` sequences); the
comparisons, the figures and the report.

Example:
    >>> report = run_study(GRIDS["quick"], "runs/quick")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from mhainterp.analyze.run import analyze_run
from mhainterp.analyze.sweeps import run_sweep_with_figures, seed_lines
from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.render import estimate_line, format_duration
from mhainterp.specialization.folders import SweepSpecialization
from mhainterp.specialization.seeds.answer import comparison_grid
from mhainterp.specialization.seeds.summary import per_seed_measures
from mhainterp.stats import describe, mean_interval
from mhainterp.tasks import AXES, get_task, list_tasks

__all__ = [
    "D_MODEL",
    "GRIDS",
    "Grid",
    "LABEL_N_EVAL",
    "TASK_PARAMS",
    "does_h_matter_table",
    "run_study",
    "sweep_config",
    "write_study_report",
    "write_study_tables",
]

D_MODEL = 64
TASK_PARAMS = {"seq_len": 16, "d_vocab": 10}
LABEL_N_EVAL = 256
"""Sequences of the per-head labelling (roles, nulls, backup tests) of every run, so a study
of hundreds of runs stays minutes; the division of labour, on which the answer rests, uses the
default evaluation set. ``mhainterp specialize`` uses the default for both."""
STEPS = 1500


def grid_measures() -> tuple[str, ...]:
    """The measures of ``does_h_matter.md`` (and the README's table), where they change."""
    return ("accuracy", "frac_backed_up", *(f"division_{axis}" for axis in AXES))


@dataclass(frozen=True)
class Grid:
    """The runs of a study: tasks x head counts x seeds, each trained ``steps`` steps."""

    name: str
    tasks: tuple[str, ...]
    n_heads: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: int = STEPS

    @property
    def n_runs(self) -> int:
        return len(self.tasks) * len(self.n_heads) * len(self.seeds)

    def describe(self) -> str:
        """``demo grid: 2 tasks x h in {1, 4, 8} x 6 seeds (0-5) = 36 runs of 1,000 steps``."""
        seeds = list(self.seeds)
        consecutive = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
        which = f"{seeds[0]}-{seeds[-1]}" if consecutive else ", ".join(map(str, seeds))
        tasks = "task" if len(self.tasks) == 1 else "tasks"
        return (
            f"{self.name} grid: {len(self.tasks)} {tasks} x h in "
            f"{{{', '.join(map(str, self.n_heads))}}} x {len(seeds)} seeds ({which}) = "
            f"{self.n_runs} runs of {self.steps:,} steps"
        )

    def with_options(self, **changes: object) -> Grid:
        """This grid with some fields replaced; its name gets a ``*`` when anything changed."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        return replace(self, name=f"{self.name.rstrip('*')}*", **changes)  # type: ignore[arg-type]


def _one_layer_tasks() -> tuple[str, ...]:
    """The built-in tasks one attention layer can learn (all but ``induction``)."""
    return tuple(t for t in list_tasks() if get_task(t, **TASK_PARAMS).min_layers == 1)


# 6 seeds: the fewest at which a complete separation of the seeds (exact floor 2 / C(12, 6)
# = 0.0022) survives Holm over a question's family of up to 23 comparisons; 5 seeds reach
# 0.0079, which survives only families of up to 6.
GRIDS = {
    # 1,000 steps: every comparison of seeds 0-5 that 1,500 steps decide gets the same verdict,
    # and both answers the same sentence (one count_previous measure, heads per relation at
    # h = 4 -> 8, becomes undetermined: one seed of h = 8 covers a relation, was two), in two
    # thirds of the training time (issue 38)
    "demo": Grid("demo", ("count_previous", "reverse"), (1, 4, 8), tuple(range(6)), 1000),
    "cpu": Grid("cpu", _one_layer_tasks(), (1, 2, 4, 8), tuple(range(6))),  # a name, not a device
    "full": Grid("full", tuple(list_tasks()), (1, 2, 4, 8, 16, 32, 64), tuple(range(30))),
    "quick": Grid("quick", ("count_previous", "reverse"), (1, 4), (0, 1, 2), 150),
}


def sweep_config(grid: Grid, task: str) -> SweepConfig:
    """The sweep of one task: d_model :data:`D_MODEL`, the task's fewest layers."""
    layers = get_task(task, **TASK_PARAMS).min_layers
    return SweepConfig(
        task=task,
        task_params=dict(TASK_PARAMS),
        n_heads=list(grid.n_heads),
        seeds=list(grid.seeds),
        model={"d_model": D_MODEL, "n_layers": layers},
        train=TrainConfig(steps=grid.steps, warmup_steps=min(100, grid.steps // 10)),
    )


def run_study(
    grid: Grid,
    out: str | os.PathLike[str],
    *,
    executor: str = "auto",
    analysis: bool = True,
    echo: Callable[[str], None] = lambda text: None,
    progress: bool = True,
) -> Path:
    """Run ``grid``: sweeps, the head analysis, the division and the specialization test of
    every run, the comparisons, figures and the report.

    Args:
        grid: What to train (:data:`GRIDS`, or your own :class:`Grid`).
        out: Results folder (resumable).
        executor: Sweep executor (default "auto": :func:`mhainterp.sweep.fastest_executor`).
        analysis: Also analyse the heads of one run per task (the one with the most heads).
        echo: Called with each line for the terminal (the CLI passes ``print``): the plan,
            each task's seed table, the answers and where the report is; one screen.
        progress: Show progress bars.

    Returns:
        The path of ``report.md``.
    """
    from mhainterp.specialization import (
        DivisionSettings,
        SpecializationSettings,
        specialize_folder,
    )

    out = Path(out)
    echo(
        f"{grid.describe()}; then the division of labour and the specialization test of "
        "every run, the figures and the report"
    )
    start = time.perf_counter()
    for i, task in enumerate(grid.tasks):
        summary = run_sweep_with_figures(sweep_config(grid, task), out / task, executor, progress)
        echo("\n".join(seed_lines(task, summary.table)))
        if analysis:
            _analyse_one_run(out / task, grid, progress)
        if i == 0 and len(grid.tasks) > 1:
            echo(estimate_line("training", "task", len(grid.tasks), time.perf_counter() - start))
    echo(f"specialization: the division and the specialization test of {grid.n_runs} runs")
    # the division on DEFAULT_N_EVAL sequences, the labels on fewer: each run loaded once
    labels = SpecializationSettings(n_eval=LABEL_N_EVAL)
    answers: list[str] = []
    dividing = DivisionSettings()
    for _, spec in specialize_folder(out, labels, progress=progress, division_settings=dividing):
        answers += list(spec.answers.values())
    markdown, html = write_study_report(out, [out / task for task in grid.tasks], progress)
    elapsed = format_duration(time.perf_counter() - start)
    echo("\n".join(["", "Does h matter?", *[f"- {line}" for line in answers], ""]))
    echo(f"report: {markdown} (evidence, figures, every test) and {html} ({elapsed} in all)")
    return markdown


def write_study_report(
    out: Path, sweeps: Sequence[Path], progress: bool = False
) -> tuple[Path, Path]:
    """The study's last step, from its saved results: every sweep's figures, the study tables
    (:func:`write_study_tables`) and ``report.md`` + ``report.html`` (the step the benchmark's
    ``demo`` section times).

    Returns:
        ``(report.md path, report.html path)``.

    Example:
        >>> out = Path("runs/quickstart")
        >>> write_study_report(out, [out / "count_previous", out / "reverse"])  # doctest: +SKIP
    """
    from mhainterp.figures.saved import save_folder_figures
    from mhainterp.report import write_report

    for sweep in tqdm(sweeps, desc="figures", unit="sweep", disable=not progress):
        save_folder_figures(sweep)
    write_study_tables(out, sweeps)
    return write_report(out)


def write_study_tables(out: Path, sweeps: Sequence[Path]) -> list[Path]:
    """``does_h_matter.csv`` + figure, ``study_comparisons.csv`` and ``does_h_matter.md`` (the
    comparisons as a grid: accuracy, and every measure that changes beyond the seed spread),
    from the sweeps' saved specialization results (the report reads them)."""
    from mhainterp.figures._common import save_figure
    from mhainterp.figures.headcount import plot_does_h_matter
    from mhainterp.io import write_csv, write_text

    specs = [SweepSpecialization.load(sweep) for sweep in sweeps]
    comparisons = pd.concat([s.comparisons for s in specs], ignore_index=True)
    table = pd.concat([does_h_matter_table(s) for s in specs], ignore_index=True)
    grid = comparison_grid(comparisons, grid_measures(), changes_only=True)
    return [
        write_csv(out / "study_comparisons.csv", comparisons),
        write_text(out / "does_h_matter.md", grid + "\n"),
        save_figure(plot_does_h_matter(table), out / "does_h_matter.png", table),
    ]


def does_h_matter_table(spec: SweepSpecialization) -> pd.DataFrame:
    """Per task and h of a sweep: seeds; the accuracy's seed mean, std, n and 95% t interval;
    per division axis the same over the seeds where the index is defined, and the seeds
    called divided (``{axis}_n_divided``).

    Example:
        >>> spec = SweepSpecialization.load("runs/demo/reverse")  # doctest: +SKIP
        >>> table = does_h_matter_table(spec)  # doctest: +SKIP
    """
    per_seed = per_seed_measures(spec.runs, spec.result.division)
    division = spec.result.division
    calls = dict(zip(zip(division["run"], division["by"]), division["call"], strict=True))
    rows = []
    for (task, h), group in per_seed.groupby(["task", "n_heads"], sort=False):
        row: dict[str, object] = {"task": task, "n_heads": int(h), "n_seeds": len(group)}
        row |= _mean_and_interval("accuracy", group["accuracy"])
        for axis in AXES:
            column = f"division_{axis}"
            values = group[column] if column in group else pd.Series(dtype=float)
            row |= _mean_and_interval(f"{axis}_index", values)
            called = [calls.get((run, axis)) for run in group["run"]]
            row[f"{axis}_n_divided"] = sum(call == "divided" for call in called)
        rows.append(row)
    return pd.DataFrame(rows)


def _mean_and_interval(name: str, values: pd.Series) -> dict[str, float]:
    stats = describe(values.dropna())
    low, high = mean_interval(values)
    return {
        f"{name}_mean": stats["mean"],
        f"{name}_std": stats["std"],
        f"{name}_n": stats["n"],
        f"{name}_ci_low": low,
        f"{name}_ci_high": high,
    }


def _analyse_one_run(sweep: Path, grid: Grid, progress: bool) -> None:
    """Analyse the run with the most heads (first seed), the one-head run as reference."""
    h = max(grid.n_heads)
    runs = sweep / "runs"
    reference = runs / f"h1_seed{grid.seeds[0]}" if 1 in grid.n_heads and h != 1 else None
    analyze_run(runs / f"h{h}_seed{grid.seeds[0]}", reference=reference, progress=progress)
