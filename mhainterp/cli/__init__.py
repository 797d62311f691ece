"""The ``mhainterp`` command: one sub-command per job, each defined in its own module.

Each module in ``COMMAND_MODULES`` (one per command, in ``--help`` order) exposes
``register(subparsers)``, which adds its parser and sets ``func=handler``; a handler takes the
parsed args and returns an exit code. ``options`` holds the argument groups they share.

Errors (DESIGN.md, "Errors"): the user's input, a damaged file, a full disk or a folder that
cannot be written end with one line on stderr and exit code 2; Ctrl-C with one line and 130.
``MHAINTERP_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from mhainterp.cli.task_modules import load_task_modules

__all__ = ["main", "build_parser"]

COMMAND_MODULES = (
    "mhainterp.cli.tasks",
    "mhainterp.cli.train",
    "mhainterp.cli.sweep",
    "mhainterp.cli.analyze",
    "mhainterp.cli.demo",
    "mhainterp.cli.ablate",
    "mhainterp.cli.specialize",
    "mhainterp.cli.report",
    "mhainterp.cli.explore",
)

DESCRIPTION = """\
mhainterp: do attention heads really specialize?

Train small multi-head attention models on synthetic tasks with known answers, compare head
counts across seeds, and look inside the heads (patterns, similarity, ablation).

Start here:
  mhainterp tasks                          list the tasks and what they ask
  mhainterp demo --out runs/quickstart     the head-count experiment + analysis, with figures
  mhainterp <command> --help               every command explains its options
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mhainterp",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mhainterp`` console script."""
    try:  # building the parser imports torch and TransformerLens: seconds a Ctrl-C can hit
        parser = build_parser()
    except KeyboardInterrupt:
        if os.environ.get("MHAINTERP_DEBUG"):
            raise
        print("mhainterp: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from mhainterp.io import RunLockedError, describe_os_error
    from mhainterp.training import TrainingDivergedError

    prefix = f"mhainterp {args.command}"
    try:
        load_task_modules(args)  # --task-module: the user's own tasks, before anything else
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if os.environ.get("MHAINTERP_DEBUG"):
            raise
        print(f"{prefix}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except OSError as error:  # a full disk, a read-only folder, a file where a folder belongs
        if os.environ.get("MHAINTERP_DEBUG"):
            raise
        print(f"{prefix}: error: {_one_line(describe_os_error(error))}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, TrainingDivergedError, RunLockedError) as error:
        # The user's input or a damaged run folder: one clear line, no traceback.
        if os.environ.get("MHAINTERP_DEBUG"):
            raise
        print(f"{prefix}: error: {_one_line(str(error))}", file=sys.stderr)
        return 2


def _one_line(message: str) -> str:
    """Several lines (a list of diverged runs) joined into one."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(line if line.endswith(":") else line + ";" for line in lines).rstrip(";")


if __name__ == "__main__":
    raise SystemExit(main())
