"""Per-triple damage: what removing each head alone costs at every scored triple.

One pass of the ablation engine (:func:`mhainterp.ablation.evaluate_head_sets`, clean model
plus every single head, per-position outputs) gives, for every head and scored (sequence,
position, target) triple, the accuracy and loss it loses there, with each triple's value on
every axis of the division of labour (query token, position, target class, target).
:mod:`~mhainterp.specialization.whom.division` builds its profiles from this, and
:func:`mhainterp.specialization.whom.causal.target_damage` sums it per target.

Shapes: H heads, N scored triples, K values of an axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.ablation import Method, evaluate_head_sets
from mhainterp.heads import all_heads, head_label
from mhainterp.protocol import HookedModel, scored_by_loss
from mhainterp.tasks import AXES, Axis, Batch

__all__ = ["TripleDamage", "axis_values", "triple_damage"]


@dataclass
class TripleDamage:
    """Every head's damage at every scored (sequence, position, target) triple.

    Attributes:
        pairs: ``(layer, head)`` of every head, layer-major (H).
        damage: ``[H, N]`` float32: clean correct minus ablated correct (on a model scored
            by its loss, :func:`~mhainterp.protocol.scored_by_loss`, the loss increase).
        loss_increase: ``[H, N]`` float32: ablated minus clean cross-entropy.
        clean: ``[N]`` float32: 1 where the clean model is right.
        values: Per axis, ``[N]`` int64 ids of the triple's value (0..K-1).
        value_names: Per axis, the K values as strings (ids index into it).
        index: ``[N, 3]`` int64: each triple's (sequence, position, target) in the batch.
    """

    pairs: list[tuple[int, int]]
    damage: Float[Tensor, "H N"]
    loss_increase: Float[Tensor, "H N"]
    clean: Float[Tensor, " N"]
    values: dict[Axis, Int[Tensor, " N"]]
    value_names: dict[Axis, list[str]]
    index: Int[Tensor, "N 3"] | None = None
    _onehots: dict[Axis, Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def heads(self) -> list[str]:
        """Head labels, layer-major."""
        return [head_label(layer, head) for layer, head in self.pairs]

    @property
    def total_damage(self) -> Float[Tensor, " H"]:
        """Each head's overall accuracy drop (all scored triples)."""
        return self.damage.mean(1)

    def onehot(self, axis: Axis) -> Float[Tensor, "N K"]:
        """The triple x value indicator matrix of ``axis`` (built once per axis: the division
        of labour asks for it several times)."""
        if axis not in self._onehots:
            K = len(self.value_names[axis])
            onehot = torch.nn.functional.one_hot(self.values[axis], K).to(self.damage.dtype)
            self._onehots[axis] = onehot
        return self._onehots[axis]


def _small_unique(column: Int[Tensor, " N"]) -> tuple[Int[Tensor, " K"], Int[Tensor, " N"]]:
    """``torch.unique(column, return_inverse=True)`` for small non-negative ids (tokens,
    positions, classes, targets) by counting instead of sorting: 4x faster on 16k triples."""
    present = torch.bincount(column) > 0  # (max + 1,)
    unique = present.nonzero()[:, 0]
    rank = torch.cumsum(present, 0) - 1  # id of each present value
    return unique, rank[column]


def axis_values(
    batch: Batch, scored: Bool[Tensor, "n T k"], names: Sequence[str]
) -> tuple[dict[Axis, Tensor], dict[Axis, list[str]]]:
    """Value ids and names of every axis of :data:`~mhainterp.tasks.AXES` at the scored
    triples (row-major order).

    The axes and their value names are the division of labour's; the explorer groups its loss
    and accuracy by the same ones.
    """
    i, t, j = scored.nonzero(as_tuple=True)
    values: dict[Axis, Tensor] = {}
    value_names: dict[Axis, list[str]] = {}
    for axis, spec in AXES.items():
        unique, ids = _small_unique(spec.values(batch, i, t, j).cpu())
        values[axis] = ids
        value_names[axis] = [spec.label(int(u), names) for u in unique]
    return values, value_names


@torch.no_grad()
def triple_damage(
    model: HookedModel,
    batch: Batch,
    *,
    method: Method = "mean",
    names: Sequence[str] = (),
    progress: bool = False,
    pairs: Sequence[tuple[int, int]] | None = None,
) -> TripleDamage:
    """One engine pass (clean + every single head, per position) -> :class:`TripleDamage`.

    Args:
        model: The model.
        batch: The evaluation batch (also the mean/resample reference).
        method: The ablation method.
        names: Target names (for the ``target`` axis); empty for single-target models.
        progress: Show a progress bar.
        pairs: Only these ``(layer, head)`` (default every head, layer-major): the
            attribution screen runs the heads it computes exactly
            (:func:`~mhainterp.specialization.whom.screen.screened_triple_damage`).

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> batch = get_task("previous_token").eval_batch(32)
        >>> td = triple_damage(handbuilt_model(["previous", "dead"], d_head=18), batch,
        ...                    method="zero")
        >>> [round(float(d), 2) for d in td.total_damage]
        [0.83, 0.0]
    """
    pairs = list(all_heads(model.cfg.n_layers, model.cfg.n_heads) if pairs is None else pairs)
    result = evaluate_head_sets(
        model,
        batch,
        [[], *([pair] for pair in pairs)],
        method,
        per_position=True,
        progress=progress,
        desc="ablate heads (per position)",
    )
    scores = result.scores
    scored = scores.scored  # (n, T, k)
    correct = scores.correct[:, scored].float().cpu()  # (1 + H, N), row-major triples
    nll = scores.nll[:, scored].float().cpu()
    if scored_by_loss(model):  # a pretrained model: damage is the loss increase (protocol)
        correct = -nll
    values, value_names = axis_values(result.batch, scored, list(names))
    return TripleDamage(
        pairs=pairs,
        damage=correct[:1] - correct[1:],
        loss_increase=nll[1:] - nll[:1],
        clean=correct[0],
        values=values,
        value_names=value_names,
        index=scored.nonzero().cpu(),  # row-major, the order of the triples above
    )
