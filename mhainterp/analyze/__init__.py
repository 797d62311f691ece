"""What ``mhainterp analyze`` and ``mhainterp demo`` write: files on disk from the library.

Modules, each with one job::

    run.py          analyze_run, analyze_path: every table and figure of a trained run
    pretrained.py   analyze_pretrained: the battery on a pretrained model and real text
    tables.py       ablation_tables: the ablation and gradient tables of one run, side by side
    sweeps.py       run_sweep_with_figures, seed_lines: one sweep written with its figures
    study.py        Grid, GRIDS, run_study: the head-count study, one protocol for every grid
    demo.py         run_demo: the study on its demo grid (the README's main job)

This package sits above the report and below the explorer and the CLI: it computes through the
library, writes through :mod:`mhainterp.io`, and the report reads what it wrote.

Example:
    >>> from mhainterp.analyze import analyze_run
    >>> written = analyze_run("runs/quickstart/reverse/runs/h8_seed0")  # doctest: +SKIP

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``ablation``, ``attribution``, ``capture``, ``config``, ``data``, ``errors``,
``figures``, ``heads``, ``io``, ``pretrained``, ``protocol``, ``provenance``, ``render``,
``report``, ``runs``, ``runtime``, ``scoring``, ``similarity``, ``specialization``, ``stats``,
``sweep``, ``tasks``, ``training``, ``validation``.
"""

from mhainterp.analyze.demo import DEMO_STEPS, DEMO_TASKS, run_demo
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
from mhainterp.analyze.study import GRIDS, Grid, run_study
from mhainterp.analyze.sweeps import run_sweep_with_figures, seed_lines
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
    "GRIDS",
    "Grid",
    "run_demo",
    "run_study",
    "run_sweep_with_figures",
    "seed_lines",
    "text_roles",
    "unpack_run",
    "verified_heads",
    "zero_vs_mean",
]
