"""The task registry: tasks by name, so configs, sweeps and the CLI can refer to them.

Each registration also remembers the module that defined the task (:func:`task_module`), which
a run folder records beside the task's name, so that a run of a user's task can say which
module to import before it can be loaded. Tasks of installed packages (the ``mhainterp.tasks``
entry-point group) and of a user's file or module (:func:`~mhainterp.tasks.load_task_module`)
are loaded by :mod:`mhainterp.tasks.plugins`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from mhainterp.tasks.base import Task, init_param_names

__all__ = [
    "accepted_params",
    "get_task",
    "list_tasks",
    "register_task",
    "task_from_record",
    "task_module",
    "task_record",
    "unregister_task",
]

TaskFactory = Callable[..., Task]

_REGISTRY: dict[str, TaskFactory] = {}
_MODULES: dict[str, str] = {}  # task name -> the module (dotted name or file path) defining it
_defining: list[str] = []  # the module being loaded by plugins.load_task_module, innermost last
_lookup_hooks: list[Callable[[], None]] = []  # run once before the first lookup (entry points)


@contextlib.contextmanager
def defining_module(module: str) -> Iterator[None]:
    """Tasks registered inside this block record ``module`` as the module that defined them
    (a file loaded by path has no importable ``__module__`` of its own)."""
    _defining.append(module)
    try:
        yield
    finally:
        _defining.pop()


def _load_plugins() -> None:
    while _lookup_hooks:
        _lookup_hooks.pop(0)()


def register_task(name: str, factory: TaskFactory, *, overwrite: bool = False) -> TaskFactory:
    """Register a task under ``name`` so ``get_task(name, **params)`` builds it.

    Args:
        name: The registry name; it becomes the built task's ``name`` (and so seeds its fixed
            evaluation set).
        factory: A :class:`Task` subclass, or any callable taking keyword parameters and
            returning a ``Task``.
        overwrite: Replace an existing registration instead of raising.

    Returns:
        ``factory``, unchanged.

    Raises:
        ValueError: If ``name`` is already registered and ``overwrite`` is False, or is empty.
        TypeError: If ``name`` is not a string or ``factory`` is not callable.

    Example:
        >>> from mhainterp.tasks import ReverseTask, get_task
        >>> _ = register_task("reverse_long", lambda seq_len=32, **kw: ReverseTask(seq_len, **kw))
        >>> get_task("reverse_long").seq_len
        32
        >>> unregister_task("reverse_long")
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}.")
    if not name.strip():
        raise ValueError(f"name={name!r} is invalid: must be a non-empty string.")
    if not callable(factory):
        raise TypeError(
            f"factory must be a Task subclass or a callable returning a Task, "
            f"got {type(factory).__name__}."
        )
    if name in _REGISTRY and not overwrite:
        raise ValueError(
            f"a task named {name!r} is already registered ({_describe(_REGISTRY[name])}); "
            f"pass overwrite=True to replace it, or choose another name."
        )
    _REGISTRY[name] = factory
    _MODULES[name] = _defining[-1] if _defining else getattr(factory, "__module__", "") or ""
    return factory


def task_module(name: str) -> str:
    """The module that registered task ``name``: a dotted module name, or a file's path for a
    module loaded from a file (what a run folder records, and what ``--task-module`` takes).

    Example:
        >>> task_module("reverse")
        'mhainterp.tasks.builtin'
    """
    _lookup(name)
    return _MODULES.get(name, "")


def task_record(task: Task) -> dict[str, Any]:
    """What a run folder stores about its task: ``{"name", "params", "module"}`` (no code).

    Example:
        >>> from mhainterp.tasks import get_task
        >>> task_record(get_task("reverse", seq_len=8))["module"]
        'mhainterp.tasks.builtin'
    """
    try:
        module = task_module(task.name)
    except ValueError:  # a task object that was never registered: its class's module
        module = type(task).__module__
    return {"name": task.name, "params": dict(task.params), "module": module}


def task_from_record(record: dict[str, Any], source: Any = "the run folder") -> Task:
    """Rebuild a task from :func:`task_record` output, by name.

    The module the record names is never imported (a run folder is data, not code): a task
    that is not registered raises an error that says which module to load, and how.

    Args:
        record: ``{"name", "params"}`` and, for runs written since it was recorded, ``"module"``.
        source: Where the record comes from (named in the error), e.g. ``run/config.json``.

    Raises:
        ValueError: If the task is not registered (or its parameters are invalid).
    """
    name = record["name"]
    if name not in _REGISTRY:
        _load_plugins()
    if name not in _REGISTRY:
        module = record.get("module")
        if not module:  # a folder written before the module was recorded
            raise ValueError(
                f"{source}: task {name!r} is not registered and the folder does not say which "
                "module defines it; load that module first (--task-module PATH_OR_MODULE)"
            )
        raise ValueError(
            f"{source}: task {name!r} is not registered; it was defined in {module}. Load it "
            f"first: --task-module {module} on the command line, or "
            f"mhainterp.tasks.load_task_module({module!r}) in Python"
        )
    return get_task(name, **record.get("params", {}))


def unregister_task(name: str) -> None:
    """Remove a registered task.

    Raises:
        ValueError: If ``name`` is not registered.

    Example:
        >>> from mhainterp.tasks import ReverseTask
        >>> _ = register_task("tmp_task", ReverseTask)
        >>> unregister_task("tmp_task")
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(list_tasks())}.")
    del _REGISTRY[name]
    _MODULES.pop(name, None)


def list_tasks() -> list[str]:
    """The registered task names, sorted.

    Example:
        >>> "reverse" in list_tasks()
        True
    """
    _load_plugins()
    return sorted(_REGISTRY)


def accepted_params(name: str) -> list[str] | None:
    """The keyword parameters the task registered as ``name`` accepts (None if any are).

    Example:
        >>> accepted_params("sort")
        ['seq_len', 'd_vocab', 'min_len']
    """
    return _factory_params(_lookup(name))


def get_task(name: str, **params: Any) -> Task:
    """Build the task registered as ``name`` with keyword ``params``.

    Args:
        name: A registered name (see :func:`list_tasks`).
        **params: The task's parameters; every built-in accepts ``seq_len`` (default 16),
            ``d_vocab`` (default 10) and ``min_len`` (default ``seq_len``).

    Returns:
        The task; ``get_task(task.name, **task.params)`` rebuilds an equal one.

    Raises:
        ValueError: For an unknown name (the message lists the registered ones), an unknown
            parameter (the message lists the accepted ones), or an invalid value.

    Example:
        >>> task = get_task("count_previous", seq_len=16, d_vocab=10)
        >>> task.d_vocab_out, task.causal
        (16, True)
    """
    factory = _lookup(name)
    accepted = _factory_params(factory)
    if accepted is not None:
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise ValueError(
                f"task {name!r} got unknown parameter(s) {unknown}; accepted parameters: "
                f"{accepted}."
            )
    task = factory(**params)
    if not isinstance(task, Task):
        raise TypeError(
            f"the factory registered as {name!r} ({_describe(factory)}) returned "
            f"{type(task).__name__}, not a Task."
        )
    if task.name != name:
        task.name = name  # the registry name identifies the task (and seeds its eval set)
    return task


def _lookup(name: str) -> TaskFactory:
    if name not in _REGISTRY:
        _load_plugins()
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(list_tasks())}.")
    return _REGISTRY[name]


def _factory_params(factory: TaskFactory) -> list[str] | None:
    if isinstance(factory, type):
        return init_param_names(factory)
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _describe(factory: TaskFactory) -> str:
    return getattr(factory, "__qualname__", None) or repr(factory)
