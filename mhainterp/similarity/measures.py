"""The head-similarity measures: js, pattern_corr, cka (through data) and ov, qk (weights).

Each returns a ``[heads of A, heads of B]`` similarity tensor; :func:`cross_model_similarity`
and :func:`~mhainterp.similarity.head_similarity` wrap them in DataFrames. Data is streamed
batch by batch through capture's loop (:func:`mhainterp.capture.iter_activations`) and only
running sums are kept. Definitions and ranges: see :mod:`mhainterp.similarity`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mhainterp.capture import (
    Data,
    iter_activations,
    pattern_hook_names,
    statistic_queries,
    visible_keys,
)
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import check_model
from mhainterp.runtime import uses_work_threads
from mhainterp.validation import ParameterError, check_option

__all__ = [
    "CROSS_MODEL_METHODS",
    "SIMILARITY_METHODS",
    "CrossModelMethod",
    "SimilarityMethod",
    "check_same_masking",
    "circuit_similarity",
    "cross_model_similarity",
    "head_frame",
    "row_chunks",
    "stacked_patterns",
]

SimilarityMethod = Literal["js", "pattern_corr", "cka", "ov", "qk", "separation"]
SIMILARITY_METHODS: tuple[SimilarityMethod, ...] = get_args(SimilarityMethod)
"""Methods of :func:`~mhainterp.similarity.head_similarity`."""
CrossModelMethod = Literal["js", "pattern_corr", "cka"]
CROSS_MODEL_METHODS: tuple[CrossModelMethod, ...] = get_args(CrossModelMethod)
"""Methods of :func:`cross_model_similarity` (those that compare heads through data, not weights
in a model-specific residual basis)."""
_LN2 = math.log(2.0)


# ----------------------------------------------------------------------------- frames


def head_frame(values: Tensor | np.ndarray, rows: list[str], cols: list[str]) -> pd.DataFrame:
    """A ``[rows, cols]`` similarity array as a DataFrame indexed ``head_a``, columned ``head_b``.

    Example:
        >>> head_frame(np.eye(2), ["L0H0", "L0H1"], ["L0H0", "L0H1"]).loc["L0H1", "L0H1"]
        np.float64(1.0)
    """
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


def _stream(
    models: list[HookedMHATransformer],
    data: Data,
    padding_mask: Tensor | None,
    names: list[list[str]],
    **run: Any,
) -> Iterator[tuple[Tensor, list[dict[str, Tensor]]]]:
    """capture's streaming loop over every model: ``(CPU padding_mask, [activations])``."""
    for part in iter_activations(models, data, names, padding_mask, desc="head similarity", **run):
        yield part.padding_mask, part.activations


def stacked_patterns(
    model: HookedMHATransformer, acts: dict[str, Tensor], mask: Bool[Tensor, "B T"]
) -> Float[Tensor, "B H T T"]:
    """All heads' patterns, layer-major, as float64 on the CPU; padding query rows zeroed.

    ``acts`` holds the model's ``hook_pattern`` activations (``[B, h, T, T]`` per layer) and
    ``mask`` is the CPU padding mask they were captured with.
    """
    patterns = torch.cat([acts[name] for name in pattern_hook_names(model)], dim=1)
    return patterns.double().cpu() * mask[:, None, :, None]


def check_same_masking(model_a: HookedMHATransformer, model_b: HookedMHATransformer) -> None:
    """Raise unless both models mask attention alike (both causal or both bidirectional)."""
    if model_a.cfg.causal != model_b.cfg.causal:
        raise ParameterError(
            f"model_b is invalid: a model that masks attention like model_a "
            f"(causal={model_a.cfg.causal}), got causal={model_b.cfg.causal}"
        )


# ----------------------------------------------------------------------------- pattern methods


_CHUNK_ELEMENTS = 2**22  # ~32 MB of float64 per temporary


def row_chunks(n_rows: int, per_row: int) -> list[slice]:
    """Split ``n_rows`` sequences so each chunk's temporaries (``per_row`` float64 numbers per
    sequence) stay near 32 MB.

    Example:
        >>> row_chunks(3, 2**21)
        [slice(0, 2, None), slice(2, 4, None)]
    """
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
    out = torch.zeros(xa.shape[0], xb.shape[0], dtype=torch.float64, device=xa.device)
    for cols in row_chunks(xa.shape[1], xb.shape[0]):
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
    check_same_masking(model_a, model_b)
    names = [pattern_hook_names(model_a), pattern_hook_names(model_b)]
    js_total: Tensor | float = 0.0
    n_queries = 0.0
    corr = _CorrSums()
    for mask, (acts_a, acts_b) in _stream([model_a, model_b], data, padding_mask, names, **run):
        visible = visible_keys(mask, model_a.cfg.causal)  # (B, T, T)
        queries = statistic_queries(visible)  # (B, T)
        entries = visible & queries[:, :, None]  # (B, q, k): counted query, visible key
        xa = stacked_patterns(model_a, acts_a, mask).permute(1, 0, 2, 3)[:, entries]  # (HA, N)
        xb = stacked_patterns(model_b, acts_b, mask).permute(1, 0, 2, 3)[:, entries]  # (HB, N)
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
        raise ParameterError(
            f"model_b is invalid: a model with model_a's d_model={model_a.cfg.d_model} (cka "
            f"compares residual-stream writes; same d_model needed), got {model_b.cfg.d_model}"
        )
    same = model_a is model_b
    names = [_z_names(model_a), _z_names(model_b)]
    n = 0.0
    sums: dict[str, Tensor | float] = {"a": 0.0, "b": 0.0, "aa": 0.0, "bb": 0.0, "ab": 0.0}
    da, db = model_a.cfg.d_head, model_b.cfg.d_head
    for mask, (acts_a, acts_b) in _stream([model_a, model_b], data, padding_mask, names, **run):
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


def circuit_similarity(
    model: HookedMHATransformer, method: Literal["ov", "qk"]
) -> Float[Tensor, "H H"]:
    """Frobenius cosine of every pair of heads' OV (``W_V W_O``) or QK (``W_Q W_K^T``) maps.

    Heads are layer-major (``H = n_layers * n_heads``); a pair with one zero circuit scores 0,
    two zero circuits 1.
    """
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


# ----------------------------------------------------------------------------- across models


@uses_work_threads
def cross_model_similarity(
    model_a: HookedMHATransformer,
    model_b: HookedMHATransformer,
    tokens: Data,
    method: CrossModelMethod = "js",
    padding_mask: Tensor | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = DEFAULT_N_EVAL,
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
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> a = handbuilt_model(["previous", "first"], d_head=18)
        >>> b = handbuilt_model(["first", "previous", "self"])
        >>> sim = cross_model_similarity(a, b, torch.randint(0, 10, (8, 16)))
        >>> sim.shape, sim.loc["L0H0"].idxmax()
        ((2, 3), 'L0H1')
    """
    check_model(model_a, "model_a")
    check_model(model_b, "model_b")
    check_option("method", method, CROSS_MODEL_METHODS)
    run = dict(batch_size=batch_size, n_eval=n_eval, progress=progress)
    if method == "cka":
        values = _cka(model_a, model_b, tokens, padding_mask, **run)
    else:
        values = _pattern_similarity(model_a, model_b, tokens, padding_mask, method, **run)
    return head_frame(values, model_a.head_labels, model_b.head_labels)
