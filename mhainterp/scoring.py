"""Which positions are scored, and loss and accuracy on them: the one implementation.

Training's loss, ``evaluate``, every ablation table, the division-of-labour profiles and the
explorer all score through this module, so "accuracy" means the same thing everywhere:

- a (sequence, position, target) triple is **scored** when the batch's ``mask`` is True at the
  position and the target is not :data:`IGNORE_INDEX`;
- **loss** is the mean cross-entropy over scored triples (the differentiable training loss,
  :func:`~mhainterp.model.loss.mean_loss`, and :data:`IGNORE_INDEX` live below the model, in
  :mod:`mhainterp.model.loss`, for its ``return_type="loss"``); **accuracy** the share of scored
  triples whose argmax logit is the target; ``accuracy/<target>`` the same per target.

Shapes: C copies (ablation configurations), n sequences, T positions, k targets, V classes.
Logits may be ``[n, T, V]`` (one target) or ``[n, T, k, V]``, with any leading copy axes.

Example:
    >>> import torch
    >>> logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [5.0, 0.0]]])  # [n=1, T=3, V=2]
    >>> targets = torch.tensor([[0, 0, IGNORE_INDEX]])
    >>> mask = torch.tensor([[True, True, True]])
    >>> scores = position_scores(logits, targets, mask)
    >>> scores.correct.squeeze(-1).tolist(), totals(scores).metrics()[0]["accuracy"]
    ([[True, False, False]], 0.5)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.model.loss import IGNORE_INDEX  # noqa: F401 (the doctests' unscored target)
from mhainterp.runtime import reads_without_wait
from mhainterp.tasks.batch import scored_positions
from mhainterp.validation import ParameterError

if TYPE_CHECKING:  # tasks.batch imports this module
    from mhainterp.tasks import Batch

__all__ = [
    "FORWARD_MEMORY_BUDGET",
    "OUTPUT_KINDS",
    "CleanOutputMetric",
    "PositionScores",
    "Totals",
    "metric_names",
    "position_scores",
    "damage_metric",
    "delta_cross_entropy",
    "embedding_damage",
    "kl_to_clean",
    "pooled_output",
    "rows_for_outputs",
    "totals",
]


@dataclass
class PositionScores:
    """Per-(copy, sequence, position, target) results; unscored entries are 0 / False.

    Attributes:
        nll: ``[*C, n, T, k]`` cross-entropy of the target (float32, or float64 for a float64
            model), 0 where unscored.
        correct: ``[*C, n, T, k]`` argmax == target, False where unscored.
        predictions: ``[*C, n, T, k]`` argmax class (also where unscored, except at the
            trailing padding the ablation engine cuts from a chunk: 0 there).
        scored: ``[n, T, k]`` which triples count (shared by every copy).
    """

    nll: Float[Tensor, "*C n T k"]
    correct: Bool[Tensor, "*C n T k"]
    predictions: Int[Tensor, "*C n T k"]
    scored: Bool[Tensor, "n T k"]


def position_scores(
    logits: Float[Tensor, "*C n T *k V"],
    targets: Int[Tensor, "n T *k"],
    mask: Bool[Tensor, "n T"],
) -> PositionScores:
    """Cross-entropy, correctness and prediction at every position, for every copy."""
    n, T = mask.shape
    scored = scored_positions(targets, mask)  # (n, T, k)
    k, V = scored.shape[-1], logits.shape[-1]
    # Logits have a target axis only when k > 1 (the model's own layout); the rest are copies.
    lead = logits.shape[: logits.ndim - (4 if k > 1 else 3)]
    grouped = logits.reshape(*lead, n, T, k, V)
    index = targets.reshape(n, T, k).clamp(min=0)
    # float32 at least (half-precision log-softmax loses the loss), float64 kept as it is.
    precise = grouped if grouped.dtype == torch.float64 else grouped.float()
    classes = len(lead)  # where the class axis goes in class-major order: (*C, V, n, T, k)
    if precise.movedim(-1, classes).is_contiguous() and V > 1:
        # Class-major memory (the linear readout's copies): every reduction over the classes
        # is elementwise over contiguous rows; the same quantities, rounded in another order.
        nll, predictions = _class_major_scores(precise.movedim(-1, classes), index, classes)
    else:
        nll = -precise.log_softmax(-1).gather(-1, index.expand(*lead, n, T, k)[..., None])
        nll = nll.squeeze(-1)  # (*C, n, T, k)
        predictions = grouped.max(-1).indices  # argmax's first-index rule, 40% faster on CPU
    return PositionScores(
        nll=torch.where(scored, nll, 0.0),
        correct=(predictions == index) & scored,
        predictions=predictions,
        scored=scored,
    )


def _class_major_scores(
    major: Float[Tensor, "*C V n T k"], index: Int[Tensor, "n T k"], classes: int
) -> tuple[Float[Tensor, "*C n T k"], Int[Tensor, "*C n T k"]]:
    """:func:`position_scores`' cross-entropy and argmax (first index among equal maxima)
    from logits whose class axis ``classes`` is outermost in memory."""
    V = major.shape[classes]
    target = index.expand(*major.shape[:classes], 1, *index.shape)  # (*C, 1, n, T, k)
    nll = -major.log_softmax(classes).gather(classes, target).squeeze(classes)
    high = major.amax(classes, keepdim=True)
    # The first maximum: V - max over classes of (V - v) where the class holds the maximum.
    rank = torch.arange(
        V, 0, -1, dtype=torch.uint8 if V < 256 else torch.int32, device=major.device
    )
    rank = rank.reshape(V, *[1] * (major.ndim - classes - 1))
    first = ((major == high) * rank).amax(classes)  # 0: no class equals the max (NaN logits)
    if reads_without_wait(major.device):
        if bool((first == 0).any()):
            return nll, major.movedim(classes, -1).max(-1).indices
        return nll, V - first.long()
    # On a device, the host does not look for NaNs (a sync per call): a NaN logit makes the
    # maximum NaN, which no class equals, and there argmax's rule picks the first NaN, so the
    # NaNs count as maxima. The same answer, for one more elementwise pass.
    first = torch.where(first == 0, (major.isnan() * rank).amax(classes), first)
    return nll, V - first.long()


@dataclass
class Totals:
    """Sufficient statistics of loss and accuracy for C configurations (summable over chunks),
    on the device of the scores they sum.

    Attributes:
        loss_sum: ``[C]`` summed cross-entropy over scored triples (float64).
        correct: ``[C, k]`` correct scored triples per target.
        scored: ``[k]`` scored triples per target (the same for every configuration).
    """

    loss_sum: Float[Tensor, " C"]
    correct: Float[Tensor, "C k"]
    scored: Float[Tensor, " k"]

    def __add__(self, other: Totals) -> Totals:
        """Totals over two disjoint sets of sequences (same configurations)."""
        return Totals(
            self.loss_sum + other.loss_sum, self.correct + other.correct, self.scored + other.scored
        )

    def metrics(self, target_names: Sequence[str] = ()) -> list[dict[str, float]]:
        """One dict per configuration: ``loss, accuracy`` and ``accuracy/<name>`` per target.

        ``target_names`` is empty for single-target models (no per-target columns).
        """
        # One copy to the host for the whole table (a result handed back): per-number reads
        # of device tensors would each wait for the device.
        C, k = self.correct.shape
        host = torch.cat([self.loss_sum, self.correct.reshape(-1), self.scored]).cpu()
        loss_sum, correct, scored = host[:C], host[C : C + C * k].reshape(C, k), host[C + C * k :]
        n_scored = float(scored.sum())
        if n_scored == 0:
            raise ParameterError(
                "mask is invalid: at least one scored position, got none (it is all False)"
            )
        rows = []
        for c in range(C):
            row = {
                "loss": float(loss_sum[c]) / n_scored,
                "accuracy": float(correct[c].sum()) / n_scored,
            }
            for t, name in enumerate(target_names):
                s = float(scored[t])
                row[f"accuracy/{name}"] = float(correct[c, t]) / s if s else float("nan")
            rows.append(row)
        return rows


def totals(scores: PositionScores) -> Totals:
    """Sum :class:`PositionScores` over sequences and positions (copies kept apart).

    The sums stay where the scores are (summed over chunks there, with no wait for the
    device); :meth:`Totals.metrics` copies them to the host once.
    """
    nll, correct = scores.nll, scores.correct
    C = nll.shape[: nll.ndim - 3]
    return Totals(
        loss_sum=nll.double().reshape(*C, -1).sum(-1).reshape(-1),
        correct=correct.double().sum((-3, -2)).reshape(-1, scores.scored.shape[-1]),
        scored=scores.scored.double().sum((0, 1)),
    )


def metric_names(target_names: Sequence[str] = ()) -> list[str]:
    """``["loss", "accuracy", "accuracy/<name>"...]``: the metric columns of every table."""
    return ["loss", "accuracy", *(f"accuracy/{name}" for name in target_names)]


# ----------------------------------------------------------------------------- real models

OutputKind = Literal["kl", "embedding", "position_embedding"]
OUTPUT_KINDS: tuple[OutputKind, ...] = ("kl", "embedding", "position_embedding")
"""What :class:`CleanOutputMetric` scores: KL to the clean next-token distribution,
1 - cosine of the mean-pooled output to the clean one (embedding-only models), or 1 - cosine
of each position's output to the clean one at that position (the per-position embedding
metric: where in the sentence an embedding model's output is hurt)."""

FORWARD_MEMORY_BUDGET = 512 * 2**20
"""Bytes one ablation forward may spend on its outputs (see :func:`rows_for_outputs`)."""
_OUTPUT_COPIES = 3
"""Float tensors of the output's size alive at once while scoring (output, log-softmax, one
temporary)."""


def rows_for_outputs(
    d_vocab_out: int, n_positions: int, budget_bytes: int = FORWARD_MEMORY_BUDGET
) -> int:
    """Rows (copies x sequences) per forward whose outputs fit ``budget_bytes``.

    A row's output is ``n_positions x d_vocab_out`` float32 values, held about
    :data:`_OUTPUT_COPIES` times while it is scored; at least one row.

    Example:
        >>> rows_for_outputs(49152, 48)  # SmolLM2: a 512-row chunk would need 14 GB
        18
        >>> rows_for_outputs(10, 16) >= 512
        True
    """
    per_row = _OUTPUT_COPIES * 4 * max(1, d_vocab_out) * max(1, n_positions)
    return max(1, budget_bytes // per_row)


def delta_cross_entropy(ablated: PositionScores, clean: PositionScores) -> Float[Tensor, "*C n T"]:
    """Per (copy, sequence, position): ablated minus clean next-token cross-entropy, summed
    over targets (0 where unscored; positive = the ablation hurts).

    Example:
        >>> import torch
        >>> t, m = torch.tensor([[1, IGNORE_INDEX]]), torch.tensor([[True, True]])
        >>> clean = position_scores(torch.tensor([[[0.0, 2.0], [0.0, 0.0]]]), t, m)
        >>> hurt = position_scores(torch.tensor([[[0.0, 0.0], [9.0, 0.0]]]), t, m)
        >>> [round(v, 3) for v in delta_cross_entropy(hurt, clean)[0].tolist()]
        [0.566, 0.0]
    """
    return (ablated.nll - clean.nll).sum(-1)


def kl_to_clean(
    clean_log_probs: Float[Tensor, "n T V"],
    logits: Float[Tensor, "*C n T V"],
    scored: Bool[Tensor, "n T"],
) -> Float[Tensor, "*C n T"]:
    """``KL(clean || ablated)`` of the next-token distribution per position (0 where unscored).

    Example:
        >>> import torch
        >>> clean = torch.tensor([[[0.0, 0.0]]]).log_softmax(-1)
        >>> every = torch.ones(1, 1).bool()
        >>> round(float(kl_to_clean(clean, torch.tensor([[[0.0, 0.0]]]), every)), 6)
        0.0
        >>> round(float(kl_to_clean(clean, torch.tensor([[[2.0, 0.0]]]), every)), 4)
        0.4338
    """
    log_q = logits.float().log_softmax(-1)
    log_p = clean_log_probs.float()
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # (*C, n, T)
    return torch.where(scored, kl, 0.0)


def pooled_output(
    hidden: Float[Tensor, "*C n T d"], padding_mask: Bool[Tensor, "n T"]
) -> Float[Tensor, "*C n d"]:
    """Mean over each sequence's real positions (the sentence embedding of MiniLM)."""
    weights = padding_mask.to(hidden.dtype)[..., None]  # (n, T, 1)
    return (hidden * weights).sum(-2) / weights.sum(-2).clamp(min=1)


def embedding_damage(
    clean_pooled: Float[Tensor, "n d"], hidden: Float[Tensor, "*C n T d"], padding_mask: Tensor
) -> Float[Tensor, "*C n"]:
    """``1 - cos(pooled(hidden), clean_pooled)`` per sequence (0 = the embedding is unchanged).

    Example:
        >>> import torch
        >>> h = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
        >>> float(embedding_damage(torch.tensor([[0.0, 1.0]]), h, torch.tensor([[True, False]])))
        1.0
    """
    pooled = pooled_output(hidden.float(), padding_mask)
    return 1.0 - F.cosine_similarity(pooled, clean_pooled.float().expand_as(pooled), dim=-1)


@dataclass
class CleanOutputMetric:
    """A metric hook for the ablation engine: scores copies against the clean model's output
    instead of against targets (``run_masks(..., metric=...)``).

    Its :class:`PositionScores` put the damage in the ``nll`` slot, so every total and table
    of the engine reads it as the "loss": ``"kl"`` puts ``KL(clean || ablated)`` at each
    scored position; ``"embedding"`` puts the sequence's ``1 - cos`` of the pooled output at
    each of its scored positions (its mean over scored positions weights a sequence by its
    length). ``correct`` is "the argmax is unchanged" (``"kl"``) or all False.

    Attributes:
        kind: ``"kl"`` or ``"embedding"``.
        clean: ``[n, T, V]`` clean log-probabilities (``"kl"``), ``[n, d]`` pooled clean
            outputs (``"embedding"``) or ``[n, T, d]`` clean outputs
            (``"position_embedding"``), for the whole evaluated batch.
        padding_mask: ``[n, T]`` of the evaluated batch (pools the embedding).
    """

    kind: OutputKind
    clean: Tensor
    padding_mask: Bool[Tensor, "n T"]

    def __call__(
        self, outputs: Float[Tensor, "c s T *out"], targets: Tensor, mask: Tensor, rows: Tensor
    ) -> PositionScores:
        """Scores of ``c`` copies of the sequences ``rows`` (their targets and mask)."""
        scored = scored_positions(targets, mask)  # (s, T, 1)
        T = mask.shape[1]  # the engine may cut a chunk's trailing padding
        clean = self.clean[rows.to(self.clean.device)]
        if self.kind == "kl":
            clean = clean[:, :T]
            damage = kl_to_clean(clean, outputs, scored[..., 0])
            same = outputs.argmax(-1) == clean.argmax(-1)
        elif self.kind == "position_embedding":
            clean = clean[:, :T].float()  # (s, T, d)
            cos = F.cosine_similarity(outputs.float(), clean.expand_as(outputs), dim=-1)
            damage = torch.where(scored[..., 0], 1.0 - cos, 0.0)  # (c, s, T)
            same = torch.zeros_like(damage, dtype=torch.bool)
        else:
            padding_mask = self.padding_mask[rows][:, :T]
            per_sequence = embedding_damage(clean, outputs, padding_mask)  # (c, s)
            damage = torch.where(scored[..., 0], per_sequence[..., None], 0.0)
            same = torch.zeros_like(damage, dtype=torch.bool)
        return PositionScores(
            nll=damage[..., None],
            correct=same[..., None] & scored,
            predictions=torch.zeros_like(damage, dtype=torch.long)[..., None],
            scored=scored,
        )


def damage_metric(model: Any, batch: Batch, chunk: int = 32) -> CleanOutputMetric | None:
    """The metric a head's damage on ``model`` is scored by: None (cross-entropy against the
    targets) for next-token models, and for an embedding model (MiniLM, no trained output
    head) ``1 - cos`` of each real position's final hidden state to the clean model's there
    (one clean forward of ``batch``): the per-position parts of the sentence embedding, so
    that a head's damage has a position, a query token and a frequency.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> model = handbuilt_model(["self"], d_head=48)
        >>> damage_metric(model, get_task("previous_token").eval_batch(4)) is None
        True
    """
    if getattr(model.cfg, "objective", "next_token") != "embedding":
        return None
    was_training = model.training
    model.eval()
    with torch.no_grad():
        clean = torch.cat(
            [
                model.logits(part.tokens, part.padding_mask)
                for part in (batch[i : i + chunk] for i in range(0, len(batch), chunk))
            ]
        )
    model.train(was_training)
    return CleanOutputMetric("position_embedding", clean, batch.padding_mask)
