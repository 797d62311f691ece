"""Attention-pattern figures: dataset-average pattern per head beside the task's relation
templates, and one example's patterns with its tokens on the axes.

Inputs are the tidy tables of :mod:`mhainterp.capture` (:func:`~mhainterp.capture.patterns_frame`,
:func:`~mhainterp.capture.relations_frame`, :func:`~mhainterp.capture.example_patterns`).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd

from mhainterp.figures._common import integer_axis, new_figure, plt, require_columns, save_figure
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


def _grid(n_panels: int, max_cols: int, panel: float = 2.6) -> tuple[plt.Figure, list, int]:
    """A figure of ``n_panels`` axes, its axes, and the number of columns used."""
    if n_panels > 16:  # many heads: wider rows of smaller panels (half the pixels to draw)
        max_cols, panel = max(max_cols, 8), min(panel, 2.0)
    ncols = max(1, min(max_cols, n_panels))
    nrows = math.ceil(n_panels / ncols)
    fig, axes = new_figure(
        panel * ncols + 1.2,
        panel * nrows + 0.8,
        nrows=nrows,
        ncols=ncols,
        squeeze=False,
        layout="constrained",
    )
    flat = list(axes.ravel())
    for ax in flat[n_panels:]:
        ax.set_axis_off()
    return fig, flat[:n_panels], ncols


def _label_axes(ax: plt.Axes, index: int, ncols: int, n_panels: int, x: str, y: str) -> None:
    """Axis labels and ticks on the left column and the bottom panel of each column only:
    every panel shares the axes, and ticks on all 32 panels of a 2 x 16-head model doubled the
    time to draw the figure."""
    if index % ncols == 0:
        ax.set_ylabel(y)
    else:
        ax.set_yticks([])
    if index + ncols >= n_panels:
        ax.set_xlabel(x)
    else:
        ax.set_xticks([])


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
    fig, axes, ncols = _grid(len(panels), max_cols)
    image = None
    for index, (ax, (kind, name, part)) in enumerate(zip(axes, panels, strict=True)):
        image = ax.imshow(_matrix(part), vmin=0.0, vmax=1.0, cmap=_CMAP, aspect="equal")
        ax.grid(False)
        integer_axis(ax, max_ticks=4)  # positions: 0, 5, 10, never 2.5
        if kind == "head":
            ax.set_title(name, fontsize=11)
        else:
            ax.set_title(f"template: {name}", fontsize=11, color="firebrick")
        _label_axes(ax, index, ncols, len(panels), "key position", "query position")
    fig.colorbar(image, ax=axes, shrink=0.8, label="mean attention weight (template: fraction)")
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
    panels = list(example.groupby("head_label", sort=False))
    fig, axes, ncols = _grid(len(panels), max_cols, panel=3.2)
    image = None
    for index, (ax, (label, part)) in enumerate(zip(axes, panels, strict=True)):
        image = ax.imshow(_matrix(part), vmin=0.0, vmax=1.0, cmap=_CMAP, aspect="equal")
        ax.set_title(label, fontsize=11)
        # Tokens on the outer panels only (_label_axes removes the inner panels' ticks): every
        # panel shows the same sequence.
        ax.set_xticks(
            key_tokens.index, [f"{k}:{t}" for k, t in key_tokens.items()], rotation=90, fontsize=7
        )
        ax.set_yticks(query_tokens.index, [f"{q}:{t}" for q, t in query_tokens.items()], fontsize=7)
        ax.grid(False)
        _label_axes(ax, index, ncols, len(panels), "key (position:token)", "query (position:token)")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title or "Attention patterns of one example sequence")
    _save(fig, path, example)
    return fig
