"""One sweep of a study, written with its figures, and its seed table for the terminal.

Example:
    >>> summary = run_sweep_with_figures(config, "runs/rev", "auto", True)  # doctest: +SKIP
    >>> print("\\n".join(seed_lines("reverse", summary.table)))  # doctest: +SKIP
    reverse: val accuracy by head count (seed mean ± std, n)
      h=1   1.00 ± 0.00  n=6
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from mhainterp.config import SweepConfig

__all__ = ["run_sweep_with_figures", "seed_lines"]


def run_sweep_with_figures(
    config: SweepConfig, out: str | os.PathLike[str], executor: str, progress: bool
):
    """Run a sweep, then write summary tables, figures and summary.md beside its results.

    Returns:
        The sweep's :class:`~mhainterp.sweep.SweepSummary`.
    """
    from mhainterp.figures._common import save_figure
    from mhainterp.figures.headcount import plot_head_count_accuracy, plot_training_curves
    from mhainterp.io import write_text
    from mhainterp.sweep import load_curves, run_sweep, summarize

    out = Path(out)
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


def seed_lines(task: str, table: pd.DataFrame) -> list[str]:
    """A sweep's seed table as the terminal shows it: h, the accuracy's seed mean ± std, n.

    Args:
        task: The task's name.
        table: :attr:`SweepSummary.table` (``n_heads``, ``val_accuracy_mean``,
            ``val_accuracy_std``, ``n``).

    Example:
        >>> table = pd.DataFrame({"n_heads": [1, 4], "val_accuracy_mean": [0.6424, 0.99],
        ...     "val_accuracy_std": [0.0866, 0.0039], "n": [6, 6]})
        >>> print("\\n".join(seed_lines("count_previous", table)))
        count_previous: val accuracy by head count (seed mean ± std, n)
          h=1   0.64 ± 0.09  n=6
          h=4   0.99 ± 0.00  n=6
    """
    lines = [f"{task}: val accuracy by head count (seed mean ± std, n)"]
    for row in table.itertuples(index=False):
        std = "" if pd.isna(row.val_accuracy_std) else f" ± {row.val_accuracy_std:.2f}"
        lines.append(f"  h={row.n_heads:<3d} {row.val_accuracy_mean:.2f}{std}  n={row.n}")
    return lines
