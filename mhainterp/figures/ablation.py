"""Figures of the ablation tables (:mod:`mhainterp.ablation`): one function per figure.

Each function takes the DataFrame(s) the library returned and gives back a matplotlib Figure;
:func:`save_ablation_figures` draws them all and saves each PNG next to the CSV it was drawn
from (via :func:`mhainterp.figures._common.save_figure`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from mhainterp.attribution import compare_importance, importance_agreement
from mhainterp.figures._common import (
    fit_cell_text,
    fit_tick_labels,
    head_order,
    heatmap,
    legend_outside,
    mark_layers,
    new_figure,
    plt,
    require_columns,
    save_figure,
    sns,
)
from mhainterp.validation import check_option

__all__ = [
    "ABLATION_FIGURES",
    "gradient_vs_ablation_figure",
    "importance_figure",
    "pairwise_figure",
    "pairwise_matrix",
    "prune_curve_figure",
    "save_ablation_figure",
    "save_ablation_figures",
]


def _require(df: pd.DataFrame, columns: Sequence[str], name: str) -> None:
    require_columns(df, columns, name, "mhainterp.ablation")


def _target_names(importance: pd.DataFrame) -> list[str]:
    return [c.split("/", 1)[1] for c in importance.columns if c.startswith("delta_accuracy/")]


# ----------------------------------------------------------------------------- importance


def importance_figure(importance: pd.DataFrame, *, method: str | None = None) -> plt.Figure:
    """Bars of each head's ablation effect: Δloss, Δaccuracy, and Δaccuracy per target.

    Args:
        importance: :func:`mhainterp.ablation.head_importance` output (one or several methods
            stacked; each method is a bar colour).
        method: The method shown in the per-target panel (default: the first in the table).
            The per-target panel appears only for multi-target tasks.

    Returns:
        The figure (1 row of 2 or 3 panels).

    Example:
        >>> fig = importance_figure(head_importance(model, task))  # doctest: +SKIP
    """
    _require(importance, ["head_label", "method", "delta_loss", "delta_accuracy"], "importance")
    heads = head_order(importance["head_label"])
    methods = list(dict.fromkeys(importance["method"]))
    method = methods[0] if method is None else method
    check_option("method", method, methods)
    targets = _target_names(importance)
    n_panels = 3 if targets else 2
    width = min(18.0, max(6.0, 0.3 * len(heads) * (len(methods) + 1) + 2.0))
    fig, axes = new_figure(width, 3.2 * n_panels, nrows=n_panels, squeeze=False)
    for ax, column, label in (
        (axes[0, 0], "delta_loss", "Δ loss (ablated − clean)"),
        (axes[1, 0], "delta_accuracy", "Δ accuracy (ablated − clean)"),
    ):
        sns.barplot(
            data=importance,
            x="head_label",
            y=column,
            hue="method",
            order=heads,
            hue_order=methods,
            ax=ax,
        )
        ax.set(
            xlabel="head", ylabel=label, title=label.split(" (")[0] + " when the head is ablated"
        )
        ax.axhline(0.0, color="black", linewidth=0.8)
        legend_outside(ax, title="method", fontsize=8)
    if targets:
        _per_target_panel(axes[2, 0], importance[importance["method"] == method], heads, targets)
        axes[2, 0].set_title(f"Δ accuracy per target ({method} ablation)")
    fig.suptitle("Head importance: effect of ablating one head at a time")
    fig.tight_layout()
    fig.draw_without_rendering()  # no layout engine: one draw measures every panel as it stays
    turned = [fit_tick_labels(ax, "x", drawn=True) for ax in axes[:, 0]]
    if any(turned):  # turned labels are taller: lay out again, or the "head" label runs into
        fig.tight_layout()  # the next panel's title (32 heads)
    return fig


def _per_target_panel(
    ax: plt.Axes, importance: pd.DataFrame, heads: list[str], targets: list[str]
) -> None:
    long = importance.melt(
        id_vars=["head_label"],
        value_vars=[f"delta_accuracy/{t}" for t in targets],
        var_name="target",
        value_name="delta",
    )
    long["target"] = long["target"].str.removeprefix("delta_accuracy/")
    sns.barplot(data=long, x="head_label", y="delta", hue="target", order=heads, ax=ax)
    ax.set(xlabel="head", ylabel="Δ accuracy (ablated − clean)")
    ax.axhline(0.0, color="black", linewidth=0.8)
    legend_outside(ax, title="target", fontsize=8)


# ----------------------------------------------------------------------------- pairwise


def pairwise_matrix(
    pairwise: pd.DataFrame, *, metric: str = "accuracy", value: str = "interaction"
) -> pd.DataFrame:
    """The square head × head matrix drawn by :func:`pairwise_figure`.

    Off the diagonal: ``value`` for the pair (symmetric). On the diagonal: the single-head damage
    when ``value`` is a ``damage_*`` column, NaN otherwise.
    """
    _require(pairwise, ["head_a", "head_b", "metric", value, "damage_a", "damage_b"], "pairwise")
    rows = pairwise[pairwise["metric"] == metric]
    if rows.empty and not pairwise.empty:
        check_option("metric", metric, sorted(pairwise["metric"].unique()))
    heads = head_order([*rows["head_a"], *rows["head_b"]])
    matrix = pd.DataFrame(np.nan, index=heads, columns=heads)
    for row in rows.itertuples(index=False):
        a, b, v = row.head_a, row.head_b, getattr(row, value)
        matrix.loc[a, b] = matrix.loc[b, a] = v
        if value.startswith("damage"):
            matrix.loc[a, a], matrix.loc[b, b] = row.damage_a, row.damage_b
    matrix.index.name = "head"
    return matrix


def pairwise_figure(
    pairwise: pd.DataFrame, *, metric: str = "accuracy", value: str = "interaction"
) -> plt.Figure:
    """Heatmap of pairwise ablation: joint damage beyond the sum of single damages.

    Args:
        pairwise: :func:`mhainterp.ablation.pairwise_ablation` output.
        metric: ``"accuracy"``, ``"loss"`` or ``"accuracy/<target>"``.
        value: ``"interaction"`` (joint − sum of singles; > 0 = redundant / backup heads) or
            ``"damage_joint"`` (damage of removing both; diagonal = one head alone).

    Example:
        >>> fig = pairwise_figure(pairwise_ablation(model, task), metric="loss")  # doctest: +SKIP
    """
    matrix = pairwise_matrix(pairwise, metric=metric, value=value)
    n = len(matrix)
    size = max(4.5, 0.55 * n + 2.5)
    fig, ax = new_figure(size + 1.0, size)
    method = pairwise["method"].iloc[0] if "method" in pairwise and len(pairwise) else "?"
    if n < 2:
        ax.text(0.5, 0.5, "pairwise ablation needs at least two heads", ha="center", va="center")
        ax.set_axis_off()
        return fig
    finite = matrix.to_numpy()[np.isfinite(matrix.to_numpy())]
    limit = float(np.abs(finite).max()) if finite.size else 1.0
    drop = "increase" if metric == "loss" else "drop"
    label = f"{metric} {drop}" + (": joint − (a + b)" if value == "interaction" else ": joint")
    heatmap(
        matrix,
        ax,
        cmap="RdBu_r",
        center=0.0,
        vmin=-limit or -1,
        vmax=limit or 1,
        annot=n <= 12,
        fmt=".2f",
        square=True,
        linewidths=0.5,
        cbar_kws={"label": label},
    )
    ax.grid(False)
    ax.set_facecolor("#eeeeee")  # the blank diagonal / missing pairs
    ax.tick_params(axis="y", rotation=0)
    fig.draw_without_rendering()  # no layout engine yet: the fitting moves no panel
    fit_tick_labels(ax, "x", drawn=True)
    fit_tick_labels(ax, "y", drawn=True)
    fit_cell_text(ax, n, n, drawn=True)
    mark_layers(ax, list(matrix.index), columns=True)
    ax.set(xlabel="head b", ylabel="head a")
    what = "joint − sum of single damages" if value == "interaction" else "joint damage"
    hint = "\n> 0: the heads back each other up (redundancy)" if value == "interaction" else ""
    ax.set_title(f"Pairwise ablation ({method}), {metric}: {what}{hint}")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- pruning


def prune_curve_figure(curve: pd.DataFrame) -> plt.Figure:
    """Accuracy (overall and per target) as heads are greedily removed.

    Args:
        curve: :func:`mhainterp.attribution.prune_curve` output (several methods may be stacked).

    Example:
        >>> fig = prune_curve_figure(prune_curve(model, task))  # doctest: +SKIP
    """
    _require(curve, ["n_heads_left", "accuracy", "removed", "method"], "curve")
    fig, ax = new_figure(7.0, 4.5)
    targets = [c.split("/", 1)[1] for c in curve.columns if c.startswith("accuracy/")]
    for method, group in curve.groupby("method", sort=False):
        line = ax.plot(group["n_heads_left"], group["accuracy"], marker="o", label=f"{method}")[0]
        for target, style in zip(targets, ("--", ":", "-.") * 10, strict=False):
            ax.plot(
                group["n_heads_left"],
                group[f"accuracy/{target}"],
                linestyle=style,
                color=line.get_color(),
                alpha=0.7,
                label=f"{method}: {target}",
            )
        for row in group.itertuples(index=False):
            if row.removed:
                ax.annotate(
                    f"−{row.removed}",
                    (row.n_heads_left, row.accuracy),
                    textcoords="offset points",
                    xytext=(0, 7),
                    ha="center",
                    fontsize=8,
                )
    total = int(curve["n_heads_left"].max())
    ax.set_xlim(total + 0.5, -0.5)  # pruning proceeds left to right
    ax.set_xticks(range(total, -1, -max(1, math.ceil(total / 16))))
    ax.set(xlabel="heads left", ylabel="accuracy", ylim=(-0.02, 1.08))
    ax.set_title("Greedy pruning: remove the least important head, re-score, repeat")
    legend_outside(ax, fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- gradient


def gradient_vs_ablation_figure(
    comparison: pd.DataFrame, agreement: pd.DataFrame | None = None
) -> plt.Figure:
    """Scatter of gradient importance against ablation importance, one panel per method.

    Args:
        comparison: :func:`mhainterp.attribution.compare_importance` output.
        agreement: :func:`mhainterp.attribution.importance_agreement` output, for the Spearman ρ
            in each title (computed from ``comparison`` when None).

    Example:
        >>> g, a = gradient_importance(m, t), head_importance(m, t)  # doctest: +SKIP
        >>> fig = gradient_vs_ablation_figure(compare_importance(g, a))  # doctest: +SKIP
    """
    _require(
        comparison,
        ["head_label", "layer", "method", "gradient_importance", "ablation_importance"],
        "comparison",
    )
    methods = list(dict.fromkeys(comparison["method"]))
    # the one legend goes beside the last panel: beside the first it covered that panel's
    # rightmost point labels
    fig, axes = new_figure(5.0 * len(methods) + 1.0, 4.5, ncols=len(methods), squeeze=False)
    rho = _rho_by_method(comparison, agreement)
    for ax, method in zip(axes[0], methods, strict=True):
        group = comparison[comparison["method"] == method]
        group = group.assign(layer=group["layer"].map(lambda layer: f"layer {layer}"))
        sns.scatterplot(
            data=group,
            x="ablation_importance",
            y="gradient_importance",
            hue="layer",
            hue_order=sorted(set(group["layer"]), key=lambda name: int(name.split()[1])),
            palette="viridis",
            ax=ax,
            s=50,
            legend=ax is axes[0, -1],
        )
        _annotate_points(ax, group)
        if ax.get_legend() is not None:
            legend_outside(ax, title=None, fontsize=8)
        ax.set(
            xlabel=f"ablation importance: Δ loss ({method})",
            ylabel="gradient importance E|∂L/∂ξ| (layer-normalised)",
            title=f"{method} ablation: Spearman ρ = {rho.get(method, float('nan')):.2f}",
        )
    fig.suptitle("Gradient head importance (Michel et al. 2019) vs ablation importance")
    fig.tight_layout()
    return fig


def _annotate_points(ax: plt.Axes, group: pd.DataFrame) -> None:
    """Label each point with its head; heads within 1% of the axis spans share one label."""
    x, y = group["ablation_importance"], group["gradient_importance"]
    x_span = float(x.max() - x.min()) or 1.0
    y_span = float(y.max() - y.min()) or 1.0
    labels: dict[tuple[float, float], list[tuple[float, float, str]]] = {}
    for row in group.itertuples(index=False):
        xi, yi = float(row.ablation_importance), float(row.gradient_importance)
        key = (round(xi / x_span, 2), round(yi / y_span, 2))
        labels.setdefault(key, []).append((xi, yi, row.head_label))
    right = float(x.min()) + 0.75 * x_span  # labels of the rightmost points go to their left
    for points in labels.values():
        xi, yi, _ = points[0]
        text = ", ".join(label for _, _, label in points)
        left = xi > right
        ax.annotate(
            text,
            (xi, yi),
            textcoords="offset points",
            xytext=(-4 if left else 4, 3),
            ha="right" if left else "left",
            fontsize=8,
        )


def _rho_by_method(comparison: pd.DataFrame, agreement: pd.DataFrame | None) -> dict[str, float]:
    if agreement is None:
        return {
            m: _spearman(g["gradient_importance"], g["ablation_importance"])
            for m, g in comparison.groupby("method", sort=False)
        }
    return dict(zip(agreement["method"], agreement["spearman"], strict=True))


def _spearman(x: pd.Series, y: pd.Series) -> float:
    if len(x) < 2 or x.nunique() < 2 or y.nunique() < 2:
        return float("nan")  # undefined for a constant score
    return float(stats.spearmanr(x, y).statistic)


# ----------------------------------------------------------------------------- all at once


ABLATION_FIGURES: dict[str, tuple[str, ...]] = {
    "ablation_importance": ("importance",),
    "ablation_pairwise": ("pairwise",),
    "ablation_prune_curve": ("prune_curve",),
    "gradient_vs_ablation": ("gradient_importance", "importance", "importance_agreement"),
}
"""Each ablation figure and the tables of :func:`mhainterp.analyze.ablation_tables` it is drawn
from (``gradient_vs_ablation`` computes the agreement itself where that table is missing)."""


def save_ablation_figure(
    name: str, tables: Mapping[str, pd.DataFrame], out_dir: str | os.PathLike[str]
) -> Path | None:
    """Draw and save the ablation figure ``name`` (a key of :data:`ABLATION_FIGURES`) from
    ``tables``, its PNG beside the CSV it was drawn from; None when a table it needs is missing.

    Example:
        >>> save_ablation_figure("ablation_pairwise", tables, out)  # doctest: +SKIP
    """
    name = check_option("name", name, ABLATION_FIGURES)
    png = Path(out_dir) / f"{name}.png"
    if name == "gradient_vs_ablation":
        if "gradient_importance" not in tables or "importance" not in tables:
            return None
        comparison = compare_importance(tables["gradient_importance"], tables["importance"])
        agreement = tables.get("importance_agreement")
        if agreement is None:
            agreement = importance_agreement(tables["gradient_importance"], tables["importance"])
        return save_figure(gradient_vs_ablation_figure(comparison, agreement), png, comparison)
    (table,) = ABLATION_FIGURES[name]
    if table not in tables:
        return None
    draw = {
        "importance": importance_figure,
        "pairwise": pairwise_figure,
        "prune_curve": prune_curve_figure,
    }[table]
    return save_figure(draw(tables[table]), png, tables[table])


def save_ablation_figures(
    tables: Mapping[str, pd.DataFrame], out_dir: str | os.PathLike[str]
) -> dict[str, Path]:
    """Draw and save every ablation figure from :func:`mhainterp.analyze.ablation_tables`.

    Writes, each PNG beside the CSV it was drawn from: ``ablation_importance``,
    ``ablation_pairwise`` (accuracy interaction; the CSV is the full pairwise table),
    ``ablation_prune_curve`` and ``gradient_vs_ablation`` (the CSV is
    :func:`~mhainterp.attribution.compare_importance`). Tables that are missing are skipped.

    Returns:
        Figure name -> PNG path.

    Example:
        >>> save_ablation_figures(ablation_tables(run), run.path / "analysis")  # doctest: +SKIP
    """
    saved = {name: save_ablation_figure(name, tables, out_dir) for name in ABLATION_FIGURES}
    return {name: png for name, png in saved.items() if png is not None}
