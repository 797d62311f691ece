"""``mhainterp train``: train one model on one task and save a run folder.

    mhainterp train --task reverse --n-heads 4 --seed 0 --out runs/rev_h4

A finished run already in ``--out`` is kept (``--overwrite`` trains it again); another run there
is refused, and so is a folder that holds a sweep.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mhainterp.cli.options import (
    Checked,
    add_count,
    add_model_args,
    add_runtime_args,
    add_seed,
    add_task_args,
    add_train_args,
    check_folder,
    model_overrides,
    print_eval,
    train_config,
)
from mhainterp.validation import invalid

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` command to the ``mhainterp`` parser."""
    train = subparsers.add_parser(
        "train",
        help="train one model and save a run folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train one model on one task and save a run folder (config.json, "
        "model.safetensors, metrics.csv, eval.json).",
        epilog="example:\n  mhainterp train --task reverse --n-heads 4 --seed 0 --out runs/rev_h4",
    )
    train.add_argument(
        "--out", required=True, action=Checked, check=check_folder, help="run folder to write"
    )
    add_count(train, "--n-heads", "attention heads per layer, a divisor of --d-model", default=4)
    add_seed(train)
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (without it, a finished run is kept)",
    )
    add_task_args(train)
    add_model_args(train)
    add_train_args(train)
    add_runtime_args(train)
    train.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from mhainterp.io import ensure_writable_dir, read_json, run_lock
    from mhainterp.runs import check_free_folder
    from mhainterp.tasks import get_task
    from mhainterp.training import build_model, run_config_differences, run_folder_state, train

    task = get_task(args.task, **dict(args.task_param))
    model = build_model(task, **model_overrides(args), n_heads=args.n_heads, seed=args.seed)
    config = train_config(args, args.seed)
    out = Path(args.out)
    check_free_folder(out, "run", "--out")  # a sweep's folder: analyze would see one or the other
    ensure_writable_dir(out, "--out")
    # --overwrite replaces whatever run is there, a damaged one included: reading it first
    # would refuse the damage it is asked to replace
    state = "replaced" if args.overwrite else run_folder_state(out, model, task, config)
    if state == "same finished":
        print(
            f"{out} already holds this run, finished: nothing to do (--overwrite trains it again)"
        )
        print_eval(read_json(out / "eval.json"))
        return 0
    if state == "different":
        differences = run_config_differences(out, model, task, config)
        raise invalid(
            "--out",
            str(out),
            f"a folder free for this run, but it already holds another run ({differences}); "
            "to keep that one, choose another --out (to resume it, rerun the command that made "
            "it); to replace it, add --overwrite",
        )
    with run_lock(out):  # a sweep or another train writing this folder is refused
        result = train(
            model,
            task,
            config,
            run_dir=out,
            progress=not args.quiet,
            resume=not args.overwrite,
            overwrite=args.overwrite,
        )
    print(f"trained {task.name} h={args.n_heads} seed={args.seed} -> {result.path}")
    print_eval(result.eval)
    return 0
