"""The sweep's table does not depend on the executor or on how runs are grouped; resumption."""

from __future__ import annotations

import errno
import functools
import math
import os
import sys
import time
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

import mhainterp.sweep.executors as executors
import mhainterp.sweep.run as sweep_run
from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.errors import NotEnoughMemoryError
from mhainterp.fast.stacked_memory import stacked_bytes_per_model
from mhainterp.io import atomic_path
from mhainterp.runtime import available_cpus
from mhainterp.sweep import EXECUTORS, fastest_executor, plan_sweep, run_sweep
from mhainterp.sweep.executors import (
    _lpt_split,
    group_specs,
    plan_chunks,
    plan_device_groups,
    ray_task_options,
    run_batched,
    run_ray,
    split_group,
    train_group,
)
from mhainterp.sweep.memory import device_memory, plan_group_sizes, specs_device

TINY = SweepConfig(
    task="reverse",
    task_params={"seq_len": 6, "d_vocab": 4},
    n_heads=[1, 2, 4],
    seeds=[0, 1],
    model={"d_model": 8},
    train=TrainConfig(steps=12, batch_size=8, warmup_steps=2, log_every=4, n_eval=32),
)


def _numbers(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["run_dir"])


@pytest.fixture(scope="module")
def local_table(tmp_path_factory) -> pd.DataFrame:
    return run_sweep(TINY, tmp_path_factory.mktemp("local"), executor="local", progress=False)


def test_executors_are_registered():
    assert {"local", "batched", "ray"} <= set(EXECUTORS)


@pytest.mark.parametrize(("workers", "batch"), [(1, True), (2, True), (None, True), (2, False)])
def test_batched_table_equals_local_table(local_table, tmp_path, monkeypatch, workers, batch):
    executor = functools.partial(run_batched, workers=workers, batch=batch)
    monkeypatch.setitem(EXECUTORS, "batched", executor)
    table = run_sweep(TINY, tmp_path, executor="batched", progress=False)
    pd.testing.assert_frame_equal(_numbers(table), _numbers(local_table), atol=1e-5, rtol=1e-4)
    assert table["run_dir"].tolist() == [
        str(tmp_path / "runs" / f"h{h}_seed{s}") for h in (1, 2, 4) for s in (0, 1)
    ]


def test_grouping_does_not_change_the_table(local_table, tmp_path):
    specs = plan_sweep(TINY, tmp_path)
    for group in group_specs(specs, max_group_size=4):  # groups of 4 and 2, mixed head counts
        train_group(group)
    table = run_sweep(TINY, tmp_path, executor="local", progress=False)  # nothing left to do
    pd.testing.assert_frame_equal(_numbers(table), _numbers(local_table), atol=1e-5, rtol=1e-4)


def test_group_specs_and_split_group(tmp_path):
    specs = plan_sweep(TINY, tmp_path)
    other = plan_sweep(SweepConfig(**{**TINY.__dict__, "model": {"d_model": 16}}), tmp_path)
    groups = group_specs(specs + other[:2])
    assert [[(s.n_heads, s.seed) for s in g] for g in groups] == [
        [(1, 0), (1, 1), (2, 0), (2, 1), (4, 0), (4, 1)],
        [(1, 0), (1, 1)],
    ]
    assert [len(g) for g in group_specs(specs, max_group_size=4)] == [4, 2]
    # the best split: costs 1.4 (h=4), 1.2 (h=2), 1.1 (h=1), so one of each per chunk (3.7)
    chunks = split_group(specs, 2)
    assert [[(s.n_heads, s.seed) for s in c] for c in chunks] == [
        [(1, 0), (2, 0), (4, 0)],
        [(1, 1), (2, 1), (4, 1)],
    ]
    grid = plan_sweep(SweepConfig(**{**TINY.__dict__, "n_heads": [1, 4, 8], "seeds": [0, 1, 2]}),
                      tmp_path)  # fmt: skip
    # costs 1.8 (h=8), 1.4 (h=4), 1.1 (h=1): the best split is 6.5 / 6.4; longest-first
    # dealing would give 6.8 / 6.1 (one worker idle for a twentieth of the sweep)
    chunks = split_group(grid, 2)
    assert [[(s.n_heads, s.seed) for s in c] for c in chunks] == [
        [(1, 0), (1, 1), (1, 2), (4, 0), (8, 0)],
        [(4, 1), (4, 2), (8, 1), (8, 2)],
    ]
    costs = [1.0 + s.n_heads / 10 for s in grid]
    lpt = [sum(costs[i] for i in chunk) for chunk in _lpt_split(costs, 2, 9)]
    assert max(lpt) == pytest.approx(6.8)
    assert [len(c) for c in split_group(grid, 2, max_size=5)] == [5, 4]
    assert [len(c) for c in split_group(grid, 3, max_size=3)] == [3, 3, 3]
    with pytest.raises(
        ValueError, match="max_size=4 is invalid: so large that 9 runs fit 2 chunks"
    ):
        split_group(grid, 2, max_size=4)
    assert len(split_group(specs[:1], 2)) == 1  # no empty chunks
    # at most 3 runs per step, 2 workers: 4 chunks (too many splits to try: dealt
    # longest-first), costliest first
    chunks = plan_chunks([grid], workers=2, chunk_size=3)
    assert [[(s.n_heads, s.seed) for s in c] for c in chunks] == [
        [(1, 2), (4, 0), (4, 1)],
        [(4, 2), (8, 0)],
        [(1, 0), (8, 1)],
        [(1, 1), (8, 2)],
    ]
    assert [len(c) for c in plan_chunks([specs], workers=1, chunk_size=4)] == [3, 3]
    with pytest.raises(ValueError, match="max_group_size=0 is invalid"):
        group_specs(specs, max_group_size=0)
    with pytest.raises(ValueError, match="chunk_size=0 is invalid"):
        plan_chunks([specs], workers=1, chunk_size=0)
    with pytest.raises(ValueError, match="workers=0 is invalid"):
        run_batched(specs, workers=0)


def test_batched_sweep_resumes_only_missing_runs(local_table, tmp_path, monkeypatch):
    monkeypatch.setitem(EXECUTORS, "batched", functools.partial(run_batched, workers=1))
    run_sweep(TINY, tmp_path, executor="batched", progress=False)
    runs = tmp_path / "runs"
    (runs / "h2_seed1" / "eval.json").unlink()  # killed before this run finished
    (runs / "h4_seed0" / "model.safetensors").unlink()
    kept = {p.name: (p / "model.safetensors").stat().st_mtime_ns for p in runs.iterdir()
            if (p / "model.safetensors").is_file() and (p / "eval.json").is_file()}  # fmt: skip
    trained = []
    real = executors.train_group

    def counting(specs, progress=False):
        trained.extend(s.run_dir.name for s in specs)
        return real(specs, progress)

    monkeypatch.setattr(executors, "train_group", counting)
    table = run_sweep(TINY, tmp_path, executor="batched", progress=False)
    assert sorted(trained) == ["h2_seed1", "h4_seed0"]
    for name, mtime in kept.items():
        assert (runs / name / "model.safetensors").stat().st_mtime_ns == mtime, name
    pd.testing.assert_frame_equal(_numbers(table), _numbers(local_table), atol=1e-5, rtol=1e-4)


def test_divergence_is_reported_after_the_other_runs(tmp_path):
    config = SweepConfig(**{**TINY.__dict__, "train": TrainConfig(
        steps=12, batch_size=8, warmup_steps=0, log_every=4, n_eval=32, lr=1e30,
        grad_clip=None)})  # fmt: skip
    specs = plan_sweep(config, tmp_path)
    with pytest.raises(executors.TrainingDivergedError, match=r"run\(s\) diverged"):
        run_batched(specs, progress=False, workers=1)
    statuses = {p.name: (p / "eval.json").read_text() for p in (tmp_path / "runs").iterdir()}
    assert len(statuses) == 6  # every run folder was written, diverged or not
    assert any('"diverged"' in text for text in statuses.values())


def _write_forever_or_fail(specs) -> dict[str, str]:
    """A pool worker: the first run's worker holds a half-written temp file; the other one
    fails (a full disk) as soon as that temp exists."""
    run_dir = specs[0].run_dir
    writer_dir = run_dir.with_name("h1_seed0")
    if run_dir == writer_dir:
        with atomic_path(run_dir / "config.json") as tmp:
            tmp.write_text("half")
            time.sleep(120)
    deadline = time.monotonic() + 60
    while not list(writer_dir.glob(".*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.02)
    raise OSError(errno.ENOSPC, "No space left on device", str(run_dir))


def test_a_failed_chunk_leaves_no_temp_file_of_the_workers_it_killed(tmp_path):
    # CI (stop 28): a worker killed while it wrote config.json left its temp file behind
    specs = [s for s in plan_sweep(TINY, tmp_path) if s.run_dir.name in ("h1_seed0", "h1_seed1")]
    for spec in specs:
        spec.run_dir.mkdir(parents=True)
    started = time.monotonic()
    with pytest.raises(OSError, match="No space left"):
        executors._run_in_pool([[s] for s in specs], 2, False, _write_forever_or_fail)
    assert time.monotonic() - started < 60  # the writer was killed, not waited for
    assert sorted(p.name for p in (tmp_path / "runs").rglob("*")) == ["h1_seed0", "h1_seed1"]


def test_ray_missing_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(ImportError, match=r"pip install 'mhainterp\[ray\]'"):
        run_ray(plan_sweep(TINY, tmp_path))


def test_ray_tasks_ask_for_a_share_of_a_gpu_on_cuda(monkeypatch, tmp_path):
    """Without a GPU request Ray hides every GPU from its tasks. The options are read off a
    stand-in for ray (ray itself need not be installed). Each task carries the environment
    its worker starts with: the device the runs were planned for."""
    from dataclasses import replace

    asked: list[tuple[int, dict]] = []
    environments: list[dict[str, str]] = []

    def remote(options):
        def call(fn, chunk, threads, environment):
            environments.append(environment)
            return asked.append((len(chunk), options)) or object()

        return call

    class Remote:
        def options(self, **options):
            return types.SimpleNamespace(remote=remote(options))

    fake = types.SimpleNamespace(
        is_initialized=lambda: True,
        remote=lambda fn: Remote(),
        wait=lambda pending, num_returns: ([pending[0]], pending[1:]),
        get=lambda ref: [],
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    specs = plan_sweep(TINY, tmp_path)  # 6 runs in one group
    on_cuda = [replace(s, model_config=replace(s.model_config, device="cuda")) for s in specs]
    run_ray(on_cuda, progress=False, group_size=4, num_cpus=2)
    assert sorted((n, o.get("num_gpus")) for n, o in asked) == [(2, 0.5), (4, 1.0)]
    assert all(o["num_cpus"] == 2 and o["max_retries"] == 3 for _, o in asked)
    assert environments == [{"MHAINTERP_DEVICE": "cuda"}] * 2  # as planned: no GPU needed here
    asked.clear()
    environments.clear()
    run_ray(specs, progress=False, group_size=4)  # on the CPU: no GPU asked
    assert [("num_gpus" in o) for _, o in asked] == [False, False]
    assert environments == [{"MHAINTERP_DEVICE": "cpu"}] * 2
    assert ray_task_options(5, None, torch.device("cuda"))["num_gpus"] == 1.0
    assert ray_task_options(1, 3, torch.device("cuda"))["num_gpus"] == 0.3333


# ----- Ray (optional: only where ray is installed) ----------------------------------------------
def _crash_on_seed_1(specs):
    """A Ray task body whose worker process dies when its group holds a seed-1 run."""
    if any(spec.seed == 1 for spec in specs):
        os._exit(1)
    return executors.train_group_files(specs)


@pytest.fixture(scope="module")
def ray_local():
    # CI installs the [ray] extra and sets MHAINTERP_REQUIRE_RAY=1: there a missing Ray fails.
    if os.environ.get("MHAINTERP_REQUIRE_RAY"):
        import ray
    else:
        ray = pytest.importorskip("ray")
    # Ray workers cannot import this test module: send its functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_table_equals_local_table(ray_local, local_table, tmp_path):
    table = run_sweep(TINY, tmp_path, executor="ray", progress=False)
    pd.testing.assert_frame_equal(_numbers(table), _numbers(local_table), atol=1e-5, rtol=1e-4)


def test_ray_killed_worker_then_rerun_completes_only_missing(
    ray_local, local_table, tmp_path, monkeypatch
):
    crashing = functools.partial(run_ray, group_size=1, max_retries=0, _task_fn=_crash_on_seed_1)
    monkeypatch.setitem(EXECUTORS, "ray", crashing)
    with pytest.raises(RuntimeError, match="3 Ray task"):
        run_sweep(TINY, tmp_path, executor="ray", progress=False)
    runs = tmp_path / "runs"
    done = sorted(p.name for p in runs.iterdir() if (p / "eval.json").is_file())
    assert done == ["h1_seed0", "h2_seed0", "h4_seed0"]
    mtimes = {name: (runs / name / "model.safetensors").stat().st_mtime_ns for name in done}

    monkeypatch.setitem(EXECUTORS, "ray", functools.partial(run_ray, group_size=1))
    trained: list[str] = []
    real = executors.run_ray

    def spy(specs, progress):
        trained.extend(Path(s.run_dir).name for s in specs)
        return real(specs, progress, group_size=1)

    monkeypatch.setitem(EXECUTORS, "ray", spy)
    table = run_sweep(TINY, tmp_path, executor="ray", progress=False)
    assert sorted(trained) == ["h1_seed1", "h2_seed1", "h4_seed1"]
    for name, mtime in mtimes.items():
        assert (runs / name / "model.safetensors").stat().st_mtime_ns == mtime
    pd.testing.assert_frame_equal(_numbers(table), _numbers(local_table), atol=1e-5, rtol=1e-4)


# ----- on a GPU: stacked groups sized by free memory, in this process -----------------------------
def test_plan_group_sizes_is_the_fewest_near_equal_groups():
    cases = {  # (runs, bytes per run, free) -> sizes; 90% of free is used
        (9, 100, 1000): [9],
        (10, 100, 1000): [5, 5],
        (19, 100, 1000): [7, 6, 6],
        (1, 900, 1000): [1],
        (27000, 7 * 2**20, 80 * 2**30): [9000, 9000, 9000],
    }
    for (n, per_model, free), sizes in cases.items():
        assert plan_group_sizes(n, per_model, free) == sizes, (n, per_model, free)
    assert plan_group_sizes(10, 100, 1000, fixed=200) == [5, 5]  # 7 fit beside 200 fixed
    with pytest.raises(NotEnoughMemoryError) as error:
        plan_group_sizes(3, 2 * 2**30, 2**30, what="training one reverse run", where="cuda:0")
    assert str(error.value) == (
        "training one reverse run needs about 2.0 GiB of memory on cuda:0, but 921.6 MiB are "
        "free there; lower the sizes asked for"
    )


def _gpu_of(monkeypatch, free: int, total: int = 80 * 2**30) -> torch.device:
    """CUDA as the planner sees it: ``torch.cuda.mem_get_info`` says ``free`` bytes."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    return torch.device("cuda")


def _room_for(specs, n_models: int) -> int:
    """Free bytes in which the plan fits exactly ``n_models`` of ``specs``' runs per group."""
    per_model = max(stacked_bytes_per_model(s.model_config, s.train_config) for s in specs)
    return math.ceil((n_models * per_model + executors._evaluation_bytes(specs[0])) / 0.9) + 1


def test_device_groups_follow_the_free_memory_mem_get_info_reports(monkeypatch, tmp_path):
    specs = plan_sweep(TINY, tmp_path, device="cpu")
    assert device_memory(_gpu_of(monkeypatch, 123, 456)) == (123, 456)
    for fits, sizes in ((6, [6]), (5, [3, 3]), (2, [2, 2, 2]), (1, [1] * 6)):
        device = _gpu_of(monkeypatch, _room_for(specs, fits))
        groups = plan_device_groups(specs, device)
        assert [len(g) for g in groups] == sizes, fits
        assert [s for g in groups for s in g] == specs  # every run once, in order
    refusal = r"^training one reverse run \(h=4, batch_size=8\) in a stacked group needs about "
    with pytest.raises(NotEnoughMemoryError, match=refusal + r".* on cuda, but"):
        plan_device_groups(specs, _gpu_of(monkeypatch, _room_for(specs, 1) - 2))


def _as_if_on_a_gpu(monkeypatch, free: int) -> None:
    """The GPU path, run on the CPU: in-process stacked groups sized by ``free`` bytes, and no
    process pool."""
    for module in (executors, sweep_run):
        monkeypatch.setattr(module, "trains_in_groups", lambda device: True)
        monkeypatch.setattr(module, "device_memory", lambda device: (free, free))

    def no_pool(*args, **kwargs):
        raise AssertionError("a GPU sweep starts no process pool")

    monkeypatch.setattr(executors, "_run_in_pool", no_pool)


def test_gpu_path_trains_planned_groups_in_process_and_resumes(local_table, tmp_path, monkeypatch):
    specs = plan_sweep(TINY, tmp_path, device="cpu")
    _as_if_on_a_gpu(monkeypatch, _room_for(specs, 2))
    trained: list[list[str]] = []
    real = executors.train_group

    def counting(group, progress=False, on_step=None, device=None):
        trained.append([s.run_dir.name for s in group])
        return real(group, progress, on_step, device)

    monkeypatch.setattr(executors, "train_group", counting)
    table = run_sweep(TINY, tmp_path, executor="auto", progress=False)  # auto: batched on a GPU
    assert trained == [["h1_seed0", "h1_seed1"], ["h2_seed0", "h2_seed1"], ["h4_seed0", "h4_seed1"]]
    pd.testing.assert_frame_equal(_numbers(table), _numbers(local_table), atol=1e-5, rtol=1e-4)
    (tmp_path / "runs" / "h2_seed1" / "eval.json").unlink()  # killed before it finished
    trained.clear()
    resumed = run_sweep(TINY, tmp_path, executor="batched", progress=False)
    assert trained == [["h2_seed1"]]
    pd.testing.assert_frame_equal(_numbers(resumed), _numbers(local_table), atol=1e-5, rtol=1e-4)


def test_gpu_path_refuses_what_cannot_fit_before_any_run_starts(tmp_path, monkeypatch):
    specs = plan_sweep(TINY, tmp_path, device="cpu")
    _as_if_on_a_gpu(monkeypatch, _room_for(specs, 1) - 2)
    with pytest.raises(NotEnoughMemoryError, match="in a stacked group needs about"):
        run_sweep(TINY, tmp_path, executor="batched", progress=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_gpu_out_of_memory_is_one_line(tmp_path, monkeypatch):
    specs = plan_sweep(TINY, tmp_path, device="cpu")
    _as_if_on_a_gpu(monkeypatch, _room_for(specs, 3))

    def out_of_memory(group, progress=False, on_step=None, device=None):
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ..."
        )

    monkeypatch.setattr(executors, "train_group", out_of_memory)
    with pytest.raises(NotEnoughMemoryError) as error:
        run_batched(specs, progress=False)
    assert str(error.value) == (
        "training a group of 3 runs ran out of memory on cpu (2.00 GiB at once); lower the "
        "sizes asked for"
    )


def test_auto_executor_and_device():
    assert fastest_executor("cpu") == ("batched" if len(available_cpus()) > 1 else "local")
    assert specs_device(plan_sweep(TINY, "out", device="cpu")) == torch.device("cpu")
