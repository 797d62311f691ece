"""``mhainterp sweep``: the head-count experiment, every (head count, seed) with everything else
fixed, then the seed table and the figures.

    mhainterp sweep --task reverse --n-heads 1,4,8 --seeds 0,1,2 --out runs/reverse

Rerunning with the same settings resumes: finished runs are kept.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mhainterp.cli.options import (
    EXECUTORS,
    Checked,
    add_int_list,
    add_model_args,
    add_runtime_args,
    add_task_args,
    add_train_args,
    check_executor,
    check_folder,
    model_overrides,
    train_config,
)

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` command to the ``mhainterp`` parser."""
    sweep = subparsers.add_parser(
        "sweep",
        help="the head-count experiment: h x seeds, with the seed table and figures",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train every (head count, seed) with everything else fixed, then print the "
        "seed table (mean, std, n; differences vs the seed spread) and draw the figures. "
        "Rerunning with the same settings resumes: finished runs are kept.",
        epilog="example:\n  mhainterp sweep --task reverse --n-heads 1,4,8 --seeds 0,1,2 "
        "--out runs/reverse",
    )
    sweep.add_argument(
        "--out",
        required=True,
        action=Checked,
        check=check_folder,
        help="sweep folder (resumed if it exists; not a run's folder)",
    )
    add_int_list(
        sweep, "--n-heads", "head counts to compare, each a divisor of --d-model", default=[1, 4, 8]
    )
    add_int_list(
        sweep, "--seeds", "seeds, each for init and data order", default=[0, 1, 2], seeds=True
    )
    sweep.add_argument(
        "--executor",
        default="auto",
        choices=EXECUTORS,
        help="auto (default): the fastest here, batched where there are several CPUs; local: "
        "one run after another; batched: several models per step in one pinned worker per "
        "CPU; ray: one task per run on a Ray cluster. The table is the same for all",
    )
    sweep.add_argument(
        "--address",
        default=None,
        help="Ray cluster address for --executor ray (auto, ray://host:port); "
        "default: $MHAINTERP_RAY_ADDRESS or Ray's own default",
    )
    add_task_args(sweep)
    add_model_args(sweep)
    add_train_args(sweep)
    add_runtime_args(sweep)
    sweep.set_defaults(func=_cmd_sweep)


def _cmd_sweep(args: argparse.Namespace) -> int:
    check_executor(args.executor)
    from mhainterp.analyze import run_sweep_with_figures
    from mhainterp.config import SweepConfig
    from mhainterp.runs import check_free_folder
    from mhainterp.tasks import get_task

    check_free_folder(args.out, "sweep", "--out")  # a run's folder: analyze would see the run alone
    overrides = model_overrides(args)
    if "n_layers" not in overrides:
        overrides["n_layers"] = get_task(args.task, **dict(args.task_param)).min_layers
    config = SweepConfig(
        task=args.task,
        task_params=dict(args.task_param),
        n_heads=args.n_heads,
        seeds=args.seeds,
        model=overrides,
        train=train_config(args),
    )
    if args.address and args.executor == "ray":  # connected now: no environment to carry it
        from mhainterp.sweep.executors import start_ray

        start_ray(args.address)
    summary = run_sweep_with_figures(config, Path(args.out), args.executor, not args.quiet)
    print(summary.to_markdown())
    print(f"results, figures and summary in {args.out}")
    return 0
