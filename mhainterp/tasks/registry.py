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
import json
from collections.abc import Callable, Iterator
from typing import Any

from mhainterp.errors import InvalidTaskError
from mhainterp.tasks.base import Task, init_param_names
from mhainterp.tasks.contract import task_error, validate_task
from mhainterp.validation import invalid

__all__ = [
    "accepted_params",
    "get_task",
    "list_tasks",
    "on_first_lookup",
    "register_task",
    "registered_modules",
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
_validated: set[tuple[str, str]] = set()  # (name, params) already checked against the contract


@contextlib.contextmanager
def defining_module(module: str) -> Iterator[None]:
    """Tasks registered inside this block record ``module`` as the module that defined them
    (a file loaded by path has no importable ``__module__`` of its own)."""
    _defining.append(module)
    try:
        yield
    finally:
        _defining.pop()


def on_first_lookup(hook: Callable[[], None]) -> None:
    """Run ``hook`` once, before the next task lookup or listing (how
    :mod:`~mhainterp.tasks.plugins` loads installed packages' tasks only when one is needed)."""
    _lookup_hooks.append(hook)


def registered_modules() -> dict[str, str]:
    """Task name -> the module that registered it, for the tasks registered so far (a copy;
    installed packages' tasks are not loaded for it, unlike :func:`list_tasks`).

    Example:
        >>> registered_modules()["reverse"]
        'mhainterp.tasks.builtin'
    """
    return {name: _MODULES.get(name, "") for name in _REGISTRY}


def _load_plugins() -> None:
    while _lookup_hooks:
        _lookup_hooks.pop(0)()


def register_task(
    name: str, factory: TaskFactory, *, overwrite: bool = False, validate: bool = True
) -> TaskFactory:
    """Register a task under ``name`` so ``get_task(name, **params)`` builds it.

    The task is checked against the Task contract (:mod:`mhainterp.tasks.contract`) once: now,
    built with its defaults, when every parameter of ``factory`` has a default; otherwise the
    first time :func:`get_task` builds it (and again for other parameters).

    Args:
        name: The registry name; it becomes the built task's ``name`` (and so seeds its fixed
            evaluation set).
        factory: A :class:`Task` subclass, or any callable taking keyword parameters and
            returning a ``Task``.
        overwrite: Replace an existing registration instead of raising.
        validate: False leaves the check to the first :func:`get_task` (the built-ins, which
            are registered when :mod:`mhainterp.tasks` is imported).

    Returns:
        ``factory``, unchanged.

    Raises:
        ParameterError: If ``name`` is not a non-empty string or is already registered (and
            ``overwrite`` is False), or ``factory`` is not callable.
        InvalidTaskError: If the task breaks the contract (the task is then not registered).

    Example:
        >>> from mhainterp.tasks import ReverseTask, get_task
        >>> _ = register_task("reverse_long", lambda seq_len=32, **kw: ReverseTask(seq_len, **kw))
        >>> get_task("reverse_long").seq_len
        32
        >>> unregister_task("reverse_long")
    """
    if not isinstance(name, str) or not name.strip():
        raise invalid("name", name, "a non-empty string")
    if not callable(factory):
        raise invalid("factory", factory, "a Task subclass or a callable returning a Task")
    if name in _REGISTRY and not overwrite:
        raise invalid(
            "name",
            name,
            f"a name not registered yet (it holds {_describe(_REGISTRY[name])}); pass "
            "overwrite=True to replace it, or choose another name",
        )
    module = _defining[-1] if _defining else getattr(factory, "__module__", "") or ""
    checked = validate and _has_defaults(factory)
    if checked:
        validate_task(_build(name, factory, {}))  # raises before anything is registered
    _REGISTRY[name] = factory
    _MODULES[name] = module
    _validated.difference_update({key for key in _validated if key[0] == name})
    if checked:
        _validated.add(_validation_key(name, {}))
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
        raise invalid("name", name, f"a registered task: one of {', '.join(list_tasks())}")
    del _REGISTRY[name]
    _MODULES.pop(name, None)
    _validated.difference_update({key for key in _validated if key[0] == name})


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
            allowed = f"parameters of task {name!r}: {', '.join(accepted)}"
            raise invalid("params", unknown, allowed)
    task = _build(name, factory, params)
    key = _validation_key(name, params)
    if key not in _validated:
        validate_task(task)
        _validated.add(key)
    return task


def _build(name: str, factory: TaskFactory, params: dict[str, Any]) -> Task:
    """``factory(**params)``, checked to be a Task, named ``name``; the user's own errors for
    bad parameter values pass through, any other error names the task."""
    try:
        task = factory(**params)
    except (ValueError, TypeError, InvalidTaskError):
        raise  # a bad parameter value (the task's own check) or a contract fault
    except Exception as error:
        what = f"building it with {params or 'its defaults'} raised {type(error).__name__}: {error}"
        raise task_error(name, "__init__", what) from error
    if not isinstance(task, Task):
        what = f"{_describe(factory)} must return a Task, got {type(task).__name__}"
        raise task_error(name, "factory", what)
    if task.name != name:
        task.name = name  # the registry name identifies the task (and seeds its eval set)
    return task


def _has_defaults(factory: TaskFactory) -> bool:
    """Whether ``factory()`` can be called: every parameter has a default."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )


def _validation_key(name: str, params: dict[str, Any]) -> tuple[str, str]:
    return name, json.dumps(params, sort_keys=True, default=repr)


def _lookup(name: str) -> TaskFactory:
    if name not in _REGISTRY:
        _load_plugins()
    if name not in _REGISTRY:
        raise invalid("task", name, f"a registered task: one of {', '.join(list_tasks())}")
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
