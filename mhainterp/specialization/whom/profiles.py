"""The engine passes of the division test: configurations, noisy copies, per-value means.

One pass of the ablation engine (:func:`mhainterp.ablation.evaluate_head_sets`, per-position
outputs) scores every configuration of :class:`Configs` at every scored (sequence, position,
target) triple: the clean model, each head removed alone, each layer removed whole, each head
kept alone in its layer (the rest of the layer removed) and each backed-up group removed as one
unit. :func:`value_means` turns the ``[C, N]`` correctness into per-value accuracies for the
observed sequences and for bootstrap resamples of them in one product (sums per sequence and
value, then weights per sequence). :func:`noisy_copy` is the same-function null's model: every
head's ``W_Q, W_K, W_V, W_O`` with relative Gaussian noise.

Shapes: C configurations, N scored triples, n sequences, K values of an axis, B bootstrap
resamples (row 0 of every resampled table is the observed data), H heads, L layers, G groups.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.ablation import Method, evaluate_head_sets
from mhainterp.ablation.replacement import CleanCache, capture_z
from mhainterp.eval_mode import eval_mode
from mhainterp.heads import all_heads
from mhainterp.tasks import Batch

__all__ = [
    "Configs",
    "PassScores",
    "basis_rows",
    "bootstrap_weights",
    "build_configs",
    "noisy_copy",
    "passes_means",
    "run_pass",
    "run_rows",
    "value_means",
    "axes_value_means",
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
        kept: Per head, the row keeping it alone in its layer.
        group: Per group, the row removing it.
    """

    head_sets: list[list[Pair]]
    pairs: list[Pair]
    groups: list[list[Pair]]
    clean: int
    single: list[int]
    layer: list[int]
    kept: list[int]
    group: list[int]


def build_configs(n_layers: int, n_heads: int, groups: Sequence[Sequence[Pair]] = ()) -> Configs:
    """Clean, singles, whole layers, kept-alone heads and groups, in that order.

    Example:
        >>> c = build_configs(1, 2, groups=[[(0, 0), (0, 1)]])
        >>> c.head_sets
        [[], [(0, 0)], [(0, 1)], [(0, 0), (0, 1)], [(0, 1)], [(0, 0)], [(0, 0), (0, 1)]]
        >>> c.single, c.layer, c.kept, c.group
        ([1, 2], [3], [4, 5], [6])
    """
    pairs = all_heads(n_layers, n_heads)
    layer_sets = [[(lay, h) for h in range(n_heads)] for lay in range(n_layers)]
    sets: list[list[Pair]] = [[]]
    single = _append(sets, [[p] for p in pairs])
    layer = _append(sets, layer_sets)
    kept = _append(sets, [[q for q in layer_sets[p[0]] if q != p] for p in pairs])
    groups = [sorted(g) for g in groups]
    group = _append(sets, groups)
    return Configs(sets, pairs, groups, 0, single, layer, kept, group)


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
    model: Any,
    batch: Batch,
    head_sets: Sequence[Sequence[Pair]],
    method: Method,
    *,
    progress: bool = False,
    cache: CleanCache | None = None,
) -> tuple[PassScores, Any]:
    """One engine pass of ``head_sets`` (the batch is its own mean/resample reference; a
    ``cache`` shares the clean activations between passes over one model and batch).

    Returns:
        The :class:`PassScores` and the engine's :class:`~mhainterp.ablation.AblationResult`
        (for the scored mask and the evaluated batch).
    """
    result = evaluate_head_sets(
        model, batch, [list(s) for s in head_sets], method, per_position=True,
        progress=progress, desc=f"division ({method})", cache=cache,
    )  # fmt: skip
    scored = result.scores.scored
    correct = result.scores.correct[:, scored].float().cpu()
    nll = result.scores.nll[:, scored].float().cpu()
    return PassScores(method, correct, nll), result


def run_rows(
    model: Any,
    batch: Batch,
    configs: Configs,
    rows: Sequence[int],
    method: Method,
    cache: CleanCache | None = None,
    clean_from: PassScores | None = None,
) -> PassScores:
    """:func:`run_pass` of the configurations ``rows`` only, laid out as a full pass (NaN in
    the rows not run), so that every row keeps its meaning.

    ``clean_from``: a pass of the same model and batch under another method, whose clean row
    is copied instead of run again (the clean model ablates nothing: every method scores it
    alike)."""
    run = [r for r in rows if clean_from is None or r != configs.clean]
    C = len(configs.head_sets)
    if run:
        part, _ = run_pass(model, batch, [configs.head_sets[r] for r in run], method, cache=cache)
        N = part.correct.shape[1]
    else:
        N = clean_from.correct.shape[1]
    correct, nll = torch.full((C, N), math.nan), torch.full((C, N), math.nan)
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
        return [configs.clean, *configs.layer, *configs.kept]
    if basis == "group":
        return [configs.clean, *configs.single, *configs.group]
    return [configs.clean]


def noisy_copy(model: Any, noise: float, generator: torch.Generator) -> Any:
    """A deep copy of ``model`` whose every head's ``W_Q, W_K, W_V, W_O`` gets Gaussian noise
    of standard deviation ``noise`` x the RMS of that head's matrix (biases, embeddings, MLPs
    and the unembedding unchanged): the same heads doing the same jobs, slightly differently.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> m = handbuilt_model(["previous", "previous"], d_head=18)
        >>> c = noisy_copy(m, 0.1, torch.Generator().manual_seed(0))
        >>> bool((c.blocks[0].attn.W_V != m.blocks[0].attn.W_V).any())
        True
    """
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for block in twin.blocks:
            attn = block.attn
            for name in ("W_Q", "W_K", "W_V", "W_O"):
                weight = getattr(attn, name).detach().clone()  # (h, a, b)
                rms = weight.pow(2).mean((1, 2), keepdim=True).sqrt()
                draw = torch.randn(weight.shape, generator=generator, dtype=weight.dtype)
                setattr(attn, name, weight + noise * rms * draw.to(weight.device))
    return twin.eval()


def bootstrap_weights(n: int, n_resamples: int, generator: torch.Generator) -> Float[Tensor, "B n"]:
    """Row 0: every sequence once (the observed data); rows 1..: how often each sequence is
    drawn in a resample of ``n`` with replacement.

    Example:
        >>> w = bootstrap_weights(5, 3, torch.Generator().manual_seed(0))
        >>> w.shape, w[0].tolist(), w.sum(1).tolist()
        (torch.Size([4, 5]), [1.0, 1.0, 1.0, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0])
    """
    draws = torch.randint(0, n, (n_resamples, n), generator=generator)
    counts = torch.zeros(n_resamples, n).scatter_add_(1, draws, torch.ones(n_resamples, n))
    return torch.cat([torch.ones(1, n), counts])


def passes_means(
    passes: Sequence[PassScores],
    sequence: Int[Tensor, " N"],
    values: Mapping[str, Int[Tensor, " N"]],
    sizes: Mapping[str, int],
    weights: Float[Tensor, "B n"],
    halves: Bool[Tensor, " n"] | None = None,
) -> list[dict[str, Float[Tensor, "B C K"]]]:
    """Per pass and axis, :func:`axes_value_means` of the pass's correctness on the rows it ran
    (NaN else): every pass's rows and every axis side by side, so all of it is one product.

    Identical to one :func:`value_means` per pass and axis (with ``halves``: of the weights
    ``weights * halves`` and ``weights * ~halves`` stacked): the sums are whole counts, exact in
    float32 in any order."""
    if not passes or not values:
        return [{} for _ in passes]
    parts = [p.correct if p.rows is None else p.correct[p.rows] for p in passes]
    means = axes_value_means(torch.cat(parts), sequence, values, sizes, weights, halves)
    out = []
    start = 0
    for p, part in zip(passes, parts, strict=True):
        rows = slice(None) if p.rows is None else p.rows
        stop = start + len(part)
        tables = {}
        for axis, table in means.items():  # (B, sum of the passes' rows, K)
            full = torch.full((len(table), p.correct.shape[0], sizes[axis]), math.nan)
            full[:, rows] = table[:, start:stop]
            tables[axis] = full
        out.append(tables)
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

    The triples are summed per (sequence, value) once, then every resample is one row of a
    single matrix product (stack several weight tables to get them all from one call).

    Example:
        >>> correct = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
        >>> seq, vals = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])
        >>> value_means(correct, seq, vals, 2, torch.tensor([[1.0, 1.0], [2.0, 0.0]])).tolist()
        [[[1.0, 0.5]], [[1.0, 0.0]]]
    """
    return axes_value_means(correct, sequence, {"": values}, {"": K}, weights)[""]


def axes_value_means(
    correct: Float[Tensor, "C N"],
    sequence: Int[Tensor, " N"],
    values: Mapping[str, Int[Tensor, " N"]],
    sizes: Mapping[str, int],
    weights: Float[Tensor, "B n"],
    halves: Bool[Tensor, " n"] | None = None,
) -> dict[str, Float[Tensor, "B C K"]]:
    """:func:`value_means` of several axes at once: their values side by side (K_all, the sum
    of the axes' K), so that the sums are one table and the resamples one product.

    ``halves``: each resample twice, on the sequences where it is True (rows ``:B``) and where
    it is False (rows ``B:``), each a product over its half of the sequences only."""
    n, C = weights.shape[1], correct.shape[0]
    axes = list(values)
    offsets = [0]
    for axis in axes:
        offsets.append(offsets[-1] + sizes[axis])
    K_all = offsets[-1]
    # (n * K_all, C): the configurations last, so the resamples are one (B, n) @ (n, K_all * C)
    sums, counts = torch.zeros(n * K_all, C), torch.zeros(n * K_all)
    rows = correct.T.float().contiguous()  # (N, C): index_add_ of a transposed view is 5x slower
    for axis, start in zip(axes, offsets, strict=False):
        key = sequence * K_all + start + values[axis]  # (N,) each triple's (sequence, value) slot
        sums.index_add_(0, key, rows)
        counts += torch.bincount(key, minlength=n * K_all).float()
    sums, counts = sums.reshape(n, K_all * C), counts.reshape(n, K_all)
    if halves is None:
        total, seen = weights @ sums, weights @ counts  # (B, K_all * C), (B, K_all)
    else:  # (2B, ...): half the work of weights * halves (zeros on the other half) @ sums
        total = torch.cat([weights[:, h] @ sums[h] for h in (halves, ~halves)])
        seen = torch.cat([weights[:, h] @ counts[h] for h in (halves, ~halves)])
    total = total.reshape(len(total), K_all, C).transpose(1, 2)
    means = total / seen.clamp(min=1)[:, None, :]  # (B, C, K_all)
    return {a: means[..., offsets[i] : offsets[i + 1]] for i, a in enumerate(axes)}


@torch.no_grad()
def write_norms(
    model: Any, batch: Batch, zs: Sequence[Tensor] | None = None
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
        W_O = model.blocks[layer].attn.W_O.to(z.dtype)  # (h, d_head, d_model)
        norm = torch.einsum("nthd,hdm->nthm", z, W_O).norm(dim=-1)  # (n, T, h)
        out.append((norm * real[..., None]).sum((0, 1)) / real.sum().clamp(min=1))
    return torch.cat(out).double().cpu()
