"""The README's main job: the head-count experiment on two tasks, then a look inside the heads.

``mhainterp demo --out runs/quickstart`` writes::

    runs/quickstart/
      report.md  report.html         findings, tables and figures, generated from the numbers
      count_previous/  reverse/      one sweep folder per task (see mhainterp.sweep), each with
        results.csv summary.md summary_*.csv head_count_accuracy.png training_curves.png
        runs/h{h}_seed{s}/           run folders; the analysed one has analysis/ (CSV + PNG)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm.auto import tqdm

from mhainterp.analyze.run import analyze_run
from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.render import estimate_line, format_duration

__all__ = ["DEMO_TASKS", "DEMO_STEPS", "run_demo", "run_sweep_with_figures"]

DEMO_TASKS = ("count_previous", "reverse")
DEMO_STEPS = 1500
DEMO_TASK_PARAMS = {"seq_len": 16, "d_vocab": 10}
DEMO_LABEL_N_EVAL = 256
"""Sequences the demo's per-head labelling (roles, nulls, backup tests) uses, so the main job
stays a few minutes; the division of labour, on which the headline rests, uses the default
evaluation set (``DEFAULT_N_EVAL``). ``mhainterp specialize`` uses the default for both."""


def run_demo(
    out: Path,
    *,
    steps: int | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    n_heads: Sequence[int] = (1, 4, 8),
    executor: str = "auto",
    analysis: bool = True,
    echo: Callable[[str], None] = lambda text: None,
    progress: bool = True,
) -> Path:
    """Run the head-count experiment on :data:`DEMO_TASKS`, analyse heads, write ``report.md``.

    Args:
        out: Results folder (resumable).
        steps: Training steps per run (default :data:`DEMO_STEPS`).
        seeds: Seeds per head count (>= 3 for the seed's protocol).
        n_heads: Head counts to compare.
        executor: Sweep executor (default "auto": :func:`mhainterp.sweep.fastest_executor`).
        analysis: Also analyse the heads of one run per task.
        echo: Called with each finished table (the CLI passes ``print``).
        progress: Show progress bars.

    Returns:
        The path of ``report.md``.
    """
    from mhainterp.figures.saved import save_folder_figures
    from mhainterp.report import write_report
    from mhainterp.specialization import SpecializationSettings, specialize_folder
    from mhainterp.specialization.folders import division_folder

    out = Path(out)
    train = TrainConfig(steps=steps or DEMO_STEPS)
    echo(_plan_line(train.steps, seeds, n_heads, analysis))
    start = time.perf_counter()
    for i, task in enumerate(DEMO_TASKS):
        config = SweepConfig(
            task=task,
            task_params=dict(DEMO_TASK_PARAMS),
            n_heads=list(n_heads),
            seeds=list(seeds),
            model={"d_model": 64, "n_layers": 1},
            train=train,
        )
        summary = run_sweep_with_figures(config, out / task, executor, progress)
        echo(summary.to_markdown())
        if analysis:
            _analyse_one_run(out, task, list(n_heads), list(seeds), echo, progress)
        if i == 0:
            echo(
                estimate_line("demo", "task", len(DEMO_TASKS), time.perf_counter() - start)
                + "; then the specialization test, the figures and the report"
            )
    # The report reads these results; the terminal gets each sweep's answer right away.
    n_runs = len(DEMO_TASKS) * len(seeds) * len(n_heads)
    echo(f"specialization: the division of labour and the specialization test of {n_runs} runs")
    division_folder(out, progress=progress)  # the division first, on DEFAULT_N_EVAL sequences
    labels = SpecializationSettings(n_eval=DEMO_LABEL_N_EVAL)  # by=(): attaches the saved one
    for sweep, spec in specialize_folder(out, labels, progress=progress, by=()):
        echo(f"### {sweep.name}: do the heads specialize?\n\n{spec.to_markdown()}")
    # The figures of both sweeps take 10-20 s: said, with a bar, not silent.
    sweeps = [out / task for task in DEMO_TASKS]
    echo(f"figures: drawing each sweep's figures ({len(sweeps)} sweeps), then the report")
    for sweep in tqdm(sweeps, desc="figures", unit="sweep", disable=not progress):
        save_folder_figures(sweep)
    markdown, html = write_report(out)
    echo(f"report: {markdown} and {html} ({format_duration(time.perf_counter() - start)} in all)")
    return markdown


def _plan_line(steps: int, seeds: Sequence[int], n_heads: Sequence[int], analysis: bool) -> str:
    """What the demo is about to do, said before the minutes of it start.

    Example:
        >>> print(_plan_line(1500, [0, 1, 2], [1, 4, 8], True))
        demo: count_previous and reverse, 9 runs each (h = 1, 4, 8 x seeds 0, 1, 2; 1,500 \
steps each), then the head analysis of one run per task, the specialization test of every run, \
the figures and the report; the time is estimated once the first task is done
    """
    heads, seed_list = ", ".join(map(str, n_heads)), ", ".join(map(str, seeds))
    then = "the head analysis of one run per task, " if analysis else ""
    return (
        f"demo: {' and '.join(DEMO_TASKS)}, {len(n_heads) * len(seeds)} runs each (h = {heads} "
        f"x seeds {seed_list}; {steps:,} steps each), then {then}the specialization test of "
        "every run, the figures and the report; the time is estimated once the first task is "
        "done"
    )


def run_sweep_with_figures(config: SweepConfig, out: Path, executor: str, progress: bool):
    """Run a sweep, then write summary tables, figures and summary.md beside its results."""
    from mhainterp.figures._common import save_figure
    from mhainterp.figures.headcount import plot_head_count_accuracy, plot_training_curves
    from mhainterp.io import write_text
    from mhainterp.sweep import load_curves, run_sweep, summarize

    results = run_sweep(config, out, executor=executor, progress=progress)
    summary = summarize(results)
    summary.save(out)  # the seed table, comparisons and notes the report reads
    write_text(out / "summary.md", summary.to_markdown())
    save_figure(
        plot_head_count_accuracy(results),
        out / "head_count_accuracy.png",
        results.drop(columns=["run_dir"]),
    )
    curves = load_curves(results)
    save_figure(plot_training_curves(curves), out / "training_curves.png", curves)
    return summary


def _analyse_one_run(
    out: Path,
    task: str,
    n_heads: list[int],
    seeds: list[int],
    echo: Callable[[str], None],
    progress: bool,
) -> None:
    """Analyse the run with the most heads (first seed), the one-head run as reference (about
    10 s: its bar counts the steps)."""
    h = max(n_heads)
    runs = out / task / "runs"
    run_dir = runs / f"h{h}_seed{seeds[0]}"
    reference = runs / f"h1_seed{seeds[0]}" if 1 in n_heads and h != 1 else None
    written = analyze_run(run_dir, reference=reference, progress=progress)
    echo(f"analysed {run_dir}: {len(written)} files in {run_dir / 'analysis'}")
