"""Figures of the head-count experiment: accuracy by head count, training curves."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mhainterp.figures._common import legend_outside, new_figure, plt, require_columns, sns

__all__ = ["plot_head_count_accuracy", "plot_training_curves"]


def plot_head_count_accuracy(results: pd.DataFrame, *, metric: str = "val_accuracy") -> plt.Figure:
    """Validation accuracy per head count: every seed as a point, mean ± std as a bar.

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
    fig, axes = new_figure(4.2 * len(tasks), 3.8, ncols=len(tasks), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        df = results[results["task"] == task]
        heads = sorted(df["n_heads"].unique())
        positions = {h: i for i, h in enumerate(heads)}
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
        # Jitter seeds sideways so identical values stay visible.
        seeds = sorted(df["seed"].unique())
        offsets = {s: (i - (len(seeds) - 1) / 2) * 0.08 for i, s in enumerate(seeds)}
        palette = sns.color_palette("tab10", len(seeds))
        for i, seed in enumerate(seeds):
            part = df[df["seed"] == seed]
            ax.scatter(
                [positions[h] + offsets[seed] for h in part["n_heads"]],
                part[metric],
                color=palette[i],
                alpha=0.8,
                s=28,
                label=f"seed {seed}",
                zorder=2,
            )
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
        sns.lineplot(
            data=df,
            x="step",
            y="loss",
            hue="heads",
            units="seed",
            estimator=None,
            ax=ax,
            alpha=0.8,
            linewidth=1.2,
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
    fig.tight_layout()
    return fig
