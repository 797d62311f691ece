"""Figures of the head-count experiment: accuracy by head count, training curves, and
:func:`draw_seeds`, how every figure shows the seeds of one head count (3 or 100 alike)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from mhainterp.figures._common import legend_outside, new_figure, plt, require_columns, sns

__all__ = [
    "BOX_MIN_SEEDS",
    "UNDEFINED_PANEL",
    "draw_seeds",
    "plot_does_h_matter",
    "plot_head_count_accuracy",
    "plot_training_curves",
]

BOX_MIN_SEEDS = 20
"""From this many seeds at one head count, a box (quartiles, whiskers at 1.5 IQR) stands
behind faint seed dots: 100 overlapping dots would hide where most of them lie."""

SEED_COLOR = "tab:blue"


def draw_seeds(
    ax: plt.Axes,
    positions: Sequence[float],
    groups: Sequence[np.ndarray],
    width: Sequence[float] | float,
    *,
    label: str = "seeds",
) -> None:
    """Draw the seeds of each group at its x position: dots spread sideways (a fixed jitter,
    so equal values stay visible); from :data:`BOX_MIN_SEEDS` seeds a box behind them and
    the dots small and faint.

    Args:
        ax: The axes.
        positions: One x per group.
        groups: One array of seed values per group (NaN values are left out).
        width: The sideways room of each group, in data units (one number, or one per group).
        label: Legend label of the dots.

    Example:
        >>> fig, ax = new_figure()
        >>> draw_seeds(ax, [0, 1], [np.array([0.5, 0.6]), np.array([0.9, 0.8])], 0.3)
    """
    widths = np.broadcast_to(np.asarray(width, dtype=float), (len(positions),))
    values = [np.asarray(g, dtype=float)[~np.isnan(np.asarray(g, dtype=float))] for g in groups]
    most = max((v.size for v in values), default=0)
    many = most >= BOX_MIN_SEEDS
    rng = np.random.default_rng(0)  # the same jitter every time the figure is drawn
    if many:
        label += " (box: quartiles)"
    for i, (x, v) in enumerate(zip(positions, values, strict=True)):
        if not v.size:
            continue
        spread = rng.uniform(-0.5, 0.5, v.size) * widths[i] if v.size > 1 else np.zeros(1)
        ax.scatter(
            x + spread,
            v,
            color=SEED_COLOR,
            s=6 if many else 24,
            alpha=0.25 if many else 0.8,
            linewidths=0,
            zorder=2,
            label=label,
        )
        label = None  # one legend entry
    if many:
        shown = [i for i, v in enumerate(values) if v.size]
        ax.boxplot(
            [values[i] for i in shown],
            positions=[positions[i] for i in shown],
            widths=[float(widths[i]) for i in shown],
            showfliers=False,
            manage_ticks=False,
            patch_artist=True,
            zorder=1,
            boxprops={"facecolor": "none", "edgecolor": "0.3"},
            medianprops={"color": "0.3"},
            whiskerprops={"color": "0.3"},
            capprops={"color": "0.3"},
        )


def plot_head_count_accuracy(results: pd.DataFrame, *, metric: str = "val_accuracy") -> plt.Figure:
    """Validation accuracy per head count: every seed as a point (behind a box from
    :data:`BOX_MIN_SEEDS` seeds), mean ± std as a bar.

    Args:
        results: :func:`mhainterp.sweep.run_sweep`'s table (columns ``task, n_heads, seed`` and
            ``metric``); several tasks give one panel each.
        metric: The column to plot.

    Example:
        >>> fig = plot_head_count_accuracy(pd.read_csv("runs/rev/results.csv"))  # doctest: +SKIP
    """
    require_columns(
        results, ["task", "n_heads", "seed", metric], "results", "a sweep's results.csv"
    )
    tasks = list(dict.fromkeys(results["task"]))
    # ~0.9 in per head count for its two-line label, and 3 in for the axis label and the
    # legend (the legend took the room of a 1.5 in margin: the panel shrank to ~1.8 in)
    most = int(results.groupby("task")["n_heads"].nunique().max())
    panel = max(4.2, 0.9 * most)
    fig, axes = new_figure(3.0 + panel * len(tasks), 3.8, ncols=len(tasks), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        df = results[results["task"] == task]
        heads = sorted(df["n_heads"].unique())
        stats = df.groupby("n_heads")[metric].agg(["mean", "std", "count"]).reindex(heads)
        x = np.arange(len(heads))
        ax.errorbar(
            x,
            stats["mean"],
            yerr=stats["std"].fillna(0),
            fmt="o",
            color="black",
            capsize=8,
            markersize=9,
            label="seed mean ± std",
            zorder=3,
        )
        by_h = [df.loc[df["n_heads"] == h, metric].to_numpy(float) for h in heads]
        draw_seeds(ax, x, by_h, 0.35)
        d_model = int(df["d_model"].iloc[0]) if "d_model" in df else None
        ax.set_xticks(x, [f"h={h}\nd_head={d_model // h}" if d_model else f"h={h}" for h in heads])
        n = int(stats["count"].min())
        ax.set_title(f"{task} (n = {n} seeds per head count)")
        ax.set_xlabel("number of heads (same parameter count)")
        ax.set_ylabel(metric.replace("_", " "))
    legend_outside(axes[0, -1], fontsize=8)
    fig.suptitle("Head count vs accuracy: is the difference bigger than the seed spread?")
    fig.tight_layout()
    return fig


def plot_training_curves(curves: pd.DataFrame, *, log_y: bool = True) -> plt.Figure:
    """Training loss against step, one line per run, coloured by head count.

    Args:
        curves: Tidy table with columns ``task, n_heads, seed, step, loss`` (the runs'
            ``metrics.csv`` stacked; see :func:`mhainterp.sweep.load_curves`).
        log_y: Log-scale the loss axis.
    """
    require_columns(
        curves, ["task", "n_heads", "seed", "step", "loss"], "curves", "a sweep's curves"
    )
    tasks = list(dict.fromkeys(curves["task"]))
    fig, axes = new_figure(4.6 * len(tasks), 3.6, ncols=len(tasks), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        df = curves[curves["task"] == task].copy()
        df["heads"] = df["n_heads"].map(lambda h: f"h={h}")
        # many seeds: fainter, thinner lines, so the bundle shows where most runs go
        n_seeds = df["seed"].nunique()
        faint = n_seeds > BOX_MIN_SEEDS // 2
        sns.lineplot(
            data=df,
            x="step",
            y="loss",
            hue="heads",
            units="seed",
            estimator=None,
            ax=ax,
            alpha=max(0.08, 8 / n_seeds) if faint else 0.8,
            linewidth=0.6 if faint else 1.2,
            hue_order=[f"h={h}" for h in sorted(df["n_heads"].unique())],
        )
        if log_y:
            ax.set_yscale("log")
        ax.set_title(f"{task}: training loss (one line per seed)")
        ax.set_xlabel("optimiser step")
        ax.set_ylabel("training loss (cross-entropy)")
        if ax is not axes[0, -1] and ax.get_legend() is not None:
            ax.get_legend().remove()  # one legend, outside the last panel
    legend_outside(axes[0, -1], fontsize=8)
    for handle in axes[0, -1].get_legend().legend_handles:  # faint lines, solid legend keys
        handle.set_alpha(1.0)
        handle.set_linewidth(1.5)
    fig.tight_layout()
    return fig


UNDEFINED_PANEL = (
    "the division index is undefined at every head count here (fewer than 2 heads or groups "
    "do the work)"
)


def plot_does_h_matter(table: pd.DataFrame, axes: Sequence[str] | None = None) -> plt.Figure:
    """One row per task: accuracy against h with 95% intervals (left), the division index
    against h per axis with 95% intervals (right); h on a log2 axis, equal parameter count.

    Args:
        table: One row per (task, n_heads): ``accuracy_mean, accuracy_ci_low,
            accuracy_ci_high`` and per axis ``{axis}_index_mean`` (+ ``_ci_low``, ``_ci_high``),
            as :func:`mhainterp.analyze.study.does_h_matter_table` writes it.
        axes: The division axes to draw (default: every ``*_index_mean`` column).
    """
    require_columns(
        table, ["task", "n_heads", "accuracy_mean"], "table", "analyze.study.does_h_matter_table"
    )
    axes = list(axes or [c.removesuffix("_index_mean") for c in table if c.endswith("_index_mean")])
    tasks = list(dict.fromkeys(table["task"]))
    fig, grid = plt.subplots(
        len(tasks), 2, figsize=(10, 2.6 * len(tasks) + 0.4), squeeze=False, sharex=True
    )
    heads = sorted(table["n_heads"].unique())
    for row, task in zip(grid, tasks, strict=True):
        group = table[table["task"] == task]
        _with_interval(row[0], group, "accuracy", "accuracy")
        row[0].set_ylabel("val accuracy")
        row[0].set_title(f"{task}: accuracy (seed mean, 95% CI)", fontsize=9)
        drawn = [axis for axis in axes if group[f"{axis}_index_mean"].notna().any()]
        for axis in drawn:
            _with_interval(row[1], group, f"{axis}_index", axis)
        row[1].set_ylabel("division index")
        row[1].set_title(f"{task}: division index by axis (seed mean, 95% CI)", fontsize=9)
        if drawn:
            legend_outside(row[1], fontsize=7)
        else:  # say why the panel is empty rather than leave a blank box
            row[1].text(
                0.5,
                0.5,
                UNDEFINED_PANEL,
                ha="center",
                va="center",
                wrap=True,
                fontsize=8,
                transform=row[1].transAxes,
            )
    for ax in grid[-1]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(heads, labels=[str(h) for h in heads])
        ax.set_xlabel("heads h (equal parameter count)")
    fig.tight_layout()
    return fig


def _with_interval(ax: plt.Axes, group: pd.DataFrame, name: str, label: str) -> None:
    """The seed mean of ``name`` against h, with its interval as error bars."""
    shown = group[group[f"{name}_mean"].notna()]
    mean = shown[f"{name}_mean"]
    errors = np.nan_to_num([mean - shown[f"{name}_ci_low"], shown[f"{name}_ci_high"] - mean])
    ax.errorbar(
        shown["n_heads"], mean, yerr=errors, marker="o", markersize=4, capsize=3, label=label
    )
