"""Figures of the specialization test (:mod:`mhainterp.specialization`), one function per figure.

Each function takes the DataFrame(s) the library returned and gives back a matplotlib Figure;
:func:`save_specialization_figures` draws those that apply to a result and saves each PNG next to
the CSV it was drawn from (:func:`mhainterp.figures._common.save_figure`).

- :func:`role_heatmap`: heads x roles, the role score, with significance marks;
- :func:`causal_matrix_figure`: heads x targets, the accuracy drop when the head is removed;
- :func:`specialization_vs_heads`: relations covered and heads per relation (counts), backed-up
  and dead shares and accuracy against head count (every seed a point, mean ± std a bar);
- :func:`consistency_figure`: cross-seed consistency against random matching and the
  head-shuffled null (heads dealt across seeds at random), per head count.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from mhainterp.figures._common import (
    COUNT_CLIP_NOTE,
    count_error_bars,
    fit_cell_text,
    head_order,
    heatmap,
    legend_in_cell,
    legend_outside,
    mark_layers,
    new_figure,
    plt,
    require_columns,
    save_figure,
    wrapped_grid,
)
from mhainterp.figures.headcount import draw_seeds

__all__ = [
    "causal_matrix_figure",
    "consistency_figure",
    "role_heatmap",
    "save_specialization_figures",
    "specialization_figure_stems",
    "specialization_vs_heads",
]


def _require(df: pd.DataFrame, columns: Sequence[str], name: str) -> None:
    require_columns(df, columns, name, "mhainterp.specialization")


def _runs(df: pd.DataFrame, max_runs: int) -> list[str]:
    runs = list(dict.fromkeys(df["run"])) if "run" in df.columns else [""]
    return runs[:max_runs]


def _of_run(df: pd.DataFrame, run: str) -> pd.DataFrame:
    return df[df["run"] == run] if "run" in df.columns else df


def _panel_grid(n_panels: int, width: float, height: float) -> tuple[plt.Figure, list]:
    """A figure of ``n_panels`` panels, at most two per row (constrained layout: room for the
    two-line title above the panels' own, which tight_layout let overlap)."""
    ncols = min(2, n_panels)
    nrows = -(-n_panels // ncols)
    fig, axes = new_figure(
        width * ncols,
        height * nrows,
        nrows=nrows,
        ncols=ncols,
        squeeze=False,
        layout="constrained",
    )
    flat = list(axes.ravel())
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def role_heatmap(
    roles: pd.DataFrame, *, value: str = "score", alpha: float = 0.05, max_runs: int = 4
) -> plt.Figure:
    """Heads x roles heatmap of the role score, one panel per run.

    Marks: ``**`` significant role (beats both nulls after correction, effect large enough),
    ``*`` corrected p below alpha but effect too small, nothing otherwise. The task's own
    relations come first and carry a trailing ``†`` on the axis.

    Args:
        roles: :attr:`~mhainterp.specialization.SpecializationResult.roles` (``run, head_label,
            role, task_relation``, ``value``, ``p_adj``, ``significant``).
        value: The column to colour by (``"score"`` or ``"effect"``).
        alpha: The level the ``*`` mark uses (the test's ``alpha``).
        max_runs: Draw at most this many runs.

    Example:
        >>> fig = role_heatmap(result.roles)  # doctest: +SKIP
    """
    _require(roles, ["head_label", "role", value, "p_adj", "significant"], "roles")
    runs = _runs(roles, max_runs)
    width = 2.5 + 0.85 * roles["role"].nunique()
    height = 2.6 + 0.45 * roles["head_label"].nunique()
    fig, axes = _panel_grid(len(runs), width, height)
    cells = []  # (panel, rows, columns): their text is fitted after one draw of every panel
    for ax, run in zip(axes, runs, strict=True):
        df = _of_run(roles, run)
        role_order = list(dict.fromkeys(df["role"]))
        heads = head_order(df["head_label"])
        grid = df.pivot(index="head_label", columns="role", values=value).loc[heads, role_order]
        sig = df.pivot(index="head_label", columns="role", values="significant")
        p_adj = df.pivot(index="head_label", columns="role", values="p_adj")
        marks = np.where(
            sig.loc[heads, role_order].astype(bool),
            "**",
            np.where(p_adj.loc[heads, role_order] < alpha, "*", ""),
        )
        text = np.array(
            [
                [f"{v:.2f}{m}" if np.isfinite(v) else "" for v, m in zip(row, mrow, strict=True)]
                for row, mrow in zip(grid.to_numpy(float), marks, strict=True)
            ]
        )
        own = df["task_relation"].astype(bool) if "task_relation" in df else df["role"].isna()
        relations = set(df.loc[own, "role"])
        labels = [f"{r} †" if r in relations else r for r in role_order]
        heatmap(
            grid,
            ax,
            annot=text,
            fmt="",
            vmin=0.0 if value == "score" else -0.2,
            vmax=1.0,
            cmap="viridis",
            cbar_kws={"label": value.replace("_", " ")},
            xticklabels=labels,
            yticklabels=heads,
            annot_kws={"fontsize": 8},
        )
        cells.append((ax, len(heads), len(role_order)))
        ax.set_xlabel("relation template († = the task's own)")
        ax.set_ylabel(mark_layers(ax, heads))
        ax.set_title(run or "role scores", fontsize=10)
        # upright labels slanted at 40 degrees overlapped their neighbours' boxes
        plt.setp(ax.get_xticklabels(), rotation=90, ha="center")
        plt.setp(ax.get_yticklabels(), rotation=0)
    fig.suptitle(
        "Share of each head's attention on each relation template\n"
        f"** = role (beats both nulls, corrected p < {alpha:g}, effect large enough); "
        "* = p only"
    )
    fig.draw_without_rendering()
    for ax, n_rows, n_cols in cells:
        fit_cell_text(ax, n_rows, n_cols, drawn=True)
    return fig


def causal_matrix_figure(causal: pd.DataFrame, *, max_runs: int = 4) -> plt.Figure:
    """Heads x targets heatmap of the accuracy drop when the head is ablated alone.

    Args:
        causal: :attr:`~mhainterp.specialization.SpecializationResult.causal` (``run, head_label,
            target, damage``).
        max_runs: Draw at most this many runs.

    Example:
        >>> fig = causal_matrix_figure(result.causal)  # doctest: +SKIP
    """
    _require(causal, ["head_label", "target", "damage"], "causal")
    runs = _runs(causal, max_runs)
    n_targets = causal["target"].nunique()
    width = 3.2 + 1.1 * n_targets
    height = 2.4 + 0.45 * causal["head_label"].nunique()
    fig, axes = _panel_grid(len(runs), width, height)
    vmax = max(0.05, float(causal["damage"].abs().max()))
    for ax, run in zip(axes, runs, strict=True):
        df = _of_run(causal, run)
        targets = list(dict.fromkeys(df["target"]))
        heads = head_order(df["head_label"])
        grid = df.pivot(index="head_label", columns="target", values="damage").loc[heads, targets]
        heatmap(
            grid,
            ax,
            annot=True,
            fmt=".2f",
            cmap="RdBu_r",
            center=0.0,
            vmin=-vmax,
            vmax=vmax,
            cbar_kws={"label": "accuracy drop when ablated"},
            annot_kws={"fontsize": 8},
        )
        ax.set_xlabel("target")
        ax.set_ylabel(f"ablated {mark_layers(ax, heads)}")
        ax.set_title(run or "head x target damage", fontsize=10)
        plt.setp(ax.get_yticklabels(), rotation=0)
    fig.suptitle("Which target each head serves: accuracy lost when it is removed")
    return fig


_SWEEP_METRICS = (  # (column, label, is a count): counts and shares get separate panels
    ("n_relations", "relations covered (a count)", True),
    ("heads_per_relation", "heads per relation (a count)", True),
    ("frac_backed_up", "backed-up share of heads", False),
    ("frac_dead", "dead share of heads", False),
    ("accuracy", "validation accuracy", False),
)


def specialization_vs_heads(runs: pd.DataFrame) -> plt.Figure:
    """Relations covered and heads per relation (counts), backed-up and dead shares and
    accuracy against head count.

    One row of panels per task; every seed is a point (jittered), the mean ± sample std over
    seeds a black bar. The division index against h, with its null, is
    :func:`mhainterp.figures.division.division_vs_heads`.

    Args:
        runs: :attr:`~mhainterp.specialization.SweepSpecialization.runs` (``task, n_heads, seed,
            n_relations, heads_per_relation, frac_backed_up, frac_dead`` and ``val_accuracy`` or
            ``accuracy``; ``heads_per_relation`` is NaN for a seed without a relation).

    Example:
        >>> fig = specialization_vs_heads(sweep_specialization("runs/x").runs)  # doctest: +SKIP
    """
    _require(runs, ["task", "n_heads", "seed", *(m for m, _, _ in _SWEEP_METRICS[:-1])], "runs")
    df = runs.copy()
    if "val_accuracy" in df.columns and df["val_accuracy"].notna().all():
        df["accuracy"] = df["val_accuracy"]
    _require(df, ["accuracy"], "runs")
    tasks = list(dict.fromkeys(df["task"]))
    fig, axes, spare = wrapped_grid(len(tasks), len(_SWEEP_METRICS), ncols=3)
    for row, task in enumerate(tasks):
        part = df[df["task"] == task]
        heads = sorted(part["n_heads"].unique())
        for col, (metric, label, is_count) in enumerate(_SWEEP_METRICS):
            ax = axes[row, col]
            stats = part.groupby("n_heads")[metric].agg(["mean", "std"]).reindex(heads)
            ax.errorbar(
                np.arange(len(heads)),
                stats["mean"],
                yerr=count_error_bars(stats["mean"], stats["std"])
                if is_count
                else stats["std"].fillna(0),
                fmt="o",
                color="black",
                capsize=6,
                markersize=7,
                zorder=3,
                label="mean ± std",
            )
            # every seed a dot (a box behind them from many seeds), as every seed figure
            groups = [part.loc[part["n_heads"] == h, metric].to_numpy(float) for h in heads]
            draw_seeds(ax, np.arange(len(heads)), groups, 0.5)
            ax.set_xticks(np.arange(len(heads)), [f"h={h}" for h in heads])
            if is_count:  # whole numbers, from 0 to the largest seen
                top = max(
                    1.0, float(part[metric].max(skipna=True)) if part[metric].notna().any() else 1.0
                )
                ax.set_ylim(-0.2, top + 0.5)
                ax.yaxis.get_major_locator().set_params(integer=True)
            else:
                ax.set_ylim(-0.05, 1.05)
            ax.set_xlabel("number of heads (same parameter count)")
            ax.set_ylabel(label)
            ax.set_title(f"{task}: {label}", fontsize=10)
    fig.suptitle(
        "Relations covered, heads per relation, backed-up and dead heads, accuracy vs h "
        "(points = seeds)"
    )
    fig.tight_layout()
    handles, labels = axes[0, 0].get_legend_handles_labels()
    legend_in_cell(fig, spare[0], handles, labels, note=COUNT_CLIP_NOTE.replace(": ", ":\n"))
    return fig


def consistency_figure(consistency: pd.DataFrame) -> plt.Figure:
    """Cross-seed consistency of role profiles per head count, against its two nulls.

    Every run pair is a point; for each head count a black bar marks the mean observed
    consistency, a grey dash the random-matching null and a red dash the head-shuffled null.

    Args:
        consistency: :attr:`~mhainterp.specialization.SpecializationResult.consistency` (``task,
            n_heads, consistency, random_matching, null_shuffled``).

    Example:
        >>> fig = consistency_figure(result.consistency)  # doctest: +SKIP
    """
    _require(
        consistency,
        ["task", "n_heads", "consistency", "random_matching", "null_shuffled"],
        "consistency",
    )
    tasks = list(dict.fromkeys(consistency["task"]))
    # + room for the legend beside the last panel (it squeezed a lone panel to ~160 px)
    fig, axes = new_figure(4.4 * len(tasks) + 2.4, 3.6, ncols=len(tasks), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        part = consistency[consistency["task"] == task]
        heads = sorted(part["n_heads"].unique())
        means = part.groupby("n_heads")[["consistency", "random_matching", "null_shuffled"]]
        means = means.mean().reindex(heads)
        x = np.arange(len(heads))
        groups = [part.loc[part["n_heads"] == h, "consistency"].to_numpy(float) for h in heads]
        draw_seeds(ax, x, groups, 0.5, label="run pairs")
        ax.scatter(x, means["consistency"], marker="_", s=900, color="black", label="observed")
        ax.scatter(
            x, means["random_matching"], marker="_", s=700, color="grey", label="random matching"
        )
        ax.scatter(
            x,
            means["null_shuffled"],
            marker="_",
            s=700,
            color="tab:red",
            label="heads shuffled across seeds",
        )
        ax.set_xticks(x, [f"h={h}" for h in heads])
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("number of heads")
        ax.set_ylabel("matched role-profile similarity")
        ax.set_title(f"{task}: same roles across seeds?")
    legend_outside(axes[0, -1], fontsize=8, markerscale=0.5)
    fig.tight_layout()
    return fig


def specialization_figure_stems(result: object) -> list[str]:
    """The figures that apply to a ``SpecializationResult``: ``role_scores``, then
    ``causal_matrix`` when the task has several targets and ``consistency`` when the result
    has run pairs."""
    causal = result.causal  # type: ignore[attr-defined]
    stems = ["role_scores"]
    if len(causal) and causal["target"].nunique() > 1:
        stems.append("causal_matrix")
    if len(result.consistency):  # type: ignore[attr-defined]
        stems.append("consistency")
    return stems


def save_specialization_figures(
    result: object, out_dir: str | os.PathLike[str], *, prefix: str = ""
) -> list[Path]:
    """Draw the figures that apply to a ``SpecializationResult`` and save PNG + CSV pairs.

    Writes ``{prefix}role_scores.png``, ``{prefix}causal_matrix.png`` (when the task has
    several targets) and ``{prefix}consistency.png`` (when the result has run pairs): those
    :func:`specialization_figure_stems` names.

    Example:
        >>> save_specialization_figures(result, "runs/x/analysis")  # doctest: +SKIP
    """
    figures = {
        "role_scores": lambda: role_heatmap(result.roles, alpha=result.settings.alpha),
        "causal_matrix": lambda: causal_matrix_figure(result.causal),
        "consistency": lambda: consistency_figure(result.consistency),
    }
    tables = {"role_scores": "roles", "causal_matrix": "causal", "consistency": "consistency"}
    return [
        save_figure(
            figures[stem](), Path(out_dir) / f"{prefix}{stem}.png", getattr(result, tables[stem])
        )
        for stem in specialization_figure_stems(result)
    ]
