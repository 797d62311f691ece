"""``mhainterp analyze``: look inside a run (or every run of a sweep) and write every analysis
table and figure under ``RUN/analysis/``.

    mhainterp analyze runs/quickstart/reverse/runs/h8_seed0
"""

from __future__ import annotations

import argparse

from mhainterp.cli.options import add_n_eval, check_run_folders
from mhainterp.cli.task_modules import add_task_module_argument

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``analyze`` command to the ``mhainterp`` parser."""
    analyze = subparsers.add_parser(
        "analyze",
        help="look inside a run (or every run of a sweep): patterns, similarity, ablation",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write every analysis table (CSV) and figure (PNG beside its CSV) under "
        "RUN/analysis/: per-head statistics, average and example patterns next to the task's "
        "relation templates, head similarity (js, pattern_corr, cka, ov, qk, separation) with "
        "clustering and an MDS map, and ablation importance (single, pairwise, gradient, "
        "pruning). Given a sweep folder, analyses every run in it.",
        epilog="example:\n  mhainterp analyze runs/quickstart/reverse/runs/h8_seed0",
    )
    analyze.add_argument("path", help="a run folder or a sweep folder")
    add_n_eval(analyze, "sequences of the task's fixed evaluation set")
    analyze.add_argument("--no-ablation", action="store_true", help="skip the ablation tables")
    analyze.add_argument("--quiet", action="store_true", help="no progress bars")
    add_task_module_argument(analyze)
    analyze.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from mhainterp.analyze import analyze_path

    check_run_folders(args.path)
    results = analyze_path(
        args.path, n_eval=args.n_eval, ablation=not args.no_ablation, progress=not args.quiet
    )
    for run_dir, written in results.items():
        print(f"{run_dir}: {len(written)} files in {run_dir / 'analysis'}")
    return 0
