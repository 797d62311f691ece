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

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``capture``, ``config``, ``heads``, ``model``, ``protocol``, ``runtime``,
``validation``.
"""

from __future__ import annotations

import pandas as pd
from torch import Tensor

from mhainterp.capture import Data
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import check_model
from mhainterp.runtime import uses_work_threads
from mhainterp.similarity.matrix import (
    Linkage,
    cluster_heads,
    dissimilarity,
    head_linkage,
    head_map_mds,
    match_heads,
    similarity_frame,
)
from mhainterp.similarity.measures import (
    CROSS_MODEL_METHODS,
    SIMILARITY_METHODS,
    CrossModelMethod,
    SimilarityMethod,
    circuit_similarity,
    cross_model_similarity,
    head_frame,
)
from mhainterp.similarity.separation import head_separation
from mhainterp.validation import check_option, invalid

__all__ = [
    "CROSS_MODEL_METHODS",
    "SIMILARITY_METHODS",
    "CrossModelMethod",
    "Linkage",
    "SimilarityMethod",
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


@uses_work_threads
def head_similarity(
    model: HookedMHATransformer,
    data: Data | None = None,
    method: SimilarityMethod = "js",
    padding_mask: Tensor | None = None,
    reference: HookedMHATransformer | None = None,
    *,
    batch_size: int = 256,
    n_eval: int = DEFAULT_N_EVAL,
    progress: bool = False,
) -> pd.DataFrame:
    """Square head x head similarity matrix of one model (all layers), by ``method``.

    Args:
        model: The model.
        data: A Task (its evaluation set), a Batch or ``[n, pos]`` tokens; not needed for
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
        ValueError: For an unknown method, missing data, or ``reference`` with another method.

    Example:
        >>> import torch
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> model = handbuilt_model(["previous", "uniform", "previous"])
        >>> sim = head_similarity(model, torch.randint(0, 10, (16, 16)), method="js")
        >>> float(sim.loc["L0H0", "L0H2"]), bool(sim.loc["L0H0", "L0H1"] < 0.5)
        (1.0, True)
    """
    check_model(model)
    check_option("method", method, SIMILARITY_METHODS)
    if reference is not None and method != "separation":
        raise invalid("method", method, "'separation' when a reference is given (only it uses one)")
    labels = model.head_labels
    if method in ("ov", "qk"):
        return head_frame(circuit_similarity(model, method), labels, labels)
    if data is None:
        raise invalid("data", data, f"tokens (a Task, a Batch or [n, pos] tokens) for {method=}")
    run = dict(batch_size=batch_size, n_eval=n_eval, progress=progress)
    if method == "separation":
        table = head_separation(model, data, padding_mask, reference=reference, **run)
        order = list(dict.fromkeys(table["head_a"]))
        square = table.pivot(index="head_a", columns="head_b", values="similarity")
        return head_frame(square.loc[order, order].to_numpy(), order, order)
    return cross_model_similarity(model, model, data, method, padding_mask, **run)
