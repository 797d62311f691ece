"""``mhainterp tasks``: list the registered tasks, what each asks and which relation solves it.

    mhainterp tasks
    mhainterp tasks --task-module my_tasks.py

Each task is printed with its first sentence of description, relations, targets, masking,
minimum depth and default parameters. Without ``--task-module`` and installed task packages,
the built-ins are listed from :data:`mhainterp.cli.static.BUILTIN_TASKS`, without importing torch.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys
import textwrap
from typing import Any

from mhainterp.cli.static import BUILTIN_TASKS, ENTRY_POINT_GROUP
from mhainterp.cli.task_modules import add_task_module_argument

__all__ = ["describe_task", "first_sentence", "format_task", "register"]

_WIDTH = 96
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :class:`~a.b.C` -> C (the last dotted part)
_LITERAL = re.compile(r"``([^`]+)``")  # ``x`` -> x
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]])\.(?=\s+[A-Z(]|\s*$)")


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
    entries = dict(BUILTIN_TASKS)
    if "mhainterp.tasks" in sys.modules or _has_task_packages():  # user tasks: ask the registry
        entries = _registry_entries()
    for name, entry in sorted(entries.items()):
        print(format_task(name, entry))
    return 0


def _has_task_packages() -> bool:
    return bool(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _registry_entries() -> dict[str, dict[str, Any]]:
    from mhainterp.tasks import get_task, list_tasks

    return {name: describe_task(get_task(name)) for name in list_tasks()}


def describe_task(task: Any) -> dict[str, Any]:
    """What ``mhainterp tasks`` prints about a built task (JSON values only).

    Returns:
        ``{"summary", "relations", "targets", "causal", "min_layers", "defaults"}`` and, for a
        task defined outside mhainterp, ``"module"``.
    """
    from mhainterp.tasks import task_module

    entry = {
        "summary": first_sentence(type(task).__doc__ or ""),
        "relations": list(task.relation_names),
        "targets": list(task.target_names),
        "causal": bool(task.causal),
        "min_layers": int(task.min_layers),
        "defaults": dict(task.params),
    }
    module = task_module(task.name)
    if not module.startswith("mhainterp."):
        entry["module"] = module
    return entry


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring, on one line, RST markup removed.

    Example:
        >>> first_sentence("Copy the ``t - 1`` token (:class:`~mhainterp.tasks.Task`). Then x.")
        'Copy the t - 1 token (Task).'
    """
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    paragraph = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], paragraph)
    paragraph = _LITERAL.sub(r"\1", paragraph)
    end = _SENTENCE_END.search(paragraph)
    return paragraph[: end.end()] if end else paragraph


def format_task(name: str, entry: dict[str, Any]) -> str:
    """One task's block of ``mhainterp tasks``: its name, then indented lines."""
    lines = [name]
    lines += textwrap.wrap(entry["summary"], _WIDTH, initial_indent="  ", subsequent_indent="  ")
    facts = (
        f"relations: {', '.join(entry['relations'])}; targets: {', '.join(entry['targets'])}; "
        f"{'causal' if entry['causal'] else 'bidirectional'}; layers >= {entry['min_layers']}"
    )
    lines += textwrap.wrap(facts, _WIDTH, initial_indent="  ", subsequent_indent="    ")
    lines.append(f"  defaults: {json.dumps(entry['defaults'])}")
    if "module" in entry:
        lines.append(f"  defined in: {entry['module']}")
    return "\n".join(lines)
