"""The division's engine passes, kept: a division that moves a gate runs only what it adds.

Every engine row of :func:`~mhainterp.specialization.division_of_labour` is a function of the
model, the sequences, the ablation method and the head set removed, never of the gates that
chose to run it. A :class:`PassStore` keeps each row so run (per model, sequences, method and
head set), with the clean activations, the attribution estimates and the noisy copies of the
same-function null; a second division of the same model and task given the store
(``division_of_labour(..., passes=result.passes)``) runs only the head sets it has not seen.
That is what re-deciding a pretrained model's verdict under moved gates costs
(:func:`~mhainterp.specialization.headline.pretrained_headline_stability`): seconds of
arithmetic, where running the passes again takes most of an hour.

The store lives in memory only (a division's ``passes`` attribute, not saved); it refuses
nothing by itself, so one store serves one model and task: rows are keyed by the model object
and the exact tokens evaluated, so another model or other sequences simply miss. A model
whose weights change in place must not go through it (the same object would find the old
rows): the division's noisy copy is checked outside it, and stored once its noise is kept.

Shapes: C configurations (head sets), N scored triples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mhainterp.ablation.replacement import CleanCache
from mhainterp.tasks import Batch

__all__ = ["PassStore"]

Pair = tuple[int, int]
HeadSet = tuple[Pair, ...]


def _sequences_key(batch: Batch) -> str:
    """A digest of the tokens and padding evaluated: the same sequences give the same key."""
    digest = hashlib.sha1()
    for tensor in (batch.tokens, batch.padding_mask):
        digest.update(str(tuple(tensor.shape)).encode())
        # hashed on the host: the digest reads the bytes (a few kB of token ids)
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@dataclass
class PassStore:
    """What a division's passes computed, by what determines it (module docstring).

    Attributes:
        rows: ``(model id, sequences, method, head set)`` -> ``(correct [N], nll [N])``.
        engines: ``(model id, sequences)`` -> the engine's first result there (its scored
            mask and evaluated batch).
        caches: ``(model id, sequences)`` -> the clean activations shared by its passes.
        made: Anything else computed once (:meth:`memo`): the damage metric's clean outputs,
            the attribution screen's estimates, the same-function null's noisy copies.
        n_run: Head sets run by the engine through this store (the others were reused).
    """

    rows: dict[tuple, tuple[Tensor, Tensor]] = field(default_factory=dict)
    engines: dict[tuple, Any] = field(default_factory=dict)
    caches: dict[tuple, CleanCache] = field(default_factory=dict)
    made: dict[tuple, Any] = field(default_factory=dict)
    n_run: int = 0
    _models: list[Any] = field(default_factory=list, repr=False)  # keeps ids valid

    def _place(self, model: Any, batch: Batch) -> tuple[int, str]:
        if not any(m is model for m in self._models):
            self._models.append(model)
        return id(model), _sequences_key(batch)

    def cache(self, model: Any, batch: Batch, make: Callable[[], CleanCache]) -> CleanCache:
        """The clean activations of ``model`` on ``batch`` (``make()`` the first time)."""
        place = self._place(model, batch)
        if place not in self.caches:
            self.caches[place] = make()
        return self.caches[place]

    def memo(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()`` the first time ``key`` is asked for, the same object after that (the
        key must name everything the value depends on besides the store's model and task)."""
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]

    def run(
        self,
        model: Any,
        batch: Batch,
        head_sets: Sequence[Sequence[Pair]],
        method: str,
        engine: Callable[[list[list[Pair]]], tuple[Tensor, Tensor, Any]],
    ) -> tuple[Tensor, Tensor, Any]:
        """``(correct [C, N], nll [C, N], engine result)`` of ``head_sets``: the rows kept,
        and ``engine(missing head sets)`` for the others (which it returns the same way).

        The engine result is the first one run on this model and batch (every pass of them
        shares its scored mask and batch)."""
        place = self._place(model, batch)
        keys = [(*place, method, tuple(sorted(map(tuple, s)))) for s in head_sets]
        missing = list(dict.fromkeys(k for k in keys if k not in self.rows))
        if missing or place not in self.engines:
            sets = [list(k[3]) for k in missing]
            correct, nll, result = engine(sets)
            self.n_run += len(sets)
            self.engines.setdefault(place, result)
            for i, key in enumerate(missing):
                self.rows[key] = (correct[i], nll[i])
        correct = torch.stack([self.rows[k][0] for k in keys]) if keys else None
        nll = torch.stack([self.rows[k][1] for k in keys]) if keys else None
        return correct, nll, self.engines[place]
