"""Sweep executors beyond "local": "batched" (many runs per training step, on every CPU, or in
stacked groups on one GPU) and "ray" (runs as tasks on a Ray cluster).

An executor is a callable ``(specs, progress) -> None`` in :data:`mhainterp.sweep.EXECUTORS`
that leaves a finished run folder for every :class:`~mhainterp.sweep.RunSpec` (exactly what
:func:`~mhainterp.sweep.execute_run` writes). ``EXECUTORS`` names them all (nothing registers
itself on import, and importing this module starts no process); the sweep's results table never
depends on the executor or on how runs were grouped, because every run is
trained on its own data stream and the table is read back from the run folders.

- ``"batched"``: runs that share task, model shape (except ``n_heads``) and training settings
  (except the seed) are trained together by :func:`mhainterp.fast.stacked.train_many`. On a machine
  with several CPUs the models are dealt out to one worker process per CPU, each pinned to its
  CPU with one thread (see :func:`run_batched` and ``python analysis/benchmark.py``). On a GPU
  (the runs' planned device, ``RunSpec.model_config.device``) there is no pool: the runs are
  trained in this process in as few stacked groups as the device's free memory allows
  (:func:`plan_device_groups`), one group after another.
- ``"ray"``: each group of runs is a Ray task on an existing cluster (``address`` argument, or
  the ``MHAINTERP_RAY_ADDRESS`` environment variable, or Ray's own default). The worker sends the
  run files back and the driver writes them, so no shared file system is needed. Ray is
  optional: ``pip install 'mhainterp[ray]'``.

Example:
    >>> from mhainterp import run_sweep
    >>> df = run_sweep("reverse", "runs/rev", executor="batched")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mhainterp.errors import BatchDivergedError, TrainingDivergedError
from mhainterp.fast.stacked_memory import stacked_bytes_per_model
from mhainterp.io import atomic_path, remove_stale_temps
from mhainterp.runs import RUN_FILES
from mhainterp.runtime import (
    available_cpus,
    enter_worker,
    leave_signals_to_parent,
    worker_environment,
)
from mhainterp.sweep.memory import (
    device_allocation_failures,
    device_memory,
    plan_group_sizes,
    specs_device,
    trains_in_groups,
)
from mhainterp.sweep.spec import RunSpec, execute_run
from mhainterp.training import EVAL_BATCH_SIZE, training_memory
from mhainterp.validation import check_int, invalid

__all__ = [
    "RAY_ADDRESS_ENV",
    "DEFAULT_CHUNK_SIZE",
    "group_specs",
    "plan_chunks",
    "plan_device_groups",
    "ray_task_options",
    "run_batched",
    "run_ray",
    "split_group",
    "start_ray",
    "train_group",
]

RAY_ADDRESS_ENV = "MHAINTERP_RAY_ADDRESS"
RAY_MISSING = (
    "the 'ray' executor needs Ray, which is not installed; install it with "
    "pip install 'mhainterp[ray]'"
)


# ----- grouping ----------------------------------------------------------------------------------
def _group_key(spec: RunSpec) -> str:
    """Runs with equal keys can share one batched training step."""
    model = spec.model_config.to_dict()
    for free in ("n_heads", "d_head", "seed"):
        model.pop(free)
    train = spec.train_config.to_dict()
    train.pop("seed")
    return json.dumps([spec.task_name, spec.task_params, model, train], sort_keys=True, default=str)


def group_specs(specs: Sequence[RunSpec], max_group_size: int | None = None) -> list[list[RunSpec]]:
    """Group runs that can be trained together (same task, shape and settings but head count
    and seed), in first-seen order; groups larger than ``max_group_size`` are split.

    Example:
        >>> specs = plan_sweep(SweepConfig(n_heads=[1, 4, 8]), "runs/x")  # doctest: +SKIP
        >>> [len(g) for g in group_specs(specs)]  # doctest: +SKIP
        [9]
    """
    if max_group_size is not None:
        check_int("max_group_size", max_group_size, minimum=1)
    groups: dict[str, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(_group_key(spec), []).append(spec)
    out = []
    for group in groups.values():
        size = max_group_size or len(group)
        out.extend(group[i : i + size] for i in range(0, len(group), size))
    return out


def _relative_cost(spec: RunSpec) -> float:
    """Measured shape of a step's cost on a CPU: the attention core grows with ``n_heads``
    (with layer 0 on the (token, position) table, a step at h = 8 takes ~1.6x one at h = 1 at
    d_model 64, h = 4 ~1.25x); the rest does not."""
    return 1.0 + spec.n_heads * spec.model_config.n_layers / 10


_EXACT_SPLIT_LIMIT = 20_000
"""Most assignments :func:`split_group` tries for an exact best split (9 runs into 2 chunks is
256, about 1 ms); larger groups are dealt longest-processing-time first."""


def split_group(
    group: Sequence[RunSpec], parts: int, max_size: int | None = None
) -> list[list[RunSpec]]:
    """Deal a group into at most ``parts`` chunks of near-equal cost, each trained as one
    batched group, with at most ``max_size`` runs each. Small groups get the split whose
    costliest chunk is cheapest (exhaustive search); others are dealt longest-processing-time
    first (the costliest run to the chunk with the least work so far), which on the 9-run
    h = 1, 4, 8 grid left one worker 5% more work than the best split (measured: the best
    split trained the grid in 0.93x the time). Chunks keep the group's order inside."""
    check_int("parts", parts, minimum=1)
    costs = [_relative_cost(spec) for spec in group]
    k = min(parts, len(group))
    limit = max_size or len(group)
    if limit * k < len(group):
        raise invalid(
            "max_size", max_size, f"so large that {len(group)} runs fit {k} chunks of at most it"
        )
    if k > 1 and k ** (len(group) - 1) <= _EXACT_SPLIT_LIMIT:
        members = _best_split(costs, k, limit)
    else:
        members = _lpt_split(costs, k, limit)
    return [[group[i] for i in sorted(chunk)] for chunk in members if chunk]


def _best_split(costs: list[float], k: int, max_size: int) -> list[list[int]]:
    """The assignment of items to ``k`` non-empty chunks of at most ``max_size`` items with
    the smallest costliest chunk (first found, item 0 in chunk 0); one exists when
    ``k <= len(costs) <= k * max_size``."""
    best, best_load = None, math.inf
    for rest in itertools.product(range(k), repeat=len(costs) - 1):
        assignment = (0, *rest)
        loads, sizes = [0.0] * k, [0] * k
        for item, chunk in enumerate(assignment):
            loads[chunk] += costs[item]
            sizes[chunk] += 1
        if min(sizes) == 0 or max(sizes) > max_size:
            continue
        if max(loads) < best_load - 1e-9:
            best, best_load = assignment, max(loads)
    assert best is not None  # k <= n <= k * max_size admits a split
    return [[i for i, chunk in enumerate(best) if chunk == c] for c in range(k)]


def _lpt_split(costs: list[float], k: int, max_size: int) -> list[list[int]]:
    """Longest processing time first, into the least-loaded chunk that has room."""
    loads = [0.0] * k
    members: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        open_chunks = [c for c in range(k) if len(members[c]) < max_size]
        target = min(open_chunks, key=lambda c: (loads[c], c))
        loads[target] += costs[i]
        members[target].append(i)
    return members


DEFAULT_CHUNK_SIZE = 6
"""Most models per batched step in one process. Measured on a 2-core CPU, the h = 1, 4, 8 x 3
seeds grid at the standard config with 2 workers, interleaved repeats: chunks of up to 6
(two chunks, 5 + 4 runs) took 0.93-0.95x the time of chunks of up to 3 (3 + 2 + 2 + 2): the
fixed cost of a step is shared by more models, and with layer 0 on the (token, position)
table the activations of 5 models still fit the caches. A chunk's run folders are written
when it finishes, so this is also the most runs a killed sweep can lose per worker."""


def plan_chunks(
    groups: Sequence[Sequence[RunSpec]], workers: int, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> list[list[RunSpec]]:
    """Cut groups into chunks of at most ``chunk_size`` runs, a multiple of ``workers`` chunks
    per group where possible so that workers get equal work, costliest chunks first (they are
    handed out in this order).

    Example:
        >>> [len(c) for c in plan_chunks([grid_of_9_runs], workers=2)]  # doctest: +SKIP
        [5, 4]
    """
    check_int("chunk_size", chunk_size, minimum=1)
    chunks = []
    for group in groups:
        n_chunks = math.ceil(len(group) / chunk_size)
        n_chunks = workers * math.ceil(n_chunks / workers)
        chunks.extend(split_group(group, n_chunks, max_size=chunk_size))
    return sorted(chunks, key=lambda c: -sum(_relative_cost(s) for s in c))


def plan_device_groups(
    specs: Sequence[RunSpec], device: torch.device, memory: tuple[int, int] | None = None
) -> list[list[RunSpec]]:
    """The stacked groups ``specs`` train in on a GPU: each :func:`group_specs` group, cut
    into the fewest groups of near-equal size that fit the device's free memory (``memory``:
    ``(free, total)`` bytes, default :func:`~mhainterp.sweep.memory.device_memory`), by the
    stacked trainer's own estimate per model
    (:func:`~mhainterp.fast.stacked_memory.stacked_bytes_per_model`, the costliest head count's)
    and one model's evaluation besides.

    Raises:
        NotEnoughMemoryError: not even one run fits (one line, before any run starts).

    Example:
        >>> specs = plan_sweep(SweepConfig(seeds=list(range(30))), "out")  # doctest: +SKIP
        >>> [len(g) for g in plan_device_groups(specs, device, (2**30, 2**30))]  # doctest: +SKIP
        [45, 45]
    """
    free, _total = device_memory(device) if memory is None else memory
    planned = []
    for group in group_specs(specs):
        first = group[0]
        one_per_head_count = {spec.n_heads: spec for spec in group}.values()
        per_model = max(
            stacked_bytes_per_model(spec.model_config, spec.train_config)
            for spec in one_per_head_count
        )
        heads = sorted({spec.n_heads for spec in group})
        what = (
            f"training one {first.task_name} run (h={heads[-1]}, batch_size="
            f"{first.train_config.batch_size}) in a stacked group"
        )
        sizes = plan_group_sizes(
            len(group),
            per_model,
            free,
            fixed=_evaluation_bytes(first),
            what=what,
            where=str(device),
        )
        starts = list(itertools.accumulate(sizes, initial=0))
        planned += [list(group[a:b]) for a, b in itertools.pairwise(starts)]
    return planned


def _evaluation_bytes(spec: RunSpec) -> int:
    """What a group needs besides its models: one model's evaluation on the fixed set (models
    are evaluated one at a time, at most :data:`~mhainterp.training.evaluation.EVAL_BATCH_SIZE`
    sequences per pass), counted as training it."""
    train = spec.train_config
    size = min(train.n_eval, EVAL_BATCH_SIZE)
    return training_memory(spec.model_config, replace(train, batch_size=size))


# ----- training one group ------------------------------------------------------------------------
def train_group(
    specs: Sequence[RunSpec],
    progress: bool = False,
    on_step: Callable[[int], None] | None = None,
    device: torch.device | str | None = None,
) -> dict[str, str]:
    """Train runs that :func:`group_specs` put together and write their run folders.

    ``on_step`` is called after every step with the number of runs that took it. ``device``:
    where to train (None: the runs' planned device, where their models are built).

    Returns:
        Run folder -> divergence message, for the runs whose loss became NaN/inf (their folders
        hold the last good weights with status "diverged", as :func:`train` leaves them).
    """
    from mhainterp.fast.stacked import train_many
    from mhainterp.training import build_model

    task = specs[0].build_task()
    models = [build_model(task, **spec.model_config.to_dict()) for spec in specs]
    try:
        train_many(
            models,
            task,
            [spec.train_config for spec in specs],
            run_dirs=[spec.run_dir for spec in specs],
            progress=progress,
            on_step=on_step,
            device=device,
        )
    except BatchDivergedError as error:
        return {str(specs[i].run_dir): message for i, message in error.messages.items()}
    return {}


def _raise_diverged(messages: dict[str, str]) -> None:
    if messages:
        lines = "\n".join(f"{run}: {message}" for run, message in sorted(messages.items()))
        raise TrainingDivergedError(
            f"{len(messages)} run(s) diverged (all other runs finished):\n{lines}"
        )


# ----- the batched executor ----------------------------------------------------------------------
_worker_steps: Any = None  # in a pool worker: the shared counter of model-steps done


def _pin_worker(
    cpu_queue: Any,
    steps: Any,
    parent: int | None = None,
    environment: dict[str, str] | None = None,
) -> None:
    """Process-pool initializer: start with the sweep's ``environment``
    (:func:`mhainterp.runtime.worker_environment`: the runs' device, the command's threads);
    pin this worker to one CPU, with one torch thread; leave Ctrl-C (and SIGTERM's one-line
    ending) to the parent; die with the parent (a killed sweep leaves no orphans training)."""
    import torch

    enter_worker(environment or {})
    leave_signals_to_parent(parent)  # Ctrl-C and SIGTERM's one line are the parent's
    global _worker_steps
    _worker_steps = steps
    cpu = cpu_queue.get()
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)


def _count_steps(n: int) -> None:
    with _worker_steps.get_lock():
        _worker_steps.value += n


def _train_in_worker(specs: Sequence[RunSpec]) -> dict[str, str]:
    return train_group(specs, on_step=_count_steps)


def _train_alone_in_worker(specs: Sequence[RunSpec]) -> dict[str, str]:
    """One run at a time with :func:`mhainterp.training.train`, counting steps for the bar."""
    messages = {}
    for spec in specs:
        messages.update(_train_alone([spec]))
        _count_steps(spec.train_config.steps)
    return messages


def run_batched(
    specs: Sequence[RunSpec],
    progress: bool = True,
    *,
    workers: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch: bool = True,
) -> None:
    """The "batched" executor: train groups of runs together, on every available CPU, or on
    the GPU the runs were planned for (``RunSpec.model_config.device``).

    On a GPU there is no process pool: the runs are trained in this process, in the fewest
    stacked groups that fit its free memory (:func:`plan_device_groups`; ``workers`` and
    ``chunk_size`` do not apply), one group after another. A group's run folders are written
    when it finishes.

    Args:
        specs: Runs to do.
        progress: Show progress bars.
        workers: Worker processes, each pinned to its own CPU with one thread. None: one per
            available CPU, but never more than there are runs. 1: train in this process (with
            torch's current thread setting).
        chunk_size: Most runs per batched step (see :data:`DEFAULT_CHUNK_SIZE`). A chunk's
            run folders are written when it finishes, so this also bounds the work lost when
            a sweep is killed.
        batch: False trains each run alone with :func:`~mhainterp.training.train` (the local
            executor, spread over the pinned workers, or one after another on a GPU); for
            comparison and for runs that cannot be batched.

    Raises:
        TrainingDivergedError: after all other runs finished, if some runs diverged.
        NotEnoughMemoryError: on a GPU, a run that cannot fit (before any run starts), or a
            group that ran out of memory (one line each).

    Example:
        >>> run_batched(plan_sweep(SweepConfig(), "runs/x"), workers=1)  # doctest: +SKIP
    """
    specs = list(specs)
    if not specs:
        return
    device = specs_device(specs)
    if trains_in_groups(device):
        _raise_diverged(_train_on_device(specs, device, progress, batch))
        return
    if workers is None:
        workers = min(len(available_cpus()), len(specs))
    check_int("workers", workers, minimum=1)
    chunks = plan_chunks(group_specs(specs), workers, chunk_size)
    messages: dict[str, str] = {}
    if workers == 1 and batch:
        for chunk in tqdm(chunks, desc="sweep (batched)", disable=not progress or len(chunks) < 2):
            messages.update(train_group(chunk, progress=progress))
    else:
        worker_fn = _train_in_worker if batch else _train_alone_in_worker
        environment = worker_environment(device)
        messages = _run_in_pool(chunks, workers, progress, worker_fn, environment)
    _raise_diverged(messages)


def _train_on_device(
    specs: Sequence[RunSpec], device: torch.device, progress: bool, batch: bool
) -> dict[str, str]:
    """The GPU path of :func:`run_batched`: the planned groups (or, ``batch=False``, the runs
    one by one) in this process; an out-of-memory error is one line."""
    chunks = plan_device_groups(specs, device) if batch else [[spec] for spec in specs]
    messages: dict[str, str] = {}
    desc = f"sweep (batched, {device}, {len(chunks)} groups)"
    for chunk in tqdm(chunks, desc=desc, disable=not progress or len(chunks) < 2, leave=False):
        with device_allocation_failures(f"training a group of {len(chunk)} runs", device):
            if batch:
                messages.update(train_group(chunk, progress=progress, device=device))
            else:
                messages.update(_train_alone(chunk))
    return messages


def _train_alone(specs: Sequence[RunSpec]) -> dict[str, str]:
    """One run at a time with :func:`mhainterp.training.train` (the local executor's way)."""
    messages = {}
    for spec in specs:
        try:
            execute_run(spec)
        except TrainingDivergedError as error:
            messages[str(spec.run_dir)] = str(error)
    return messages


def _mp_context() -> Any:
    """fork on Linux: no re-import of torch per worker and no ``if __name__ == "__main__"``
    guard needed in user scripts; workers use one thread (as DataLoader workers do), which is
    what makes forking after torch's thread pool safe. spawn elsewhere."""
    import multiprocessing

    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _run_in_pool(
    chunks: list[list[RunSpec]],
    workers: int,
    progress: bool,
    worker_fn: Callable[[Sequence[RunSpec]], dict[str, str]],
    environment: dict[str, str] | None = None,
) -> dict[str, str]:
    """Train ``chunks`` in ``workers`` processes, each started with ``environment`` (the one
    place, with Ray's tasks, where the toolkit writes an environment: the workers' own)."""
    context = _mp_context()
    cpus = available_cpus()
    cpu_queue = context.Queue()
    for i in range(workers):
        cpu_queue.put(cpus[i % len(cpus)] if len(cpus) >= workers else None)
    steps = context.Value("q", 0)
    messages: dict[str, str] = {}
    total = sum(len(chunk) * chunk[0].train_config.steps for chunk in chunks)
    with (
        ProcessPoolExecutor(
            workers,
            mp_context=context,
            initializer=_pin_worker,
            initargs=(cpu_queue, steps, os.getpid(), environment),
        ) as pool,
        tqdm(
            total=total,
            desc=f"sweep (batched, {workers} workers)",
            unit="model-step",
            disable=not progress,
            leave=False,
        ) as bar,
    ):
        try:
            pending = {pool.submit(worker_fn, chunk) for chunk in chunks}
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    messages.update(future.result())
                bar.update(steps.value - bar.n)
        except BaseException:
            # Ctrl-C or a failed chunk: stop the workers now rather than let the pool's exit
            # wait for every running chunk (finished chunks' folders are already written).
            _stop_workers(pool)
            _remove_killed_writes(chunks)
            raise
    return messages


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    # The executor has no public way to end running tasks; its process table is the way
    # (read before shutdown, which clears it).
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(OSError, AttributeError):
            process.kill()
    for process in processes:  # reaped: a zombie's pid still reads as a live writer
        with contextlib.suppress(OSError, AttributeError, AssertionError):
            process.join(timeout=10)
    pool.shutdown(wait=False, cancel_futures=True)


def _remove_killed_writes(chunks: list[list[RunSpec]]) -> None:
    """Remove the temp files that the killed workers' writes left in the run folders (SIGKILL
    runs no ``finally``). A rerun would remove them too, but the folder a failed or
    interrupted sweep leaves must not show half-written files (temps of live processes,
    such as another sweep's, are left alone)."""
    for chunk in chunks:
        for spec in chunk:
            with contextlib.suppress(OSError):
                remove_stale_temps(spec.run_dir)
        for folder in {spec.run_dir.parent for spec in chunk}:  # group checkpoints' temps
            with contextlib.suppress(OSError):
                remove_stale_temps(folder)


# ----- the Ray executor --------------------------------------------------------------------------
def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    return ray


def start_ray(address: str | None = None) -> Any:
    """Ray, connected: ``ray.init(address=...)`` unless it is initialised already, with
    ``address`` from the argument, else the ``MHAINTERP_RAY_ADDRESS`` environment variable
    (``"auto"``, ``"ray://host:10001"``...), else Ray's default (an existing local cluster, or
    a new one). ``mhainterp sweep --address`` calls it before the sweep, so the address
    needs no environment.

    Raises:
        ImportError: Ray is not installed (``pip install 'mhainterp[ray]'``).
    """
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get(RAY_ADDRESS_ENV) or None, log_to_driver=False)
    return ray


def train_group_files(specs: Sequence[RunSpec]) -> list[tuple[str, dict[str, bytes], str | None]]:
    """Train a group in a temporary folder and return its run files (for remote workers).

    Returns:
        One ``(run_dir, {file name: bytes}, divergence message or None)`` per run.
    """
    from dataclasses import replace

    with tempfile.TemporaryDirectory(prefix="mhainterp-") as tmp:
        local = [replace(spec, run_dir=Path(tmp) / f"run{i}") for i, spec in enumerate(specs)]
        messages = train_group(local)
        out = []
        for spec, here in zip(specs, local, strict=True):
            folder = here.run_dir
            files = {n: (folder / n).read_bytes() for n in RUN_FILES if (folder / n).is_file()}
            out.append((str(spec.run_dir), files, messages.get(str(folder))))
    return out


def _write_run_files(run_dir: str, files: dict[str, bytes]) -> None:
    """Write a run folder atomically, file by file, ``eval.json`` last (as save_run does)."""
    order = [n for n in RUN_FILES if n != "eval.json" and n in files]
    order += ["eval.json"] if "eval.json" in files else []
    for name in order:
        with atomic_path(Path(run_dir) / name) as tmp:
            tmp.write_bytes(files[name])


def run_ray(
    specs: Sequence[RunSpec],
    progress: bool = True,
    *,
    address: str | None = None,
    group_size: int | None = 3,
    num_cpus: int = 1,
    max_retries: int = 3,
    _task_fn: Callable[[Sequence[RunSpec]], Any] | None = None,
) -> None:
    """The "ray" executor: each group of runs is one Ray task; results land in ``run_dir`` s.

    Ray is initialised if it is not already (:func:`start_ray`). Each finished task's run
    folders are written as soon as it returns, so a sweep whose workers die can be rerun and
    only the missing runs are trained. Runs planned for CUDA ask Ray for their share of a GPU
    (:func:`ray_task_options`); each task's worker starts with the runs' device in its
    environment (:func:`mhainterp.runtime.worker_environment`).

    Args:
        specs: Runs to do.
        progress: Show a progress bar.
        address: Ray cluster address (see :func:`start_ray`).
        group_size: Most runs per task (batched together on the worker); 1 = one run per task.
        num_cpus: CPUs each task reserves (and torch threads it uses).
        max_retries: Ray retries of a task whose worker died.

    Raises:
        ImportError: Ray is not installed (``pip install 'mhainterp[ray]'``).
        TrainingDivergedError: after all other runs finished, if some runs diverged.
        RuntimeError: some tasks failed; their runs are missing and a rerun does them.
    """
    specs = list(specs)
    if not specs:
        _import_ray()  # Ray missing is refused even with nothing to do
        return
    ray = start_ray(address)
    remote = ray.remote(_ray_task)
    fn = _task_fn or train_group_files
    chunks = group_specs(specs, group_size)
    device = _planned_device(specs)
    environment = worker_environment(device)
    pending = {
        remote.options(
            **ray_task_options(len(chunk), group_size, device, num_cpus, max_retries)
        ).remote(fn, chunk, num_cpus, environment): chunk
        for chunk in chunks
    }
    messages: dict[str, str] = {}
    failures: list[str] = []
    with tqdm(total=len(specs), desc="sweep (ray)", disable=not progress) as bar:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            chunk = pending.pop(done[0])
            try:
                results = ray.get(done[0])
            except Exception as error:  # a dead worker or a failed task: the runs stay missing
                reason = (str(error).strip().splitlines() or [""])[-1][:200]
                failures.append(
                    f"{[s.run_dir.name for s in chunk]}: {type(error).__name__}: {reason}"
                )
                continue
            for run_dir, files, message in results:
                _write_run_files(run_dir, files)
                if message:
                    messages[run_dir] = message
            bar.update(len(chunk))
    _raise_diverged(messages)
    if failures:
        raise RuntimeError(
            f"{len(failures)} Ray task(s) failed; their runs are missing (rerun the sweep to do "
            "only those):\n" + "\n".join(failures)
        )


def ray_task_options(
    n_runs: int,
    group_size: int | None,
    device: torch.device,
    num_cpus: int = 1,
    max_retries: int = 3,
) -> dict[str, Any]:
    """The options of the Ray task that trains ``n_runs`` runs planned for ``device``.

    On CUDA the task asks for its share of a GPU, ``n_runs / group_size`` (a full group one
    GPU, a smaller last group a fraction of one, which Ray may pack beside another; one GPU
    when groups are not capped): without a GPU request Ray hides every GPU from a task
    (an empty ``CUDA_VISIBLE_DEVICES``), and runs planned for CUDA find none.

    Example:
        >>> ray_task_options(2, 4, torch.device("cuda"))
        {'num_cpus': 1, 'max_retries': 3, 'num_gpus': 0.5}
        >>> ray_task_options(2, 4, torch.device("cpu"))
        {'num_cpus': 1, 'max_retries': 3}
    """
    options: dict[str, Any] = {"num_cpus": num_cpus, "max_retries": max_retries}
    if device.type == "cuda":
        share = 1.0 if group_size is None else min(1.0, n_runs / group_size)
        options["num_gpus"] = round(share, 4)  # Ray takes GPU shares in steps of 0.0001
    return options


def _planned_device(specs: Sequence[RunSpec]) -> torch.device:
    """The device the runs were planned for, as named (the driver may have none of its own:
    the Ray workers do)."""
    return torch.device(str(specs[0].model_config.device))


def _ray_task(
    fn: Callable[[Sequence[RunSpec]], Any],
    chunk: Sequence[RunSpec],
    threads: int,
    environment: dict[str, str] | None = None,
):
    """One Ray task, in a Ray worker process: the sweep's ``environment`` first
    (:func:`mhainterp.runtime.worker_environment`), then ``threads`` torch threads."""
    import torch

    enter_worker(environment or {})
    torch.set_num_threads(max(1, threads))
    return fn(chunk)
