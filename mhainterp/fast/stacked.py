"""Train a group of same-shaped models at once: one batched step instead of one step per model.

The models of a head-count sweep are tiny, so on a CPU the per-operation overhead of PyTorch,
not arithmetic, sets the speed of training them one by one. :func:`train_many` trains ``M``
models together: their parameters live in one ``[M, P]`` buffer, every matmul of the forward and
backward pass is one ``bmm`` over the model axis, the per-model gradient norms (for clipping)
are one ``norm(dim=1)`` and AdamW is a handful of element-wise ops over the whole buffer.
Layer 0's per-token work (LayerNorm, the Q/K/V projection) depends only on the (token,
position) pair, so it is computed on the ``d_vocab * T`` table of pairs and gathered: with
10 tokens and batch 128 that is 13x fewer rows for the largest matmul of the model.

The result is the same as training each model alone with :func:`mhainterp.training.train`
(to float rounding): each model draws its own data stream from a generator seeded with its
``TrainConfig.seed``, follows the same learning-rate schedule, clips by its *own* gradient
norm, logs the same ``metrics.csv`` rows and is evaluated by the same
:func:`~mhainterp.training.evaluate`. Models with different head counts share one step: the
fused Q/K/V/O weights have the same shape for every ``n_heads``; only the split into heads (the
attention core) is done per head count.

Shapes: M models, B batch, T positions, d d_model, h heads, P parameters per model.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.config import ModelConfig, TrainConfig
from mhainterp.model import HookedMHATransformer
from mhainterp.scoring import scored_positions
from mhainterp.tasks import Task
from mhainterp.training import (
    Run,
    TrainingDivergedError,
    _check_compatible,
    _diverged,
    evaluate,
    lr_at,
    save_run,
)

__all__ = [
    "BatchDivergedError",
    "ManyBatch",
    "StackedModels",
    "batched_logits",
    "batched_loss",
    "check_batchable",
    "sample_many",
    "train_many",
]

# Fields that may differ between models trained together (everything else must be equal).
_FREE_MODEL_FIELDS = ("n_heads", "d_head", "seed")
_FREE_TRAIN_FIELDS = ("seed",)
_ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which training.train uses
_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


class BatchDivergedError(TrainingDivergedError):
    """Some models of a :func:`train_many` group diverged; the others finished.

    Attributes:
        results: One entry per model, in input order: its :class:`~mhainterp.training.Run`, or
            None for a model that diverged (its run folder, if any, holds the last good weights with
            ``eval.json`` status "diverged", exactly as :func:`~mhainterp.training.train`
            leaves it).
        messages: Input index -> the divergence message :func:`train` would have raised.
    """

    def __init__(self, results: list[Run | None], messages: dict[int, str]) -> None:
        self.results = results
        self.messages = messages
        lines = [f"model {i}: {message}" for i, message in sorted(messages.items())]
        super().__init__(f"{len(messages)} of {len(results)} models diverged:\n" + "\n".join(lines))


# ----- parameters of M models in one buffer ------------------------------------------------------
_FUSED_QKV = tuple(f"attn.{x}_proj.{kind}" for kind in ("weight", "bias") for x in "qkv")


def _param_layout(model: HookedMHATransformer) -> list[tuple[str, tuple[int, ...]]]:
    """The model's own parameters (``named_parameters``: names and shapes) in buffer order.

    The one change to the model's order: each attention's Q, K and V weights are moved next to
    each other, then their biases, so that one ``[3d, d]`` view projects all three at once.
    """
    params = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    shapes = dict(params)
    layout: list[tuple[str, tuple[int, ...]]] = []
    for name, shape in params:
        if name.endswith(_FUSED_QKV[0]):  # the first of a fused group: emit the whole group
            prefix = name[: -len(_FUSED_QKV[0])]
            layout += [(prefix + part, shapes[prefix + part]) for part in _FUSED_QKV]
        elif not name.endswith(_FUSED_QKV):
            layout.append((name, shape))
    return layout


def _layout_of(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """:func:`_param_layout` of a model built from ``cfg`` (the layout depends on it alone)."""
    return _param_layout(HookedMHATransformer(cfg))


def _slot_layout(cfg: ModelConfig) -> dict[str, tuple[list[str], tuple[int, ...]]]:
    """Forward-pass weights (slots) -> (the model parameters they span, the slot's shape).

    A slot spans consecutive parameters of :func:`_param_layout`; ``W_qkv`` is the Q, K and V
    weights stacked as ``[3d, d]`` (nn.Linear layout: out x in).
    """
    d, slots = cfg.d_model, {}
    slots["embed"] = (["embed.weight"], (cfg.d_vocab, d))
    slots["pos_embed"] = (["pos_embed.weight"], (cfg.n_ctx, d))
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        if cfg.normalization_type == "LN":
            slots[p + "ln1.w"] = ([p + "ln1.weight"], (d,))
            slots[p + "ln1.b"] = ([p + "ln1.bias"], (d,))
        slots[p + "W_qkv"] = ([p + f"attn.{x}_proj.weight" for x in "qkv"], (3 * d, d))
        slots[p + "b_qkv"] = ([p + f"attn.{x}_proj.bias" for x in "qkv"], (3 * d,))
        slots[p + "W_O"] = ([p + "attn.o_proj.weight"], (d, d))
        slots[p + "b_O"] = ([p + "attn.o_proj.bias"], (d,))
        if not cfg.attn_only:
            if cfg.normalization_type == "LN":
                slots[p + "ln2.w"] = ([p + "ln2.weight"], (d,))
                slots[p + "ln2.b"] = ([p + "ln2.bias"], (d,))
            slots[p + "W_in"] = ([p + "mlp.fc_in.weight"], (cfg.d_mlp, d))
            slots[p + "b_in"] = ([p + "mlp.fc_in.bias"], (cfg.d_mlp,))
            slots[p + "W_out"] = ([p + "mlp.fc_out.weight"], (d, cfg.d_mlp))
            slots[p + "b_out"] = ([p + "mlp.fc_out.bias"], (d,))
    if cfg.normalization_type == "LN":
        slots["ln_final.w"] = (["ln_final.weight"], (d,))
        slots["ln_final.b"] = (["ln_final.bias"], (d,))
    n_out = cfg.n_targets * cfg.d_vocab_out
    slots["W_U"] = (["unembed.weight"], (n_out, d))
    slots["b_U"] = (["unembed.bias"], (n_out,))
    return slots


def _shape_key(cfg: ModelConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.to_dict().items() if k not in _FREE_MODEL_FIELDS}


def check_batchable(models: Sequence[HookedMHATransformer]) -> None:
    """Raise ``ValueError`` unless the models can be trained together by :func:`train_many`.

    They must be :class:`HookedMHATransformer` s with equal configs except ``n_heads`` (and the
    derived ``d_head``) and ``seed``, no hooks attached, and the standard parameters only.

    Example:
        >>> check_batchable([build_model(task, n_heads=h) for h in (1, 4, 8)])  # doctest: +SKIP
    """
    if len(models) == 0:
        raise ValueError("models is empty; pass at least one model")
    for i, model in enumerate(models):
        if not isinstance(model, HookedMHATransformer):
            raise TypeError(
                f"models[{i}] must be a HookedMHATransformer, got {type(model).__name__}"
            )
        hooked = [name for name, hp in model.hook_dict.items() if hp.fwd_hooks or hp.bwd_hooks]
        if hooked:
            raise ValueError(
                f"models[{i}] has hooks attached at {hooked[:3]}; batched training does not run "
                "hooks. Remove them (model.reset_hooks()) or train the model with train()"
            )
        expected = dict(_layout_of(model.cfg))
        actual = {name: tuple(p.shape) for name, p in model.named_parameters()}
        if actual != expected:
            extra = sorted(set(actual) - set(expected))
            raise ValueError(
                f"models[{i}] has parameters {extra or sorted(actual)} that batched training does "
                "not know; only the standard HookedMHATransformer parameters are supported"
            )
    reference = _shape_key(models[0].cfg)
    for i, model in enumerate(models[1:], start=1):
        key = _shape_key(model.cfg)
        diff = sorted(k for k in reference if reference[k] != key.get(k))
        if diff:
            raise ValueError(
                f"models[{i}] differs from models[0] in {diff}; models trained together may "
                f"differ only in {list(_FREE_MODEL_FIELDS)}. Group them by shape first"
            )


class StackedModels:
    """The parameters of ``M`` same-shaped models in one ``[M, P]`` buffer, with its gradient.

    Each forward-pass weight is a leaf tensor ``[M, *shape]`` that is a *view* of row slices of
    :attr:`flat`, with its ``.grad`` a view of :attr:`grad`. Autograd accumulates gradients in
    place into those views, so after ``backward()`` the whole gradient is :attr:`grad`, and an
    optimiser step or a per-model norm is one op over the buffer.

    Attributes:
        flat: ``[M, P]`` parameters, row ``m`` = model ``m`` (its own layout, see ``offsets``).
        grad: ``[M, P]`` gradients.
        slots: Forward weight name -> leaf view ``[M, *shape]``.
        offsets: Model parameter name -> (start column, shape).
        n_heads: Head count of each row.

    Example:
        >>> models = [build_model(task, n_heads=h, seed=0) for h in (4, 8)]  # doctest: +SKIP
        >>> StackedModels.from_models(models).flat.shape  # doctest: +SKIP
        torch.Size([2, 18960])
    """

    def __init__(
        self,
        flat: Float[Tensor, "M P"],
        cfg: ModelConfig,
        n_heads: Sequence[int],
        layout: list[tuple[str, tuple[int, ...]]] | None = None,
    ):
        self.cfg = cfg
        self.layout = _layout_of(cfg) if layout is None else layout
        self.n_heads = list(n_heads)
        self.flat = flat
        self.grad = torch.zeros_like(flat)
        self.offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
        start = 0
        for name, shape in self.layout:
            self.offsets[name] = (start, shape)
            start += math.prod(shape)
        if start != flat.shape[1]:
            raise ValueError(f"flat has {flat.shape[1]} columns; the layout needs {start}")
        self.slots: dict[str, Tensor] = {}
        for slot, (names, shape) in _slot_layout(cfg).items():
            first = self.offsets[names[0]][0]
            stop = first + math.prod(shape)
            view = flat[:, first:stop].view(len(flat), *shape)
            view.requires_grad_(True)
            view.grad = self.grad[:, first:stop].view(len(flat), *shape)
            self.slots[slot] = view

    @classmethod
    def from_models(cls, models: Sequence[HookedMHATransformer]) -> StackedModels:
        """Copy the models' weights into one buffer (checked with :func:`check_batchable`)."""
        check_batchable(models)
        cfg = models[0].cfg
        layout = _param_layout(models[0])
        rows = []
        for model in models:
            params = dict(model.named_parameters())
            rows.append(torch.cat([params[name].detach().reshape(-1) for name, _ in layout]))
        return cls(torch.stack(rows), cfg, [m.cfg.n_heads for m in models], layout)

    def __len__(self) -> int:
        return self.flat.shape[0]

    def select(self, rows: Sequence[int]) -> StackedModels:
        """A new stack holding only ``rows`` (copies)."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.flat.device)
        return StackedModels(
            self.flat.index_select(0, index), self.cfg, [self.n_heads[r] for r in rows], self.layout
        )

    def state_dict(self, row: int, flat: Tensor | None = None) -> dict[str, Tensor]:
        """Model ``row``'s parameters by model parameter name (views of ``flat``)."""
        flat = self.flat if flat is None else flat
        return {
            name: flat[row, start : start + math.prod(shape)].view(shape)
            for name, (start, shape) in self.offsets.items()
        }

    @torch.no_grad()
    def write_to(self, row: int, model: HookedMHATransformer, flat: Tensor | None = None) -> None:
        """Copy row ``row`` (of ``flat``, default :attr:`flat`) into ``model``'s parameters."""
        values = self.state_dict(row, flat)
        for name, param in model.named_parameters():
            param.copy_(values[name])

    def head_groups(self) -> list[tuple[int, int, int]]:
        """``(start, stop, n_heads)`` for each run of consecutive rows with one head count."""
        groups: list[tuple[int, int, int]] = []
        for row, h in enumerate(self.n_heads):
            if groups and groups[-1][2] == h:
                groups[-1] = (groups[-1][0], row + 1, h)
            else:
                groups.append((row, row + 1, h))
        return groups


# ----- the batched forward pass ------------------------------------------------------------------
def _linear(x: Float[Tensor, "M N i"], weight: Tensor, bias: Tensor) -> Float[Tensor, "M N o"]:
    """Per-model ``x @ weight.T + bias`` (weight ``[M, o, i]`` in nn.Linear layout)."""
    return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))


def _layer_norm(x: Float[Tensor, "M N d"], weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=eps) * weight[:, None, :] + bias[:, None, :]


def _attend(
    q: Float[Tensor, "n T d_head"],
    k: Float[Tensor, "n T d_head"],
    v: Float[Tensor, "n T d_head"],
    causal: bool,
) -> Float[Tensor, "n T d_head"]:
    """Attention of ``n`` (sequence, head) pairs without padding.

    The fastest formulation measured on a CPU for these tiny heads (T = 16, d_head = 8..64):
    the scale is the ``alpha`` of a ``baddbmm`` whose input is the additive ``-inf`` causal
    bias. Slower alternatives measured: ``scaled_dot_product_attention`` (about 1.2x the
    time), ``torch.compile`` (no gain), a hand-written backward that avoids autograd's final
    stack of the Q/K/V gradients (within the noise, about 5% at h = 8).
    """
    n, T, d_head = q.shape
    scale = 1.0 / math.sqrt(d_head)
    if causal:
        bias = torch.zeros(T, T, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(_future_mask(T, q.device), float("-inf"))
        scores = torch.baddbmm(bias.expand(n, T, T), q, k.transpose(1, 2), alpha=scale)
    else:
        scores = torch.bmm(q, k.transpose(1, 2)) * scale  # (n, T_q, T_k)
    return torch.bmm(torch.softmax(scores, dim=-1), v)


def _split_heads(
    qkv: Float[Tensor, "m N 3d"], T: int, n_heads: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``[m, B * T, 3d]`` token-major Q/K/V -> contiguous head-major Q, K, V, each
    ``[m * B * h, T, d_head]`` (one copy; measured faster over h = 1, 4, 8 than gathering
    head-major rows from the (token, position) table directly)."""
    d_head = qkv.shape[-1] // 3 // n_heads
    heads = qkv.reshape(-1, T, 3, n_heads, d_head).permute(2, 0, 3, 1, 4)  # (3, m*B, h, T, dh)
    return heads.reshape(3, -1, T, d_head).unbind(0)


def _merge_heads(z: Float[Tensor, "n T d_head"], m: int, n_heads: int) -> Float[Tensor, "m N d"]:
    """``[m * B * h, T, d_head]`` (heads after sequences) -> ``[m, B * T, h * d_head]``."""
    _, T, d_head = z.shape
    return z.view(-1, n_heads, T, d_head).transpose(1, 2).reshape(m, -1, n_heads * d_head)


def _padded_attention(
    qkv: Float[Tensor, "m N 3d"],
    T: int,
    n_heads: int,
    causal: bool,
    key_mask: Bool[Tensor, "m B T"],
) -> Float[Tensor, "m N d"]:
    """Attention with a padding mask: the model's own math (``masked_fill``, softmax, and
    ``nan_to_num`` for a query that sees only padding)."""
    m, N, three_d = qkv.shape
    d = three_d // 3
    d_head = d // n_heads
    # (m * B, T, 3, h, d_head) -> three (m * B, h, T, d_head) strided views; no copies
    q, k, v = (x.transpose(1, 2) for x in qkv.view(-1, T, 3, n_heads, d_head).unbind(2))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d_head)  # (m * B, h, T_q, T_k)
    blocked = ~key_mask.reshape(-1, 1, 1, T)
    if causal:
        blocked = blocked | _future_mask(T, qkv.device)
    pattern = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
    z = torch.nan_to_num(pattern, nan=0.0) @ v  # a query that sees only padding: 0
    return z.transpose(1, 2).reshape(m, N, d)  # merge heads: (m, B * T, d)


def _future_mask(T: int, device: torch.device) -> Bool[Tensor, "T T"]:
    return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)


def batched_logits(
    stack: StackedModels,
    tokens: Int[Tensor, "M B T"],
    padding_mask: Bool[Tensor, "M B T"] | None = None,
    use_table: bool | None = None,
) -> Float[Tensor, "M B T n_out"]:
    """The logits of every model of ``stack`` on its own batch; the function
    :meth:`HookedMHATransformer.logits` computes, one ``bmm`` per weight for all models.

    Args:
        stack: The models' parameters.
        tokens: ``[M, B, T]`` token ids, batch ``m`` for model ``m`` (no input checks).
        padding_mask: ``[M, B, T]`` bool, True for real tokens, or None.
        use_table: Compute layer 0's LayerNorm and Q/K/V projection once per (token,
            position) pair and gather them, instead of once per token: the same function,
            with ``V * T`` instead of ``B * T`` rows. None: when ``d_vocab < B``.

    Returns:
        ``[M, B, T, n_targets * d_vocab_out]`` logits.

    Example:
        >>> stack = StackedModels.from_models(models)  # doctest: +SKIP
        >>> batched_logits(stack, tokens[None].expand(len(models), -1, -1))  # doctest: +SKIP
    """
    cfg, s = stack.cfg, stack.slots
    M, B, T = tokens.shape
    d, V = cfg.d_model, cfg.d_vocab
    # Layer 0's LayerNorm and Q/K/V projection see one token at a time, so they are a
    # function of (token, position) only: compute them on the V * T table rows and gather,
    # instead of on all B * T tokens (exact; fewer FLOPs whenever V < B, and the table is
    # then smaller than the activations it replaces).
    table_first_layer = V < B if use_table is None else use_table
    if table_first_layer:
        # Row of each position in its model's (token, position) table: V * T rows per model.
        positions = torch.arange(T, device=tokens.device)
        model_offset = torch.arange(M, device=tokens.device)[:, None, None] * (V * T)
        flat_rows = (tokens * T + positions + model_offset).reshape(-1)  # (M * B * T,)
        table = (s["embed"][:, :, None, :] + s["pos_embed"][:, None, :T, :]).reshape(M, -1, d)
        resid = table.reshape(M * V * T, d).index_select(0, flat_rows).view(M, B * T, d)
    else:
        offsets = torch.arange(M, device=tokens.device)[:, None, None] * V
        resid = F.embedding(tokens + offsets, s["embed"].reshape(M * V, d))  # (M, B, T, d)
        resid = (resid + s["pos_embed"][:, None, :T]).reshape(M, B * T, d)
    groups = stack.head_groups()
    sizes = [b - a for a, b, _ in groups]
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        first = layer == 0 and table_first_layer
        x = table if first else resid
        if cfg.normalization_type == "LN":
            x = _layer_norm(x, s[p + "ln1.w"], s[p + "ln1.b"], cfg.eps)
        qkv = _linear(x, s[p + "W_qkv"], s[p + "b_qkv"])  # (M, V * T or B * T, 3d)
        if first:
            qkv = qkv.reshape(M * V * T, 3 * d).index_select(0, flat_rows).view(M, B * T, -1)
        # split (not slicing): the backward is one cat, not a zero-filled copy per group
        if padding_mask is None:
            parts = [
                _merge_heads(_attend(*_split_heads(part, T, h), cfg.causal), b - a, h)
                for part, (a, b, h) in zip(qkv.split(sizes), groups, strict=True)
            ]
        else:
            parts = [
                _padded_attention(part, T, h, cfg.causal, pad)
                for part, pad, (_, _, h) in zip(
                    qkv.split(sizes), padding_mask.split(sizes), groups, strict=True
                )
            ]
        z = parts[0] if len(parts) == 1 else torch.cat(parts)  # (M, B * T, d)
        resid = resid + _linear(z, s[p + "W_O"], s[p + "b_O"])
        if not cfg.attn_only:
            x = resid
            if cfg.normalization_type == "LN":
                x = _layer_norm(x, s[p + "ln2.w"], s[p + "ln2.b"], cfg.eps)
            act = F.relu if cfg.act_fn == "relu" else F.gelu
            hidden = act(_linear(x, s[p + "W_in"], s[p + "b_in"]))
            resid = resid + _linear(hidden, s[p + "W_out"], s[p + "b_out"])
    if cfg.normalization_type == "LN":
        resid = _layer_norm(resid, s["ln_final.w"], s["ln_final.b"], cfg.eps)
    return _linear(resid, s["W_U"], s["b_U"]).view(M, B, T, -1)


def batched_loss(
    logits: Float[Tensor, "M B T n_out"],
    targets: Int[Tensor, "M B T *k"],
    mask: Bool[Tensor, "M B T"],
    d_vocab_out: int,
) -> Float[Tensor, " M"]:
    """Each model's mean cross-entropy over its scored (position, target) pairs, as
    :meth:`HookedMHATransformer.loss` computes it."""
    M, B, T = mask.shape
    targets = targets.reshape(M * B, T, -1)  # (M * B, T, k)
    scored = scored_positions(targets, mask.reshape(M * B, T)).reshape(-1)  # (M * B * T * k,)
    losses = F.cross_entropy(
        logits.reshape(-1, d_vocab_out), targets.clamp(min=0).reshape(-1), reduction="none"
    )
    losses = torch.where(scored, losses, 0.0).view(M, -1)
    return losses.sum(1) / scored.view(M, -1).sum(1)


# ----- data --------------------------------------------------------------------------------------
@dataclass
class ManyBatch:
    """Batches of ``M`` models stacked: tokens/mask/padding ``[M, B, T]``, targets
    ``[M, B, T(, k)]``."""

    tokens: Tensor
    targets: Tensor
    mask: Tensor
    padding_mask: Tensor


def sample_many(task: Task, n: int, generators: Sequence[torch.Generator]) -> ManyBatch:
    """One batch per generator, equal to ``task.sample(n, generator)`` for each, stacked.

    The random draws are made generator by generator, exactly as :meth:`Task.sample` makes
    them; when the task does not override ``sample``, the (deterministic) labelling is done once
    for all models together.

    Example:
        >>> gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
        >>> sample_many(get_task("reverse"), 8, gens).tokens.shape  # doctest: +SKIP
        torch.Size([2, 8, 16])
    """
    M = len(generators)
    if type(task).sample is not Task.sample:
        batches = [task.sample(n, generator=g) for g in generators]
        return ManyBatch(*(torch.stack([getattr(b, f) for b in batches]) for f in _BATCH_FIELDS))
    token_rows, length_rows = [], []
    for g in generators:
        lengths = task.sample_lengths(n, g)  # the same draws, in the same order, as Task.sample
        token_rows.append(task.sample_tokens(n, lengths, g).long())
        length_rows.append(lengths)
    tokens = torch.cat(token_rows)  # (M * n, T)
    padding_mask = torch.arange(task.seq_len)[None, :] < torch.cat(length_rows)[:, None]
    if task.pad_token is not None:
        tokens = tokens.masked_fill(~padding_mask, task.pad_token)
    targets, mask = task.targets_for(tokens, padding_mask)

    def split(x: Tensor) -> Tensor:
        return x.view(M, n, *x.shape[1:])

    return ManyBatch(split(tokens), split(targets), split(mask), split(padding_mask))


_BATCH_FIELDS = ("tokens", "targets", "mask", "padding_mask")


# ----- the optimiser -----------------------------------------------------------------------------
@torch.no_grad()
def _clip_per_model(grad: Float[Tensor, "M P"], max_norm: float | None) -> Float[Tensor, " M"]:
    """Scale each row to norm <= max_norm as clip_grad_norm_ does; return the norms before."""
    norms = torch.linalg.vector_norm(grad, dim=1)  # (M,)
    if max_norm is not None:
        coef = (max_norm / (norms + _CLIP_EPS)).clamp(max=1.0)
        grad.mul_(coef[:, None])
    return norms


@torch.no_grad()
def _adamw_step(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
) -> None:
    """torch.optim.AdamW's (single-tensor, CPU default) update, over the whole buffer at once.

    AdamW is element-wise, so one update of the ``[M, P]`` buffer is ``M`` independent AdamW
    updates; the same ops in the same order as ``torch.optim.adam._single_tensor_adam``.
    """
    beta1, beta2 = betas
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1 ** float(step)
    bias_correction2 = 1 - beta2 ** float(step)
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(_ADAM_EPS)
    param.addcdiv_(exp_avg, denom, value=-step_size)


# ----- training ----------------------------------------------------------------------------------
def _check_configs(configs: Sequence[TrainConfig]) -> TrainConfig:
    reference = {k: v for k, v in configs[0].to_dict().items() if k not in _FREE_TRAIN_FIELDS}
    for i, config in enumerate(configs[1:], start=1):
        if not isinstance(config, TrainConfig):
            raise TypeError(f"configs[{i}] must be a TrainConfig, got {type(config).__name__}")
        other = config.to_dict()
        diff = sorted(k for k in reference if reference[k] != other[k])
        if diff:
            raise ValueError(
                f"configs[{i}] differs from configs[0] in {diff}; models trained together may "
                f"differ only in {list(_FREE_TRAIN_FIELDS)}"
            )
    return configs[0]


class _Group:
    """The mutable state of one :func:`train_many` call (rows = models still training)."""

    def __init__(self, models, task, configs, run_dirs, order):
        self.task = task
        self.config = configs[order[0]]
        self.index = list(order)  # row -> input index
        self.models = models
        self.configs = configs
        self.run_dirs = run_dirs
        self.stack = StackedModels.from_models([models[i] for i in order])
        self.exp_avg = torch.zeros_like(self.stack.flat)
        self.exp_avg_sq = torch.zeros_like(self.stack.flat)
        self.generators = [torch.Generator().manual_seed(configs[i].seed) for i in order]
        self.last_good = self.stack.flat.clone()
        self.loss_sum = torch.zeros(len(order), dtype=torch.float64)
        self.n_interval = 0
        self.rows: dict[int, list[dict[str, Any]]] = {i: [] for i in order}
        self.messages: dict[int, str] = {}

    def drop(self, keep: list[int]) -> None:
        """Keep only the given rows (models that diverged leave the group)."""
        index = torch.as_tensor(keep, dtype=torch.long)
        self.stack = self.stack.select(keep)
        self.exp_avg = self.exp_avg.index_select(0, index)
        self.exp_avg_sq = self.exp_avg_sq.index_select(0, index)
        self.last_good = self.last_good.index_select(0, index)
        self.loss_sum = self.loss_sum.index_select(0, index)
        self.generators = [self.generators[r] for r in keep]
        self.index = [self.index[r] for r in keep]

    def diverge(self, bad: list[int], step: int, losses: list[float]) -> None:
        """Restore the last good weights of diverged rows, save them as train() does."""
        for row in bad:
            i = self.index[row]
            model = self.models[i]
            self.stack.write_to(row, model, self.last_good)
            try:
                _diverged(
                    model,
                    self.task,
                    self.configs[i],
                    self.rows[i],
                    step,
                    losses[row],
                    self.run_dirs[i],
                )
            except TrainingDivergedError as error:
                self.messages[i] = str(error)
        self.drop([r for r in range(len(self.index)) if r not in bad])

    def log(self, step: int, lr: float, norms: list[float]) -> None:
        means = (self.loss_sum / self.n_interval).tolist()
        config = self.config
        do_eval = config.eval_every and (
            (step + 1) % config.eval_every == 0 or step + 1 == config.steps
        )
        for row, i in enumerate(self.index):
            entry = {"step": step + 1, "loss": means[row], "lr": lr, "grad_norm": norms[row]}
            if do_eval:
                self.stack.write_to(row, self.models[i])
                metrics = evaluate(self.models[i], self.task, n_eval=config.n_eval)
                entry.update(eval_loss=metrics["loss"], eval_accuracy=metrics["accuracy"])
            self.rows[i].append(entry)
        self.loss_sum.zero_()
        self.n_interval = 0
        self.last_good.copy_(self.stack.flat)

    def step(self, step: int) -> None:
        config, stack = self.config, self.stack
        lr = lr_at(step, config)
        batch = sample_many(self.task, config.batch_size, self.generators)
        logits = batched_logits(stack, batch.tokens, _padding(batch))
        losses = batched_loss(logits, batch.targets, batch.mask, stack.cfg.d_vocab_out)
        values = losses.tolist()
        bad = [row for row, v in enumerate(values) if not math.isfinite(v)]
        total = losses.sum() if not bad else torch.where(losses.isfinite(), losses, 0.0).sum()
        with warnings.catch_warnings():
            # The gradients are row slices of one buffer (strided by design).
            warnings.filterwarnings("ignore", message=".*gradient layout contract.*")
            total.backward()
        norms = _clip_per_model(stack.grad, config.grad_clip)
        _adamw_step(
            stack.flat,
            stack.grad,
            self.exp_avg,
            self.exp_avg_sq,
            step + 1,
            lr,
            config.betas,
            config.weight_decay,
        )
        stack.grad.zero_()
        self.loss_sum += torch.tensor(values, dtype=torch.float64)
        self.n_interval += 1
        if bad:
            # Like train(): the model stops at the step whose loss was not finite.
            self.diverge(bad, step, values)
            if not self.index:
                return
            norms = norms[[r for r in range(len(values)) if r not in bad]]
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            self.log(step, lr, norms.tolist())


def _padding(batch: ManyBatch) -> Tensor | None:
    # Fixed-length tasks have no padding; skipping the mask keeps the fast path.
    return None if bool(batch.padding_mask.all()) else batch.padding_mask


def train_many(
    models: Sequence[HookedMHATransformer],
    task: Task,
    configs: TrainConfig | Sequence[TrainConfig] | None = None,
    *,
    run_dirs: Sequence[str | os.PathLike[str] | None] | None = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> list[Run]:
    """Train several models together; each ends as if trained alone by :func:`train`.

    Args:
        models: Models that fit ``task`` and differ at most in ``n_heads`` and ``seed``
            (see :func:`check_batchable`). They are trained in place, like :func:`train` does.
        task: The task all models learn.
        configs: One :class:`TrainConfig` per model (they may differ only in ``seed``, the
            data-order seed), or one config for all (then all models see the same data).
        run_dirs: One run folder (or None) per model; each is written by
            :func:`~mhainterp.training.save_run` exactly as :func:`train` writes it.
        progress: Show a tqdm progress bar.
        on_step: Called after every step with the number of models that took it (for
            progress reporting from worker processes).

    Returns:
        One :class:`~mhainterp.training.Run` per model, in input order.

    Raises:
        BatchDivergedError: some models' loss became NaN/inf. The others finished (their
            results are in ``error.results``); each diverged model holds, and its run folder
            saves, its last good weights, with the message :func:`train` would have raised.

    Example:
        >>> task = get_task("count_previous")
        >>> models = [build_model(task, n_heads=h, seed=s) for h in (1, 4) for s in (0, 1)]
        >>> configs = [TrainConfig(steps=100, seed=m.cfg.seed) for m in models]
        >>> results = train_many(models, task, configs, progress=False)
        >>> len(results)
        4
    """
    models = list(models)
    if configs is None:
        configs = TrainConfig()
    configs = [configs] * len(models) if isinstance(configs, TrainConfig) else list(configs)
    run_dirs = [None] * len(models) if run_dirs is None else list(run_dirs)
    for name, values in (("configs", configs), ("run_dirs", run_dirs)):
        if len(values) != len(models):
            raise ValueError(f"{name} has {len(values)} entries for {len(models)} models")
    check_batchable(models)
    for model in models:
        _check_compatible(model, task)
    config = _check_configs(configs)
    # Rows sorted by head count, so each head count's attention core is one contiguous slice.
    order = sorted(range(len(models)), key=lambda i: models[i].cfg.n_heads)
    group = _Group(models, task, configs, run_dirs, order)
    heads = sorted({m.cfg.n_heads for m in models})
    bar = tqdm(
        range(config.steps),
        desc=f"train {task.name} {len(models)} models h={heads}",
        disable=not progress,
        leave=False,
    )
    for step in bar:
        group.step(step)
        if on_step is not None:
            on_step(len(group.index))
        if not group.index:
            break
    return _finish(group, models, task, configs, run_dirs)


def _finish(group: _Group, models, task, configs, run_dirs) -> list[Run]:
    results: list[Run | None] = [None] * len(models)
    for row, i in enumerate(group.index):
        model = models[i]
        group.stack.write_to(row, model)
        model.eval()
        metrics_df = pd.DataFrame(group.rows[i])
        eval_metrics = evaluate(model, task, n_eval=configs[i].n_eval)
        eval_metrics["final_train_loss"] = float(metrics_df["loss"].iloc[-1])
        eval_metrics["status"] = "finished"
        saved: Path | None = None
        if run_dirs[i] is not None:
            saved = save_run(run_dirs[i], model, task, configs[i], metrics_df, eval_metrics)
        results[i] = Run(saved, model, task, model.cfg, configs[i], metrics_df, eval_metrics)
    if group.messages:
        raise BatchDivergedError(results, group.messages)
    return results  # type: ignore[return-value]
