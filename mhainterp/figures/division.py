"""Figures of the division of labour (:mod:`mhainterp.specialization.whom.division`).

- :func:`division_heatmap`: heads x values, one panel per axis, each on the profiles its call
  rests on (single: the accuracy lost when the head is removed; kept: the accuracy it adds
  kept alone; group: lost when a backed-up group is removed); a served value is marked ``*``;
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from mhainterp.figures._common import (
    fit_cell_text,
    fit_tick_labels,
    head_order,
    heatmap,
    legend_outside,
    mark_layers,
    new_figure,
    note_on_axes,
    plt,
    require_columns,
    save_figure,
)
from mhainterp.figures.headcount import draw_seeds
from mhainterp.specialization.verdict.division_words import BASIS_NAMES

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
    profiles: pd.DataFrame,
    heads: pd.DataFrame | None = None,
    *,
    min_damage: float = 0.01,
    basis_profiles: pd.DataFrame | None = None,
    index: pd.DataFrame | None = None,
) -> plt.Figure:
    """Heads x values heatmap of the profiles each axis's call rests on, one panel per axis.

    An axis called on single-head profiles shows the accuracy lost on each value when a head
    is removed alone; one called on kept-head profiles (every head backed up, as in
    ``reverse``) shows the accuracy each head adds on each value kept alone in its layer;
    one called on group profiles shows the accuracy lost when each backed-up group (and each
    lone damaging head) is removed. A panel's title names the axis's call and that basis, so
    the figure shows the evidence of the sentence it illustrates (a call on kept-head
    profiles beside a blank single-head heatmap showed none). A ``*`` marks a value a head
    serves (:attr:`~mhainterp.specialization.DivisionResult.heads` ``serves``: significant and an
    effect), on the profile of the head's own basis, and only on a cell that shows at least
    ``min_damage``.

    Panels sit side by side, or one per row when side by side would make a strip more than
    four times as wide as it is high (few heads, many values). Values left out of the indices
    (too few scored triples) are not drawn as blank columns: they are dropped and named under
    the panel. A panel whose every cell is below ``min_damage`` says so: an all-pale heatmap is
    not evidence of anything.

    Args:
        profiles: :attr:`~mhainterp.specialization.DivisionResult.profiles` (``head_label, by,
            value, damage, in_index``), the single-head profiles.
        heads: :attr:`~mhainterp.specialization.DivisionResult.heads`; its ``serves`` (and
            ``basis``) place the ``*``.
        min_damage: Accuracy below which a cell counts as nothing (the library's
            ``min_damage`` default).
        basis_profiles: :attr:`~mhainterp.specialization.DivisionResult.basis_profiles`, the
            kept-head and group profiles (without them every panel is single-head).
        index: :attr:`~mhainterp.specialization.DivisionResult.index`; its ``basis`` and ``call``
            per axis pick each panel's profiles and title (without it: single-head, titled by
            the axis alone).

    Example:
        >>> fig = division_heatmap(result.profiles, result.heads,
        ...     basis_profiles=result.basis_profiles, index=result.index)  # doctest: +SKIP
    """
    require_columns(
        profiles, ["head_label", "by", "value", "damage", "in_index"], "profiles", SOURCE
    )
    axes_names = list(dict.fromkeys(profiles["by"]))
    calls = _axis_calls(index)
    panels_data = [
        _basis_grid(profiles, basis_profiles, heads, axis, calls.get(axis, ("", ""))[0])
        for axis in axes_names
    ]
    widths = [max(3.0, 0.38 * max(1, g.values.shape[1]) + 1.5) for g in panels_data]
    height = 0.35 * max([len(g.values) for g in panels_data] or [1]) + 2.0
    stacked = sum(widths) + 1.0 > 4.0 * height  # a long strip: one panel per row instead
    if stacked:
        fig, grid = new_figure(
            max(widths) + 2.0,
            height * len(axes_names),
            nrows=len(axes_names),
            squeeze=False,
            layout="constrained",
        )
        panels = list(grid[:, 0])
    else:
        fig, grid = new_figure(
            sum(widths) + 1.0,
            height,
            ncols=max(1, len(axes_names)),
            squeeze=False,
            gridspec_kw={"width_ratios": widths or [1]},
            layout="constrained",
        )
        panels = list(grid[0])
    finite = [
        float(np.nanmax(g.values.clip(lower=0).to_numpy(float), initial=0.0)) for g in panels_data
    ]
    vmax = max([0.05, *finite])
    served = _served(heads)
    bases = {g.basis for g in panels_data}
    colour = COLOUR_LABELS.get(frozenset(bases), "accuracy lost (removed) or added (kept alone)")
    notes = []  # (panel, note): "no damaging head" over a panel with nothing to show
    for ax, axis, data, largest in zip(panels, axes_names, panels_data, finite, strict=False):
        colorbar = stacked or ax is panels[-1]  # stacked: one each (same scale), panels aligned
        marks = _marks(data, served, axis, min_damage)
        _damage_panel(ax, data, marks, vmax, colorbar, colour)
        ax.set_title(_panel_title(axis, calls.get(axis)))
        label = axis.replace("_", " ")
        if data.left_out:
            label += f"\n(left out, too few scored: {', '.join(data.left_out)})"
        ax.set_xlabel(label)
        row_label = _row_label(ax, data)
        ax.set_ylabel(row_label if stacked or ax is panels[0] else "")
        if largest < min_damage:
            notes.append((ax, _empty_note(data.basis, min_damage)))
    fig.suptitle(
        "Damage of removing one head, per value (* = serves)"
        if bases == {"single"}
        else "The profiles each axis's call rests on, per value (* = serves)"
    )
    _fit_panels(fig, list(zip(panels, panels_data, strict=False)))
    for ax, note in notes:  # after the fitting, which keeps or drops every text of a panel
        note_on_axes(ax, note)
    return fig


def _fit_panels(fig: plt.Figure, panels: list[tuple[plt.Axes, _PanelData]]) -> None:
    """Fit every panel's tick labels, then its cell text, each after one draw of the figure
    (turned labels change the cells' size: drawn again then; a draw per panel and step cost
    2 x the panels)."""
    fig.draw_without_rendering()
    turned = [fit_tick_labels(ax, "x", drawn=True) for ax, _ in panels]
    if any(turned):
        fig.draw_without_rendering()
    for ax, data in panels:
        fit_cell_text(ax, *data.values.shape, drawn=True)


COLOUR_LABELS = {
    frozenset({"single"}): "accuracy lost",
    frozenset({"group"}): "accuracy lost",
    frozenset({"single", "group"}): "accuracy lost",
    frozenset({"kept"}): "accuracy added, kept alone",
}
"""The colour bar's label for the bases a figure's panels use (kept mixed with the others:
both named)."""


@dataclass
class _PanelData:
    """One panel's grid: rows (heads or groups) x the values in the index, its basis, the
    values left out, and which row is which head (None for a group's row)."""

    values: pd.DataFrame
    basis: str
    left_out: list[str]
    heads: dict[str, str | None]


def _axis_calls(index: pd.DataFrame | None) -> dict[str, tuple[str, str]]:
    """Axis -> ``(basis, call)`` from a division index table (empty without one)."""
    if index is None or not len(index) or "basis" not in index.columns:
        return {}
    calls = index["call"] if "call" in index.columns else pd.Series("", index=index.index)
    return {
        str(by): (str(basis) if isinstance(basis, str) else "", str(call) if call else "")
        for by, basis, call in zip(index["by"], index["basis"], calls.fillna(""), strict=True)
    }


def _basis_grid(
    profiles: pd.DataFrame,
    basis_profiles: pd.DataFrame | None,
    heads: pd.DataFrame | None,
    axis: str,
    basis: str,
) -> _PanelData:
    """The rows x values grid of ``axis`` on ``basis`` ("" or a basis without saved
    profiles: single-head)."""
    single = profiles[profiles["by"] == axis].rename(columns={"head_label": "unit"})
    single = single.assign(profile=single["damage"])
    saved = _basis_rows(basis_profiles, axis, basis)
    if basis == "kept" and len(saved):
        part = saved
    elif basis == "group" and len(saved):
        lone = _lone_heads(heads, axis)
        part = pd.concat([saved, single[single["unit"].isin(lone)]], ignore_index=True)
    else:
        part, basis = single, "single"
    part = part.assign(value=part["value"].astype(str))
    in_index = part["in_index"].astype(bool)
    kept_values = set(part.loc[in_index, "value"])
    left_out = [v for v in _value_order(part["value"]) if v not in kept_values]
    part = part[in_index]
    units = list(dict.fromkeys(part["unit"].astype(str)))
    groups = [u for u in units if "," in u]
    rows = groups + head_order([u for u in units if "," not in u])
    grid = part.pivot(index="unit", columns="value", values="profile").reindex(
        index=rows, columns=_value_order(part["value"])
    )
    return _PanelData(grid, basis, left_out, {u: None if "," in u else u for u in rows})


def _basis_rows(basis_profiles: pd.DataFrame | None, axis: str, basis: str) -> pd.DataFrame:
    """The saved rows of ``basis`` on ``axis`` (empty when none are saved)."""
    if basis_profiles is None or not len(basis_profiles) or basis not in ("kept", "group"):
        return pd.DataFrame()
    rows = basis_profiles[(basis_profiles["by"] == axis) & (basis_profiles["basis"] == basis)]
    return rows.assign(unit=rows["unit"].astype(str))


def _lone_heads(heads: pd.DataFrame | None, axis: str) -> list[str]:
    """The heads that damage alone outside every group: the group basis's other units."""
    if heads is None or not {"basis", "group"} <= set(heads.columns):
        return []
    own = heads[(heads["by"] == axis) & (heads["basis"] == "single")]
    return [
        str(h) for h, g in zip(own["head_label"], own["group"].fillna(""), strict=True) if not g
    ]


def _marks(
    data: _PanelData,
    served: dict[tuple[str, str], tuple[str, set[str]]],
    axis: str,
    min_damage: float,
) -> np.ndarray:
    """``*`` where a head serves the value on this panel's basis and the cell shows it."""
    marks = np.full(data.values.shape, "", dtype=object)
    for i, unit in enumerate(data.values.index):
        head = data.heads.get(unit)
        basis, values = served.get((head, axis), ("", set())) if head else ("", set())
        if basis not in ("", data.basis) and not (data.basis == "group" and basis == "single"):
            continue  # served on another basis' profile: not this row's evidence
        for j, value in enumerate(data.values.columns):
            cell = data.values.iat[i, j]
            if value in values and np.isfinite(cell) and cell >= min_damage:
                marks[i, j] = "*"
    return marks


def _panel_title(axis: str, call: tuple[str, str] | None) -> str:
    """``by position`` (no index given), else with the call and its basis."""
    if not call:
        return f"by {axis}"
    basis, verdict = call
    if not basis:
        return f"by {axis}: {verdict or 'cannot tell'}\n(no basis: single-head shown)"
    return f"by {axis}: {verdict}\n({BASIS_NAMES[basis]})"


def _row_label(ax: plt.Axes, data: _PanelData) -> str:
    """The rows' axis label; heads of several layers get a line between the layers and the
    layers named (:func:`~._common.mark_layers`)."""
    if data.basis == "group":
        return "group or head"
    named = mark_layers(ax, list(data.values.index))
    return named.replace("head", "head kept alone", 1) if data.basis == "kept" else named


def _empty_note(basis: str, min_damage: float) -> str:
    if basis == "kept":
        return f"no contributing head:\nno head kept alone adds ≥ {min_damage:g} accuracy"
    return f"no damaging head:\nno removal costs ≥ {min_damage:g} accuracy"


def _served(heads: pd.DataFrame | None) -> dict[tuple[str, str], tuple[str, set[str]]]:
    """``(head_label, by) -> (basis, served values)`` from the heads table's gated ``serves``
    column ("" unless the head is specialized) and the basis its profile used."""
    if heads is None:
        return {}
    bases = heads["basis"] if "basis" in heads.columns else pd.Series("", index=heads.index)
    return {
        (str(h), str(by)): (b if isinstance(b, str) else "", set(filter(None, s.split(","))))
        for h, by, s, b in zip(
            heads["head_label"], heads["by"], heads["serves"], bases, strict=True
        )
        if isinstance(s, str)
    }


def _damage_panel(
    ax: plt.Axes,
    data: _PanelData,
    marks: np.ndarray,
    vmax: float,
    colorbar: bool,
    colour: str,
) -> None:
    """One axis' rows x values heatmap."""
    heatmap(
        data.values,
        ax,
        cmap="rocket_r",
        vmin=0,
        vmax=vmax,
        annot=marks,
        fmt="",
        cbar=colorbar,
        cbar_kws={"label": colour},
        linewidths=0.3,
    )
    ax.grid(False)  # the style's grid showed through empty cells as stray ticks
    ax.tick_params(axis="y", rotation=0)


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
        sweep,
        ["task", "n_heads", "seed", "by", "index", "null_index", "null_index_std"],
        "sweep",
        "mhainterp.specialization.division_folder",
    )
    tasks = list(dict.fromkeys(sweep["task"]))
    axes_names = list(dict.fromkeys(sweep["by"]))
    fig, axes = new_figure(
        3.4 * len(axes_names),
        3.0 * len(tasks),
        nrows=len(tasks),
        ncols=len(axes_names),
        squeeze=False,
        sharey=True,
    )
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
    """Draw the heatmap of a :class:`~mhainterp.specialization.DivisionResult` (each axis on its
    call's basis) into ``folder/division_profiles.png``, beside ``division_profiles.csv`` (which
    :meth:`~mhainterp.specialization.DivisionResult.save` wrote); nothing when the result has no
    profiles.

    Example:
        >>> save_division_figures(result, "runs/cp/runs/h8_seed0/analysis")  # doctest: +SKIP
    """
    profiles = result.profiles  # type: ignore[attr-defined]
    if not len(profiles):
        return []
    fig = division_heatmap(
        profiles,
        result.heads,
        basis_profiles=result.basis_profiles,  # type: ignore[attr-defined]
        index=result.index,  # type: ignore[attr-defined]
    )
    return [save_figure(fig, Path(folder) / PROFILE_FIGURE)]
