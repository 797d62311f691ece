"""The README's main job: the head-count experiment on two tasks, then a look inside the heads.

``mhainterp demo --out runs/quickstart`` writes::

    runs/quickstart/
      report.md                      the findings, tables and figures, generated from the numbers
      count_previous/  reverse/      one sweep folder per task (see mhainterp.sweep), each with
        results.csv summary.md summary_*.csv head_count_accuracy.png training_curves.png
        runs/h{h}_seed{s}/           run folders; the analysed one has analysis/ (CSV + PNG)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.io import write_text

__all__ = ["DEMO_TASKS", "DEMO_STEPS", "run_demo"]

DEMO_TASKS = ("count_previous", "reverse")
DEMO_STEPS = 1500
DEMO_TASK_PARAMS = {"seq_len": 16, "d_vocab": 10}


def _default_executor() -> str:
    from mhainterp.sweep import EXECUTORS

    return "batched" if "batched" in EXECUTORS else "local"


def run_demo(
    out: Path,
    *,
    steps: int | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    n_heads: Sequence[int] = (1, 4, 8),
    executor: str | None = None,
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
        executor: Sweep executor name (default: "batched" when available, else "local").
        analysis: Also analyse the heads of one run per task.
        echo: Called with each finished table (the CLI passes ``print``).
        progress: Show progress bars.

    Returns:
        The path of ``report.md``.
    """
    from mhainterp.cli.core import run_and_report_sweep

    out = Path(out)
    executor = executor or _default_executor()
    train = TrainConfig(steps=steps or DEMO_STEPS)
    sections = []
    for task in DEMO_TASKS:
        config = SweepConfig(
            task=task,
            task_params=dict(DEMO_TASK_PARAMS),
            n_heads=list(n_heads),
            seeds=list(seeds),
            model={"d_model": 64, "n_layers": 1},
            train=train,
        )
        summary = run_and_report_sweep(config, out / task, executor, progress)
        echo(summary.to_markdown())
        section = [
            summary.to_markdown(),
            f"![head count vs accuracy]({task}/head_count_accuracy.png)",
            f"![training curves]({task}/training_curves.png)",
        ]
        if analysis:
            section.extend(_analyse_one_run(out, task, list(n_heads), list(seeds), echo))
        sections.append("\n\n".join(section))
    report = out / "report.md"
    write_text(report, _report_text(sections, train, list(n_heads), list(seeds)))
    return report


def _analyse_one_run(
    out: Path, task: str, n_heads: list[int], seeds: list[int], echo: Callable[[str], None]
) -> list[str]:
    """Analyse the run with the most heads (first seed); return report lines."""
    from mhainterp.analyze import analyze_run

    h = max(n_heads)
    runs = out / task / "runs"
    run_dir = runs / f"h{h}_seed{seeds[0]}"
    reference = runs / f"h1_seed{seeds[0]}" if 1 in n_heads and h != 1 else None
    written = analyze_run(run_dir, reference=reference)
    echo(f"analysed {run_dir}: {len(written)} files in {run_dir / 'analysis'}")
    rel = run_dir.relative_to(out) / "analysis"
    lines = [f"#### Inside {task}, h={h}, seed {seeds[0]}"]
    lines += [f"![{p.stem}]({rel / p.name})" for p in written if p.suffix == ".png"]
    return lines


def _report_text(
    sections: list[str], train: TrainConfig, n_heads: list[int], seeds: list[int]
) -> str:
    header = f"""# mhainterp: head count vs accuracy

Protocol (seed 000): d_model 64, one attention-only layer, learned positional embedding, same
data stream, steps ({train.steps}), learning rate ({train.lr}) and initialisation seed for every
head count; only the number of heads changes (h = {", ".join(map(str, n_heads))}), so the
parameter count is identical. Seeds {", ".join(map(str, seeds))} (n = {len(seeds)} per head count).
Accuracy is measured on each task's fixed evaluation set.

How to read the tables: "std" is the sample standard deviation over seeds. A difference counts
only when it exceeds the seed spread (|diff| > std_a + std_b); otherwise the verdict is "no
difference". With n = {len(seeds)} seeds, Welch's p-value and the bootstrap interval are coarse.
Attention maps are clues, not explanations: what a head attends to does not by itself show what
the model uses.
"""
    return (
        header
        + "\n\n"
        + "\n\n".join(f"## {s}" if not s.startswith("#") else s for s in sections)
        + "\n"
    )
