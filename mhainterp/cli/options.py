"""Shared argument groups and helpers of the ``mhainterp`` sub-commands (not a command).

Task, model and training options (``train``, ``sweep``), the specialization settings
(``specialize``, ``report``) with the ``--by`` axes, and the checks and printing they share.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from mhainterp.cli.task_modules import add_task_module_argument
from mhainterp.config import TrainConfig

__all__ = [
    "int_list",
    "task_param",
    "add_task_args",
    "add_model_args",
    "add_train_args",
    "model_overrides",
    "train_config",
    "print_eval",
    "check_run_folders",
    "add_settings_args",
    "settings_from_args",
    "by_axes",
]


# ----- argument types ---------------------------------------------------------------------------
def int_list(text: str) -> list[int]:
    """``1,4,8`` -> ``[1, 4, 8]`` (an argparse ``type``)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def task_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``, the value parsed as JSON where it is JSON."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


# ----- task, model and training -----------------------------------------------------------------
def add_task_args(parser: argparse.ArgumentParser) -> None:
    """The ``task`` group: ``--task``, ``--task-module``, ``--task-param``."""
    group = parser.add_argument_group("task")
    group.add_argument("--task", default="count_previous", help="task name (see `mhainterp tasks`)")
    add_task_module_argument(group)
    group.add_argument(
        "--task-param",
        type=task_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task parameter, repeatable: --task-param seq_len=16 --task-param d_vocab=10",
    )


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The ``model`` group: everything but the head count."""
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


def add_train_args(parser: argparse.ArgumentParser) -> None:
    """The ``training`` group, defaults from :class:`TrainConfig`."""
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


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The model options given, as ``build_model`` keyword arguments."""
    overrides: dict[str, Any] = {"d_model": args.d_model, "attn_only": not args.mlp}
    if args.layer_norm:
        overrides["normalization_type"] = "LN"
    if args.n_layers is not None:
        overrides["n_layers"] = args.n_layers
    if args.causal is not None:
        overrides["causal"] = args.causal
    return overrides


def train_config(args: argparse.Namespace, seed: int = 0) -> TrainConfig:
    """The training options given, as a :class:`TrainConfig` for ``seed``."""
    return TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        grad_clip=args.grad_clip,
        n_eval=args.n_eval,
        seed=seed,
    )


def print_eval(metrics: dict[str, Any]) -> None:
    """Print evaluation metrics, one ``key: value`` a line."""
    for key, value in metrics.items():
        print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")


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


# ----- specialization settings ------------------------------------------------------------------
def add_settings_args(parser: argparse.ArgumentParser) -> None:
    """The ``specialization test`` group (and ``--task-module``) of ``specialize`` and
    ``report``."""
    from mhainterp.specialization import CORRECTIONS, SpecializationSettings

    defaults = SpecializationSettings()
    group = parser.add_argument_group("specialization test")
    group.add_argument(
        "--n-eval",
        type=int,
        default=defaults.n_eval,
        help=f"held-out sequences (default {defaults.n_eval})",
    )
    group.add_argument("--alpha", type=float, default=defaults.alpha, help="level after correction")
    group.add_argument(
        "--correction",
        default=defaults.correction,
        choices=CORRECTIONS,
        help="multiple-comparison correction (default holm)",
    )
    group.add_argument(
        "--min-effect",
        type=float,
        default=defaults.min_effect,
        help=f"smallest effect size that counts as a role (default {defaults.min_effect})",
    )
    group.add_argument(
        "--ablation-method",
        default=defaults.ablation_method,
        help="ablation method for damage and redundancy (default mean)",
    )
    group.add_argument(
        "--by",
        default="token,position,target_class,target",
        help="axes of the division of labour, comma-separated (default: every axis that "
        "applies: token,position,target_class,target); 'none' to skip it",
    )
    group.add_argument("--quiet", action="store_true", help="no progress bars")
    add_task_module_argument(parser)


def settings_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~mhainterp.specialization.SpecializationSettings` the options give."""
    from mhainterp.specialization import SpecializationSettings

    return SpecializationSettings(
        n_eval=args.n_eval,
        alpha=args.alpha,
        correction=args.correction,
        min_effect=args.min_effect,
        ablation_method=args.ablation_method,
    )


def by_axes(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--by`` axes (empty for ``none``)."""
    if args.by.strip().lower() == "none":
        return ()
    return tuple(part.strip() for part in args.by.split(",") if part.strip())
