"""The training loss and the target value it ignores: what the model's ``return_type="loss"``
(TransformerLens's API) needs, below the model so the model imports nothing above it.

:mod:`mhainterp.scoring` builds every other score (scored positions, per-position loss and
accuracy, KL to clean) on :data:`IGNORE_INDEX` and uses this :func:`mean_loss`; this is their one
home.

Shapes: n sequences, T positions, k targets, V classes.

Example:
    >>> import torch
    >>> logits = torch.tensor([[[0.0, 0.0], [9.0, 0.0]]])  # [n=1, T=2, V=2]
    >>> round(mean_loss(logits, torch.tensor([[0, IGNORE_INDEX]])).item(), 4)  # ln 2
    0.6931
"""

from __future__ import annotations

import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.validation import invalid

__all__ = ["IGNORE_INDEX", "mean_loss"]

IGNORE_INDEX = -100
"""Target value at unscored positions (``torch.nn.functional.cross_entropy``'s ``ignore_index``)."""


def mean_loss(
    logits: Float[Tensor, "n T *k V"],
    targets: Int[Tensor, "n T *k"],
    mask: Bool[Tensor, "n T"] | None = None,
) -> Float[Tensor, ""]:
    """Mean cross-entropy over scored triples (differentiable; the training loss).

    Args:
        logits: ``[n, T, V]`` or ``[n, T, k, V]`` class logits.
        targets: Integer class ids ``[n, T]`` or ``[n, T, k]``; :data:`IGNORE_INDEX` is unscored.
        mask: Optional bool ``[n, T]``; False positions are unscored. None scores every
            position whose target is not :data:`IGNORE_INDEX`.

    Returns:
        The scalar mean cross-entropy over scored (sequence, position, target) triples.

    Raises:
        ParameterError: ``targets`` is not an integer tensor, or its shape does not match.
    """
    if not isinstance(targets, Tensor) or targets.is_floating_point():
        shown = f"a {targets.dtype} tensor" if isinstance(targets, Tensor) else targets
        raise invalid("targets", shown, f"an integer tensor of class ids ({IGNORE_INDEX} = ignore)")
    if targets.numel() != logits[..., 0].numel():
        raise invalid(
            "targets",
            f"a tensor of shape {tuple(targets.shape)}",
            f"shape {tuple(logits.shape[:-1])}, matching logits {tuple(logits.shape)}",
        )
    targets = targets.long().reshape(logits.shape[:-1])
    if mask is not None:
        keep = mask if targets.ndim == mask.ndim else mask[..., None]
        targets = targets.masked_fill(~keep.expand_as(targets), IGNORE_INDEX)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )
