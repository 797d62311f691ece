"""The Task contract, checked once per task: what a user's task must define, and the check.

A task (built-in or a user's) is checked when it is registered (:func:`register_task`, a
``--task-module`` file, an entry point of the ``mhainterp.tasks`` group) if its factory can be
built with its defaults, else the first time :func:`~mhainterp.tasks.get_task` builds it. The
check reads every member the toolkit relies on and labels a tiny batch, so that a broken task
fails at once with one line naming the task, the member and what is wrong, instead of a
traceback (or silently wrong numbers) deep inside training.

Members checked (``n`` sequences, ``pos = seq_len`` positions):

====================  ==========================================================================
``name``              a non-empty string
``seq_len``           an integer in ``[2, MAX_SEQ_LEN]``
``d_vocab``           an integer in ``[2, MAX_VOCAB]``
``d_vocab_out``       an integer in ``[1, MAX_VOCAB]`` (output classes)
``n_targets``         an integer >= 1; ``target_names`` one string per target
``causal``            True or False; ``min_layers`` an integer >= 1
``params``            a dict of JSON values (a run folder records it)
``sample``            a :class:`~mhainterp.tasks.Batch`: int64 tokens ``[n, pos]`` in
                      ``[0, d_vocab_in)``, bool masks ``[n, pos]``
``compute_targets``   ``(targets, mask)`` tensors: integer targets ``[n, pos]`` (``[n, pos, k]``
                      for k targets) in ``[0, d_vocab_out)`` where scored, a bool mask
``compute_relations`` a dict of relation name -> ``[n, pos, pos]`` tensors with values in [0, 1]
====================  ==========================================================================
"""

from __future__ import annotations

import json
import math
import traceback
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from mhainterp.errors import InvalidTaskError, NotEnoughMemoryError
from mhainterp.io import allocation_failure, require_memory

if TYPE_CHECKING:
    from mhainterp.tasks.base import Task

__all__ = ["MAX_SEQ_LEN", "MAX_VOCAB", "task_error", "validate_task"]

MAX_SEQ_LEN = 65536
"""Longest sequence a task may have (positions fit every index and the positional embedding)."""

MAX_VOCAB = 2**20
"""Largest input or output vocabulary a task may have."""

_MEMBERS = (
    "compute_targets",
    "compute_relations",
    "sample_tokens",
    "sample_lengths",
    "d_vocab_out",
    "n_targets",
    "target_names",
    "params",
)
_CHECK_SIZE = 4  # sequences labelled by the check
_TEMPLATE_BYTES = 4  # per template entry: a float32 template, or a few bool ones


def task_error(task: str, member: str, what: str) -> InvalidTaskError:
    """The error for ``member`` of task ``task``, in one line.

    Example:
        >>> str(task_error("majority", "d_vocab_out", "an integer >= 1, got 0"))
        "task 'majority': d_vocab_out is invalid: an integer >= 1, got 0"
    """
    return InvalidTaskError(f"task {task!r}: {member} is invalid: {what}")


def validate_task(task: Task) -> Task:
    """Check every member of ``task`` the toolkit relies on (the table above); return it.

    Raises:
        InvalidTaskError: the first member that breaks the contract, named with the task.

    Example:
        >>> from mhainterp.tasks import get_task
        >>> validate_task(get_task("reverse", seq_len=4)).seq_len
        4
    """
    name = task.name if isinstance(task.name, str) and task.name else type(task).__name__
    if not isinstance(task.name, str) or not task.name.strip():
        raise task_error(name, "name", f"a non-empty string, got {task.name!r}")
    _check_integer(task, "seq_len", 2, MAX_SEQ_LEN)
    _check_integer(task, "d_vocab", 2, MAX_VOCAB)
    _check_integer(task, "d_vocab_out", 1, MAX_VOCAB)
    _check_integer(task, "n_targets", 1, 1024)
    _check_integer(task, "min_layers", 1, 1024)
    _check_integer(task, "n_special_tokens", 0, MAX_VOCAB)
    if not isinstance(_member(task, "causal"), bool):
        raise task_error(name, "causal", f"True or False, got {task.causal!r}")
    _check_target_names(task)
    _check_params(task)
    batch = _call(
        task, "sample", lambda: task.sample(_CHECK_SIZE, torch.Generator().manual_seed(0))
    )
    _check_tokens(task, batch.tokens, batch.padding_mask)  # else an embedding IndexError later
    # templates are [n, L, L]: at a long seq_len the probe alone can exhaust memory (the kernel
    # kills the process): refuse it in one line first, naming the size to lower
    require_memory(
        _CHECK_SIZE * task.seq_len**2 * _TEMPLATE_BYTES,
        f"checking the relation templates of task {name!r} ([{_CHECK_SIZE}, L, L] at seq_len="
        f"{task.seq_len})",
    )
    relations = _call(
        task, "compute_relations", lambda: task.relations(batch.tokens, batch.padding_mask)
    )
    _check_relations(task, relations)
    return task


def check_labels(task: Task, targets: Any, mask: Any, shape: tuple[int, ...]) -> None:
    """What ``compute_targets`` returned: two tensors, integer targets of ``shape`` and a mask
    ``shape[:2]`` of bools (or 0/1 integers). Raises :class:`InvalidTaskError` otherwise."""
    name, member = task.name, "compute_targets"
    for what, value in (("targets", targets), ("mask", mask)):
        if not isinstance(value, Tensor):
            allowed = f"it must return (targets, mask) as torch tensors; its {what} is a "
            raise task_error(name, member, allowed + type(value).__name__)
    if targets.is_floating_point() or targets.is_complex():
        raise task_error(
            name,
            member,
            f"targets must be class ids, an integer tensor; got {targets.dtype} "
            f"(values such as {_sample_values(targets)}); convert with .long() after rounding",
        )
    if tuple(targets.shape) != shape or tuple(mask.shape) != shape[:2]:
        raise task_error(
            name,
            member,
            f"targets of shape {shape} and a mask of shape {shape[:2]}; got "
            f"{tuple(targets.shape)} and {tuple(mask.shape)}",
        )
    if mask.dtype != torch.bool and (mask.is_floating_point() or ((mask != 0) & (mask != 1)).any()):
        raise task_error(name, member, f"the mask must be bool (or 0/1 integers), got {mask.dtype}")


def _member(task: Task, member: str) -> Any:
    """``getattr(task, member)``, a raising property turned into the task's one-line error."""
    try:
        return getattr(task, member)
    except Exception as error:  # the user's property: any error is the task's fault
        raise task_error(task.name, member, f"reading it raised {_describe(error)}") from error


def _call(task: Task, member: str, function: Any) -> Any:
    """``function()``; an error raised inside the task's code names the member that raised."""
    try:
        return function()
    except (InvalidTaskError, NotEnoughMemoryError):
        raise
    except Exception as error:
        memory = allocation_failure(error, f"{member} of task {task.name!r}")
        if memory is not None:  # the machine's limit, not the task's fault
            raise NotEnoughMemoryError(memory) from None
        raise task_error(
            task.name, _raising_member(error, member), f"it raised {_describe(error)}"
        ) from error


def _raising_member(error: BaseException, default: str) -> str:
    """The innermost Task member in ``error``'s traceback (``compute_targets``...)."""
    frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    for frame in reversed(frames):
        if frame in _MEMBERS:
            return frame
    return default


def _check_integer(task: Task, member: str, minimum: int, maximum: int) -> None:
    value = _member(task, member)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        what = f"an integer >= {minimum} and <= {maximum}, got {value!r}"
        raise task_error(task.name, member, what)


def _check_tokens(task: Task, tokens: Tensor, padding_mask: Tensor) -> None:
    if tuple(tokens.shape) != (_CHECK_SIZE, task.seq_len):
        what = f"tokens of shape [n, seq_len={task.seq_len}], got {tuple(tokens.shape)}"
        raise task_error(task.name, "sample_tokens", what)
    real = tokens[padding_mask]
    bad = real[(real < 0) | (real >= task.d_vocab_in)]
    if bad.numel():
        what = f"tokens must lie in [0, d_vocab_in={task.d_vocab_in}), got {bad[:5].tolist()}"
        raise task_error(task.name, "sample_tokens", what)


def _check_target_names(task: Task) -> None:
    names = _member(task, "target_names")
    ok = isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)
    if not ok or len(names) != task.n_targets:
        what = f"a list of n_targets={task.n_targets} strings, got {names!r}"
        raise task_error(task.name, "target_names", what)


def _check_params(task: Task) -> None:
    params = _member(task, "params")
    try:
        json.dumps(params, allow_nan=False)
    except (TypeError, ValueError) as error:
        what = f"a dict of JSON values (a run folder records it), got {params!r}: {error}"
        raise task_error(task.name, "params", what) from None
    if not isinstance(params, dict):
        raise task_error(task.name, "params", f"a dict, got {type(params).__name__}")


def _check_relations(task: Task, relations: Any) -> None:
    if not isinstance(relations, dict) or not all(isinstance(k, str) for k in relations):
        what = f"a dict of relation name -> [n, q, k] tensor, got {type(relations).__name__}"
        raise task_error(task.name, "compute_relations", what)
    for relation, template in relations.items():
        low, high = (float(template.min()), float(template.max())) if template.numel() else (0, 0)
        if not (math.isfinite(low) and math.isfinite(high) and low >= 0 and high <= 1):
            what = f"relation {relation!r} must hold values in [0, 1], got [{low}, {high}]"
            raise task_error(task.name, "compute_relations", what)


def _sample_values(tensor: Tensor) -> list[float]:
    return tensor.flatten()[:3].tolist()


def _describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
