"""The explorer's one link to the ablation and scoring code: an :class:`ExploreSession`.

A session *is* an :class:`mhainterp.ablation.Ablator` (one state: the method and the ablated
heads, changed only by ``toggle``, ``set``, ``reset`` and ``method =``), plus the views the
page draws: loss and accuracy against the clean model grouped along the division of
labour's axes (the grouping of :func:`mhainterp.specialization.whom.damage.axis_values`), one
example sequence with its predictions and attention, the average patterns and single-head
importance. Reading a view never changes the state. Every configuration is one engine pass
from the first ablated layer on (the clean prefix is kept), cached by the Ablator's LRU;
the single heads of a method are precomputed in one batched pass.

Example:
    >>> from mhainterp.handbuilt import handbuilt_model
    >>> from mhainterp.tasks import get_task
    >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
    >>> session = ExploreSession(handbuilt_model(["previous", "uniform", "previous"]), task)
    >>> session.toggle("L0H0").metrics()["overall"]["accuracy"]  # the other previous head backs up
    {'clean': 1.0, 'ablated': 1.0}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mhainterp.ablation import Ablator, check_method
from mhainterp.ablation.interactive import DEFAULT_CACHE_SIZE
from mhainterp.capture import average_patterns
from mhainterp.data import DEFAULT_N_EVAL
from mhainterp.heads import all_heads, head_label
from mhainterp.model import HookedMHATransformer
from mhainterp.scoring import PositionScores
from mhainterp.specialization.whom.damage import AXES, axis_values
from mhainterp.tasks import Batch, Task
from mhainterp.validation import invalid

__all__ = ["ExploreSession"]


class ExploreSession(Ablator):
    """An Ablator with the explorer's views: grouped metrics, an example, patterns, importance.

    Args:
        model: The model to explore.
        data: A Task (its fixed evaluation set of ``n_eval`` sequences) or a Batch.
        n_eval: Evaluation sequences when ``data`` is a Task.
        method: Initial ablation method: ``"zero"``, ``"mean"`` or ``"resample"``. Mean and
            resample take their reference activations from the evaluation batch itself.
        target_names: Names of the targets (default: the task's, or ``target0..``).
        cache_size: Configurations the Ablator keeps (LRU; see ``DEFAULT_CACHE_SIZE``).

    Example:
        >>> session = ExploreSession(model, task)  # doctest: +SKIP
        >>> session.method = "mean"  # doctest: +SKIP
        >>> session.toggle("L0H1").metrics()["overall"]  # doctest: +SKIP
    """

    def __init__(
        self,
        model: HookedMHATransformer,
        data: Task | Batch,
        *,
        n_eval: int = DEFAULT_N_EVAL,
        method: str = "zero",
        target_names: Sequence[str] | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if not isinstance(data, (Task, Batch)):
            raise TypeError(f"data must be a Task or a Batch, got {type(data).__name__}")
        super().__init__(
            model.eval(), data, method=check_method(method), n_eval=n_eval, cache_size=cache_size
        )
        k = self.batch_.n_targets
        names = data.target_names if isinstance(data, Task) else [f"target{i}" for i in range(k)]
        self.target_names = list(target_names) if target_names is not None else list(names)
        self._scored = self.batch_.scored  # (n, T, k)
        self._targets = self.batch_.targets.reshape(self._scored.shape)  # (n, T, k)
        self._values, self._value_names = axis_values(self.batch_, self._scored, self.target_names)
        self._counts = {
            axis: torch.bincount(ids, minlength=len(self._value_names[axis]))
            for axis, ids in self._values.items()
        }
        clean = self.position_scores(heads=[])
        self._clean_sums = self._sums(clean)
        self._importance: dict[str, dict[str, float]] = {}

    @property
    def batch(self) -> Batch:
        """The evaluation batch (``n_eval`` sequences)."""
        return self.batch_

    # -- views ---------------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """Loss and accuracy of the current configuration, each next to the clean model's.

        Returns:
            ``{"method", "ablated", "overall", "by"}``. ``overall`` is ``{"loss": {"clean",
            "ablated"}, "accuracy": {...}, "n_scored"}``; ``by[axis]`` (axis one of
            :data:`AXES`) is a list of rows ``{"key", "n", "loss": {"clean", "ablated"},
            "accuracy": {...}}``, one per value of the axis that has scored pairs (key: the
            value's name as the division of labour writes it, a string). With no head
            ablated, ``ablated`` equals ``clean`` exactly.
        """
        current = self.position_scores()
        clean = self.position_scores(heads=[])
        n = int(self._scored.sum())
        overall = {
            "loss": _pair(clean.nll.sum() / n, current.nll.sum() / n),
            "accuracy": _pair(clean.correct.sum().double() / n, current.correct.sum().double() / n),
            "n_scored": n,
        }
        return {
            "method": self.method, "ablated": self.heads, "overall": overall,
            "by": self._rows(current),
        }  # fmt: skip

    def example(self, index: int) -> dict[str, Any]:
        """Sequence ``index`` of the batch: tokens, targets, predictions and attention.

        Returns:
            ``{"index", "tokens", "real", "targets", "scored", "predictions",
            "clean_predictions", "correct", "attention"}``. ``real`` is False at padding.
            ``targets``, ``scored``, ``predictions`` and ``correct`` are lists per position of
            lists per target; a pair that is not scored has target -1 and ``correct`` False.
            ``attention[label][q]`` is where head ``label`` attends from query ``q`` (a list
            over keys), under the current ablation (only heads after an ablated layer can
            change).

        Raises:
            ParameterError: for an index outside ``[0, n_eval)``.
        """
        n = len(self.batch_)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise invalid("index", index, f"an integer in [0, {n})")
        current = self.position_scores()
        scored = self._scored[index]  # (T, k)
        targets = self._targets[index]
        return {
            "index": index,
            "tokens": self.batch_.tokens[index].tolist(),
            "real": self.batch_.padding_mask[index].tolist(),
            "targets": torch.where(scored, targets, -1).tolist(),
            "scored": scored.tolist(),
            "predictions": current.predictions[index].tolist(),
            "clean_predictions": self.position_scores(heads=[]).predictions[index].tolist(),
            "correct": current.correct[index].tolist(),
            "attention": _per_head(self.patterns(index)),
        }

    def average_patterns(self) -> dict[str, list[list[float]]]:
        """Each head's dataset-average pattern ``[q][k]`` on the batch (clean model)."""
        return _per_head(average_patterns(self.model, self.batch_))

    def importance(self, method: str | None = None) -> dict[str, float]:
        """Change in accuracy when each head alone is ablated (``method``: default current).

        The single heads are scored once per method in one batched pass, per position, into
        the Ablator's cache: the first click on any head is then a cache hit.
        """
        method = check_method(method or self.method)
        if method not in self._importance:
            singles = [
                [pair] for pair in all_heads(self.model.cfg.n_layers, self.model.cfg.n_heads)
            ]
            self.precompute(singles, method=method)
            self._importance[method] = {
                head_label(*pair): self.evaluate(heads, method=method)["delta_accuracy"]
                for heads in singles
                for pair in heads
            }
        return self._importance[method]

    # -- grouping ------------------------------------------------------------------------------
    def _sums(self, scores: PositionScores) -> dict[str, tuple[Tensor, Tensor]]:
        """Per axis, summed loss and correct per value over the scored pairs (``[K]`` each)."""
        loss = scores.nll[self._scored].double().cpu()  # (N,), row-major like the axis ids
        right = scores.correct[self._scored].double().cpu()
        return {
            axis: (
                torch.bincount(ids, weights=loss, minlength=len(self._value_names[axis])),
                torch.bincount(ids, weights=right, minlength=len(self._value_names[axis])),
            )
            for axis, ids in self._values.items()
        }

    def _rows(self, current: PositionScores) -> dict[str, list[dict[str, Any]]]:
        """Per axis, one row ``{key, n, loss, accuracy}`` per value (clean and current)."""
        sums = self._sums(current)
        out = {}
        for axis in AXES:
            (clean_loss, clean_right), (loss, right) = self._clean_sums[axis], sums[axis]
            counts: Int[Tensor, " K"] = self._counts[axis]
            out[axis] = [
                {
                    "key": name,
                    "n": int(count),
                    "loss": _pair(clean_loss[i] / count, loss[i] / count),
                    "accuracy": _pair(clean_right[i] / count, right[i] / count),
                }
                for i, (name, count) in enumerate(zip(self._value_names[axis], counts.tolist()))
            ]
        return out


def _pair(clean: Tensor, ablated: Tensor) -> dict[str, float]:
    return {"clean": float(clean), "ablated": float(ablated)}


def _per_head(patterns: Float[Tensor, "L h T T"]) -> dict[str, list[list[float]]]:
    """Patterns by head label, as nested lists with 3 decimals (what the page can show)."""
    rounded = (torch.round(patterns.double() * 1000) / 1000).tolist()  # 0.123, not 0.12300001
    return {
        head_label(layer, head): rounded[layer][head]
        for layer in range(patterns.shape[0])
        for head in range(patterns.shape[1])
    }
