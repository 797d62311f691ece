"""Summarise a sweep: the seed table (mean, std, n per head count), Welch and bootstrap
comparisons between head counts, and plain-language notes generated from the numbers.

Example:
    >>> print(summarize(read_results("runs/reverse")))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mhainterp.render import markdown_table
from mhainterp.sweep.run import resolve_run_dir

__all__ = ["SIGNIFICANCE", "TOO_EASY_ACCURACY", "SweepSummary", "load_curves", "summarize"]

TOO_EASY_ACCURACY = 0.99
"""Every head count at or above this accuracy: the task cannot separate head counts."""
SIGNIFICANCE = 0.05
"""Welch's test level below which a difference beyond the seed spread is not "tentative"."""


@dataclass
class SweepSummary:
    """What :func:`summarize` returns.

    Attributes:
        table: One row per (task, n_heads): ``task, n_heads, d_head, n_params, n_attn_params,
            final_train_loss_mean, val_accuracy_mean, val_accuracy_std, n`` (+ per-target means).
        comparisons: One row per (task, pair of head counts a < b): ``task, n_heads_a,
            n_heads_b, diff`` (= mean_b - mean_a of val accuracy), ``welch_t, welch_p,
            ci_low, ci_high`` (95% bootstrap of the diff), ``exceeds_seed_spread`` (the seed's
            rule: |diff| > std_a + std_b) and ``verdict`` ("h=b better", "h=a better",
            "no difference (within seed spread)", or "undetermined (n < 2)"); a difference
            that passes the seed's rule but not Welch's test at 0.05 is marked "tentative".
        notes: Plain-language findings and caveats generated from the numbers.
    """

    table: pd.DataFrame
    comparisons: pd.DataFrame
    notes: list[str]

    def to_markdown(self) -> str:
        parts = []
        for task, group in self.table.groupby("task", sort=False):
            parts.append(f"### {task}\n")
            parts.append(markdown_table(_display_table(group)))
            cmp = self.comparisons[self.comparisons["task"] == task]
            if len(cmp):
                parts.append("")
                parts.append(markdown_table(_display_comparisons(cmp)))
            parts.append("")
        parts.extend(f"- {note}" for note in self.notes)
        return "\n".join(parts) + "\n"

    def __str__(self) -> str:
        return self.to_markdown()


def summarize(results: pd.DataFrame) -> SweepSummary:
    """The seed's record table with honest comparisons between head counts.

    Args:
        results: The per-run table of :func:`run_sweep` (may hold several tasks).

    Example:
        >>> print(summarize(pd.read_csv("runs/rev/results.csv")))  # doctest: +SKIP
    """
    from mhainterp.stats import bootstrap_diff_ci, describe, exceeds_seed_spread, welch_test

    required = {"task", "n_heads", "seed", "val_accuracy", "final_train_loss"}
    missing = required - set(results.columns)
    if missing:
        raise ValueError(f"results is missing columns {sorted(missing)}; pass run_sweep's table")
    target_cols = [c for c in results.columns if c.startswith("val_accuracy/")]
    rows, comparisons, notes = [], [], []
    for task, task_df in results.groupby("task", sort=False):
        by_h = {h: g for h, g in task_df.groupby("n_heads")}
        for h, g in by_h.items():
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
            rows.append(row)
        heads = sorted(by_h)
        for i, h_a in enumerate(heads):
            for h_b in heads[i + 1 :]:
                a, b = by_h[h_a]["val_accuracy"], by_h[h_b]["val_accuracy"]
                da, db = describe(a), describe(b)
                t, p = welch_test(b, a)
                low, high = bootstrap_diff_ci(b, a)
                rule = exceeds_seed_spread(da["mean"], da["std"], db["mean"], db["std"])
                diff = db["mean"] - da["mean"]
                if rule is None:
                    verdict = "undetermined (n < 2)"
                elif not rule:
                    verdict = "no difference (within seed spread)"
                else:
                    verdict = f"h={h_b} better" if diff > 0 else f"h={h_a} better"
                    if not p < SIGNIFICANCE:  # the seed's rule alone, not confirmed by Welch
                        verdict += f" (tentative: Welch p >= {SIGNIFICANCE})"
                comparisons.append(
                    {
                        "task": task,
                        "n_heads_a": h_a,
                        "n_heads_b": h_b,
                        "diff": diff,
                        "welch_t": t,
                        "welch_p": p,
                        "ci_low": low,
                        "ci_high": high,
                        "exceeds_seed_spread": rule,
                        "verdict": verdict,
                    }
                )
        notes.extend(_task_notes(task, rows, comparisons))
    return SweepSummary(
        pd.DataFrame(rows), pd.DataFrame(comparisons, columns=COMPARISON_COLUMNS), notes
    )


COMPARISON_COLUMNS = [
    "task",
    "n_heads_a",
    "n_heads_b",
    "diff",
    "welch_t",
    "welch_p",
    "ci_low",
    "ci_high",
    "exceeds_seed_spread",
    "verdict",
]


def _task_notes(task: str, rows: list[dict], comparisons: list[dict]) -> list[str]:
    task_rows = [r for r in rows if r["task"] == task]
    task_cmp = [c for c in comparisons if c["task"] == task]
    notes = []
    n_params = {r["n_params"] for r in task_rows}
    if len(n_params) == 1:
        notes.append(
            f"{task}: every head count has the same parameter count ({n_params.pop():,}); "
            "only the split of d_model into heads differs."
        )
    if all(r["val_accuracy_mean"] >= TOO_EASY_ACCURACY for r in task_rows):
        notes.append(
            f"{task}: every head count reaches >= {TOO_EASY_ACCURACY:.0%} validation accuracy, so "
            "the task is too easy to separate head counts. Make it harder and rerun: longer "
            "sequences (--task-param seq_len=32), a larger vocabulary (d_vocab=20), variable "
            "length (min_len=4), fewer steps, or a smaller d_model."
        )
    real = [c for c in task_cmp if c["exceeds_seed_spread"]]
    undetermined = [c for c in task_cmp if c["exceeds_seed_spread"] is None]
    if len(task_rows) == 1:
        row = task_rows[0]
        notes.append(
            f"{task}: one head count (h={row['n_heads']}), so nothing is compared; over "
            f"{row['n']} seed(s) its validation accuracy is {row['val_accuracy_mean']:.4f} "
            f"(std {row['val_accuracy_std']:.4f}), the seed spread a difference between head "
            "counts would have to exceed."
        )
    elif undetermined:
        notes.append(f"{task}: fewer than 2 seeds per head count; no comparison is possible.")
    elif not real:
        notes.append(
            f"{task}: no difference between head counts exceeds the seed spread "
            "(|diff| > std_a + std_b); report no difference."
        )
    for c in real:
        confirmed = c["welch_p"] < SIGNIFICANCE
        notes.append(
            f"{task}: h={c['n_heads_b']} vs h={c['n_heads_a']}: accuracy difference "
            f"{c['diff']:+.3f} exceeds the seed spread (Welch p = {c['welch_p']:.3g}; "
            f"95% bootstrap CI [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}], n = seeds per group)"
            + ("." if confirmed else "; Welch's test does not confirm it, so call it tentative.")
        )
    return notes


def _display_table(group: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(
        {
            "n_heads": group["n_heads"],
            "d_head": group["d_head"],
            "params": group["n_params"].map(lambda v: f"{v:,}"),
            "attn params": group["n_attn_params"].map(lambda v: f"{v:,}"),
            "final train loss": group["final_train_loss_mean"].map(lambda v: f"{v:.4f}"),
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


def _display_comparisons(cmp: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "comparison": [f"h={b} - h={a}" for a, b in zip(cmp["n_heads_a"], cmp["n_heads_b"])],
            "diff": cmp["diff"].map(lambda v: f"{v:+.4f}"),
            "Welch p": cmp["welch_p"].map(lambda v: f"{v:.3g}"),
            "95% CI": [f"[{lo:+.4f}, {hi:+.4f}]" for lo, hi in zip(cmp["ci_low"], cmp["ci_high"])],
            "> seed spread?": cmp["exceeds_seed_spread"].map(
                lambda v: "n/a" if v is None else ("yes" if v else "no")
            ),
            "verdict": cmp["verdict"],
        }
    )


def load_curves(
    results: pd.DataFrame, sweep_dir: str | os.PathLike[str] | None = None
) -> pd.DataFrame:
    """Stack every run's ``metrics.csv`` into one tidy table.

    Args:
        results: A per-run table (:func:`run_sweep`, :func:`read_results`).
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
