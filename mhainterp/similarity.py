"""Head-by-head similarity: which heads do the same thing, within a model and across models.

:func:`head_similarity` returns a square DataFrame indexed and columned by head label (all layers)
for one of these methods:

=================  ==========================================================================
``"js"``           1 - Jensen-Shannon divergence (base 2, so in [0, 1]) between two heads'
                   attention distributions, per query, averaged over queries and sequences
                   (Clark et al. 2019). 1 = identical patterns. Range [0, 1].
``"pattern_corr"`` Pearson correlation of the two heads' flattened patterns over every
                   (sequence, query, visible key) entry. Range [-1, 1].
``"cka"``          Linear CKA (Kornblith et al. 2019) of the heads' outputs ``hook_result``
                   (each head's write to the residual stream, ``z_h @ W_O[h]``) over every real
                   position. Range [0, 1]; invariant to rotation and scale of the outputs.
``"ov"``           Cosine similarity, in the Frobenius inner product, of the heads' OV circuits
                   ``W_V[h] @ W_O[h]`` (``d_model x d_model``): what a head writes given what it
                   reads. Biases are ignored. Range [-1, 1]. Needs no data.
``"qk"``           The same for the QK circuits ``W_Q[h] @ W_K[h].T``: which (query, key)
                   residual directions a head matches. Range [-1, 1]. Needs no data.
``"separation"``   The seed's "head separation" (seed 004): the L2 distance between two heads'
                   context vectors, turned into a similarity in [0, 1] (see
                   :func:`head_separation`, which also gives the raw distance).
=================  ==========================================================================

Queries follow :mod:`mhainterp.capture`'s rule: padding queries never count, and the pattern
methods (js, pattern_corr, separation) use the real queries that see >= 2 keys (a query that
sees one key is forced to put all its weight there in every head, which would only make every
pair look alike). CKA uses every real position.

Degenerate heads: when a method is undefined for a pair because a head's patterns, outputs or
circuit have zero variance/norm (a "dead" head), the similarity is 1 if both heads of the pair
are degenerate and 0 otherwise.

Also: :func:`cross_model_similarity` (heads of model A x heads of model B on the same tokens,
for models of any head count), :func:`match_heads` (Hungarian assignment),
:func:`cluster_heads` (hierarchical clustering) and :func:`head_map_mds` (a 2-D map of heads).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from scipy.cluster.hierarchy import fcluster, leaves_list, linkage, optimal_leaf_ordering
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import squareform
from sklearn.manifold import MDS
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.capture import (
    Data,
    capture_activations,
    pattern_hook_names,
    resolve_inputs,
    statistic_queries,
    visible_keys,
)
from mhainterp.model import HookedMHATransformer, head_label

__all__ = [
    "CROSS_MODEL_METHODS",
    "SIMILARITY_METHODS",
    "cluster_heads",
    "cross_model_similarity",
    "dissimilarity",
    "head_linkage",
    "head_map_mds",
    "head_separation",
    "head_similarity",
    "match_heads",
    "similarity_frame",
]

SIMILARITY_METHODS = ("js", "pattern_corr", "cka", "ov", "qk", "separation")
"""Methods of :func:`head_similarity`."""
CROSS_MODEL_METHODS = ("js", "pattern_corr", "cka")
"""Methods of :func:`cross_model_similarity` (those that compare heads through data, not weights
in a model-specific residual basis)."""
_LN2 = math.log(2.0)


# ----------------------------------------------------------------------------- checks


def _check_model(model: Any, name: str = "model") -> None:
    if not isinstance(model, HookedMHATransformer):
        raise TypeError(f"{name} must be a HookedMHATransformer, got {type(model).__name__}")


def _check_method(method: Any, allowed: tuple[str, ...]) -> None:
    if method not in allowed:
        raise ValueError(f"method={method!r} is invalid; allowed: {', '.join(allowed)}")


def _labels(model: HookedMHATransformer) -> list[str]:
    return model.head_labels


def _head_frame(values: Tensor | np.ndarray, rows: list[str], cols: list[str]) -> pd.DataFrame:
    array = values.detach().cpu().double().numpy() if isinstance(values, Tensor) else values
    frame = pd.DataFrame(np.asarray(array, dtype=float), index=rows, columns=cols)
    frame.index.name, frame.columns.name = "head_a", "head_b"
    return frame


def _degenerate_fix(value: Tensor, bad_a: Tensor, bad_b: Tensor) -> Tensor:
    """Similarity 1 where both heads are degenerate, 0 where exactly one is."""
    both = bad_a[:, None] & bad_b[None, :]
    one = bad_a[:, None] ^ bad_b[None, :]
    return value.masked_fill(one, 0.0).masked_fill(both, 1.0)


# ----------------------------------------------------------------------------- data streams


def _batches(
    models: list[HookedMHATransformer],
    data: Data,
    padding_mask: Tensor | None,
    names: list[list[str]],
    *,
    batch_size: int,
    n_eval: int,
    progress: bool,
) -> Iterator[tuple[Tensor, list[dict[str, Tensor]]]]:
    """Run every model on the same batches; yield (padding_mask, [captured activations])."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is invalid: must be an int >= 1")
    tokens, mask, _ = resolve_inputs(data, padding_mask, n_eval=n_eval)
    for model in models:
        model.validate_inputs(tokens, mask)
    has_padding = not bool(mask.all())
    starts = range(0, tokens.shape[0], batch_size)
    # A model listed twice (a model compared with itself) runs once per batch.
    unique: dict[int, tuple[HookedMHATransformer, set[str]]] = {}
    for model, wanted in zip(models, names, strict=True):
        unique.setdefault(id(model), (model, set()))[1].update(wanted)
    for start in tqdm(starts, desc="head similarity", disable=not progress, leave=False):
        part_mask = mask[start : start + batch_size]
        captured: dict[int, dict[str, Tensor]] = {}
        for key, (model, wanted) in unique.items():
            device = model.cfg.device
            part = tokens[start : start + batch_size].to(device)
            run_mask = part_mask.to(device) if has_padding else None
            captured[key] = capture_activations(model, part, run_mask, sorted(wanted))
        yield part_mask, [captured[id(model)] for model in models]


def _stacked_patterns(
    model: HookedMHATransformer, acts: dict[str, Tensor], mask: Tensor
) -> Float[Tensor, "B H T T"]:
    """All heads' patterns, layer-major, as float64 on the CPU; padding query rows zeroed."""
    patterns = torch.cat([acts[name] for name in pattern_hook_names(model)], dim=1)
    return patterns.double().cpu() * mask[:, None, :, None]


def _check_same_masking(model_a: HookedMHATransformer, model_b: HookedMHATransformer) -> None:
    if model_a.cfg.causal != model_b.cfg.causal:
        raise ValueError(
            f"both models must mask attention the same way; got causal={model_a.cfg.causal} "
            f"and causal={model_b.cfg.causal}"
        )


# ----------------------------------------------------------------------------- pattern methods


_CHUNK_ELEMENTS = 2**22  # ~32 MB of float64 per temporary


def _row_chunks(n_rows: int, per_row: int) -> list[slice]:
    """Split ``n_rows`` sequences so each chunk's temporaries stay near ``_CHUNK_ELEMENTS``."""
    step = max(1, _CHUNK_ELEMENTS // max(per_row, 1))
    return [slice(start, start + step) for start in range(0, n_rows, step)]


def _js_sums(
    xa: Float[Tensor, "HA N"], xb: Float[Tensor, "HB N"], symmetric: bool
) -> Float[Tensor, "HA HB"]:
    """Sum over the counted queries of JS(a_i[q], b_j[q]) in bits, for every pair (i, j).

    ``xa``/``xb`` hold the weights of every (counted query, visible key) entry; keys a query
    cannot see have weight 0 in both heads and add nothing. Summing JS over queries equals
    summing ``(p log p + q log q) / 2 - m log m`` over all entries, with ``m = (p + q) / 2``.
    """
    plogp_a = torch.special.xlogy(xa, xa).sum(-1)  # (HA,)
    plogp_b = torch.special.xlogy(xb, xb).sum(-1)  # (HB,)
    out = torch.zeros(xa.shape[0], xb.shape[0], dtype=torch.float64)
    for cols in _row_chunks(xa.shape[1], xb.shape[0]):
        for i in range(xa.shape[0]):
            first = i if symmetric else 0  # JS is symmetric: fill j >= i, mirror below
            m = (xa[i, cols] + xb[first:, cols]) / 2  # (HB - first, n)
            out[i, first:] -= torch.special.xlogy(m, m).sum(-1)
    out += (plogp_a[:, None] + plogp_b[None, :]) / 2
    if symmetric:
        out = torch.triu(out) + torch.triu(out, 1).T
        out.fill_diagonal_(0.0)  # JS(p, p) = 0 exactly, whatever the rounding of the sums
    return out.clamp(min=0) / _LN2


class _CorrSums:
    """Running sums for the Pearson correlation of flattened patterns (float64)."""

    def __init__(self) -> None:
        self.n = 0.0
        self.sa: Tensor | float = 0.0
        self.sb: Tensor | float = 0.0
        self.saa: Tensor | float = 0.0
        self.sbb: Tensor | float = 0.0
        self.sab: Tensor | float = 0.0

    def add(self, xa: Tensor, xb: Tensor) -> None:
        """Add entries ``xa: [HA, N]``, ``xb: [HB, N]`` (the same N entries for both)."""
        self.n += float(xa.shape[1])
        self.sa = self.sa + xa.sum(-1)
        self.sb = self.sb + xb.sum(-1)
        self.saa = self.saa + (xa * xa).sum(-1)
        self.sbb = self.sbb + (xb * xb).sum(-1)
        self.sab = self.sab + xa @ xb.T

    def result(self) -> Tensor:
        n = max(self.n, 1.0)
        cov = self.sab / n - torch.outer(self.sa / n, self.sb / n)
        var_a = (self.saa / n - (self.sa / n) ** 2).clamp(min=0)
        var_b = (self.sbb / n - (self.sb / n) ** 2).clamp(min=0)
        corr = cov / torch.sqrt(torch.outer(var_a, var_b)).clamp(min=1e-300)
        tiny = 1e-12
        return _degenerate_fix(corr.clamp(-1, 1), var_a <= tiny, var_b <= tiny)


def _pattern_similarity(
    model_a: HookedMHATransformer,
    model_b: HookedMHATransformer,
    data: Data,
    padding_mask: Tensor | None,
    method: str,
    **run: Any,
) -> Tensor:
    """js or pattern_corr between the heads of two models (may be the same model)."""
    _check_same_masking(model_a, model_b)
    names = [pattern_hook_names(model_a), pattern_hook_names(model_b)]
    js_total: Tensor | float = 0.0
    n_queries = 0.0
    corr = _CorrSums()
    for mask, (acts_a, acts_b) in _batches([model_a, model_b], data, padding_mask, names, **run):
        visible = visible_keys(mask, model_a.cfg.causal)  # (B, T, T)
        queries = statistic_queries(visible)  # (B, T)
        entries = visible & queries[:, :, None]  # (B, q, k): counted query, visible key
        xa = _stacked_patterns(model_a, acts_a, mask).permute(1, 0, 2, 3)[:, entries]  # (HA, N)
        xb = _stacked_patterns(model_b, acts_b, mask).permute(1, 0, 2, 3)[:, entries]  # (HB, N)
        if method == "js":
            js_total = js_total + _js_sums(xa, xb, symmetric=model_a is model_b)
            n_queries += float(queries.sum())
        else:
            corr.add(xa, xb)
    if method == "js":
        return 1.0 - js_total / max(n_queries, 1.0)
    return corr.result()


# ----------------------------------------------------------------------------- CKA


def _z_names(model: HookedMHATransformer) -> list[str]:
    return [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]


def _flat_z(model: HookedMHATransformer, acts: dict[str, Tensor], mask: Tensor) -> Tensor:
    """``[N real positions, L * h * d_head]`` float64: every head's z, layer-major."""
    z = torch.cat([acts[name].flatten(2) for name in _z_names(model)], dim=-1)  # (B, T, D)
    return z.double().cpu()[mask]


def _output_grams(model: HookedMHATransformer) -> Float[Tensor, "H d_head d_head"]:
    """``W_O[h] W_O[h]^T`` for every head (float64, CPU), layer-major."""
    W_O = model.W_O.detach().double().cpu().flatten(0, 1)  # (H, d_head, d_model)
    return W_O @ W_O.transpose(-1, -2)


def _head_blocks(cov: Tensor, d_a: int, d_b: int) -> Float[Tensor, "HA HB da db"]:
    """Cut a ``[HA * da, HB * db]`` covariance into per-head-pair blocks."""
    HA, HB = cov.shape[0] // d_a, cov.shape[1] // d_b
    return cov.reshape(HA, d_a, HB, d_b).permute(0, 2, 1, 3)


def _hsic(
    gram_a: Tensor, blocks: Float[Tensor, "HA HB da db"], gram_b: Tensor
) -> Float[Tensor, "HA HB"]:
    """``||W_O[i]^T C_ij W_O[j]||_F^2 = tr(K_i C_ij K_j C_ij^T)`` with ``K = W_O W_O^T``:
    everything in d_head x d_head, never d_model x d_model."""
    left = torch.einsum("iab,ijbc,jcd->ijad", gram_a, blocks, gram_b)
    return (left * blocks).sum((-1, -2)).clamp(min=0)


def _cka(
    model_a: HookedMHATransformer,
    model_b: HookedMHATransformer,
    data: Data,
    padding_mask: Tensor | None,
    **run: Any,
) -> Tensor:
    """Linear CKA of hook_result between every head of A and every head of B.

    ``hook_result`` of head h is ``X_h = z_h @ W_O[h]``, so the centred cross-covariance of two
    heads is ``W_O[h]^T Cov(z_h, z_g) W_O[g]`` and linear CKA,
    ``||X_h^T X_g||_F^2 / (||X_h^T X_h||_F ||X_g^T X_g||_F)`` on centred X, needs only the
    covariance of the z's (``[L * d_model]^2``), never a ``d_model x d_model`` matrix per pair.
    """
    if model_a.cfg.d_model != model_b.cfg.d_model:
        raise ValueError(
            f"cka compares residual-stream writes, so both models need the same d_model; got "
            f"{model_a.cfg.d_model} and {model_b.cfg.d_model}"
        )
    same = model_a is model_b
    names = [_z_names(model_a), _z_names(model_b)]
    n = 0.0
    sums: dict[str, Tensor | float] = {"a": 0.0, "b": 0.0, "aa": 0.0, "bb": 0.0, "ab": 0.0}
    da, db = model_a.cfg.d_head, model_b.cfg.d_head
    for mask, (acts_a, acts_b) in _batches([model_a, model_b], data, padding_mask, names, **run):
        za = _flat_z(model_a, acts_a, mask)  # (N, HA * da)
        zb = za if same else _flat_z(model_b, acts_b, mask)
        n += za.shape[0]
        sums["a"] = sums["a"] + za.sum(0)
        sums["b"] = sums["b"] + zb.sum(0)
        sums["ab"] = sums["ab"] + za.T @ zb
        if not same:  # only the per-head diagonal blocks are needed for the normalisers
            sums["aa"] = sums["aa"] + _self_blocks(za, da)
            sums["bb"] = sums["bb"] + _self_blocks(zb, db)
    mean_a, mean_b = sums["a"] / n, sums["b"] / n
    cross = _head_blocks(sums["ab"] / n - torch.outer(mean_a, mean_b), da, db)
    if same:
        self_a = self_b = torch.diagonal(cross, dim1=0, dim2=1).permute(2, 0, 1)  # (H, d, d)
    else:
        self_a = sums["aa"] / n - _outer_blocks(mean_a, da)
        self_b = sums["bb"] / n - _outer_blocks(mean_b, db)
    gram_a, gram_b = _output_grams(model_a), _output_grams(model_b)
    hsic = _hsic(gram_a, cross, gram_b)  # ||X_i^T X_j||_F^2
    norm_a = _self_hsic(gram_a, self_a).sqrt()  # ||X_i^T X_i||_F
    norm_b = _self_hsic(gram_b, self_b).sqrt()
    cka = hsic / torch.outer(norm_a, norm_b).clamp(min=1e-300)
    tiny_a = norm_a <= 1e-12 * max(float(norm_a.max()), 1e-300)
    tiny_b = norm_b <= 1e-12 * max(float(norm_b.max()), 1e-300)
    return _degenerate_fix(cka.clamp(0, 1), tiny_a, tiny_b)


def _self_hsic(gram: Tensor, blocks: Float[Tensor, "H d d"]) -> Float[Tensor, " H"]:
    """``||W_O[h]^T C_hh W_O[h]||_F^2`` for every head."""
    left = torch.einsum("hab,hbc,hcd->had", gram, blocks, gram)
    return (left * blocks).sum((-1, -2)).clamp(min=0)


def _self_blocks(z: Tensor, d: int) -> Float[Tensor, "H d d"]:
    """Per-head ``z_h^T z_h`` blocks of ``z: [N, H * d]``."""
    heads = z.reshape(z.shape[0], -1, d)  # (N, H, d)
    return torch.einsum("nhd,nhe->hde", heads, heads)


def _outer_blocks(mean: Tensor, d: int) -> Float[Tensor, "H d d"]:
    heads = mean.reshape(-1, d)
    return heads[:, :, None] * heads[:, None, :]


# ----------------------------------------------------------------------------- weight space


def _circuit_similarity(model: HookedMHATransformer, method: str) -> Tensor:
    """Frobenius cosine of every pair of heads' OV (``W_V W_O``) or QK (``W_Q W_K^T``) maps."""
    with torch.no_grad():
        if method == "ov":
            left, right = model.W_V, model.W_O  # (L, h, d_model, d_head), (L, h, d_head, d_model)
        else:
            left, right = model.W_Q, model.W_K.transpose(-1, -2)
        circuits = (left.double() @ right.double()).flatten(0, 1).flatten(1).cpu()  # (H, d²)
    norms = circuits.norm(dim=-1)  # (H,)
    cosine = (circuits @ circuits.T) / torch.outer(norms, norms).clamp(min=1e-300)
    zero = norms <= 1e-12 * max(float(norms.max()), 1e-300)
    return _degenerate_fix(cosine.clamp(-1, 1), zero, zero)


# ----------------------------------------------------------------------------- separation


def _check_reference(reference: Any, model: HookedMHATransformer) -> None:
    _check_model(reference, "reference")
    if reference.cfg.n_heads != 1:
        raise ValueError(
            f"reference must be a one-head model (the seed's single-head baseline); it has "
            f"n_heads={reference.cfg.n_heads}"
        )
    if reference.cfg.n_layers != model.cfg.n_layers:
        raise ValueError(
            f"reference must have the model's n_layers={model.cfg.n_layers} (its layer l is "
            f"compared with layer l); it has n_layers={reference.cfg.n_layers}"
        )
    _check_same_masking(model, reference)


def _reference_labels(reference: HookedMHATransformer) -> list[str]:
    return [f"ref:{head_label(layer, 0)}" for layer in range(reference.cfg.n_layers)]


def _attention_inputs(
    model: HookedMHATransformer, acts: dict[str, Tensor]
) -> list[Float[Tensor, "B T d_model"]]:
    """What each layer's heads read: ``ln1(resid_pre)`` (float64, CPU)."""
    inputs = []
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            resid = acts[f"blocks.{layer}.hook_resid_pre"]
            inputs.append(block.ln1(resid).double().cpu())
    return inputs


def _query_bounds(
    x_a: Tensor, x_b: Tensor, padding_mask: Tensor, causal: bool
) -> Float[Tensor, "B T"]:
    """Per query, the largest possible distance between a context built from layer a's inputs
    and one built from layer b's: ``max ||x_a[k] - x_b[k']||`` over the keys the query may see
    (the maximum of a convex function over two simplices sits at their vertices)."""
    real_pair = padding_mask[:, :, None] & padding_mask[:, None, :]  # (B, k, k')
    dist = torch.cdist(x_a, x_b).masked_fill(~real_pair, 0.0)  # (B, T, T)
    T = dist.shape[-1]
    if not causal:  # every real query sees every real key
        return dist.flatten(1).amax(-1)[:, None].expand(-1, T)
    # Causal: query q sees keys 0..q, so the bound is a running maximum over q of the largest
    # distance that involves position q and an earlier (or the same) position.
    newest = torch.maximum(torch.tril(dist).amax(-1), torch.tril(dist.transpose(1, 2)).amax(-1))
    return torch.cummax(newest, dim=-1).values


def _pairwise_distances(context: Float[Tensor, "B H T d"]) -> Float[Tensor, "B T H H"]:
    """``||c_i(q) - c_j(q)||`` for every pair of heads, from Gram matrices (one batched matmul)."""
    flat = context.transpose(1, 2)  # (B, T, H, d)
    gram = flat @ flat.transpose(-1, -2)  # (B, T, H, H)
    sq = torch.diagonal(gram, dim1=-2, dim2=-1)  # (B, T, H)
    return (sq[..., :, None] + sq[..., None, :] - 2 * gram).clamp(min=0).sqrt()


def _separation_sums(
    patterns: Float[Tensor, "B H T T"],
    inputs: Float[Tensor, "B L T d_model"],
    layer_of: Tensor,
    padding_mask: Tensor,
    causal: bool,
) -> tuple[Tensor, Tensor, float]:
    """Sums over counted queries of the context distance and scaled distance, ``[H, H]`` each."""
    dist = _pairwise_distances(patterns @ inputs[:, layer_of])  # (B, T, H, H)
    queries = statistic_queries(visible_keys(padding_mask, causal))
    weight = queries.double()[:, :, None, None]  # (B, T, 1, 1)
    n_layers = inputs.shape[1]
    bounds = torch.stack(
        [
            torch.stack(
                [
                    _query_bounds(inputs[:, a], inputs[:, b], padding_mask, causal)
                    for b in range(n_layers)
                ],
                dim=-1,
            )
            for a in range(n_layers)
        ],
        dim=-2,
    )  # (B, T, L, L)
    pair_bounds = bounds[:, :, layer_of][:, :, :, layer_of]  # (B, T, H, H)
    scaled = torch.where(pair_bounds > 0, dist / pair_bounds.clamp(min=1e-300), 0.0)
    return (
        (dist * weight).sum((0, 1)),
        (scaled.clamp(max=1.0) * weight).sum((0, 1)),
        float(queries.sum()),
    )


def head_separation(
    model: HookedMHATransformer,
    tokens: Data,
    padding_mask: Tensor | None = None,
    *,
    reference: HookedMHATransformer | None = None,
    batch_size: int = 256,
    n_eval: int = 1024,
    progress: bool = False,
) -> pd.DataFrame:
    """The seed's head separation: L2 distance between two heads' context vectors.

    Seed 004 gives each head a *context vector*, the attention-weighted sum of the tokens'
    values, with the same values for every head (only the weights differ), and calls the L2
    distance between two heads' context vectors their *separation*; its ``difference_from_single``
    compares each head with a single-head model's context. Here, for head ``h`` in layer ``l``
    and query ``q``, ``c_h(q) = sum_k A_h[q, k] x_l[k]``, where ``x_l = ln1(resid_pre)`` is what
    every head of layer ``l`` reads (shared values, as in the seed; W_V/W_O are left out so the
    measure isolates *where* heads look; use ``cka`` for *what* they write). The distance
    ``||c_g(q) - c_h(q)||`` is averaged over the real queries that see >= 2 keys and over
    sequences.

    Because a context vector is a convex combination of the visible keys' ``x``, the distance
    for a query is at most ``bound(q) = max_{k, k'} ||x_l[k] - x_l'[k']||`` over its visible
    keys. ``scaled_distance`` is the mean of ``distance(q) / bound(q)`` (in [0, 1]) and
    ``similarity = 1 - scaled_distance``.

    With ``reference`` (a one-head model with the same number of layers and masking) its head
    in layer ``l`` joins as ``"ref:L{l}H0"``: its pattern is applied to *this* model's ``x_l``
    (the seed's ``single_weight`` column over the same token values), so
    ``distance(head, "ref:L{l}H0")`` is the seed's ``difference_from_single``, in norm.

    Args:
        model: The model.
        tokens: Task, Batch or ``[n, pos]`` tokens.
        padding_mask: With a token tensor only.
        reference: Optional one-head model (e.g. the h=1 run of the same sweep).
        batch_size: Sequences per forward pass.
        n_eval: Size of a task's evaluation set.
        progress: tqdm bar over batches.

    Returns:
        Tidy DataFrame, one row per ordered pair of heads (self-pairs included):
        ``head_a, head_b, distance, scaled_distance, similarity, n_queries``.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> sep = head_separation(handbuilt_model(["previous", "previous", "first"]),
        ...                       torch.randint(0, 10, (8, 16)))
        >>> sep.query("head_a == 'L0H0' and head_b == 'L0H1'").distance.round(4).tolist()
        [0.0]
    """
    _check_model(model)
    models, labels = [model], _labels(model)
    names = [
        [
            *pattern_hook_names(model),
            *[f"blocks.{lay}.hook_resid_pre" for lay in range(model.cfg.n_layers)],
        ]
    ]
    if reference is not None:
        _check_reference(reference, model)
        models.append(reference)
        names.append(pattern_hook_names(reference))
        labels = labels + _reference_labels(reference)
    layers = [lay for lay in range(model.cfg.n_layers) for _ in range(model.cfg.n_heads)]
    if reference is not None:
        layers += list(range(reference.cfg.n_layers))
    layer_of = torch.tensor(layers)
    H = len(labels)
    dist_sum = torch.zeros(H, H, dtype=torch.float64)
    scaled_sum = torch.zeros(H, H, dtype=torch.float64)
    n_queries = 0.0
    run = dict(batch_size=batch_size, n_eval=n_eval, progress=progress)
    for mask, captured in _batches(models, tokens, padding_mask, names, **run):
        patterns = torch.cat(
            [_stacked_patterns(m, acts, mask) for m, acts in zip(models, captured, strict=True)],
            dim=1,
        )  # (B, H, T, T)
        inputs = torch.stack(_attention_inputs(model, captured[0]), dim=1)  # (B, L, T, d_model)
        per_row = H * patterns.shape[-1] * inputs.shape[-1]  # context floats per sequence
        for rows in _row_chunks(patterns.shape[0], per_row):
            sums = _separation_sums(
                patterns[rows], inputs[rows], layer_of, mask[rows], model.cfg.causal
            )
            dist_sum += sums[0]
            scaled_sum += sums[1]
            n_queries += sums[2]
    denom = max(n_queries, 1.0)
    mean_dist, mean_scaled = dist_sum / denom, scaled_sum / denom
    grid_a, grid_b = np.meshgrid(np.arange(H), np.arange(H), indexing="ij")
    return pd.DataFrame(
        {
            "head_a": np.array(labels)[grid_a.ravel()],
            "head_b": np.array(labels)[grid_b.ravel()],
            "distance": mean_dist.numpy().ravel(),
            "scaled_distance": mean_scaled.numpy().ravel(),
            "similarity": 1.0 - mean_scaled.numpy().ravel(),
            "n_queries": int(n_queries),
        }
    )


# ----------------------------------------------------------------------------- public API


def head_similarity(
    model: HookedMHATransformer,
    tokens: Data | None = None,
    method: str = "js",
    padding_mask: Tensor | None = None,
    reference: HookedMHATransformer | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = 1024,
    progress: bool = False,
) -> pd.DataFrame:
    """Square head x head similarity matrix of one model (all layers), by ``method``.

    Args:
        model: The model.
        tokens: A Task (its evaluation set), a Batch or ``[n, pos]`` tokens; not needed for
            ``"ov"`` and ``"qk"``.
        method: One of :data:`SIMILARITY_METHODS` (see the module docstring for each one's
            definition and range).
        padding_mask: With a token tensor only: True for real tokens.
        reference: Only for ``"separation"``: a one-head model whose heads join the matrix as
            ``"ref:L{l}H0"`` (see :func:`head_separation`).
        batch_size: Sequences per forward pass (data is streamed batch by batch).
        n_eval: Size of a task's evaluation set.
        progress: tqdm bar over batches.

    Returns:
        DataFrame indexed (``head_a``) and columned (``head_b``) by head label, e.g.
        ``"L0H0" .. "L1H3"``; larger = more similar. Symmetric.

    Raises:
        ValueError: For an unknown method, missing tokens, or ``reference`` with another method.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> model = handbuilt_model(["previous", "uniform", "previous"])
        >>> sim = head_similarity(model, torch.randint(0, 10, (16, 16)), method="js")
        >>> float(sim.loc["L0H0", "L0H2"]), bool(sim.loc["L0H0", "L0H1"] < 0.5)
        (1.0, True)
    """
    _check_model(model)
    _check_method(method, SIMILARITY_METHODS)
    if reference is not None and method != "separation":
        raise ValueError(f"reference is only used by method='separation', not {method!r}")
    labels = _labels(model)
    if method in ("ov", "qk"):
        return _head_frame(_circuit_similarity(model, method), labels, labels)
    if tokens is None:
        raise ValueError(f"method={method!r} needs tokens (a Task, a Batch or [n, pos] tokens)")
    run = dict(batch_size=batch_size, n_eval=n_eval, progress=progress)
    if method == "separation":
        table = head_separation(model, tokens, padding_mask, reference=reference, **run)
        order = list(dict.fromkeys(table["head_a"]))
        square = table.pivot(index="head_a", columns="head_b", values="similarity")
        return _head_frame(square.loc[order, order].to_numpy(), order, order)
    return cross_model_similarity(model, model, tokens, method, padding_mask, **run)


def cross_model_similarity(
    model_a: HookedMHATransformer,
    model_b: HookedMHATransformer,
    tokens: Data,
    method: str = "js",
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = 1024,
    progress: bool = False,
) -> pd.DataFrame:
    """Similarity of every head of ``model_a`` to every head of ``model_b`` on the same tokens.

    The models may differ in head count, seed and ``d_head``; they must accept the tokens and
    mask attention the same way (both causal or both not). ``"cka"`` also needs the same
    ``d_model``. Feed the result to :func:`match_heads` to pair heads across seeds.

    Args:
        model_a: Rows of the result.
        model_b: Columns of the result.
        tokens: Task, Batch or ``[n, pos]`` tokens.
        method: One of :data:`CROSS_MODEL_METHODS` (``"js"``, ``"pattern_corr"``, ``"cka"``).
        padding_mask: With a token tensor only.
        batch_size: Sequences per forward pass.
        n_eval: Size of a task's evaluation set.
        progress: tqdm bar over batches.

    Returns:
        DataFrame indexed by ``model_a``'s head labels (``head_a``) and columned by
        ``model_b``'s (``head_b``).

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> a = handbuilt_model(["previous", "first"], d_head=18)
        >>> b = handbuilt_model(["first", "previous", "self"])
        >>> sim = cross_model_similarity(a, b, torch.randint(0, 10, (8, 16)))
        >>> sim.shape, sim.loc["L0H0"].idxmax()
        ((2, 3), 'L0H1')
    """
    _check_model(model_a, "model_a")
    _check_model(model_b, "model_b")
    _check_method(method, CROSS_MODEL_METHODS)
    run = dict(batch_size=batch_size, n_eval=n_eval, progress=progress)
    if method == "cka":
        values = _cka(model_a, model_b, tokens, padding_mask, **run)
    else:
        values = _pattern_similarity(model_a, model_b, tokens, padding_mask, method, **run)
    return _head_frame(values, _labels(model_a), _labels(model_b))


def similarity_frame(similarity: pd.DataFrame, method: str | None = None) -> pd.DataFrame:
    """Long (tidy) form of a similarity matrix: ``head_a, head_b, similarity`` (+ ``method``).

    Example:
        >>> m = pd.DataFrame([[1.0, 0.5], [0.5, 1.0]], index=["L0H0", "L0H1"],
        ...                  columns=["L0H0", "L0H1"])
        >>> similarity_frame(m).similarity.tolist()
        [1.0, 0.5, 0.5, 1.0]
    """
    _check_frame(similarity, square=False)
    rows, cols = list(similarity.index), list(similarity.columns)
    grid_a, grid_b = np.meshgrid(np.arange(len(rows)), np.arange(len(cols)), indexing="ij")
    frame = pd.DataFrame(
        {
            "head_a": np.array(rows, dtype=object)[grid_a.ravel()],
            "head_b": np.array(cols, dtype=object)[grid_b.ravel()],
            "similarity": similarity.to_numpy(dtype=float).ravel(),
        }
    )
    if method is not None:
        frame.insert(0, "method", method)
    return frame


# ----------------------------------------------------------------------------- structure


def _check_frame(similarity: Any, *, square: bool = True) -> None:
    if not isinstance(similarity, pd.DataFrame):
        raise TypeError(
            f"similarity must be a pandas DataFrame (from head_similarity), got "
            f"{type(similarity).__name__}"
        )
    if similarity.empty:
        raise ValueError("similarity is empty")
    if square and list(similarity.index) != list(similarity.columns):
        raise ValueError(
            "similarity must be square with the same head labels on both axes (from "
            "head_similarity); use match_heads for a model-A x model-B matrix"
        )
    if not np.isfinite(similarity.to_numpy(dtype=float)).all():
        raise ValueError("similarity contains NaN or infinite values")


def dissimilarity(similarity: pd.DataFrame) -> pd.DataFrame:
    """``1 - similarity``, symmetrised, clipped at 0, with a zero diagonal: the distance that
    :func:`cluster_heads` and :func:`head_map_mds` use (in [0, 1] for methods in [0, 1] and
    [0, 2] for the correlation-like ones in [-1, 1]).

    Example:
        >>> m = pd.DataFrame([[1.0, 0.25], [0.25, 1.0]], index=["a", "b"], columns=["a", "b"])
        >>> dissimilarity(m).to_numpy().tolist()
        [[0.0, 0.75], [0.75, 0.0]]
    """
    _check_frame(similarity)
    values = similarity.to_numpy(dtype=float)
    dist = np.clip(1.0 - (values + values.T) / 2.0, 0.0, None)
    np.fill_diagonal(dist, 0.0)
    return pd.DataFrame(dist, index=similarity.index, columns=similarity.columns)


_LINKAGE_METHODS = ("average", "complete", "single", "weighted")


def head_linkage(similarity: pd.DataFrame, *, method: str = "average") -> np.ndarray:
    """SciPy linkage matrix of the heads (on :func:`dissimilarity`), with optimal leaf order.

    Example:
        >>> m = pd.DataFrame(np.eye(3), index=list("abc"), columns=list("abc"))
        >>> head_linkage(m).shape
        (2, 4)
    """
    if method not in _LINKAGE_METHODS:
        raise ValueError(f"method={method!r} is invalid; allowed: {', '.join(_LINKAGE_METHODS)}")
    if len(similarity) < 2:
        raise ValueError("clustering needs at least 2 heads")
    dist = squareform(dissimilarity(similarity).to_numpy(), checks=False)
    tree = linkage(dist, method=method)
    return optimal_leaf_ordering(tree, dist) if len(similarity) > 2 else tree


def cluster_heads(
    similarity: pd.DataFrame,
    *,
    n_clusters: int | None = None,
    threshold: float = 0.5,
    method: str = "average",
) -> pd.DataFrame:
    """Hierarchical (agglomerative) clustering of heads from a similarity matrix.

    Distances are :func:`dissimilarity` (``1 - similarity``); ``method`` is the SciPy linkage.
    Either cut the tree into ``n_clusters`` clusters, or (default) merge heads whose linkage
    distance is at most ``threshold``.

    Args:
        similarity: Square matrix from :func:`head_similarity`.
        n_clusters: Number of clusters; overrides ``threshold``.
        threshold: Distance cut when ``n_clusters`` is None (0.5 = similarity 0.5).
        method: ``"average"``, ``"complete"``, ``"single"`` or ``"weighted"``.

    Returns:
        DataFrame ``head_label, cluster, order``: cluster ids start at 1 and are numbered in
        leaf order; ``order`` is the head's position in the dendrogram's (optimal) leaf order,
        which puts similar heads next to each other. Rows are in the input's order.

    Example:
        >>> m = pd.DataFrame([[1, .9, 0], [.9, 1, 0], [0, 0, 1]], index=["L0H0", "L0H1", "L0H2"],
        ...                  columns=["L0H0", "L0H1", "L0H2"], dtype=float)
        >>> c = cluster_heads(m).cluster
        >>> bool(c[0] == c[1] != c[2])
        True
    """
    _check_frame(similarity)
    labels = list(similarity.index)
    if len(labels) == 1:
        return pd.DataFrame({"head_label": labels, "cluster": [1], "order": [0]})
    if n_clusters is not None and (
        not isinstance(n_clusters, int) or not 1 <= n_clusters <= len(labels)
    ):
        raise ValueError(
            f"n_clusters={n_clusters!r} is invalid: must be an int in [1, {len(labels)}]"
        )
    tree = head_linkage(similarity, method=method)
    if n_clusters is not None:
        raw = fcluster(tree, t=n_clusters, criterion="maxclust")
    else:
        raw = fcluster(tree, t=threshold, criterion="distance")
    leaves = leaves_list(tree)
    order = np.empty(len(labels), dtype=int)
    order[leaves] = np.arange(len(labels))
    # Renumber clusters 1, 2, ... in the order they appear along the leaves.
    renumber: dict[int, int] = {}
    for leaf in leaves:
        renumber.setdefault(int(raw[leaf]), len(renumber) + 1)
    clusters = [renumber[int(c)] for c in raw]
    return pd.DataFrame({"head_label": labels, "cluster": clusters, "order": order})


def _mds_estimator(random_state: int) -> MDS:
    """A metric MDS on precomputed dissimilarities, across scikit-learn's API change (1.8)."""
    params = inspect.signature(MDS).parameters
    if "metric_mds" in params:  # scikit-learn >= 1.8: `metric` names the dissimilarity
        return MDS(
            n_components=2,
            metric="precomputed",
            metric_mds=True,
            init="classical_mds",
            random_state=random_state,
        )
    return MDS(
        n_components=2,
        dissimilarity="precomputed",
        metric=True,
        n_init=4,
        random_state=random_state,
        normalized_stress="auto",
    )


def head_map_mds(similarity: pd.DataFrame, *, random_state: int = 0) -> pd.DataFrame:
    """A 2-D map of the heads: metric MDS (scikit-learn) on :func:`dissimilarity`.

    Heads close on the map have similar behaviour under the chosen method; the axes have no
    meaning of their own (any rotation/reflection is equally valid).

    Args:
        similarity: Square matrix from :func:`head_similarity`.
        random_state: Seed of the MDS optimiser.

    Returns:
        DataFrame ``head_label, x, y`` in the input's order.

    Example:
        >>> m = pd.DataFrame([[1, 1, 0], [1, 1, 0], [0, 0, 1]], index=["a", "b", "c"],
        ...                  columns=["a", "b", "c"], dtype=float)
        >>> xy = head_map_mds(m)
        >>> bool(abs(xy.x[0] - xy.x[1]) + abs(xy.y[0] - xy.y[1]) < 1e-3)
        True
    """
    _check_frame(similarity)
    labels = list(similarity.index)
    if len(labels) < 3:
        # MDS of 1 or 2 points: place them on the x axis at their distance.
        dist = dissimilarity(similarity).to_numpy()
        xs = [0.0] if len(labels) == 1 else [-dist[0, 1] / 2, dist[0, 1] / 2]
        return pd.DataFrame({"head_label": labels, "x": xs, "y": [0.0] * len(labels)})
    coords = _mds_estimator(random_state).fit_transform(dissimilarity(similarity).to_numpy())
    return pd.DataFrame({"head_label": labels, "x": coords[:, 0], "y": coords[:, 1]})


def match_heads(similarity: pd.DataFrame) -> pd.DataFrame:
    """Pair the heads of model A (rows) with those of model B (columns), one-to-one, maximising
    the total similarity (Hungarian assignment, ``scipy.optimize.linear_sum_assignment``).

    With different head counts the larger side keeps ``|h_A - h_B|`` heads unmatched; they are
    listed with an empty partner.

    Args:
        similarity: Rows = heads of A, columns = heads of B (from
            :func:`cross_model_similarity`, or any DataFrame of similarities).

    Returns:
        DataFrame ``head_a, head_b, similarity``: the matched pairs in row order, then the
        unmatched heads (``head_b`` or ``head_a`` None, similarity NaN).

    Example:
        >>> m = pd.DataFrame([[0.1, 0.9], [0.8, 0.2]], index=["L0H0", "L0H1"],
        ...                  columns=["L0H0", "L0H1"])
        >>> match_heads(m).head_b.tolist()
        ['L0H1', 'L0H0']
    """
    _check_frame(similarity, square=False)
    values = similarity.to_numpy(dtype=float)
    rows, cols = linear_sum_assignment(values, maximize=True)
    labels_a, labels_b = list(similarity.index), list(similarity.columns)
    records = [
        (labels_a[i], labels_b[j], float(values[i, j])) for i, j in zip(rows, cols, strict=True)
    ]
    matched_a, matched_b = set(rows.tolist()), set(cols.tolist())
    records += [(a, None, math.nan) for i, a in enumerate(labels_a) if i not in matched_a]
    records += [(None, b, math.nan) for j, b in enumerate(labels_b) if j not in matched_b]
    return pd.DataFrame(records, columns=["head_a", "head_b", "similarity"])
