"""Interactive ablation for notebooks, the terminal and the explorer: toggle heads, see metrics.

Example:
    >>> ab = Ablator(model, task)  # doctest: +SKIP
    >>> ab.toggle("L0H2").evaluate()["delta_accuracy"]  # doctest: +SKIP
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from mhainterp.ablation.engine import head_masks, run_masks
from mhainterp.ablation.replacement import (
    RESAMPLE_SEED,
    CleanCache,
    Method,
    Replacement,
    build_replacement,
    check_method,
)
from mhainterp.ablation.tables import with_deltas
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import Data, as_batch, batch_for_model, target_names
from mhainterp.heads import HeadSpec, head_label, resolve_heads
from mhainterp.protocol import HookedModel
from mhainterp.runtime import eval_mode
from mhainterp.scoring import PositionScores, Totals, metric_names
from mhainterp.validation import check_int

__all__ = ["DEFAULT_CACHE_BYTES", "DEFAULT_CACHE_SIZE", "Ablator"]

DEFAULT_CACHE_SIZE = 128
"""Configurations (method, heads) whose results an :class:`Ablator` keeps, least recently used
dropped first. An entry with per-position scores holds ``n x T x k`` losses, correctness and
predictions: about 0.2 MB at 1,024 sequences x 16 positions x 1 target (~27 MB for 128)."""

DEFAULT_CACHE_BYTES = 64 * 2**20
"""Bytes of scores an :class:`Ablator` keeps at most, whatever the entry count: 128 entries of
8,192 sequences would be 218 MB, so a larger batch keeps fewer configurations."""

_Key = tuple[str, tuple[tuple[int, int], ...]]


@dataclass
class _Entry:
    """What the Ablator keeps of one configuration."""

    totals: Totals
    scores: PositionScores | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of its per-position tensors (each owns its storage, see ``Ablator._run``)."""
        if self.scores is None:
            return 0
        parts = (self.scores.nll, self.scores.correct, self.scores.predictions)
        return sum(part.untyped_storage().nbytes() for part in parts)


class Ablator:
    """Interactive ablation for notebooks and the terminal: toggle heads, see the metrics.

    The evaluation batch, the unablated baseline, each method's reference activations and the
    clean activations up to each layer (the engine's clean prefix) are computed once, so an
    update costs the forward from the first ablated layer on (a few milliseconds on a
    d_model=64, 8-head model with 1024 sequences). Results are kept per configuration in a
    bounded LRU cache (:data:`DEFAULT_CACHE_SIZE`), so going back to a recent set is free.

    The state is the method and the set of ablated heads; only ``toggle``, ``set``, ``reset``
    and assigning ``method`` change it. Reading (``evaluate``, ``position_scores``,
    ``patterns``) never does; each takes ``heads=``/``method=`` to read another configuration.

    Args:
        model: The model.
        data: A Task (its evaluation set of ``n_eval`` sequences) or a Batch.
        method: Initial method (``"zero"``, ``"mean"``, ``"resample"``); change with ``.method``.
        reference: Mean/resample reference (same kinds as ``data``); default: the evaluation
            batch.
        generator: Resample permutation (seed 0 when None).
        n_eval: Size of a Task's evaluation set.
        cache_size: Configurations kept (least recently used dropped first).
        cache_bytes: Bytes of per-position scores kept at most (the least recently used
            entries dropped first; the newest is always kept).
        metric: Score outputs with this hook instead of cross-entropy against the targets
            (e.g. a :class:`~mhainterp.scoring.CleanOutputMetric` for an embedding model; see
            :func:`~mhainterp.ablation.engine.run_masks`); its damage is the "loss".

    Attributes:
        batch_: The cached evaluation batch.
        target_names_: Per-target names (empty for single-target models).
        baseline_: Metrics of the unablated model (``loss, accuracy, [accuracy/<target>]``).

    Example:
        >>> ab = Ablator(model, task)  # doctest: +SKIP
        >>> ab.toggle("L0H2").evaluate()["delta_accuracy"]  # doctest: +SKIP
        >>> ab.method = "mean"; ab.set(["L0H1", "L0H3"]).evaluate()  # doctest: +SKIP
        >>> ab.reset().evaluate() == {**ab.baseline_, ...}  # doctest: +SKIP
    """

    def __init__(
        self,
        model: HookedModel,
        data: Data,
        *,
        method: Method = "zero",
        reference: Data | None = None,
        generator: torch.Generator | None = None,
        n_eval: int = DEFAULT_N_EVAL,
        cache_size: int = DEFAULT_CACHE_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        metric: Any = None,
    ) -> None:
        self.model = model
        self.metric = metric
        self._method = check_method(method)
        self.cache_size = check_int("cache_size", cache_size, minimum=1)
        self.cache_bytes = check_int("cache_bytes", cache_bytes, minimum=0)
        self.batch_ = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
        self.target_names_ = target_names(data, model.cfg.n_targets)
        self._reference = (
            self.batch_
            if reference is None
            else as_batch(reference, n_eval=n_eval, name="reference")
        )
        if generator is None:
            generator = torch.Generator().manual_seed(RESAMPLE_SEED)
        self._seed_state = generator.get_state()
        self._replacements: dict[str, Replacement] = {}
        self._cache: OrderedDict[_Key, _Entry] = OrderedDict()
        self._cached_bytes = 0
        # Every layer's clean prefix from the first clean forward: a click starts at any layer
        self._clean = CleanCache(every_layer=True)
        self._heads: list[tuple[int, int]] = []
        # Per position at once: the views read the clean scores too (a second clean forward)
        clean = self._entry(self._key("zero", ()), per_position=True)
        self.baseline_ = clean.totals.metrics(self.target_names_)[0]

    # -- state ---------------------------------------------------------------------------------
    @property
    def method(self) -> str:
        """The ablation method; assigning checks it (``ab.method = "mean"``)."""
        return self._method

    @method.setter
    def method(self, value: str) -> None:
        self._method = check_method(value)

    @property
    def heads(self) -> list[str]:
        """Labels of the heads currently ablated, layer-major."""
        return [head_label(*pair) for pair in self._heads]

    @property
    def head_pairs(self) -> list[tuple[int, int]]:
        """The heads currently ablated as ``(layer, head)`` pairs, layer-major."""
        return list(self._heads)

    @property
    def valid_heads(self) -> list[str]:
        """Every head label of the model."""
        return self.model.head_labels

    def toggle(self, *heads: str | Sequence[HeadSpec]) -> Ablator:
        """Flip each given head between ablated and not; returns self for chaining."""
        flips = [pair for spec in heads for pair in resolve_heads(self.model, spec)]
        current = set(self._heads)
        for pair in flips:
            current ^= {pair}
        self._heads = sorted(current)
        return self

    def set(self, heads: str | Sequence[HeadSpec]) -> Ablator:
        """Ablate exactly ``heads`` (``[]`` for none); returns self."""
        self._heads = resolve_heads(self.model, heads)
        return self

    def reset(self) -> Ablator:
        """Ablate no heads (the method is kept); returns self."""
        self._heads = []
        return self

    # -- results -------------------------------------------------------------------------------
    def evaluate(
        self, heads: str | Sequence[HeadSpec] | None = None, *, method: Method | None = None
    ) -> dict[str, float]:
        """Metrics with the current heads ablated, and ``delta_<metric>`` from the baseline.

        Args:
            heads: Read this set instead of the current one (the state is not changed).
            method: Read this method instead of the current one.

        Returns:
            ``{"loss", "accuracy", ["accuracy/<target>"...], "delta_loss", "delta_accuracy",
            ...}``. With no heads ablated the metrics equal ``baseline_`` exactly and the
            deltas are 0.
        """
        entry = self._entry(self._config(heads, method), per_position=False)
        metrics = entry.totals.metrics(self.target_names_)[0]
        names = metric_names(self.target_names_)
        result = with_deltas(metrics, self.baseline_, names)
        return {key: value for key, value in result.items() if not key.startswith("baseline_")}

    def position_scores(
        self, heads: str | Sequence[HeadSpec] | None = None, *, method: Method | None = None
    ) -> PositionScores:
        """Per-(sequence, position, target) scores with the current heads ablated.

        Args:
            heads: Read this set instead of the current one (``[]``: the clean model).
            method: Read this method instead of the current one.

        Returns:
            :class:`~mhainterp.scoring.PositionScores` of shape ``[n, T, k]`` (predictions,
            correctness and cross-entropy at every position), cached per (method, heads).
        """
        scores = self._entry(self._config(heads, method), per_position=True).scores
        assert scores is not None
        return scores

    def precompute(
        self, head_sets: Sequence[str | Sequence[HeadSpec]], *, method: Method | None = None
    ) -> Ablator:
        """Score ``head_sets`` in one batched engine pass (per position) into the cache.

        The explorer precomputes every single head this way, so the first click on any head
        is a cache hit. Sets beyond ``cache_size`` push older entries out. Returns self.
        """
        keys = [self._config(heads, method) for heads in head_sets]
        todo = list(dict.fromkeys(k for k in keys if not self._cached(k, per_position=True)))
        for start in range(0, len(todo), self.cache_size):
            self._run(todo[start : start + self.cache_size], per_position=True)
        return self

    @torch.no_grad()
    def patterns(
        self,
        index: int,
        heads: str | Sequence[HeadSpec] | None = None,
        *,
        method: Method | None = None,
    ) -> Float[Tensor, "L h T T"]:
        """Attention patterns of evaluation sequence ``index`` with the current heads ablated.

        One forward of that one sequence; an ablated head's z is replaced exactly as in the
        engine (resample: this row's donor), so the patterns equal the batched pass's row.
        Only layers after the first ablated one can change.
        """
        method, pairs = self._config(heads, method)
        row = self.batch_[index : index + 1]
        device = row.tokens.device
        mask = head_masks(self.model, [pairs])[0].to(device)  # (L, h)
        kept: dict[int, Tensor] = {}

        def keep(pattern: Tensor, hook: Any, layer: int) -> None:
            kept[layer] = pattern[0].float().cpu()  # (h, T, T)

        n_layers = self.model.cfg.n_layers
        hooks = [(f"blocks.{i}.attn.hook_pattern", partial(keep, layer=i)) for i in range(n_layers)]
        if pairs:
            replacement = self._replacement(method)
            rows = torch.tensor([index], device=device)
            hooks += [
                (
                    f"blocks.{i}.attn.hook_z",
                    partial(replacement.replace_heads, head_mask=mask[i], layer=i, rows=rows),
                )
                for i in range(n_layers)
                if bool(mask[i].any())
            ]
        with eval_mode(self.model), self.model.hooks(fwd_hooks=hooks):
            self.model.logits(row.tokens, row.padding_mask)
        return torch.stack([kept[i] for i in range(n_layers)])

    def table(self) -> pd.DataFrame:
        """The current result as a table: columns ``metric, baseline, ablated, delta``."""
        result = self.evaluate()
        return pd.DataFrame(
            [
                {
                    "metric": name,
                    "baseline": self.baseline_[name],
                    "ablated": result[name],
                    "delta": result[f"delta_{name}"],
                }
                for name in metric_names(self.target_names_)
            ]
        )

    def cache_info(self) -> dict[str, int]:
        """``{"entries", "with_scores", "bytes", "cache_size", "cache_bytes"}``: what the LRU
        cache holds now (``bytes``: its per-position tensors) and its bounds."""
        with_scores = sum(entry.scores is not None for entry in self._cache.values())
        return {
            "entries": len(self._cache),
            "with_scores": with_scores,
            "bytes": self._cached_bytes,
            "cache_size": self.cache_size,
            "cache_bytes": self.cache_bytes,
        }

    def __repr__(self) -> str:
        heads = ", ".join(self.heads) or "none"
        return f"Ablator(method={self._method!r}, heads=[{heads}])"

    # -- cache and engine ----------------------------------------------------------------------
    @staticmethod
    def _key(method: Method, heads: tuple[tuple[int, int], ...]) -> _Key:
        """With no head ablated every method is the clean model: one entry, ``"none"``."""
        return (method if heads else "none", heads)

    def _config(self, heads: str | Sequence[HeadSpec] | None, method: Method | None) -> _Key:
        if heads is None:
            pairs = self._heads
        else:  # an empty set (the clean model) needs no resolving
            pairs = resolve_heads(self.model, heads) if len(heads) else []
        return self._key(self._method if method is None else check_method(method), tuple(pairs))

    def _cached(self, key: _Key, *, per_position: bool) -> bool:
        entry = self._cache.get(key)
        return entry is not None and (entry.scores is not None or not per_position)

    def _entry(self, key: _Key, *, per_position: bool) -> _Entry:
        if not self._cached(key, per_position=per_position):
            self._run([key], per_position=per_position)
        self._cache.move_to_end(key)
        return self._cache[key]

    def _run(self, keys: list[_Key], *, per_position: bool) -> None:
        """One engine pass over ``keys`` (all of one method), results into the LRU cache."""
        method = next((m for m, _ in keys if m != "none"), "zero")
        masks = head_masks(self.model, [heads for _, heads in keys])
        sums, scores = run_masks(
            self.model,
            self.batch_,
            masks,
            self._replacement(method),
            per_position=per_position,
            cache=self._clean,
            metric=self.metric,
        )
        for c, key in enumerate(keys):
            totals = Totals(sums.loss_sum[c : c + 1], sums.correct[c : c + 1], sums.scored)
            entry = _Entry(totals)
            if scores is not None:
                entry.scores = _own_scores(scores, c, len(keys))
            self._store(key, entry)

    def _store(self, key: _Key, entry: _Entry) -> None:
        """Keep ``entry`` as the newest; drop the least recently used beyond either bound."""
        old = self._cache.pop(key, None)
        self._cached_bytes += entry.nbytes - (old.nbytes if old is not None else 0)
        self._cache[key] = entry
        while len(self._cache) > 1 and (
            len(self._cache) > self.cache_size or self._cached_bytes > self.cache_bytes
        ):
            _, dropped = self._cache.popitem(last=False)
            self._cached_bytes -= dropped.nbytes

    def _replacement(self, method: Method) -> Replacement:
        if method == "none":
            method = "zero"
        if method not in self._replacements:
            generator = torch.Generator()
            generator.set_state(self._seed_state)
            self._replacements[method] = build_replacement(
                self.model, method, self._reference, generator
            )
        return self._replacements[method]


def _own_scores(scores: PositionScores, c: int, n_configs: int) -> PositionScores:
    """Configuration ``c`` of a pass's scores in storage of its own.

    A view of one row would keep the whole pass's ``[C, n, T, k]`` tensors alive as long as
    any of its configurations stays cached (C times the bytes the LRU counts).
    """
    own = (lambda t: t[c].clone()) if n_configs > 1 else (lambda t: t[c])
    return PositionScores(
        nll=own(scores.nll),
        correct=own(scores.correct),
        predictions=own(scores.predictions),
        scored=scores.scored,
    )
