"""Shared figure plumbing: a headless backend, one style, atomic PNG + PDF + CSV saving, and
the small layout rules every figure follows (whole-number ticks on integer axes, tick labels and
cell text sized to fit, legends outside the data, count error bars that stop at 0).

Every figure function takes a tidy DataFrame (and options) and returns a matplotlib Figure;
:func:`save_figure` writes the PNG, the vector PDF beside it and the CSV it was drawn from.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen needed; must precede pyplot

import matplotlib.colors
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import seaborn.matrix as seaborn_matrix
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox

from mhainterp.heads import parse_head_label
from mhainterp.io import atomic_path, write_csv
from mhainterp.validation import ParameterError, invalid

__all__ = [
    "save_figure",
    "laid_out",
    "new_figure",
    "wrapped_grid",
    "require_columns",
    "head_order",
    "integer_axis",
    "heatmap",
    "fit_tick_labels",
    "fit_cell_text",
    "legend_outside",
    "legend_in_cell",
    "count_error_bars",
    "note_on_axes",
    "mark_layers",
    "COUNT_CLIP_NOTE",
    "VECTOR_SUFFIX",
]

sns.set_theme(context="notebook", style="whitegrid")

VECTOR_SUFFIX = ".pdf"
"""The vector copy every PNG gets (matplotlib's own PDF backend: no extra dependency)."""

COUNT_CLIP_NOTE = "error bars of counts: mean ± std, the lower end drawn at 0 where mean − std < 0"
"""The caption line of a figure whose count error bars were clipped by :func:`count_error_bars`."""

_MIN_FONT = 6.0  # points: below this a tick label or cell text is unreadable in print
_MAX_CELL_FONT = 9.0


def new_figure(width: float = 6.0, height: float = 4.0, **kwargs) -> tuple[plt.Figure, object]:
    """A figure and axes of the given size in inches (``plt.subplots`` arguments pass through)."""
    return plt.subplots(figsize=(width, height), **kwargs)


def wrapped_grid(
    n_blocks: int, n_panels: int, *, ncols: int = 3, width: float = 4.0, height: float = 3.4
) -> tuple[plt.Figure, np.ndarray, list[plt.Axes]]:
    """A grid for ``n_blocks`` rows of ``n_panels`` panels, each row wrapped at ``ncols``.

    Five panels per task become two rows of three instead of one strip of five, so the figure
    keeps a printable aspect. The spare cells of each block are blank (axes off) and returned,
    so a caller can put the legend in one.

    Args:
        n_blocks: Logical rows (e.g. tasks).
        n_panels: Panels per logical row.
        ncols: Panels per drawn row.
        width: Width of one panel in inches.
        height: Height of one panel in inches.

    Returns:
        ``(figure, axes, spare)``: ``axes[block, panel]`` (shape ``[n_blocks, n_panels]``) and
        the blank cells, in order.

    Example:
        >>> fig, axes, spare = wrapped_grid(1, 5)
        >>> axes.shape, len(spare)
        ((1, 5), 1)
        >>> plt.close(fig)
    """
    ncols = max(1, min(ncols, n_panels))
    rows_per_block = math.ceil(n_panels / ncols)
    fig, grid = new_figure(
        width * ncols,
        height * rows_per_block * n_blocks,
        nrows=rows_per_block * n_blocks,
        ncols=ncols,
        squeeze=False,
    )
    axes = np.empty((n_blocks, n_panels), dtype=object)
    spare: list[plt.Axes] = []
    for block in range(n_blocks):
        cells = list(grid[block * rows_per_block : (block + 1) * rows_per_block].ravel())
        axes[block] = cells[:n_panels]
        for ax in cells[n_panels:]:
            ax.set_axis_off()
            spare.append(ax)
    return fig, axes, spare


def save_figure(
    fig: plt.Figure,
    png_path: str | os.PathLike[str],
    data: pd.DataFrame | None = None,
    *,
    dpi: int = 120,
    vector: bool = True,
) -> Path:
    """Atomically save ``data`` as the CSV, ``fig`` as PDF and then as PNG (written last: the
    PNG marks a finished figure); close ``fig``.

    The one place figures are written: ``head_count.png`` + ``head_count.pdf`` (vector, for a
    paper; no creation date, so the same figure gives the same bytes) + ``head_count.csv``.

    Args:
        fig: The figure.
        png_path: Where the PNG goes (must end in ``.png``).
        data: The table the figure was drawn from, or None.
        dpi: PNG resolution.
        vector: Also write the PDF.

    Returns:
        The PNG path.
    """
    png_path = Path(png_path)
    if png_path.suffix != ".png":
        raise invalid("png_path", str(png_path), "a path ending in .png")
    try:
        if data is not None:
            write_csv(png_path.with_suffix(".csv"), data)
        box, pixels = laid_out(fig, dpi)
        if vector:
            with atomic_path(png_path.with_suffix(VECTOR_SUFFIX)) as tmp:
                fig.savefig(tmp, bbox_inches=box, format="pdf", metadata={"CreationDate": None})
        # The PNG last: callers take it as the sign that the figure is done, so a process
        # killed before it leaves a figure that a rerun draws again, PDF included
        with atomic_path(png_path) as tmp:
            if pixels is None:
                fig.savefig(tmp, dpi=dpi, bbox_inches=box, format="png")
            else:
                matplotlib.image.imsave(tmp, pixels, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return png_path


def laid_out(fig: plt.Figure, dpi: float = 120) -> tuple[Bbox, np.ndarray | None]:
    """Lay ``fig`` out and render it once at ``dpi`` (the PNG's), then freeze its layout.

    ``savefig(bbox_inches="tight")`` draws a figure twice per format (once to measure its box,
    once to render), running the constrained layout each time: a PNG + PDF pair cost four
    draws. Here one draw lays the figure out and renders its pixels; the PNG is those pixels
    cut to the tight box, and the PDF one more draw of the same layout.

    Returns:
        The tight box (inches, padded as ``bbox_inches="tight"`` pads it) every format is
        saved with, and the PNG's pixels (``[rows, columns, 4]`` RGBA) cut to it, or None when
        something is drawn outside the figure (clipped in this render: a PNG must be drawn).

    Example:
        >>> fig, ax = new_figure(4.0, 3.0, layout="constrained")
        >>> box, pixels = laid_out(fig, dpi=100)
        >>> fig.get_layout_engine() is None, pixels.shape[:2] == (int(box.height * 100),
        ...                                                        int(box.width * 100))
        (True, True)
        >>> plt.close(fig)
    """
    shown = fig.dpi
    fig.set_dpi(dpi)
    try:
        fig.canvas.draw()  # the layout engine, if any, then the pixels
        content = fig.get_tightbbox(fig.canvas.get_renderer())
        rendered = np.array(fig.canvas.buffer_rgba())
    finally:
        fig.set_dpi(shown)
    fig.set_layout_engine(None)  # laid out: each save draws the figure as it is now
    box = content.padded(plt.rcParams["savefig.pad_inches"])
    width, height = fig.get_size_inches()
    inside = content.x0 >= 0 and content.y0 >= 0 and content.x1 <= width and content.y1 <= height
    return box, _cut_to(rendered, box, dpi, fig.get_facecolor()) if inside else None


def _cut_to(rendered: np.ndarray, box: Bbox, dpi: float, background: tuple) -> np.ndarray:
    """The part of a rendered figure (``[rows, columns, 4]``) in ``box`` (inches from its
    lower left corner), as ``savefig(bbox_inches=box)`` sizes it (to the pixel); where the box
    passes the figure's edge, the figure's background colour."""
    rows, columns = int(box.height * dpi), int(box.width * dpi)
    left = round(box.x0 * dpi)
    top = round(rendered.shape[0] - box.y0 * dpi - rows)  # the buffer's rows run downwards
    out = np.empty((rows, columns, 4), dtype=np.uint8)
    out[:] = np.round(np.asarray(matplotlib.colors.to_rgba(background)) * 255).astype(np.uint8)
    r0, c0 = max(top, 0), max(left, 0)
    r1, c1 = min(top + rows, rendered.shape[0]), min(left + columns, rendered.shape[1])
    out[r0 - top : r1 - top, c0 - left : c1 - left] = rendered[r0:r1, c0:c1]
    return out


def require_columns(df: pd.DataFrame, columns: Iterable[str], name: str, source: str) -> None:
    """Check a figure's input table; the error names the missing columns and where to get it.

    Args:
        df: The table passed to a figure function.
        columns: Columns the figure needs.
        name: The argument's name, for the message.
        source: The function whose output the figure expects, for the message.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{name} must be a pandas DataFrame ({source}), got {type(df).__name__}")
    missing = sorted(set(columns) - set(df.columns))
    if missing:
        raise ParameterError(
            f"{name} is invalid: the table from {source}, but it is missing columns {missing} "
            f"(has: {', '.join(map(str, df.columns))})"
        )


def head_order(labels: Iterable[str]) -> list[str]:
    """Unique head labels in layer-major order (``L0H2`` before ``L0H10`` before ``L1H0``)."""

    return sorted(dict.fromkeys(labels), key=parse_head_label)


# ----------------------------------------------------------------------------- layout rules


def integer_axis(ax: plt.Axes, axis: str = "both", *, max_ticks: int | None = None) -> None:
    """Tick an integer axis (positions, counts, head counts) at whole numbers only: no 2.5;
    at most about ``max_ticks`` of them (a small panel: "0 2 4 ... 14" ran into each other)."""
    for which in ("x", "y") if axis == "both" else (axis,):
        locator = MaxNLocator(integer=True, **({"nbins": max_ticks} if max_ticks else {}))
        getattr(ax, f"{which}axis").set_major_locator(locator)


def heatmap(data: pd.DataFrame | np.ndarray, ax: plt.Axes, **kwargs) -> plt.Axes:
    """``sns.heatmap(data, ax=ax, **kwargs)`` without the render of the whole figure that
    seaborn makes on every call to turn tick labels that overlap.

    That render cost one full draw per heatmap (a figure of three panels: three), and every
    figure here sets its labels' rotation itself afterwards (explicitly or by
    :func:`fit_tick_labels`, measured once per figure). seaborn's own check still runs, on the
    labels as placed before the layout.

    Example:
        >>> fig, ax = new_figure()
        >>> _ = heatmap(pd.DataFrame([[0.0, 1.0]]), ax, annot=True)
        >>> [t.get_text() for t in ax.texts]
        ['0', '1']
        >>> plt.close(fig)
    """
    drawn = getattr(seaborn_matrix, "_draw_figure", None)
    if drawn is None:  # a seaborn without that private hook: its own render, as before
        return sns.heatmap(data, ax=ax, **kwargs)
    with _SEABORN_SWAP:  # a module global: one heatmap at a time swaps it (threads)
        seaborn_matrix._draw_figure = _skip_draw  # what seaborn's heatmap renders through
        try:
            return sns.heatmap(data, ax=ax, **kwargs)
        finally:
            seaborn_matrix._draw_figure = drawn


_SEABORN_SWAP = threading.Lock()


def _skip_draw(fig: plt.Figure) -> None:
    """Stands in for seaborn's figure render inside :func:`heatmap`."""


def _pixels_per_point(fig: plt.Figure) -> float:
    return fig.dpi / 72.0


def _measured(ax: plt.Axes, drawn: bool = False):
    """The axes' drawn box in pixels, after layout and aspect (a draw without rendering,
    unless the caller ``drawn`` the figure since it last changed)."""
    if not drawn:
        ax.figure.draw_without_rendering()
    return ax.get_window_extent()


def fit_tick_labels(ax: plt.Axes, axis: str = "x", *, drawn: bool = False) -> bool:
    """Keep an axis' tick labels from overlapping: rotate, then shrink, then thin them.

    Horizontal labels stay when they fit their tick spacing; else they are turned (90° on x),
    their font shrunk to fit the spacing down to 6 pt; below that every k-th label is shown.
    Call it after the ticks are set (for a heatmap: after ``sns.heatmap``). ``drawn``: the
    caller drew the figure (``draw_without_rendering``) after its last change, so one draw
    measures every panel of a figure.

    Returns:
        Whether the labels changed (else a draw made before still measures the figure).
    """
    labels = [t for t in getattr(ax, f"get_{axis}ticklabels")() if t.get_text()]
    if len(labels) < 2:
        return False
    box = _measured(ax, drawn)
    span = box.width if axis == "x" else box.height
    spacing = span / len(labels) / _pixels_per_point(ax.figure)  # points per tick
    size = labels[0].get_fontsize()
    longest = max(len(t.get_text()) for t in labels)
    along = 0.62 * size * longest if axis == "x" else 1.25 * size  # label extent along the axis
    if along <= 0.9 * spacing:
        return False
    fitted = max(_MIN_FONT, min(size, 0.75 * spacing))
    step = max(1, math.ceil(1.3 * fitted / spacing))
    for i, label in enumerate(labels):
        label.set_fontsize(fitted)
        if axis == "x":
            label.set_rotation(90)
            label.set_horizontalalignment("center")
        label.set_visible(i % step == 0)
    return True


def fit_cell_text(ax: plt.Axes, n_rows: int, n_cols: int, *, drawn: bool = False) -> bool:
    """Size a heatmap's cell annotations (``ax.texts``) to its cells, or drop them.

    The font is the largest (at most 9 pt) at which the longest text fits a cell; when that is
    under 6 pt the annotations are removed (the colour carries the value, the CSV the number).
    ``drawn``: as in :func:`fit_tick_labels`.

    Returns:
        Whether the annotations were kept.
    """
    texts = [t for t in ax.texts if t.get_text()]
    if not texts or n_rows < 1 or n_cols < 1:
        return bool(texts)
    box = _measured(ax, drawn)
    per_point = _pixels_per_point(ax.figure)
    cell_w, cell_h = box.width / n_cols / per_point, box.height / n_rows / per_point
    longest = max(len(t.get_text()) for t in texts)
    size = min(_MAX_CELL_FONT, 0.8 * cell_w / (0.62 * longest), 0.6 * cell_h)
    if size < _MIN_FONT:
        for text in texts:
            text.remove()
        return False
    for text in texts:
        text.set_fontsize(size)
    return True


def legend_outside(ax: plt.Axes, **kwargs) -> None:
    """Put the axes' legend to the right of its data area, never over the data.

    Works on a legend seaborn made (moved) and on artists with labels (a new legend).
    ``kwargs`` go to the legend (``title``, ``fontsize``...).
    """
    place = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0}
    if ax.get_legend() is not None:
        sns.move_legend(ax, **place, **kwargs)
    else:
        ax.legend(**place, **kwargs)


def legend_in_cell(
    fig: plt.Figure,
    cell: plt.Axes,
    handles: Sequence,
    labels: Sequence[str],
    *,
    note: str | None = None,
    **kwargs,
) -> None:
    """Put a figure legend (and an optional note under it) where a blank grid cell is.

    The cell's axes is removed, so ``fig.axes`` lists only the panels with data. Call it after
    the layout is final (``tight_layout``): the legend is placed at the cell's position then.
    ``kwargs`` go to ``fig.legend``.
    """
    box = cell.get_position()
    fig.delaxes(cell)
    anchor = (box.x0, box.y0 + 0.15 * box.height, box.width, 0.85 * box.height)
    fig.legend(
        handles,
        labels,
        loc="center",
        bbox_to_anchor=anchor,
        bbox_transform=fig.transFigure,
        **kwargs,
    )
    if note:
        fig.text(box.x0 + box.width / 2, box.y0, note, ha="center", va="bottom", fontsize=8)


def count_error_bars(mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """``yerr`` of mean ± std for a count: the lower arm stops at 0 (a count is never < 0).

    Args:
        mean: ``[n]`` means.
        std: ``[n]`` standard deviations (NaN: no bar).

    Returns:
        ``[2, n]``: lower and upper arms.

    Example:
        >>> count_error_bars([0.33, 2.0], [0.58, 0.5]).round(2).tolist()
        [[0.33, 0.5], [0.58, 0.5]]
    """
    mean = np.asarray(mean, dtype=float)
    std = np.nan_to_num(np.asarray(std, dtype=float), nan=0.0)
    lower = np.minimum(std, np.clip(mean, 0.0, None))
    return np.vstack([lower, std])


def mark_layers(ax: plt.Axes, heads: Sequence[str], *, columns: bool = False) -> str:
    """Draw a line between the blocks of heads of different layers in a heatmap whose rows
    (and, with ``columns``, columns) are ``heads`` in layer order; return the axis label that
    names the layers ("head (layer 0 | layer 1)"), so a figure comparing heads of different
    layers says which layer each belongs to.

    Example:
        >>> fig, ax = new_figure()
        >>> mark_layers(ax, ["L0H0", "L0H1", "L1H0"])
        'head (layer 0 | layer 1, lines between layers)'
        >>> mark_layers(ax, ["L0H0", "L0H1"])
        'head'
        >>> plt.close(fig)
    """
    layers = [parse_head_label(label)[0] for label in heads]
    if len(set(layers)) < 2:
        return "head"
    for i in range(1, len(layers)):
        if layers[i] != layers[i - 1]:
            ax.axhline(i, color="black", linewidth=1.5)
            if columns:
                ax.axvline(i, color="black", linewidth=1.5)
    names = list(dict.fromkeys(layers))
    shown = (
        " | ".join(f"layer {n}" for n in names)
        if len(names) <= 4
        else f"layers {names[0]}-{names[-1]}"
    )
    return f"head ({shown}, lines between layers)"


def note_on_axes(ax: plt.Axes, text: str) -> None:
    """A boxed note across the middle of a panel (e.g. "nothing to draw, because ...")."""
    ax.text(
        0.5,
        0.5,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=10,
        wrap=True,
        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.5", "alpha": 0.95},
        zorder=10,
    )
