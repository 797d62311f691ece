"""The README's main job: the head-count experiment on two tasks, then a look inside the heads.

``mhainterp demo --out runs/quickstart`` writes::

    runs/quickstart/
      report.md  report.html         findings, tables and figures, generated from the numbers
      count_previous/  reverse/      one sweep folder per task (see mhainterp.sweep), each with
        results.csv summary.md summary_*.csv head_count_accuracy.png training_curves.png
        runs/h{h}_seed{s}/           run folders; the analysed one has analysis/ (CSV + PNG)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from mhainterp.config import SweepConfig, TrainConfig

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

    out = Path(out)
    train = TrainConfig(steps=steps or DEMO_STEPS)
    for task in DEMO_TASKS:
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
            _analyse_one_run(out, task, list(n_heads), list(seeds), echo)
    # The report reads these results; the terminal gets each sweep's answer right away.
    labels = SpecializationSettings(n_eval=DEMO_LABEL_N_EVAL)
    for sweep, spec in specialize_folder(out, labels, progress=progress):
        echo(f"### {sweep.name}: do the heads specialize?\n\n{spec.to_markdown()}")
    save_folder_figures(out)
    markdown, html = write_report(out)
    echo(f"report: {markdown} and {html}")
    return markdown


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
    out: Path, task: str, n_heads: list[int], seeds: list[int], echo: Callable[[str], None]
) -> None:
    """Analyse the run with the most heads (first seed), the one-head run as reference."""
    from mhainterp.analyze import analyze_run

    h = max(n_heads)
    runs = out / task / "runs"
    run_dir = runs / f"h{h}_seed{seeds[0]}"
    reference = runs / f"h1_seed{seeds[0]}" if 1 in n_heads and h != 1 else None
    written = analyze_run(run_dir, reference=reference)
    echo(f"analysed {run_dir}: {len(written)} files in {run_dir / 'analysis'}")
