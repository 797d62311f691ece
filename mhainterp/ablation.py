"""Which heads matter: ablation by editing ``hook_z``, importance tables, pruning, gradients.

Every ablation here replaces the chosen heads' slice of ``blocks.{l}.attn.hook_z``
(``[batch, pos, head, d_head]``, the heads' outputs *before* ``W_O``), so exactly those heads
change and every other head, the biases and the residual stream are left alone. Three methods:

``"zero"``
    The head's z is set to 0: the head writes nothing into the residual stream.
``"mean"``
    The head's z is set to its mean over a *reference* batch, **per position** and counting only
    real (non-padding) tokens: ``mean_z[t] = mean over reference sequences whose position t is
    real``. Per position because the heads see learned position embeddings, so a head's typical
    output at t=0 differs from its output at t=10. A position that no reference sequence reaches
    (all padding there) gets the head's mean over all real positions. This keeps the head's
    average contribution and removes only what depends on the particular input.
``"resample"``
    The head's z is taken from *another* sequence of the reference batch (resample ablation,
    Chan et al. 2022): row ``i`` of the ablated batch gets the z of reference row
    ``sigma(i mod m)`` (``m`` reference sequences), where ``sigma`` is a random single-cycle
    permutation drawn once from ``generator`` (seed 0 when None). A single cycle has no fixed
    points, so when the reference batch *is* the evaluated batch (the default of the table
    functions), no sequence ever gets its own output back. Where the donor sequence is padding
    and the receiver is not, the per-position mean (as in ``"mean"``) is used.

The reference activations are computed once, before any ablation hook is added, so they are
the unablated model's (unless the caller has other hooks on).

All single-head ablations of :func:`head_importance` run in one batched pass: the batch is
repeated once per ablated configuration (plus one clean copy) along the batch axis, and a hook
on each layer's ``hook_z`` applies a per-copy head mask, so a single forward evaluates every
head. Copies are identical up to the first ablated layer's ``hook_z``, so that prefix runs
once on the un-repeated batch and only the rest of the network (``model.logits_from_z``) runs
per copy. :func:`pairwise_ablation` and :func:`prune_curve` use the same machinery. To bound memory,
a pass is split into forwards of at most ``max_rows`` rows (copies x sequences; default 16384,
which covers 15 heads x 1024 sequences in one forward); results do not depend on the split.

Example:
    >>> from mhainterp.handbuilt import handbuilt_model
    >>> from mhainterp.tasks import get_task
    >>> model = handbuilt_model(["previous", "uniform", "previous"])
    >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
    >>> table = head_importance(model, task)
    >>> table[["head_label", "accuracy"]].round(2).values.tolist()  # doctest: +SKIP
    [['L0H0', 1.0], ['L0H1', 1.0], ['L0H2', 1.0]]
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from scipy import stats
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.model import HookedMHATransformer, head_label, parse_head_label
from mhainterp.tasks import IGNORE_INDEX, Batch, Task

__all__ = [
    "METHODS",
    "Ablator",
    "ablate",
    "ablate_sets",
    "ablation_tables",
    "check_method",
    "compare_importance",
    "gradient_importance",
    "head_importance",
    "importance_agreement",
    "pairwise_ablation",
    "prune_curve",
    "resolve_heads",
]

METHODS = ("zero", "mean", "resample")
"""The ablation methods (see the module docstring)."""

DEFAULT_MAX_ROWS = 16384
_RESAMPLE_SEED = 0
HeadSpec = str | tuple[int, int]


# ----------------------------------------------------------------------------- input checks


def check_method(method: Any) -> str:
    """Return ``method`` if it is one of :data:`METHODS`, else raise a ``ValueError``.

    Example:
        >>> check_method("mean")
        'mean'
    """
    if not isinstance(method, str) or method not in METHODS:
        allowed = ", ".join(repr(m) for m in METHODS)
        raise ValueError(f"method={method!r} is invalid; allowed: {allowed}")
    return method


def resolve_heads(
    model: HookedMHATransformer, heads: str | Iterable[HeadSpec]
) -> list[tuple[int, int]]:
    """Turn head names into sorted, de-duplicated ``(layer, head)`` pairs for ``model``.

    Args:
        model: The model whose heads are named.
        heads: ``"L0H1"``, ``"L0H1,L0H3"``, a list of labels, or ``(layer, head)`` pairs.

    Raises:
        ValueError: for an unknown head (``"L0H9"`` on 8 heads, ``"L3H0"`` on one layer,
            ``"head2"``), listing the valid heads.
        TypeError: for something that is not a label or a pair.

    Example:
        >>> resolve_heads(model, "L0H3,L0H1")  # doctest: +SKIP
        [(0, 1), (0, 3)]
    """
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if isinstance(heads, str):
        heads = [part.strip() for part in heads.split(",") if part.strip()]
    if not isinstance(heads, Iterable):
        raise TypeError(
            f"heads must be a list of head labels like ['L0H1', 'L0H3'], got {type(heads).__name__}"
        )
    pairs: set[tuple[int, int]] = set()
    for spec in heads:
        if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(i, int) for i in spec):
            spec = head_label(*spec)
        if not isinstance(spec, str):
            raise TypeError(
                f"each head must be a label like 'L0H1' or a (layer, head) pair, got {spec!r}; "
                f"valid heads: {', '.join(model.head_labels)}"
            )
        pairs.add(parse_head_label(spec.strip(), n_layers, n_heads))
    return sorted(pairs)


def _all_heads(model: HookedMHATransformer) -> list[tuple[int, int]]:
    return [(layer, h) for layer in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]


def _device(model: HookedMHATransformer) -> torch.device:
    return next(model.parameters()).device


def _as_batch(task_or_batch: Task | Batch, eval_size: int, name: str = "task_or_batch") -> Batch:
    """A Task's fixed evaluation set, or the Batch itself."""
    if isinstance(task_or_batch, Task):
        return task_or_batch.eval_batch(eval_size)
    if isinstance(task_or_batch, Batch):
        return task_or_batch
    raise TypeError(f"{name} must be a Task or a Batch, got {type(task_or_batch).__name__}")


def _check_batch(model: HookedMHATransformer, batch: Batch) -> Batch:
    """Move ``batch`` to the model's device and check it fits the model."""
    model.validate_inputs(batch.tokens, batch.padding_mask)
    if batch.n_targets != model.cfg.n_targets:
        raise ValueError(
            f"the batch has {batch.n_targets} target(s) per position but the model predicts "
            f"n_targets={model.cfg.n_targets}; use a batch of the model's task"
        )
    scored = batch.targets[batch.targets != IGNORE_INDEX]
    if scored.numel() and int(scored.max()) >= model.cfg.d_vocab_out:
        raise ValueError(
            f"targets reach class {int(scored.max())} but the model has "
            f"d_vocab_out={model.cfg.d_vocab_out}; use a batch of the model's task"
        )
    if not bool(batch.mask.any()):
        raise ValueError("the batch has no scored positions (mask is all False)")
    return batch.to(_device(model))


def _target_names(model: HookedMHATransformer, task_or_batch: Task | Batch) -> list[str]:
    """Per-target names (as in ``training.evaluate``); empty for single-target models."""
    if model.cfg.n_targets == 1:
        return []
    if isinstance(task_or_batch, Task):
        return list(task_or_batch.target_names)
    return [f"target{i}" for i in range(model.cfg.n_targets)]


def _metric_names(target_names: Sequence[str]) -> list[str]:
    return ["loss", "accuracy", *(f"accuracy/{name}" for name in target_names)]


def _resample_generator(generator: torch.Generator | None) -> torch.Generator:
    if generator is None:
        return torch.Generator().manual_seed(_RESAMPLE_SEED)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    return generator


# ----------------------------------------------------------------------------- replacements


@dataclass
class _Replacement:
    """What an ablated head's z becomes, per layer (see the module docstring)."""

    method: str
    mean_z: list[Float[Tensor, "T h d_head"]] | None = None
    donor_z: list[Float[Tensor, "m T h d_head"]] | None = None
    donor_real: Bool[Tensor, "m T"] | None = None
    sigma: Int[Tensor, " m"] | None = None

    def values(
        self, layer: int, rows: Int[Tensor, " s"], z: Float[Tensor, "s T h d_head"]
    ) -> Tensor:
        """Replacement z for rows ``rows`` of the evaluated batch, broadcastable to ``z``."""
        T = z.shape[1]
        if self.method == "zero":
            return z.new_zeros(())
        mean = self.mean_z[layer]
        if mean.shape[0] < T:
            raise ValueError(
                f"the reference batch has {mean.shape[0]} positions but the ablated batch has "
                f"{T}; use a reference batch at least as long"
            )
        mean = mean[:T].to(z.dtype)  # (T, h, d_head)
        if self.method == "mean":
            return mean[None]  # (1, T, h, d_head)
        donors = self.sigma[rows % self.sigma.shape[0]]  # (s,)
        donor = self.donor_z[layer][donors, :T].to(z.dtype)  # (s, T, h, d_head)
        real = self.donor_real[donors, :T, None, None]  # (s, T, 1, 1)
        return torch.where(real, donor, mean[None])


def _capture_z(
    model: HookedMHATransformer, batch: Batch, max_rows: int
) -> list[Float[Tensor, "m T h d_head"]]:
    """Every layer's clean ``hook_z`` on ``batch``, in chunks of ``max_rows`` sequences."""
    n_layers = model.cfg.n_layers
    chunks: list[list[Tensor]] = [[] for _ in range(n_layers)]

    def keep(z: Tensor, hook: Any, layer: int) -> None:
        chunks[layer].append(z.detach())

    hooks = [
        (f"blocks.{layer}.attn.hook_z", partial(keep, layer=layer)) for layer in range(n_layers)
    ]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for start in range(0, len(batch), max_rows):
            part = batch[start : start + max_rows]
            model.logits(part.tokens, part.padding_mask)
    return [torch.cat(layer_chunks) for layer_chunks in chunks]


def _per_position_mean(
    z: Float[Tensor, "m T h d_head"], real: Bool[Tensor, "m T"]
) -> Float[Tensor, "T h d_head"]:
    """Mean over the real tokens at each position; the overall real mean where none exist."""
    weights = real.to(z.dtype)[:, :, None, None]  # (m, T, 1, 1)
    counts = weights.sum(0)  # (T, 1, 1)
    per_position = (z * weights).sum(0) / counts.clamp(min=1)  # (T, h, d_head)
    overall = (z * weights).sum((0, 1)) / weights.sum().clamp(min=1)  # (h, d_head)
    return torch.where(counts > 0, per_position, overall[None])


def _single_cycle(m: int, generator: torch.Generator) -> Int[Tensor, " m"]:
    """A random permutation made of one cycle (no fixed points when m > 1)."""
    order = torch.randperm(m, generator=generator)
    sigma = torch.empty(m, dtype=torch.int64)
    sigma[order] = order.roll(-1)
    return sigma


def _build_replacement(
    model: HookedMHATransformer,
    method: str,
    reference: Batch | None,
    generator: torch.Generator | None,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> _Replacement:
    method = check_method(method)
    if method == "zero":
        return _Replacement("zero")
    if reference is None:
        raise ValueError(
            f"method={method!r} needs reference= (a Batch or Task whose clean activations give "
            "the replacement); method='zero' needs none"
        )
    model.validate_inputs(reference.tokens, reference.padding_mask)
    reference = reference.to(_device(model))
    if not bool(reference.padding_mask.any()):
        raise ValueError("the reference batch has no real (non-padding) tokens")
    was_training = model.training
    model.eval()
    try:
        donor_z = _capture_z(model, reference, max_rows)
    finally:
        model.train(was_training)
    real = reference.padding_mask
    means = [_per_position_mean(z, real) for z in donor_z]
    if method == "mean":
        return _Replacement("mean", mean_z=means)
    sigma = _single_cycle(len(reference), _resample_generator(generator)).to(real.device)
    return _Replacement("resample", mean_z=means, donor_z=donor_z, donor_real=real, sigma=sigma)


def _reference_batch(reference: Task | Batch | None, eval_size: int) -> Batch | None:
    return None if reference is None else _as_batch(reference, eval_size, name="reference")


# ----------------------------------------------------------------------------- ablate()


def _ablate_hook(
    z: Float[Tensor, "B T h d_head"],
    hook: Any,
    *,
    layer: int,
    head_mask: Bool[Tensor, " h"],
    replacement: _Replacement,
) -> Tensor:
    rows = torch.arange(z.shape[0], device=z.device)
    values = replacement.values(layer, rows, z)
    return torch.where(head_mask[None, None, :, None], values, z)


@contextmanager
def ablate(
    model: HookedMHATransformer,
    heads: str | Sequence[HeadSpec],
    method: str = "zero",
    reference: Task | Batch | None = None,
    generator: torch.Generator | None = None,
) -> Iterator[HookedMHATransformer]:
    """Context manager: inside it, ``model`` runs with ``heads`` ablated.

    The listed heads' slices of ``hook_z`` are replaced (before ``W_O``, so no other head
    changes). Hooks are removed on exit, also after an exception. Ablating no heads adds no
    hooks, so the model is exactly the unablated one.

    Args:
        model: The model.
        heads: Head labels (``["L0H1", "L0H3"]``, ``"L0H1,L0H3"``) or ``(layer, head)`` pairs.
        method: ``"zero"``, ``"mean"`` or ``"resample"`` (see the module docstring).
        reference: For ``"mean"``/``"resample"``: a Batch, or a Task (its fixed evaluation
            set). Its clean activations are computed once, on entering the context.
        generator: For ``"resample"``: draws the donor permutation (seed 0 when None).
            Row ``i`` of every batch run inside the context receives reference row
            ``sigma(i mod m)``.

    Yields:
        The model itself, with the ablation hooks on.

    Example:
        >>> with ablate(model, ["L0H0", "L0H2"]) as ablated:  # doctest: +SKIP
        ...     logits = ablated(batch.tokens)
    """
    method = check_method(method)
    pairs = resolve_heads(model, heads)
    replacement = _build_replacement(model, method, _reference_batch(reference, 1024), generator)
    head_mask = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
    for layer, h in pairs:
        head_mask[layer, h] = True
    head_mask = head_mask.to(_device(model))
    hooks = [
        (
            f"blocks.{layer}.attn.hook_z",
            partial(_ablate_hook, layer=layer, head_mask=head_mask[layer], replacement=replacement),
        )
        for layer in range(model.cfg.n_layers)
        if bool(head_mask[layer].any())
    ]
    with model.hooks(fwd_hooks=hooks):
        yield model


# ----------------------------------------------------------------------------- batched core


@dataclass
class _Sums:
    """Sufficient statistics of loss and accuracy for C ablation configurations."""

    loss: Float[Tensor, " C"]  # summed cross-entropy over scored (position, target) pairs
    correct: Float[Tensor, "C k"]  # correct scored pairs per target
    scored: Float[Tensor, " k"]  # scored pairs per target (the same for every configuration)

    def metrics(self, target_names: Sequence[str]) -> list[dict[str, float]]:
        """One dict per configuration: loss, accuracy and accuracy/<target> (multi-target)."""
        n_scored = float(self.scored.sum())
        rows = []
        for c in range(self.loss.shape[0]):
            row = {
                "loss": float(self.loss[c]) / n_scored,
                "accuracy": float(self.correct[c].sum()) / n_scored,
            }
            for t, name in enumerate(target_names):
                s = float(self.scored[t])
                row[f"accuracy/{name}"] = float(self.correct[c, t]) / s if s else float("nan")
            rows.append(row)
        return rows


def _score(
    logits: Tensor, batch: Batch, n_copies: int
) -> tuple[Float[Tensor, " C"], Float[Tensor, "C k"], Float[Tensor, " k"]]:
    """Loss sums and correct counts per copy; ``logits`` rows are copy-major."""
    s, T = batch.tokens.shape
    k, V = batch.n_targets, logits.shape[-1]
    logits = logits.reshape(n_copies, s, T, k, V)
    targets = batch.targets.reshape(s, T, k)
    scored = (targets != IGNORE_INDEX) & batch.mask[..., None]  # (s, T, k)
    index = targets.clamp(min=0)[None, ..., None].expand(n_copies, s, T, k, 1)
    nll = -logits.float().log_softmax(-1).gather(-1, index).squeeze(-1)  # (C, s, T, k)
    loss = torch.where(scored, nll, 0.0).double().sum((1, 2, 3))  # (C,)
    correct = ((logits.argmax(-1) == targets) & scored).double().sum((1, 2))  # (C, k)
    return loss, correct, scored.double().sum((0, 1))


def _mask_hook(
    z: Float[Tensor, "CS T h d_head"],
    hook: Any,
    *,
    layer: int,
    copy_masks: Bool[Tensor, "c h"],
    rows: Int[Tensor, " s"],
    replacement: _Replacement,
) -> Tensor:
    c, s = copy_masks.shape[0], rows.shape[0]
    z = z.reshape(c, s, *z.shape[1:])  # (c, s, T, h, d_head)
    values = replacement.values(layer, rows, z[0])  # broadcastable to (s, T, h, d_head)
    out = torch.where(copy_masks[:, None, None, :, None], values[None], z)
    return out.reshape(c * s, *z.shape[2:])


def _masked_sums(
    model: HookedMHATransformer,
    batch: Batch,
    masks: Bool[Tensor, "C L h"],
    replacement: _Replacement,
    *,
    max_rows: int = DEFAULT_MAX_ROWS,
    progress: bool = False,
    desc: str = "ablate",
) -> _Sums:
    """Metrics of C ablation configurations in batched forwards (copy c ablates masks[c]).

    The batch is repeated along the batch axis once per configuration; a hook on each layer's
    ``hook_z`` replaces, in copy c, the heads where ``masks[c, layer]`` is True.
    """
    if not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows={max_rows!r} is invalid; must be an integer >= 1")
    n_copies, n = masks.shape[0], len(batch)
    seqs_per = min(n, max_rows)
    copies_per = max(1, max_rows // seqs_per)
    masks = masks.to(_device(model))
    loss = torch.zeros(n_copies, dtype=torch.float64)
    correct = torch.zeros(n_copies, batch.n_targets, dtype=torch.float64)
    scored = torch.zeros(batch.n_targets, dtype=torch.float64)
    jobs = [(c0, s0) for c0 in range(0, n_copies, copies_per) for s0 in range(0, n, seqs_per)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for c0, s0 in tqdm(jobs, desc=desc, disable=not progress, leave=False):
                chunk = masks[c0 : c0 + copies_per]  # (c, L, h)
                part = batch[s0 : s0 + seqs_per]
                rows = torch.arange(s0, s0 + len(part), device=chunk.device)
                part_loss, part_correct, part_scored = _forward_copies(
                    model, part, chunk, rows, replacement
                )
                loss[c0 : c0 + len(chunk)] += part_loss.cpu()
                correct[c0 : c0 + len(chunk)] += part_correct.cpu()
                if c0 == 0:
                    scored += part_scored.cpu()
    finally:
        model.train(was_training)
    return _Sums(loss=loss, correct=correct, scored=scored)


def _forward_copies(
    model: HookedMHATransformer,
    part: Batch,
    chunk: Bool[Tensor, "c L h"],
    rows: Int[Tensor, " s"],
    replacement: _Replacement,
) -> tuple[Tensor, Tensor, Tensor]:
    c = chunk.shape[0]
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
        for layer in range(model.cfg.n_layers)
        if bool(chunk[:, layer].any())
    ]
    ablated_layers = chunk.any(dim=(0, 2)).nonzero().flatten().tolist()
    first = ablated_layers[0] if ablated_layers else model.cfg.n_layers - 1
    # Every copy is the clean model up to the first ablated layer's hook_z: compute that once.
    resid_pre, z = _clean_resid_and_z(model, part, first)
    z = z.contiguous()  # hook_z is a transposed view; copies written from it would be too
    values = replacement.values(first, rows, z)  # broadcastable to (s, T, h, d_head)
    if _readout_is_linear(model, first):
        logits = _linear_readout_copies(model, first, resid_pre, z, values, chunk[:, first])
        unsure = _near_ties(logits, part)  # (c, s): an argmax rounding could flip
        if bool(unsure.any()):
            pairs = unsure.nonzero()  # (n, 2): (copy, sequence)
            copy_z = torch.where(
                chunk[pairs[:, 0], first][:, None, :, None],  # (n, 1, h, 1)
                values.expand_as(z)[pairs[:, 1]],
                z[pairs[:, 1]],
            )  # (n, T, h, d_head)
            exact = model.logits_from_z(
                first, resid_pre[pairs[:, 1]], copy_z, part.padding_mask[pairs[:, 1]]
            )
            logits[pairs[:, 0], pairs[:, 1]] = exact.reshape(len(pairs), *logits.shape[2:])
        return _score(logits, part, c)
    # Broadcasting the clean z over copies writes each copy once (no repeat, then overwrite).
    z = torch.where(chunk[:, first, None, None, :, None], values[None], z[None])
    z = z.reshape(c * len(part), *z.shape[2:])  # (c * s, T, h, d_head), copy-major
    padding_mask = part.padding_mask.repeat(c, 1)  # copy-major
    later_hooks = [(name, hook) for name, hook in hooks if int(name.split(".")[1]) > first]
    with model.hooks(fwd_hooks=later_hooks):
        logits = model.logits_from_z(first, resid_pre.repeat(c, 1, 1), z, padding_mask)
    return _score(logits, part, c)


def _readout_is_linear(model: HookedMHATransformer, layer: int) -> bool:
    """Whether everything after layer ``layer``'s attention output is linear and unhooked: the
    last layer of an attention-only model without LayerNorm, and no hooks on the way out."""
    cfg = model.cfg
    if layer != cfg.n_layers - 1 or not cfg.attn_only or cfg.normalization_type is not None:
        return False
    after_z = (f"blocks.{layer}.attn.hook_result", f"blocks.{layer}.hook_attn_out",
               f"blocks.{layer}.hook_resid_post")  # fmt: skip
    return not cfg.use_attn_result and not any(model.hook_dict[n].fwd_hooks for n in after_z)


def _linear_readout_copies(
    model: HookedMHATransformer,
    layer: int,
    resid_pre: Float[Tensor, "s T d_model"],
    z: Float[Tensor, "s T h d_head"],
    values: Tensor,
    copy_masks: Bool[Tensor, "c h"],
) -> Float[Tensor, "c s T *out"]:
    """Logits of every copy when the readout after ``hook_z`` is linear.

    Then logits are the clean logits plus, for each replaced head, its change read out through
    ``W_O[h] @ W_U``: ``(values_h - z_h) @ W_O[h] @ W_U`` (``[s, T, n_out]`` per head). No copy
    of the residual stream is made, so all single-head ablations cost about one forward.
    """
    attn = model.blocks[layer].attn
    clean = model._unembed(model.blocks[layer].after_attention(resid_pre, attn.output_from_z(z)))
    s, T = z.shape[:2]
    readout = attn.W_O @ model.W_U  # (h, d_head, n_out)
    change = torch.einsum("sthd,hdv->hstv", values - z, readout)  # (h, s, T, n_out)
    weights = copy_masks.to(change.dtype)  # (c, h)
    logits = clean.reshape(s, T, -1)[None] + torch.einsum("ch,hstv->cstv", weights, change)
    return logits.reshape(len(copy_masks), *clean.shape)  # the model's shape: (c, s, T, [k,] V)


_TIE_TOLERANCE = 1e-4
"""Relative top-2 logit margin below which the linear readout's rounding could pick another
argmax than the model's own forward (hand-built models have exact ties)."""


def _near_ties(logits: Float[Tensor, "c s T *out"], part: Batch) -> Bool[Tensor, "c s"]:
    """Copies x sequences with a scored position whose best two logits are nearly equal."""
    c, s, T = logits.shape[:3]
    k = part.n_targets
    grouped = logits.reshape(c, s, T, k, -1)
    low, high = torch.aminmax(grouped, dim=-1)  # (c, s, T, k); cheaper than topk(2)
    tolerance = _TIE_TOLERANCE * (1.0 + torch.maximum(high.abs(), low.abs()))
    contenders = (grouped >= (high - tolerance)[..., None]).sum(-1)  # the max counts itself
    scored = (part.targets.reshape(s, T, k) != IGNORE_INDEX) & part.mask[..., None]
    return ((contenders >= 2) & scored).any(dim=(2, 3))


def _clean_resid_and_z(
    model: HookedMHATransformer, part: Batch, layer: int
) -> tuple[Float[Tensor, "s T d_model"], Float[Tensor, "s T h d_head"]]:
    """Layer ``layer``'s clean ``hook_resid_pre`` and ``hook_z`` on ``part``."""
    names = (f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z")
    _, cache = model.run_with_cache(part.tokens, part.padding_mask, names_filter=list(names))
    return cache[names[0]], cache[names[1]]


def _masks_for(
    model: HookedMHATransformer, configurations: Sequence[Sequence[tuple[int, int]]]
) -> Bool[Tensor, "C L h"]:
    masks = torch.zeros(
        len(configurations), model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool
    )
    for c, pairs in enumerate(configurations):
        for layer, h in pairs:
            masks[c, layer, h] = True
    return masks


def _evaluate_configurations(
    model: HookedMHATransformer,
    batch: Batch,
    configurations: Sequence[Sequence[tuple[int, int]]],
    replacement: _Replacement,
    target_names: Sequence[str],
    *,
    max_rows: int,
    progress: bool,
    desc: str,
) -> list[dict[str, float]]:
    masks = _masks_for(model, configurations)
    sums = _masked_sums(
        model, batch, masks, replacement, max_rows=max_rows, progress=progress, desc=desc
    )
    return sums.metrics(target_names)


@dataclass
class _Setup:
    """What every table function needs: the checked batch, target names, the replacement."""

    batch: Batch
    target_names: list[str]
    replacement: _Replacement


def _setup(
    model: HookedMHATransformer,
    task_or_batch: Task | Batch,
    method: str,
    reference: Task | Batch | None,
    generator: torch.Generator | None,
    eval_size: int,
) -> _Setup:
    method = check_method(method)
    batch = _check_batch(model, _as_batch(task_or_batch, eval_size))
    ref = _reference_batch(reference, eval_size) if reference is not None else batch
    replacement = _build_replacement(model, method, ref, generator)
    return _Setup(batch, _target_names(model, task_or_batch), replacement)


def _with_deltas(
    metrics: dict[str, float], baseline: dict[str, float], names: Sequence[str]
) -> dict[str, float]:
    """``metric`` and ``delta_metric = metric - baseline`` for each name, in that order."""
    out: dict[str, float] = {}
    for name in names:
        out[name] = metrics[name]
    for name in names:
        out[f"delta_{name}"] = metrics[name] - baseline[name]
    return out


# ----------------------------------------------------------------------------- head_importance


def head_importance(
    model: HookedMHATransformer,
    task_or_batch: Task | Batch,
    method: str = "zero",
    reference: Task | Batch | None = None,
    *,
    generator: torch.Generator | None = None,
    eval_size: int = 1024,
    max_rows: int = DEFAULT_MAX_ROWS,
    progress: bool = False,
) -> pd.DataFrame:
    """Loss and accuracy with each head ablated alone, all heads in one batched pass.

    Args:
        model: The model.
        task_or_batch: A Task (its fixed evaluation set of ``eval_size`` sequences) or a Batch.
        method: ``"zero"``, ``"mean"`` or ``"resample"``.
        reference: Where mean/resample activations come from; default: the evaluated batch.
        generator: The resample permutation (seed 0 when None), as in :func:`ablate`.
        eval_size: Size of the task's evaluation set when a Task is given.
        max_rows: Most rows (copies x sequences) per forward; bounds memory.
        progress: Show a progress bar.

    Returns:
        One row per head (layer-major) with columns ``head_label, layer, head, method, loss,
        accuracy, [accuracy/<target>...], delta_loss, delta_accuracy,
        [delta_accuracy/<target>...], baseline_loss, baseline_accuracy``. ``delta_x`` is the
        ablated minus the unablated value (a harmful ablation has ``delta_loss > 0`` and
        ``delta_accuracy < 0``). Per-target columns appear for multi-target models only. The
        table equals ablating each head with :func:`ablate` and calling
        ``training.evaluate`` (to float rounding).

    Example:
        >>> head_importance(model, task, method="mean")  # doctest: +SKIP
    """
    setup = _setup(model, task_or_batch, method, reference, generator, eval_size)
    heads = _all_heads(model)
    configurations = [[], *([pair] for pair in heads)]  # copy 0 is the clean model
    results = _evaluate_configurations(
        model,
        setup.batch,
        configurations,
        setup.replacement,
        setup.target_names,
        max_rows=max_rows,
        progress=progress,
        desc=f"importance ({method})",
    )
    baseline, names = results[0], _metric_names(setup.target_names)
    rows = []
    for (layer, h), metrics in zip(heads, results[1:], strict=True):
        rows.append(
            {
                "head_label": head_label(layer, h),
                "layer": layer,
                "head": h,
                "method": method,
                **_with_deltas(metrics, baseline, names),
                "baseline_loss": baseline["loss"],
                "baseline_accuracy": baseline["accuracy"],
            }
        )
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- head sets


def ablate_sets(
    model: HookedMHATransformer,
    task_or_batch: Task | Batch,
    head_sets: Sequence[str | Sequence[HeadSpec]],
    method: str = "zero",
    reference: Task | Batch | None = None,
    *,
    generator: torch.Generator | None = None,
    eval_size: int = 1024,
    max_rows: int = DEFAULT_MAX_ROWS,
    progress: bool = False,
) -> pd.DataFrame:
    """Loss and accuracy with each given set of heads ablated together, in one batched pass.

    Args:
        model, task_or_batch, method, reference, generator, eval_size, max_rows, progress:
            As in :func:`head_importance`.
        head_sets: Sets of heads to ablate together (each: labels like ``"L0H1"``, ``(layer,
            head)`` pairs, or one comma-separated string); an empty set is the clean model.

    Returns:
        One row per set, in order, with columns ``heads`` (labels joined by ``;``),
        ``n_ablated``, ``method``, the metrics and their ``delta_`` (ablated minus clean), as
        in :func:`head_importance`. Equal to :func:`ablate` + ``training.evaluate`` per set.

    Example:
        >>> ablate_sets(model, task, [["L0H0", "L0H1"], ["L0H2"]], method="mean")  # doctest: +SKIP
    """
    if isinstance(head_sets, str) or not isinstance(head_sets, Sequence):
        raise TypeError(
            "head_sets must be a list of head sets, e.g. [['L0H0', 'L0H1'], ['L0H2']] or "
            f"['L0H0,L0H1', 'L0H2'], got {head_sets!r}"
        )
    resolved = [resolve_heads(model, heads) if len(heads) else [] for heads in head_sets]
    setup = _setup(model, task_or_batch, method, reference, generator, eval_size)
    results = _evaluate_configurations(
        model,
        setup.batch,
        [[], *resolved],
        setup.replacement,
        setup.target_names,
        max_rows=max_rows,
        progress=progress,
        desc=f"ablate sets ({method})",
    )
    baseline, names = results[0], _metric_names(setup.target_names)
    rows = [
        {
            "heads": ";".join(head_label(layer, h) for layer, h in pairs),
            "n_ablated": len(pairs),
            "method": method,
            **_with_deltas(metrics, baseline, names),
        }
        for pairs, metrics in zip(resolved, results[1:], strict=True)
    ]
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- pairwise


def _damage(metric: str, ablated: float, baseline: float) -> float:
    """Harm done: loss increase, or accuracy drop (positive = worse)."""
    return ablated - baseline if metric == "loss" else baseline - ablated


def pairwise_ablation(
    model: HookedMHATransformer,
    task_or_batch: Task | Batch,
    method: str = "zero",
    reference: Task | Batch | None = None,
    *,
    heads: str | Sequence[HeadSpec] | None = None,
    generator: torch.Generator | None = None,
    eval_size: int = 1024,
    max_rows: int = DEFAULT_MAX_ROWS,
    progress: bool = False,
) -> pd.DataFrame:
    """Joint ablation of every pair of heads against the sum of their single ablations.

    All single and pair ablations run in one batched pass. Effects are *damage*: the loss
    increase (``loss``) or the accuracy drop (``accuracy``, ``accuracy/<target>``), so positive
    means the ablation hurts. ``interaction = damage_joint - (damage_a + damage_b)``:

    - ``interaction >> 0``: removing both hurts far more than the two removals added up, i.e.
      each head can stand in for the other (redundancy, backup heads);
    - ``interaction << 0``: the heads' harms overlap (e.g. both are needed together);
    - ``interaction ~ 0``: the heads act independently.

    Args:
        model, task_or_batch, method, reference, generator, eval_size, max_rows, progress:
            As in :func:`head_importance`.
        heads: The heads to pair up (default: all heads of the model).

    Returns:
        Tidy DataFrame, one row per unordered pair ``head_a < head_b`` (layer-major order) and
        metric, with columns ``head_a, head_b, layer_a, layer_b, method, metric, baseline,
        ablated_a, ablated_b, ablated_joint, damage_a, damage_b, damage_joint, damage_sum,
        interaction``. ``metric`` is ``loss``, ``accuracy`` and, on multi-target models,
        ``accuracy/<target>``.

    Example:
        >>> pairs = pairwise_ablation(model, task)  # doctest: +SKIP
        >>> pairs.query("metric == 'accuracy'").sort_values("interaction").tail(1)  # doctest: +SKIP
    """
    setup = _setup(model, task_or_batch, method, reference, generator, eval_size)
    chosen = _all_heads(model) if heads is None else resolve_heads(model, heads)
    pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
    configurations = [[], *([h] for h in chosen), *([a, b] for a, b in pairs)]
    results = _evaluate_configurations(
        model,
        setup.batch,
        configurations,
        setup.replacement,
        setup.target_names,
        max_rows=max_rows,
        progress=progress,
        desc=f"pairwise ({method})",
    )
    baseline, single = results[0], dict(zip(chosen, results[1 : 1 + len(chosen)], strict=True))
    rows = []
    for (a, b), joint in zip(pairs, results[1 + len(chosen) :], strict=True):
        for metric in _metric_names(setup.target_names):
            base = baseline[metric]
            damage_a = _damage(metric, single[a][metric], base)
            damage_b = _damage(metric, single[b][metric], base)
            damage_joint = _damage(metric, joint[metric], base)
            rows.append(
                {
                    "head_a": head_label(*a),
                    "head_b": head_label(*b),
                    "layer_a": a[0],
                    "layer_b": b[0],
                    "method": method,
                    "metric": metric,
                    "baseline": base,
                    "ablated_a": single[a][metric],
                    "ablated_b": single[b][metric],
                    "ablated_joint": joint[metric],
                    "damage_a": damage_a,
                    "damage_b": damage_b,
                    "damage_joint": damage_joint,
                    "damage_sum": damage_a + damage_b,
                    "interaction": damage_joint - (damage_a + damage_b),
                }
            )
    columns = [
        "head_a",
        "head_b",
        "layer_a",
        "layer_b",
        "method",
        "metric",
        "baseline",
        "ablated_a",
        "ablated_b",
        "ablated_joint",
        "damage_a",
        "damage_b",
        "damage_joint",
        "damage_sum",
        "interaction",
    ]
    return pd.DataFrame(rows, columns=columns)


# ----------------------------------------------------------------------------- gradients


def _per_sequence_loss(
    logits: Tensor, batch: Batch
) -> tuple[Float[Tensor, " s"], Bool[Tensor, " s"]]:
    """Mean cross-entropy of each sequence over its scored pairs, and which have any."""
    s, T = batch.tokens.shape
    k, V = batch.n_targets, logits.shape[-1]
    targets = batch.targets.reshape(s, T, k)
    scored = (targets != IGNORE_INDEX) & batch.mask[..., None]  # (s, T, k)
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, V), targets.clamp(min=0).reshape(-1), reduction="none"
    ).reshape(s, T, k)
    counts = scored.sum((1, 2))  # (s,)
    per_seq = torch.where(scored, nll, 0.0).sum((1, 2)) / counts.clamp(min=1)
    return per_seq, counts > 0


def _gate_hook(z: Tensor, hook: Any, *, xi: Float[Tensor, "s h"]) -> Tensor:
    return z * xi[:, None, :, None]


def gradient_importance(
    model: HookedMHATransformer,
    task_or_batch: Task | Batch,
    *,
    normalize: bool = True,
    eval_size: int = 1024,
    batch_size: int = 512,
    progress: bool = False,
) -> pd.DataFrame:
    """Michel et al. (2019) head importance: ``I_h = E_x |dL(x)/d xi_h|``.

    A gate ``xi_h = 1`` multiplies each head's ``hook_z``; ``I_h`` is the absolute derivative of
    a sequence's loss (mean cross-entropy over its scored positions) with respect to the gate,
    averaged over sequences. Each sequence gets its own gate, so one backward pass gives every
    per-sequence derivative exactly. As in the paper, scores are then normalised within each
    layer by their L2 norm (a layer whose scores are all 0 stays 0). The model's parameter
    gradients are not touched.

    Args:
        model: The model.
        task_or_batch: A Task (its fixed evaluation set) or a Batch.
        normalize: Divide each layer's scores by their L2 norm.
        eval_size: Size of the task's evaluation set when a Task is given.
        batch_size: Sequences per forward/backward.
        progress: Show a progress bar.

    Returns:
        One row per head with columns ``head_label, layer, head, importance`` (normalised if
        ``normalize``) and ``raw_importance`` (``E|dL/d xi|`` before normalising).

    Example:
        >>> gradient_importance(model, task).sort_values("importance")  # doctest: +SKIP
    """
    batch = _check_batch(model, _as_batch(task_or_batch, eval_size))
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid; must be an integer >= 1")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    total = torch.zeros(L, H, dtype=torch.float64)
    n_sequences = 0
    was_training = model.training
    model.eval()
    try:
        starts = range(0, len(batch), batch_size)
        for start in tqdm(starts, desc="gradient importance", disable=not progress, leave=False):
            part = batch[start : start + batch_size]
            grads, has_scored = _gate_gradients(model, part)  # (s, L, H), (s,)
            total += grads[has_scored].abs().double().sum(0).cpu()
            n_sequences += int(has_scored.sum())
    finally:
        model.train(was_training)
    raw = total / max(1, n_sequences)  # (L, H)
    scores = raw / raw.norm(dim=1, keepdim=True).clamp(min=1e-30) if normalize else raw
    rows = [
        {
            "head_label": head_label(layer, h),
            "layer": layer,
            "head": h,
            "importance": float(scores[layer, h]),
            "raw_importance": float(raw[layer, h]),
        }
        for layer, h in _all_heads(model)
    ]
    return pd.DataFrame(rows)


def _gate_gradients(model: HookedMHATransformer, part: Batch) -> tuple[Tensor, Tensor]:
    """d(loss of sequence i)/d(gate of head h in sequence i), for every i and head."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    xi = torch.ones(len(part), L, H, device=_device(model), requires_grad=True)
    hooks = [
        (f"blocks.{layer}.attn.hook_z", partial(_gate_hook, xi=xi[:, layer])) for layer in range(L)
    ]
    with model.hooks(fwd_hooks=hooks):
        logits = model.logits(part.tokens, part.padding_mask)
    per_seq, has_scored = _per_sequence_loss(logits, part)
    # Sequence i's loss depends only on its own gates, so the gradient of the sum is per-sequence.
    (grads,) = torch.autograd.grad(per_seq.sum(), xi)
    return grads.detach(), has_scored


def compare_importance(
    gradient: pd.DataFrame,
    ablation: pd.DataFrame,
    *,
    ablation_column: str = "delta_loss",
    gradient_column: str = "importance",
) -> pd.DataFrame:
    """Gradient and ablation importance side by side, per head and ablation method.

    Args:
        gradient: From :func:`gradient_importance`.
        ablation: From :func:`head_importance` (one or several methods, stacked).
        ablation_column: The ablation score (default ``delta_loss``: loss increase).
        gradient_column: The gradient score (default the layer-normalised ``importance``).

    Returns:
        Columns ``head_label, layer, head, method, gradient_importance, ablation_importance,
        gradient_rank, ablation_rank`` (rank 1 = most important, within each method).

    Example:
        >>> compare_importance(gradient_importance(m, t), head_importance(m, t))  # doctest: +SKIP
    """
    for name, df, column in (
        ("gradient", gradient, gradient_column),
        ("ablation", ablation, ablation_column),
    ):
        if column not in df.columns:
            raise ValueError(
                f"{name} table has no column {column!r}; columns: {', '.join(map(str, df.columns))}"
            )
    left = gradient[["head_label", "layer", "head", gradient_column]].rename(
        columns={gradient_column: "gradient_importance"}
    )
    right = ablation[["head_label", "method", ablation_column]].rename(
        columns={ablation_column: "ablation_importance"}
    )
    merged = left.merge(right, on="head_label", how="inner", validate="one_to_many")
    by_method = merged.groupby("method", sort=False)
    merged["gradient_rank"] = by_method["gradient_importance"].rank(ascending=False, method="min")
    merged["ablation_rank"] = by_method["ablation_importance"].rank(ascending=False, method="min")
    method_order = {m: i for i, m in enumerate(dict.fromkeys(ablation["method"]))}
    return merged.sort_values(
        ["method", "layer", "head"], key=lambda c: c.map(method_order) if c.name == "method" else c
    ).reset_index(drop=True)


def importance_agreement(
    gradient: pd.DataFrame,
    ablation: pd.DataFrame,
    *,
    ablation_column: str = "delta_loss",
    gradient_column: str = "importance",
) -> pd.DataFrame:
    """Spearman rank correlation between gradient and ablation importance, per method.

    Returns:
        One row per ablation method with columns ``method, ablation_column, gradient_column,
        spearman, p_value, n_heads``. ``spearman`` is NaN when either score is constant.

    Example:
        >>> importance_agreement(gradient_importance(m, t), head_importance(m, t))  # doctest: +SKIP
    """
    merged = compare_importance(
        gradient, ablation, ablation_column=ablation_column, gradient_column=gradient_column
    )
    rows = []
    for method, group in merged.groupby("method", sort=False):
        rho, p_value = _spearman(group["gradient_importance"], group["ablation_importance"])
        rows.append(
            {
                "method": method,
                "ablation_column": ablation_column,
                "gradient_column": gradient_column,
                "spearman": rho,
                "p_value": p_value,
                "n_heads": len(group),
            }
        )
    return pd.DataFrame(rows)


def _spearman(x: pd.Series, y: pd.Series) -> tuple[float, float]:
    if len(x) < 2 or x.nunique() < 2 or y.nunique() < 2:
        return float("nan"), float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = stats.spearmanr(x, y)
    return float(result.statistic), float(result.pvalue)


# ----------------------------------------------------------------------------- pruning


def prune_curve(
    model: HookedMHATransformer,
    task_or_batch: Task | Batch,
    method: str = "zero",
    reference: Task | Batch | None = None,
    *,
    by: str = "loss",
    rescore: bool = True,
    generator: torch.Generator | None = None,
    eval_size: int = 1024,
    max_rows: int = DEFAULT_MAX_ROWS,
    progress: bool = False,
) -> pd.DataFrame:
    """Greedy pruning: remove the least important head, re-score the rest, repeat.

    At every step each remaining head is scored by ablating it *together with* the heads
    already removed (one batched pass per step); the one whose removal hurts least goes.

    Args:
        model, task_or_batch, method, reference, generator, eval_size, max_rows, progress:
            As in :func:`head_importance`.
        by: ``"loss"`` (least important = lowest loss after removal) or ``"accuracy"``
            (highest accuracy; ties broken by lower loss).
        rescore: Re-score after every removal (True) or remove in the order of the first
            scoring, as in Michel et al. (False).

    Returns:
        One row per step, from all heads (step 0, the clean model) to none, with columns
        ``step, n_heads_left, removed, pruned, method, loss, accuracy,
        [accuracy/<target>...]``. ``removed`` is the head removed at that step ("" at step 0)
        and ``pruned`` the comma-separated heads removed so far.

    Example:
        >>> curve = prune_curve(model, task, method="mean")  # doctest: +SKIP
        >>> curve[["n_heads_left", "accuracy"]]  # doctest: +SKIP
    """
    if by not in ("loss", "accuracy"):
        raise ValueError(f"by={by!r} is invalid; allowed: 'loss', 'accuracy'")
    setup = _setup(model, task_or_batch, method, reference, generator, eval_size)
    run = partial(
        _evaluate_configurations,
        model,
        setup.batch,
        replacement=setup.replacement,
        target_names=setup.target_names,
        max_rows=max_rows,
        progress=False,
    )
    heads = _all_heads(model)
    baseline = run([[]], desc="prune")[0]
    rows = [_prune_row(0, len(heads), "", [], method, baseline)]
    if not rescore:
        # Michel et al.: one scoring, then remove in that order (one batched pass).
        singles = run([[h] for h in heads], desc="prune")
        order = [
            heads[i] for i in sorted(range(len(heads)), key=lambda i: _rank_key(singles[i], by))
        ]
        cumulative = run([order[: i + 1] for i in range(len(order))], desc="prune")
        for i, metrics in enumerate(cumulative):
            rows.append(
                _prune_row(
                    i + 1,
                    len(heads) - i - 1,
                    head_label(*order[i]),
                    order[: i + 1],
                    method,
                    metrics,
                )
            )
        return pd.DataFrame(rows)
    remaining, pruned = list(heads), []
    for _ in tqdm(heads, desc=f"prune ({method})", disable=not progress, leave=False):
        candidates = run([[*pruned, h] for h in remaining], desc="prune")
        # Least important: its removal hurts least (ties: the first in layer-major order).
        pick = min(range(len(remaining)), key=lambda i: _rank_key(candidates[i], by))
        pruned.append(remaining.pop(pick))
        rows.append(
            _prune_row(
                len(pruned),
                len(remaining),
                head_label(*pruned[-1]),
                pruned,
                method,
                candidates[pick],
            )
        )
    return pd.DataFrame(rows)


def _rank_key(metrics: dict[str, float], by: str) -> tuple[float, ...]:
    """Sort key of a removal: by loss, or by accuracy (higher first) then loss."""
    return (metrics["loss"],) if by == "loss" else (-metrics["accuracy"], metrics["loss"])


def _prune_row(
    step: int,
    n_left: int,
    removed: str,
    pruned: list[tuple[int, int]],
    method: str,
    metrics: dict[str, float],
) -> dict[str, Any]:
    return {
        "step": step,
        "n_heads_left": n_left,
        "removed": removed,
        "pruned": ",".join(head_label(*p) for p in pruned),
        "method": method,
        **metrics,
    }


# ----------------------------------------------------------------------------- Ablator


class Ablator:
    """Interactive ablation for notebooks and the terminal: toggle heads, see the metrics.

    The evaluation batch, the unablated baseline and each method's reference activations are
    computed once and cached, so an update costs one forward pass over the evaluation batch
    (a few milliseconds on a d_model=64, 8-head model with 1024 sequences).

    Args:
        model: The model.
        task_or_batch: A Task (its fixed evaluation set of ``eval_size`` sequences) or a Batch.
        method: Initial method (``"zero"``, ``"mean"``, ``"resample"``); change with ``.method``.
        reference: Mean/resample reference; default: the evaluation batch.
        generator: Resample permutation (seed 0 when None).
        eval_size: Size of the task's evaluation set when a Task is given.

    Attributes:
        batch_: The cached evaluation batch.
        baseline_: Metrics of the unablated model (``loss, accuracy, [accuracy/<target>]``).

    Example:
        >>> ab = Ablator(model, task)  # doctest: +SKIP
        >>> ab.toggle("L0H2").evaluate()["delta_accuracy"]  # doctest: +SKIP
        >>> ab.method = "mean"; ab.set(["L0H1", "L0H3"]).evaluate()  # doctest: +SKIP
        >>> ab.reset().evaluate() == {**ab.baseline_, ...}  # doctest: +SKIP
    """

    def __init__(
        self,
        model: HookedMHATransformer,
        task_or_batch: Task | Batch,
        *,
        method: str = "zero",
        reference: Task | Batch | None = None,
        generator: torch.Generator | None = None,
        eval_size: int = 1024,
    ) -> None:
        self.model = model
        self._method = check_method(method)
        self.batch_ = _check_batch(model, _as_batch(task_or_batch, eval_size))
        self.target_names_ = _target_names(model, task_or_batch)
        ref = _reference_batch(reference, eval_size)
        self._reference = self.batch_ if ref is None else ref
        self._seed_state = _resample_generator(generator).get_state()
        self._replacements: dict[str, _Replacement] = {}
        self._results: dict[tuple[str, tuple[tuple[int, int], ...]], dict[str, float]] = {}
        self._heads: list[tuple[int, int]] = []
        self.baseline_ = self._metrics_for("zero", ())

    # -- state ---------------------------------------------------------------------------------
    @property
    def method(self) -> str:
        """The ablation method; assigning checks it (``ab.method = "mean"``)."""
        return self._method

    @method.setter
    def method(self, value: str) -> None:
        self._method = check_method(value)

    @property
    def heads(self) -> list[str]:
        """Labels of the heads currently ablated, layer-major."""
        return [head_label(*pair) for pair in self._heads]

    @property
    def valid_heads(self) -> list[str]:
        """Every head label of the model."""
        return self.model.head_labels

    def toggle(self, *heads: str | Sequence[HeadSpec]) -> Ablator:
        """Flip each given head between ablated and not; returns self for chaining."""
        flips = [pair for spec in heads for pair in resolve_heads(self.model, spec)]
        current = set(self._heads)
        for pair in flips:
            current ^= {pair}
        self._heads = sorted(current)
        return self

    def set(self, heads: str | Sequence[HeadSpec]) -> Ablator:
        """Ablate exactly ``heads`` (``[]`` for none); returns self."""
        self._heads = resolve_heads(self.model, heads)
        return self

    def reset(self) -> Ablator:
        """Ablate no heads (the method is kept); returns self."""
        self._heads = []
        return self

    # -- results -------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Metrics with the current heads ablated, and ``delta_<metric>`` from the baseline.

        Returns:
            ``{"loss", "accuracy", ["accuracy/<target>"...], "delta_loss", "delta_accuracy",
            ...}``. With no heads ablated the metrics equal ``baseline_`` exactly and the
            deltas are 0.
        """
        metrics = self._metrics_for(self._method, tuple(self._heads))
        return _with_deltas(metrics, self.baseline_, _metric_names(self.target_names_))

    def table(self) -> pd.DataFrame:
        """The current result as a table: columns ``metric, baseline, ablated, delta``."""
        result = self.evaluate()
        return pd.DataFrame(
            [
                {
                    "metric": name,
                    "baseline": self.baseline_[name],
                    "ablated": result[name],
                    "delta": result[f"delta_{name}"],
                }
                for name in _metric_names(self.target_names_)
            ]
        )

    def __repr__(self) -> str:
        heads = ", ".join(self.heads) or "none"
        return f"Ablator(method={self._method!r}, heads=[{heads}])"

    def _metrics_for(self, method: str, heads: tuple[tuple[int, int], ...]) -> dict[str, float]:
        key = (method if heads else "none", heads)
        if key not in self._results:
            sums = _masked_sums(
                self.model, self.batch_, _masks_for(self.model, [heads]), self._replacement(method)
            )
            self._results[key] = sums.metrics(self.target_names_)[0]
        return dict(self._results[key])

    def _replacement(self, method: str) -> _Replacement:
        if method not in self._replacements:
            generator = torch.Generator()
            generator.set_state(self._seed_state)
            self._replacements[method] = _build_replacement(
                self.model, method, self._reference, generator
            )
        return self._replacements[method]


# ----------------------------------------------------------------------------- all tables


def ablation_tables(
    run_or_model: Any,
    task: Task | Batch | None = None,
    *,
    method: str = "mean",
    methods: Sequence[str] = METHODS,
    eval_size: int = 1024,
    progress: bool = False,
) -> dict[str, pd.DataFrame]:
    """Every ablation table for a run (or a model and its task), ready to save as CSV.

    Args:
        run_or_model: A ``training.Run`` (uses its model and task) or a model.
        task: The Task or Batch to evaluate on; required with a model, optional with a Run.
        method: The method for the pairwise and pruning tables.
        methods: The methods for the importance table (stacked, one block per method).
        eval_size: Size of the task's evaluation set.
        progress: Show progress bars.

    Returns:
        ``{"importance": head_importance for each of methods, "pairwise": pairwise_ablation,
        "gradient_importance": gradient_importance, "importance_agreement":
        importance_agreement (per method), "prune_curve": prune_curve}``.

    Example:
        >>> tables = ablation_tables(load_run("runs/x/h4_seed0"))  # doctest: +SKIP
        >>> for name, df in tables.items():  # doctest: +SKIP
        ...     write_csv(run.path / "analysis" / f"{name}.csv", df)
    """
    model, task = _unpack_run(run_or_model, task)
    importance = pd.concat(
        [
            head_importance(model, task, m, eval_size=eval_size, progress=progress)
            for m in [check_method(m) for m in methods]
        ],
        ignore_index=True,
    )
    gradient = gradient_importance(model, task, eval_size=eval_size, progress=progress)
    return {
        "importance": importance,
        "pairwise": pairwise_ablation(model, task, method, eval_size=eval_size, progress=progress),
        "gradient_importance": gradient,
        "importance_agreement": importance_agreement(gradient, importance),
        "prune_curve": prune_curve(model, task, method, eval_size=eval_size, progress=progress),
    }


def _unpack_run(
    run_or_model: Any, task: Task | Batch | None
) -> tuple[HookedMHATransformer, Task | Batch]:
    if isinstance(run_or_model, HookedMHATransformer):
        if task is None:
            raise ValueError("task= is required when a model (not a Run) is given")
        return run_or_model, task
    model, run_task = getattr(run_or_model, "model", None), getattr(run_or_model, "task", None)
    if not isinstance(model, HookedMHATransformer):
        raise TypeError(
            f"run_or_model must be a training.Run or a HookedMHATransformer, got "
            f"{type(run_or_model).__name__}"
        )
    return model, task if task is not None else run_task
