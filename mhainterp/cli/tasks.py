"""``mhainterp tasks``: list the registered tasks, what each asks and which relation solves it.

    mhainterp tasks
    mhainterp tasks --task-module my_tasks.py

Each task is printed with its relations, targets, masking, minimum depth and default parameters.
"""

from __future__ import annotations

import argparse
import json

from mhainterp.cli.task_modules import add_task_module_argument

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``tasks`` command to the ``mhainterp`` parser."""
    tasks = subparsers.add_parser(
        "tasks",
        help="list the synthetic tasks",
        description="List the registered tasks: what each asks and which relation solves it.",
    )
    add_task_module_argument(tasks)
    tasks.set_defaults(func=_cmd_tasks)


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
