"""What ``mhainterp analyze`` and ``mhainterp demo`` write: files on disk from the library.

Modules, each with one job::

    run.py          analyze_run, analyze_path: every table and figure of a trained run
    pretrained.py   analyze_pretrained: the battery on a pretrained model and real text
    tables.py       ablation_tables: the ablation and gradient tables of one run, side by side
    demo.py         run_demo: the head-count experiment on two tasks, then the report

This package sits above the report and below the explorer and the CLI: it computes through the
library, writes through :mod:`mhainterp.io`, and the report reads what it wrote.

Example:
    >>> from mhainterp.analyze import analyze_run
    >>> written = analyze_run("runs/quickstart/reverse/runs/h8_seed0")  # doctest: +SKIP
"""

from mhainterp.analyze.demo import (
    DEMO_STEPS,
    DEMO_TASKS,
    run_demo,
    run_sweep_with_figures,
)
from mhainterp.analyze.pretrained import (
    CLARK_CATEGORIES,
    analyze_pretrained,
    clark_categories,
    embedding_metric,
    text_roles,
    verified_heads,
    zero_vs_mean,
)
from mhainterp.analyze.run import analysis_memory, analyze_path, analyze_run
from mhainterp.analyze.tables import ablation_tables, unpack_run

__all__ = [
    "CLARK_CATEGORIES",
    "DEMO_STEPS",
    "DEMO_TASKS",
    "ablation_tables",
    "analysis_memory",
    "analyze_path",
    "analyze_pretrained",
    "analyze_run",
    "clark_categories",
    "embedding_metric",
    "run_demo",
    "run_sweep_with_figures",
    "text_roles",
    "unpack_run",
    "verified_heads",
    "zero_vs_mean",
]
