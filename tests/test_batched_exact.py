"""The stacked trainer's shortcuts compute the same bits as what they replace: the loss of
labelled batches, the interval means summed on the host."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mhainterp.fast.stacked import _interval_means, sample_many
from mhainterp.fast.stacked_forward import batched_loss
from mhainterp.tasks import get_task


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))


def test_the_loss_of_a_labelled_batch_is_the_masked_loss_bit_for_bit():
    for name, params in [("induction", {}), ("reverse", {"min_len": 5}), ("multi_relation", {})]:
        task = get_task(name, **params)
        batch = sample_many(task, 16, [torch.Generator().manual_seed(s) for s in (0, 1, 2)])
        n_out = task.n_targets * task.d_vocab_out
        logits = torch.randn(*batch.tokens.shape, n_out, requires_grad=True)
        grads = []
        for labelled in (False, True):
            losses = batched_loss(
                logits, batch.targets, batch.mask, task.d_vocab_out, labelled=labelled
            )
            (grad,) = torch.autograd.grad(losses.sum(), logits)
            grads.append((losses, grad))
        assert _same_bits(grads[0][0], grads[1][0]), name
        assert torch.equal(grads[0][1], grads[1][1]), name


def test_a_full_batch_knows_its_count_and_a_padded_one_does_not():
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    assert sample_many(get_task("reverse"), 8, gens, checked=False).all_scored
    assert not sample_many(get_task("reverse", min_len=4), 8, gens, checked=False).all_scored
    assert not sample_many(get_task("induction"), 8, gens, checked=False).all_scored


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_interval_means_are_the_running_device_sums_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(0)
    losses = torch.rand(50, 6, generator=generator) * 3
    losses[:, 1] = -0.0  # a perfect model's loss: the running sum starts at +0
    losses[7, 2], losses[9, 3], losses[3, 4] = math.nan, math.inf, 3e38
    running = torch.zeros(6, dtype=dtype)
    for row in losses:
        running += row.to(dtype)
    expected = (running / len(losses)).tolist()
    got = _interval_means(losses.numpy(), dtype)
    for a, b in zip(got, expected, strict=True):
        assert (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    assert np.isnan(got[2]) and got[3] == math.inf
