"""``mhainterp demo``: the main job, the head-count study on count_previous and reverse (h = 1,
4, 8 x 6 seeds) plus the head analysis and report.md.

    mhainterp demo --out runs/quickstart

Resumable: rerunning keeps what is finished.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mhainterp.cli.options import (
    EXECUTORS,
    Checked,
    add_count,
    add_int_list,
    add_runtime_args,
    check_executor,
    check_folder,
)
from mhainterp.cli.static import DEMO_SEEDS, DEMO_STEPS
from mhainterp.cli.task_modules import add_task_module_argument
from mhainterp.validation import invalid

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` command to the ``mhainterp`` parser."""
    demo = subparsers.add_parser(
        "demo",
        help="the main job: head-count experiment on count_previous and reverse + head analysis",
        description="Run the head-count study (h = 1, 4, 8; seeds 0-5; d_model 64) on "
        "count_previous and reverse, the same protocol as analysis/head_count_study.py: print "
        "each task's seed table and its one-line answer, draw the figures, analyse the heads of "
        "one model per task, and write report.md. 6 seeds is the fewest at which a complete "
        "separation survives Holm; fewer still run and say what they cannot show. Resumable.",
    )
    demo.add_argument(
        "--out",
        default="runs/quickstart",
        action=Checked,
        check=check_folder,
        help="results folder (default runs/quickstart)",
    )
    add_count(demo, "--steps", f"training steps per run (default {DEMO_STEPS})", default=None)
    add_int_list(
        demo,
        "--seeds",
        "seeds, each for init and data order",
        default=list(DEMO_SEEDS),
        seeds=True,
    )
    add_int_list(demo, "--n-heads", "head counts to compare", default=[1, 4, 8])
    demo.add_argument(
        "--executor",
        default="auto",
        choices=EXECUTORS,
        help="sweep executor (default auto: the fastest here)",
    )
    demo.add_argument(
        "--no-analysis",
        action="store_true",
        help="skip the head analysis of one run per task (patterns, similarity, ablation in "
        "its analysis/ folder); the division of labour and the specialization test of every "
        "run, the figures and the report still run",
    )
    add_task_module_argument(demo)
    add_runtime_args(demo)
    demo.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    check_executor(args.executor)
    _check_free_for_study(Path(args.out))
    from mhainterp.analyze import run_demo

    run_demo(
        Path(args.out),
        steps=args.steps,
        seeds=args.seeds,
        n_heads=args.n_heads,
        executor=args.executor,
        analysis=not args.no_analysis,
        echo=print,
    )
    return 0


def _check_free_for_study(out: Path) -> None:
    """The demo writes a folder of sweeps: a sweep or a run at its top is what every reader
    would take the folder for, skipping the demo's sweeps."""
    for marker, held in (("sweep.json", "a sweep"), ("eval.json", "a run")):
        if (out / marker).is_file():
            raise invalid(
                "--out",
                str(out),
                f"a folder free for the demo's sweeps, but it holds {held} ({out / marker}); "
                "choose another --out",
            )
