"""The population trainer on a real GPU (``make test-gpu``; every test here skips without CUDA):
``train_many`` and a sweep on CUDA agree with the CPU within the tolerance stated below, the
same seeds on CUDA give identical tables, a step reads nothing back to the host, and a sweep
trains in stacked groups sized by the free memory.

The tolerance, CPU against CUDA, both in full fp32 (``train_many``'s default: no TF32): after a
short training (tens of steps) every weight, logit and logged loss agrees within
``atol=CUDA_ATOL, rtol=CUDA_RTOL`` (the float order of the two devices' matmuls and
reductions differs; Adam turns a gradient's last bits into steps of ~lr where the gradient is
~0, so ``attn.k_proj.bias``, whose gradient is exactly zero in exact arithmetic, is not
compared), and every accuracy within ``CUDA_ACCURACY_ATOL`` (a near-tie may flip a few of the
scored predictions). Long trainings drift apart further, as two CPUs' would: seed-level
results are compared by the statistics, not value by value.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import mhainterp.sweep.executors as executors
from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.fast.stacked import _Group, train_many
from mhainterp.fast.stacked_memory import stacked_bytes_per_model
from mhainterp.runtime import model_device
from mhainterp.sweep import plan_sweep, run_sweep
from mhainterp.tasks import get_task
from mhainterp.training import build_model

pytestmark = pytest.mark.cuda

CUDA_ATOL = 1e-4
CUDA_RTOL = 1e-3
CUDA_ACCURACY_ATOL = 0.01
ZERO_GRADIENT_PARAMS = ("attn.k_proj.bias",)

SHAPES = [
    # causal, fixed length, attention only: the standard config, shrunk
    ("count_previous", {"seq_len": 8, "d_vocab": 5}, {"d_model": 16}),
    # bidirectional, padded, 2 layers with MLP and LayerNorm
    (
        "reverse",
        {"seq_len": 6, "d_vocab": 4, "min_len": 3},
        {"d_model": 8, "n_layers": 2, "attn_only": False, "normalization_type": "LN"},
    ),
]
RUNS = [(1, 0), (4, 1), (2, 2), (4, 3)]  # mixed head counts share one step


def _train(task, model_kwargs, device, tf32=False):
    models = [build_model(task, n_heads=h, seed=s, device=device, **model_kwargs) for h, s in RUNS]
    configs = [
        TrainConfig(steps=30, batch_size=16, warmup_steps=5, log_every=10, n_eval=64, seed=s,
                    grad_clip=0.05, eval_every=20)
        for _, s in RUNS
    ]  # fmt: skip
    return train_many(models, task, configs, progress=False, tf32=tf32)


def _assert_close_runs(cpu_runs, gpu_runs) -> None:
    for cpu, gpu in zip(cpu_runs, gpu_runs, strict=True):
        assert model_device(gpu.model).type == "cuda"  # handed back on the training device
        for (name, a), b in zip(cpu.model.named_parameters(), gpu.model.parameters(), strict=True):
            if not name.endswith(ZERO_GRADIENT_PARAMS):
                torch.testing.assert_close(b.cpu(), a, atol=CUDA_ATOL, rtol=CUDA_RTOL, msg=name)
        pd.testing.assert_frame_equal(gpu.metrics.drop(columns=["eval_accuracy"]),
                                      cpu.metrics.drop(columns=["eval_accuracy"]),
                                      atol=CUDA_ATOL, rtol=CUDA_RTOL)  # fmt: skip
        accuracy = gpu.metrics["eval_accuracy"].fillna(0) - cpu.metrics["eval_accuracy"].fillna(0)
        assert accuracy.abs().max() <= CUDA_ACCURACY_ATOL
        assert gpu.eval["loss"] == pytest.approx(cpu.eval["loss"], rel=CUDA_RTOL, abs=CUDA_ATOL)
        assert gpu.eval["accuracy"] == pytest.approx(cpu.eval["accuracy"], abs=CUDA_ACCURACY_ATOL)


@pytest.mark.parametrize(("task_name", "task_params", "model_kwargs"), SHAPES)
def test_train_many_on_cuda_equals_the_cpu_within_the_tolerance(
    task_name, task_params, model_kwargs
):
    task = get_task(task_name, **task_params)
    _assert_close_runs(_train(task, model_kwargs, "cpu"), _train(task, model_kwargs, "cuda"))


@pytest.mark.parametrize(("task_name", "task_params", "model_kwargs"), SHAPES)
def test_same_seeds_on_cuda_give_identical_results(task_name, task_params, model_kwargs):
    task = get_task(task_name, **task_params)
    first, second = (_train(task, model_kwargs, "cuda") for _ in range(2))
    for a, b in zip(first, second, strict=True):
        pd.testing.assert_frame_equal(a.metrics, b.metrics, check_exact=True)
        assert a.eval == b.eval
        for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(pa, pb)


def test_a_cuda_step_reads_nothing_back_to_the_host():
    task = get_task("reverse", seq_len=6, d_vocab=4, min_len=3)
    models = [build_model(task, n_heads=h, seed=s, d_model=8, device="cuda") for h, s in RUNS]
    configs = [TrainConfig(steps=10, batch_size=16, seed=s) for _, s in RUNS]
    order, device = list(range(len(RUNS))), model_device(models[0])
    group = _Group(models, task, configs, [None] * len(RUNS), order, device)
    group.step(0, 1e-3)  # the first batch is labelled with the task's checks (they read back)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 6):
            group.step(step, 1e-3)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert group.n_steps == 6


def test_tf32_is_only_inside_the_trainer():
    before = torch.backends.cuda.matmul.allow_tf32
    task = get_task("count_previous", seq_len=8, d_vocab=5)
    runs = _train(task, {"d_model": 16}, "cuda", tf32=True)
    assert torch.backends.cuda.matmul.allow_tf32 == before
    assert all(run.eval["status"] == "finished" for run in runs)


@pytest.mark.parametrize("n_heads", [1, 8])
def test_the_memory_estimate_bounds_what_a_group_allocates(n_heads):
    """The plan's bytes per model (:func:`stacked_bytes_per_model`) are an upper bound of what
    a stacked group allocates per model on the GPU, and not a loose one."""
    task = get_task("count_previous", seq_len=16, d_vocab=10)
    n_models = 64
    models = [build_model(task, d_model=64, n_heads=n_heads, seed=s, device="cuda")
              for s in range(n_models)]  # fmt: skip
    configs = [TrainConfig(steps=3, warmup_steps=0, n_eval=64, seed=s) for s in range(n_models)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    train_many(models, task, configs, progress=False)
    peak = torch.cuda.max_memory_allocated() - base
    estimate = n_models * stacked_bytes_per_model(models[0].cfg, configs[0])
    assert peak <= estimate
    assert estimate <= 4 * peak


TINY = SweepConfig(
    task="reverse",
    task_params={"seq_len": 6, "d_vocab": 4},
    n_heads=[1, 2, 4],
    seeds=[0, 1],
    model={"d_model": 8},
    train=TrainConfig(steps=12, batch_size=8, warmup_steps=2, log_every=4, n_eval=32),
)


def test_a_cuda_sweep_trains_in_groups_and_matches_the_cpu(tmp_path, monkeypatch):
    cpu = run_sweep(TINY, tmp_path / "cpu", executor="local", progress=False, device="cpu")
    free, total = torch.cuda.mem_get_info()
    specs = plan_sweep(TINY, tmp_path / "x", device="cuda")
    per_model = max(executors.stacked_bytes_per_model(s.model_config, s.train_config)
                    for s in specs)  # fmt: skip
    room = int((2 * per_model + executors._evaluation_bytes(specs[0])) / 0.9) + 1
    monkeypatch.setattr(executors, "device_memory", lambda device: (min(free, room), total))
    groups: list[int] = []
    real = executors.train_group

    def counting(group, progress=False, on_step=None, device=None):
        groups.append(len(group))
        assert torch.device(device).type == "cuda"
        return real(group, progress, on_step, device)

    monkeypatch.setattr(executors, "train_group", counting)
    gpu = run_sweep(TINY, tmp_path / "gpu", executor="auto", progress=False, device="cuda")
    assert groups == [2, 2, 2]  # auto is "batched" on a GPU: three groups, no process pool
    saved = pd.read_csv(tmp_path / "gpu" / "results.csv")
    accuracy = [c for c in cpu.columns if "accuracy" in c]
    rest = [c for c in cpu.columns if c not in accuracy and c != "run_dir"]
    for table in (gpu, saved):
        pd.testing.assert_frame_equal(table[rest], cpu[rest], atol=CUDA_ATOL, rtol=CUDA_RTOL,
                                      check_dtype=False)  # fmt: skip
        difference = (table[accuracy] - cpu[accuracy]).abs().to_numpy().max()
        assert difference <= CUDA_ACCURACY_ATOL


def test_the_gpu_benchmark_section_runs():
    from test_bench import bench

    rows = bench.gpu_measure(torch.device("cuda"), heads=(1,), n_models=(4,), steps=3, repeats=1)
    assert [row["case"] for row in rows][:3] == ["reference_stack", "train_many", "train_many_tf32"]
    assert all(row["value"] > 0 for row in rows)
