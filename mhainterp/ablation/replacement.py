"""What an ablated head's ``hook_z`` becomes: the registry of methods, their replacement
values, and the clean capture of the reference they come from (see
:mod:`mhainterp.ablation.engine`).

- A method is ONE :class:`Replacement` subclass registered by name (:func:`register_method`,
  pyvene style): its name, a one-line help, how it is built from the reference's clean capture
  (:meth:`Replacement.build`), its values (:meth:`Replacement.values`) and, optionally, a
  closed-form attribution estimate (:attr:`Replacement.closed_form`). :data:`METHODS` is the
  registry; every method list, column, default and help text of the toolkit iterates it.
- The built-ins, in this order: ``"zero"``: 0; ``"mean"``: the reference's per-position mean
  over real tokens (of at least 2 sequences: one sequence's mean is its own z);
  ``"resample"``: another reference sequence's z (a single-cycle permutation, so never its
  own: a reference of one sequence is refused, its ablation would equal the clean run).
- :func:`capture_z` runs the reference clean once; :class:`ReferencePrefix` keeps that run's
  prefixes when the reference is also the evaluated batch, so the engine does not repeat it.
- The chunk sizes both that capture and the engine's passes use live here too.

Shapes: m reference sequences, T positions, h heads, L layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.data import batch_for_model
from mhainterp.model import StopForward
from mhainterp.protocol import HookedModel
from mhainterp.registry import Registry
from mhainterp.runtime import DRAW_DEVICE, eval_mode
from mhainterp.tasks import Batch
from mhainterp.validation import ParameterError, check_type, invalid

__all__ = [
    "DEFAULT_MAX_ROWS",
    "FULL_FORWARD_ROWS",
    "LAST_LAYER_STATE_BYTES",
    "LINEAR_READOUT_ROWS",
    "METHODS",
    "RESAMPLE_SEED",
    "AttributionSums",
    "CleanCache",
    "Method",
    "Reference",
    "ReferencePrefix",
    "Replacement",
    "build_replacement",
    "capture_z",
    "check_method",
    "method_order",
    "register_method",
]

Method = str
"""The name of a registered ablation method (a key of :data:`METHODS`)."""

DEFAULT_MAX_ROWS: int | None = None
"""Rows (copies x sequences) per forward when none is asked: ``FULL_FORWARD_ROWS`` where the
copies run the rest of the network, ``LINEAR_READOUT_ROWS`` on the linear-readout fast path."""
FULL_FORWARD_ROWS = 512
"""Measured (analysis/benchmark.py, 2 x 16 heads, 1,024 sequences, 2 cores): 0.93x a plain
forward per configuration at 512 rows, 1.1x at 1,024, 1.5x at 2,048 and 1.9x at 16,384; big
chunks leave the cache and the allocator returns their memory to the system every time."""
LINEAR_READOUT_ROWS = 16384
"""The fast path's copies are one einsum each; there big chunks win (3.3 vs 6.0 ms at 1,024)."""
LAST_LAYER_STATE_BYTES = 64 * 2**20
"""The most bytes of last-layer states a :class:`CleanCache` keeps: 16 states of 512 sequences
of 16 positions x 64 wide, a pruning step's 8 candidates over 1,024 sequences, which the next
step starts from. 256 MiB took analyze's peak from 1.16 to 1.66 GiB (64 MiB: 1.33 GiB) and
saved 15 of 348 state computations more."""
RESAMPLE_SEED = 0


def check_method(method: Any) -> Method:
    """``method`` if it is registered in :data:`METHODS`.

    Example:
        >>> check_method("mean")
        'mean'
    """
    return METHODS.check(method)


def method_order(primary: Method) -> tuple[Method, ...]:
    """Every registered method, ``primary`` first, the others in registration order (the order
    of every per-method column).

    Example:
        >>> method_order("mean")
        ('mean', 'zero', 'resample')
    """
    return (primary, *[m for m in METHODS if m != primary])


# ----------------------------------------------------------------------------- the methods


@dataclass
class AttributionSums:
    """What one forward + backward over the evaluated batch accumulates, from which a method's
    closed-form attribution estimate (:attr:`Replacement.closed_form`) follows when the batch
    is its own reference (:func:`mhainterp.attribution.attribution_patching`). ``g`` is
    ``dL/dz``, summed in float64 where z lives.

    Attributes:
        g_dot_z: ``[L, h]``: ``sum_{seq, pos, d} g * z`` per head.
        g_sum: ``[L, T, h, d_head]``: ``G = sum_seq g``.
        z_sum: ``[L, T, h, d_head]``: z summed over the real tokens.
        counts: ``[T]``: real tokens per position.
    """

    g_dot_z: Float[Tensor, "L h"]
    g_sum: Float[Tensor, "L T h d_head"]
    z_sum: Float[Tensor, "L T h d_head"]
    counts: Float[Tensor, " T"]


@dataclass
class Reference:
    """The reference's clean capture that a method's values are built from (one per model,
    reference and :class:`CleanCache`, shared by every method).

    Attributes:
        batch: The reference.
        donor_z: Per layer, its clean ``hook_z`` ``[m, T, h, d_head]``.
        mean_z: Per layer, the per-position mean over real tokens ``[T, h, d_head]``.
        prefix: Its clean prefixes, when the caller keeps them (:class:`ReferencePrefix`).
    """

    batch: Batch
    donor_z: list[Float[Tensor, "m T h d_head"]]
    mean_z: list[Float[Tensor, "T h d_head"]]
    prefix: ReferencePrefix | None = None


class Replacement:
    """One ablation method: what an ablated head's z becomes, per layer.

    A method is a subclass registered by name with :func:`register_method`; an instance holds
    the values built for one model and reference (:func:`build_replacement` builds it).

    Class attributes:
        name: The method's name (its key in :data:`METHODS`, its columns' suffix).
        help: One line for ``--help`` and the docs.
        needs_reference: Whether its values come from a reference's clean run (False: it is
            built from nothing, and :meth:`build` gets ``reference=None``).
        min_sequences: The fewest reference sequences it accepts.
        closed_form: ``AttributionSums -> [L, h]`` estimate of its loss change when the
            evaluated batch is its own reference, or None (attribution then builds the
            replacement and uses the general path).

    Example:
        >>> class Ones(Replacement):
        ...     name, help, needs_reference = "ones", "z set to 1", False
        ...     def values(self, layer, rows, z):
        ...         return z.new_ones(())
        >>> with METHODS.temporary():
        ...     _ = register_method(Ones)
        ...     method_order("mean")
        ('mean', 'zero', 'resample', 'ones')
    """

    name: ClassVar[str]
    help: ClassVar[str]
    needs_reference: ClassVar[bool] = True
    min_sequences: ClassVar[int] = 1
    closed_form: ClassVar[Callable[[AttributionSums], Tensor] | None] = None

    reference_prefix: ReferencePrefix | None = None

    @classmethod
    def build(cls, reference: Reference | None, generator: torch.Generator | None) -> Replacement:
        """The method's values for ``reference`` (None when it needs none); ``generator``
        draws any randomness (None: the method's fixed seed)."""
        return cls()

    @classmethod
    def refusal(cls, n_sequences: int) -> str | None:
        """Why a reference of ``n_sequences`` cannot be used (None: it can)."""
        if n_sequences >= cls.min_sequences:
            return None
        return f"at least {cls.min_sequences} sequences for method={cls.name!r}, got {n_sequences}"

    def values(
        self, layer: int, rows: Int[Tensor, " s"], z: Float[Tensor, "s T h d_head"]
    ) -> Tensor:
        """Replacement z for rows ``rows`` of the evaluated batch, broadcastable to ``z``."""
        raise NotImplementedError(f"method={self.name!r}: {type(self).__name__} has no values()")

    def values_key(self) -> tuple:
        """What tells these values from another instance's: equal keys, equal values (this
        instance alone by default). An engine's kept states are reused under it.

        Example:
            >>> ZeroReplacement().values_key() == ZeroReplacement().values_key()
            True
        """
        return (id(self),)

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


METHODS: Registry[type[Replacement]] = Registry("method")
"""The ablation methods by name, in registration order (the built-ins: zero, mean, resample).
An order with a primary method first is :func:`method_order`; ``mhainterp.cli.static
.ABLATION_METHODS`` mirrors the built-ins' names and help for ``--help``."""


def register_method(cls: type[Replacement], *, replace: bool = False) -> type[Replacement]:
    """Register the :class:`Replacement` subclass ``cls`` as ``cls.name`` (a class decorator).

    Raises:
        ParameterError: not a Replacement subclass with a name and a help line, or the name
            is taken (and ``replace`` is False), or it defines no :meth:`Replacement.values`.
    """
    if not (isinstance(cls, type) and issubclass(cls, Replacement)):
        raise invalid("method", cls, "a subclass of Replacement")
    if cls.values is Replacement.values:
        # without values no engine pass (nor attribution's general path) can use it
        raise invalid("method", getattr(cls, "name", cls.__name__), "a Replacement with values()")
    for attribute in ("name", "help"):
        check_type(
            f"{getattr(cls, '__name__', cls)}.{attribute}",
            getattr(cls, attribute, None),
            str,
            "a string",
        )
    return METHODS.register(cls.name, cls, replace=replace)


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
    :func:`~mhainterp.ablation.engine.run_masks` takes them instead of running that forward a
    second time."""

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
    # (the replacement's values_key, s0, s1, heads ablated above the last layer) -> (the
    # replacement, kept so that the ids in its key are not reused, and the last layer's
    # (hook_resid_pre, hook_z) under those heads): a later pass with the same values (a
    # pruning step's candidates add one head to the last step's pick; the pairwise table's
    # pairs of single heads the importance table removed) starts there. Oldest out first
    # beyond LAST_LAYER_STATE_BYTES.
    last_layer_states: dict[tuple, tuple[Any, tuple[Tensor, Tensor]]] = field(default_factory=dict)
    # (the replacement's values_key, a configuration's [L, h] mask as bytes) -> (the
    # replacement, kept so that the ids in its key are not reused, and that configuration's
    # loss sum and [k] correct counts): a later pass asks for some again (the pruning curve's
    # first step removes the single heads the importance table removed, the pairwise table
    # its chosen heads alone); a configuration's totals do not depend on what runs beside it
    totals: dict[tuple, tuple[Any, Tensor, Tensor]] = field(default_factory=dict)
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
    kind = METHODS[method]
    if not kind.needs_reference:
        return kind.build(None, generator)
    if reference is None:
        allowed = "a Task, Batch or tokens whose clean activations give the replacement"
        without = ", ".join(repr(m) for m, k in METHODS.items() if not k.needs_reference)
        needs = f"method={method!r} needs reference=" + (
            f"; method={without} needs none" if without else ""
        )
        raise invalid("reference", None, f"{allowed} ({needs})")
    reference = batch_for_model(model, reference, scored=False)
    if not bool(reference.padding_mask.any()):
        raise ParameterError("reference is invalid: a batch with real tokens, got padding only")
    refusal = kind.refusal(len(reference))
    if refusal is not None:
        raise ParameterError(f"reference is invalid: {refusal}")
    return kind.build(_capture(model, reference, max_rows, cache, keep_prefix), generator)


def _capture(
    model: HookedModel,
    reference: Batch,
    max_rows: int | None,
    cache: CleanCache | None,
    keep_prefix: bool,
) -> Reference:
    """The reference's clean ``hook_z`` and per-position means (from ``cache`` when it has
    them, kept there otherwise) and, with ``keep_prefix``, its prefixes."""
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
    return Reference(reference, donor_z, means, prefix)


# ----------------------------------------------------------------------------- the built-ins


def _check_length(mean: Tensor, T: int) -> None:
    if mean.shape[0] < T:
        raise ParameterError(
            f"reference is invalid: a batch at least as long as the ablated one ({T} "
            f"positions), got {mean.shape[0]} positions"
        )


@register_method
class ZeroReplacement(Replacement):
    """z set to 0: the head writes nothing into the residual stream."""

    name = "zero"
    help = "the head's z set to 0 (it writes nothing)"
    needs_reference = False

    @staticmethod
    def closed_form(sums: AttributionSums) -> Float[Tensor, "L h"]:
        """``sum g (0 - z)``."""
        return -sums.g_dot_z

    def values(self, layer: int, rows: Tensor, z: Tensor) -> Tensor:
        return z.new_zeros(())

    def values_key(self) -> tuple:
        return ("zero",)  # every instance writes 0


@register_method
@dataclass
class MeanReplacement(Replacement):
    """z set to the reference's per-position mean over real tokens."""

    name: ClassVar[str] = "mean"
    help: ClassVar[str] = "the head's z set to its per-position mean over the reference"
    # the mean of one sequence is its own z: on that sequence the ablation changes nothing, and
    # a verdict on it reads every head as unneeded (audit: one sentence, "0 of 72 needed")
    min_sequences: ClassVar[int] = 2
    mean_z: list[Float[Tensor, "T h d_head"]] = field(default_factory=list)
    reference_prefix: ReferencePrefix | None = None

    @classmethod
    def build(cls, reference: Reference | None, generator: torch.Generator | None) -> Replacement:
        return cls(mean_z=reference.mean_z, reference_prefix=reference.prefix)

    @classmethod
    def refusal(cls, n_sequences: int) -> str | None:
        if n_sequences >= cls.min_sequences:
            return None
        return (
            "at least 2 sequences for method='mean' (the mean of one sequence is its own z: "
            f"ablating a head on it changes nothing), got {n_sequences} sequence; use "
            "method='zero', or more sequences"
        )

    @staticmethod
    def closed_form(sums: AttributionSums) -> Float[Tensor, "L h"]:
        """``sum_{pos, d} G m - sum g z``: the mean ``m`` is the same for every sequence."""
        counts, z_sum = sums.counts, sums.z_sum
        per_position = z_sum / counts.clamp(min=1)[None, :, None, None]
        overall = z_sum.sum(1) / counts.sum().clamp(min=1)  # (L, h, d_head)
        mean = torch.where(counts[None, :, None, None] > 0, per_position, overall[:, None])
        return (sums.g_sum * mean).sum((1, 3)) - sums.g_dot_z

    def values(self, layer: int, rows: Tensor, z: Tensor) -> Tensor:
        mean = self.mean_z[layer]
        _check_length(mean, z.shape[1])
        return mean[: z.shape[1]].to(z.dtype)[None]  # (1, T, h, d_head)

    def values_key(self) -> tuple:
        # The means one CleanCache holds are one list: every pass on that cache shares them
        return ("mean", id(self.mean_z))


@register_method
@dataclass
class ResampleReplacement(Replacement):
    """z taken from another reference sequence (a single-cycle permutation ``sigma``)."""

    name: ClassVar[str] = "resample"
    help: ClassVar[str] = "the head's z taken from another reference sequence"
    min_sequences: ClassVar[int] = 2
    mean_z: list[Float[Tensor, "T h d_head"]] = field(default_factory=list)
    donor_z: list[Float[Tensor, "m T h d_head"]] = field(default_factory=list)
    donor_real: Bool[Tensor, "m T"] | None = None
    sigma: Int[Tensor, " m"] | None = None
    reference_prefix: ReferencePrefix | None = None

    @classmethod
    def build(cls, reference: Reference | None, generator: torch.Generator | None) -> Replacement:
        real = reference.batch.padding_mask
        sigma = _single_cycle(len(reference.batch), _generator(generator)).to(real.device)
        return cls(reference.mean_z, reference.donor_z, real, sigma, reference.prefix)

    @classmethod
    def refusal(cls, n_sequences: int) -> str | None:
        if n_sequences >= 2:
            return None
        # A single-cycle permutation of one sequence is that sequence: its own z would replace
        # the ablated heads' z, and the ablation would equal the clean run.
        return (
            "at least 2 sequences for method='resample' (each sequence takes another one's z; "
            "with one sequence that is its own z, and the ablation equals the clean run), got "
            "1 sequence; use method='mean' or 'zero', or more sequences"
        )

    def values(self, layer: int, rows: Tensor, z: Tensor) -> Tensor:
        T = z.shape[1]
        mean = self.mean_z[layer]
        _check_length(mean, T)
        mean = mean[:T].to(z.dtype)  # (T, h, d_head)
        donors = self.sigma[rows % self.sigma.shape[0]]  # (s,)
        donor = self.donor_z[layer][donors, :T].to(z.dtype)  # (s, T, h, d_head)
        real = self.donor_real[donors, :T, None, None]  # (s, T, 1, 1)
        return torch.where(real, donor, mean[None])
