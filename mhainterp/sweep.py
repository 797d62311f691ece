"""The head-count experiment (seed 000): same everything, only ``n_heads`` varies, over seeds.

Folder layout of a sweep (``out_dir``)::

    sweep.json               the SweepConfig (a rerun must match it)
    runs/h{h}_seed{s}/       one run folder per (head count, seed), see mhainterp.training
    runs/.h{h}_seed{s}.lock  the run's lock file (see mhainterp.io.RunLock)
    results.csv              one row per run (see run_sweep); run_dir relative to this folder
    sweep.log                one line per event: which process trained or waited for which runs

A sweep is resumable: finished runs are kept, missing or unfinished ones are (re)done, and the
table is always rebuilt from the run folders, so a killed-and-rerun sweep ends with exactly
the table of an uninterrupted one. Two sweeps on one folder share the work: each run is locked
by the process that trains it; the other skips it, and waits for it at the end.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from tqdm.auto import tqdm

from mhainterp.config import ModelConfig, SweepConfig, TrainConfig
from mhainterp.io import RunLock, ensure_writable_dir, read_json, write_csv, write_json
from mhainterp.render import markdown_table
from mhainterp.tasks import Task, get_task
from mhainterp.training import build_model, is_finished_run, train
from mhainterp.validation import check_option

__all__ = [
    "RunSpec",
    "SweepSummary",
    "run_sweep",
    "summarize",
    "plan_sweep",
    "collect_results",
    "read_results",
    "resolve_run_dir",
    "execute_run",
    "EXECUTORS",
    "fastest_executor",
    "load_curves",
]


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: everything needed to train it in any process."""

    task_name: str
    task_params: dict[str, Any]
    model_config: ModelConfig
    train_config: TrainConfig
    run_dir: Path

    @property
    def n_heads(self) -> int:
        return self.model_config.n_heads

    @property
    def seed(self) -> int:
        return self.model_config.seed

    def build_task(self) -> Task:
        return get_task(self.task_name, **self.task_params)


def plan_sweep(config: SweepConfig, out_dir: str | os.PathLike[str]) -> list[RunSpec]:
    """The runs of a sweep, head count major, then seed."""
    out_dir = Path(out_dir)
    task = get_task(config.task, **config.task_params)
    specs = []
    for n_heads in config.n_heads:
        for seed in config.seeds:
            model_kwargs = {**task.model_kwargs(), "device": "cpu", **config.model}
            model_config = ModelConfig(**{**model_kwargs, "n_heads": n_heads, "seed": seed})
            train_config = TrainConfig.from_dict({**config.train.to_dict(), "seed": seed})
            specs.append(
                RunSpec(
                    task_name=task.name,
                    task_params=dict(task.params),
                    model_config=model_config,
                    train_config=train_config,
                    run_dir=out_dir / "runs" / f"h{n_heads}_seed{seed}",
                )
            )
    return specs


def execute_run(spec: RunSpec, *, progress: bool = False) -> Path:
    """Train one planned run and write its folder (used by every executor)."""
    task = spec.build_task()
    model = build_model(task, **spec.model_config.to_dict())
    train(model, task, spec.train_config, run_dir=spec.run_dir, progress=progress)
    return spec.run_dir


def _run_local(specs: Sequence[RunSpec], progress: bool) -> None:
    """The default executor: one run after another in this process."""
    for spec in tqdm(specs, desc="sweep", disable=not progress):
        execute_run(spec, progress=progress)


def _run_batched(specs: Sequence[RunSpec], progress: bool) -> None:
    """Several runs per step, one pinned worker per CPU (:mod:`mhainterp.executors`)."""
    from mhainterp.executors import run_batched  # imported on use: it starts worker processes

    run_batched(specs, progress)


def _run_ray(specs: Sequence[RunSpec], progress: bool) -> None:
    """Runs spread over a Ray cluster (the ``[ray]`` extra; :mod:`mhainterp.executors`)."""
    from mhainterp.executors import run_ray

    run_ray(specs, progress)


# name -> callable(specs, progress). Nothing registers itself on import: the table is complete.
EXECUTORS: dict[str, Callable[[Sequence[RunSpec], bool], None]] = {
    "local": _run_local,
    "batched": _run_batched,
    "ray": _run_ray,
}
Executor = Literal["auto", "local", "batched", "ray"]


def fastest_executor() -> str:
    """The executor ``"auto"`` means on this machine: ``"batched"`` (measured 1.9x the local
    loop on 2 cores, README "Performance"), or ``"local"`` where only one CPU is usable."""
    from mhainterp.executors import available_cpus

    return "batched" if len(available_cpus()) > 1 else "local"


def _check_same_sweep(out_dir: Path, config: SweepConfig) -> None:
    """Refuse to mix runs of two different sweeps in one folder."""
    saved_path = out_dir / "sweep.json"
    if not saved_path.is_file():
        return
    saved = read_json(saved_path)
    if saved != _jsonable(config.to_dict()):
        raise ValueError(
            f"{out_dir} holds a different sweep (see {saved_path}); rerun with the same "
            "settings to resume it, or choose a new output folder"
        )


def _jsonable(obj: Any) -> Any:
    import json

    return json.loads(json.dumps(obj, default=list))


def run_sweep(
    config: SweepConfig | str,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    executor: Executor = "auto",
    progress: bool = True,
    **config_fields: Any,
) -> pd.DataFrame:
    """Run (or resume) the head-count experiment and return its per-run table.

    Args:
        config: A :class:`SweepConfig`, or a task name with the other fields as keywords.
        out_dir: The sweep folder (created; resumed if it exists). Default: ``runs/<task>``.
        executor: How runs are executed: ``"auto"`` (the fastest here, see
            :func:`fastest_executor`), or one of :data:`EXECUTORS`. The table does not depend on
            it (tested).
        progress: Show progress bars.
        **config_fields: ``SweepConfig`` fields when ``config`` is a task name.

    Returns:
        One row per run, ordered by n_heads then seed, with columns ``task, n_heads, seed,
        d_model, d_head, n_params, n_attn_params, steps, final_train_loss, val_loss,
        val_accuracy`` (plus ``val_accuracy/<target>`` on multi-target tasks) and ``run_dir``
        (usable from here: ``out_dir/runs/...``). ``results.csv`` holds the same table with
        ``run_dir`` relative to ``out_dir``; read it back with :func:`read_results`.

    Example:
        >>> df = run_sweep("reverse", n_heads=[1, 4, 8], seeds=[0, 1, 2])  # doctest: +SKIP
        >>> summarize(df).table  # doctest: +SKIP
    """
    if isinstance(config, str):
        config = SweepConfig(task=config, **config_fields)
    elif config_fields:
        raise TypeError("pass either a SweepConfig or a task name with keywords, not both")
    check_option("executor", executor, ("auto", *EXECUTORS))
    if executor == "auto":
        executor = fastest_executor()
    out_dir = Path(out_dir) if out_dir is not None else Path("runs") / config.task
    _check_same_sweep(out_dir, config)
    ensure_writable_dir(out_dir, "sweep folder")
    write_json(out_dir / "sweep.json", config.to_dict())
    specs = plan_sweep(config, out_dir)
    _train_missing(specs, executor, progress, _SweepLog(out_dir / "sweep.log"))
    results = collect_results(specs)
    stored = results.assign(
        run_dir=[Path(os.path.relpath(spec.run_dir, out_dir)).as_posix() for spec in specs]
    )
    write_csv(out_dir / "results.csv", stored)
    return results


LOCK_POLL_SECONDS = 0.2
CLAIM_AT_ONCE: dict[str, int] = {"local": 1}
"""Runs an executor locks per round. The local executor trains one run at a time, so it locks
one at a time and two local sweeps on one folder share the runs; executors that batch or
spread runs (batched, ray) lock every free run at once."""


def _train_missing(specs: Sequence[RunSpec], executor: str, progress: bool, log: _SweepLog) -> None:
    """Train every unfinished run that no other process holds; then wait for the held ones
    (and train those whose holder died before finishing them)."""
    tried: set[Path] = set()
    announced: set[Path] = set()
    while True:
        todo = [spec for spec in specs if not is_finished_run(spec.run_dir)]
        if not todo or all(spec.run_dir in tried for spec in todo):
            return  # done, or the executor left runs unfinished (collect_results says which)
        limit = CLAIM_AT_ONCE.get(executor)
        mine, held = _claim([spec for spec in todo if spec.run_dir not in tried], limit)
        try:
            if mine:
                log.write("train", [spec for spec, _ in mine])
                EXECUTORS[executor]([spec for spec, _ in mine], progress)
                tried.update(spec.run_dir for spec, _ in mine)
                log.write("done", [spec for spec, _ in mine])
        finally:
            for _, lock in mine:
                lock.release()
        if held and not mine:
            new = [spec for spec in held if spec.run_dir not in announced]
            if new:
                log.write("wait", new, f"held by {RunLock(new[0].run_dir).holder()}")
                if progress:
                    names = ", ".join(spec.run_dir.name for spec in new)
                    print(f"waiting for runs another process is training: {names}",
                          file=sys.stderr)  # fmt: skip
                announced.update(spec.run_dir for spec in new)
            _wait_for_any(held)


def _claim(
    specs: Sequence[RunSpec], limit: int | None = None
) -> tuple[list[tuple[RunSpec, RunLock]], list[RunSpec]]:
    """Lock up to ``limit`` runs that no other process holds; a run finished meanwhile is let
    go. Returns the locked runs and the runs other processes hold."""
    mine: list[tuple[RunSpec, RunLock]] = []
    held: list[RunSpec] = []
    for spec in specs:
        if limit is not None and len(mine) >= limit:
            break
        lock = RunLock(spec.run_dir)
        if not lock.acquire():
            held.append(spec)
        elif is_finished_run(spec.run_dir):  # another process finished it before we locked
            lock.release()
        else:
            # Temp files of a write that a killed process never finished: ours to remove now
            # that we hold the run.
            for stale in spec.run_dir.glob(".*.tmp"):
                stale.unlink(missing_ok=True)
            mine.append((spec, lock))
    return mine, held


def _wait_for_any(specs: Sequence[RunSpec]) -> None:
    """Block until one of these runs' locks is free (its holder finished, failed or died)."""
    locks = [RunLock(spec.run_dir) for spec in specs]
    while True:
        for lock in locks:
            if lock.acquire():
                lock.release()
                return
        time.sleep(LOCK_POLL_SECONDS)


class _SweepLog:
    """Appends ``<UTC time> pid=<pid> <event> <runs>`` lines to ``sweep.log``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, event: str, specs: Sequence[RunSpec], note: str = "") -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        names = ",".join(spec.run_dir.name for spec in specs)
        line = f"{stamp} pid={os.getpid()} {event} {names}{' ' + note if note else ''}\n"
        with open(self.path, "a", encoding="utf-8") as handle:  # one append = one whole line
            handle.write(line)


def resolve_run_dir(recorded: str | os.PathLike[str], table_dir: str | os.PathLike[str]) -> Path:
    """The run folder a ``run_dir`` entry of ``table_dir/results.csv`` means, from here.

    New tables store it relative to the table's folder (``runs/h4_seed0``); older ones stored
    it absolute or relative to where the sweep was started. A folder that has moved is found
    under ``table_dir/runs/`` by name.

    Example:
        >>> resolve_run_dir("runs/h4_seed0", "elsewhere/rev")  # doctest: +SKIP
        PosixPath('elsewhere/rev/runs/h4_seed0')
    """
    recorded, table_dir = Path(recorded), Path(table_dir)
    candidates = [recorded] if recorded.is_absolute() else [table_dir / recorded]
    candidates.append(table_dir / "runs" / recorded.name)
    if not recorded.is_absolute():
        candidates.append(recorded)  # an old table, relative to the sweep's starting folder
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return candidates[0]


def read_results(sweep_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """``sweep_dir/results.csv`` with ``run_dir`` resolved (see :func:`resolve_run_dir`).

    Example:
        >>> summarize(read_results("runs/rev"))  # doctest: +SKIP
    """
    path = Path(sweep_dir) / "results.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (run mhainterp sweep first)")
    try:
        table = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a readable CSV table ({error})") from None
    if "run_dir" in table:
        table["run_dir"] = [str(resolve_run_dir(r, sweep_dir)) for r in table["run_dir"]]
    return table


def collect_results(specs: Sequence[RunSpec]) -> pd.DataFrame:
    """The per-run table, read back from the run folders (so it never depends on scheduling)."""
    rows = []
    for spec in specs:
        if not is_finished_run(spec.run_dir):
            raise FileNotFoundError(f"run {spec.run_dir} did not finish; rerun the sweep")
        saved = read_json(spec.run_dir / "eval.json")
        cfg = spec.model_config
        n_params = _count_params(spec)
        row = {
            "task": spec.task_name,
            "n_heads": cfg.n_heads,
            "seed": cfg.seed,
            "d_model": cfg.d_model,
            "d_head": cfg.d_head,
            "n_params": n_params,
            "n_attn_params": cfg.n_attn_params * cfg.n_layers,
            "steps": spec.train_config.steps,
            "final_train_loss": saved["final_train_loss"],
            "val_loss": saved["loss"],
            "val_accuracy": saved["accuracy"],
        }
        for key, value in sorted(saved.items()):
            if key.startswith("accuracy/"):
                row[f"val_{key}"] = value
        row["run_dir"] = str(spec.run_dir)
        rows.append(row)
    return pd.DataFrame(rows)


def _count_params(spec: RunSpec) -> int:
    # Parameter count follows from the config alone; building the model is cheap and exact.
    from mhainterp.model import HookedMHATransformer

    return HookedMHATransformer(spec.model_config).n_params


# ----- the seed's table ---------------------------------------------------------------------------
TOO_EASY_ACCURACY = 0.99
SIGNIFICANCE = 0.05


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
