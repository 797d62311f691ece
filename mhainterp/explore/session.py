"""The explorer's one link to the ablation and scoring code: an :class:`ExploreSession`.

Every call into ``mhainterp.ablation`` (and every loss/accuracy computation) made by the explorer
lives in this module, so the ablation engine can be swapped in here without touching the server,
the page or the notebook view.

A session holds a model, its evaluation batch (``n_eval`` sequences, default 1,024), the set of
ablated heads and the method. Metrics and predictions come from the ablation engine through an
:class:`mhainterp.ablation.Ablator`: each configuration (method, heads) is one engine pass with
per-position outputs, starting at the first ablated layer from the cached clean prefix, and its
outcome is cached, so toggling a head back costs nothing. Scoring is :mod:`mhainterp.scoring`'s.

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
from functools import partial
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.ablation import METHODS, Ablator, ablate, check_method, head_importance
from mhainterp.capture import average_patterns
from mhainterp.heads import head_label, resolve_heads
from mhainterp.model import HookedMHATransformer
from mhainterp.scoring import PositionScores
from mhainterp.tasks import Batch, Task

__all__ = ["METHODS", "ExploreSession"]


class ExploreSession:
    """Toggle heads, switch the method, read the metrics and one example, all against clean.

    Args:
        model: The model to explore.
        data: A Task (its fixed evaluation set of ``n_eval`` sequences) or a Batch.
        n_eval: Evaluation sequences when ``data`` is a Task.
        method: Initial ablation method: ``"zero"``, ``"mean"`` or ``"resample"``. Mean and
            resample take their reference activations from the evaluation batch itself.
        target_names: Names of the targets (default: the task's, or ``target0..``).

    Example:
        >>> session = ExploreSession(model, task)  # doctest: +SKIP
        >>> session.set_method("mean").toggle("L0H1").metrics()["overall"]  # doctest: +SKIP
    """

    def __init__(
        self,
        model: HookedMHATransformer,
        data: Task | Batch,
        *,
        n_eval: int = 1024,
        method: str = "zero",
        target_names: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(data, (Task, Batch)):
            raise TypeError(f"data must be a Task or a Batch, got {type(data).__name__}")
        self.model = model.eval()
        self._ablator = Ablator(model, data, method=check_method(method), n_eval=n_eval)
        self.batch = self._ablator.batch_
        k = self.batch.n_targets
        names = data.target_names if isinstance(data, Task) else [f"target{i}" for i in range(k)]
        self.target_names = list(target_names) if target_names is not None else list(names)
        self._targets = self.batch.targets.reshape(len(self.batch), -1, k)  # (n, T, k)
        self._scored = self.batch.scored  # (n, T, k)
        self._method = check_method(method)
        self._ablated: list[tuple[int, int]] = []
        self._pattern_cache: dict[tuple[Any, int], Tensor] = {}
        self._clean_pattern_cache: dict[int, Tensor] = {}
        self._importance: dict[str, dict[str, float]] = {}
        self._metrics_cache: dict[Any, dict[str, Any]] = {}
        self.clean_ = self._outcome("zero", ())
        scored, targets = self._scored, self._targets
        self._groups = {
            "per_target": _Groups(
                torch.arange(k, device=scored.device).expand_as(scored),
                scored,
                self.clean_,
                self.target_names,
            ),
            "by_target_class": _Groups(targets.clamp(min=0), scored, self.clean_),
            "by_query_token": _Groups(
                self.batch.tokens[..., None].expand_as(scored), scored, self.clean_
            ),
        }

    # -- state ---------------------------------------------------------------------------------
    @property
    def method(self) -> str:
        """The current ablation method."""
        return self._method

    @property
    def ablated(self) -> list[str]:
        """Labels of the ablated heads, layer-major."""
        return [head_label(*pair) for pair in self._ablated]

    @property
    def head_labels(self) -> list[str]:
        """Every head of the model, layer-major."""
        return self.model.head_labels

    def toggle(self, head: str) -> ExploreSession:
        """Ablate ``head`` (``"L0H2"``) if it is not ablated, else restore it; returns self.

        Raises:
            ValueError: for a head the model does not have (the message lists the valid ones).
        """
        pairs = resolve_heads(self.model, [head])
        self._ablated = sorted(set(self._ablated) ^ set(pairs))
        return self

    def set_heads(self, heads: str | Sequence[str]) -> ExploreSession:
        """Ablate exactly ``heads`` (``"L0H1,L0H3"`` or a list; empty for none); returns self."""
        self._ablated = resolve_heads(self.model, heads)
        return self

    def set_method(self, method: str) -> ExploreSession:
        """Switch to ``"zero"``, ``"mean"`` or ``"resample"``; the ablated heads are kept."""
        self._method = check_method(method)
        return self

    def reset(self) -> ExploreSession:
        """Restore every head (the method is kept); returns self."""
        self._ablated = []
        return self

    # -- results -------------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """Loss and accuracy of the current configuration, each next to the clean model's.

        Returns:
            ``{"method", "ablated", "overall", "per_target", "by_target_class",
            "by_query_token"}``. ``overall`` is ``{"loss": {"clean", "ablated"}, "accuracy":
            {...}, "n_scored"}``; each of the other three is a list of rows ``{"key", "n",
            "loss": {"clean", "ablated"}, "accuracy": {...}}`` (key: the target name, the
            target class id, or the token id at the query position). With no head ablated,
            ``ablated`` equals ``clean`` exactly.
        """
        key = _key(self._method, tuple(self._ablated))
        if key not in self._metrics_cache:
            self._metrics_cache[key] = self._compute_metrics(self._current())
        return {"method": self._method, "ablated": self.ablated, **self._metrics_cache[key]}

    def _compute_metrics(self, current: PositionScores) -> dict[str, Any]:
        n = int(self._scored.sum())
        clean = self.clean_
        overall = {
            "loss": _pair(clean.nll.sum() / n, current.nll.sum() / n),
            "accuracy": _pair(clean.correct.sum().double() / n, current.correct.sum().double() / n),
            "n_scored": n,
        }
        out: dict[str, Any] = {"overall": overall}
        for name, groups in self._groups.items():
            out[name] = groups.rows(clean, current)
        return out

    def example(self, index: int) -> dict[str, Any]:
        """Sequence ``index`` of the batch: tokens, targets, predictions and attention.

        Returns:
            ``{"index", "tokens", "real", "targets", "scored", "predictions",
            "clean_predictions", "correct", "attention"}``. ``real`` is False at padding.
            ``targets``, ``scored``, ``predictions`` and ``correct`` are lists per position of
            lists per target; a pair that is not scored has target -1 and ``correct`` False.
            ``attention[label][q]`` is where head ``label`` attends from
            query ``q`` (a list over keys), under the current ablation (only heads after an
            ablated layer can change).

        Raises:
            ValueError: for an index outside ``[0, n_eval)``.
        """
        n = len(self.batch)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ValueError(f"index={index!r} is invalid: an integer in [0, {n})")
        current = self._current()
        scored = self._scored[index]  # (T, k)
        targets = self._targets[index]
        patterns = self._patterns(index)  # (L, h, T, T)
        attention = {
            head_label(layer, h): _rounded(patterns[layer, h])
            for layer in range(patterns.shape[0])
            for h in range(patterns.shape[1])
        }
        return {
            "index": index,
            "tokens": self.batch.tokens[index].tolist(),
            "real": self.batch.padding_mask[index].tolist(),
            "targets": torch.where(scored, targets, -1).tolist(),
            "scored": scored.tolist(),
            "predictions": current.predictions[index].tolist(),
            "clean_predictions": self.clean_.predictions[index].tolist(),
            "correct": current.correct[index].tolist(),
            "attention": attention,
        }

    def average_patterns(self) -> dict[str, list[list[float]]]:
        """Each head's dataset-average pattern ``[q][k]`` on the batch (clean model)."""
        average = average_patterns(self.model, self.batch)  # (L, h, T, T)
        return {
            head_label(layer, h): _rounded(average[layer, h])
            for layer in range(average.shape[0])
            for h in range(average.shape[1])
        }

    def importance(self, method: str | None = None) -> dict[str, float]:
        """Change in accuracy when each head alone is ablated (``method``: default current).

        Computed once per method in one batched pass and cached.
        """
        method = check_method(method or self._method)
        if method not in self._importance:
            table = head_importance(self.model, self.batch, method, reference=self.batch)
            self._importance[method] = dict(
                zip(table["head_label"], table["delta_accuracy"].astype(float))
            )
        return self._importance[method]

    # -- forward -------------------------------------------------------------------------------
    def _current(self) -> PositionScores:
        return self._outcome(self._method, tuple(self._ablated))

    def _outcome(self, method: str, heads: tuple[tuple[int, int], ...]) -> PositionScores:
        """Per-position scores of one configuration (the engine's, cached by the Ablator)."""
        self._ablator.method = method
        return self._ablator.set(list(heads)).position_scores()

    def _clean_patterns(self, index: int) -> Float[Tensor, "L h T T"]:
        """Row ``index``'s clean patterns (a one-sequence forward, cached)."""
        if index not in self._clean_pattern_cache:
            row = self.batch[index]
            names = [f"blocks.{i}.attn.hook_pattern" for i in range(self.model.cfg.n_layers)]
            with torch.no_grad():
                _, cache = self.model.run_with_cache(
                    row.tokens, padding_mask=row.padding_mask, names_filter=names
                )
            stacked = torch.stack([cache[name][0] for name in names])  # (L, h, T, T)
            self._clean_pattern_cache[index] = stacked.float().cpu()
        return self._clean_pattern_cache[index]

    def _patterns(self, index: int) -> Float[Tensor, "L h T T"]:
        """Row ``index``'s patterns under the current ablation."""
        heads = tuple(self._ablated)
        # Ablating z in layer l changes the patterns of later layers only.
        if not heads or heads[0][0] == self.model.cfg.n_layers - 1:
            return self._clean_patterns(index)
        key = (_key(self._method, heads), index)
        if key not in self._pattern_cache:
            if len(self._pattern_cache) > 4096:
                self._pattern_cache.clear()
            self._pattern_cache[key] = self._ablated_patterns(heads, index)
        return self._pattern_cache[key]

    def _ablated_patterns(
        self, heads: tuple[tuple[int, int], ...], index: int
    ) -> Float[Tensor, "L h T T"]:
        """Row ``index``'s patterns with ``heads`` ablated: the batch runs under
        :func:`~mhainterp.ablation.ablate` (resample donors depend on the row), row kept."""
        kept: dict[int, Tensor] = {}

        def keep(pattern: Tensor, hook: Any, layer: int) -> None:
            kept[layer] = pattern[index].detach().float().cpu()  # (h, T, T)

        n_layers = self.model.cfg.n_layers
        hooks = [(f"blocks.{i}.attn.hook_pattern", partial(keep, layer=i)) for i in range(n_layers)]
        reference = None if self._method == "zero" else self.batch
        ablated = ablate(self.model, list(heads), self._method, reference)
        with torch.no_grad(), ablated as model, model.hooks(fwd_hooks=hooks):
            model.logits(self.batch.tokens, self.batch.padding_mask)
        return torch.stack([kept[i] for i in range(n_layers)])


def _key(method: str, heads: tuple[tuple[int, int], ...]) -> tuple[str, tuple]:
    """Cache key of a configuration: with no head ablated, every method is the clean model."""
    return (method if heads else "none", heads)


def _pair(clean: Tensor, ablated: Tensor) -> dict[str, float]:
    return {"clean": float(clean), "ablated": float(ablated)}


class _Groups:
    """Loss and accuracy per value of a key (target, target class, query token).

    ``keys`` gives each (sequence, position, target) pair its group; unscored pairs go to an
    extra last group that is never shown. Sums are ``bincount``s over the flat tensors, and the
    clean model's are computed once.
    """

    def __init__(
        self,
        keys: Int[Tensor, "n T k"],
        scored: Bool[Tensor, "n T k"],
        clean: PositionScores,
        names: Sequence[Any] | None = None,
    ) -> None:
        self.n_keys = int(keys[scored].max()) + 1 if bool(scored.any()) else 0
        self.keys = torch.where(scored, keys, self.n_keys).flatten()
        self.counts = self._sums(None)
        self.names = names
        self.clean = (self._sums(clean.nll), self._sums(clean.correct))

    def _sums(self, values: Tensor | None) -> Tensor:
        weights = None if values is None else values.flatten().double()
        return torch.bincount(self.keys, weights=weights, minlength=self.n_keys + 1)

    def rows(self, clean: PositionScores, current: PositionScores) -> list[dict[str, Any]]:
        """One row per key value that has scored pairs: ``{key, n, loss, accuracy}``."""
        clean_loss, clean_acc = self.clean
        loss, acc = self._sums(current.nll), self._sums(current.correct)
        rows = []
        for key in range(self.n_keys):
            count = int(self.counts[key])
            if count == 0:
                continue
            rows.append(
                {
                    "key": self.names[key] if self.names is not None else key,
                    "n": count,
                    "loss": _pair(clean_loss[key] / count, loss[key] / count),
                    "accuracy": _pair(clean_acc[key] / count, acc[key] / count),
                }
            )
        return rows


def _rounded(matrix: Tensor) -> list[list[float]]:
    """A pattern as nested lists with 3 decimals (what the page can show), to keep JSON small."""
    return [[round(float(v), 3) for v in row] for row in matrix.tolist()]
