"""``--task-module PATH_OR_MODULE``: the user's own tasks, for every command that builds or loads
a task. ``main`` imports the named files or modules before the command runs; a run folder's
recorded module is never imported unless the user names it here."""

from __future__ import annotations

import argparse

__all__ = ["add_task_module_argument", "load_task_modules"]


def add_task_module_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Add the repeatable ``--task-module`` option to a command's parser."""
    parser.add_argument(
        "--task-module",
        action="append",
        default=[],
        metavar="PATH_OR_MODULE",
        help="a Python file (my_tasks.py) or module (mylab.tasks) that registers your own "
        "tasks with mhainterp.tasks.register_task; repeatable",
    )


def load_task_modules(args: argparse.Namespace) -> None:
    """Import every ``--task-module`` the command was given (none: nothing, not even torch)."""
    specs = getattr(args, "task_module", None) or []
    if not specs:
        return
    from mhainterp.tasks import load_task_module

    for spec in specs:
        load_task_module(spec)
