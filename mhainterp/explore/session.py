"""The explorer's one link to the ablation and scoring code: an :class:`ExploreSession`.

A session *is* an :class:`mhainterp.ablation.Ablator` (one state: the method and the ablated
heads, changed only by ``toggle``, ``set``, ``reset`` and ``method =``), plus the views the
page draws: loss and accuracy against the clean model grouped along the division of
labour's axes (the grouping of :func:`mhainterp.specialization.whom.damage.axis_values`), one
example sequence with its predictions and attention, the average patterns and single-head
importance. Reading a view never changes the state. Every configuration is one engine pass
from the first ablated layer on (the clean prefix is kept), cached by the Ablator's LRU;
the single heads of a method are precomputed in one batched pass.

On a pretrained model (a :class:`~mhainterp.protocol.BridgedModel` on a text batch) the same
session shows real text: the metric is the next-token cross-entropy (an encoder's: the
embedding damage ``1 - cos`` of the pooled output to the clean one), the groups are the text
axes (:mod:`mhainterp.explore.text`), the example carries the decoded tokens and each next
token's change in log-probability, and the per-head "importance alone" of a next-token model
is the attribution estimate of its loss change (:func:`~mhainterp.attribution.
attribution_patching`: one forward + backward at load gives zero and mean; resample's when
first asked), so only the clicked configuration is ever ablated exactly. An estimate is shown
with its measured agreement: :meth:`verify_estimates` ablates, a few heads per call, the
heads :func:`~mhainterp.attribution.verification_plan` picks, and every head ablated alone
(a click, or the plan) shows its exact value (:meth:`estimate_check`). Attention of a large
model (more than :data:`INLINE_ATTENTION_HEADS` heads) is sent for one query at a time
(:meth:`attention`).

Example:
    >>> from mhainterp.model.handbuilt import handbuilt_model
    >>> from mhainterp.tasks import get_task
    >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
    >>> session = ExploreSession(handbuilt_model(["previous", "uniform", "previous"]), task)
    >>> session.toggle("L0H0").metrics()["overall"]["accuracy"]  # the other previous head backs up
    {'clean': 1.0, 'ablated': 1.0}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, get_args

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from mhainterp.ablation import Ablator, Method, check_method
from mhainterp.ablation.interactive import DEFAULT_CACHE_SIZE
from mhainterp.analyze.pretrained import embedding_metric
from mhainterp.attribution import attribution_agreement, attribution_patching, verification_plan
from mhainterp.capture import average_patterns
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import as_batch, batch_for_model
from mhainterp.explore.text import text_axis_values, token_strings
from mhainterp.heads import all_heads, head_label
from mhainterp.protocol import BridgedModel, HookedModel
from mhainterp.scoring import PositionScores
from mhainterp.specialization.whom.damage import axis_values
from mhainterp.tasks import Batch, Task
from mhainterp.validation import check_option, invalid

__all__ = [
    "IMPORTANCE_SOURCES",
    "INLINE_ATTENTION_HEADS",
    "VERIFY_PLAN",
    "ExploreSession",
    "ImportanceSource",
]

ImportanceSource = Literal["exact", "attribution"]
IMPORTANCE_SOURCES: tuple[ImportanceSource, ...] = get_args(ImportanceSource)
"""Where the per-head "importance alone" numbers come from: exact single-head ablation (one
batched engine pass per method) or attribution patching (one forward + backward for all)."""

INLINE_ATTENTION_HEADS = 64
"""Up to this many heads the example carries every head's full pattern; a larger model's
patterns are sent one query at a time (:meth:`ExploreSession.attention`): SmolLM2's 270 heads
would put ~2 MB of JSON in every click's answer."""

ATTRIBUTION_BATCH = 16
"""Sequences per forward + backward of the attribution at load."""

AT_LOAD = ("zero", "mean")
"""Methods whose attribution estimates come from the one forward + backward at load (the
evaluation batch is the reference: no forward of its own); resample's needs a donor forward
and is estimated when the method is first shown."""

VERIFY_PLAN = {"top_k": 8, "n_random": 8, "seed": 0}
"""Heads an estimate is checked on, per method (:func:`~mhainterp.attribution.
verification_plan`): the 8 largest estimates and 8 others at random."""

VERIFY_STEP = 2
"""Heads ablated exactly per :meth:`ExploreSession.verify_estimates` call: SmolLM2 on 16
sentences takes about a second a head, so a click waits at most a step."""


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
        importance: ``"exact"`` or ``"attribution"`` (see :data:`IMPORTANCE_SOURCES`); default:
            attribution for a pretrained next-token model, else exact.

    Attributes:
        objective: ``"classes"`` (our own models), ``"next_token"`` or ``"embedding"``.
        tokenizer: A pretrained model's tokenizer (None for our own models).
        axes: The axes of ``metrics()["by"]``.

    Example:
        >>> session = ExploreSession(model, task)  # doctest: +SKIP
        >>> session.method = "mean"  # doctest: +SKIP
        >>> session.toggle("L0H1").metrics()["overall"]  # doctest: +SKIP
    """

    def __init__(
        self,
        model: HookedModel,
        data: Task | Batch,
        *,
        n_eval: int = DEFAULT_N_EVAL,
        method: Method = "zero",
        target_names: Sequence[str] | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
        importance: ImportanceSource | None = None,
    ) -> None:
        if not isinstance(data, (Task, Batch)):
            raise TypeError(f"data must be a Task or a Batch, got {type(data).__name__}")
        self.objective = str(getattr(model.cfg, "objective", "classes"))
        self.tokenizer = model.tokenizer if isinstance(model, BridgedModel) else None
        default = "attribution" if self.objective == "next_token" else "exact"
        self.importance_source = check_option(
            "importance", importance or default, IMPORTANCE_SOURCES
        )
        metric = None
        if self.objective == "embedding":  # no targets: damage to the clean sentence embedding
            batch = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
            metric = embedding_metric(model, batch)
        super().__init__(
            model.eval(),
            data,
            method=check_method(method),
            n_eval=n_eval,
            cache_size=cache_size,
            metric=metric,
        )
        k = self.batch_.n_targets
        names = data.target_names if isinstance(data, Task) else [f"target{i}" for i in range(k)]
        self.target_names = list(target_names) if target_names is not None else list(names)
        self._scored = self.batch_.scored  # (n, T, k)
        self._targets = self.batch_.targets.reshape(self._scored.shape)  # (n, T, k)
        if self.tokenizer is not None:
            self._values, self._value_names = text_axis_values(
                self.batch_,
                self.tokenizer,
                self._scored,
                next_token=self.objective == "next_token",
            )
        else:
            self._values, self._value_names = axis_values(
                self.batch_, self._scored, self.target_names
            )
        self.axes = tuple(self._values)
        self._counts = {
            axis: torch.bincount(ids, minlength=len(self._value_names[axis]))
            for axis, ids in self._values.items()
        }
        clean = self.position_scores(heads=[])
        self._clean_sums = self._sums(clean)
        self._clean_loss = float(clean.nll.sum() / int(self._scored.sum()))  # as metrics()'s
        self._importance: dict[str, dict[str, float]] = {}
        self._exact: dict[str, dict[str, float]] = {}  # method -> head -> exact Δloss alone
        self._patterns: tuple[Any, Tensor] | None = None  # (index, method, heads) -> patterns

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
            ``axes``) is a list of rows ``{"key", "n", "loss": {"clean", "ablated"},
            "accuracy": {...}}``, one per value of the axis that has scored pairs (key: the
            value's name as the division of labour writes it, a string). With no head
            ablated, ``ablated`` equals ``clean`` exactly.
        """
        current = self.position_scores()
        clean = self.position_scores(heads=[])
        n = int(self._scored.sum())
        if self.importance_source == "attribution" and len(self.head_pairs) == 1:
            self._record_exact(self.heads[0], self.method)  # what its estimate is checked on
        overall = {
            "loss": _pair(clean.nll.sum() / n, current.nll.sum() / n),
            "accuracy": _pair(clean.correct.sum().double() / n, current.correct.sum().double() / n),
            "n_scored": n,
        }
        return {
            "method": self.method,
            "ablated": self.heads,
            "overall": overall,
            "by": self._rows(current),
        }

    def example(self, index: int) -> dict[str, Any]:
        """Sequence ``index`` of the batch: tokens, targets, predictions and attention.

        Returns:
            ``{"index", "tokens", "real", "targets", "scored", "predictions",
            "clean_predictions", "correct", "attention"}``. ``real`` is False at padding.
            ``targets``, ``scored``, ``predictions`` and ``correct`` are lists per position of
            lists per target; a pair that is not scored has target -1 and ``correct`` False.
            ``attention[label][q]`` is where head ``label`` attends from query ``q`` (a list
            over keys), under the current ablation (only heads after an ablated layer can
            change). For a model of more than :data:`INLINE_ATTENTION_HEADS` heads it is None
            (ask :meth:`attention` for one query).

            On real text (a pretrained model) also ``"text"``: ``{"tokens"`` (each token as its
            string), ``"delta_logprob"`` (per position, the change in log-probability of the
            actual next token, ablated minus clean; None where not scored) and
            ``"predictions", "clean_predictions"`` (the top next token's string)``}``; for an
            encoder ``"damage"`` instead: the sentence's ``1 - cos`` to its clean embedding.

        Raises:
            ParameterError: for an index outside ``[0, n_eval)``.
        """
        self._check_index(index)
        current = self.position_scores()
        clean = self.position_scores(heads=[])
        scored = self._scored[index]  # (T, k)
        targets = self._targets[index]
        inline = self.model.cfg.n_layers * self.model.cfg.n_heads <= INLINE_ATTENTION_HEADS
        out = {
            "index": index,
            "tokens": self.batch_.tokens[index].tolist(),
            "real": self.batch_.padding_mask[index].tolist(),
            "targets": torch.where(scored, targets, -1).tolist(),
            "scored": scored.tolist(),
            "predictions": current.predictions[index].tolist(),
            "clean_predictions": clean.predictions[index].tolist(),
            "correct": current.correct[index].tolist(),
            "attention": _per_head(self._current_patterns(index)) if inline else None,
        }
        if self.tokenizer is not None:
            out["text"] = self._text_view(index, current, clean)
        return out

    def attention(self, index: int, query: int) -> dict[str, list[float]]:
        """Where each head attends from position ``query`` of sequence ``index`` (a list over
        keys per head label), under the current ablation: ``example``'s ``attention`` for one
        query (one forward of that sequence per configuration, then kept).

        Raises:
            ParameterError: for an index or query out of range.
        """
        self._check_index(index)
        T = self.batch_.tokens.shape[1]
        if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < T:
            raise invalid("query", query, f"an integer in [0, {T})")
        rows = self._current_patterns(index)[:, :, query]  # (L, h, T)
        rounded = (torch.round(rows.double() * 1000) / 1000).tolist()
        return {
            head_label(layer, head): rounded[layer][head]
            for layer in range(rows.shape[0])
            for head in range(rows.shape[1])
        }

    def _check_index(self, index: Any) -> None:
        n = len(self.batch_)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise invalid("index", index, f"an integer in [0, {n})")

    def _current_patterns(self, index: int) -> Float[Tensor, "L h T T"]:
        """:meth:`patterns` of ``index`` under the current state, the last one kept."""
        key = (index, self.method if self.head_pairs else "none", tuple(self.head_pairs))
        if self._patterns is None or self._patterns[0] != key:
            self._patterns = (key, self.patterns(index))
        return self._patterns[1]

    def _text_view(
        self, index: int, current: PositionScores, clean: PositionScores
    ) -> dict[str, Any]:
        """The decoded tokens of sequence ``index`` and what the ablation does to each."""
        ids = self.batch_.tokens[index].tolist()
        view: dict[str, Any] = {"tokens": token_strings(self.tokenizer, ids)}
        scored = self._scored[index, :, 0].tolist()
        if self.objective == "embedding":
            damage = current.nll[index, :, 0][self._scored[index, :, 0]]
            view["damage"] = float(damage[0]) if len(damage) else 0.0
            return view
        # log p(next) = -nll, so the change is clean nll - ablated nll (negative: it hurts)
        change = (clean.nll[index, :, 0] - current.nll[index, :, 0]).double().tolist()
        view["delta_logprob"] = [round(d, 4) if s else None for d, s in zip(change, scored)]
        view["clean_logprob"] = [
            round(-v, 4) if s else None
            for v, s in zip(clean.nll[index, :, 0].double().tolist(), scored)
        ]
        for key, scores in (("predictions", current), ("clean_predictions", clean)):
            view[key] = token_strings(self.tokenizer, scores.predictions[index, :, 0].tolist())
        return view

    def average_patterns(self) -> dict[str, list[list[float]]]:
        """Each head's dataset-average pattern ``[q][k]`` on the batch (clean model)."""
        return _per_head(average_patterns(self.model, self.batch_))

    @property
    def importance_quantity(self) -> str:
        """What :meth:`importance` measures: ``"accuracy"`` (exact, our own models) or
        ``"loss"`` (the attribution estimate, or a pretrained model's loss or damage)."""
        exact_accuracy = self.importance_source == "exact" and self.objective == "classes"
        return "accuracy" if exact_accuracy else "loss"

    def importance(self, method: Method | None = None) -> dict[str, float]:
        """Each head's importance alone: the change in :attr:`importance_quantity` when it
        alone is ablated with ``method`` (default: the current one).

        Exact (``importance_source``): the single heads are scored once per method in one
        batched pass, per position, into the Ablator's cache, so the first click on any head
        is a cache hit. Attribution: every method's estimate from one forward + backward
        (:func:`~mhainterp.attribution.attribution_patching` on the evaluation batch, which is
        also the mean and resample reference, as for the exact ablation).
        """
        method = check_method(method or self.method)
        if method in self._importance:
            return self._importance[method]
        if self.importance_source == "attribution":
            methods = AT_LOAD if method in AT_LOAD else (method,)
            table = attribution_patching(
                self.model, self.batch_, methods, batch_size=ATTRIBUTION_BATCH
            )
            for name, rows in table.groupby("method", sort=False):
                self._importance[str(name)] = dict(zip(rows["head_label"], rows["attribution"]))
            return self._importance[method]
        singles = [[pair] for pair in all_heads(self.model.cfg.n_layers, self.model.cfg.n_heads)]
        self.precompute(singles, method=method)
        delta = f"delta_{self.importance_quantity}"
        self._importance[method] = {
            head_label(*pair): self.evaluate(heads, method=method)[delta]
            for heads in singles
            for pair in heads
        }
        return self._importance[method]

    def estimate(self) -> dict[str, Any] | None:
        """The attribution estimate of the current configuration's loss, without a forward.

        Attribution patching is first order, so a set's estimated change in loss is the sum
        of its heads' (:meth:`importance`, computed at load). A click shows this at once and
        the exact value when its forward is done (:mod:`mhainterp.explore.exact`).

        Returns:
            None for exact importance (nothing is estimated); else ``{"source":
            "attribution", "delta_loss", "loss": {"clean", "ablated"}}``: the estimated
            change and the loss it gives, next to the clean loss (``metrics()``'s).

        Example:
            >>> session.toggle("L1H2").estimate()["delta_loss"]  # doctest: +SKIP
            0.0132
        """
        if self.importance_source != "attribution":
            return None
        per_head = self.importance(self.method)
        delta = float(sum(per_head[label] for label in self.heads))
        loss = {"clean": self._clean_loss, "ablated": self._clean_loss + delta}
        return {"source": "attribution", "delta_loss": delta, "loss": loss}

    # -- how far an estimate can be trusted ---------------------------------------------------
    def estimate_check(self, method: Method | None = None) -> dict[str, Any] | None:
        """How the attribution estimates of ``method`` agree with exact ablation so far.

        Returns:
            None for exact importance (nothing is estimated); else ``{"exact"`` (head ->
            exact Δloss alone, for every head ablated alone so far), ``"n_checked"``,
            ``"n_planned"`` (heads :meth:`verify_estimates` still ablates, plus those done),
            ``"spearman"`` (rank correlation of estimate and exact over the checked heads;
            None below 3 heads), ``"max_abs_error"``, ``"done"``}.
        """
        if self.importance_source != "attribution":
            return None
        method = check_method(method or self.method)
        exact = self._exact.get(method, {})
        estimate = self.importance(method)
        todo = self._unchecked(method)
        agreement = _agreement(estimate, exact)
        return {
            "exact": {label: round(value, 6) for label, value in exact.items()},
            "n_checked": len(exact),
            "n_planned": len(exact) + len(todo),
            **agreement,
            "done": not todo,
        }

    def verify_estimates(
        self, method: Method | None = None, n: int = VERIFY_STEP
    ) -> dict[str, Any]:
        """Ablate exactly the next ``n`` unchecked heads of ``method``'s verification plan
        (:data:`VERIFY_PLAN`; one batched pass, kept in the cache so clicking them is free)
        and return :meth:`estimate_check`. Reads no state and changes none."""
        method = check_method(method or self.method)
        todo = self._unchecked(method)[:n]
        if todo:
            self.precompute([[label] for label in todo], method=method)
            for label in todo:
                self._record_exact(label, method)
        check = self.estimate_check(method)
        return check if check is not None else {}

    def _unchecked(self, method: Method) -> list[str]:
        table = pd.DataFrame(
            [
                {"head_label": label, "layer": 0, "head": 0, "method": method, "attribution": value}
                for label, value in self.importance(method).items()
            ]
        )
        plan = verification_plan(table, method, **VERIFY_PLAN)["head_label"]
        return [label for label in plan if label not in self._exact.get(method, {})]

    def _record_exact(self, label: str, method: Method) -> None:
        """Keep head ``label``'s exact Δloss alone under ``method`` (a cache hit by now)."""
        delta = self.evaluate([label], method=method)["delta_loss"]
        self._exact.setdefault(method, {})[label] = float(delta)

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
        for axis in self.axes:
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


def _agreement(estimate: dict[str, float], exact: dict[str, float]) -> dict[str, float | None]:
    """``{"spearman", "max_abs_error"}`` of the estimates over the heads with an exact value
    (None where there are too few: a rank correlation needs 3 heads).

    Example:
        >>> _agreement({"a": 0.1, "b": 0.5, "c": 0.2}, {"a": 0.0, "b": 0.9, "c": 0.3})
        {'spearman': 1.0, 'max_abs_error': 0.4}
    """
    labels = [label for label in exact if label in estimate]
    if not labels:
        return {"spearman": None, "max_abs_error": None}
    rows = pd.DataFrame(
        {
            "method": "any",
            "chosen": "top_k",
            "exact": [exact[x] for x in labels],
            "attribution": [estimate[x] for x in labels],
        }
    )
    agreement = attribution_agreement(rows).iloc[0]
    rho = float(agreement["spearman"]) if len(labels) >= 3 else float("nan")
    error = round(float(agreement["max_abs_error"]), 6)
    return {"spearman": None if math.isnan(rho) else round(rho, 4), "max_abs_error": error}


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
