"""Tasks defined outside mhainterp: a user's file or module, and installed packages' tasks.

Two ways to make a task visible to the whole toolkit, the CLI included:

- ``load_task_module("my_tasks.py")`` (or a dotted module name such as ``"mylab.tasks"``)
  imports the user's code, which calls :func:`~mhainterp.tasks.register_task`; every CLI command
  that builds or loads a task takes ``--task-module PATH_OR_MODULE`` and calls it.
- An installed package lists its tasks in the ``mhainterp.tasks`` entry-point group::

      [project.entry-points."mhainterp.tasks"]
      two_back = "mylab.tasks:TwoBackTask"    # a Task subclass or factory, registered by name
      mylab = "mylab.tasks"                   # or a module that registers its tasks itself

  They are loaded the first time a task is looked up or listed.

A run folder records a task's name and defining module (:func:`~mhainterp.tasks.task_module`),
never code. Loading a run never imports the module it names: that is the user's decision
(``--task-module``), because a folder is data, not code.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path

from mhainterp.errors import InvalidTaskError, TaskModuleError
from mhainterp.tasks.registry import (
    defining_module,
    on_first_lookup,
    register_task,
    registered_modules,
)
from mhainterp.validation import invalid

__all__ = ["ENTRY_POINT_GROUP", "load_entry_point_tasks", "load_task_module"]

ENTRY_POINT_GROUP = "mhainterp.tasks"


_loaded: dict[str, list[str]] = {}  # module spec (resolved) -> the task names it registered


def load_task_module(spec: str | os.PathLike[str]) -> list[str]:
    """Import a user's module (a ``.py`` file path or a dotted module name) so that the tasks it
    registers become visible; loading the same module again does nothing.

    Args:
        spec: A path to a Python file (``"tasks/two_back.py"``) or an importable module name
            (``"mylab.tasks"``).

    Returns:
        The names of the tasks the module registered.

    Raises:
        FileNotFoundError: For a path that does not exist.
        TaskModuleError: When the module cannot be imported or raises while it runs, even
            ``sys.exit`` (the message names the module and the error).
        InvalidTaskError: When a task it registers breaks the Task contract.

    Example:
        >>> load_task_module("my_tasks.py")  # doctest: +SKIP
        ['two_back']
    """
    text = os.fspath(spec)
    is_path = text.endswith(".py") or os.sep in text or "/" in text
    key = str(Path(text).expanduser().resolve()) if is_path else text
    if key in _loaded:
        return list(_loaded[key])
    before = set(registered_modules())
    with defining_module(key):
        if is_path:
            _exec_file(Path(key), text)
        else:
            _import(text)
    # A module imported before (e.g. by an entry point) registered its tasks then.
    modules = registered_modules()
    names = sorted(set(modules) - before) or sorted(n for n, m in modules.items() if m == key)
    _loaded[key] = names
    return list(names)


def load_entry_point_tasks() -> list[str]:
    """Register the tasks of installed packages (entry-point group ``mhainterp.tasks``).

    An entry point that names a Task subclass or factory is registered under the entry point's
    name (unless a task of that name exists); one that names a module is imported, and the
    module registers its tasks. Returns the names registered.

    An entry point that cannot be loaded is skipped with a warning naming it and its package,
    so one broken package does not break every command.
    """
    before = set(registered_modules())
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        package = entry.dist.name if entry.dist is not None else "?"
        with defining_module(entry.module):
            try:
                _run_user_code(entry.value, lambda entry=entry: _register_entry(entry))
            except (TaskModuleError, InvalidTaskError) as error:
                # a broken plugin must not break every command
                warnings.warn(
                    f"skipped task entry point {entry.name!r} = {entry.value!r} of package "
                    f"{package!r}: {error}",
                    stacklevel=2,
                )
    return sorted(set(registered_modules()) - before)


def _register_entry(entry: importlib.metadata.EntryPoint) -> None:
    """Load one entry point: a module registers its own tasks; a factory is registered (and so
    checked) under the entry point's name, unless a task of that name exists."""
    target = entry.load()
    if not isinstance(target, types.ModuleType) and entry.name not in registered_modules():
        register_task(entry.name, target)


def _exec_file(path: Path, text: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"task module {text!r}: no such file ({path})")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"mhainterp_user_tasks.{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise invalid("--task-module", text, "a Python file (.py) or an importable module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # classes defined there can be pickled by worker processes
    try:
        _run_user_code(text, lambda: spec.loader.exec_module(module))
    except BaseException:
        del sys.modules[name]
        raise


def _import(name: str) -> None:
    try:
        _run_user_code(name, lambda: importlib.import_module(name))
    except TaskModuleError as error:
        cause = error.__cause__
        if isinstance(cause, ModuleNotFoundError) and cause.name and name.startswith(cause.name):
            raise TaskModuleError(
                f"task module {name!r} cannot be imported: no module named {cause.name!r}; give "
                "a file path (my_tasks.py) or a module on the Python path"
            ) from cause
        raise


def _run_user_code(spec: str, run: Callable[[], object]) -> None:
    """Run a task module's code: a contract fault of a task it registers passes through, any
    other exception (``sys.exit(3)`` included, Ctrl-C excepted) becomes one line naming it."""
    try:
        run()
    except (KeyboardInterrupt, InvalidTaskError):
        raise
    except BaseException as error:  # SystemExit too: a task module must not end the program
        raise TaskModuleError(f"task module {spec!r} failed: {_describe(error)}") from error


def _describe(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"it called sys.exit({error.code!r}) while being imported"
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


on_first_lookup(load_entry_point_tasks)
