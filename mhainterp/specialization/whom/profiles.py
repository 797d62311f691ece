"""The engine passes of the division test: configurations, noisy copies, per-value means.

One pass of the ablation engine (:func:`mhainterp.ablation.evaluate_head_sets`, per-position
outputs) scores every configuration of :class:`Configs` at every scored (sequence, position,
target) triple: the clean model, each head removed alone, each layer removed whole, each head
kept alone in its layer (the rest of the layer removed), in a model of two or more layers each
head kept alone in the whole model and every head removed, and each backed-up group removed as
one unit. :class:`ValueMeans` turns the ``[C, N]`` correctness into per-value accuracies of every
axis for the observed sequences and for bootstrap resamples of them in one product (sums per
sequence and value, then weights per sequence). :func:`noisy_copy` is the same-function null's
model: every head's ``W_Q, W_K, W_V, W_O`` with relative Gaussian noise.

Shapes: C configurations, N scored triples, n sequences, A axes, K values of an axis (the
longest one's when the axes are padded to one K; K_all the axes' values side by side), B
bootstrap resamples (row 0 of every resampled table is the observed data), H heads, L layers,
G groups.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.ablation import AblationResult, Method, evaluate_head_sets
from mhainterp.ablation.replacement import CleanCache, capture_z
from mhainterp.heads import all_heads
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import HookedModel, head_matrix, scored_by_loss, set_head_matrix
from mhainterp.runtime import DRAW_DEVICE, eval_mode
from mhainterp.scoring import CleanOutputMetric, damage_metric  # noqa: F401 (re-exported)
from mhainterp.specialization.whom.pass_store import PassStore
from mhainterp.tasks import Batch

__all__ = [
    "Configs",
    "PassScores",
    "basis_rows",
    "bootstrap_weights",
    "build_configs",
    "noisy_copy",
    "run_pass",
    "run_rows",
    "ValueMeans",
    "pad_axes",
    "value_given",
    "value_means",
    "write_norms",
]

Pair = tuple[int, int]


@dataclass
class Configs:
    """Head sets of one engine pass and where each kind sits in it.

    Attributes:
        head_sets: The ablated heads of each configuration (C).
        pairs: ``(layer, head)`` of every head, layer-major (H).
        groups: The backed-up groups removed as one unit (G).
        clean: Row of the clean model.
        single: Per head, the row removing it alone.
        layer: Per layer, the row removing every head of it.
        kept: Per head, the row of its kept-alone profile: it alone in its layer (the rest of
            the layer removed), or, for the heads :meth:`kept_across` names, it alone in the
            whole model.
        kept_ref: Per head, the row ``kept`` is compared with: its layer removed, or every
            head removed (what the head alone adds above it).
        group: Per group, the row removing it.
        kept_model: Per head, the row keeping it alone in the whole model (empty for one
            layer, where that is ``kept``).
        nothing: The row removing every head (None for one layer, where that is ``layer``).
    """

    head_sets: list[list[Pair]]
    pairs: list[Pair]
    groups: list[list[Pair]]
    clean: int
    single: list[int]
    layer: list[int]
    kept: list[int]
    kept_ref: list[int]
    group: list[int]
    kept_model: list[int] = field(default_factory=list)
    nothing: int | None = None

    def kept_across(self, heads: Sequence[bool]) -> Configs:
        """A copy whose kept profile of each head marked in ``heads`` is taken across layers:
        the head alone in the whole model above every head removed. A head whose layer other
        layers back up (removing the whole layer costs nothing) adds nothing kept alone in its
        layer; kept alone in the model, it shows what it does.

        Example:
            >>> c = build_configs(2, 1).kept_across([False, True])
            >>> c.kept, c.kept_ref, c.kept_model, c.nothing
            ([5, 8], [3, 9], [7, 8], 9)
        """
        if not self.kept_model or self.nothing is None:
            return self
        kept = [m if a else k for k, m, a in zip(self.kept, self.kept_model, heads, strict=True)]
        ref = [self.nothing if a else r for r, a in zip(self.kept_ref, heads, strict=True)]
        return dataclasses.replace(self, kept=kept, kept_ref=ref)

    @property
    def across(self) -> list[bool]:
        """Per head, whether its kept profile is taken across layers (:meth:`kept_across`)."""
        return [self.nothing is not None and r == self.nothing for r in self.kept_ref]


def build_configs(
    n_layers: int,
    n_heads: int,
    groups: Sequence[Sequence[Pair]] = (),
    *,
    across_layers: bool = True,
) -> Configs:
    """Clean, singles, whole layers, kept-alone heads (in their layer; with two or more
    layers and ``across_layers``, then in the whole model, and every head removed) and groups,
    in that order.

    ``across_layers=False`` leaves out the kept-alone-in-the-model rows (a pretrained model:
    one head kept alone among hundreds removed is far from anything the model computes, and
    each such row is a full forward).

    Example:
        >>> c = build_configs(1, 2, groups=[[(0, 0), (0, 1)]])
        >>> c.head_sets
        [[], [(0, 0)], [(0, 1)], [(0, 0), (0, 1)], [(0, 1)], [(0, 0)], [(0, 0), (0, 1)]]
        >>> c.single, c.layer, c.kept, c.kept_ref, c.group
        ([1, 2], [3], [4, 5], [3, 3], [6])
        >>> build_configs(2, 1).head_sets[7:]  # alone in the model; every head removed
        [[(1, 0)], [(0, 0)], [(0, 0), (1, 0)]]
        >>> build_configs(2, 1, across_layers=False).kept_model
        []
    """
    pairs = all_heads(n_layers, n_heads)
    layer_sets = [[(lay, h) for h in range(n_heads)] for lay in range(n_layers)]
    sets: list[list[Pair]] = [[]]
    single = _append(sets, [[p] for p in pairs])
    layer = _append(sets, layer_sets)
    kept = _append(sets, [[q for q in layer_sets[p[0]] if q != p] for p in pairs])
    kept_model: list[int] = []
    nothing = None
    if n_layers > 1 and across_layers:  # one layer: alone in the model is alone in the layer
        kept_model = _append(sets, [[q for q in pairs if q != p] for p in pairs])
        nothing = _append(sets, [list(pairs)])[0]
    groups = [sorted(g) for g in groups]
    group = _append(sets, groups)
    kept_ref = [layer[p[0]] for p in pairs]
    return Configs(
        sets, pairs, groups, 0, single, layer, kept, kept_ref, group, kept_model, nothing
    )


def _append(sets: list[list[Pair]], more: list[list[Pair]]) -> list[int]:
    start = len(sets)
    sets.extend(more)
    return list(range(start, len(sets)))


@dataclass
class PassScores:
    """One engine pass at the scored triples.

    Attributes:
        method: The ablation method.
        correct: ``[C, N]`` float32, 1 where the configuration is right.
        nll: ``[C, N]`` float32 cross-entropy.
    """

    method: str
    correct: Float[Tensor, "C N"]
    nll: Float[Tensor, "C N"]
    rows: list[int] | None = None  # the configurations run (None: all); NaN elsewhere

    @property
    def accuracy(self) -> Float[Tensor, " C"]:
        """Each configuration's accuracy over all scored triples."""
        return self.correct.mean(1)

    @property
    def loss(self) -> Float[Tensor, " C"]:
        """Each configuration's mean cross-entropy."""
        return self.nll.mean(1)


@torch.no_grad()
def run_pass(
    model: HookedModel,
    batch: Batch,
    head_sets: Sequence[Sequence[Pair]],
    method: Method,
    *,
    progress: bool = False,
    cache: CleanCache | None = None,
    metric: CleanOutputMetric | None = None,
    store: PassStore | None = None,
) -> tuple[PassScores, AblationResult]:
    """One engine pass of ``head_sets`` (the batch is its own mean/resample reference; a
    ``cache`` shares the clean activations between passes over one model and batch; a
    ``store`` keeps every row run and runs only the head sets it has not seen).

    ``metric``: the model's damage metric (:func:`damage_metric`; None: cross-entropy and
    accuracy against the targets). On a model scored by its loss
    (:func:`~mhainterp.protocol.scored_by_loss`: a pretrained one) the ``correct`` column holds
    the negative loss, so that every profile ``clean - ablated`` is the loss increase.

    Returns:
        The :class:`PassScores` and the engine's :class:`~mhainterp.ablation.AblationResult`
        (for the scored mask and the evaluated batch).
    """

    def engine(sets: list[list[Pair]]) -> tuple[Tensor, Tensor, AblationResult]:
        result = evaluate_head_sets(
            model,
            batch,
            sets,
            method,
            per_position=True,
            progress=progress,
            desc=f"division ({method})",
            cache=cache,
            metric=metric,
        )
        scored = result.scores.scored
        if bool(scored.all()):  # every triple scored: the values the mask gives, no copy
            correct = result.scores.correct.flatten(1).float().cpu()
            nll = result.scores.nll.flatten(1).float().cpu()
        else:
            correct = result.scores.correct[:, scored].float().cpu()
            nll = result.scores.nll[:, scored].float().cpu()
        return correct, nll, result

    if store is None:
        correct, nll, result = engine([list(s) for s in head_sets])
    else:
        correct, nll, result = store.run(model, batch, head_sets, method, engine)
    if scored_by_loss(model):
        correct = -nll
    return PassScores(method, correct, nll), result


def run_rows(
    model: HookedModel,
    batch: Batch,
    configs: Configs,
    rows: Sequence[int],
    method: Method,
    cache: CleanCache | None = None,
    clean_from: PassScores | None = None,
    metric: CleanOutputMetric | None = None,
    store: PassStore | None = None,
) -> PassScores:
    """:func:`run_pass` of the configurations ``rows`` only, laid out as a full pass (NaN in
    the rows not run), so that every row keeps its meaning.

    ``clean_from``: a pass of the same model and batch under another method, whose clean row
    is copied instead of run again (the clean model ablates nothing: every method scores it
    alike); ``store``: as :func:`run_pass`'s."""
    run = [r for r in rows if clean_from is None or r != configs.clean]
    C = len(configs.head_sets)
    if run:
        sets = [configs.head_sets[r] for r in run]
        part, _ = run_pass(model, batch, sets, method, cache=cache, metric=metric, store=store)
        N = part.correct.shape[1]
    else:
        N = clean_from.correct.shape[1]
    device = (part if run else clean_from).correct.device  # the statistics' (the CPU)
    correct = torch.full((C, N), math.nan, device=device)
    nll = torch.full((C, N), math.nan, device=device)
    if run:
        correct[run], nll[run] = part.correct, part.nll
    if clean_from is not None and configs.clean in rows:
        correct[configs.clean] = clean_from.correct[configs.clean]
        nll[configs.clean] = clean_from.nll[configs.clean]
    return PassScores(method, correct, nll, rows=list(rows))


def basis_rows(configs: Configs, basis: str) -> list[int]:
    """The configurations a basis's profiles need (the clean row always: it checks noisy
    copies' accuracy).

    Example:
        >>> basis_rows(build_configs(1, 2), "kept")
        [0, 3, 4, 5]
    """
    if basis == "single":
        return [configs.clean, *configs.single]
    if basis == "kept":
        return [configs.clean, *dict.fromkeys(configs.kept_ref), *configs.kept]
    if basis == "group":
        return [configs.clean, *configs.single, *configs.group]
    return [configs.clean]


def noisy_copy(
    model: HookedMHATransformer,
    noise: float,
    generator: torch.Generator,
    twin: HookedMHATransformer | None = None,
) -> HookedMHATransformer:
    """A deep copy of ``model`` whose every head's ``W_Q, W_K, W_V, W_O`` gets Gaussian noise
    of standard deviation ``noise`` x the RMS of that head's matrix (biases, embeddings, MLPs
    and the unembedding unchanged): the same heads doing the same jobs, slightly differently.

    ``twin``: an earlier noisy copy of ``model`` to reuse instead of a new deep copy (a copy
    at a noise that was refused): its matrices are set anew from ``model``'s, so it is the
    copy a deep copy would give.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> m = handbuilt_model(["previous", "previous"], d_head=18)
        >>> c = noisy_copy(m, 0.1, torch.Generator().manual_seed(0))
        >>> bool((c.blocks[0].attn.W_V != m.blocks[0].attn.W_V).any())
        True
    """
    twin = copy.deepcopy(model) if twin is None else twin
    with torch.no_grad():  # through the protocol: our model's views, a bridge's HF weights
        for layer in range(model.cfg.n_layers):
            for name in ("W_Q", "W_K", "W_V", "W_O"):
                weight = head_matrix(model, layer, name).detach().clone()  # (h, a, b)
                rms = weight.pow(2).mean((1, 2), keepdim=True).sqrt()
                draw = torch.randn(
                    weight.shape, generator=generator, dtype=weight.dtype, device=DRAW_DEVICE
                )  # drawn on the CPU: the same copy on every device
                set_head_matrix(twin, layer, name, weight + noise * rms * draw.to(weight.device))
    return twin.eval()


def bootstrap_weights(n: int, n_resamples: int, generator: torch.Generator) -> Float[Tensor, "B n"]:
    """Row 0: every sequence once (the observed data); rows 1..: how often each sequence is
    drawn in a resample of ``n`` with replacement.

    Example:
        >>> w = bootstrap_weights(5, 3, torch.Generator().manual_seed(0))
        >>> w.shape, w[0].tolist(), w.sum(1).tolist()
        (torch.Size([4, 5]), [1.0, 1.0, 1.0, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0])
    """
    draws = torch.randint(0, n, (n_resamples, n), generator=generator, device=DRAW_DEVICE)
    ones = torch.ones(n_resamples, n, device=draws.device)
    counts = torch.zeros_like(ones).scatter_add_(1, draws, ones)
    return torch.cat([torch.ones(1, n, device=draws.device), counts])


class ValueMeans:
    """Per-value means of per-triple columns, for the observed sequences and bootstrap
    resamples of them, every axis at once: each axis padded to the longest one's K values
    (:func:`pad_axes`), so that the statistics of all axes are one tensor operation.

    The triples are summed per (sequence, value) once, then every resample is one row of a
    single matrix product. What every table shares (each triple's slot, the weighted counts)
    is computed here once. With ``halves``, the sequences of the first half come first, so
    that each half's product is a slice rather than a copy; the sums are whole counts, exact
    in float32 in any order, so the order changes no value.

    Args:
        sequence: ``[N]`` each triple's sequence.
        values: Per axis, ``[N]`` each triple's value id (< that axis's size).
        sizes: Per axis, its number of values.
        weights: ``[B, n]`` how often each sequence is drawn in each resample.
        halves: ``[n]`` the null's split of the sequences (:meth:`halves`).

    Example:
        >>> seq, vals = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2, 1])
        >>> vm = ValueMeans(seq, {"a": vals, "b": seq}, {"a": 3, "b": 2},
        ...                 torch.tensor([[1.0, 1.0], [2.0, 0.0]]))
        >>> vm.resampled(torch.tensor([[1.0, 0.0, 1.0, 1.0]]))[:, :, 0].tolist()
        [[[1.0, 0.5, 1.0], [0.5, 1.0, 0.0]], [[1.0, 0.0, 0.0], [0.5, 0.0, 0.0]]]
    """

    def __init__(
        self,
        sequence: Int[Tensor, " N"],
        values: Mapping[str, Int[Tensor, " N"]],
        sizes: Mapping[str, int],
        weights: Float[Tensor, "B n"],
        halves: Bool[Tensor, " n"] | None = None,
    ) -> None:
        n, device = weights.shape[1], weights.device  # the statistics' device (the CPU)
        self.sizes = [sizes[a] for a in values]
        K_all = self.K_all = sum(self.sizes)
        if halves is None:
            halves = torch.ones(n, dtype=torch.bool, device=device)
        order = torch.cat([halves.nonzero()[:, 0], (~halves).nonzero()[:, 0]])  # (n,)
        self.first_half = int(halves.sum())
        rank = torch.empty(n, dtype=torch.long, device=device)
        rank[order] = torch.arange(n, device=device)
        starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        # (N,) per axis: each triple's (sequence, value) slot, sequences in ``order``
        self.keys = [
            rank[sequence] * K_all + start + ids
            for start, ids in zip(starts, values.values(), strict=True)
        ]
        self.value_ids = [start + ids for start, ids in zip(starts, values.values(), strict=True)]
        counts = torch.zeros(n * K_all, device=device)
        for key in self.keys:
            counts += torch.bincount(key, minlength=n * K_all).float()
        self.counts = counts.reshape(n, K_all)  # (n, K_all)
        self.weights = weights[:, order]  # (B, n)
        self.seen = self.weights @ self.counts  # (B, K_all)

    def _sums(
        self, correct: Float[Tensor, "C N_on"], triples: Bool[Tensor, " N"] | None = None
    ) -> Float[Tensor, "n K_all*C"]:
        """Per sequence, the sums of ``correct`` per value and configuration; ``triples``:
        the triples ``correct`` holds, when not all (0 in the other sequences' slots)."""
        n, C = self.counts.shape[0], correct.shape[0]
        # (n * K_all, C): the configurations last, so a resample table is one product
        sums = torch.zeros(n * self.K_all, C, device=correct.device)
        rows = correct.T.float().contiguous()  # (N, C): index_add_ of a transposed view: 5x slower
        for key in self.keys:
            sums.index_add_(0, key if triples is None else key[triples], rows)
        return sums.reshape(n, self.K_all * C)

    def _padded(self, total: Float[Tensor, "B K_all*C"], seen: Float[Tensor, "B K_all"]) -> Tensor:
        total = total.reshape(len(total), self.K_all, -1)  # (B, K_all, C)
        means = total / seen.clamp(min=1)[..., None]
        return pad_axes(means, self.sizes, dim=1).transpose(-1, -2)  # (B, A, C, K)

    def resampled(self, correct: Float[Tensor, "C N"]) -> Float[Tensor, "B A C K"]:
        """Each resample's mean of ``correct`` per axis, configuration and value (0 where a
        value has no triple)."""
        return self._padded(self.weights @ self._sums(correct), self.seen)

    def halves(self, correct: Float[Tensor, "C N"]) -> Float[Tensor, "2B A C K"]:
        """:meth:`resampled` on the first half's sequences (rows ``:B``), then on the
        second's (rows ``B:``), each a product over its half only."""
        sums, h = self._sums(correct), self.first_half
        w, counts = self.weights, self.counts
        total = torch.cat([w[:, :h] @ sums[:h], w[:, h:] @ sums[h:]])
        seen = torch.cat([w[:, :h] @ counts[:h], w[:, h:] @ counts[h:]])
        return self._padded(total, seen)

    def half(
        self,
        correct: Float[Tensor, "C N_on"],
        second: bool,
        triples: Bool[Tensor, " N"] | None = None,
    ) -> Float[Tensor, "B A C K"]:
        """:meth:`resampled` on one half's sequences only (the first, or the ``second``): a
        product over that half alone, for a model the null compares on that half only
        (``triples``: the triples ``correct`` holds, when it ran on that half alone)."""
        sums, h = self._sums(correct, triples), self.first_half
        rows = slice(h, None) if second else slice(None, h)
        w = self.weights[:, rows]
        return self._padded(w @ sums[rows], w @ self.counts[rows])

    def whole_and_first_half(
        self, correct: Float[Tensor, "C N"]
    ) -> tuple[Float[Tensor, "B A C K"], Float[Tensor, "B A C K"]]:
        """:meth:`resampled` and :meth:`half` on the first half, from one sum per sequence
        and one product per half: the sums are whole counts, so the whole is the two halves'
        total exactly, and the first half comes free."""
        sums, h = self._sums(correct), self.first_half
        w = self.weights
        first = w[:, :h] @ sums[:h]  # (B, K_all * C)
        whole = self._padded(first + w[:, h:] @ sums[h:], self.seen)
        return whole, self._padded(first, w[:, :h] @ self.counts[:h])

    def observed(self, column: Float[Tensor, "C N"]) -> Float[Tensor, "A C K"]:
        """The mean of ``column`` per axis, configuration and value over all triples, in
        float64 (a loss: not whole numbers)."""
        x = column.T.double().contiguous()  # (N, C)
        sums = x.new_zeros(self.K_all, x.shape[1])
        for ids in self.value_ids:
            sums.index_add_(0, ids, x)
        seen = self.counts.sum(0).double()  # (K_all,)
        means = sums / seen.clamp(min=1)[:, None]  # (K_all, C)
        return pad_axes(means, self.sizes, dim=0).transpose(-1, -2)  # (A, C, K)

    def of_passes(
        self,
        passes: Sequence[PassScores],
        split: bool = False,
        half: int | None = None,
        triples: Bool[Tensor, " N"] | None = None,
    ) -> list[Float[Tensor, "B A C K"]]:
        """Per pass, :meth:`resampled` (with ``split``: :meth:`halves`; with ``half`` 0 or 1:
        :meth:`half` on the first or the second half, ``triples`` the triples the passes ran
        on) of its correctness on the rows it ran (NaN in the others): every pass's rows side
        by side, so all of it is one product."""
        if not passes:
            return []
        parts = [p.correct if p.rows is None else p.correct[p.rows] for p in passes]
        if half is not None:
            means = self.half(torch.cat(parts), second=bool(half), triples=triples)
        else:
            means = (self.halves if split else self.resampled)(torch.cat(parts))
        return self._per_pass(means, passes, parts)

    def of_passes_and_first_half(
        self, passes: Sequence[PassScores]
    ) -> tuple[list[Float[Tensor, "B A C K"]], list[Float[Tensor, "B A C K"]]]:
        """:meth:`of_passes` on every sequence and on the first half's (``half=0``), from one
        sum and two half products (:meth:`whole_and_first_half`)."""
        parts = [p.correct if p.rows is None else p.correct[p.rows] for p in passes]
        whole, first = self.whole_and_first_half(torch.cat(parts))
        return self._per_pass(whole, passes, parts), self._per_pass(first, passes, parts)

    @staticmethod
    def _per_pass(
        means: Float[Tensor, "B A C_run K"], passes: Sequence[PassScores], parts: list[Tensor]
    ) -> list[Float[Tensor, "B A C K"]]:
        """``means`` of the passes' run rows side by side, cut into one table per pass laid
        out over all its configurations (NaN in the rows it did not run)."""
        out = []
        start = 0
        for p, part in zip(passes, parts, strict=True):
            stop = start + len(part)
            if p.rows is None:
                out.append(means[:, :, start:stop])
            else:
                shape = (*means.shape[:2], p.correct.shape[0], means.shape[-1])
                full = means.new_full(shape, math.nan)
                full[:, :, p.rows] = means[:, :, start:stop]
                out.append(full)
            start = stop
        return out


def value_means(
    correct: Float[Tensor, "C N"],
    sequence: Int[Tensor, " N"],
    values: Int[Tensor, " N"],
    K: int,
    weights: Float[Tensor, "B n"],
) -> Float[Tensor, "B C K"]:
    """Per resample, configuration and value: the accuracy over the triples with that value
    (each triple weighted by how often its sequence is drawn; NaN-free: empty values give 0).
    One axis of :class:`ValueMeans`.

    Example:
        >>> correct = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
        >>> seq, vals = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])
        >>> value_means(correct, seq, vals, 2, torch.tensor([[1.0, 1.0], [2.0, 0.0]])).tolist()
        [[[1.0, 0.5]], [[1.0, 0.0]]]
    """
    return ValueMeans(sequence, {"": values}, {"": K}, weights).resampled(correct)[:, 0]


def pad_axes(
    table: Float[Tensor, "..."], sizes: Sequence[int], dim: int = -1
) -> Float[Tensor, "..."]:
    """Axes whose values sit side by side along ``dim`` (``K_all = sum(sizes)`` entries) as
    one row per axis of ``K = max(sizes)`` values, zeros after an axis's own: ``dim`` becomes
    the two dims ``(A, K)``.

    Example:
        >>> pad_axes(torch.tensor([1.0, 2.0, 3.0]), [1, 2]).tolist()
        [[1.0, 0.0], [2.0, 3.0]]
    """
    dim = dim % table.ndim
    K = max(sizes)
    device = table.device
    starts = torch.tensor([0, *sizes[:-1]], device=device).cumsum(0)  # (A,)
    k = torch.arange(K, device=device)
    inside = k[None] < torch.tensor(sizes, device=device)[:, None]  # (A, K)
    # Padding reads the zero entry appended after the K_all values.
    source = torch.where(inside, starts[:, None] + k[None], table.shape[dim])
    zero = table.new_zeros(*table.shape[:dim], 1, *table.shape[dim + 1 :])
    padded = torch.cat([table, zero], dim).index_select(dim, source.flatten())
    return padded.reshape(*table.shape[:dim], len(sizes), K, *table.shape[dim + 1 :])


def value_given(
    values: Sequence[Int[Tensor, " N"]], sizes: Sequence[int], keep: Bool[Tensor, "A K"]
) -> Float[Tensor, "A A K K"]:
    """``given[x, y, i, j]``: among the scored triples with value ``i`` of axis ``x``, the share
    with value ``j`` of axis ``y`` (over ``y``'s kept values; 0 past an axis's own values and
    where value ``i`` has no triple). How the axes go together in the data: a division along
    one shows along another through this table alone.

    Example:
        >>> pos, cls = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 0, 1])
        >>> keep = torch.ones(2, 2, dtype=torch.bool)
        >>> value_given([pos, cls], [2, 2], keep)[1, 0].tolist()  # position given the class
        [[0.6666666666666666, 0.3333333333333333], [0.0, 1.0]]
    """
    A, K = len(values), max(sizes)
    device = keep.device
    given = torch.zeros(A, A, K, K, dtype=torch.float64, device=device)
    for x, vx in enumerate(values):
        for y, vy in enumerate(values):
            counts = torch.zeros(K, K, dtype=torch.float64, device=device)
            ones = torch.ones(len(vx), dtype=torch.float64, device=device)
            counts.index_put_((vx.to(device), vy.to(device)), ones, accumulate=True)
            counts = counts * keep[y][None, :]
            given[x, y] = counts / counts.sum(-1, keepdim=True).clamp(min=1)
    return given


@torch.no_grad()
def write_norms(
    model: HookedMHATransformer, batch: Batch, zs: Sequence[Tensor] | None = None
) -> Float[Tensor, " H"]:
    """Each head's mean write norm ``|z_h W_O[h]|`` over the real positions of ``batch``.

    ``zs``: every layer's clean ``hook_z`` of a batch that starts with ``batch`` (a
    :class:`~mhainterp.ablation.replacement.CleanCache`'s ``donor_z``), instead of a forward.
    """
    if zs is None:
        with eval_mode(model):
            zs = capture_z(model, batch)  # per layer (n, T, h, d_head)
    zs = [z[: len(batch)] for z in zs]
    real = batch.padding_mask.to(zs[0].device).float()  # (n, T)
    out = []
    for layer, z in enumerate(zs):
        W_O = head_matrix(model, layer, "W_O").to(z.dtype)  # (h, d_head, d_model)
        norm = torch.einsum("nthd,hdm->nthm", z, W_O).norm(dim=-1)  # (n, T, h)
        out.append((norm * real[..., None]).sum((0, 1)) / real.sum().clamp(min=1))
    return torch.cat(out).double().cpu()
