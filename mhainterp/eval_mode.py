"""``with eval_mode(model):`` — evaluation mode for a block, the caller's mode restored after.

One helper for every reader of a model (evaluation, the ablation engine, gradient importance).
It switches only when the model is training: ``Module.eval()`` walks every submodule, which is
a measurable share of a small model's short evaluation (about 0.3 ms per switch on an 8-head
model, twice per call).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["eval_mode"]


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Put ``model`` in evaluation mode inside the block; put it back in training mode after
    (also on an error) if it was in training mode before.

    Example:
        >>> layer = torch.nn.Dropout()
        >>> with eval_mode(layer):
        ...     layer.training
        False
        >>> layer.training
        True
    """
    if not model.training:
        yield model
        return
    model.eval()
    try:
        yield model
    finally:
        model.train(True)
