"""Figures of a pretrained model's analysis (``mhainterp analyze --model``), each from a table.

- :func:`plot_roles_vs_null`: per head, the share of attention on each Clark et al. (2019)
  relation, next to the random-weight null's mean;
- :func:`plot_attribution_vs_exact`: attribution patching's estimate against exact ablation;
- :func:`plot_zero_vs_mean`: zero against mean ablation per head (sink heads stand out).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mhainterp.figures._common import legend_outside, new_figure, require_columns, save_figure

__all__ = ["plot_attribution_vs_exact", "plot_roles_vs_null", "plot_zero_vs_mean"]


def plot_roles_vs_null(
    roles: pd.DataFrame, path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Heatmap of ``score`` per (head, role), heads layer-major; the null mean in the labels.

    ``roles`` has ``head_label, layer, head, role, score, init_mean`` (one row per head x role).
    """
    require_columns(roles, ["head_label", "layer", "role", "score", "init_mean"], "roles", "")
    wide = roles.pivot_table(index="role", columns="head_label", values="score", sort=False)
    order = roles.drop_duplicates("head_label").sort_values(["layer", "head"])["head_label"]
    wide = wide[list(order)]
    null = roles.groupby("role", sort=False)["init_mean"].first()
    fig, ax = new_figure(max(6.0, 0.04 * wide.shape[1]), 0.5 * wide.shape[0] + 1.5)
    image = ax.imshow(wide.to_numpy(), aspect="auto", vmin=0, vmax=1, cmap="viridis")
    ax.set_yticks(range(wide.shape[0]))
    ax.set_yticklabels([f"{r} (null {null[r]:.2f})" for r in wide.index])
    layers = roles.drop_duplicates("head_label").sort_values(["layer", "head"])["layer"].to_numpy()
    starts = [i for i in range(len(layers)) if i == 0 or layers[i] != layers[i - 1]]
    ax.set_xticks(starts)
    ax.set_xticklabels([f"L{layers[i]}" for i in starts], fontsize=6)
    ax.set_title(title or "share of attention per relation (random-weight null mean in brackets)")
    fig.colorbar(image, ax=ax, fraction=0.02)
    return save_figure(fig, path, roles)


def _diagonal(ax: Any, values: np.ndarray) -> None:
    """The y = x line across the range of ``values`` (where two estimates would agree)."""
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    ax.plot([low, high], [low, high], color="grey", lw=0.8, ls="--")


def plot_attribution_vs_exact(
    verified: pd.DataFrame, path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Scatter of ``attribution`` against ``exact`` delta loss, one colour per method."""
    require_columns(verified, ["method", "attribution", "exact", "head_label"], "verified", "")
    fig, ax = new_figure(6.0, 5.0)  # + the legend's room beside the data
    for method, group in verified.groupby("method", sort=False):
        ax.scatter(group["exact"], group["attribution"], label=method, s=18)
    _diagonal(ax, verified[["exact", "attribution"]].to_numpy())
    ax.set_xlabel("exact delta loss (engine)")
    ax.set_ylabel("attribution patching estimate")
    ax.set_title(title or "attribution vs exact ablation")
    legend_outside(ax, title="method", fontsize=8)
    return save_figure(fig, path, verified)


def plot_zero_vs_mean(
    table: pd.DataFrame, path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Scatter of zero- against mean-ablation damage; heads where they disagree are labelled."""
    require_columns(table, ["head_label", "delta_zero", "delta_mean", "disagree"], "table", "")
    fig, ax = new_figure(5.0, 5.0)
    ax.scatter(table["delta_mean"], table["delta_zero"], s=18)
    for _, row in table[table["disagree"]].iterrows():
        ax.annotate(row["head_label"], (row["delta_mean"], row["delta_zero"]), fontsize=7)
    _diagonal(ax, table[["delta_mean", "delta_zero"]].to_numpy())
    ax.set_xlabel("mean ablation: damage")
    ax.set_ylabel("zero ablation: damage")
    ax.set_title(title or "zero vs mean ablation")
    return save_figure(fig, path, table)
