"""What the explorer shows differently for a pretrained model on real text.

A pretrained model's batch comes from :func:`mhainterp.tasks.text.text_batch`: its "classes"
are a vocabulary of tens of thousands of tokens, so the explorer groups its metrics along the
text axes of :func:`mhainterp.tasks.text.text_axes` (query token class, position bucket,
next-token frequency) instead of per class, and shows tokens as the tokenizer's strings.

Example:
    >>> position_bucket_names()
    ['0', '1-3', '4-7', '8-15', '16+']
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from mhainterp.tasks import AXES, Batch
from mhainterp.tasks.text import POSITION_BUCKETS, TOKEN_CLASSES, text_axes

__all__ = [
    "AXIS_TITLES",
    "FREQUENCY_NAMES",
    "axis_title",
    "position_bucket_names",
    "text_axis_values",
    "token_strings",
]

AXIS_TITLES = {
    "token_class": "query token class",
    "target_frequency": "next-token frequency",
}
"""What the page calls a text task's own axes of ``ExploreSession.metrics()["by"]`` (the
division axes' titles are theirs: :class:`~mhainterp.tasks.DivisionAxis`)."""


def axis_title(axis: str) -> str:
    """What the page calls ``axis``: a text task's own title, a division axis's, or its name.

    Example:
        >>> axis_title("token"), axis_title("target_frequency")
        ('query token', 'next-token frequency')
    """
    if axis in AXIS_TITLES:
        return AXIS_TITLES[axis]
    return AXES[axis].title if axis in AXES else axis


FREQUENCY_NAMES = ("rare", "medium", "common")
"""Names of :func:`~mhainterp.tasks.text.text_axes`'s three next-token frequency buckets."""


def position_bucket_names() -> list[str]:
    """Names of the position buckets of :data:`~mhainterp.tasks.text.POSITION_BUCKETS`."""
    bounds = list(POSITION_BUCKETS)
    names = [str(low) if high - low == 1 else f"{low}-{high - 1}" for low, high in pairwise(bounds)]
    return [*names, f"{bounds[-1]}+"]


def text_axis_values(
    batch: Batch, tokenizer: Any, scored: Bool[Tensor, "n T k"], *, next_token: bool
) -> tuple[dict[str, Tensor], dict[str, list[str]]]:
    """Value ids and names of each text axis at the scored triples (row-major order).

    The contract of :func:`mhainterp.specialization.whom.damage.axis_values`: per axis, one id
    per scored triple into that axis's list of names, holding only the values that occur.

    Args:
        batch: A text batch (one target per position).
        tokenizer: Its tokenizer (special ids, punctuation).
        scored: ``[n, T, 1]`` which triples are scored.
        next_token: Whether targets are next tokens (else the frequency axis is left out:
            an embedding model's targets are placeholders).
    """
    axes = text_axes(batch, tokenizer)
    names = {
        "token_class": list(TOKEN_CLASSES),
        "position": position_bucket_names(),
        "target_frequency": list(FREQUENCY_NAMES),
    }
    if not next_token:
        del axes["target_frequency"]
    at_scored = scored[..., 0].cpu()
    values, value_names = {}, {}
    for axis, per_position in axes.items():
        column = per_position[at_scored]  # (N,) row-major, every value >= 0 where scored
        present, ids = torch.unique(column, return_inverse=True)
        values[axis] = ids
        value_names[axis] = [names[axis][int(v)] for v in present]
    return values, value_names


def token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token id as the text it stands for (``" Paris"``, ``"##ing"``, ``"[CLS]"``).

    Example:
        >>> class Words:
        ...     def decode(self, ids): return {5: " cat", 6: "s"}[ids[0]]
        >>> token_strings(Words(), [5, 6])
        [' cat', 's']
    """
    return [tokenizer.decode([token]) for token in ids]
