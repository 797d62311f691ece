"""What an ablated head's ``hook_z`` becomes: the methods, their replacement values, and the
clean capture of the reference they come from (see :mod:`mhainterp.ablation.engine`).

- ``"zero"``: 0; ``"mean"``: the reference's per-position mean over real tokens; ``"resample"``:
  another reference sequence's z (a single-cycle permutation, so never its own: a reference of
  one sequence is refused, its ablation would equal the clean run).
- :func:`capture_z` runs the reference clean once; :class:`ReferencePrefix` keeps that run's
  prefixes when the reference is also the evaluated batch, so the engine does not repeat it.
- The chunk sizes both that capture and the engine's passes use live here too.

Shapes: m reference sequences, T positions, h heads, L layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.data import batch_for_model
from mhainterp.model import StopForward
from mhainterp.protocol import HookedModel
from mhainterp.runtime import DRAW_DEVICE, eval_mode
from mhainterp.tasks import Batch
from mhainterp.validation import ParameterError, check_option, check_type, invalid

__all__ = [
    "DEFAULT_MAX_ROWS",
    "FULL_FORWARD_ROWS",
    "LINEAR_READOUT_ROWS",
    "METHODS",
    "RESAMPLE_SEED",
    "CleanCache",
    "Method",
    "ReferencePrefix",
    "Replacement",
    "build_replacement",
    "capture_z",
    "check_method",
]

Method = Literal["zero", "mean", "resample"]
METHODS: tuple[Method, ...] = get_args(Method)
"""The ablation methods (see the module docstring), spelled once, in the ``Method`` type. An
order with a primary method first derives from it: ``(primary, *[m for m in METHODS if m !=
primary])``; ``mhainterp.cli.static.ABLATION_METHODS`` mirrors it for ``--help``."""

DEFAULT_MAX_ROWS: int | None = None
"""Rows (copies x sequences) per forward when none is asked: ``FULL_FORWARD_ROWS`` where the
copies run the rest of the network, ``LINEAR_READOUT_ROWS`` on the linear-readout fast path."""
FULL_FORWARD_ROWS = 512
"""Measured (analysis/benchmark.py, 2 x 16 heads, 1,024 sequences, 2 cores): 0.93x a plain
forward per configuration at 512 rows, 1.1x at 1,024, 1.5x at 2,048 and 1.9x at 16,384; big
chunks leave the cache and the allocator returns their memory to the system every time."""
LINEAR_READOUT_ROWS = 16384
"""The fast path's copies are one einsum each; there big chunks win (3.3 vs 6.0 ms at 1,024)."""
RESAMPLE_SEED = 0


def check_method(method: Any) -> Method:
    """``method`` if it is one of :data:`METHODS`.

    Example:
        >>> check_method("mean")
        'mean'
    """
    return check_option("method", method, METHODS)


# ----------------------------------------------------------------------------- replacements


@dataclass
class Replacement:
    """What an ablated head's z becomes, per layer (see the module docstring)."""

    method: Method
    mean_z: list[Float[Tensor, "T h d_head"]] | None = None
    donor_z: list[Float[Tensor, "m T h d_head"]] | None = None
    donor_real: Bool[Tensor, "m T"] | None = None
    sigma: Int[Tensor, " m"] | None = None
    reference_prefix: ReferencePrefix | None = None

    def values(
        self, layer: int, rows: Int[Tensor, " s"], z: Float[Tensor, "s T h d_head"]
    ) -> Tensor:
        """Replacement z for rows ``rows`` of the evaluated batch, broadcastable to ``z``."""
        T = z.shape[1]
        if self.method == "zero":
            return z.new_zeros(())
        mean = self.mean_z[layer]
        if mean.shape[0] < T:
            raise ParameterError(
                f"reference is invalid: a batch at least as long as the ablated one ({T} "
                f"positions), got {mean.shape[0]} positions"
            )
        mean = mean[:T].to(z.dtype)  # (T, h, d_head)
        if self.method == "mean":
            return mean[None]  # (1, T, h, d_head)
        donors = self.sigma[rows % self.sigma.shape[0]]  # (s,)
        donor = self.donor_z[layer][donors, :T].to(z.dtype)  # (s, T, h, d_head)
        real = self.donor_real[donors, :T, None, None]  # (s, T, 1, 1)
        return torch.where(real, donor, mean[None])

    def replace_heads(
        self,
        z: Float[Tensor, "s T h d_head"],
        hook: Any,
        *,
        layer: int,
        head_mask: Bool[Tensor, " h"],
        rows: Int[Tensor, " s"] | None = None,
    ) -> Tensor:
        """The ``hook_z`` hook of one layer: ``z`` with the heads of ``head_mask`` replaced by
        :meth:`values`; ``rows`` are the evaluated batch's rows that ``z`` holds (None: all,
        in order). The batched engine's copies use :meth:`values` directly, per copy."""
        if rows is None:
            rows = torch.arange(z.shape[0], device=z.device)
        return torch.where(head_mask[None, None, :, None], self.values(layer, rows, z), z)


def capture_z(
    model: HookedModel,
    batch: Batch,
    max_rows: int | None = None,
    resid_pre: list | None = None,
    patterns: list | None = None,
    pattern_rows: int = 0,
) -> list[Float[Tensor, "m T h d_head"]]:
    """Every layer's clean ``hook_z`` on ``batch``, in chunks of ``max_rows`` sequences (the
    forward stops at the last layer's ``hook_z``).

    ``resid_pre``: an empty list to receive every layer's clean ``hook_resid_pre`` of the same
    forward (``[m, T, d_model]`` each), when ``batch`` is one chunk; left empty otherwise.
    ``patterns``: an empty list to receive every layer's ``hook_pattern`` of the first
    ``pattern_rows`` sequences (``[rows, h, T, T]`` each), so that a caller who also wants the
    patterns needs no forward of its own.
    """
    max_rows = max_rows or LINEAR_READOUT_ROWS
    n_layers = model.cfg.n_layers
    chunks: list[list[Tensor]] = [[] for _ in range(n_layers)]
    resids: list[Tensor | None] = [None] * n_layers
    one_chunk = resid_pre is not None and len(batch) <= max_rows
    seen: list[list[Tensor]] = [[] for _ in range(n_layers)]  # pattern chunks, per layer
    stop = StopForward()

    wants_patterns = patterns is not None and pattern_rows > 0
    last = n_layers - 1
    # A bridge fires a layer's hook_pattern after its hook_z: the forward stops once the last
    # layer has given both what is kept of it (ours fires the pattern first).
    pending: set[str] = set()

    def done(what: str) -> None:
        pending.discard(what)
        if not pending:  # the rest of the forward is not needed
            raise stop

    def keep(z: Tensor, hook: Any, layer: int) -> None:
        chunks[layer].append(z.detach())
        if layer == last:
            done("z")

    def keep_resid(resid: Tensor, hook: Any, layer: int) -> None:
        resids[layer] = resid.detach()

    def keep_pattern(pattern: Tensor, hook: Any, layer: int) -> None:
        missing = pattern_rows - sum(len(p) for p in seen[layer])
        if missing > 0:
            seen[layer].append(pattern[:missing].detach().clone())
        if layer == last:
            done("pattern")

    hooks = [(f"blocks.{lay}.attn.hook_z", partial(keep, layer=lay)) for lay in range(n_layers)]
    if one_chunk:
        hooks += [
            (f"blocks.{lay}.hook_resid_pre", partial(keep_resid, layer=lay))
            for lay in range(n_layers)
        ]
    if wants_patterns:
        hooks += [
            (f"blocks.{lay}.attn.hook_pattern", partial(keep_pattern, layer=lay))
            for lay in range(n_layers)
        ]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for start in range(0, len(batch), max_rows):
            part = batch[start : start + max_rows]
            pending.update(["z", "pattern"] if wants_patterns else ["z"])
            with stop:
                model.logits(part.tokens, part.padding_mask)
    if one_chunk:
        resid_pre.extend(resids)
    if wants_patterns:
        patterns.extend(torch.cat(layer_chunks) for layer_chunks in seen)
    return [torch.cat(layer_chunks) for layer_chunks in chunks]


@dataclass
class ReferencePrefix:
    """The reference's clean ``(hook_resid_pre, hook_z)`` of every layer, from the forward that
    gave the mean/resample replacement. When the evaluated batch is that reference in one
    chunk, these ARE its clean prefixes (the same forward on the same tensors), and
    :func:`run_masks` takes them instead of running that forward a second time."""

    tokens: Tensor
    padding_mask: Bool[Tensor, "m T"]
    resid_pre: list[Float[Tensor, "m T d_model"]]
    z: list[Float[Tensor, "m T h d_head"]]

    def prefixes_of(self, part: Batch, layers: Sequence[int]) -> dict | None:
        """``{layer: (resid_pre, z)}`` when ``part`` is the reference itself, else None."""
        if not _same_sequences(part, self.tokens, self.padding_mask):
            return None
        return {layer: (self.resid_pre[layer], self.z[layer].contiguous()) for layer in layers}


def _same_sequences(part: Batch, tokens: Tensor, padding_mask: Tensor) -> bool:
    """Whether ``part`` holds exactly these sequences (tokens and padding, on one device)."""
    if part.tokens is tokens and part.padding_mask is padding_mask:
        return True
    return (
        part.tokens.shape == tokens.shape
        and part.padding_mask.shape == padding_mask.shape
        and part.tokens.device == tokens.device
        and torch.equal(part.tokens, tokens)
        and torch.equal(part.padding_mask, padding_mask)
    )


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
    order = torch.randperm(m, generator=generator, device=DRAW_DEVICE)
    sigma = torch.empty(m, dtype=torch.int64, device=DRAW_DEVICE)
    sigma[order] = order.roll(-1)
    return sigma


def _generator(generator: torch.Generator | None) -> torch.Generator:
    if generator is None:
        return torch.Generator().manual_seed(RESAMPLE_SEED)
    return check_type("generator", generator, torch.Generator, "a torch.Generator or None")


@dataclass
class CleanCache:
    """Clean activations shared by several passes over ONE model, batch and reference (e.g.
    the same head sets under mean, zero and resample ablation): the reference's ``hook_z``
    (mean and resample replacements) and the clean prefixes of the copies.

    It remembers the model and sequences it was first used with (:meth:`check`) and refuses
    others, whose results would silently come from these activations.

    Example:
        >>> from mhainterp.ablation import evaluate_head_sets
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> task, cache = get_task("previous_token"), CleanCache()
        >>> model = handbuilt_model(["previous", "uniform", "dead"])
        >>> _ = evaluate_head_sets(model, task.eval_batch(64), [["L0H0"]], "mean", cache=cache)
        >>> evaluate_head_sets(model, task.eval_batch(32), [["L0H0"]], "mean", cache=cache)
        Traceback (most recent call last):
        mhainterp.validation.ParameterError: cache is invalid: the CleanCache of the reference ...
    """

    donor_z: list[Tensor] | None = None
    mean_z: list[Tensor] | None = None  # per layer, the per-position mean of donor_z
    prefixes: dict[tuple[int, int, int], tuple[Tensor, Tensor]] = field(default_factory=dict)
    # (s0, s1) -> {first: the linear readout's clean logits of that chunk}: the same under
    # every method, so a second method's pass skips that product
    readout_clean: dict[tuple[int, int], dict[int, Tensor]] = field(default_factory=dict)
    # The clean run's attention patterns of the reference's first ``pattern_rows`` sequences
    # (per layer ``[rows, h, T, T]``), kept when asked for (0: not kept)
    pattern_rows: int = 0
    patterns: list[Tensor] | None = None
    # Take every layer's clean prefix from a chunk's first clean forward (an Ablator's clicks
    # start at any layer; without it each new first layer costs a clean forward of its own)
    every_layer: bool = False
    # What it was first used with (check): the model; the tokens and padding of the reference
    # (its replacements) and of the evaluated batch (its prefixes), which may differ
    _model: HookedModel | None = field(default=None, init=False, repr=False)
    _sequences: dict[str, tuple[Tensor, Tensor]] = field(
        default_factory=dict, init=False, repr=False
    )

    def check(
        self, model: HookedModel, sequences: Batch, role: Literal["reference", "batch"]
    ) -> None:
        """Remember ``model`` and ``sequences`` (the ``role`` batch) on first use; after that,
        refuse another model or other sequences in that role.

        Raises:
            ParameterError: the cache was built for another model, reference or batch.
        """
        fix = "make one CleanCache per model, batch and reference"
        if self._model is None:
            self._model = model
        elif model is not self._model:
            raise ParameterError(
                f"cache is invalid: the CleanCache of the model it was first used with, got "
                f"another model ({fix})"
            )
        first = self._sequences.setdefault(role, (sequences.tokens, sequences.padding_mask))
        if not _same_sequences(sequences, *first):
            raise ParameterError(
                f"cache is invalid: the CleanCache of the {role} it was first used with "
                f"({tuple(first[0].shape)} tokens), got another {role} "
                f"({tuple(sequences.tokens.shape)} tokens; {fix})"
            )


def build_replacement(
    model: HookedModel,
    method: Method,
    reference: Batch | None,
    generator: torch.Generator | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    cache: CleanCache | None = None,
    keep_prefix: bool = False,
) -> Replacement:
    """The replacement values of ``method``, from the model's clean run on ``reference``
    (its ``hook_z`` taken from, or kept in, ``cache`` when one is given).

    ``keep_prefix``: the reference is also the batch about to be evaluated; keep the clean
    run's prefixes on the replacement (:class:`ReferencePrefix`) when it was one chunk, so the
    evaluation does not repeat that forward. The caller drops the replacement after.
    """
    method = check_method(method)
    if method == "zero":
        return Replacement("zero")
    if reference is None:
        allowed = "a Task, Batch or tokens whose clean activations give the replacement"
        needs = f"method={method!r} needs reference=; method='zero' needs none"
        raise invalid("reference", None, f"{allowed} ({needs})")
    reference = batch_for_model(model, reference, scored=False)
    if not bool(reference.padding_mask.any()):
        raise ParameterError("reference is invalid: a batch with real tokens, got padding only")
    if method == "resample" and len(reference) < 2:
        # A single-cycle permutation of one sequence is that sequence: its own z would replace
        # the ablated heads' z, and the ablation would equal the clean run.
        raise ParameterError(
            "reference is invalid: at least 2 sequences for method='resample' (each sequence "
            "takes another one's z; with one sequence that is its own z, and the ablation "
            "equals the clean run), got 1 sequence; use method='mean' or 'zero', or more "
            "sequences"
        )
    if cache is not None:
        cache.check(model, reference, "reference")
    resid_pre: list[Tensor] = []
    if cache is not None and cache.donor_z is not None:
        donor_z = cache.donor_z
    else:
        patterns: list[Tensor] = []
        rows = cache.pattern_rows if cache is not None else 0
        with eval_mode(model):
            donor_z = capture_z(
                model, reference, max_rows, resid_pre if keep_prefix else None, patterns, rows
            )
        if cache is not None:
            cache.donor_z = donor_z
            cache.patterns = patterns or None
    prefix = None
    if resid_pre:
        prefix = ReferencePrefix(reference.tokens, reference.padding_mask, resid_pre, donor_z)
    real = reference.padding_mask
    if cache is not None and cache.mean_z is not None:
        means = cache.mean_z
    else:
        means = [_per_position_mean(z, real) for z in donor_z]
        if cache is not None:
            cache.mean_z = means
    if method == "mean":
        return Replacement("mean", mean_z=means, reference_prefix=prefix)
    sigma = _single_cycle(len(reference), _generator(generator)).to(real.device)
    return Replacement(
        "resample",
        mean_z=means,
        donor_z=donor_z,
        donor_real=real,
        sigma=sigma,
        reference_prefix=prefix,
    )
