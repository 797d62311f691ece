"""Operations on similarity matrices: long form, distance, clustering, a 2-D map, matching.

They take the DataFrames of :func:`~mhainterp.similarity.head_similarity` (square, one model)
or :func:`~mhainterp.similarity.cross_model_similarity` (model A x model B) and need no model.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd
from scipy.cluster.hierarchy import fcluster, leaves_list, linkage, optimal_leaf_ordering
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import squareform
from sklearn.manifold import MDS

from mhainterp.validation import ParameterError, check_int, check_option

__all__ = [
    "Linkage",
    "cluster_heads",
    "dissimilarity",
    "head_linkage",
    "head_map_mds",
    "match_heads",
    "similarity_frame",
]


def similarity_frame(similarity: pd.DataFrame, method: str | None = None) -> pd.DataFrame:
    """Long (tidy) form of a similarity matrix: ``head_a, head_b, similarity`` (+ ``method``).

    Example:
        >>> m = pd.DataFrame([[1.0, 0.5], [0.5, 1.0]], index=["L0H0", "L0H1"],
        ...                  columns=["L0H0", "L0H1"])
        >>> similarity_frame(m).similarity.tolist()
        [1.0, 0.5, 0.5, 1.0]
    """
    check_frame(similarity, square=False)
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


def check_frame(similarity: Any, *, square: bool = True, finite: bool = True) -> None:
    """Refuse what is not a similarity table of :func:`head_similarity`'s shape (one message
    format for the matrix operations and the figures)."""
    if not isinstance(similarity, pd.DataFrame):
        raise TypeError(
            f"similarity must be a pandas DataFrame (from head_similarity), got "
            f"{type(similarity).__name__}"
        )
    if similarity.empty:
        raise ParameterError("similarity is invalid: a non-empty table, got an empty one")
    if square and list(similarity.index) != list(similarity.columns):
        raise ParameterError(
            "similarity is invalid: a square table with the same head labels on both axes (from "
            "head_similarity); use match_heads for a model-A x model-B matrix"
        )
    if finite and not np.isfinite(similarity.to_numpy(dtype=float)).all():
        raise ParameterError("similarity is invalid: finite values, got NaN or infinite ones")


def dissimilarity(similarity: pd.DataFrame) -> pd.DataFrame:
    """``1 - similarity``, symmetrised, clipped at 0, with a zero diagonal: the distance that
    :func:`cluster_heads` and :func:`head_map_mds` use (in [0, 1] for methods in [0, 1] and
    [0, 2] for the correlation-like ones in [-1, 1]).

    Example:
        >>> m = pd.DataFrame([[1.0, 0.25], [0.25, 1.0]], index=["a", "b"], columns=["a", "b"])
        >>> dissimilarity(m).to_numpy().tolist()
        [[0.0, 0.75], [0.75, 0.0]]
    """
    check_frame(similarity)
    values = similarity.to_numpy(dtype=float)
    dist = np.clip(1.0 - (values + values.T) / 2.0, 0.0, None)
    np.fill_diagonal(dist, 0.0)
    return pd.DataFrame(dist, index=similarity.index, columns=similarity.columns)


Linkage = Literal["average", "complete", "single", "weighted"]
"""SciPy linkage methods of :func:`head_linkage` and :func:`cluster_heads`."""
_LINKAGE_METHODS: tuple[Linkage, ...] = get_args(Linkage)


def head_linkage(similarity: pd.DataFrame, *, method: Linkage = "average") -> np.ndarray:
    """SciPy linkage matrix of the heads (on :func:`dissimilarity`), with optimal leaf order.

    Example:
        >>> m = pd.DataFrame(np.eye(3), index=list("abc"), columns=list("abc"))
        >>> head_linkage(m).shape
        (2, 4)
    """
    check_option("method", method, _LINKAGE_METHODS)
    if len(similarity) < 2:
        raise ParameterError(
            f"similarity is invalid: at least 2 heads to cluster, got {len(similarity)}"
        )
    dist = squareform(dissimilarity(similarity).to_numpy(), checks=False)
    tree = linkage(dist, method=method)
    return optimal_leaf_ordering(tree, dist) if len(similarity) > 2 else tree


def cluster_heads(
    similarity: pd.DataFrame,
    *,
    n_clusters: int | None = None,
    threshold: float = 0.5,
    method: Linkage = "average",
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
    check_frame(similarity)
    labels = list(similarity.index)
    if len(labels) == 1:
        return pd.DataFrame({"head_label": labels, "cluster": [1], "order": [0]})
    if n_clusters is not None:
        check_int("n_clusters", n_clusters, minimum=1, maximum=len(labels))
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
    check_frame(similarity)
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
    check_frame(similarity, square=False)
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
