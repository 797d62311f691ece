"""Does h matter? The head-count experiment at population scale, on every built-in task.

Same d_model, data, steps, learning rate and initialisation seed for every head count; only
the number of heads changes, so the parameter count is identical (seed 000's protocol). For
each task: one sweep folder (results.csv, seed table, accuracy comparisons, figures), the
division of labour of the first ``--verdict-seeds`` seeds of every h > 1, and then, over all
tasks, the answer::

    python analysis/head_count_study.py --out runs/head_count_study            # grid by device
    python analysis/head_count_study.py --grid full --device cuda              # the full grid
    python analysis/head_count_study.py --quick                                # a smoke run

Grids: ``full`` is all 7 built-in tasks x h in {1, 2, 4, 8, 16, 32, 64} (d_model 64, so
d_head 64 .. 1) x 30 seeds, 1,500 steps (the target: minutes on one H100/H200-class GPU);
``cpu`` is 2 tasks x h in {1, 2, 4, 8} x 6 seeds (about 20 minutes on 2 cores). ``auto``
(default) picks ``full`` on a GPU and ``cpu`` otherwise, and says so.

Outputs in ``OUT/``: ``does_h_matter.png``/``.pdf`` drawn from ``does_h_matter.csv`` (per task
and h: seeds, accuracy mean, std and 95% interval; per division axis the index's mean, std,
interval, seeds where it is defined and seeds called divided), ``study_comparisons.csv``
(adjacent head counts on accuracy and on every division index: difference, interval, test,
Holm over each task's block; see
:func:`mhainterp.stats.compare_head_counts`), ``division_runs.csv`` (one row per run and axis;
the study resumes from it) and ``study.md``. Every step is
resumable: run the same command again after an interruption.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from mhainterp.analyze import run_sweep_with_figures
from mhainterp.cli.options import int_list
from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.figures import save_figure
from mhainterp.io import write_csv, write_text
from mhainterp.runs import read_results
from mhainterp.runtime import command_settings, resolve_device
from mhainterp.specialization import division_of_labour
from mhainterp.specialization.verdict.sentences import UNDEFINED_INDEX
from mhainterp.stats import (
    CONFIDENCE,
    compare_head_counts,
    comparison_sentence,
    describe,
    difference_text,
    seeds_to_settle,
)
from mhainterp.sweep import fastest_executor
from mhainterp.tasks import AXES, list_tasks
from mhainterp.training import load_run


@dataclass(frozen=True)
class Grid:
    """The runs of a study: tasks x head counts x seeds."""

    name: str
    tasks: tuple[str, ...]
    n_heads: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: int
    verdict_seeds: int

    @property
    def n_runs(self) -> int:
        return len(self.tasks) * len(self.n_heads) * len(self.seeds)

    def describe(self) -> str:
        seeds = f"seeds {self.seeds[0]}-{self.seeds[-1]}" if len(self.seeds) > 2 else "seeds"
        return (
            f"{self.name} grid: {len(self.tasks)} task(s) x h in "
            f"{{{', '.join(map(str, self.n_heads))}}} x {len(self.seeds)} {seeds} = "
            f"{self.n_runs} runs of {self.steps:,} steps; division of labour on the first "
            f"{self.verdict_seeds} seed(s) of each h > 1"
        )


GRIDS = {
    "full": Grid("full", tuple(list_tasks()), (1, 2, 4, 8, 16, 32, 64), tuple(range(30)), 1500, 5),
    # 6 seeds: the fewest at which a complete separation survives Holm over a task's 9
    # comparisons (exact floor 2 / C(12, 6) = 0.0022 < 0.05 / 9); 5 seeds cannot (0.0079).
    "cpu": Grid("cpu", ("count_previous", "reverse"), (1, 2, 4, 8), tuple(range(6)), 1500, 6),
    "quick": Grid("quick", ("count_previous", "reverse"), (1, 4), (0, 1, 2), 150, 3),
}
D_MODEL = 64
TASK_PARAMS = {"seq_len": 16, "d_vocab": 10}
N_EVAL_DIVISION = 256  # sequences per division of labour: the study runs hundreds of them


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/head_count_study"))
    parser.add_argument(
        "--grid",
        choices=("auto", *GRIDS),
        default="auto",
        help="auto: full on a GPU, cpu otherwise (default auto)",
    )
    parser.add_argument("--quick", action="store_true", help="the quick grid (a smoke run)")
    parser.add_argument("--tasks", help="comma-separated task names (default: the grid's)")
    parser.add_argument("--n-heads", type=int_list, help="head counts, e.g. 1,2,4,8")
    parser.add_argument("--seeds", type=int_list, help="seeds, e.g. 0-29")
    parser.add_argument("--steps", type=int, help="training steps per run")
    parser.add_argument(
        "--verdict-seeds", type=int, help="seeds per h whose division of labour is measured"
    )
    parser.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N|mps")
    parser.add_argument("--executor", default=None, help="sweep executor (default: fastest)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def choose_grid(args: argparse.Namespace, on_gpu: bool) -> Grid:
    """The grid the options ask for (``auto``: full on a GPU, cpu otherwise), overridden."""
    name = "quick" if args.quick else args.grid
    if name == "auto":
        name = "full" if on_gpu else "cpu"
    grid = GRIDS[name]
    tasks = tuple(t.strip() for t in args.tasks.split(",")) if args.tasks else grid.tasks
    return Grid(
        name if not (args.tasks or args.n_heads or args.seeds or args.steps) else f"{name}*",
        tasks,
        tuple(args.n_heads or grid.n_heads),
        tuple(args.seeds or grid.seeds),
        args.steps or grid.steps,
        args.verdict_seeds or grid.verdict_seeds,
    )


# ----- the work: sweeps, then the division of labour of the verdict seeds ------------------------
def train_sweeps(grid: Grid, out: Path, executor: str, progress: bool) -> pd.DataFrame:
    """Every task's sweep (resumable); the per-run table of all tasks."""
    frames = []
    started = time.perf_counter()
    for done, task in enumerate(grid.tasks):
        config = SweepConfig(
            task=task,
            task_params=dict(TASK_PARAMS),
            n_heads=list(grid.n_heads),
            seeds=list(grid.seeds),
            model={"d_model": D_MODEL},  # n_layers: the task's minimum (induction needs 2)
            train=TrainConfig(steps=grid.steps, warmup_steps=min(100, grid.steps // 10)),
        )
        summary = run_sweep_with_figures(config, out / task, executor, progress)
        print(summary.to_markdown())
        frames.append(read_results(out / task).assign(sweep=task))
        _eta(started, done + 1, len(grid.tasks), "sweeps")
    return pd.concat(frames, ignore_index=True)


def measure_division(grid: Grid, out: Path, results: pd.DataFrame) -> pd.DataFrame:
    """The division of labour (index and call per axis) of the first ``verdict_seeds`` seeds
    of every h > 1, one row per run and axis; resumes from ``OUT/division_runs.csv``."""
    path = out / "division_runs.csv"
    done = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=DIVISION_COLUMNS)
    seeds = set(grid.seeds[: grid.verdict_seeds])
    todo = results[(results["n_heads"] > 1) & results["seed"].isin(seeds)]
    finished = set(zip(done["task"], done["n_heads"], done["seed"], strict=True))
    rows = [done]
    started, count = time.perf_counter(), 0
    for _, row in todo.iterrows():
        key = (row["task"], int(row["n_heads"]), int(row["seed"]))
        if key in finished:
            continue
        run = load_run(row["run_dir"])  # read_results gives paths usable from here
        index = division_of_labour(run.model, run.task, n_eval=N_EVAL_DIVISION).index
        rows.append(index.assign(task=key[0], n_heads=key[1], seed=key[2])[DIVISION_COLUMNS].copy())
        count += 1
        if count % 10 == 0:  # saved as it goes: an interrupted study resumes here
            write_csv(path, pd.concat(rows, ignore_index=True))
            _eta(started, count, len(todo) - len(finished), "divisions")
    table = pd.concat(rows, ignore_index=True)
    write_csv(path, table)
    return table


DIVISION_COLUMNS = ["task", "n_heads", "seed", "by", "index", "call"]


def _eta(started: float, done: int, total: int, what: str) -> None:
    elapsed = time.perf_counter() - started
    left = elapsed / max(done, 1) * (total - done)
    print(f"{what}: {done}/{total} in {elapsed / 60:.1f} min, about {left / 60:.1f} min left")


# ----- the answer --------------------------------------------------------------------------------
def per_seed_table(results: pd.DataFrame, division: pd.DataFrame) -> pd.DataFrame:
    """One row per run: ``task, n_heads, seed, accuracy`` and ``index_<axis>`` (NaN where the
    division was not measured or is undefined) for :func:`compare_head_counts`."""
    runs = results[["task", "n_heads", "seed", "val_accuracy"]].rename(
        columns={"val_accuracy": "accuracy"}
    )
    if len(division):
        wide = division.pivot_table(
            index=["task", "n_heads", "seed"], columns="by", values="index", dropna=False
        ).add_prefix("index_")
        runs = runs.merge(wide.reset_index(), on=["task", "n_heads", "seed"], how="left")
    return runs


def mean_interval(values: Sequence[float], bounds: tuple[float, float] = (0.0, 1.0)):
    """Student's t interval of a mean at :data:`CONFIDENCE`, clipped to ``bounds`` (accuracy
    and the division index lie in [0, 1]; the t interval does not know it); NaN below 2."""
    x = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if x.size < 2:
        return math.nan, math.nan
    half = scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(max(bounds[0], x.mean() - half)), float(min(bounds[1], x.mean() + half))


def study_table(per_seed: pd.DataFrame, division: pd.DataFrame) -> pd.DataFrame:
    """Per task and h: seeds, accuracy mean/std/interval; per axis the index's mean, std,
    interval, seeds where it is defined and seeds called divided."""
    rows = []
    for (task, h), group in per_seed.groupby(["task", "n_heads"], sort=False):
        row = {"task": task, "n_heads": int(h), "n_seeds": len(group)}
        row |= _summary("accuracy", group["accuracy"])
        calls = division[(division["task"] == task) & (division["n_heads"] == h)]
        for axis in AXES:
            column = f"index_{axis}"
            values = group[column].dropna() if column in group else pd.Series(dtype=float)
            row |= _summary(f"{axis}_index", values)
            row[f"{axis}_n_divided"] = int((calls[calls["by"] == axis]["call"] == "divided").sum())
        rows.append(row)
    return pd.DataFrame(rows)


def _summary(name: str, values: pd.Series) -> dict[str, float]:
    stats = describe(values)
    low, high = mean_interval(values)
    return {
        f"{name}_mean": stats["mean"],
        f"{name}_std": stats["std"],
        f"{name}_n": stats["n"],
        f"{name}_ci_low": low,
        f"{name}_ci_high": high,
    }


MEASURES = [("accuracy", "accuracy")] + [
    (f"index_{axis}", f"division index by {axis}") for axis in AXES
]


def lead_sentence(task: str, rows: pd.DataFrame) -> str:
    """One sentence per task: does h change the accuracy, the division (along which axis, by
    how much), and what n would settle what is still open."""
    beyond = rows[rows["beyond"].astype(bool)]
    accuracy = beyond[beyond["measure"] == "accuracy"]
    division = beyond[beyond["measure"] != "accuracy"]

    def changes(found: pd.DataFrame) -> str:
        return "; ".join(
            f"{r['quantity'].removeprefix('division index ')} h={r['n_heads_a']}→{r['n_heads_b']} "
            f"{difference_text(r)}"
            for _, r in found.iterrows()
        )

    if not (rows["measure"] != "accuracy").any():
        division_part = "the division index is defined at fewer than two head counts (untested)"
    elif len(division):
        division_part = f"h changes the division of labour ({changes(division)})"
    else:
        division_part = "no change of the division index with h is shown"
    parts = [
        f"h changes the accuracy ({changes(accuracy)})"
        if len(accuracy)
        else "no accuracy difference between adjacent head counts is shown",
        division_part,
    ]
    open_rows = rows[~rows["beyond"].astype(bool) & rows["p"].notna() & (rows["diff"] != 0)]
    needed = [
        seeds_to_settle(r["diff"], r["std_a"], r["std_b"], 0.05, int(r["n_holm"]))
        for _, r in open_rows.iterrows()
    ]
    needed = [n for n in needed if math.isfinite(n)]
    if needed:
        low, high = int(min(needed)), int(max(needed))
        span = f"{low}" if low == high else f"{low} to {high}"
        parts.append(
            f"settling the open comparisons at their observed size needs {span} seeds per head "
            "count"
        )
    return f"**{task}**: " + "; ".join(parts) + "."


def answer(grid: Grid, comparisons: pd.DataFrame, minutes: float) -> str:
    """``study.md``: the grid, one lead sentence per task, then every comparison in words."""
    lines = [
        "# Does h matter?",
        "",
        f"{grid.describe()}; {minutes:.1f} min in this invocation (runs an earlier one "
        "finished are kept, not retrained).",
        "",
    ]
    for task, rows in comparisons.groupby("task", sort=False):
        lines += [lead_sentence(str(task), rows), ""]
    for task, rows in comparisons.groupby("task", sort=False):
        lines += [f"## {task}", "", f"Holm over the task's {len(rows)} comparisons.", ""]
        lines += [f"- {comparison_sentence(row)}" for _, row in rows.iterrows()]
        lines.append("")
    return "\n".join(lines)


def plot_study(table: pd.DataFrame):
    """One row per task: accuracy against h with 95% intervals (left), the division index
    against h per axis with 95% intervals (right); h on a log2 axis, equal parameter count."""
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(table["task"]))
    fig, grid = plt.subplots(
        len(tasks), 2, figsize=(9, 2.4 * len(tasks) + 0.6), squeeze=False, sharex=True
    )
    heads = sorted(table["n_heads"].unique())
    for row, task in zip(grid, tasks, strict=True):
        group = table[table["task"] == task]
        _with_interval(row[0], group, "accuracy", "accuracy")
        row[0].set_ylabel(f"{task}\nval accuracy")
        drawn = [axis for axis in AXES if group[f"{axis}_index_mean"].notna().any()]
        for axis in drawn:
            _with_interval(row[1], group, f"{axis}_index", axis)
        row[1].set_ylabel("division index")
        if drawn:
            row[1].legend(fontsize=7, loc="upper left")
        else:  # say why the panel is empty rather than leave a blank box
            row[1].text(
                0.5,
                0.5,
                UNDEFINED_INDEX,
                ha="center",
                va="center",
                wrap=True,
                fontsize=8,
                transform=row[1].transAxes,
            )
    grid[0][0].set_title("accuracy (seed mean, 95% CI)")
    grid[0][1].set_title("division of labour by axis (seed mean, 95% CI)")
    for ax in grid[-1]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(heads, labels=[str(h) for h in heads])
        ax.set_xlabel("heads h (equal parameter count)")
    fig.tight_layout()
    return fig


def _with_interval(ax, group: pd.DataFrame, name: str, label: str) -> None:
    """The seed mean of ``name`` against h, with its interval as error bars."""
    shown = group[group[f"{name}_mean"].notna()]
    mean = shown[f"{name}_mean"]
    errors = np.nan_to_num([mean - shown[f"{name}_ci_low"], shown[f"{name}_ci_high"] - mean])
    ax.errorbar(
        shown["n_heads"], mean, yerr=errors, marker="o", markersize=4, capsize=3, label=label
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with command_settings(device=args.device):
        device = resolve_device("auto")
        grid = choose_grid(args, on_gpu=device.type == "cuda")
        note = (
            ""
            if grid.name.startswith(("full", "quick"))
            else (" (the smaller CPU grid; --grid full runs every task and h up to 64)")
        )
        print(f"{grid.describe()} on {device}{note}")
        started = time.perf_counter()
        out = args.out
        executor = args.executor or fastest_executor()
        results = train_sweeps(grid, out, executor, progress=not args.quiet)
        division = measure_division(grid, out, results)
    per_seed = per_seed_table(results, division)
    table = study_table(per_seed, division)
    comparisons = compare_head_counts(per_seed, MEASURES)
    write_csv(out / "study_comparisons.csv", comparisons)
    save_figure(plot_study(table), out / "does_h_matter.png", table)
    minutes = (time.perf_counter() - started) / 60
    write_text(out / "study.md", answer(grid, comparisons, minutes))
    print(f"study: {out / 'study.md'}, {out / 'does_h_matter.png'} ({minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
