"""The task registry: tasks by name, so configs, sweeps and the CLI can refer to them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from mhainterp.tasks.base import Task, init_param_names

__all__ = ["accepted_params", "get_task", "list_tasks", "register_task", "unregister_task"]

TaskFactory = Callable[..., Task]

_REGISTRY: dict[str, TaskFactory] = {}


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
    return factory


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


def list_tasks() -> list[str]:
    """The registered task names, sorted.

    Example:
        >>> "reverse" in list_tasks()
        True
    """
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
