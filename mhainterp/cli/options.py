"""Shared argument groups and helpers of the ``mhainterp`` sub-commands (not a command).

Task, model and training options (``train``, ``sweep``), the specialization settings
(``specialize``, ``report``) with the ``--by`` axes, and the checks and printing they share.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhainterp.cli.static import (
    CORRECTIONS,
    DEFAULT_N_EVAL,
    SPECIALIZATION_DEFAULTS,
    TRAIN_DEFAULTS,
    ablation_methods,
    division_axes,
)
from mhainterp.cli.task_modules import add_task_module_argument
from mhainterp.runtime import DEFAULT_THREADS, DEVICE_CHOICES, check_device_name
from mhainterp.validation import (
    MAX_SEED,
    check_float,
    check_int,
    check_option,
    check_seed,
    invalid,
)

__all__ = [
    "EXECUTORS",
    "MAX_COUNT",
    "Checked",
    "add_choice",
    "add_float",
    "check_executor",
    "check_folder",
    "add_count",
    "add_int_list",
    "add_n_eval",
    "add_seed",
    "add_runtime_args",
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

if TYPE_CHECKING:
    from mhainterp.config import TrainConfig

MAX_COUNT = 2**31 - 1
"""Largest count an option takes (steps, sequences, widths): beyond it torch's sizes overflow."""

EXECUTORS = ("auto", "local", "batched", "ray")
"""``--executor`` choices of ``sweep`` and ``demo`` (:mod:`mhainterp.sweep.executors`)."""


def check_executor(executor: str) -> str:
    """``executor`` if it can run here: ``ray`` needs Ray installed (the message says how).

    Example:
        >>> check_executor("local")
        'local'
    """
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise invalid(
            "--executor",
            executor,
            "an executor installed here: Ray is not; install it with pip install -e .[ray] "
            "(from a clone) or pip install 'mhainterp[ray]'",
        )
    return executor


def check_folder(name: str, value: str) -> str:
    """A folder option's value (``--out``), refused when empty: ``Path("")`` is the current
    folder, which nobody means by ``--out ""`` (a script's unset variable, say).

    Example:
        >>> check_folder("--out", "runs/rev")
        'runs/rev'
    """
    if value == "":
        raise invalid(name, value, "a folder path, not empty (give . for the current folder)")
    return value


# ----- checked options: every value within its documented range, or one line and exit 2 --------
class Checked(argparse.Action):
    """Store an option's value after ``check(option, value)`` (a :mod:`mhainterp.validation`
    check); a value out of range raises its ``ParameterError``, which ``main`` prints as one
    line with exit code 2. Defaults are not checked (they are the toolkit's own)."""

    def __init__(self, option_strings: list[str], dest: str, check: Any, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.check = check

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, self.check(option_string or self.dest, values))


def add_count(
    parser: Any, flag: str, help: str, *, default: int | None, minimum: int = 1, **kwargs: Any
) -> None:
    """An integer option in ``[minimum, MAX_COUNT]``; its help shows the range and default."""

    def check(name: str, value: int) -> int:
        return check_int(name, value, minimum=minimum, maximum=MAX_COUNT)

    shown = "" if default is None else f", default {default}"
    parser.add_argument(
        flag,
        type=int,
        action=Checked,
        check=check,
        default=default,
        metavar="N",
        help=f"{help} (an integer >= {minimum}{shown})",
        **kwargs,
    )


def add_float(
    parser: Any, flag: str, help: str, *, default: float, minimum: float, maximum: float | None
) -> None:
    """A finite number option with ``minimum < value`` (``< maximum``); help shows both."""

    def check(name: str, value: float) -> float:
        return check_float(name, value, minimum=minimum, maximum=maximum, inclusive=False)

    below = "" if maximum is None else f" and < {maximum}"
    parser.add_argument(
        flag,
        type=float,
        action=Checked,
        check=check,
        default=default,
        metavar="X",
        help=f"{help} (a number > {minimum}{below}, default {default})",
    )


def add_choice(
    parser: Any,
    flag: str,
    help: str,
    options: tuple[str, ...] | dict[str, str],
    *,
    default: str,
) -> None:
    """An option that takes one of ``options``; help lists them (each with its description,
    when ``options`` maps names to one) and the default."""
    names = tuple(options)
    listed = (
        "; ".join(f"{name}: {text}" for name, text in options.items())
        if isinstance(options, dict)
        else ", ".join(names)
    )
    parser.add_argument(
        flag,
        action=Checked,
        check=lambda name, value: check_option(name, value, names),
        default=default,
        metavar="{" + ",".join(names) + "}",
        help=f"{help}: {listed} (default {default})",
    )


def add_seed(parser: Any, flag: str = "--seed", help: str = "init and data seed") -> None:
    """A seed option: ``0 <= seed <= 2**63 - 1`` (torch's int64), default 0."""
    parser.add_argument(
        flag,
        type=int,
        action=Checked,
        check=check_seed,
        default=0,
        metavar="SEED",
        help=f"{help} (0 <= SEED <= 2**63 - 1, default 0)",
    )


def add_int_list(
    parser: Any, flag: str, help: str, *, default: list[int], seeds: bool = False
) -> None:
    """A comma-separated list of distinct integers, with ranges (``0-99``, ``1,4,8``,
    ``0-4,10``): head counts (>= 1) or seeds (see :func:`add_seed`); help shows the default."""
    low, high = (0, MAX_SEED) if seeds else (1, MAX_COUNT)

    def check(name: str, values: list[int]) -> list[int]:
        ok = bool(values) and all(low <= v <= high for v in values)
        repeated = sorted({v for v in values if values.count(v) > 1})
        if not ok or repeated:
            allowed = f"distinct integers >= {low} and <= {high}, comma-separated"
            if repeated:  # say which, in a long list of ranges it is hard to see
                allowed += f" ({', '.join(map(str, repeated))} given twice)"
            raise invalid(name, ",".join(map(str, values)), allowed)
        return values

    parser.add_argument(
        flag,
        type=int_list,
        action=Checked,
        check=check,
        default=default,
        metavar="A,B,C-D",
        help=f"{help} (default {','.join(map(str, default))})",
    )


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """The ``where it runs`` group of every command that runs a model: ``--device`` and
    ``--threads`` (:func:`mhainterp.runtime.device_context` and
    :func:`~mhainterp.runtime.threads_context` carry them to every model the command loads and
    every analysis it runs)."""
    group = parser.add_argument_group("where it runs")
    group.add_argument(
        "--device",
        action=Checked,
        check=lambda name, value: check_device_name(value, name),
        default="auto",
        metavar="DEVICE",
        help=f"{DEVICE_CHOICES} (default auto: CUDA when available, else the CPU; a device "
        "this machine does not have is refused before any work)",
    )
    add_count(
        group,
        "--threads",
        f"torch threads on the CPU; 0 keeps torch's default of one per core (default "
        f"{DEFAULT_THREADS} for the small models: more threads contend for the cores, on a busy "
        "machine one thread was 5-20x faster; a pretrained model's own: its matmuls are large)",
        default=None,
        minimum=0,
    )


def add_n_eval(parser: Any, help: str = "evaluation sequences") -> None:
    """``--n-eval``, one default for every command (``mhainterp.config.DEFAULT_N_EVAL``)."""
    add_count(parser, "--n-eval", help, default=DEFAULT_N_EVAL)


# ----- argument types ---------------------------------------------------------------------------
MAX_LIST = 100_000
"""Most values a list option expands to (``--seeds 0-99999``): a typo such as ``0-1000000000``
is refused at once instead of planning a billion runs."""


def int_list(text: str) -> list[int]:
    """``1,4,8`` -> ``[1, 4, 8]``, ``0-3,7`` -> ``[0, 1, 2, 3, 7]`` (an argparse ``type``).

    Example:
        >>> int_list("0-4,10")
        [0, 1, 2, 3, 4, 10]
    """
    values: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            if dash and low.strip():  # a range A-B (a leading '-' is a negative number)
                first, last = int(low), int(high)
                if last < first or last - first >= MAX_LIST:
                    raise ValueError
                values.extend(range(first, last + 1))
            else:
                values.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers or ranges A-B (A <= B, at most "
                f"{MAX_LIST:,} values), got {text!r}"
            ) from None
    if len(values) > MAX_LIST:
        raise argparse.ArgumentTypeError(f"at most {MAX_LIST:,} values, got {len(values):,}")
    return values


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
    group.add_argument(
        "--task",
        default="count_previous",
        help="task name (see `mhainterp tasks`; default count_previous)",
    )
    add_task_module_argument(group)
    group.add_argument(
        "--task-param",
        type=task_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task parameter, repeatable: --task-param seq_len=16 --task-param d_vocab=10 "
        "(each task checks its own: seq_len 2..65536, d_vocab 2..1048576; default: the "
        "task's, see `mhainterp tasks`)",
    )


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The ``model`` group: everything but the head count."""
    group = parser.add_argument_group("model (everything but the head count is shared)")
    add_count(group, "--d-model", "residual width", default=64)
    add_count(group, "--n-layers", "blocks (default: the task's minimum)", default=None)
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
    causal.add_argument(
        "--bidirectional",
        dest="causal",
        action="store_false",
        help="let every position see every other (default: what the task expects)",
    )


def add_train_args(parser: argparse.ArgumentParser) -> None:
    """The ``training`` group, defaults from :class:`~mhainterp.config.TrainConfig`."""
    group = parser.add_argument_group("training")
    add_count(group, "--steps", "optimiser steps", default=TRAIN_DEFAULTS["steps"])
    add_count(
        group, "--batch-size", "fresh sequences per step", default=TRAIN_DEFAULTS["batch_size"]
    )
    add_float(
        group,
        "--lr",
        "peak AdamW learning rate",
        default=TRAIN_DEFAULTS["lr"],
        minimum=0,
        maximum=None,
    )
    add_count(
        group,
        "--warmup-steps",
        "linear warm-up steps, at most --steps (default: 10%% of the steps, at most 100)",
        default=None,
        minimum=0,
    )
    add_float(
        group,
        "--grad-clip",
        "largest global gradient norm",
        default=TRAIN_DEFAULTS["grad_clip"],
        minimum=0,
        maximum=None,
    )
    add_n_eval(group, "sequences of the task's fixed evaluation set")
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
    from mhainterp.config import TrainConfig  # torch: not for --help

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
    """Check every run folder at or below ``path`` (each folder with a run file) from its files
    (:func:`~mhainterp.training.check_run_folder`: no weights loaded), so that a damaged or
    disagreeing one is refused, naming the file, before anything is computed."""
    from mhainterp.runs import RUN_FILES
    from mhainterp.training import check_run_folder

    path = Path(path)
    if any((path / name).exists() for name in RUN_FILES):
        runs = {path}
    else:
        runs = {found.parent for name in RUN_FILES for found in path.rglob(name)}
    for run in sorted(runs):
        check_run_folder(run)


# ----- specialization settings ------------------------------------------------------------------
def add_settings_args(parser: argparse.ArgumentParser) -> None:
    """The ``specialization test`` group (and ``--task-module``) of ``specialize`` and
    ``report``; defaults from :class:`~mhainterp.specialization.SpecializationSettings`."""
    defaults = SPECIALIZATION_DEFAULTS
    group = parser.add_argument_group("specialization test")
    add_n_eval(
        group,
        "held-out sequences of the task's fixed evaluation set, for both the labels and the "
        "division of labour",
    )
    add_float(
        group,
        "--alpha",
        "significance level after correction",
        default=defaults["alpha"],
        minimum=0,
        maximum=1,
    )
    add_choice(
        group,
        "--correction",
        "multiple-comparison correction",
        CORRECTIONS,
        default=defaults["correction"],
    )
    group.add_argument(
        "--min-effect",
        type=float,
        action=Checked,
        check=lambda name, value: check_float(name, value, minimum=0),
        default=defaults["min_effect"],
        metavar="X",
        help="smallest effect size that counts as a role (a number >= 0, default "
        f"{defaults['min_effect']})",
    )
    add_choice(
        group,
        "--ablation-method",
        "ablation method for damage, redundancy and the division",
        ablation_methods(),
        default=defaults["method"],
    )
    axes = division_axes()
    listed = "; ".join(f"{name}: {text}" for name, text in axes.items())
    group.add_argument(
        "--by",
        default=",".join(axes),
        help=f"axes of the division of labour, comma-separated ({listed}; default: every "
        f"axis that applies: {','.join(axes)}); 'none' to skip it",
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
        method=args.ablation_method,
    )


def by_axes(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--by`` axes (empty for ``none``)."""
    if args.by.strip().lower() == "none":
        return ()
    return tuple(part.strip() for part in args.by.split(",") if part.strip())
