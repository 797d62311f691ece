"""Loss and accuracy of a model on a task's fixed evaluation set (:func:`evaluate`).

What :func:`~mhainterp.training.train` reports at its end (``eval.json``) and at every
``eval_every`` step, and what a legacy run folder's weights are checked against
(:func:`~mhainterp.training.load_run`).
"""

from __future__ import annotations

from typing import Any

import torch

from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import as_batch, batch_for_model, target_names
from mhainterp.model import HookedMHATransformer
from mhainterp.runtime import eval_mode
from mhainterp.scoring import Totals, position_scores, totals
from mhainterp.tasks import Batch, Task
from mhainterp.validation import check_int

__all__ = ["EVAL_BATCH_SIZE", "evaluate"]

EVAL_BATCH_SIZE = 1024
"""Sequences per forward when :func:`evaluate` scores the evaluation set (the sweeps plan
their memory with it)."""


@torch.no_grad()
def evaluate(
    model: HookedMHATransformer,
    data: Task | Batch,
    *,
    n_eval: int = DEFAULT_N_EVAL,
    batch_size: int = EVAL_BATCH_SIZE,
) -> dict[str, Any]:
    """Loss and accuracy on the scored positions of ``data`` (a Task's fixed evaluation set).

    Returns:
        ``{"loss", "accuracy", "n_sequences", "n_scored"}`` plus, for multi-target tasks,
        ``"accuracy/<target>"`` per target. Accuracy is over scored (position, target) pairs
        (:mod:`mhainterp.scoring`).

    Example:
        >>> evaluate(model, get_task("reverse"))["accuracy"]  # doctest: +SKIP
        0.97
    """
    batch = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
    check_int("batch_size", batch_size, minimum=1)
    with eval_mode(model):
        result: Totals | None = None
        for start in range(0, len(batch), batch_size):
            part = batch[start : start + batch_size]
            tokens, padding_mask = model.validate_inputs(part.tokens, part.padding_mask)
            part_totals = totals(
                position_scores(model.logits(tokens, padding_mask), part.targets, part.mask)
            )
            result = part_totals if result is None else result + part_totals
    out: dict[str, Any] = result.metrics(target_names(data, model.cfg.n_targets))[0]
    out["n_sequences"] = len(batch)
    out["n_scored"] = int(result.scored.sum())
    return out
