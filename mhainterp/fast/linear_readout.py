"""Derived fast path: score many ablated copies when the readout after ``hook_z`` is linear.

When everything after layer ``l``'s ``hook_z`` is linear (the last layer of an attention-only
model without LayerNorm, and no hooks on the way out), a copy whose heads' z are replaced has
logits

    clean_logits + sum over replaced heads h of (values_h - z_h) @ W_O[h] @ W_U

so no per-copy residual stream is built and all single-head ablations cost about one forward.
The clean logits and each head's change form one class-major table (:class:`ReadoutBasis`,
built once per sequence chunk); the copies' logits are views of class-major memory, which
:func:`mhainterp.scoring.position_scores` scores with its class-major branch.
It is a fenced copy of :meth:`HookedMHATransformer.logits_from_z` for that case, tested equal to
it (``tests/test_ablation.py``), and it uses only public model methods. A change to the model's
forward after ``hook_z`` must be followed here (``model.py`` names this module).

**CPU only.** On a device where reading a value waits (a GPU), :func:`applies` is False and
the engine runs full forwards, so that the tie guard's read is no host sync per chunk.

**Tie guard.** Where a scored position's best two logits are within a relative 1e-4 (hand-built
models have exact ties), float rounding of the sum could pick another argmax than the model's own
forward; those (copy, sequence) pairs are re-scored with the full forward.

Shapes: c copies, s sequences, T positions, h heads, V output logits (``n_targets * d_vocab_out``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mhainterp.runtime import reads_without_wait

if TYPE_CHECKING:  # annotations only
    from mhainterp.model import HookedMHATransformer
    from mhainterp.protocol import HookedModel

__all__ = ["TIE_TOLERANCE", "ReadoutBasis", "applies", "copy_logits", "readout_basis"]

TIE_TOLERANCE = 1e-4
"""Relative top-2 logit margin below which a copy is re-scored with the full forward."""


def applies(model: HookedModel, layer: int) -> bool:
    """Whether the readout after layer ``layer``'s ``hook_z`` is linear and unhooked, on a
    device whose values the host reads without waiting.

    On a GPU the tie guard's read (one per chunk) would be a host sync per forward, and the
    full forward it saves is cheap there: so the fast path is a CPU path, and an ablation job
    makes the same few syncs whatever the number of head sets (``tests/test_strict_device.py``).
    """
    cfg = model.cfg
    if not reads_without_wait(next(model.parameters()).device):
        return False
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


@dataclass
class ReadoutBasis:
    """What every copy of one chunk shares: the clean logits and each head's change, in one
    **class-major** table (the output logits' axis first, ``V = n_targets * d_vocab_out``), so
    that a chunk of copies is one product ``[1, mask] @ table`` (no clean row broadcast first).

    Row ``1 + h`` of ``table`` is what replacing head ``h``'s z by its replacement value adds to
    the logits, ``(values_h - z_h) @ W_O[h] @ W_U``. These rows are the costly part of a chunk
    (an ``(h, V, s, T)`` block), so :func:`~mhainterp.ablation.engine.run_masks` builds the
    table once per sequence chunk and replacement, and every chunk of copies over those
    sequences reuses it.

    Class-major because every reduction over the classes (the tie guard here, the scoring's
    log-softmax and argmax) is then an elementwise pass over contiguous rows rather than a
    reduction over 10-20 adjacent numbers: 2.5x faster on ``(16, 1024, 16)`` copies of 16
    classes.
    """

    table: Float[Tensor, "1+h V s T"]  # row 0 the clean logits, row 1 + h head h's change
    clean: Float[Tensor, "s T *out"]  # the clean logits in the model's shape (s, T, [k,] V)

    @property
    def shape(self) -> tuple[int, ...]:
        """The model's logits shape of one copy."""
        return tuple(self.clean.shape)

    @property
    def has_heads(self) -> bool:
        """Whether the heads' rows were computed (not for a chunk of clean copies only)."""
        return len(self.table) > 1


@torch.no_grad()  # scores only; an out= product cannot record a graph
def readout_basis(
    model: HookedMHATransformer,
    layer: int,
    resid_pre: Float[Tensor, "s T d_model"],
    z: Float[Tensor, "s T h d_head"],
    values: Tensor | None,
    clean: Tensor | None = None,
) -> ReadoutBasis:
    """The :class:`ReadoutBasis` of a chunk (``values``: replacement z, broadcastable to
    ``z``, or None for a basis of the clean row alone, when every copy is clean; ``z``: the
    clean ``hook_z``, contiguous; ``clean``: the chunk's clean logits in the model's shape,
    when the caller has them from another method's basis)."""
    block = model.blocks[layer]
    attn = block.attn
    if clean is None:
        clean = model.logits_from_resid(block.after_attention(resid_pre, attn.output_from_z(z)))
    s, T = clean.shape[:2]
    clean_major = clean.reshape(s, T, -1).permute(2, 0, 1)  # (V, s, T)
    if values is None:  # the heads' rows cost an (h, V, s, T) product: skipped
        return ReadoutBasis(clean_major[None].contiguous(), clean)
    readout = attn.W_O @ model.W_U  # (h, d_head, V)
    h, d_head, V = readout.shape
    table = clean_major.new_empty(1 + h, V, s, T)
    table[0] = clean_major
    # Each head's change, einsum("sthd,hdv->hvst", values - z, readout), written in place:
    # the same batched product einsum runs (tested equal), without a copy into the table.
    diff = (values - z).permute(2, 3, 0, 1).reshape(h, d_head, s * T)  # (h, d_head, s*T)
    torch.bmm(readout.transpose(1, 2), diff, out=table[1:].view(h, V, s * T))
    return ReadoutBasis(table, clean)


def copy_logits(
    model: HookedMHATransformer,
    layer: int,
    resid_pre: Float[Tensor, "s T d_model"],
    z: Float[Tensor, "s T h d_head"],
    values: Tensor,
    copy_masks: Bool[Tensor, "c h"],
    part: Any,
    basis: ReadoutBasis | None = None,
) -> Float[Tensor, "c s T *out"]:
    """Logits of every copy (copy ``i`` replaces the heads in ``copy_masks[i]`` by ``values``),
    in the model's shape ``(c, s, T, [k,] V)`` as a view of class-major memory.

    Args:
        model: The model (``applies(model, layer)`` must hold).
        layer: The last layer.
        resid_pre: Its clean ``hook_resid_pre``.
        z: Its clean ``hook_z`` (contiguous).
        values: Replacement z, broadcastable to ``z``.
        copy_masks: Which heads each copy replaces.
        part: The batch (its ``scored`` triples decide where ties matter).
        basis: :func:`readout_basis` of these arguments, when the caller keeps it for several
            chunks of copies (built here otherwise).
    """
    if basis is None:
        basis = readout_basis(model, layer, resid_pre, z, values)
    table = basis.table
    weights = torch.cat(
        [table.new_ones(len(copy_masks), 1), copy_masks.to(table.dtype)], 1
    )  # (c, 1 + h): the clean row once, each replaced head's change once
    if not basis.has_heads:  # a basis of the clean row alone serves clean copies alone
        # a caller's slip, checked where reading the masks makes no device wait
        if reads_without_wait(copy_masks.device) and bool(copy_masks.any()):
            raise RuntimeError("copy_masks replace heads, but the basis has the clean row only")
        weights = weights[:, :1]
    logits = weights @ table.reshape(len(table), -1)  # one product over the (V, s, T) entries
    s, T, *out = basis.shape
    logits = logits.reshape(len(copy_masks), *out[:-1], out[-1], s, T)  # (c, [k,] V, s, T)
    order = (0, logits.ndim - 2, logits.ndim - 1, *range(1, logits.ndim - 2))
    logits = logits.permute(order)  # the model's shape (c, s, T, [k,] V), class-major memory
    # (m, 2): (copy, sequence) pairs with a near tie; reading them is this chunk's one sync
    pairs = _near_ties(logits, part).nonzero()
    if len(pairs):
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
    # max(|high|, |low|) is max(high, -low), as low <= high: one op fewer on every chunk
    tolerance = TIE_TOLERANCE * (1.0 + torch.maximum(high, low.neg()))
    near = grouped >= (high - tolerance)[..., None]  # the max counts itself
    # Count in the narrowest integer that cannot overflow: a uint8 sum is 2x an int64 one
    # (summed from the booleans as they are: no uint8 copy first).
    count = torch.uint8 if near.shape[-1] < 256 else torch.int32
    contenders = near.sum(-1, dtype=count)
    return ((contenders >= 2) & scored).any(dim=(2, 3))
