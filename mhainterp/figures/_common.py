"""Shared figure plumbing: a headless backend, consistent style, atomic PNG + CSV saving.

Every figure function takes a tidy DataFrame (and options) and returns a matplotlib Figure;
:func:`save_figure` writes the PNG next to the CSV it was drawn from.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen needed; must precede pyplot

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from mhainterp.io import atomic_path, write_csv

__all__ = ["plt", "sns", "save_figure", "new_figure", "require_columns", "head_order"]

sns.set_theme(context="notebook", style="whitegrid")


def new_figure(width: float = 6.0, height: float = 4.0, **kwargs) -> tuple[plt.Figure, object]:
    """A figure and axes of the given size in inches (``plt.subplots`` arguments pass through)."""
    return plt.subplots(figsize=(width, height), **kwargs)


def save_figure(
    fig: plt.Figure,
    png_path: str | os.PathLike[str],
    data: pd.DataFrame | None = None,
    *,
    dpi: int = 120,
) -> Path:
    """Atomically save ``fig`` as PNG and, if given, ``data`` as the CSV beside it; close ``fig``.

    The CSV gets the PNG's name with ``.csv``: ``head_count.png`` + ``head_count.csv``.
    """
    png_path = Path(png_path)
    if png_path.suffix != ".png":
        raise ValueError(f"figure path must end in .png, got {png_path}")
    if data is not None:
        write_csv(png_path.with_suffix(".csv"), data)
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    plt.close(fig)
    return png_path


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
        raise ValueError(
            f"{name} is missing columns {missing}; expected the table from {source} "
            f"(has: {', '.join(map(str, df.columns))})"
        )


def head_order(labels: Iterable[str]) -> list[str]:
    """Unique head labels in layer-major order (``L0H2`` before ``L0H10`` before ``L1H0``)."""

    def key(label: str) -> tuple[int, int]:
        layer, head = label[1:].split("H")
        return int(layer), int(head)

    return sorted(dict.fromkeys(labels), key=key)
