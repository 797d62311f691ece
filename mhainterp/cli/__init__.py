"""The ``mhainterp`` command: one sub-command per job, each defined in its own module.

Each module in ``COMMAND_MODULES`` exposes ``register(subparsers)``, which adds its parser(s)
and sets ``func=handler``; a handler takes the parsed args and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from mhainterp.cli.task_modules import load_task_modules

__all__ = ["main", "build_parser"]

COMMAND_MODULES = (
    "mhainterp.cli.core",
    "mhainterp.cli.inspect",
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        load_task_modules(args)  # --task-module: the user's own tasks, before anything else
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as error:
        # User errors: one clear line, no traceback.
        print(f"mhainterp {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
