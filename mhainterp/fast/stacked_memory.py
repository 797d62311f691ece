"""How much device memory :func:`mhainterp.fast.stacked.train_many` needs per model, estimated
before anything is allocated (a GPU sweep sizes its groups by it).

The activations are not counted by hand: one model's forward pass is traced on torch's meta
device (shapes only, nothing allocated) and the tensors autograd saves for the backward pass
are summed, so the estimate follows the forward pass when it changes.

Shapes: M models, B batch, T positions, P parameters per model.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from mhainterp.config import ModelConfig, TrainConfig
from mhainterp.fast.stacked_forward import batched_logits, batched_loss
from mhainterp.fast.stacked_params import StackedModels
from mhainterp.training import count_parameters, itemsize

__all__ = ["BACKWARD_FACTOR", "STATE_COPIES", "stacked_bytes_per_model", "saved_activation_bytes"]

STATE_COPIES = 6
"""``[M, P]`` buffers per model in a group: the weights, their gradient, AdamW's two moments,
the last good weights, and the model's own parameters (where the rows are written back)."""

BACKWARD_FACTOR = 2
"""The backward pass holds the saved activations and, at its peak, gradients of about their
size: the activations are counted twice."""


def saved_activation_bytes(config: ModelConfig, batch_size: int, padded: bool = False) -> int:
    """Bytes autograd keeps from one model's stacked forward pass and loss on ``batch_size``
    sequences, traced on the meta device (nothing is allocated; the first call in a process
    loads torch's meta kernels, about a second or two).

    Example:
        >>> cfg = ModelConfig(d_model=64, n_heads=8, n_ctx=16, d_vocab=10, d_vocab_out=16)
        >>> saved_activation_bytes(cfg, 128) > 128 * 16 * 64 * 4  # more than the residual
        True
    """
    return _saved_bytes(tuple(sorted(config.to_dict().items(), key=str)), batch_size, padded)


@functools.lru_cache(maxsize=64)
def _saved_bytes(config_items: tuple, batch_size: int, padded: bool) -> int:
    config = ModelConfig.from_dict({**dict(config_items), "device": "meta"})
    n_params = count_parameters(config)
    dtype = getattr(torch, config.to_dict()["dtype"])
    stack = StackedModels(
        torch.zeros(1, n_params, dtype=dtype, device="meta"), config, [config.n_heads]
    )
    shape = (1, batch_size, config.n_ctx)
    tokens = torch.zeros(shape, dtype=torch.long, device="meta")
    targets_shape = shape if config.n_targets == 1 else (*shape, config.n_targets)
    targets = torch.zeros(targets_shape, dtype=torch.long, device="meta")
    mask = torch.ones(shape, dtype=torch.bool, device="meta")
    saved: list[int] = []

    def pack(tensor: Tensor) -> Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = batched_logits(stack, tokens, mask if padded else None)
        batched_loss(logits, targets, mask, config.d_vocab_out)
    return sum(saved)


def stacked_bytes_per_model(config: ModelConfig, train_config: TrainConfig) -> int:
    """Device bytes one more model adds to a :func:`~mhainterp.fast.stacked.train_many` group:
    :data:`STATE_COPIES` copies of its parameters, :data:`BACKWARD_FACTOR` times its saved
    activations (the larger of the padded and unpadded forward: the config does not say which
    the task needs), and its batch (tokens, lengths, padding mask, targets, scored mask).

    Example:
        >>> cfg = ModelConfig(d_model=64, n_heads=1, n_ctx=16, d_vocab=10, d_vocab_out=16)
        >>> 2**20 < stacked_bytes_per_model(cfg, TrainConfig()) < 64 * 2**20
        True
    """
    activations = max(
        saved_activation_bytes(config, train_config.batch_size, padded) for padded in (False, True)
    )
    tokens = train_config.batch_size * config.n_ctx
    batch = tokens * (8 + 8 + 1 + 8 * config.n_targets + 1)
    parameters = STATE_COPIES * count_parameters(config) * itemsize(config)
    return parameters + BACKWARD_FACTOR * activations + batch
