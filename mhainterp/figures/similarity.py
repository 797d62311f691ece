"""Head-similarity figures: a clustered similarity heatmap per method and the MDS head map.

Inputs come from :mod:`mhainterp.similarity` (:func:`~mhainterp.similarity.head_similarity`,
:func:`~mhainterp.similarity.cluster_heads`, :func:`~mhainterp.similarity.head_map_mds`).
"""

from __future__ import annotations

import os
import re

import pandas as pd
from matplotlib.patches import Rectangle

from mhainterp.figures._common import (
    fit_cell_text,
    fit_tick_labels,
    heatmap,
    legend_outside,
    new_figure,
    plt,
    require_columns,
    save_figure,
    sns,
)
from mhainterp.similarity import cluster_heads, similarity_frame
from mhainterp.similarity.matrix import check_frame
from mhainterp.validation import ParameterError

__all__ = ["plot_head_map", "plot_similarity_heatmap"]

_BOUNDED_01 = ("js", "cka", "separation")  # similarity methods whose range is [0, 1]
_HEAD_RE = re.compile(r"^(?:.*:)?L(\d+)H(\d+)$")


def _colour_range(similarity: pd.DataFrame, method: str | None) -> tuple[float, float, str]:
    """[0, 1] with a sequential map, or [-1, 1] with a diverging one for signed methods."""
    if method in _BOUNDED_01:
        return 0.0, 1.0, "viridis"
    if method is None and float(similarity.to_numpy(dtype=float).min()) >= 0:
        return 0.0, 1.0, "viridis"
    return -1.0, 1.0, "vlag"


def _outline_clusters(ax: plt.Axes, clusters_in_order: list[int]) -> None:
    """Draw a box around each run of equal cluster ids along the diagonal."""
    start = 0
    for i in range(1, len(clusters_in_order) + 1):
        if i == len(clusters_in_order) or clusters_in_order[i] != clusters_in_order[start]:
            size = i - start
            ax.add_patch(
                Rectangle((start, start), size, size, fill=False, edgecolor="black", linewidth=2)
            )
            start = i


def plot_similarity_heatmap(
    similarity: pd.DataFrame,
    *,
    method: str | None = None,
    clusters: pd.DataFrame | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    path: str | os.PathLike[str] | None = None,
) -> plt.Figure:
    """Head x head similarity heatmap, heads reordered so clusters sit together (boxed).

    A square matrix (same labels on both axes) is ordered by :func:`cluster_heads` (or by the
    ``clusters`` given); a model-A x model-B matrix is drawn as is.

    Args:
        similarity: Square DataFrame from :func:`~mhainterp.similarity.head_similarity` or a
            rectangular one from :func:`~mhainterp.similarity.cross_model_similarity`.
        method: The similarity method, for the title, colour-bar label and range.
        clusters: :func:`cluster_heads` table; computed with its defaults when None.
        title: Figure title.
        annotate: Write the values in the cells; default when there are at most 12 heads.
            Cells too small for 6-pt text lose their text (the CSV has the numbers).
        path: When given, save the PNG there and the long table (``method, head_a, head_b,
            similarity``, plus ``cluster_a, cluster_b`` for a clustered square matrix) as the CSV.

    Returns:
        The Figure (closed if saved).

    Example:
        >>> sim = head_similarity(model, task, method="js")  # doctest: +SKIP
        >>> fig = plot_similarity_heatmap(sim, method="js")  # doctest: +SKIP
    """
    check_frame(similarity, square=False, finite=False)
    square = list(similarity.index) == list(similarity.columns)
    cluster_of: dict[str, int] = {}
    if square and len(similarity) >= 2:
        if clusters is None:
            clusters = cluster_heads(similarity)
        ordered = clusters.sort_values("order")
        order = list(ordered["head_label"])
        if sorted(order) != sorted(similarity.index):
            raise ParameterError(
                "clusters is invalid: a table listing exactly the heads of similarity (head_label)"
            )
        cluster_of = dict(zip(ordered["head_label"], ordered["cluster"], strict=True))
        similarity = similarity.loc[order, order]
    n_rows, n_cols = similarity.shape
    if annotate is None:
        annotate = max(n_rows, n_cols) <= 12
    vmin, vmax, cmap = _colour_range(similarity, method)
    size = 1.2 + 0.45 * max(n_rows, n_cols)
    fig, ax = new_figure(max(4.5, size + 1.2), max(3.8, size), layout="constrained")
    heatmap(
        similarity,
        ax,
        vmin=vmin,
        vmax=vmax,
        cmap=cmap,
        square=True,
        annot=annotate,
        fmt=".2f",
        annot_kws={"fontsize": 7},
        linewidths=0.3,
        cbar_kws={"label": f"similarity ({method})" if method else "similarity"},
    )
    ax.tick_params(axis="y", rotation=0)
    fit_tick_labels(ax, "x")
    # Turned x labels shrink the square panel a little: the y labels and cells are sized
    # from the same draw all the same (one draw instead of two or three; they look alike)
    fit_tick_labels(ax, "y", drawn=True)
    if annotate:
        fit_cell_text(ax, n_rows, n_cols, drawn=True)
    if cluster_of:
        _outline_clusters(ax, [cluster_of[label] for label in similarity.index])
    ax.set_xlabel("head" if square else "model B head")
    ax.set_ylabel("head" if square else "model A head")
    name = f" ({method})" if method else ""
    default = (
        f"Head similarity{name}, clustered\n(boxes = clusters)"  # fits 4 heads' width
        if cluster_of
        else f"Head similarity{name}"
    )
    # over the whole figure: a panel's title ran under the colour bar beside a narrow panel
    fig.suptitle(title or default)
    data = similarity_frame(similarity, method or "")
    if cluster_of:
        data["cluster_a"] = data["head_a"].map(cluster_of)
        data["cluster_b"] = data["head_b"].map(cluster_of)
    if path is not None:
        save_figure(fig, path, data)
    return fig


def _layer_of(label: str) -> str:
    match = _HEAD_RE.match(str(label))
    prefix = "reference " if str(label).startswith("ref:") else ""
    return f"{prefix}layer {match.group(1)}" if match else "other"


def _natural_key(text: str) -> tuple:
    """Sort "cluster 10" after "cluster 2"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _point_labels(data: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """One label per distinct point; heads at the same spot share it ("L0H0, L0H2")."""
    span = float(max(data["x"].max() - data["x"].min(), data["y"].max() - data["y"].min(), 1e-12))
    spots: list[tuple[float, float, list[str]]] = []
    for label, x, y in zip(data["head_label"], data["x"], data["y"], strict=True):
        for sx, sy, names in spots:
            if abs(sx - x) + abs(sy - y) <= 1e-3 * span:
                names.append(str(label))
                break
        else:
            spots.append((float(x), float(y), [str(label)]))
    return {", ".join(names): (x, y) for x, y, names in spots}


def _distinct_colours(n: int) -> list:
    """``n`` colours, none repeated: tab10 had cluster 11 coloured as cluster 1."""
    if n <= 10:
        return sns.color_palette("tab10", n)
    if n <= 20:
        return sns.color_palette("tab20", n)
    return sns.color_palette("husl", n)


_LABEL_SPOTS = ((4, 4, "left", "bottom"), (-4, 4, "right", "bottom"),
                (4, -4, "left", "top"), (-4, -4, "right", "top"))  # fmt: skip
"""Where a point's label may go (offset in points, alignment): up right first."""


def _place_point_labels(fig: plt.Figure, ax: plt.Axes, labels: list) -> None:
    """Move each point label to the first of :data:`_LABEL_SPOTS` where it stays inside the
    axes and clear of the labels placed before it (measured on one draw of the laid-out
    figure); a label with no such spot keeps the first spot inside the axes, else its own.

    Written up-right always, labels ran into each other and, past the right edge, into the
    legend beside the axes."""
    fig.canvas.draw()  # the layout (constrained, equal aspect) that the saved figure keeps
    renderer = fig.canvas.get_renderer()
    # 2 points inside the edges: the saved figure is drawn again at its own resolution, where
    # a label flush with an edge could land a pixel past it
    margin = 2 * fig.dpi / 72
    inside = ax.get_window_extent(renderer).padded(-margin)
    placed: list = []
    for label in labels:
        fallback = None
        for dx, dy, ha, va in _LABEL_SPOTS:
            label.xyann = (dx, dy)
            label.set_horizontalalignment(ha)
            label.set_verticalalignment(va)
            box = label.get_window_extent(renderer)
            within = inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0
            within = within and box.y1 <= inside.y1
            if within and not any(box.overlaps(other) for other in placed):
                break
            if within and fallback is None:
                fallback = (dx, dy, ha, va)
        else:
            dx, dy, ha, va = fallback or _LABEL_SPOTS[0]
            label.xyann = (dx, dy)
            label.set_horizontalalignment(ha)
            label.set_verticalalignment(va)
            box = label.get_window_extent(renderer)
        placed.append(box)


def plot_head_map(
    mds: pd.DataFrame,
    *,
    clusters: pd.DataFrame | None = None,
    method: str | None = None,
    title: str | None = None,
    path: str | os.PathLike[str] | None = None,
) -> plt.Figure:
    """2-D MDS map of the heads: nearby heads behave alike; each point labelled with its head.

    Points are coloured by cluster when ``clusters`` is given, else by layer.

    Args:
        mds: :func:`~mhainterp.similarity.head_map_mds` table (``head_label, x, y``).
        clusters: Optional :func:`~mhainterp.similarity.cluster_heads` table.
        method: The similarity method the map was computed from (for the title).
        title: Figure title.
        path: When given, save the PNG there and the drawn table (``head_label, x, y, group``)
            as the CSV beside it.

    Returns:
        The Figure (closed if saved).

    Example:
        >>> fig = plot_head_map(head_map_mds(sim), clusters=cluster_heads(sim))  # doctest: +SKIP
    """
    if not isinstance(mds, pd.DataFrame):
        raise TypeError(f"mds must be a pandas DataFrame (from head_map_mds), got {type(mds)}")
    require_columns(mds, ["head_label", "x", "y"], "mds", "head_map_mds")
    data = mds[["head_label", "x", "y"]].copy()
    if clusters is not None:
        cluster_of = dict(zip(clusters["head_label"], clusters["cluster"], strict=True))
        data["group"] = [f"cluster {cluster_of[label]}" for label in data["head_label"]]
        legend_title = "cluster"
    else:
        data["group"] = [_layer_of(label) for label in data["head_label"]]
        legend_title = "layer"
    fig, ax = new_figure(5.8, 4.8, layout="constrained")
    groups = sorted(set(data["group"]), key=_natural_key)
    sns.scatterplot(
        data=data, x="x", y="y", hue="group", hue_order=groups, ax=ax, s=90,
        palette=_distinct_colours(len(groups)),
    )  # fmt: skip
    labels = [
        ax.annotate(text, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
        for text, (x, y) in _point_labels(data).items()
    ]
    ax.set_xlabel("MDS dimension 1")
    ax.set_ylabel("MDS dimension 2")
    ax.set_aspect("equal", adjustable="datalim")
    legend_outside(ax, title=legend_title, fontsize=8)
    name = f" ({method})" if method else ""
    ax.set_title(title or f"Head map{name}: nearby heads are similar")
    _place_point_labels(fig, ax, labels)
    if path is not None:
        save_figure(fig, path, data)
    return fig
