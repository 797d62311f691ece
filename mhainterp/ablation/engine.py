"""The ablation engine: any list of head sets, one batched pass, per-position outputs.

Every ablation in the toolkit replaces the chosen heads' slice of ``blocks.{l}.attn.hook_z``
(``[batch, pos, head, d_head]``, the heads' outputs *before* ``W_O``), so exactly those heads
change and every other head, the biases and the residual stream are left alone. The methods
are a registry (:data:`~mhainterp.ablation.replacement.METHODS`, one registered
:class:`~mhainterp.ablation.replacement.Replacement` each); the three built-ins:

``"zero"``
    The head's z is set to 0: the head writes nothing into the residual stream.
``"mean"``
    The head's z is set to its mean over a *reference* batch, **per position** and counting only
    real (non-padding) tokens. Per position because the heads see learned position embeddings,
    so a head's typical output at t=0 differs from its output at t=10. A position that no
    reference sequence reaches gets the head's mean over all real positions. This keeps the
    head's average contribution and removes only what depends on the particular input.
``"resample"``
    The head's z is taken from *another* sequence of the reference batch (resample ablation,
    Chan et al. 2022): row ``i`` gets the z of reference row ``sigma(i mod m)``, where ``sigma``
    is a random single-cycle permutation drawn once from ``generator`` (seed 0 when None). A
    single cycle has no fixed points, so when the reference *is* the evaluated batch (the
    default), no sequence gets its own output back. Where the donor is padding and the receiver
    is not, the per-position mean is used.

**One pass for many configurations.** :func:`evaluate_head_sets` repeats the batch once per
head set along the batch axis, and a hook on each layer's ``hook_z`` applies a per-copy head
mask. Copies are identical up to the first ablated layer's ``hook_z``, so that prefix runs once
on the un-repeated batch and only the rest (``model.logits_from_z``) runs per copy; head sets
are grouped by their first ablated layer so that a cheap group is never dragged into a costly
one. When everything after ``hook_z`` is linear, the derived fast path
:mod:`mhainterp.fast.linear_readout` scores all copies without a per-copy residual stream.
Passes are split into forwards of at most ``max_rows`` rows (copies x sequences; by default the
measured best for each kind of group,
:data:`~mhainterp.ablation.replacement.FULL_FORWARD_ROWS`); results do not depend on the split
beyond rounding. Which forwards run is planned on the host by :mod:`mhainterp.ablation.plan`:
the sequences are chunked longest first and each chunk is cut after its last real token; on a
pretrained model a chunk holds only sentences of like length
(:data:`~mhainterp.ablation.plan.PADDING_BAND`), so padded text wastes few positions. One clean
forward per chunk gives the prefixes of every first layer. When the batch is its own
mean/resample reference and fits one chunk, the forward that gives the replacement is that
clean forward too (:class:`~mhainterp.ablation.replacement.ReferencePrefix`). Configurations
that ablate the same heads above the last layer share that layer's input and ``hook_z`` too: it
is computed once and each runs only its last layer (kept in a
:class:`~mhainterp.ablation.replacement.CleanCache` for later passes with the same values),
where that gives the same values bit for bit
(:func:`~mhainterp.ablation.plan.shared_above_last`). On our own model a chunk without padding
runs without a padding mask (the same values, less work).

Shapes: C configurations, n sequences, T positions, L layers, h heads, k targets.

Example:
    >>> from mhainterp.model.handbuilt import handbuilt_model
    >>> from mhainterp.tasks import get_task
    >>> model = handbuilt_model(["previous", "uniform", "previous"])
    >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
    >>> result = evaluate_head_sets(model, task, [[], ["L0H0"], ["L0H0", "L0H2"]])
    >>> [round(m["accuracy"], 2) for m in result.metrics()]  # doctest: +SKIP
    [1.0, 1.0, 0.11]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.ablation.plan import (
    PLAN_DEVICE,
    first_layers,
    plan_jobs,
    sequence_ends,
    shared_above_last,
    unpadded_chunks,
)
from mhainterp.ablation.replacement import (
    DEFAULT_MAX_ROWS,
    LAST_LAYER_STATE_BYTES,
    CleanCache,
    Method,
    Replacement,
    build_replacement,
    check_method,
)
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import Data, as_batch, batch_for_model, target_names
from mhainterp.fast import linear_readout
from mhainterp.heads import HeadSpec, format_heads, resolve_heads
from mhainterp.model import StopForward
from mhainterp.protocol import HookedModel
from mhainterp.runtime import eval_mode, model_device, uses_work_threads
from mhainterp.scoring import (
    PositionScores,
    Totals,
    damage_metric,
    position_scores,
    totals,
)
from mhainterp.tasks import Batch
from mhainterp.validation import check_int

__all__ = [
    "AblationResult",
    "ablate",
    "evaluate_head_sets",
    "resolve_head_sets",
    "rows_of",
    "run_masks",
]


# ----------------------------------------------------------------------------- ablate()


@contextmanager
def ablate(
    model: HookedModel,
    heads: str | Sequence[HeadSpec],
    method: Method = "zero",
    reference: Data | None = None,
    generator: torch.Generator | None = None,
    *,
    n_eval: int = DEFAULT_N_EVAL,
) -> Iterator[Any]:
    """Context manager: inside it, ``model`` runs with ``heads`` ablated.

    The listed heads' slices of ``hook_z`` are replaced (before ``W_O``, so no other head
    changes). Hooks are removed on exit, also after an exception. Ablating no heads adds no
    hooks, so the model is exactly the unablated one.

    Args:
        model: The model.
        heads: Head labels (``["L0H1", "L0H3"]``, ``"L0H1,L0H3"``) or ``(layer, head)`` pairs.
        method: ``"zero"``, ``"mean"`` or ``"resample"`` (see the module docstring).
        reference: For ``"mean"``/``"resample"``: a Task (its evaluation set of ``n_eval``),
            a Batch or tokens. Its clean activations are computed once, on entering.
        generator: For ``"resample"``: draws the donor permutation (seed 0 when None).
        n_eval: Size of a Task reference's evaluation set.

    Example:
        >>> with ablate(model, ["L0H0", "L0H2"]) as ablated:  # doctest: +SKIP
        ...     logits = ablated(batch.tokens)
    """
    method = check_method(method)
    pairs = resolve_heads(model, heads)
    ref = None if reference is None else as_batch(reference, n_eval=n_eval, name="reference")
    replacement = build_replacement(model, method, ref, generator)
    planned = head_masks(model, [pairs], device=PLAN_DEVICE)[0]  # (L, h), read here for free
    mask = planned.to(model_device(model))
    hooks = [
        (
            f"blocks.{layer}.attn.hook_z",
            partial(replacement.replace_heads, layer=layer, head_mask=mask[layer]),
        )
        for layer in range(model.cfg.n_layers)
        if bool(planned[layer].any())
    ]
    with model.hooks(fwd_hooks=hooks):
        yield model


# ----------------------------------------------------------------------------- batched passes


def head_masks(
    model: HookedModel,
    head_sets: Sequence[Sequence[tuple[int, int]]],
    *,
    device: torch.device | str | None = None,
) -> Bool[Tensor, "C L h"]:
    """One ``[L, h]`` mask per head set (True = ablated), on ``device`` (default: the model's).

    The masks are filled on the host and moved in one copy (not one per head).
    """
    L, h = model.cfg.n_layers, model.cfg.n_heads
    # Filled as a Python list and made a tensor once: one tensor op, not one per head.
    flat = [False] * (len(head_sets) * L * h)
    for c, pairs in enumerate(head_sets):
        for layer, head in pairs:
            if not (-L <= layer < L and -h <= head < h):  # as tensor indexing would refuse
                raise IndexError(f"head ({layer}, {head}) is out of range for {L} x {h} heads")
            flat[(c * L + layer % L) * h + head % h] = True
    masks = torch.tensor(flat, dtype=torch.bool, device=PLAN_DEVICE).reshape(-1, L, h)
    return masks.to(model_device(model) if device is None else device)


def _mask_hook(
    z: Float[Tensor, "CS T h d_head"],
    hook: Any,
    *,
    layer: int,
    copy_masks: Bool[Tensor, "c h"],
    rows: Int[Tensor, " s"],
    replacement: Replacement,
) -> Tensor:
    c, s = copy_masks.shape[0], rows.shape[0]
    z = z.reshape(c, s, *z.shape[1:])  # (c, s, T, h, d_head)
    values = replacement.values(layer, rows, z[0])  # broadcastable to (s, T, h, d_head)
    out = torch.where(copy_masks[:, None, None, :, None], values[None], z)
    return out.reshape(c * s, *z.shape[2:])


def _clean_prefixes(
    model: HookedModel, part: Batch, layers: Sequence[int]
) -> dict[int, tuple[Float[Tensor, "s T d_model"], Float[Tensor, "s T h d_head"]]]:
    """The clean ``(hook_resid_pre, hook_z)`` of every layer in ``layers`` on ``part``.

    One forward of the model's own serves them all and stops at the deepest one's ``hook_z``:
    the layers after it are the copies' business, so computing them here would be wasted.
    """
    deepest = max(layers)
    seen: dict[str, Tensor] = {}
    stop = StopForward()

    def keep(value: Tensor, hook: Any) -> None:
        seen[hook.name] = value
        if hook.name == f"blocks.{deepest}.attn.hook_z":
            raise stop

    names = {
        layer: (f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z") for layer in layers
    }
    hooks = [(name, keep) for pair in names.values() for name in pair]
    with model.hooks(fwd_hooks=hooks), stop:
        model.logits(part.tokens, part.padding_mask)
    # hook_z is a transposed view: made contiguous once here, not once per copy chunk
    return {layer: (seen[r], seen[z].contiguous()) for layer, (r, z) in names.items()}


def rows_of(batch: Batch, rows: Int[Tensor, " s"]) -> Batch:
    """Rows ``rows`` of ``batch``, cut after the last position any of them has a real token.

    Trailing padding changes no real position (padding keys are masked in every head, and
    each position is normalised on its own), so the cut leaves every scored value as it is.
    """
    part = batch[rows]
    real = part.padding_mask.any(0)  # (T,)
    cut = int(real.nonzero().max()) + 1 if bool(real.any()) else part.padding_mask.shape[1]
    return _cut(part, cut)


def _cut(part: Batch, cut: int) -> Batch:
    """``part`` without its positions from ``cut`` on (as it is when nothing is cut)."""
    if cut == part.padding_mask.shape[1]:
        return part
    return Batch(
        tokens=part.tokens[:, :cut],
        targets=part.targets[:, :cut],
        mask=part.mask[:, :cut],
        padding_mask=part.padding_mask[:, :cut],
    )


def _forward_copies(
    model: HookedModel,
    part: Batch,
    chunk: Bool[Tensor, "c L h"],
    rows: Int[Tensor, " s"],
    replacement: Replacement,
    first: int,
    prefix: tuple[Tensor, Tensor],
    bases: dict,
    clean_logits: dict | None = None,
    planned: Bool[Tensor, "c L h"] | None = None,
    unpadded: bool = False,
    stop_at: int | None = None,
) -> Float[Tensor, "c s T *out"] | tuple[Tensor, Tensor]:
    """Logits of ``c`` copies of ``part``: copy ``i`` ablates ``chunk[i]``, from ``first`` on.

    ``planned``: ``chunk`` on the host, where which layers it ablates is read (``chunk``
    itself when None). ``unpadded``: ``part`` has no padding
    (:func:`~mhainterp.ablation.plan.unpadded_chunks`), so the copies run without a padding
    mask. ``stop_at``: a layer after ``first``; the copies
    stop at its ``hook_z``, before its heads are ablated, and their ``(hook_resid_pre,
    hook_z)`` there is returned instead of logits (:func:`_finish_copies` goes on from it).

    ``prefix`` is the clean ``(hook_resid_pre, hook_z)`` of layer ``first`` on ``part``.
    ``bases``: the linear readout's :class:`~mhainterp.fast.linear_readout.ReadoutBasis` of
    ``(first, part)``, kept by the caller for the next chunk of copies over the same rows;
    ``clean_logits``: that chunk's clean logits from another method's pass (a
    :class:`~mhainterp.ablation.replacement.CleanCache`'s, keyed by ``first``), filled here.
    """
    c = chunk.shape[0]
    planned = chunk if planned is None else planned
    resid_pre, z = prefix
    values = replacement.values(first, rows, z)  # broadcastable to (s, T, h, d_head)
    if stop_at is None and linear_readout.applies(model, first):
        heads = bool(planned[:, first].any())  # clean copies alone need no head rows
        if first not in bases or (heads and not bases[first].has_heads):
            known = bases[first].clean if first in bases else None
            if known is None and clean_logits is not None:
                known = clean_logits.get(first)
            bases[first] = linear_readout.readout_basis(
                model, first, resid_pre, z, values if heads else None, known
            )
            if clean_logits is not None:
                clean_logits[first] = bases[first].clean
        return linear_readout.copy_logits(
            model, first, resid_pre, z, values, chunk[:, first], part, basis=bases[first]
        )
    # Broadcasting the clean z over copies writes each copy once (no repeat, then overwrite).
    z = torch.where(chunk[:, first, None, None, :, None], values[None], z[None])
    z = z.reshape(c * len(part), *z.shape[2:])  # (c * s, T, h, d_head), copy-major
    hooks = [
        (
            f"blocks.{layer}.attn.hook_z",
            partial(
                _mask_hook,
                layer=layer,
                copy_masks=chunk[:, layer],
                rows=rows,
                replacement=replacement,
            ),
        )
        for layer in range(first + 1, model.cfg.n_layers if stop_at is None else stop_at)
        if bool(planned[:, layer].any())
    ]
    padding_mask = None if unpadded else part.padding_mask.repeat(c, 1)
    if stop_at is not None:
        return _state_at(model, stop_at, hooks, first, resid_pre.repeat(c, 1, 1), z, padding_mask)
    with model.hooks(fwd_hooks=hooks):
        logits = model.logits_from_z(first, resid_pre.repeat(c, 1, 1), z, padding_mask)
    return logits.reshape(c, len(part), *logits.shape[1:])


def _state_at(
    model: HookedModel, layer: int, hooks: list, first: int, *forward: Tensor | None
) -> tuple[Float[Tensor, "B T d_model"], Float[Tensor, "B T h d_head"]]:
    """``(hook_resid_pre, hook_z)`` of ``layer`` in ``model.logits_from_z(first, *forward)``
    run with ``hooks``; the forward stops there."""
    seen: dict[str, Tensor] = {}
    stop = StopForward()
    names = (f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z")

    def keep(value: Tensor, hook: Any) -> None:
        seen[hook.name] = value
        if hook.name == names[1]:
            raise stop

    with model.hooks(fwd_hooks=[*hooks, *((name, keep) for name in names)]), stop:
        model.logits_from_z(first, *forward)
    return seen[names[0]], seen[names[1]]


def _finish_copies(
    model: HookedModel,
    part: Batch,
    chunk: Bool[Tensor, "c L h"],
    rows: Int[Tensor, " s"],
    replacement: Replacement,
    layer: int,
    state: tuple[Tensor, Tensor],
    planned: Bool[Tensor, "c L h"],
    unpadded: bool,
) -> Float[Tensor, "c s T *out"]:
    """The logits of :func:`_forward_copies` from ``state``, its ``(hook_resid_pre, hook_z)``
    of ``layer`` (``stop_at=layer``), ``layer`` being the last layer and the copies' heads in
    it ablated here: the same operations on the same values as the whole forward, so the
    same logits bit for bit."""
    c = chunk.shape[0]
    resid_pre, z = state
    if bool(planned[:, layer].any()):  # the hook the whole forward would run there
        z = _mask_hook(z, None, layer=layer, copy_masks=chunk[:, layer], rows=rows,
                       replacement=replacement)  # fmt: skip
    padding_mask = None if unpadded else part.padding_mask.repeat(c, 1)
    logits = model.logits_from_z(layer, resid_pre, z, padding_mask)
    return logits.reshape(c, len(part), *logits.shape[1:])


def _keep_state(states: dict, key: tuple, replacement: Replacement, state: tuple) -> None:
    """Keep ``state`` under ``key`` (with ``replacement``, so that its id stays its own),
    the oldest states out beyond :data:`LAST_LAYER_STATE_BYTES` (the newest always kept)."""
    states[key] = (replacement, state)
    size = sum(t.nbytes for _, kept in states.values() for t in kept)
    for old in list(states)[:-1]:
        if size <= LAST_LAYER_STATE_BYTES:
            break
        size -= sum(t.nbytes for t in states.pop(old)[1])


def run_masks(
    model: HookedModel,
    batch: Batch,
    masks: Bool[Tensor, "C L h"],
    replacement: Replacement,
    *,
    per_position: bool = False,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    progress: bool = False,
    desc: str = "ablate",
    cache: CleanCache | None = None,
    metric: Any = None,
) -> tuple[Totals, PositionScores | None]:
    """Score ``C`` ablation configurations of ``batch`` (copy c ablates ``masks[c]``).

    ``cache``: a :class:`CleanCache` the caller keeps across calls on the same model, batch and
    ``max_rows`` (several methods, or an :class:`Ablator`'s clicks); the clean prefixes are kept
    in it (by first layer and sequence range) and reused, so a later call skips the clean
    forward. Without it, one prefix is held at a time.

    ``metric``: scores the copies' outputs instead of cross-entropy against the targets,
    ``metric(outputs [c, s, T, *out], targets, mask, rows) -> PositionScores`` (e.g.
    :class:`~mhainterp.scoring.CleanOutputMetric`: KL or embedding damage to the clean model).
    With ``max_rows=None`` a forward's rows are also capped so its outputs fit
    :data:`~mhainterp.scoring.FORWARD_MEMORY_BUDGET` (a 49k vocabulary gets 18-row chunks).

    With a ``cache``, a configuration it already scored under the same replacement values
    (cross-entropy totals, no ``per_position``) is taken from it, not run again: its totals
    are the same bits whatever runs beside it (``tests/test_ablation.py``).

    Returns:
        The :class:`~mhainterp.scoring.Totals` of every configuration and, with
        ``per_position``, the :class:`~mhainterp.scoring.PositionScores` ``[C, n, T, k]``.
    """
    if max_rows is not None:
        max_rows = check_int("max_rows", max_rows, minimum=1)
    options = {"max_rows": max_rows, "progress": progress, "desc": desc, "cache": cache}
    if cache is None or per_position or metric is not None or masks.shape[0] == 0:
        return _run_masks(model, batch, masks, replacement, per_position, metric, **options)
    cache.check(model, batch, "batch")  # before anything is taken from it
    values = replacement.values_key()
    keys = [(values, mask) for mask in _mask_keys(masks)]
    todo = [c for c, key in enumerate(keys) if key not in cache.totals]
    if todo:
        index = torch.tensor(todo, device=masks.device)
        found, _ = _run_masks(model, batch, masks[index], replacement, False, None, **options)
        for i, c in enumerate(todo):
            cache.totals[keys[c]] = (replacement, found.loss_sum[i], found.correct[i])
    loss_sum = torch.stack([cache.totals[key][1] for key in keys])  # (C,)
    correct = torch.stack([cache.totals[key][2] for key in keys])  # (C, k)
    scored = batch.scored.double().sum((0, 1))
    return Totals(loss_sum=loss_sum, correct=correct, scored=scored), None


def _mask_keys(masks: Bool[Tensor, "C L h"]) -> list[bytes]:
    """Each configuration's mask as bytes (one read of the masks)."""
    planned = masks.to(PLAN_DEVICE).contiguous()
    return [planned[c].numpy().tobytes() for c in range(planned.shape[0])]


def _run_masks(
    model: HookedModel,
    batch: Batch,
    masks: Bool[Tensor, "C L h"],
    replacement: Replacement,
    per_position: bool,
    metric: Any,
    *,
    max_rows: int | None,
    progress: bool,
    desc: str,
    cache: CleanCache | None,
) -> tuple[Totals, PositionScores | None]:
    """:func:`run_masks`, every configuration run."""
    C = masks.shape[0]
    # The host plans every forward from one read of the masks and of the sequence lengths, so
    # the forwards themselves never wait for the device (a constant number of syncs per call).
    planned = masks.to(PLAN_DEVICE)  # free when the caller built them there (head_masks)
    jobs = plan_jobs(model, batch, first_layers(planned), max_rows)
    masks = masks.to(model_device(model))
    lengths = sequence_ends(batch)  # (n,)
    order = torch.argsort(-lengths, stable=True).to(masks.device)  # as length_order(batch)
    # chunk s0:s1 holds sequences order[s0:s1]; their ends are the lengths sorted longest first
    # (read with each sequence's count of real tokens: one read of the device)
    lengths_read, real_read = torch.stack([lengths, batch.padding_mask.sum(1)]).tolist()
    host_order = sorted(range(len(lengths_read)), key=lambda i: -lengths_read[i])  # stable
    ends = [lengths_read[i] for i in host_order]
    # Already longest first (no padding at all, say): the order is the identity, so a chunk of
    # every sequence is the batch itself, and its scores need no scatter back into place.
    in_order = all(a >= b for a, b in itertools.pairwise(lengths_read))
    n, T = batch.padding_mask.shape
    cuts = {(s0, s1): max(ends[s0:s1]) or T for _, _, s0, s1 in jobs}  # as rows_of cuts
    unpadded = unpadded_chunks(model, cuts, [real_read[i] for i in host_order])
    # A cache keeps the last layer's states for later passes (every one that may serve one)
    shared = shared_above_last(model, jobs, planned, keep_all=cache is not None)
    jobs.sort(key=lambda job: (job[2], job[3], shared.get(job[1][0], b"")))  # sharers adjacent
    last = model.cfg.n_layers - 1
    states = cache.last_layer_states if cache is not None else {}
    k = batch.n_targets
    loss_sum = torch.zeros(C, dtype=torch.float64, device=masks.device)
    correct = torch.zeros(C, k, dtype=torch.float64, device=masks.device)
    pieces: dict[tuple[int, int], PositionScores] = {}
    if cache is not None:
        cache.check(model, batch, "batch")
    # (first, s0, s1) -> clean prefix; without a cache only the current chunk's are kept (memory)
    prefixes = cache.prefixes if cache is not None else {}
    # The linear readout's bases of the current sequence chunk (jobs are ordered by chunk, so
    # every chunk of copies over these rows follows; one chunk's are kept at a time: memory).
    bases: dict[int, Any] = {}
    rows_of_bases = None
    with eval_mode(model), torch.no_grad():
        for first, members, s0, s1 in tqdm(jobs, desc=desc, disable=not progress, leave=False):
            rows = order[s0:s1]
            whole = in_order and (s0, s1) == (0, n)  # rows are 0..n-1: no copy of the batch
            part = _cut(batch if whole else batch[rows], cuts[(s0, s1)])  # rows_of, planned
            if rows_of_bases != (s0, s1):
                bases, rows_of_bases = {}, (s0, s1)
            index = torch.tensor(members, device=masks.device)
            if (first, s0, s1) not in prefixes:  # one clean forward for the chunk's groups
                if cache is None:
                    prefixes.clear()
                wanted = sorted(
                    {f for f, _, a, b in jobs if (a, b) == (s0, s1) and (f, s0, s1) not in prefixes}
                )
                if cache is not None and cache.every_layer:
                    wanted = [f for f in range(model.cfg.n_layers) if (f, s0, s1) not in prefixes]
                known = replacement.reference_prefix
                found = known.prefixes_of(part, wanted) if known is not None else None
                if found is None:
                    found = _clean_prefixes(model, part, wanted)
                prefixes.update({(f, s0, s1): found[f] for f in wanted})
            prefix = prefixes[(first, s0, s1)]
            arguments = (model, part, masks[index], rows, replacement, first, prefix, bases)
            sharing = shared.get(members[0])
            if sharing is None:
                logits = _forward_copies(
                    *arguments,
                    None if cache is None else cache.readout_clean.setdefault((s0, s1), {}),
                    planned[members],
                    unpadded[(s0, s1)],
                )
            else:  # the layers above the last run once for every configuration alike there
                key = (replacement.values_key(), s0, s1, sharing)
                if key not in states:
                    if cache is None:
                        states.clear()  # sharers are adjacent: one state at a time
                    state = _forward_copies(
                        *arguments, None, planned[members], unpadded[(s0, s1)], stop_at=last
                    )
                    _keep_state(states, key, replacement, state)
                state = states[key][1]
                logits = _finish_copies(
                    model,
                    part,
                    masks[index],
                    rows,
                    replacement,
                    last,
                    state,
                    planned[members],
                    unpadded[(s0, s1)],
                )
            if metric is None:
                scores = position_scores(logits, part.targets, part.mask)  # (c, s, T', k)
            else:
                scores = metric(logits, part.targets, part.mask, rows)
            part_totals = totals(scores)
            loss_sum[index] += part_totals.loss_sum
            correct[index] += part_totals.correct
            if per_position:
                pieces[(members[0], s0)] = scores
    result = Totals(loss_sum=loss_sum, correct=correct, scored=batch.scored.double().sum((0, 1)))
    if not per_position:
        return result, None
    if in_order and all((s0, s1, cuts[(s0, s1)]) == (0, n, T) for _, _, s0, s1 in jobs):
        return result, _stack(pieces, jobs, C, batch)
    return result, _assemble(pieces, jobs, order, C, batch)


def _stack(
    pieces: dict[tuple[int, int], PositionScores], jobs: list, C: int, batch: Batch
) -> PositionScores:
    """:func:`_assemble` where every chunk holds every sequence in order, uncut: each chunk's
    scores are its configurations' rows as they are, copied in place (no scatter)."""
    n, T, k = batch.scored.shape
    device = batch.scored.device
    nll = torch.empty(C, n, T, k, device=device)
    correct = torch.empty(C, n, T, k, dtype=torch.bool, device=device)
    predictions = torch.empty(C, n, T, k, dtype=torch.long, device=device)
    for _, members, s0, _ in jobs:  # the jobs hold every configuration once
        piece = pieces[(members[0], s0)]
        index = torch.tensor(members, device=device)
        shape = (len(members), n, T, k)
        nll.index_copy_(0, index, piece.nll.to(nll.dtype).reshape(shape))
        correct.index_copy_(0, index, piece.correct.reshape(shape))
        predictions.index_copy_(0, index, piece.predictions.reshape(shape))
    return PositionScores(nll=nll, correct=correct, predictions=predictions, scored=batch.scored)


def _assemble(
    pieces: dict[tuple[int, int], PositionScores],
    jobs: list,
    order: Int[Tensor, " n"],
    C: int,
    batch: Batch,
) -> PositionScores:
    """Put the per-chunk scores back into configuration and sequence order: ``[C, n, T, k]``
    (a trimmed chunk's positions past its cut are unscored: 0 / False)."""
    n, T, k = batch.scored.shape
    device = batch.scored.device
    nll = torch.zeros(C, n, T, k, device=device)
    correct = torch.zeros(C, n, T, k, dtype=torch.bool, device=device)
    predictions = torch.zeros(C, n, T, k, dtype=torch.long, device=device)
    for _, members, s0, s1 in jobs:
        piece = pieces[(members[0], s0)]
        rows = order[s0:s1].to(device)[None, :]  # (1, s)
        index = torch.tensor(members, device=device)[:, None]  # (c, 1)
        cut = piece.nll.shape[2]
        nll[index, rows, :cut] = piece.nll.to(nll.dtype)
        correct[index, rows, :cut] = piece.correct
        predictions[index, rows, :cut] = piece.predictions
    return PositionScores(nll=nll, correct=correct, predictions=predictions, scored=batch.scored)


# ----------------------------------------------------------------------------- public entry


def resolve_head_sets(
    model: HookedModel, head_sets: Sequence[str | Sequence[HeadSpec]]
) -> list[list[tuple[int, int]]]:
    """Each head set as sorted ``(layer, head)`` pairs (an empty set is the clean model).

    Raises:
        TypeError: ``head_sets`` is one string or not a list (a common slip: ``"L0H1,L0H2"``
            is ONE set; wrap it in a list).
    """
    if isinstance(head_sets, str) or not isinstance(head_sets, Sequence):
        raise TypeError(
            "head_sets must be a list of head sets, e.g. [['L0H0', 'L0H1'], ['L0H2']] or "
            f"['L0H0,L0H1', 'L0H2'], got {head_sets!r}"
        )
    return [resolve_heads(model, heads) if len(heads) else [] for heads in head_sets]


@dataclass
class AblationResult:
    """What :func:`evaluate_head_sets` returns.

    Attributes:
        head_sets: The configurations, as sorted ``(layer, head)`` lists (C).
        method: The ablation method.
        target_names: Per-target names (empty for single-target models).
        batch: The evaluated batch.
        totals: Loss sums and correct counts per configuration.
        scores: Per-(configuration, sequence, position, target) scores ``[C, n, T, k]``, when
            ``per_position=True`` was asked.
    """

    head_sets: list[list[tuple[int, int]]]
    method: Method
    target_names: list[str]
    batch: Batch
    totals: Totals
    scores: PositionScores | None = None

    def metrics(self) -> list[dict[str, float]]:
        """Per configuration: ``loss, accuracy`` and ``accuracy/<target>``."""
        return self.totals.metrics(self.target_names)

    @property
    def labels(self) -> list[str]:
        """Each head set written ``"L0H1,L0H3"`` (``""`` for the clean model)."""
        return [format_heads(pairs) for pairs in self.head_sets]


@uses_work_threads
def evaluate_head_sets(
    model: HookedModel,
    data: Data,
    head_sets: Sequence[str | Sequence[HeadSpec]],
    method: Method = "zero",
    reference: Data | None = None,
    *,
    n_eval: int = DEFAULT_N_EVAL,
    per_position: bool = False,
    generator: torch.Generator | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    progress: bool = False,
    desc: str = "ablate",
    cache: CleanCache | None = None,
    metric: Any = None,
) -> AblationResult:
    """Loss and accuracy with each head set ablated, all in one batched pass.

    Args:
        model: The model.
        data: A Task (its evaluation set of ``n_eval`` sequences), a Batch, or tokens (which
            raise: scoring needs targets).
        head_sets: Sets of heads to ablate together; each a list of labels or pairs, or one
            comma-separated string. An empty set is the clean model.
        method: ``"zero"``, ``"mean"`` or ``"resample"``.
        reference: Where mean/resample activations come from (same kinds as ``data``);
            default: the evaluated batch.
        n_eval: Size of a Task's evaluation set.
        per_position: Also keep per-(set, sequence, position, target) scores.
        generator: The resample permutation (seed 0 when None).
        max_rows: Most rows (copies x sequences) per forward; bounds memory. None: the
            measured best (:data:`~mhainterp.ablation.replacement.FULL_FORWARD_ROWS`,
            :data:`~mhainterp.ablation.replacement.LINEAR_READOUT_ROWS`), within the output
            memory cap (:func:`~mhainterp.scoring.rows_for_outputs`).
        progress: Show a progress bar.
        desc: The progress bar's label.
        cache: A :class:`CleanCache` shared by passes over the same model, batch and
            reference (other methods, other head sets): the clean activations are computed
            once. Results are the same with or without it.
        metric: Score outputs with this hook instead of cross-entropy (see :func:`run_masks`).

    Returns:
        An :class:`AblationResult`.
    """
    method = check_method(method)
    resolved = resolve_head_sets(model, head_sets)
    batch = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
    if metric is None:  # an embedding model has no targets: its damage is the embedding's
        metric = damage_metric(model, batch)
    ref = batch if reference is None else as_batch(reference, n_eval=n_eval, name="reference")
    masks = head_masks(model, resolved, device=PLAN_DEVICE)  # run_masks moves them once
    # The batch is its own reference and is evaluated in one chunk: the replacement's clean
    # forward is also the copies' clean prefix (kept only then: it holds every layer's).
    one_chunk = {
        (a, b) for _, _, a, b in plan_jobs(model, batch, first_layers(masks), max_rows)
    } == {(0, len(batch))}
    replacement = build_replacement(
        model, method, ref, generator, max_rows, cache, keep_prefix=reference is None and one_chunk
    )
    result, scores = run_masks(
        model,
        batch,
        masks,
        replacement,
        per_position=per_position,
        max_rows=max_rows,
        progress=progress,
        desc=desc,
        cache=cache,
        metric=metric,
    )
    return AblationResult(
        head_sets=resolved,
        method=method,
        target_names=target_names(data, model.cfg.n_targets),
        batch=batch,
        totals=result,
        scores=scores,
    )
