"""The stacked step's speed-ups change no bit: the trained weights (and so every table a sweep
writes) are exactly those of the plain formulation (issue 38: ``torch.equal``, not a
tolerance). Each test compares two ways of computing the same thing in this process."""

from __future__ import annotations

import pytest
import torch

import mhainterp.fast.stacked as stacked
from mhainterp.config import TrainConfig
from mhainterp.fast.stacked import sample_many, train_many
from mhainterp.fast.stacked_buffers import Workspace
from mhainterp.fast.stacked_forward import batched_logits, batched_loss
from mhainterp.fast.stacked_params import StackedModels
from mhainterp.tasks import get_task
from mhainterp.training import build_model

CASES = [
    # causal and unpadded (the demo's count_previous), one and two head counts
    ("count_previous", {"seq_len": 8, "d_vocab": 5}, (1, 1)),
    ("count_previous", {"seq_len": 8, "d_vocab": 5}, (4, 4)),
    ("count_previous", {"seq_len": 8, "d_vocab": 5}, (1, 2, 4)),
    # bidirectional (the demo's reverse), and padded
    ("reverse", {"seq_len": 8, "d_vocab": 5}, (1, 4)),
    ("reverse", {"seq_len": 8, "d_vocab": 5, "min_len": 3}, (1, 4)),
]
DEEP = {"n_layers": 2, "attn_only": False, "normalization_type": "LN"}  # every kind of layer


def _models(name, params, heads, **kwargs):
    task = get_task(name, **params)
    models = [
        build_model(task, n_heads=h, seed=s, d_model=16, **kwargs) for s, h in enumerate(heads)
    ]
    return task, models


def _step(stack, task, batch, work):
    """Logits, and the gradient of the loss (the training step's forward and backward)."""
    stack.grad.zero_()
    pad = batch.padding_mask if batch.padded else None
    logits = batched_logits(stack, batch.tokens, pad, work=work)
    loss = batched_loss(logits, batch.targets, batch.mask, task.d_vocab_out, labelled=True)
    loss.sum().backward()
    return logits.detach().clone(), stack.grad.clone()


@pytest.mark.filterwarnings("ignore:.*gradient layout contract")  # grads: slices of one buffer
@pytest.mark.parametrize("deep", [False, True])
@pytest.mark.parametrize(("name", "params", "heads"), CASES)
def test_the_workspace_step_is_bitwise_the_plain_step(name, params, heads, deep):
    """Layer 0's gathers and attention core and every output projection in reused buffers
    (:mod:`stacked_buffers`, with their backward written out) give the bits of the plain ops
    and autograd, step after step (the second step overwrites the first's buffers); with
    one layer, attention only (the demo's models), and two with MLPs and LayerNorm."""
    task, models = _models(name, params, heads, **(DEEP if deep else {}))
    stacks = [StackedModels.from_models(models) for _ in range(2)]
    work = Workspace()
    for step in range(2):
        gens = [torch.Generator().manual_seed(100 * step + s) for s in range(len(models))]
        batch = sample_many(task, 32, gens)  # 32 sequences > 5 tokens: layer 0 on the table
        plain = _step(stacks[0], task, batch, None)
        reused = _step(stacks[1], task, batch, work)
        assert plain[1].abs().max() > 0
        for a, b in zip(plain, reused, strict=True):
            assert torch.equal(a, b)
        for stack in stacks:  # a different point for the next step
            stack.flat.data.sub_(1e-2 * stack.grad)


def test_train_many_is_bitwise_train_many_without_the_workspace(monkeypatch):
    """The whole training loop (clipping, AdamW, logging) with and without the reused buffers:
    the same weights and the same metrics, bit for bit."""
    task = get_task("count_previous", seq_len=8, d_vocab=5)
    heads = (1, 4, 1, 4)
    configs = [
        TrainConfig(steps=12, batch_size=32, warmup_steps=2, log_every=4, n_eval=16, seed=s)
        for s in range(len(heads))
    ]
    runs = []
    for reuse in (True, False):
        if not reuse:
            monkeypatch.setattr(stacked, "Workspace", lambda: None)
        models = [build_model(task, n_heads=h, seed=s, d_model=16) for s, h in enumerate(heads)]
        runs.append(train_many(models, task, configs, progress=False))
    for a, b in zip(*runs, strict=True):
        for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
            assert torch.equal(pa, pb), name
        assert a.metrics.equals(b.metrics)
