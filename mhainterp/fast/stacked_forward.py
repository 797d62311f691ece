"""The batched forward pass of :func:`mhainterp.fast.stacked.train_many`: the logits and loss
of every model of a :class:`~mhainterp.fast.stacked_params.StackedModels` on its own batch, one
``bmm`` per weight for all models (a fenced copy of :meth:`HookedMHATransformer.logits`).

It runs on the device of the stack's buffer. Every op is deterministic there: on CUDA the rows of
layer 0's (token, position) table are gathered with ``F.embedding`` (its backward sums the
gradients of repeated rows in a fixed order; ``index_select``'s accumulates them with atomics).

Shapes: M models, B batch, T positions, d d_model, h heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.fast.stacked_buffers import Attention, GatherRows, Linear, Workspace
from mhainterp.fast.stacked_params import StackedModels
from mhainterp.model.loss import IGNORE_INDEX
from mhainterp.tasks.batch import scored_positions

__all__ = ["batched_logits", "batched_loss"]


# ----- the batched forward pass ------------------------------------------------------------------
def _linear(
    x: Float[Tensor, "M N i"],
    weight: Tensor,
    bias: Tensor,
    residual: Float[Tensor, "M N o"] | None = None,
    work: Workspace | None = None,
    name: str = "",
) -> Float[Tensor, "M N o"]:
    """Per-model ``x @ weight.T + bias`` (weight ``[M, o, i]`` in nn.Linear layout), added to
    ``residual`` if given; into ``work``'s buffers when given (:class:`Linear`)."""
    if work is not None:
        return Linear.apply(x, weight, bias[:, None, :], residual, work, name)
    out = torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))
    return out if residual is None else residual + out


def _layer_norm(x: Float[Tensor, "M N d"], weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=eps) * weight[:, None, :] + bias[:, None, :]


def _attend(
    q: Float[Tensor, "n T d_head"],
    k: Float[Tensor, "n T d_head"],
    v: Float[Tensor, "n T d_head"],
    causal_bias: Float[Tensor, "T T"] | None,
) -> Float[Tensor, "n T d_head"]:
    """Attention of ``n`` (sequence, head) pairs without padding (``causal_bias``: the additive
    ``-inf`` mask of a causal model, :func:`_causal_bias`; None: bidirectional).

    The fastest formulation measured on a CPU for these tiny heads (T = 16, d_head = 8..64):
    the scale is the ``alpha`` of a ``baddbmm`` whose input is the additive ``-inf`` causal
    bias. Slower alternatives measured: ``scaled_dot_product_attention`` (about 1.2x the
    time), ``torch.compile`` (no gain), a hand-written backward that avoids autograd's final
    stack of the Q/K/V gradients (within the noise, about 5% at h = 8).
    """
    n, T, d_head = q.shape
    scale = 1.0 / math.sqrt(d_head)
    if causal_bias is not None:
        scores = torch.baddbmm(causal_bias.expand(n, T, T), q, k.transpose(1, 2), alpha=scale)
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
    if n_heads == 1:  # views with a row stride of 3d: their backward stacks the gradients
        # straight into qkv's layout (one pass, not a stack then a permuting copy; the same
        # values, measured up to 1.15x at h = 1 and 27 models)
        return qkv.view(-1, T, 3, d_head).unbind(2)
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
    future: Bool[Tensor, "T T"] | None,
    key_mask: Bool[Tensor, "m B T"],
) -> Float[Tensor, "m N d"]:
    """Attention with a padding mask: the model's own math (``masked_fill``, softmax, and
    ``nan_to_num`` for a query that sees only padding); ``future``: a causal model's blocked
    keys (:func:`_future_mask`), None for a bidirectional one."""
    m, N, three_d = qkv.shape
    d = three_d // 3
    d_head = d // n_heads
    # (m * B, T, 3, h, d_head) -> three (m * B, h, T, d_head) strided views; no copies
    q, k, v = (x.transpose(1, 2) for x in qkv.view(-1, T, 3, n_heads, d_head).unbind(2))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d_head)  # (m * B, h, T_q, T_k)
    blocked = ~key_mask.reshape(-1, 1, 1, T)
    if future is not None:
        blocked = blocked | future
    pattern = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
    z = torch.nan_to_num(pattern, nan=0.0) @ v  # a query that sees only padding: 0
    return z.transpose(1, 2).reshape(m, N, d)  # merge heads: (m, B * T, d)


def _gather_rows(table: Float[Tensor, "R c"], rows: Int[Tensor, " N"]) -> Float[Tensor, "N c"]:
    """``table[rows]``, with a backward that is deterministic on every device.

    On the CPU ``index_select`` (measured faster there; its backward runs in order). A
    backward that sums each table row's gradients by ``segment_reduce`` over a stable sort of
    ``rows`` (the same bits) measured 0.7-0.9x the speed of ``index_add`` at one thread. Elsewhere
    ``F.embedding``, the same gather, whose CUDA backward reduces repeated rows in a fixed
    order: ``index_select``'s backward accumulates them with atomics, so two runs of the same
    seeds could differ in the last bits (torch's ``use_deterministic_algorithms`` notes).

    Example:
        >>> _gather_rows(torch.arange(6.0).view(3, 2), torch.tensor([2, 0, 2])).tolist()
        [[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]]
    """
    if table.device.type == "cuda":
        return F.embedding(rows, table)
    return table.index_select(0, rows)


def _gather(
    table: Float[Tensor, "R c"], rows: Int[Tensor, " N"], work: Workspace | None, name: str
) -> Float[Tensor, "N c"]:
    """:func:`_gather_rows`, into ``work``'s buffer ``name`` when given (CPU only)."""
    if work is None:
        return _gather_rows(table, rows)
    return GatherRows.apply(table, rows, work, name)


def _future_mask(T: int, device: torch.device) -> Bool[Tensor, "T T"]:
    return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)


def _causal_bias(T: int, dtype: torch.dtype, device: torch.device) -> Float[Tensor, "T T"]:
    """The additive causal mask: 0 on and below the diagonal, ``-inf`` above."""
    bias = torch.zeros(T, T, dtype=dtype, device=device)
    return bias.masked_fill(_future_mask(T, device), float("-inf"))


def _table_offsets(M: int, V: int, T: int, device: torch.device) -> Int[Tensor, "M 1 T"]:
    """``position + m * V * T``: with ``token * T`` added, the row of each (model, token,
    position) in the stacked ``[M * V * T]`` table of layer 0."""
    positions = torch.arange(T, device=device)
    return positions + torch.arange(M, device=device)[:, None, None] * (V * T)


def _attention(
    qkv: Float[Tensor, "M N 3d"],
    groups: list[tuple[int, int, int]],
    T: int,
    causal_bias: Float[Tensor, "T T"] | None,
    future: Bool[Tensor, "T T"] | None,
    padding_mask: Bool[Tensor, "M B T"] | None,
) -> Float[Tensor, "M N d"]:
    """One layer's attention of every head-count group (rows ``a:b`` of ``groups``, ``h``
    heads): :func:`_attend` on each, or :func:`_padded_attention` with a padding mask."""
    sizes = [b - a for a, b, _ in groups]
    # split (not slicing): the backward is one cat, not a zero-filled copy per group;
    # one head count: no split (its backward would be a cat of one tensor, a copy)
    qkv_parts = qkv.split(sizes) if len(groups) > 1 else (qkv,)
    if padding_mask is None:
        parts = [
            _merge_heads(_attend(*_split_heads(part, T, h), causal_bias), b - a, h)
            for part, (a, b, h) in zip(qkv_parts, groups, strict=True)
        ]
    else:
        pads = padding_mask.split(sizes) if len(groups) > 1 else (padding_mask,)
        parts = [
            _padded_attention(part, T, h, future, pad)
            for part, pad, (_, _, h) in zip(qkv_parts, pads, groups, strict=True)
        ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)  # (M, B * T, d)


def batched_logits(
    stack: StackedModels,
    tokens: Int[Tensor, "M B T"],
    padding_mask: Bool[Tensor, "M B T"] | None = None,
    use_table: bool | None = None,
    work: Workspace | None = None,
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
        work: Buffers kept from call to call for layer 0's gathers and attention core
            (:mod:`~mhainterp.fast.stacked_buffers`: the same values, without the fresh
            tensors a CPU pays for); the next call with it overwrites this one's activations.
            None: plain tensors.

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
    # Constants of the shape (the same every step): made once per stack (stack.constant).
    device = tokens.device
    if table_first_layer:
        # Row of each position in its model's (token, position) table: V * T rows per model.
        offsets = stack.constant(("table_offsets", T), lambda: _table_offsets(M, V, T, device))
        flat_rows = (tokens * T + offsets).reshape(-1)  # (M * B * T,)
        table = (s["embed"][:, :, None, :] + s["pos_embed"][:, None, :T, :]).reshape(M, -1, d)
        resid = _gather(table.reshape(M * V * T, d), flat_rows, work, "resid").view(M, B * T, d)
    else:
        offsets = torch.arange(M, device=tokens.device)[:, None, None] * V
        resid = F.embedding(tokens + offsets, s["embed"].reshape(M * V, d))  # (M, B, T, d)
        resid = (resid + s["pos_embed"][:, None, :T]).reshape(M, B * T, d)
    groups = stack.head_groups()
    causal_bias = future = None
    if cfg.causal and padding_mask is None:
        dtype = stack.flat.dtype
        causal_bias = stack.constant(("causal_bias", T), lambda: _causal_bias(T, dtype, device))
    elif cfg.causal:
        future = stack.constant(("future", T), lambda: _future_mask(T, device))
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        first = layer == 0 and table_first_layer
        x = table if first else resid
        if cfg.normalization_type == "LN":
            x = _layer_norm(x, s[p + "ln1.w"], s[p + "ln1.b"], cfg.eps)
        qkv = _linear(x, s[p + "W_qkv"], s[p + "b_qkv"])  # (M, V * T or B * T, 3d)
        if first:
            qkv = _gather(qkv.reshape(M * V * T, 3 * d), flat_rows, work, "qkv").view(M, B * T, -1)
        if first and work is not None and padding_mask is None:  # the core in work's buffers
            z = Attention.apply(qkv, groups, T, causal_bias, work)  # (M, B * T, d)
        else:
            z = _attention(qkv, groups, T, causal_bias, future, padding_mask)
        resid = _linear(z, s[p + "W_O"], s[p + "b_O"], resid, work, p + "W_O")
        if not cfg.attn_only:
            x = resid
            if cfg.normalization_type == "LN":
                x = _layer_norm(x, s[p + "ln2.w"], s[p + "ln2.b"], cfg.eps)
            act = F.relu if cfg.act_fn == "relu" else F.gelu
            hidden = act(_linear(x, s[p + "W_in"], s[p + "b_in"]))
            resid = resid + _linear(hidden, s[p + "W_out"], s[p + "b_out"])
    if cfg.normalization_type == "LN":
        resid = _layer_norm(resid, s["ln_final.w"], s["ln_final.b"], cfg.eps)
    return _linear(resid, s["W_U"], s["b_U"], None, work, "W_U").view(M, B, T, -1)


def batched_loss(
    logits: Float[Tensor, "M B T n_out"],
    targets: Int[Tensor, "M B T *k"],
    mask: Bool[Tensor, "M B T"],
    d_vocab_out: int,
    *,
    labelled: bool = False,
    n_scored: Int[Tensor, " M"] | None = None,
) -> Float[Tensor, " M"]:
    """Each model's mean cross-entropy over its scored (position, target) pairs, as
    :meth:`HookedMHATransformer.loss` computes it.

    ``labelled=True`` says that ``targets`` already hold ``IGNORE_INDEX`` wherever ``mask`` is
    False (as :func:`~mhainterp.fast.stacked.sample_many` labels them): the scored pairs are
    then the targets that are not ``IGNORE_INDEX``, and ``cross_entropy``'s own
    ``ignore_index`` gives their 0 (the same values; four ops fewer a step, and two in the
    backward). ``n_scored``: each model's count of scored pairs when the caller knows it
    (every position scored: ``B * T * k``), two ops fewer again."""
    M, B, T = mask.shape
    if labelled:
        flat = targets.reshape(-1)  # (M * B * T * k,)
        losses = F.cross_entropy(
            logits.reshape(-1, d_vocab_out), flat, ignore_index=IGNORE_INDEX, reduction="none"
        )
        if n_scored is None:
            n_scored = (flat != IGNORE_INDEX).view(M, -1).sum(1)
        return losses.view(M, -1).sum(1) / n_scored
    targets = targets.reshape(M * B, T, -1)  # (M * B, T, k)
    scored = scored_positions(targets, mask.reshape(M * B, T)).reshape(-1)  # (M * B * T * k,)
    losses = F.cross_entropy(
        logits.reshape(-1, d_vocab_out), targets.clamp(min=0).reshape(-1), reduction="none"
    )
    losses = torch.where(scored, losses, 0.0).view(M, -1)
    return losses.sum(1) / scored.view(M, -1).sum(1)


# ----- data --------------------------------------------------------------------------------------
