"""Synthetic sequence tasks with known ground-truth attention relations.

A task samples batches (``Task.sample(n, generator) -> Batch``), labels given tokens
(``Task.targets_for``), gives the 0/1 attention templates of the relations that solve it
(``Task.relations``) and a fixed evaluation set (``Task.eval_batch``). Tasks are built by name:

    >>> from mhainterp.tasks import get_task, list_tasks
    >>> task = get_task("count_previous", seq_len=16, d_vocab=10)
    >>> batch = task.sample(64)
    >>> batch.tokens.shape, task.d_vocab_out
    (torch.Size([64, 16]), 16)

Users add tasks with ``register_task(name, TaskSubclass)``; see :class:`Task` for what a
subclass defines. A task in the user's own file or module is made visible with
``load_task_module(PATH_OR_MODULE)`` (``--task-module`` on the CLI); installed packages add theirs
through the ``mhainterp.tasks`` entry-point group (see :mod:`mhainterp.tasks.plugins`).

Layout: ``batch`` (Batch), ``templates`` (relation template builders), ``base`` (Task),
``builtin`` (the built-in tasks), ``registry`` (register_task / get_task / list_tasks),
``plugins`` (load_task_module, entry points), ``contract`` (the check every task passes once),
``axes`` (the division axes, registered once), ``split_data`` (the hand-set split heads' data).

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``config``, ``errors``, ``io``, ``model``, ``protocol``, ``registry``,
``runtime``, ``validation``.
"""

from mhainterp.errors import InvalidTaskError, TaskModuleError
from mhainterp.model.loss import IGNORE_INDEX
from mhainterp.tasks.axes import AXES, Axis, DivisionAxis, register_axis
from mhainterp.tasks.base import Task
from mhainterp.tasks.batch import Batch
from mhainterp.tasks.builtin import (
    BUILTIN_TASKS,
    CountPreviousTask,
    HistogramTask,
    InductionTask,
    MultiRelationTask,
    PreviousTokenTask,
    ReverseTask,
    SortTask,
)
from mhainterp.tasks.contract import validate_task
from mhainterp.tasks.plugins import (
    ENTRY_POINT_GROUP,
    load_entry_point_tasks,
    load_task_module,
)
from mhainterp.tasks.registry import (
    accepted_params,
    get_task,
    list_tasks,
    register_task,
    task_from_record,
    task_module,
    task_record,
    unregister_task,
)
from mhainterp.tasks.split_data import split_batch
from mhainterp.tasks.templates import (
    RELATION_TEMPLATES,
    first_position_template,
    induction_template,
    mirror_template,
    previous_token_template,
    same_token_template,
    self_template,
    sort_source_template,
    uniform_template,
)

__all__ = [
    "AXES",
    "BUILTIN_TASKS",
    "ENTRY_POINT_GROUP",
    "IGNORE_INDEX",
    "RELATION_TEMPLATES",
    "Axis",
    "Batch",
    "CountPreviousTask",
    "DivisionAxis",
    "HistogramTask",
    "InductionTask",
    "InvalidTaskError",
    "MultiRelationTask",
    "PreviousTokenTask",
    "ReverseTask",
    "SortTask",
    "Task",
    "TaskModuleError",
    "accepted_params",
    "first_position_template",
    "get_task",
    "induction_template",
    "list_tasks",
    "load_entry_point_tasks",
    "load_task_module",
    "mirror_template",
    "previous_token_template",
    "register_axis",
    "register_task",
    "split_batch",
    "same_token_template",
    "self_template",
    "task_from_record",
    "task_module",
    "task_record",
    "sort_source_template",
    "uniform_template",
    "unregister_task",
    "validate_task",
]

for _task_cls in BUILTIN_TASKS:
    register_task(_task_cls.name, _task_cls, overwrite=True, validate=False)  # at first use
del _task_cls
