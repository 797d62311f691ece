"""Attention-pattern figures: dataset-average pattern per head beside the task's relation
templates, and one example's patterns with its tokens on the axes.

Inputs are the tidy tables of :mod:`mhainterp.capture` (:func:`~mhainterp.capture.patterns_frame`,
:func:`~mhainterp.capture.relations_frame`, :func:`~mhainterp.capture.example_patterns`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from mhainterp.figures._common import new_figure, plt, require_columns, save_figure
from mhainterp.validation import ParameterError

__all__ = ["plot_average_patterns", "plot_example_patterns"]


def _require(df: pd.DataFrame, columns: set[str], name: str, source: str) -> None:
    require_columns(df, columns, name, f"mhainterp.capture.{source}")
    if df.empty:
        raise ParameterError(f"{name} is invalid: a non-empty table, got an empty one")


_CMAP = "viridis"


def _matrix(df: pd.DataFrame) -> np.ndarray:
    """``[query, key]`` array from rows with ``query, key, weight``."""
    size_q, size_k = int(df["query"].max()) + 1, int(df["key"].max()) + 1
    out = np.zeros((size_q, size_k))
    out[df["query"].to_numpy(int), df["key"].to_numpy(int)] = df["weight"].to_numpy(float)
    return out


@dataclass
class _Panel:
    """One small multiple of a tiled figure: its title, title colour and ``[query, key]``
    weights."""

    title: str
    weights: np.ndarray
    color: str = "black"


@dataclass
class _Axis:
    """The tick positions and labels every panel repeats along one axis, and its label."""

    label: str
    positions: list[int]
    texts: list[str]
    fontsize: float | None = None  # None: the style's tick label size
    rotation: float = 0.0


_GAP = 0.3
"""Space between two panels, in panel widths (room for a title, or tick labels, between)."""


def _tiled(
    panels: list[_Panel],
    x: _Axis,
    y: _Axis,
    *,
    max_cols: int,
    panel: float,
    colorbar: str,
) -> tuple[plt.Figure, plt.Axes]:
    """Small multiples drawn as ONE image on one Axes: the panels tiled into a mosaic
    (``NaN`` between them, drawn transparent), each framed and titled; the query ticks on the
    left of every row and the key ticks under the lowest panel of every column, with each
    axis label beside them; one colour bar on the shared 0..1 scale.

    One Axes instead of one per panel: a figure of 32 heads drew 35 Axes, each with its ticks,
    spines and constrained-layout boxes, and took 1.5-2.5 s to save; one image is cheap.

    Returns:
        The figure and its one Axes (panel ``i`` is at row ``i // ncols``, column
        ``i % ncols``; its title, frame and labels are that Axes' texts and patches).
    """
    n = len(panels)
    if n > 16:  # many heads: wider rows of smaller panels (half the pixels to draw)
        max_cols, panel = max(max_cols, 8), min(panel, 2.0)
    ncols = max(1, min(max_cols, n))
    nrows = math.ceil(n / ncols)
    rows = max(p.weights.shape[0] for p in panels)
    cols = max(p.weights.shape[1] for p in panels)
    step_x, step_y = cols + round(_GAP * cols), rows + round(_GAP * rows)
    mosaic = np.full((nrows * step_y - (step_y - rows), ncols * step_x - (step_x - cols)), np.nan)
    fig, ax = new_figure(panel * ncols + 1.2, panel * nrows + 0.8, layout="constrained")
    frame = {"color": plt.rcParams["axes.edgecolor"], "linewidth": plt.rcParams["axes.linewidth"]}
    tick = {"fontsize": x.fontsize or _points("xtick.labelsize"), "rotation": x.rotation}
    label_size = _points("axes.labelsize")
    # a row's label no longer than its panel (72 pt an inch, the layout leaves ~85%): a long
    # one ("query (position:token)") ran into the next row's
    row_label_size = min(label_size, 0.85 * panel * 72 / (0.6 * len(y.label)))
    lowest = {i % ncols: i for i in range(n)}  # column -> its lowest panel
    for i, part in enumerate(panels):
        top, left = (i // ncols) * step_y, (i % ncols) * step_x
        q, k = part.weights.shape
        mosaic[top : top + q, left : left + k] = part.weights
        ax.add_patch(Rectangle((left - 0.5, top - 0.5), k, q, fill=False, **frame))
        centre = left + (k - 1) / 2
        ax.annotate(
            part.title,
            (centre, top - 0.5),
            xytext=(0, 6),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=11,
            color=part.color,
        )
        if i % ncols == 0:  # the row's query label, left of its tick labels
            width = 0.62 * max(map(len, y.texts)) * (y.fontsize or _points("ytick.labelsize"))
            ax.annotate(
                y.label,
                (left - 0.5, top + (q - 1) / 2),
                xytext=(-width - 14, 0),
                textcoords="offset points",
                ha="right",
                va="center",
                rotation=90,
                fontsize=row_label_size,
            )
        if lowest[i % ncols] != i:
            continue
        for position, text in zip(x.positions, x.texts, strict=True):  # this column's ticks
            ax.annotate(
                text,
                (left + position, top + q - 0.5),
                xytext=(0, -3.5),
                textcoords="offset points",
                ha="center",
                va="top",
                **tick,
            )
        # below the ticks: their height (turned: the longest label's length) and a pad
        drop = (0.55 * max(map(len, x.texts)) if x.rotation else 1.0) * tick["fontsize"] + 6
        ax.annotate(
            x.label,
            (centre, top + q - 0.5),
            xytext=(0, -3.5 - drop),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=label_size,
        )
    cmap = matplotlib.colormaps[_CMAP].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    image = ax.imshow(mosaic, vmin=0.0, vmax=1.0, cmap=cmap, aspect="equal")
    ax.grid(False)
    ax.set_xticks([])
    starts = [r * step_y for r in range(nrows)]
    ax.set_yticks(
        [top + position for top in starts for position in y.positions],
        y.texts * nrows,
        **({"fontsize": y.fontsize} if y.fontsize else {}),
    )
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.colorbar(image, ax=ax, shrink=0.8, label=colorbar)
    return fig, ax


def _points(setting: str) -> float:
    """A font size setting of the style (``11.0`` or ``"medium"``) in points."""
    return FontProperties(size=plt.rcParams[setting]).get_size_in_points()


def _integer_ticks(size: int) -> list[int]:
    """Whole-number positions of an axis of ``size`` cells, about 4 of them (0, 4, 8, 12 of
    16; never 2.5), as :func:`~mhainterp.figures._common.integer_axis` ticks a panel."""
    values = MaxNLocator(integer=True, nbins=4).tick_values(-0.5, size - 0.5)
    return [int(v) for v in values if -0.5 <= v <= size - 0.5]


def _save(fig: plt.Figure, path: str | os.PathLike[str] | None, data: pd.DataFrame) -> None:
    if path is not None:
        save_figure(fig, path, data)


def plot_average_patterns(
    patterns: pd.DataFrame,
    templates: pd.DataFrame | None = None,
    *,
    title: str | None = None,
    max_cols: int = 4,
    path: str | os.PathLike[str] | None = None,
) -> plt.Figure:
    """Dataset-average attention pattern of every head, then the relation templates.

    One panel per head (titled by head label) and one per relation template (titled
    ``template: <name>``), all on the same 0..1 colour scale with one colour bar, so a head
    that implements a relation looks like that template.

    Args:
        patterns: :func:`mhainterp.capture.patterns_frame` table (columns ``head_label, query,
            key, weight``), heads drawn in order of appearance.
        templates: :func:`mhainterp.capture.relations_frame` table (``relation, query, key,
            weight``), or None.
        title: Figure title.
        max_cols: Panels per row.
        path: When given, save the PNG there and the drawn data as the CSV beside it
            (columns ``panel, kind, query, key, weight``; kind is ``head`` or ``template``).

    Returns:
        The Figure (closed if saved).

    Example:
        >>> from mhainterp.capture import average_patterns, patterns_frame  # doctest: +SKIP
        >>> average = patterns_frame(average_patterns(model, task))  # doctest: +SKIP
        >>> fig = plot_average_patterns(average, path="runs/x/patterns.png")  # doctest: +SKIP
    """
    _require(patterns, {"head_label", "query", "key", "weight"}, "patterns", "patterns_frame")
    panels = [("head", label, part) for label, part in patterns.groupby("head_label", sort=False)]
    if templates is not None:
        _require(templates, {"relation", "query", "key", "weight"}, "templates", "relations_frame")
        panels += [
            ("template", name, part) for name, part in templates.groupby("relation", sort=False)
        ]
    size = max(int(part["query"].max()) + 1 for _, _, part in panels)
    ticks = _integer_ticks(size)  # positions: 0, 4, 8, 12 of 16, never 2.5
    fig, _ = _tiled(
        [
            _Panel(
                name if kind == "head" else f"template: {name}",
                _matrix(part),
                "black" if kind == "head" else "firebrick",
            )
            for kind, name, part in panels
        ],
        _Axis("key position", ticks, [str(t) for t in ticks]),
        _Axis("query position", ticks, [str(t) for t in ticks]),
        max_cols=max_cols,
        panel=2.6,
        colorbar="mean attention weight (template: fraction)",
    )
    fig.suptitle(title or "Dataset-average attention per head vs the task's relation templates")
    data = pd.concat(
        [
            part[["query", "key", "weight"]].assign(panel=name, kind=kind)
            for kind, name, part in panels
        ],
        ignore_index=True,
    )[["panel", "kind", "query", "key", "weight"]]
    _save(fig, path, data)
    return fig


def plot_example_patterns(
    example: pd.DataFrame,
    *,
    title: str | None = None,
    max_cols: int = 4,
    path: str | os.PathLike[str] | None = None,
) -> plt.Figure:
    """One sequence's attention patterns, one panel per head, with its tokens on the axes.

    Tick labels read ``position:token``; rows are queries, columns keys.

    Args:
        example: :func:`mhainterp.capture.example_patterns` table (columns ``head_label, query,
            key, query_token, key_token, weight``).
        title: Figure title.
        max_cols: Panels per row.
        path: When given, save the PNG there and ``example`` (the drawn rows) as the CSV beside it.

    Returns:
        The Figure (closed if saved).

    Example:
        >>> from mhainterp.capture import example_patterns  # doctest: +SKIP
        >>> fig = plot_example_patterns(example_patterns(model, task, index=0))  # doctest: +SKIP
    """
    columns = {"head_label", "query", "key", "query_token", "key_token", "weight"}
    _require(example, columns, "example", "example_patterns")
    query_tokens = example.drop_duplicates("query").set_index("query")["query_token"].sort_index()
    key_tokens = example.drop_duplicates("key").set_index("key")["key_token"].sort_index()
    panels = [
        _Panel(label, _matrix(part)) for label, part in example.groupby("head_label", sort=False)
    ]
    # Tokens on the outer panels only: every panel shows the same sequence.
    fig, _ = _tiled(
        panels,
        _Axis(
            "key (position:token)",
            list(key_tokens.index),
            [f"{k}:{t}" for k, t in key_tokens.items()],
            fontsize=7,
            rotation=90,
        ),
        _Axis(
            "query (position:token)",
            list(query_tokens.index),
            [f"{q}:{t}" for q, t in query_tokens.items()],
            fontsize=7,
        ),
        max_cols=max_cols,
        panel=3.2,
        colorbar="attention weight",
    )
    fig.suptitle(title or "Attention patterns of one example sequence")
    _save(fig, path, example)
    return fig
