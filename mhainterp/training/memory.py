"""What training needs in memory, estimated before anything is allocated.

:func:`~mhainterp.training.train` and :func:`~mhainterp.training.build_model` refuse a size
that cannot fit with one line (how much is needed, how much is available:
:func:`mhainterp.io.require_memory`) instead of ending in the allocator's traceback; the
stacked trainer (:mod:`mhainterp.fast.stacked_memory`) sizes its groups with the same counts.

Example:
    >>> from mhainterp.config import ModelConfig
    >>> count_parameters(ModelConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, d_mlp=32,
    ...                              d_vocab=5, n_ctx=6, attn_only=True)) > 0
    True
"""

from __future__ import annotations

import torch

from mhainterp.config import ModelConfig, TrainConfig
from mhainterp.model import HookedMHATransformer

__all__ = ["count_parameters", "itemsize", "training_memory", "training_what"]


def count_parameters(config: ModelConfig) -> int:
    """Parameters of a model of ``config``, counted on torch's meta device (nothing allocated)."""
    meta = ModelConfig.from_dict({**config.to_dict(), "device": "meta"})
    with torch.device("meta"):
        return sum(p.numel() for p in HookedMHATransformer(meta).parameters())


def itemsize(config: ModelConfig) -> int:
    """Bytes per element of the model's dtype."""
    return torch.empty((), dtype=getattr(torch, config.to_dict()["dtype"])).element_size()


def training_memory(config: ModelConfig, train_config: TrainConfig) -> int:
    """A lower bound on the bytes :func:`~mhainterp.training.train` allocates: weights,
    gradients, two AdamW moments and the last good copy (5 x parameters); one step's
    activations, kept for the backward pass; the fixed evaluation set (tokens, targets, mask:
    int64)."""
    n = config.n_ctx
    per_token = config.n_layers * (8 * config.d_model + 3 * config.n_heads * n)
    if not config.attn_only:
        per_token += config.n_layers * 2 * config.d_mlp
    per_token += 2 * config.d_vocab_out * config.n_targets
    activations = 2 * train_config.batch_size * n * per_token * itemsize(config)
    batch_tokens = 3 * 8 * n * (train_config.batch_size + train_config.n_eval)
    return 5 * count_parameters(config) * itemsize(config) + activations + batch_tokens


def training_what(config: ModelConfig, train_config: TrainConfig) -> str:
    """What the estimate is of, for the refusal's one line."""
    return (
        f"training (d_model={config.d_model}, batch_size={train_config.batch_size}, "
        f"n_eval={train_config.n_eval})"
    )
