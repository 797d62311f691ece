"""The head-count experiment: plan, run (resumably, with any executor) and summarise a sweep.

- :mod:`~mhainterp.sweep.run`: :func:`run_sweep`, the run folders, locks and ``results.csv``;
- :mod:`~mhainterp.sweep.spec`: :class:`RunSpec`, :func:`plan_sweep` and :func:`execute_run`,
  shared by the sweep and its executors (below both, so no cycle);
- :mod:`~mhainterp.sweep.executors`: how runs are trained: ``"local"``, ``"batched"`` (several
  runs per step on every CPU) and ``"ray"``; :data:`EXECUTORS` names them all, nothing
  registers itself on import;
- :mod:`~mhainterp.sweep.compare`: :func:`compare_head_counts`, adjacent head counts compared
  over seeds (:data:`HEAD_COUNT_COLUMNS`), and the words that say it (:func:`comparison_sentence`,
  :func:`comparison_display`, :func:`seed_power_note`); the numbers beneath are
  :mod:`mhainterp.stats`'s, which writes no sentences. It imports only the ground floor, so
  the Findings over seeds and the report, above the sweep, use it;
- :mod:`~mhainterp.sweep.summary`: :func:`summarize`, the seed table and the accuracy
  comparisons;
- :mod:`~mhainterp.sweep.fork_safety`: forked children get a tqdm lock of their own, so a
  killed worker cannot leave the parent's progress bars waiting forever.

Example:
    >>> df = run_sweep("reverse", n_heads=[1, 4, 8], seeds=[0, 1, 2])  # doctest: +SKIP
    >>> print(summarize(df))  # doctest: +SKIP

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``config``, ``errors``, ``fast``, ``io``, ``render``, ``runs``, ``runtime``,
``stats``, ``tasks``, ``training``, ``validation``.
"""

from mhainterp.sweep.compare import (
    HEAD_COUNT_COLUMNS,
    compare_head_counts,
    comparison_display,
    comparison_sentence,
    seed_power_note,
)
from mhainterp.sweep.run import EXECUTORS, collect_results, fastest_executor, run_sweep
from mhainterp.sweep.spec import RunSpec, execute_run, plan_sweep
from mhainterp.sweep.summary import SweepSummary, load_curves, summarize

__all__ = [
    "EXECUTORS",
    "HEAD_COUNT_COLUMNS",
    "RunSpec",
    "SweepSummary",
    "collect_results",
    "compare_head_counts",
    "comparison_display",
    "comparison_sentence",
    "execute_run",
    "fastest_executor",
    "load_curves",
    "plan_sweep",
    "run_sweep",
    "seed_power_note",
    "summarize",
]
