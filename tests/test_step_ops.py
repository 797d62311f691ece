"""Device operations per ``train_many`` step (issue 39 item 3): every built-in task's labelling
is vectorised, so a step issues at most 1.5x the operations of the benchmark's plain stacked
reference (``analysis/benchmark.py``'s ``ReferenceStack``, AdamW ``foreach``). Counts, not
times: each aten op that computes (views and metadata excluded) is one launch on a GPU."""

from __future__ import annotations

import collections
import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mhainterp.fast.stacked as stacked
from mhainterp.config import TrainConfig
from mhainterp.tasks import get_task
from mhainterp.tasks.builtin import BUILTIN_TASKS
from mhainterp.training import build_model

# Not work on the device: views, metadata, the host reading a scalar, profiler marks.
_NOT_COUNTED = {"detach", "alias", "lift_fresh", "_unsafe_view", "_local_scalar_dense"}


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that compute (by name), except while :attr:`paused`."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        counted = not (func.is_view or name in _NOT_COUNTED or name.startswith("_record"))
        if counted and not self.paused:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    def total(self) -> int:
        return sum(self.counts.values())


def _load_benchmark():
    path = Path(__file__).resolve().parent.parent / "analysis" / "benchmark.py"
    spec = importlib.util.spec_from_file_location("benchmark_for_ops", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmark_for_ops"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()
M = 4


@pytest.fixture
def counter(monkeypatch):
    """An :class:`OpCounter` that does not count the host's draw of the batches (each model's
    CPU generator, on the host whatever the device: ``fast.stacked._draw``)."""
    counter = OpCounter()
    draw = stacked._draw

    def host_draw(*args, **kwargs):
        counter.paused = True
        try:
            return draw(*args, **kwargs)
        finally:
            counter.paused = False

    monkeypatch.setattr(stacked, "_draw", host_draw)
    return counter


def _reference_ops(counter: OpCounter, n_heads: int, model_class=None) -> int:
    """Ops of one step of the benchmark's stacked reference (batch labelled its plain way)."""
    model = (model_class or bench.ReferenceStack)(M, n_heads, torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):  # the optimiser's state is made at the first step
        bench.reference_stack_step(model, optimizer, generator)
    counter.counts.clear()
    with counter:
        bench.reference_stack_step(model, optimizer, generator)
    return counter.total()


def _step_ops(counter: OpCounter, task, n_heads: int, n_layers: int = 1) -> OpCounter:
    """Ops of one (unlogged, unchecked) ``train_many`` step of M models."""
    models = [
        build_model(task, d_model=32, n_heads=n_heads, n_layers=n_layers, seed=s, device="cpu")
        for s in range(M)
    ]
    configs = [TrainConfig(steps=10, batch_size=16, seed=s) for s in range(M)]
    group = stacked._Group(models, task, configs, [None] * M, list(range(M)), torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        group.step(0, 1e-3)  # the first step labels with the task's data checks
        counter.counts.clear()
        with counter:
            group.step(1, 1e-3)
    return counter


ONE_LAYER = [cls.name for cls in BUILTIN_TASKS if cls.min_layers == 1]


@pytest.mark.parametrize("n_heads", [1, 8])
@pytest.mark.parametrize("name", ONE_LAYER)
def test_a_step_issues_at_most_one_and_a_half_times_the_references_ops(counter, name, n_heads):
    reference = _reference_ops(counter, n_heads)
    assert 45 <= reference <= 75, counter.counts  # what the reference is (57 and 62 here)
    ours = _step_ops(counter, get_task(name), n_heads)
    assert ours.total() <= 1.5 * reference, (ours.total(), reference, ours.counts.most_common())


def test_the_two_layer_task_stays_within_the_reference_given_a_second_layer(counter):
    """``induction`` needs two layers and the reference has one: its bound is 1.5x the
    reference plus what a second layer adds to our own step (count_previous on two layers
    against one, the same models otherwise)."""
    reference = _reference_ops(counter, 4)
    plain = [_step_ops(counter, get_task("count_previous"), 4, n).total() for n in (1, 2)]
    second_layer = plain[1] - plain[0]
    induction = _step_ops(counter, get_task("induction"), 4, 2)
    bound = 1.5 * (reference + second_layer)
    assert induction.total() <= bound, (induction.total(), bound, induction.counts.most_common())


@pytest.mark.parametrize("name", [cls.name for cls in BUILTIN_TASKS])
def test_labelling_a_batch_is_a_few_ops_whatever_the_length(counter, name):
    """The labelling loops are gone: the same few ops at 8 and 32 positions."""
    seen = []
    for seq_len in (8, 32):
        task = get_task(name, seq_len=seq_len, d_vocab=seq_len)
        tokens = task.sample(16, torch.Generator().manual_seed(0)).tokens
        padding_mask = torch.ones_like(tokens, dtype=torch.bool)
        counter.counts.clear()
        with counter:
            stacked._label(task, tokens, padding_mask, checked=False, padded=False)
        seen.append(counter.total())
    assert seen[0] == seen[1] <= 12, (seen, counter.counts)
