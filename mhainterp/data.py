"""One data convention: every analysis function takes ``(model, data, ...)``.

``data`` is one of

- a :class:`~mhainterp.tasks.Task`: its fixed evaluation set of ``n_eval`` sequences
  (``task.eval_batch(n_eval)``), the same in every process;
- a :class:`~mhainterp.tasks.Batch`: used as it is;
- a tokens tensor ``[n, pos]`` (or one sequence ``[pos]``), with an optional ``padding_mask=``:
  enough for patterns and similarity, but it has no targets, so a function that scores loss or
  accuracy raises a ``TypeError`` that says so.

``reference=`` (where mean and resample ablation take their activations) accepts the same kinds.

Example:
    >>> import torch
    >>> from mhainterp.tasks import get_task
    >>> len(as_batch(get_task("reverse"), n_eval=8))
    8
    >>> as_batch(torch.tensor([[1, 2, 3]])).has_targets
    False
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.model.loss import IGNORE_INDEX
from mhainterp.runtime import model_device
from mhainterp.tasks import Batch, Task
from mhainterp.validation import ParameterError, check_int

if TYPE_CHECKING:  # annotations only: protocol imports the model, which data must not need
    from mhainterp.protocol import HookedModel

__all__ = ["Data", "as_batch", "batch_for_model", "target_names"]


Data = Task | Batch | Tensor


def as_batch(
    data: Any,
    *,
    n_eval: int = DEFAULT_N_EVAL,
    padding_mask: Tensor | None = None,
    needs_targets: bool = False,
    name: str = "data",
) -> Batch:
    """The :class:`Batch` that ``data`` stands for (see the module docstring).

    Args:
        data: A Task, a Batch, or a tokens tensor.
        n_eval: Size of a Task's evaluation set (ignored for a Batch or tokens).
        padding_mask: With tokens only: ``[n, pos]`` bool, True for real tokens.
        needs_targets: Raise a ``TypeError`` for bare tokens (the caller scores loss/accuracy).
        name: The argument's name in error messages (``"data"``, ``"reference"``).

    Raises:
        ParameterError: ``data`` is none of the three kinds, or tokens where targets are needed
            (a ``TypeError`` too, as a wrong kind of argument is).
    """
    if padding_mask is not None and isinstance(data, (Task, Batch)):
        raise ParameterError(
            f"padding_mask is only used with a tokens tensor; a {type(data).__name__} carries "
            "its own padding mask: pass padding_mask=None"
        )
    if isinstance(data, Task):
        return data.eval_batch(check_int("n_eval", n_eval, minimum=1))
    if isinstance(data, Batch):
        return data
    if isinstance(data, Tensor):
        if needs_targets:
            raise ParameterError(
                f"{name} is a tokens tensor, which has no targets, but this function scores loss "
                "and accuracy: pass the Task or a Batch (task.sample(n) or task.eval_batch(n))"
            )
        return _tokens_batch(data, padding_mask, name)
    raise ParameterError(
        f"{name} must be a Task, a Batch or a tokens tensor [n, pos], got {type(data).__name__}"
    )


def _tokens_batch(tokens: Tensor, padding_mask: Tensor | None, name: str) -> Batch:
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ParameterError(f"{name} is invalid: integer token ids, got dtype {tokens.dtype}")
    if tokens.ndim == 1:  # one sequence
        tokens = tokens[None]
        padding_mask = None if padding_mask is None else padding_mask.reshape(1, -1)
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ParameterError(
            f"{name} is invalid: tokens [n, pos] with n >= 1, got shape {tuple(tokens.shape)}"
        )
    if padding_mask is None:
        padding_mask = torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
    if not isinstance(padding_mask, Tensor) or padding_mask.dtype != torch.bool:
        raise ParameterError("padding_mask is invalid: a bool tensor, True for real tokens")
    if padding_mask.shape != tokens.shape:
        raise ParameterError(
            f"padding_mask is invalid: the tokens' shape {tuple(tokens.shape)}, "
            f"got {tuple(padding_mask.shape)}"
        )
    return Batch(
        tokens=tokens.long(),
        targets=torch.full(tokens.shape, IGNORE_INDEX, dtype=torch.long, device=tokens.device),
        mask=torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device),
        padding_mask=padding_mask,
    )


def batch_for_model(model: HookedModel, batch: Batch, *, scored: bool = True) -> Batch:
    """Check that ``batch`` fits ``model`` and move it to the model's device.

    Args:
        model: A HookedMHATransformer.
        batch: The batch.
        scored: The caller scores loss/accuracy: the batch needs the model's number of targets,
            classes the model can output, and at least one scored position.
    """
    model.validate_inputs(batch.tokens, batch.padding_mask)
    if scored:
        if batch.n_targets != model.cfg.n_targets:
            raise ParameterError(
                f"data is invalid: a batch of the model's task, with n_targets="
                f"{model.cfg.n_targets} target(s) per position, got {batch.n_targets}"
            )
        targets = batch.targets[batch.targets != IGNORE_INDEX]
        if targets.numel() and int(targets.max()) >= model.cfg.d_vocab_out:
            raise ParameterError(
                f"data is invalid: a batch of the model's task, with target classes below "
                f"d_vocab_out={model.cfg.d_vocab_out}, got class {int(targets.max())}"
            )
        if not batch.has_targets:
            raise ParameterError(
                "data is invalid: a batch with at least one scored position, got none "
                "(its mask is all False)"
            )
    return batch.to(model_device(model))


def target_names(data: Any, n_targets: int) -> list[str]:
    """Per-target names for metric columns; empty for single-target models.

    A Task names its targets (``multi_relation``: previous, mirror, count_previous); a Batch or
    tokens get ``target0, target1, ...``.
    """
    if n_targets == 1:
        return []
    if isinstance(data, Task):
        return list(data.target_names)
    return [f"target{i}" for i in range(n_targets)]
