"""``mhainterp ablate``: remove heads from a trained run and see what breaks.

One-shot::

    mhainterp ablate RUN --heads L0H1,L0H3 --method mean

prints the metrics before and after (overall and per target). Interactive::

    mhainterp ablate RUN --interactive

reads commands from standard input (``list``, ``L0H2`` or ``toggle L0H2``, ``set L0H1,L0H3``,
``method mean``, ``reset``, ``eval``, ``help``, ``quit``) and prints the table after every change.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from mhainterp.cli.options import add_choice, add_n_eval, add_runtime_args, add_seed
from mhainterp.cli.static import ablation_methods
from mhainterp.cli.task_modules import add_task_module_argument
from mhainterp.heads import head_set_labels, parse_head_label
from mhainterp.validation import ParameterError, invalid

if TYPE_CHECKING:  # imported by the handler: torch is not needed for --help
    import pandas as pd

    from mhainterp.ablation import Ablator
    from mhainterp.training import Run

__all__ = ["register", "run_ablate", "interactive_session", "format_metrics_table"]

ABLATE_DESCRIPTION = """\
Ablate (remove) attention heads of a trained run and compare loss and accuracy on the task's
fixed evaluation set before and after, overall and per target.

Methods (each edits the heads' outputs before W_O, so no other head changes):
  zero      the head writes nothing
  mean      the head's output is replaced by its mean over the evaluation set (per position)
  resample  the head's output comes from another sequence of the evaluation set

examples (run folders as `mhainterp demo` writes them):
  mhainterp ablate runs/quickstart/count_previous/runs/h4_seed0 --heads L0H1,L0H3 --method mean
  mhainterp ablate runs/quickstart/count_previous/runs/h4_seed0 --interactive
"""

HELP_TEXT = """\
commands:
  list                 show every head; [x] marks the ablated ones
  HEAD[,HEAD]          ablate a head, or restore it if it is ablated (e.g. L0H2)
  toggle HEAD[,HEAD]   the same (e.g. toggle L0H2)
  set HEAD[,HEAD]      ablate exactly these heads ('set' alone: none)
  method NAME          switch method: zero, mean or resample
  reset                restore every head
  eval                 print the metrics table again
  help                 this text
  quit                 leave (end of input also leaves)"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``ablate`` command to the ``mhainterp`` parser."""
    parser = subparsers.add_parser(
        "ablate",
        help="ablate heads of a run and compare metrics (or explore interactively)",
        description=ABLATE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN", help="a run folder (written by train or sweep)")
    parser.add_argument(
        "--heads", default=None, help="comma-separated heads to ablate, e.g. L0H1,L0H3"
    )
    add_choice(parser, "--method", "ablation method", ablation_methods(), default="zero")
    parser.add_argument(
        "--interactive", action="store_true", help="open a session that reads commands from stdin"
    )
    add_n_eval(parser, "sequences of the task's fixed evaluation set")
    add_seed(parser, help="seed of the resample permutation")
    add_task_module_argument(parser)
    add_runtime_args(parser)
    parser.set_defaults(func=run_ablate)


def run_ablate(args: argparse.Namespace) -> int:
    """Handler of ``mhainterp ablate``; returns the exit code."""
    import torch

    from mhainterp.ablation import Ablator
    from mhainterp.training import load_run

    if not args.interactive and not args.heads:
        raise ParameterError(
            "--heads is invalid: the heads to ablate (--heads L0H1,L0H3) or --interactive, "
            "got neither"
        )
    run = load_run(args.run)
    ablator = Ablator(
        run.model,
        run.task,
        method=args.method,
        generator=torch.Generator().manual_seed(args.seed),
        n_eval=args.n_eval,
    )
    if args.interactive:
        return interactive_session(ablator, sys.stdin, sys.stdout, header=_describe_run(run))
    ablator.set(args.heads)
    print(_describe_run(run))
    print(_status(ablator))
    print(format_metrics_table(ablator.table()))
    return 0


def _describe_run(run: Run) -> str:
    cfg = run.model.cfg
    return (
        f"run: {run.path}\ntask: {run.task.name}  model: {cfg.n_layers} layer(s) x "
        f"{cfg.n_heads} heads, d_model {cfg.d_model}"
    )


def _status(ablator: Ablator) -> str:
    heads = ", ".join(ablator.heads) or "none"
    return (
        f"method: {ablator.method}  ablated: {heads}  ({len(ablator.batch_)} evaluation sequences)"
    )


def format_metrics_table(table: pd.DataFrame) -> str:
    """The ``metric / before / after / change`` table as aligned text (4 decimals).

    Each number column is at least 10 wide and always one wider than its longest value, so a
    large loss (``13263.4007``) keeps a space before it instead of running into its neighbour.

    Args:
        table: :meth:`mhainterp.ablation.Ablator.table` output (``metric, baseline, ablated,
            delta``).

    Example:
        >>> print(format_metrics_table(Ablator(model, task).set("L0H1").table()))  # doctest: +SKIP
        metric        before     after    change
        loss          0.0000    0.0000   +0.0000
        accuracy      1.0000    1.0000   +0.0000
    """
    width = max(len("metric"), *(len(m) for m in table["metric"])) + 2
    columns = {
        "before": [f"{v:.4f}" for v in table["baseline"]],
        "after": [f"{v:.4f}" for v in table["ablated"]],
        "change": [f"{v:+.4f}" for v in table["delta"]],
    }
    widths = {name: max(10, *(len(v) + 1 for v in values)) for name, values in columns.items()}
    lines = [f"{'metric':<{width}}" + "".join(f"{name:>{widths[name]}}" for name in columns)]
    for i, metric in enumerate(table["metric"]):
        cells = "".join(f"{values[i]:>{widths[name]}}" for name, values in columns.items())
        lines.append(f"{metric:<{width}}{cells}")
    return "\n".join(lines)


def _list_heads(ablator: Ablator) -> str:
    ablated = set(ablator.heads)
    n_heads = ablator.model.cfg.n_heads
    labels = ablator.valid_heads
    lines = []
    for layer in range(ablator.model.cfg.n_layers):
        row = labels[layer * n_heads : (layer + 1) * n_heads]
        marks = "  ".join(f"[{'x' if label in ablated else ' '}] {label}" for label in row)
        lines.append(f"layer {layer}:  {marks}")
    return "\n".join(lines)


def _heads_argument(text: str) -> str:
    """``"L0H1 L0H2"`` or ``"L0H1, L0H2"`` -> ``"L0H1,L0H2"``."""
    return ",".join(part for part in text.replace(",", " ").split())


def _looks_like_heads(word: str) -> bool:
    """``L0H1`` or ``L0H1,L1H2``: a head list typed without ``toggle`` (its form only; toggle
    checks the heads against the model)."""
    try:
        return bool([parse_head_label(label) for label in head_set_labels(word)])
    except ParameterError:
        return False


def _command_table(ablator: Ablator) -> dict[str, Callable[[str], bool]]:
    """Command name -> action(argument); the action returns True when the metrics changed."""

    def toggle(arg: str) -> bool:
        if not arg.strip():
            raise invalid("toggle", arg, "a head, e.g. 'toggle L0H2'")
        ablator.toggle(_heads_argument(arg))
        return True

    def set_heads(arg: str) -> bool:
        ablator.set(_heads_argument(arg))
        return True

    def method(arg: str) -> bool:
        if not arg.strip():
            names = ", ".join(ablation_methods())
            raise invalid("method", arg, f"one of {names} (now {ablator.method!r})")
        ablator.method = arg.strip()
        return True

    def reset(arg: str) -> bool:
        ablator.reset()
        return True

    return {
        "toggle": toggle,
        "set": set_heads,
        "method": method,
        "reset": reset,
        "eval": lambda arg: True,
    }


def interactive_session(
    ablator: Ablator, stdin: TextIO, stdout: TextIO, *, header: str = ""
) -> int:
    """Read ablation commands from ``stdin`` until ``quit`` or end of input; returns 0.

    A command that fails (an unknown head, an unknown method) prints the error and the session
    goes on. The prompt ``ablate>`` is shown only when ``stdin`` is a terminal.
    """

    def say(text: str = "") -> None:
        print(text, file=stdout, flush=True)

    def show() -> None:
        say(_status(ablator))
        say(format_metrics_table(ablator.table()))

    if header:
        say(header)
    say("interactive ablation: type 'help' for commands, 'quit' to leave")
    show()
    commands = _command_table(ablator)
    interactive = stdin.isatty()
    while True:
        if interactive:
            print("ablate> ", end="", file=stdout, flush=True)
        try:
            line = stdin.readline()
        except KeyboardInterrupt:  # end the prompt's line; the CLI prints one line and exits
            if interactive:
                say()
            raise
        if not line:  # end of input
            if interactive:
                say()
            return 0
        name, _, arg = line.strip().partition(" ")
        if not name:
            continue
        if _looks_like_heads(name):  # "L0H1" alone (or "L0H1,L0H2 L1H0") toggles
            name, arg = "toggle", line
        if name in ("quit", "exit", "q"):
            return 0
        if name in ("help", "?"):
            say(HELP_TEXT)
        elif name in ("list", "ls"):
            say(_list_heads(ablator))
        elif name in commands:
            try:
                commands[name](arg)
            except (ValueError, TypeError) as error:
                say(f"error: {error}")
                continue
            show()
        else:
            say(f"unknown command {name!r}; type 'help' for the commands")
