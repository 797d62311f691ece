"""The seed's head separation (seed 004): the L2 distance between two heads' context vectors.

See :func:`head_separation`; :func:`~mhainterp.similarity.head_similarity` with
``method="separation"`` turns it into a similarity matrix.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from mhainterp.capture import (
    Data,
    iter_activations,
    pattern_hook_names,
    statistic_queries,
    visible_keys,
)
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.heads import head_label
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import check_model
from mhainterp.runtime import uses_work_threads
from mhainterp.similarity.measures import check_same_masking, row_chunks, stacked_patterns
from mhainterp.validation import ParameterError

__all__ = ["head_separation"]


def _check_reference(reference: HookedMHATransformer, model: HookedMHATransformer) -> None:
    check_model(reference, "reference")
    if reference.cfg.n_heads != 1:
        raise ParameterError(
            f"reference is invalid: a one-head model (the seed's single-head baseline), got "
            f"n_heads={reference.cfg.n_heads}"
        )
    if reference.cfg.n_layers != model.cfg.n_layers:
        raise ParameterError(
            f"reference is invalid: a model with the model's n_layers={model.cfg.n_layers} (its "
            f"layer l is compared with layer l), got n_layers={reference.cfg.n_layers}"
        )
    check_same_masking(model, reference)


def _reference_labels(reference: HookedMHATransformer) -> list[str]:
    return [f"ref:{head_label(layer, 0)}" for layer in range(reference.cfg.n_layers)]


_STATISTICS_DEVICE = "cpu"  # results handed back: the statistics run on the host (float64)


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


@uses_work_threads
def head_separation(
    model: HookedMHATransformer,
    tokens: Data,
    padding_mask: Tensor | None = None,
    *,
    reference: HookedMHATransformer | None = None,
    batch_size: int = 256,
    n_eval: int = DEFAULT_N_EVAL,
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
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> sep = head_separation(handbuilt_model(["previous", "previous", "first"]),
        ...                       torch.randint(0, 10, (8, 16)))
        >>> sep.query("head_a == 'L0H0' and head_b == 'L0H1'").distance.round(4).tolist()
        [0.0]
    """
    check_model(model)
    models, labels = [model], model.head_labels
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
    H = len(labels)
    # The statistics run where the patterns and inputs are handed back (float64 on the host,
    # as stacked_patterns gives them): the head-to-layer index and the sums live there too.
    layer_of = torch.tensor(layers, device=_STATISTICS_DEVICE)
    dist_sum = torch.zeros(H, H, dtype=torch.float64, device=_STATISTICS_DEVICE)
    scaled_sum = torch.zeros(H, H, dtype=torch.float64, device=_STATISTICS_DEVICE)
    n_queries = 0.0
    run = dict(batch_size=batch_size, n_eval=n_eval, progress=progress)
    parts = iter_activations(models, tokens, names, padding_mask, desc="head similarity", **run)
    for part in parts:
        mask, captured = part.padding_mask, part.activations
        patterns = torch.cat(
            [stacked_patterns(m, acts, mask) for m, acts in zip(models, captured, strict=True)],
            dim=1,
        )  # (B, H, T, T)
        inputs = torch.stack(_attention_inputs(model, captured[0]), dim=1)  # (B, L, T, d_model)
        per_row = H * patterns.shape[-1] * inputs.shape[-1]  # context floats per sequence
        for rows in row_chunks(patterns.shape[0], per_row):
            sums = _separation_sums(
                patterns[rows], inputs[rows], layer_of, mask[rows], model.cfg.causal
            )
            dist_sum += sums[0]
            scaled_sum += sums[1]
            n_queries += sums[2]
    denom = max(n_queries, 1.0)
    mean_dist, mean_scaled = (dist_sum / denom).cpu(), (scaled_sum / denom).cpu()  # the table's
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
