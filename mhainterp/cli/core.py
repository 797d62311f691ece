"""Commands ``tasks``, ``train``, ``sweep`` and ``demo``: train models and compare head counts."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from mhainterp.cli.task_modules import add_task_module_argument
from mhainterp.config import SweepConfig, TrainConfig

__all__ = ["register", "check_run_folders"]

DEMO_TASKS = ("count_previous", "reverse")


def register(subparsers: argparse._SubParsersAction) -> None:
    tasks = subparsers.add_parser(
        "tasks",
        help="list the synthetic tasks",
        description="List the registered tasks: what each asks and which relation solves it.",
    )
    add_task_module_argument(tasks)
    tasks.set_defaults(func=_cmd_tasks)

    train = subparsers.add_parser(
        "train",
        help="train one model and save a run folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train one model on one task and save a run folder (config.json, "
        "model.safetensors, metrics.csv, eval.json).",
        epilog="example:\n  mhainterp train --task reverse --n-heads 4 --seed 0 --out runs/rev_h4",
    )
    train.add_argument("--out", required=True, help="run folder to write")
    train.add_argument("--n-heads", type=int, default=4, help="attention heads (default 4)")
    train.add_argument("--seed", type=int, default=0, help="init and data seed (default 0)")
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (without it, a finished run is kept)",
    )
    _add_task_args(train)
    _add_model_args(train)
    _add_train_args(train)
    train.set_defaults(func=_cmd_train)

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
    sweep.add_argument("--out", required=True, help="sweep folder (resumed if it exists)")
    sweep.add_argument("--n-heads", type=_int_list, default=[1, 4, 8], help="e.g. 1,4,8")
    sweep.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="e.g. 0,1,2")
    sweep.add_argument(
        "--executor",
        default="auto",
        choices=["auto", "local", "batched", "ray"],
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
    _add_task_args(sweep)
    _add_model_args(sweep)
    _add_train_args(sweep)
    sweep.set_defaults(func=_cmd_sweep)

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
    analyze.add_argument("--n-eval", type=int, default=1024, help="evaluation sequences")
    analyze.add_argument("--no-ablation", action="store_true", help="skip the ablation tables")
    analyze.add_argument("--quiet", action="store_true", help="no progress bars")
    add_task_module_argument(analyze)
    analyze.set_defaults(func=_cmd_analyze)

    demo = subparsers.add_parser(
        "demo",
        help="the main job: head-count experiment on count_previous and reverse + head analysis",
        description="Run the head-count experiment (h = 1, 4, 8; seeds 0, 1, 2; d_model 64) on "
        "count_previous and reverse, print the seed tables, draw the figures, analyse the heads "
        "of one model per task, and write report.md. Resumable.",
    )
    demo.add_argument("--out", default="runs/quickstart", help="results folder")
    demo.add_argument("--steps", type=int, default=None, help="override training steps")
    demo.add_argument("--seeds", type=_int_list, default=[0, 1, 2])
    demo.add_argument("--n-heads", type=_int_list, default=[1, 4, 8])
    demo.add_argument(
        "--executor",
        default="auto",
        choices=["auto", "local", "batched", "ray"],
        help="sweep executor (default auto: the fastest here)",
    )
    demo.add_argument("--no-analysis", action="store_true", help="skip the head analysis")
    add_task_module_argument(demo)
    demo.set_defaults(func=_cmd_demo)


# ----- argument groups --------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _task_param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _add_task_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("task")
    group.add_argument("--task", default="count_previous", help="task name (see `mhainterp tasks`)")
    add_task_module_argument(group)
    group.add_argument(
        "--task-param",
        type=_task_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task parameter, repeatable: --task-param seq_len=16 --task-param d_vocab=10",
    )


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model (everything but the head count is shared)")
    group.add_argument("--d-model", type=int, default=64, help="residual width (default 64)")
    group.add_argument("--n-layers", type=int, default=None, help="blocks (default: task minimum)")
    group.add_argument("--mlp", action="store_true", help="add MLPs (default: attention only)")
    group.add_argument("--layer-norm", action="store_true", help="pre-LayerNorm (default: none)")
    causal = group.add_mutually_exclusive_group()
    causal.add_argument(
        "--causal",
        dest="causal",
        action="store_true",
        default=None,
        help="mask future positions (default: what the task expects)",
    )
    causal.add_argument("--bidirectional", dest="causal", action="store_false")


def _add_train_args(parser: argparse.ArgumentParser) -> None:
    defaults = TrainConfig()
    group = parser.add_argument_group("training")
    group.add_argument("--steps", type=int, default=defaults.steps)
    group.add_argument("--batch-size", type=int, default=defaults.batch_size)
    group.add_argument("--lr", type=float, default=defaults.lr)
    group.add_argument(
        "--warmup-steps", type=int, default=None, help="default: 10%% of steps, at most 100"
    )
    group.add_argument("--grad-clip", type=float, default=defaults.grad_clip)
    group.add_argument(
        "--n-eval",
        type=int,
        default=defaults.n_eval,
        help="evaluation sequences (default %(default)s)",
    )
    group.add_argument("--quiet", action="store_true", help="no progress bars")


def _model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {"d_model": args.d_model, "attn_only": not args.mlp}
    if args.layer_norm:
        overrides["normalization_type"] = "LN"
    if args.n_layers is not None:
        overrides["n_layers"] = args.n_layers
    if args.causal is not None:
        overrides["causal"] = args.causal
    return overrides


def _train_config(args: argparse.Namespace, seed: int = 0) -> TrainConfig:
    return TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        grad_clip=args.grad_clip,
        n_eval=args.n_eval,
        seed=seed,
    )


# ----- commands ---------------------------------------------------------------------------------
def _cmd_tasks(args: argparse.Namespace) -> int:
    from mhainterp.tasks import get_task, list_tasks, task_module

    for name in list_tasks():
        task = get_task(name)
        module = task_module(name)
        doc = (type(task).__doc__ or "").strip().splitlines()
        relations = ", ".join(task.relations(task.sample(1).tokens))
        print(f"{name}")
        print(f"  {doc[0] if doc else ''}")
        print(
            f"  relations: {relations}; targets: {', '.join(task.target_names)}; "
            f"{'causal' if task.causal else 'bidirectional'}; layers >= {task.min_layers}"
        )
        print(f"  defaults: {json.dumps(task.params)}")
        if not module.startswith("mhainterp."):
            print(f"  defined in: {module}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from mhainterp.io import ensure_writable_dir, read_json, run_lock
    from mhainterp.tasks import get_task
    from mhainterp.training import build_model, run_config_differences, run_folder_state, train

    task = get_task(args.task, **dict(args.task_param))
    model = build_model(task, **_model_overrides(args), n_heads=args.n_heads, seed=args.seed)
    config = _train_config(args, args.seed)
    out = Path(args.out)
    ensure_writable_dir(out, "--out")
    state = run_folder_state(out, model, task, config)
    if state == "same finished" and not args.overwrite:
        print(
            f"{out} already holds this run, finished: nothing to do (--overwrite trains it again)"
        )
        _print_eval(read_json(out / "eval.json"))
        return 0
    if state == "different" and not args.overwrite:
        differences = run_config_differences(out, model, task, config)
        raise ValueError(
            f"--out {out} already holds another run ({differences}); to keep it, choose another "
            "--out (to resume it, rerun the command that made it); to replace it, add --overwrite"
        )
    with run_lock(out):  # a sweep or another train writing this folder is refused
        result = train(model, task, config, run_dir=out, progress=not args.quiet)
    print(f"trained {task.name} h={args.n_heads} seed={args.seed} -> {result.path}")
    _print_eval(result.eval)
    return 0


def _print_eval(metrics: dict[str, Any]) -> None:
    for key, value in metrics.items():
        print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from mhainterp.tasks import get_task

    overrides = _model_overrides(args)
    if "n_layers" not in overrides:
        overrides["n_layers"] = get_task(args.task, **dict(args.task_param)).min_layers
    config = SweepConfig(
        task=args.task,
        task_params=dict(args.task_param),
        n_heads=args.n_heads,
        seeds=args.seeds,
        model=overrides,
        train=_train_config(args),
    )
    from mhainterp.demo import run_sweep_with_figures

    if args.address:
        os.environ["MHAINTERP_RAY_ADDRESS"] = args.address
    summary = run_sweep_with_figures(config, Path(args.out), args.executor, not args.quiet)
    print(summary.to_markdown())
    print(f"results, figures and summary in {args.out}")
    return 0


def check_run_folders(path: str | os.PathLike[str]) -> None:
    """Load every run folder at or below ``path`` (each folder with a run file), so that a
    damaged or disagreeing one is refused, naming the file, before anything is computed."""
    from mhainterp.training import RUN_FILES, load_run

    path = Path(path)
    if any((path / name).exists() for name in RUN_FILES):
        runs = {path}
    else:
        runs = {found.parent for name in RUN_FILES for found in path.rglob(name)}
    for run in sorted(runs):
        load_run(run)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from mhainterp.analyze import analyze_path

    check_run_folders(args.path)
    if args.n_eval < 1:
        raise ValueError(f"--n-eval={args.n_eval} is invalid: must be >= 1 sequence")
    results = analyze_path(
        args.path, n_eval=args.n_eval, ablation=not args.no_ablation, progress=not args.quiet
    )
    for run_dir, written in results.items():
        print(f"{run_dir}: {len(written)} files in {run_dir / 'analysis'}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from mhainterp.demo import run_demo

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
