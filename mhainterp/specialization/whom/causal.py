"""Causal selectivity: does removing a head hurt one target far more than the others?

On a multi-target task (``multi_relation``: previous, mirror, count_previous) every head is
ablated alone (the ablation engine, before ``W_O``) and its **damage** on each
target is the drop in that target's accuracy, ``baseline - ablated``. The head x target matrix
of damages is what :func:`mhainterp.ablation.head_importance` reports as
``-delta_accuracy/<target>`` (the tests check they agree); here it is also kept per sequence for
the permutation null.

**Selectivity index** of a head with damages ``d_1..d_k`` (clipped at 0, total ``D``):

    SI = (k * max(d) / D - 1) / (k - 1)

1 when all the damage falls on one target, 0 when it is spread evenly; undefined (NaN) when the
head does no damage (``D < min_damage``): a head that does nothing is not selective. The model's
selectivity is the damage-weighted mean ``sum_h D_h SI_h / sum_h D_h`` over heads that do damage.

**Permutation null** (the damage does not care which target): within every sequence, the head's
per-target damages are shuffled across targets, independently per sequence and per head, and
the indices recomputed from the shuffled means. The total damage of a head is unchanged by this,
so the same heads take part. ``p = (1 + #{null >= observed}) / (1 + M)``.

Caveat: a target that is more fragile than the others (damaged by removing *any* head) looks
like selectivity under this null; read the matrix itself, not only the index.

Shapes: H heads (all layers), n sequences, k targets, M permutations.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from mhainterp.ablation import Method
from mhainterp.heads import parse_head_label
from mhainterp.model import HookedMHATransformer
from mhainterp.runtime import DRAW_DEVICE
from mhainterp.specialization.whom.damage import TripleDamage, triple_damage
from mhainterp.specialization.whom.screen import screened_triple_damage
from mhainterp.tasks import Batch
from mhainterp.validation import ParameterError, check_int

__all__ = [
    "CausalSelectivity",
    "TargetDamage",
    "causal_selectivity",
    "head_damage_table",
    "model_selectivity",
    "selectivity_index",
    "target_damage",
]


@dataclass
class TargetDamage:
    """Per-sequence results of ablating each head alone.

    Attributes:
        heads: Head labels, layer-major (H).
        target_names: Target names (k).
        damage: ``[H, n, k]`` float64: sequence ``i``'s contribution to the accuracy drop of
            target ``t``, scaled so that ``damage.mean(1)`` is the drop over the whole batch.
        loss_increase: ``[H]`` mean cross-entropy with the head ablated minus without.
        baseline_accuracy: ``[k]`` unablated accuracy per target.
    """

    heads: list[str]
    target_names: list[str]
    damage: Float[Tensor, "H n k"]
    loss_increase: Float[Tensor, " H"]
    baseline_accuracy: Float[Tensor, " k"]

    @property
    def matrix(self) -> Float[Tensor, "H k"]:
        """The head x target accuracy drop over the batch."""
        return self.damage.mean(1)

    def frame(self) -> pd.DataFrame:
        """Tidy head x target table: ``head_label, layer, head, target, baseline_accuracy,
        ablated_accuracy, damage`` (accuracy drop; positive = the head helps that target)."""
        matrix = self.matrix.numpy()
        rows = []
        for i, label in enumerate(self.heads):
            layer, head = parse_head_label(label)
            for t, name in enumerate(self.target_names):
                base = float(self.baseline_accuracy[t])
                rows.append(
                    {
                        "head_label": label,
                        "layer": layer,
                        "head": head,
                        "target": name,
                        "baseline_accuracy": base,
                        "ablated_accuracy": base - float(matrix[i, t]),
                        "damage": float(matrix[i, t]),
                    }
                )
        return pd.DataFrame(rows)


@torch.no_grad()
def target_damage(
    model: HookedMHATransformer,
    batch: Batch,
    *,
    method: Method = "mean",
    target_names: Sequence[str] | None = None,
    progress: bool = False,
    exact: Collection[str] | None = None,
    seed: int = 0,
    triples: TripleDamage | None = None,
) -> TargetDamage:
    """Ablate each head alone and record the per-sequence, per-target accuracy drop.

    One pass of the ablation engine with per-position outputs (the clean model and every
    single-head ablation), shared with the division of labour:
    :func:`~mhainterp.specialization.whom.damage.triple_damage`, summed per sequence and target.

    Args:
        model: The model.
        batch: The evaluation batch (also the reference of mean/resample ablation).
        method: ``"zero"``, ``"mean"`` or ``"resample"`` (:mod:`mhainterp.ablation`).
        target_names: One name per target (default ``target0..``, or the task's name).
        progress: Show a progress bar.
        exact: Under the division's attribution screen (a pretrained model), the heads the
            engine removes; every other head's damage is its attribution estimate
            (:func:`~mhainterp.specialization.whom.screen.screened_triple_damage`, seeded by
            ``seed``). None (the default): every head removed.
        triples: The per-triple single-head damage of this model, batch and method already
            computed (the screened division's ``single_damage``): summed here, no pass runs.

    Returns:
        A :class:`TargetDamage`.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> batch = get_task("previous_token").eval_batch(64)
        >>> td = target_damage(handbuilt_model(["previous", "dead"], d_head=18), batch,
        ...                    method="zero")
        >>> td.matrix.round(decimals=2).tolist()
        [[0.84], [0.0]]
    """
    k = batch.n_targets
    if k != model.cfg.n_targets:
        raise ParameterError(
            f"batch is invalid: {model.cfg.n_targets} targets per position (the model's "
            f"n_targets), got {k}"
        )
    names = list(target_names) if target_names is not None else [f"target{i}" for i in range(k)]
    # One implementation of "every head's damage per scored triple": the division of labour's.
    if triples is not None:
        td = triples
    elif exact is None:
        td = triple_damage(model, batch, method=method, names=names, progress=progress)
    else:
        td = screened_triple_damage(
            model, batch, method=method, exact=exact, names=names, seed=seed, progress=progress
        )
    n, H = len(batch), len(td.heads)
    sequence, target = td.index[:, 0], td.index[:, 2]  # (N,) each
    cell = sequence * k + target  # (N,) which (sequence, target) a triple counts for
    correct_drop = td.damage.new_zeros(H, n * k, dtype=torch.float64)
    correct_drop.index_add_(1, cell, td.damage.double())
    n_scored = torch.bincount(target, minlength=k).double().clamp(min=1)  # (k,)
    clean = torch.bincount(target, weights=td.clean.double(), minlength=k)
    return TargetDamage(
        heads=td.heads,
        target_names=names,
        # Scaled so the mean over sequences is the batch-level accuracy drop.
        damage=correct_drop.reshape(H, n, k) * n / n_scored,  # (H, n, k)
        loss_increase=td.loss_increase.double().mean(1),
        baseline_accuracy=clean / n_scored,
    )


def selectivity_index(
    matrix: Float[Tensor, "... H k"], min_damage: float = 0.01
) -> Float[Tensor, "... H"]:
    """``(k * max(d) / D - 1) / (k - 1)`` per head (rows), NaN where ``D < min_damage``.

    Damages are clipped at 0 first (an ablation that helps a target is no damage).

    Example:
        >>> selectivity_index(torch.tensor([[0.6, 0.0, 0.0], [0.2, 0.2, 0.2], [0.0, 0.0, 0.0]]))
        tensor([1., 0., nan])
    """
    k = matrix.shape[-1]
    if k < 2:
        raise ParameterError(
            f"matrix is invalid: at least 2 targets (a multi-target task), got shape "
            f"{tuple(matrix.shape)}"
        )
    d = matrix.clamp(min=0)
    total = d.sum(-1)
    # (k * max - D) / ((k - 1) * D) >= 0; the clamp removes float round-off below 0.
    index = ((k * d.amax(-1) - total) / ((k - 1) * total.clamp(min=1e-300))).clamp(min=0)
    return torch.where(total >= min_damage, index, torch.full_like(index, math.nan))


def model_selectivity(
    matrix: Float[Tensor, "... H k"], min_damage: float = 0.01
) -> Float[Tensor, "..."]:
    """Damage-weighted mean selectivity over the heads that do damage (NaN if none do).

    Example:
        >>> float(model_selectivity(torch.tensor([[0.6, 0.0], [0.1, 0.1]])))
        0.75
    """
    d = matrix.clamp(min=0)
    total = d.sum(-1)
    index = selectivity_index(matrix, min_damage)
    weight = torch.where(index.isnan(), 0.0, total)
    weighted = (torch.nan_to_num(index) * weight).sum(-1)
    weight_sum = weight.sum(-1)
    return torch.where(weight_sum > 0, weighted / weight_sum.clamp(min=1e-300), math.nan)


@dataclass
class CausalSelectivity:
    """Result of :func:`causal_selectivity`.

    Attributes:
        heads: Per head: ``head_label, total_damage, causal_target, selectivity,
            null_selectivity`` (mean over permutations), ``p_selectivity``, ``loss_increase``.
        matrix: Tidy head x target damage table (:meth:`TargetDamage.frame`).
        selectivity: The model's damage-weighted selectivity.
        null_mean: Its mean under the permutation null.
        null_std: Its standard deviation under the null.
        p_value: ``(1 + #{null >= observed}) / (1 + M)``.
        n_permutations: ``M``, the draws made: ``n_permutations`` raised to ``2 m / alpha`` for
            the ``m`` heads with a selectivity, so that Holm over the heads can pass a head
            beyond every draw (the p floor is ``1 / (1 + M)``).
    """

    heads: pd.DataFrame
    matrix: pd.DataFrame
    selectivity: float
    null_mean: float
    null_std: float
    p_value: float
    n_permutations: int


def _permuted_means(
    damage: Float[Tensor, "H n k"], m: int, generator: torch.Generator
) -> Float[Tensor, "m H k"]:
    """``m`` draws of the per-head target means with targets shuffled within each sequence."""
    keys = torch.rand(
        (m, *damage.shape), generator=generator, dtype=torch.float64, device=DRAW_DEVICE
    ).to(damage.device)
    order = keys.argsort(-1)  # (m, H, n, k): a random permutation of targets per sequence
    return torch.gather(damage.expand(m, *damage.shape), -1, order).mean(2)


def causal_selectivity(
    damage: TargetDamage,
    *,
    min_damage: float = 0.01,
    n_permutations: int = 1000,
    alpha: float = 0.05,
    generator: torch.Generator | None = None,
    chunk: int = 250,
) -> CausalSelectivity:
    """Selectivity index of every head and of the model, with the permutation null.

    Args:
        damage: From :func:`target_damage` (at least 2 targets).
        min_damage: A head whose summed accuracy drop is below this does no damage (SI NaN).
        n_permutations: Null draws ``M`` (at least; see ``alpha``).
        alpha: The level the heads' p-values are corrected to (Holm over the heads with a
            selectivity): the draws are raised to ``2 m / alpha`` for ``m`` such heads.
        generator: Randomness of the null (seed 0 when None).
        chunk: Draws per vectorised step.

    Returns:
        A :class:`CausalSelectivity`.

    Example:
        >>> result = causal_selectivity(target_damage(model, batch))  # doctest: +SKIP
        >>> result.selectivity, result.null_mean, result.p_value  # doctest: +SKIP
    """
    if len(damage.target_names) < 2:
        raise ParameterError(
            f"damage is invalid: a multi-target task's damage (at least 2 targets), got "
            f"targets {list(damage.target_names)}"
        )
    check_int("n_permutations", n_permutations, minimum=1)
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    observed = damage.matrix  # (H, k)
    head_si = selectivity_index(observed, min_damage)  # (H,)
    model_si = float(model_selectivity(observed, min_damage))
    n_tests = int((~head_si.isnan()).sum())
    n_permutations = max(n_permutations, math.ceil(2 * n_tests / alpha))
    head_hits = observed.new_zeros(len(damage.heads), dtype=torch.float64)
    head_null_sum = observed.new_zeros(len(damage.heads), dtype=torch.float64)
    null_models = []
    for start in range(0, n_permutations, chunk):
        m = min(chunk, n_permutations - start)
        means = _permuted_means(damage.damage, m, generator)  # (m, H, k)
        null_si = selectivity_index(means, min_damage)  # (m, H)
        head_hits += (null_si >= head_si - 1e-12).double().sum(0)
        head_null_sum += torch.nan_to_num(null_si).sum(0)
        null_models.append(model_selectivity(means, min_damage))
    null = torch.cat(null_models)
    totals = observed.clamp(min=0).sum(-1)
    names = damage.target_names
    heads = pd.DataFrame(
        {
            "head_label": damage.heads,
            "total_damage": totals.numpy(),
            "causal_target": [
                names[int(i)] if t >= min_damage else ""
                for i, t in zip(observed.argmax(-1), totals, strict=True)
            ],
            "selectivity": head_si.numpy(),
            "null_selectivity": torch.where(
                head_si.isnan(), math.nan, head_null_sum / n_permutations
            ).numpy(),
            "p_selectivity": torch.where(
                head_si.isnan(), math.nan, (1 + head_hits) / (1 + n_permutations)
            ).numpy(),
            "loss_increase": damage.loss_increase.numpy(),
        }
    )
    valid = null[~null.isnan()]
    hits = float((valid >= model_si - 1e-12).sum()) if not math.isnan(model_si) else math.nan
    return CausalSelectivity(
        heads=heads,
        matrix=damage.frame(),
        selectivity=model_si,
        null_mean=float(valid.mean()) if valid.numel() else math.nan,
        null_std=float(valid.std()) if valid.numel() > 1 else math.nan,
        p_value=(1 + hits) / (1 + n_permutations) if not math.isnan(hits) else math.nan,
        n_permutations=n_permutations,
    )


def head_damage_table(damage: TargetDamage) -> pd.DataFrame:
    """Per head: ``head_label, total_damage`` (summed accuracy drop, clipped at 0 per target)
    and ``loss_increase``: the importance evidence used on single-target tasks too."""
    totals = damage.matrix.clamp(min=0).sum(-1)
    return pd.DataFrame(
        {
            "head_label": damage.heads,
            "total_damage": totals.numpy(),
            "loss_increase": damage.loss_increase.numpy(),
        }
    )
