"""Summarise a sweep: the seed table (mean, std, n per head count), the accuracy of adjacent
head counts compared (:func:`mhainterp.sweep.compare.compare_head_counts`: the exact
permutation test below 10 seeds per head count, Welch from there, each difference with its 95%
interval, Holm-corrected over each task's comparisons), and plain-language notes generated
from the numbers, including what the number of seeds can and cannot show.

:func:`summarize` computes; :meth:`SweepSummary.save` writes ``summary_table.csv``,
``summary_comparisons.csv`` and ``summary_notes.json`` into the sweep folder, and
:meth:`SweepSummary.load` reads them back (the report only reads).

Example:
    >>> print(summarize(read_results("runs/reverse")))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mhainterp.io import FileSet, read_json
from mhainterp.render import markdown_table
from mhainterp.runs import resolve_run_dir
from mhainterp.stats import describe
from mhainterp.sweep.compare import (
    compare_head_counts,
    comparison_display,
    comparison_sentence,
    seed_power_note,
)
from mhainterp.validation import check_float, invalid

__all__ = [
    "ACCURACY_BLOCK_MARK",
    "SIGNIFICANCE",
    "SUMMARY_FILES",
    "TOO_EASY_ACCURACY",
    "SweepSummary",
    "load_curves",
    "summarize",
]

TOO_EASY_ACCURACY = 0.99
"""Every head count at or above this accuracy: the task cannot separate head counts."""
SIGNIFICANCE = 0.05
"""Default family-wise level of a task's comparisons (``alpha`` of :func:`summarize`)."""
ACCURACY_BLOCK_MARK = "accuracy of adjacent head counts"
"""In the note that compares a task's head counts on accuracy: how the report finds it."""
SUMMARY_FILES = ("summary_table.csv", "summary_comparisons.csv", "summary_notes.json")
"""What :meth:`SweepSummary.save` writes into the sweep folder (the notes last)."""


@dataclass
class SweepSummary:
    """What :func:`summarize` returns.

    Attributes:
        table: One row per (task, n_heads): ``task, n_heads, d_head, n_params, n_attn_params,
            final_train_loss_mean, val_accuracy_mean, val_accuracy_std, n`` (+ per-target means).
        comparisons: One row per (task, adjacent head counts a < b) on the validation
            accuracy, columns :data:`mhainterp.sweep.compare.HEAD_COUNT_COLUMNS`: ``diff``
            (= mean_b - mean_a) with its 95% interval, the test suited to n with its floor,
            ``p_holm`` (Holm over the task's ``n_holm`` pairs), ``beyond`` (``p_holm <
            alpha``; None when a group has fewer than 2 seeds), ``separated`` and
            ``verdict``.
        notes: Plain-language findings and caveats generated from the numbers.
        alpha: The family-wise level used.
    """

    table: pd.DataFrame
    comparisons: pd.DataFrame
    notes: list[str]
    alpha: float = SIGNIFICANCE

    def save(self, sweep_dir: str | os.PathLike[str]) -> list[Path]:
        """Write :data:`SUMMARY_FILES` into ``sweep_dir`` (atomically; the notes last, so their
        presence means the set is complete)."""
        sweep_dir = Path(sweep_dir)
        files = FileSet(sweep_dir / SUMMARY_FILES[-1])  # a killed save reads as not saved
        return [
            files.write_csv(sweep_dir / "summary_table.csv", self.table),
            files.write_csv(sweep_dir / "summary_comparisons.csv", self.comparisons),
            files.finish({"notes": self.notes, "alpha": self.alpha}),
        ]

    @classmethod
    def load(cls, sweep_dir: str | os.PathLike[str]) -> SweepSummary:
        """Read back what :meth:`save` wrote (no computation).

        Raises:
            FileNotFoundError: If a file is missing, naming it and the command that writes it.
        """
        sweep_dir = Path(sweep_dir)
        for name in SUMMARY_FILES:
            if not (sweep_dir / name).is_file():
                raise FileNotFoundError(
                    f"{sweep_dir / name} is missing: the sweep summary has not been saved; run "
                    f"`mhainterp specialize {sweep_dir}`"
                )
        meta = read_json(sweep_dir / "summary_notes.json")
        comparisons = pd.read_csv(sweep_dir / "summary_comparisons.csv")
        comparisons["beyond"] = comparisons["beyond"].map(
            lambda v: None if pd.isna(v) else str(v) == "True"
        )
        table = pd.read_csv(sweep_dir / "summary_table.csv")
        return cls(table, comparisons, list(meta["notes"]), float(meta["alpha"]))

    def to_markdown(self) -> str:
        parts = []
        for task, group in self.table.groupby("task", sort=False):
            parts.append(f"## {task}\n")
            parts.append(markdown_table(_display_table(group)))
            cmp = self.comparisons[self.comparisons["task"] == task]
            if len(cmp):
                parts.append("")
                parts.append(markdown_table(comparison_display(cmp)))
            parts.append("")
        parts.extend(f"- {note}" for note in self.notes)
        return "\n".join(parts) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()


def summarize(results: pd.DataFrame, *, alpha: float = SIGNIFICANCE) -> SweepSummary:
    """The seed's record table with honest comparisons between head counts.

    Args:
        results: The per-run table of :func:`run_sweep` (may hold several tasks).
        alpha: Family-wise level of each task's comparisons (Holm over the task's pairs).

    Example:
        >>> print(summarize(pd.read_csv("runs/rev/results.csv")))  # doctest: +SKIP
    """
    check_float("alpha", alpha, minimum=0.0, maximum=1.0, inclusive=False)
    required = {"task", "n_heads", "seed", "val_accuracy", "final_train_loss"}
    missing = required - set(results.columns)
    if missing:
        raise invalid("results", f"a table missing columns {sorted(missing)}", "run_sweep's table")
    target_cols = [c for c in results.columns if c.startswith("val_accuracy/")]
    rows, notes = [], []
    accuracy = results.assign(accuracy=results["val_accuracy"])
    comparisons = compare_head_counts(accuracy, [("accuracy", "accuracy")], alpha=alpha)
    for task, task_df in results.groupby("task", sort=False):
        for h, g in task_df.groupby("n_heads"):
            rows.append(_table_row(task, h, g, target_cols))
        notes.extend(_task_notes(task, rows, comparisons[comparisons["task"] == task], alpha))
    table = pd.DataFrame(rows)
    if len(table):
        n = int(table["n"].min())
        block = comparisons.groupby("task")["n_holm"].max() if len(comparisons) else [1]
        notes.append(seed_power_note(n, alpha, max(1, int(max(block)))))
    return SweepSummary(table, comparisons, notes, alpha)


def _table_row(task: str, h: int, g: pd.DataFrame, target_cols: list[str]) -> dict:
    acc = describe(g["val_accuracy"])
    row = {
        "task": task,
        "n_heads": h,
        "d_head": int(g["d_head"].iloc[0]) if "d_head" in g else None,
        "n_params": int(g["n_params"].iloc[0]) if "n_params" in g else None,
        "n_attn_params": int(g["n_attn_params"].iloc[0]) if "n_attn_params" in g else None,
        "final_train_loss_mean": float(g["final_train_loss"].mean()),
        "val_accuracy_mean": acc["mean"],
        "val_accuracy_std": acc["std"],
        "n": acc["n"],
    }
    for col in target_cols:
        row[f"{col}_mean"] = float(g[col].mean())
    return row


def _task_notes(task: str, rows: list[dict], task_cmp: pd.DataFrame, alpha: float) -> list[str]:
    task_rows = [r for r in rows if r["task"] == task]
    notes = []
    n_params = {r["n_params"] for r in task_rows}
    if len(n_params) == 1:
        notes.append(
            f"{task}: every head count has the same parameter count ({n_params.pop():,}); "
            "only the split of d_model into heads differs."
        )
    # No "make it harder" hint: on reverse, fewer steps or a smaller d_model gave chance for
    # every h (40 steps, d_model 16) or a seed spread wider than the gap (100 steps), never a
    # setting that separates head counts (issue 19 item 16).
    if all(r["val_accuracy_mean"] >= TOO_EASY_ACCURACY for r in task_rows):
        notes.append(
            f"{task}: every head count reaches >= {TOO_EASY_ACCURACY:.0%} validation accuracy, so "
            "accuracy cannot separate head counts on it: compare what the heads do instead "
            "(mhainterp specialize)."
        )
    if len(task_rows) == 1:
        row = task_rows[0]
        if row["n"] < 2:  # one seed: no spread to state
            notes.append(
                f"{task}: one head count (h={row['n_heads']}) and one seed, so nothing is "
                f"compared; its validation accuracy is {row['val_accuracy_mean']:.4f}, with no "
                "seed spread known (rerun with 3 or more seeds)."
            )
            return notes
        notes.append(
            f"{task}: one head count (h={row['n_heads']}), so nothing is compared; over "
            f"{row['n']} seeds its validation accuracy is {row['val_accuracy_mean']:.4f} "
            f"(std {row['val_accuracy_std']:.4f}), the seed spread a difference between head "
            "counts would have to exceed."
        )
        return notes
    if task_cmp["beyond"].isna().any():
        notes.append(f"{task}: fewer than 2 seeds per head count; no comparison is possible.")
        return notes
    sentences = [comparison_sentence(row) for _, row in task_cmp.iterrows()]
    m = int(task_cmp["n_holm"].max())
    text = (
        f"{task}, {ACCURACY_BLOCK_MARK} ({m} comparison{'s' if m != 1 else ''}, "
        f"Holm-corrected together at {alpha:g}): " + "; ".join(sentences) + "."
    )
    if not task_cmp["beyond"].astype(bool).any():
        text += (
            " Overall, no accuracy difference between head counts is beyond the seed spread: "
            "no difference is shown, which is not the same as showing none."
        )
    return [*notes, text]


# ``final_train_loss`` is the training loss of the last logging window (its mean over the last
# ``log_every`` steps), not of the last step: after a short run it sits well above the eval loss.
TRAIN_LOSS_HEADER = "train loss (last log window)"


def _display_table(group: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(
        {
            "n_heads": group["n_heads"],
            "d_head": group["d_head"],
            "params": group["n_params"].map(lambda v: f"{v:,}"),
            "attn params": group["n_attn_params"].map(lambda v: f"{v:,}"),
            TRAIN_LOSS_HEADER: group["final_train_loss_mean"].map(lambda v: f"{v:.4f}"),
            "val acc (seed mean)": group["val_accuracy_mean"].map(lambda v: f"{v:.4f}"),
            "std": group["val_accuracy_std"].map(lambda v: f"{v:.4f}"),
            "n": group["n"],
        }
    )
    for col in group.columns:
        if col.startswith("val_accuracy/") and col.endswith("_mean"):
            name = col.removeprefix("val_accuracy/").removesuffix("_mean")
            out[f"acc {name}"] = group[col].map(lambda v: f"{v:.4f}")
    return out


def load_curves(
    results: pd.DataFrame, sweep_dir: str | os.PathLike[str] | None = None
) -> pd.DataFrame:
    """Stack every run's ``metrics.csv`` into one tidy table.

    Args:
        results: A per-run table (:func:`run_sweep`, :func:`~mhainterp.runs.read_results`).
        sweep_dir: The folder of the ``results.csv`` the table was read from, when its
            ``run_dir`` entries are as stored there (relative to it).

    Returns:
        Columns ``task, n_heads, seed, step, loss, lr, grad_norm`` (+ eval columns if logged).
    """
    frames = []
    for row in results.itertuples(index=False):
        run_dir = resolve_run_dir(row.run_dir, sweep_dir) if sweep_dir else Path(row.run_dir)
        curve = pd.read_csv(run_dir / "metrics.csv")
        curve.insert(0, "seed", row.seed)
        curve.insert(0, "n_heads", row.n_heads)
        curve.insert(0, "task", row.task)
        frames.append(curve)
    return pd.concat(frames, ignore_index=True)
