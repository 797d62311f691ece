"""The README's main job: the head-count study on its ``demo`` grid, then the report.

``mhainterp demo --out runs/quickstart`` runs :data:`~mhainterp.analyze.study.GRIDS` ``["demo"]``
(count_previous and reverse, h = 1, 4, 8 x 6 seeds, 1,000 steps) through
:func:`~mhainterp.analyze.study.run_study`, the same path as ``analysis/head_count_study.py``,
and writes what it describes. Fewer seeds still run (``--seeds 0-2``), and the answer says what
they cannot show.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from mhainterp.analyze.study import GRIDS, run_study

__all__ = ["DEMO_STEPS", "DEMO_TASKS", "run_demo"]

DEMO_TASKS = GRIDS["demo"].tasks
DEMO_STEPS = GRIDS["demo"].steps


def run_demo(
    out: str | os.PathLike[str],
    *,
    steps: int | None = None,
    seeds: Sequence[int] | None = None,
    n_heads: Sequence[int] | None = None,
    executor: str = "auto",
    analysis: bool = True,
    echo: Callable[[str], None] = lambda text: None,
    progress: bool = True,
) -> Path:
    """Run the head-count study on the ``demo`` grid, analyse heads, write ``report.md``.

    Args:
        out: Results folder (resumable).
        steps: Training steps per run (default :data:`DEMO_STEPS`).
        seeds: Seeds per head count (default 0-5: the fewest at which a complete separation
            survives Holm).
        n_heads: Head counts to compare (default 1, 4, 8).
        executor: Sweep executor (default "auto": :func:`mhainterp.sweep.fastest_executor`).
        analysis: Also analyse the heads of one run per task.
        echo: Called with each line for the terminal (the CLI passes ``print``).
        progress: Show progress bars.

    Returns:
        The path of ``report.md``.
    """
    grid = GRIDS["demo"].with_options(
        steps=steps,
        seeds=tuple(seeds) if seeds is not None else None,
        n_heads=tuple(n_heads) if n_heads is not None else None,
    )
    return run_study(
        grid, Path(out), executor=executor, analysis=analysis, echo=echo, progress=progress
    )
