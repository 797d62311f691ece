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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import torch
from tqdm.auto import tqdm

from mhainterp.config import SweepConfig
from mhainterp.errors import RunFolderError
from mhainterp.fast.stacked_checkpoint import GROUP_CHECKPOINT_GLOB
from mhainterp.io import (
    RunLock,
    ensure_writable_dir,
    read_json,
    remove_stale_temps,
    require_memory,
    write_csv,
    write_json,
)
from mhainterp.runs import (
    check_free_folder,
    is_finished_run,
    migrate_config,
    read_eval,
    relative_run_dir,
    run_status,
)
from mhainterp.runtime import available_cpus, resolve_device, terminate_as_interrupt
from mhainterp.sweep import fork_safety  # noqa: F401  (forked workers: a tqdm lock of their own)
from mhainterp.sweep.executors import plan_device_groups, run_batched, run_ray
from mhainterp.sweep.memory import device_memory, plan_group_sizes, trains_in_groups
from mhainterp.sweep.spec import RunSpec, execute_run, plan_sweep
from mhainterp.training import (
    load_run,
    run_config_differences,
    saved_config_matches,
    training_memory,
    training_what,
)
from mhainterp.validation import check_option

__all__ = [
    "EXECUTORS",
    "collect_results",
    "fastest_executor",
    "run_sweep",
]


def _run_local(specs: Sequence[RunSpec], progress: bool) -> None:
    """The default executor: one run after another in this process."""
    # leave=False: an interrupted sweep leaves no bar fragment above its one-line message
    for spec in tqdm(specs, desc="sweep", disable=not progress, leave=False):
        execute_run(spec, progress=progress)


def _run_batched(specs: Sequence[RunSpec], progress: bool) -> None:
    """Several runs per step: one pinned worker per CPU, or stacked groups on a GPU
    (:mod:`mhainterp.sweep.executors`)."""
    run_batched(specs, progress)


def _run_ray(specs: Sequence[RunSpec], progress: bool) -> None:
    """Runs spread over a Ray cluster (the ``[ray]`` extra; :mod:`mhainterp.sweep.executors`)."""
    run_ray(specs, progress)


# name -> callable(specs, progress). Nothing registers itself on import: the table is complete.
EXECUTORS: dict[str, Callable[[Sequence[RunSpec], bool], None]] = {
    "local": _run_local,
    "batched": _run_batched,
    "ray": _run_ray,
}
Executor = Literal["auto", "local", "batched", "ray"]


def fastest_executor(device: str | torch.device | None = None) -> str:
    """The executor ``"auto"`` means for runs on ``device`` (None: decided by
    :func:`mhainterp.runtime.resolve_device`): ``"batched"`` on a GPU (stacked groups sized by
    its memory) and on a CPU with several cores (measured 1.9x the local loop on 2 cores,
    README "Performance"), ``"local"`` where only one CPU is usable.

    Example:
        >>> fastest_executor("cpu") in ("batched", "local")
        True
    """
    if trains_in_groups(resolve_device(device)):
        return "batched"
    return "batched" if len(available_cpus()) > 1 else "local"


GROWABLE = ("seeds", "n_heads")
"""Sweep fields a rerun may change in the same folder: more seeds (or head counts) are more
runs of the same experiment, each checked against its own config; the runs already trained
are kept, and results.csv lists the runs asked for."""


def _check_same_sweep(out_dir: Path, config: SweepConfig) -> None:
    """Refuse to mix runs of two different sweeps in one folder (other seeds or head counts
    of the same sweep are welcome: :data:`GROWABLE`)."""
    saved_path = out_dir / "sweep.json"
    if not saved_path.is_file():
        return
    saved = read_json(saved_path)
    if isinstance(saved, dict):
        saved = migrate_config(saved)  # a sweep.json's train section, as a run's
    wanted = _jsonable(config.to_dict())
    if not isinstance(saved, dict):
        differ = ["sweep.json is not a sweep's settings"]
    else:
        differ = [
            k
            for k in sorted(set(saved) | set(wanted))
            if k not in GROWABLE and saved.get(k) != wanted.get(k)
        ]
    if differ:
        raise RunFolderError(
            f"{out_dir} holds a different sweep ({', '.join(differ)} differ; see {saved_path}); "
            "rerun with the same settings to resume it (other --seeds or --n-heads are fine), "
            "or choose a new output folder"
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
    device: str | torch.device | None = None,
    **config_fields: Any,
) -> pd.DataFrame:
    """Run (or resume) the head-count experiment and return its per-run table.

    Args:
        config: A :class:`SweepConfig`, or a task name with the other fields as keywords.
        out_dir: The sweep folder (created; resumed if it exists). Default: ``runs/<task>``.
            Refused when empty or holding a run's files or sweep folders
            (:func:`mhainterp.runs.check_free_folder`).
        executor: How runs are executed: ``"auto"`` (the fastest here, see
            :func:`fastest_executor`), or one of :data:`EXECUTORS`. The table does not depend on
            it (tested).
        progress: Show progress bars.
        device: Where the runs train: None or ``auto`` (the sweep's ``model["device"]`` if it
            names one, else decided by :func:`mhainterp.runtime.resolve_device`), ``cpu``,
            ``cuda``, ``cuda:N``, ``mps``. Each run's ``config.json`` records it; a sweep
            started on one device resumes on another. On a GPU the "batched" executor trains
            every run in as few stacked groups as its free memory allows, in this process.
        **config_fields: ``SweepConfig`` fields when ``config`` is a task name.

    Returns:
        One row per run, ordered by n_heads then seed, with columns ``task, n_heads, seed,
        d_model, d_head, n_params, n_attn_params, steps, final_train_loss, val_loss,
        val_accuracy`` (plus ``val_accuracy/<target>`` on multi-target tasks) and ``run_dir``
        (usable from here: ``out_dir/runs/...``). ``results.csv`` holds the same table with
        ``run_dir`` relative to ``out_dir``; read it back with :func:`mhainterp.runs.read_results`.

    Example:
        >>> df = run_sweep("reverse", n_heads=[1, 4, 8], seeds=[0, 1, 2])  # doctest: +SKIP
        >>> summarize(df).table  # doctest: +SKIP
    """
    if isinstance(config, str):
        config = SweepConfig(task=config, **config_fields)
    elif config_fields:
        raise TypeError("pass either a SweepConfig or a task name with keywords, not both")
    check_option("executor", executor, ("auto", *EXECUTORS))
    device = resolve_device(config.model.get("device") if device is None else device)
    if executor == "auto":
        executor = fastest_executor(device)
    out_dir = Path("runs") / config.task if out_dir is None else out_dir
    check_free_folder(out_dir, "sweep", "out_dir")  # "" checked before Path() reads it as "."
    out_dir = Path(out_dir)
    _check_same_sweep(out_dir, config)
    ensure_writable_dir(out_dir, "sweep folder")
    write_json(out_dir / "sweep.json", config.to_dict())
    specs = plan_sweep(config, out_dir, device=device)
    _refuse_foreign_runs(specs)
    # a size that cannot fit: one line before any run starts
    _check_memory([s for s in specs if run_status(s.run_dir) != "finished"], executor, device)
    with terminate_as_interrupt():  # SIGTERM (kill, timeout, Slurm) ends it as Ctrl-C does
        _train_missing(specs, executor, progress, _SweepLog(out_dir / "sweep.log"))
    results = collect_results(specs)
    stored = results.assign(run_dir=[relative_run_dir(spec.run_dir, out_dir) for spec in specs])
    write_csv(out_dir / "results.csv", stored)
    # every run is done: a group checkpoint left by an interrupted group of other runs is stale
    for runs_folder in {spec.run_dir.parent for spec in specs}:
        for stale in runs_folder.glob(GROUP_CHECKPOINT_GLOB):
            stale.unlink(missing_ok=True)
    return results


def _check_memory(specs: Sequence[RunSpec], executor: str, device: torch.device) -> None:
    """Refuse, in one line, runs that cannot fit: on a GPU the "batched" executor's group plan
    (:func:`~mhainterp.sweep.executors.plan_device_groups`) or, for one run at a time, one
    run's training against the device's free memory; on the CPU each run's training against
    the host's."""
    if not specs:
        return
    if not trains_in_groups(device):
        for spec in specs:
            needed = training_memory(spec.model_config, spec.train_config)
            require_memory(needed, training_what(spec.model_config, spec.train_config))
    elif executor == "batched":
        plan_device_groups(specs, device)
    else:
        free, _total = device_memory(device)
        for spec in specs:
            needed = training_memory(spec.model_config, spec.train_config)
            what = training_what(spec.model_config, spec.train_config)
            plan_group_sizes(1, needed, free, what=what, where=str(device))


def _refuse_foreign_runs(specs: Sequence[RunSpec]) -> None:
    """A finished run folder that holds another run than the one planned for it (copied in,
    say) is refused, never adopted; an unfinished one is redone."""
    for spec in specs:
        if run_status(spec.run_dir) != "finished":
            continue
        task = spec.build_task()
        if not saved_config_matches(spec.run_dir, spec.model_config, task, spec.train_config):
            differences = run_config_differences(
                spec.run_dir, spec.model_config, task, spec.train_config
            )
            raise RunFolderError(
                f"{spec.run_dir} holds another run than this sweep's {spec.run_dir.name} "
                f"({differences}); move it out of the sweep folder, then rerun"
            )


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
                    print(f"waiting for runs another process is training: {names}", file=sys.stderr)
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
            remove_stale_temps(spec.run_dir)  # of a write that a killed process never finished
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


def collect_results(specs: Sequence[RunSpec]) -> pd.DataFrame:
    """The per-run table, read back from the run folders (so it never depends on scheduling).
    Each run is loaded (:func:`~mhainterp.training.load_run`): a damaged file stops the
    sweep with one line naming it, rather than entering the table."""
    rows = []
    for spec in specs:
        if not is_finished_run(spec.run_dir):
            raise FileNotFoundError(f"run {spec.run_dir} did not finish; rerun the sweep")
        run = load_run(spec.run_dir, verify=False, device="cpu")  # a table, read on the CPU
        saved, cfg = read_eval(spec.run_dir, require=("final_train_loss",)), spec.model_config
        row = {
            "task": spec.task_name,
            "n_heads": cfg.n_heads,
            "seed": cfg.seed,
            "d_model": cfg.d_model,
            "d_head": cfg.d_head,
            "n_params": run.model.n_params,
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
