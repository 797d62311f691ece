"""Derived fast path: score many ablated copies when the readout after ``hook_z`` is linear.

When everything after layer ``l``'s ``hook_z`` is linear (the last layer of an attention-only
model without LayerNorm, and no hooks on the way out), a copy whose heads' z are replaced has
logits

    clean_logits + sum over replaced heads h of (values_h - z_h) @ W_O[h] @ W_U

so no per-copy residual stream is built and all single-head ablations cost about one forward.
It is a fenced copy of :meth:`HookedMHATransformer.logits_from_z` for that case, tested equal to
it (``tests/test_ablation.py``), and it uses only public model methods. A change to the model's
forward after ``hook_z`` must be followed here (``model.py`` names this module).

**Tie guard.** Where a scored position's best two logits are within a relative 1e-4 (hand-built
models have exact ties), float rounding of the sum could pick another argmax than the model's own
forward; those (copy, sequence) pairs are re-scored with the full forward.

Shapes: c copies, s sequences, T positions, h heads, V output logits (``n_targets * d_vocab_out``).
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = ["TIE_TOLERANCE", "applies", "copy_logits"]

TIE_TOLERANCE = 1e-4
"""Relative top-2 logit margin below which a copy is re-scored with the full forward."""


def applies(model: Any, layer: int) -> bool:
    """Whether the readout after layer ``layer``'s ``hook_z`` is linear and unhooked."""
    cfg = model.cfg
    if layer != cfg.n_layers - 1 or not cfg.attn_only or cfg.normalization_type is not None:
        return False
    if getattr(cfg, "use_attn_result", False):
        return False
    after_z = [
        name
        for name in model.hook_dict
        if (
            name.startswith(f"blocks.{layer}.")
            and name.endswith(("hook_result", "hook_attn_out", "hook_resid_post"))
        )
        or name.startswith(("ln_final.", "unembed.", "hook_unembed"))
    ]
    return not any(model.hook_dict[name].fwd_hooks for name in after_z)


def copy_logits(
    model: Any,
    layer: int,
    resid_pre: Float[Tensor, "s T d_model"],
    z: Float[Tensor, "s T h d_head"],
    values: Tensor,
    copy_masks: Bool[Tensor, "c h"],
    part: Any,
) -> Float[Tensor, "c s T *out"]:
    """Logits of every copy (copy ``i`` replaces the heads in ``copy_masks[i]`` by ``values``).

    Args:
        model: The model (``applies(model, layer)`` must hold).
        layer: The last layer.
        resid_pre: Its clean ``hook_resid_pre``.
        z: Its clean ``hook_z`` (contiguous).
        values: Replacement z, broadcastable to ``z``.
        copy_masks: Which heads each copy replaces.
        part: The batch (its ``scored`` triples decide where ties matter).
    """
    block = model.blocks[layer]
    attn = block.attn
    clean = model.logits_from_resid(block.after_attention(resid_pre, attn.output_from_z(z)))
    readout = attn.W_O @ model.W_U  # (h, d_head, V)
    change = torch.einsum("sthd,hdv->hstv", values - z, readout)  # (h, s, T, V)
    weights = copy_masks.to(change.dtype)  # (c, h)
    # clean + weights @ change as one addmm over the flattened (s, T, V) entries
    logits = torch.addmm(clean.reshape(1, -1), weights, change.reshape(len(change), -1))
    logits = logits.reshape(len(copy_masks), *clean.shape)  # the model's shape: (c, s, T, [k,] V)
    unsure = _near_ties(logits, part)  # (c, s)
    if bool(unsure.any()):
        pairs = unsure.nonzero()  # (m, 2): (copy, sequence)
        copy_z = torch.where(
            copy_masks[pairs[:, 0]][:, None, :, None],  # (m, 1, h, 1)
            values.expand_as(z)[pairs[:, 1]],
            z[pairs[:, 1]],
        )  # (m, T, h, d_head)
        exact = model.logits_from_z(
            layer, resid_pre[pairs[:, 1]], copy_z, part.padding_mask[pairs[:, 1]]
        )
        logits[pairs[:, 0], pairs[:, 1]] = exact
    return logits


def _near_ties(logits: Float[Tensor, "c s T *out"], part: Any) -> Bool[Tensor, "c s"]:
    """Copies x sequences with a scored position whose best two logits are nearly equal."""
    c, s, T = logits.shape[:3]
    scored = part.scored  # (s, T, k)
    k = scored.shape[-1]
    grouped = logits.reshape(c, s, T, k, -1)
    # amax and amin apart are faster than aminmax or topk(2) on CPU
    high, low = grouped.amax(-1), grouped.amin(-1)  # (c, s, T, k)
    tolerance = TIE_TOLERANCE * (1.0 + torch.maximum(high.abs(), low.abs()))
    near = grouped >= (high - tolerance)[..., None]  # the max counts itself
    # Count in the narrowest integer that cannot overflow: a uint8 sum is 2x an int64 one.
    count = torch.uint8 if near.shape[-1] < 256 else torch.int32
    contenders = near.to(count).sum(-1, dtype=count)
    return ((contenders >= 2) & scored).any(dim=(2, 3))
