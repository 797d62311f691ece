"""How the ablation engine splits a pass into forwards: which configurations and which
sequences each forward runs, and which share work (:mod:`mhainterp.ablation.engine` runs them).

A pass of ``C`` configurations over ``n`` sequences becomes jobs ``(first layer,
configurations, s0, s1)``: configurations grouped by their first ablated layer (the copies
are identical below it), sequences in :func:`length_order` cut into chunks ``s0:s1``
(:func:`sequence_chunks`), and each chunk's configurations into forwards of at most the rows
that fit (:func:`even_share`). Everything here is read on the host (:data:`PLAN_DEVICE`), once
per pass, so the forwards never wait for a device to say how to proceed.

Shapes: C configurations, n sequences, L layers, h heads.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from mhainterp.ablation.replacement import FULL_FORWARD_ROWS, LINEAR_READOUT_ROWS
from mhainterp.fast import linear_readout
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import HookedModel
from mhainterp.scoring import rows_for_outputs
from mhainterp.tasks import Batch

PLAN_DEVICE = "cpu"  # the host plans the forwards: it reads its own memory without a wait
"""Where head masks are built and the forwards planned. On a device, reading a mask per
forward would wait for the device each time; built on the host, the masks are moved to the
model once per call."""

Job = tuple[int, list[int], int, int]
"""One forward: ``(first ablated layer, configurations, s0, s1)``, the sequences ``s0:s1`` of
:func:`length_order`."""

__all__ = [
    "PADDING_BAND",
    "PLAN_DEVICE",
    "Job",
    "even_share",
    "first_layers",
    "length_order",
    "plan_jobs",
    "sequence_chunks",
    "sequence_ends",
    "shared_above_last",
    "unpadded_chunks",
]


def length_order(batch: Batch) -> Int[Tensor, " n"]:
    """Sequences longest first (stable; the identity when no sequence ends in padding).

    Chunks of similar length waste few positions on padding once trimmed
    (:func:`~mhainterp.ablation.engine.rows_of`).
    """
    lengths = sequence_ends(batch)  # (n,) one past the last real token
    return torch.argsort(-lengths, stable=True)


def sequence_ends(batch: Batch) -> Int[Tensor, " n"]:
    """Per sequence, one past its last real token (0 for padding only)."""
    T = batch.padding_mask.shape[1]
    positions = torch.arange(1, T + 1, device=batch.padding_mask.device)
    return (batch.padding_mask * positions).amax(1)


def shared_above_last(
    model: HookedModel,
    jobs: list[Job],
    planned: Tensor,
    keep_all: bool = False,
) -> dict[int, bytes]:
    """The configurations whose forward stops at the last layer's ``hook_z`` and goes on
    from there (:func:`~mhainterp.ablation.engine._finish_copies`): configuration -> its heads
    above the last layer.

    Configurations that ablate the same heads above the last layer (a pair of a layer-0 head
    with each layer-1 head; a pruning step's layer-1 candidates) have the same last layer's
    input and ``hook_z``: it is computed once for all of them, and each runs its own last
    layer only. Taken where that changes no value, bit for bit: on our own model, for a
    configuration that some other one shares with and that runs alone in its forwards (as
    every configuration does at the default rows when the batch fills them), so that each
    operation meets the same values in the same shapes as in its whole forward. ``keep_all``:
    also the configurations no other one shares with here (a later pass may: a cache keeps
    their states).

    Example:
        >>> from mhainterp.tasks import get_task
        >>> from mhainterp.training import build_model
        >>> from mhainterp.ablation.engine import head_masks
        >>> model = build_model(get_task("previous_token"), n_heads=2, n_layers=2, seed=0)
        >>> planned = head_masks(model, [[(0, 0), (1, 0)], [(0, 0), (1, 1)], [(0, 1), (1, 0)]])
        >>> jobs = [(0, [0], 0, 8), (0, [1], 0, 8), (0, [2], 0, 8)]
        >>> sorted(shared_above_last(model, jobs, planned))
        [0, 1]
    """
    last = model.cfg.n_layers - 1
    if not isinstance(model, HookedMHATransformer) or last < 1:
        return {}
    alone = [m[0] for first, m, _, _ in jobs if len(m) == 1 and first < last]
    above = {c: planned[c, :last].numpy().tobytes() for c in alone}
    counts = collections.Counter(above.values())
    return {c: key for c, key in above.items() if keep_all or counts[key] > 1}


def unpadded_chunks(
    model: HookedModel, cuts: dict[tuple[int, int], int], real_in_order: list[int]
) -> dict[tuple[int, int], bool]:
    """Per sequence chunk ``s0:s1`` (cut at ``cuts[(s0, s1)]``), whether it has no padding:
    every sequence's count of real tokens (``real_in_order``, in :func:`length_order`) equals
    the cut.

    Such a chunk's copies run without a padding mask on our own model, where that gives the
    same values bit for bit (no key is masked, no query sees padding only) and saves masking
    every attention score and clearing NaNs from every pattern: a fifth of an ablated forward
    of 2 x 16 heads. A bridged model keeps its mask (its attention may take another path).

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> model = handbuilt_model(["previous", "uniform", "previous"])
        >>> unpadded_chunks(model, {(0, 2): 4, (2, 3): 3}, [4, 4, 2])
        {(0, 2): True, (2, 3): False}
    """
    ours = isinstance(model, HookedMHATransformer)
    return {(s0, s1): ours and min(real_in_order[s0:s1]) == cut for (s0, s1), cut in cuts.items()}


def first_layers(masks: Bool[Tensor, "C L h"]) -> list[int]:
    """Each configuration's first ablated layer (the last layer for the clean model)."""
    L = masks.shape[1]
    any_layer = masks.any(-1)  # (C, L)
    first = torch.where(any_layer.any(-1), any_layer.int().argmax(-1), L - 1)
    return first.tolist()


def plan_jobs(
    model: HookedModel, batch: Batch, first_of: list[int], max_rows: int | None
) -> list[Job]:
    """The forwards of :func:`~mhainterp.ablation.engine.run_masks`: ``(first layer,
    configurations, s0, s1)`` each.

    Configurations are grouped by their first ablated layer (a cheap group is never dragged
    into a costly one) and split into forwards of at most ``max_rows`` rows; ``s0:s1`` is a
    range of :func:`length_order` (:func:`sequence_chunks`). Sequence chunks are outermost,
    so one clean forward gives the prefixes of every group of a chunk
    (:func:`~mhainterp.ablation.engine._clean_prefixes`).
    """
    # one read of the lengths, longest first as length_order (stable)
    ends = sorted(sequence_ends(batch).to(PLAN_DEVICE).tolist(), reverse=True)
    n, T = len(ends), batch.tokens.shape[1]
    # Banded chunks on a pretrained model only: its forward is arithmetic, paid per padded
    # position too; ours is overhead at these sizes, and its shared last-layer states need a
    # configuration alone in its forward (shared_above_last), as whole chunks give.
    banded = ends[0] != ends[-1] and not isinstance(model, HookedMHATransformer)
    jobs = []
    for first in sorted(set(first_of), reverse=True):

        def rows_at(cut: int, first: int = first) -> int:  # rows per forward at a chunk's cut
            if max_rows is not None:
                return max_rows
            fast = linear_readout.applies(model, first)
            rows = LINEAR_READOUT_ROWS if fast else FULL_FORWARD_ROWS
            return min(rows, rows_for_outputs(model.cfg.d_vocab_out, (banded and cut) or T))

        members = [c for c, f in enumerate(first_of) if f == first]
        for s0, s1 in sequence_chunks(ends, rows_at, PADDING_BAND if banded else 0.0):
            rows = rows_at(ends[s0])
            seqs = s1 - s0 if banded else min(n, rows)  # a band's short chunks: more copies
            copies_per = even_share(len(members), max(1, rows // seqs))
            chunks = range(0, len(members), copies_per)
            jobs += [(first, members[i : i + copies_per], s0, s1) for i in chunks]
    return sorted(jobs, key=lambda job: (job[2], job[3]))  # stable: deepest first kept


PADDING_BAND = 0.85
"""On a pretrained model, a chunk of padded sequences (longest first) takes the next sequence
only while it is at least this share of the chunk's longest: the chunk is cut after its
longest, so every position beyond a shorter sequence's end is padding computed for nothing.
On SmolLM2's 64 sentences (8 to 33 tokens, 1,133 real) the chunks of 26 that the memory cap
alone gave computed 1,458 positions; bands of 0.85 compute 1,216 in 8 chunks, each with the
memory cap of its own length, so the short ones hold more copies (a pass of 24 single heads:
42 s against 60 s; 0.75 gave 43-46 s and 0.9 42-47 s). The whole SmolLM2 verdict gains less,
28 min 7 s against 31 min 38 s: most of its passes have 1-5 configurations per first layer, too
few to fill a short chunk, and each extra forward reads every weight it runs through."""


def sequence_chunks(
    ends: list[int], rows_at: Callable[[int], int], band: float
) -> list[tuple[int, int]]:
    """Consecutive ranges ``s0:s1`` of the sequences, ``ends`` their lengths longest first:
    each holds at most ``rows_at(cut)`` sequences (``cut``: its first one's length, where the
    chunk is cut) and only those at least ``band`` x ``cut`` long (0: chunks of ``rows_at``
    sequences, whatever their lengths).

    Example:
        >>> sequence_chunks([16] * 5, lambda cut: 2, 0.85)
        [(0, 2), (2, 4), (4, 5)]
        >>> sequence_chunks([33, 30, 24, 21, 9, 8], lambda cut: 512, 0.85)
        [(0, 2), (2, 4), (4, 6)]
        >>> sequence_chunks([33, 30, 24, 21, 9, 8], lambda cut: 512, 0.0)
        [(0, 6)]
    """
    chunks, s0, n = [], 0, len(ends)
    while s0 < n:
        cut = ends[s0]
        cap = max(1, rows_at(cut))
        s1 = s0 + 1
        while s1 < n and s1 - s0 < cap and ends[s1] >= band * cut:
            s1 += 1
        chunks.append((s0, s1))
        s0 = s1
    return chunks


def even_share(n: int, cap: int) -> int:
    """The size of the fewest chunks of at most ``cap`` that hold ``n`` items, made as even as
    possible: 18 copies at 16 per forward run as 9 + 9, not 16 + 2. A chunk of 16 copies of
    1,024 sequences has outputs too large for the cache, and costs 2-3x more per element than
    one of 8 (log-softmax: 3 vs 1.1 ns per logit), so even chunks are faster (division: 4%).

    Example:
        >>> even_share(18, 16), even_share(9, 16), even_share(33, 16), even_share(0, 16)
        (9, 9, 11, 16)
    """
    if n <= 0:
        return cap
    chunks = -(-n // cap)
    return -(-n // chunks)
