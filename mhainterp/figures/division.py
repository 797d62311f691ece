"""Figures of the division of labour (:mod:`mhainterp.specialization.whom.division`).

- :func:`division_heatmap`: heads x values, the accuracy lost on each value when the head is
  removed, one panel per axis; a served value is marked ``*``;
- :func:`division_vs_heads`: the division index against the head count, every seed a point
  (behind a box from 20 seeds), the seed mean a line, the same-function null as a band from its
  mean to the upper quantile the call uses;
- :func:`save_division_figures`: the heatmap of a saved run result, beside its CSV.

Example:
    >>> from mhainterp.specialization import saved_division
    >>> fig = division_heatmap(saved_division("runs/cp/runs/h8_seed0").profiles)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from mhainterp.figures._common import (
    fit_cell_text,
    fit_tick_labels,
    head_order,
    legend_outside,
    new_figure,
    note_on_axes,
    plt,
    require_columns,
    save_figure,
    sns,
)
from mhainterp.figures.headcount import draw_seeds

__all__ = ["division_heatmap", "division_vs_heads", "save_division_figures"]

SOURCE = "mhainterp.division_of_labour"
PROFILE_FIGURE = "division_profiles.png"
SWEEP_FIGURE = "division_sweep.png"


def _value_order(values: pd.Series) -> list[str]:
    """Values in numeric order when they are numbers (``2`` before ``10``), else as given."""
    unique = list(dict.fromkeys(values.astype(str)))
    try:
        return sorted(unique, key=float)
    except ValueError:
        return unique


def division_heatmap(
    profiles: pd.DataFrame, heads: pd.DataFrame | None = None, *, min_damage: float = 0.01
) -> plt.Figure:
    """Heads x values heatmap of the damage (accuracy lost), one panel per axis.

    Panels sit side by side, or one per row when side by side would make a strip more than
    four times as wide as it is high (few heads, many values).

    Values left out of the indices (too few scored triples) are not drawn as blank columns:
    they are dropped and named under the panel. When no head costs ``min_damage`` of accuracy
    on any value (every head backed up, as in ``reverse``), each panel says so: an all-pale
    heatmap is not evidence of anything.

    Args:
        profiles: :attr:`DivisionResult.profiles` (``head_label, by, value, damage,
            in_index``).
        heads: :attr:`DivisionResult.heads`; its ``serves`` marks cells with ``*``.
        min_damage: Accuracy lost below which a cell counts as no damage (the library's
            ``min_damage`` default).

    Example:
        >>> fig = division_heatmap(result.profiles, result.heads)  # doctest: +SKIP
    """
    require_columns(
        profiles, ["head_label", "by", "value", "damage", "in_index"], "profiles", SOURCE
    )
    axes_names = list(dict.fromkeys(profiles["by"]))
    kept = profiles[profiles["in_index"].astype(bool)]
    widths = [
        max(3.0, 0.38 * max(1, kept[kept.by == a]["value"].nunique()) + 1.5) for a in axes_names
    ]
    height = 0.35 * profiles["head_label"].nunique() + 2.0
    stacked = sum(widths) + 1.0 > 4.0 * height  # a long strip: one panel per row instead
    if stacked:
        fig, grid = new_figure(
            max(widths) + 2.0, height * len(axes_names), nrows=len(axes_names), squeeze=False,
            layout="constrained",
        )  # fmt: skip
        panels = list(grid[:, 0])
    else:
        fig, grid = new_figure(
            sum(widths) + 1.0, height, ncols=max(1, len(axes_names)), squeeze=False,
            gridspec_kw={"width_ratios": widths or [1]}, layout="constrained",
        )  # fmt: skip
        panels = list(grid[0])
    largest = float(kept["damage"].clip(lower=0).max()) if len(kept) else 0.0
    vmax = max(0.05, largest)
    served = _served(heads)
    for ax, axis in zip(panels, axes_names, strict=False):
        colorbar = stacked or ax is panels[-1]  # stacked: one each (same scale), panels aligned
        _damage_panel(ax, profiles[profiles["by"] == axis], axis, served, vmax, colorbar)
        ax.set_ylabel("head" if stacked or ax is panels[0] else "")
        if largest < min_damage:
            note_on_axes(ax, f"no damaging head:\nno removal costs ≥ {min_damage:g} accuracy")
    fig.suptitle("Damage of removing one head, per value (* = serves)")
    return fig


def _served(heads: pd.DataFrame | None) -> dict[tuple[str, str], set[str]]:
    """``(head_label, by) -> served values`` from the heads table's ``serves`` column."""
    if heads is None:
        return {}
    return {
        (row.head_label, row.by): set(filter(None, str(row.serves).split(",")))
        for row in heads.itertuples(index=False)
        if isinstance(row.serves, str)
    }


def _damage_panel(
    ax: plt.Axes,
    part: pd.DataFrame,
    axis: str,
    served: dict[tuple[str, str], set[str]],
    vmax: float,
    colorbar: bool,
) -> None:
    """One axis' heads x values heatmap; values outside the index are named, not drawn."""
    part = part.assign(value=part["value"].astype(str))
    in_index = part["in_index"].astype(bool)
    left_out = [v for v in _value_order(part["value"]) if v not in set(part.loc[in_index, "value"])]
    part = part[in_index]
    order, rows = _value_order(part["value"]), head_order(part["head_label"])
    grid = part.pivot(index="head_label", columns="value", values="damage").reindex(
        index=rows, columns=order
    )
    marks = [["*" if v in served.get((h, axis), set()) else "" for v in order] for h in rows]
    sns.heatmap(
        grid, ax=ax, cmap="rocket_r", vmin=0, vmax=vmax, annot=np.array(marks), fmt="",
        cbar=colorbar, cbar_kws={"label": "accuracy lost"}, linewidths=0.3,
    )  # fmt: skip
    ax.grid(False)  # the style's grid showed through empty cells as stray ticks
    ax.tick_params(axis="y", rotation=0)
    fit_tick_labels(ax, "x")
    fit_cell_text(ax, len(rows), len(order))
    ax.set_title(f"by {axis}")
    label = axis.replace("_", " ")
    if left_out:
        label += f"\n(left out, too few scored: {', '.join(left_out)})"
    ax.set_xlabel(label)


def division_vs_heads(sweep: pd.DataFrame) -> plt.Figure:
    """Division index against head count, one panel per axis (per task: one row each).

    Every seed is a point (spread sideways; from
    :data:`~mhainterp.figures.headcount.BOX_MIN_SEEDS` seeds per head count a box stands behind
    small faint points), the seed mean a line. The grey band is the null
    (:data:`~mhainterp.specialization.nulls.SAME_FUNCTION_NULL`) from its mean to its upper
    quantile ``null_high``, the line a seed's index must clear to be called divided (seed
    means; without ``null_high``, an old table, mean ± 2 sd). A head count without an index
    (one head, or fewer than two heads that do damage) is marked "no index". Head counts
    spanning more than a factor of 8 are spaced on a log2 axis.

    Args:
        sweep: ``division_sweep.csv`` (``task, n_heads, seed, by, index, null_index,
            null_index_std`` and, when saved, ``null_high``).

    Example:
        >>> fig = division_vs_heads(pd.read_csv("runs/cp/division_sweep.csv"))  # doctest: +SKIP
    """
    require_columns(
        sweep, ["task", "n_heads", "seed", "by", "index", "null_index", "null_index_std"],
        "sweep", "mhainterp.specialization.division_folder",
    )  # fmt: skip
    tasks = list(dict.fromkeys(sweep["task"]))
    axes_names = list(dict.fromkeys(sweep["by"]))
    fig, axes = new_figure(
        3.4 * len(axes_names), 3.0 * len(tasks), nrows=len(tasks), ncols=len(axes_names),
        squeeze=False, sharey=True,
    )  # fmt: skip
    heads = sorted(int(h) for h in sweep["n_heads"].unique())
    log_x = heads[-1] / heads[0] > 8
    for r, task in enumerate(tasks):
        for c, axis in enumerate(axes_names):
            part = sweep[(sweep["task"] == task) & (sweep["by"] == axis)]
            _index_panel(axes[r][c], part, log_x)
            axes[r][c].set_title(f"{task}: by {axis}" if len(tasks) > 1 else f"by {axis}")
            axes[r][c].set_ylabel("division index" if c == 0 else "")
    legend_outside(axes[0][-1], fontsize=8)
    if len(tasks) == 1:  # a sweep figure names its task
        fig.suptitle(f"{tasks[0]}: division index vs head count")
    fig.tight_layout()
    return fig


def _null_band(part: pd.DataFrame) -> tuple[pd.Series, pd.Series, str]:
    """Per head count the band's low and high edge (seed means) and its legend label."""
    by_h = part.groupby("n_heads")
    low = by_h["null_index"].mean()
    if "null_high" in part.columns and part["null_high"].notna().any():
        return low, by_h["null_high"].mean(), "null: mean to upper quantile"
    spread = 2 * by_h["null_index_std"].mean().fillna(0)
    return low - spread, low + spread, "null (mean ± 2 sd)"


def _index_panel(ax: plt.Axes, part: pd.DataFrame, log_x: bool) -> None:
    """One task x axis panel: the null band, the seeds, their mean, "no index" marks."""
    mean = part.groupby("n_heads")["index"].mean()
    hs = mean.index.to_numpy()
    low, high, label = _null_band(part)
    ax.fill_between(hs, low.to_numpy(), high.to_numpy(), color="0.8", alpha=0.7, label=label)
    ax.plot(hs, mean.to_numpy(), color="black", marker="o", label="seed mean", zorder=4)
    if log_x:
        ax.set_xscale("log", base=2)
        width = [0.35 * h for h in hs]  # the same room per head count on a log axis
    else:
        width = 0.35 * (float(np.diff(hs).min()) if len(hs) > 1 else 1.0)
    groups = [part.loc[part["n_heads"] == h, "index"].to_numpy(float) for h in hs]
    draw_seeds(ax, hs, groups, width)
    ax.set_xticks(hs, [str(int(h)) for h in hs])
    ax.minorticks_off()
    for h in mean.index[mean.isna()]:  # e.g. h = 1: one head divides nothing
        ax.text(h, 0.5, "no index", rotation=90, ha="center", va="center", color="0.4")
    ax.set_xlabel("heads (h)")
    ax.set_ylim(-0.02, 1.02)


def save_division_figures(result: object, folder: str | os.PathLike[str]) -> list[Path]:
    """Draw the heatmap of a :class:`DivisionResult` into ``folder/division_profiles.png``
    (beside ``division_profiles.csv``, which :meth:`DivisionResult.save` wrote); nothing when
    the result has no profiles.

    Example:
        >>> save_division_figures(result, "runs/cp/runs/h8_seed0/analysis")  # doctest: +SKIP
    """
    profiles = result.profiles  # type: ignore[attr-defined]
    if not len(profiles):
        return []
    fig = division_heatmap(profiles, result.heads)  # type: ignore[attr-defined]
    return [save_figure(fig, Path(folder) / PROFILE_FIGURE)]
