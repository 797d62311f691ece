"""Train a group of same-shaped models at once: one batched step instead of one step per model.

The models of a head-count sweep are tiny, so on a CPU the per-operation overhead of PyTorch,
not arithmetic, sets the speed of training them one by one. :func:`train_many` trains ``M``
models together: their parameters live in one ``[M, P]`` buffer, every matmul of the forward and
backward pass is one ``bmm`` over the model axis, the per-model gradient norms (for clipping)
are one ``norm(dim=1)`` and AdamW is a handful of element-wise ops over the whole buffer.
Layer 0's per-token work (LayerNorm, the Q/K/V projection) depends only on the (token,
position) pair, so it is computed on the ``d_vocab * T`` table of pairs and gathered: with
10 tokens and batch 128 that is 13x fewer rows for the largest matmul of the model.

The result is the same as training each model alone with :func:`mhainterp.training.train`
(to float rounding): each model draws its own data stream from a generator seeded with its
``TrainConfig.seed``, follows the same learning-rate schedule, clips by its *own* gradient
norm, logs the same ``metrics.csv`` rows and is evaluated by the same
:func:`~mhainterp.training.evaluate`. Models with different head counts share one step: the
fused Q/K/V/O weights have the same shape for every ``n_heads``; only the split into heads (the
attention core) is done per head count.

Devices: the group trains where its models are (``device=``). Each model's batches are drawn
from its own CPU ``torch.Generator``, so the same seeds give the same data on every device, and
moved once per step (pinned and asynchronous on CUDA). The step reads nothing back to the host:
losses, their sums and the divergence flags stay on the device, and the host looks at them only
every ``log_every`` steps, when ``metrics.csv`` gets its rows. On CUDA the matmuls run in full
fp32 unless ``tf32=True`` (see :func:`train_many`).

Shapes: M models, B batch, T positions, d d_model, h heads, P parameters per model.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.config import TrainConfig
from mhainterp.errors import BatchDivergedError, TrainingDivergedError
from mhainterp.fast.stacked_buffers import Workspace
from mhainterp.fast.stacked_checkpoint import GroupCheckpoint
from mhainterp.fast.stacked_forward import batched_logits, batched_loss
from mhainterp.fast.stacked_params import StackedModels, check_batchable
from mhainterp.model import HookedMHATransformer
from mhainterp.model.loss import IGNORE_INDEX
from mhainterp.runtime import DRAW_DEVICE, available_cpus, model_device, resolve_device
from mhainterp.tasks import Task
from mhainterp.training import (
    Run,
    check_compatible,
    evaluate,
    lr_at,
    save_diverged,
    save_run,
)
from mhainterp.validation import ParameterError

__all__ = ["ManyBatch", "sample_many", "train_many"]

_FREE_TRAIN_FIELDS = ("seed",)
_ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which training.train uses
_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


@dataclass
class ManyBatch:
    """Batches of ``M`` models stacked: tokens/mask/padding ``[M, B, T]``, targets
    ``[M, B, T(, k)]``; ``padded`` is False when every sequence has the full length (the
    forward then skips the padding mask, as :func:`~mhainterp.training.train` does);
    ``all_scored`` is True when every (position, target) is scored (known without looking)."""

    tokens: Tensor
    targets: Tensor
    mask: Tensor
    padding_mask: Tensor
    padded: bool = True
    all_scored: bool = False


def sample_many(
    task: Task,
    n: int,
    generators: Sequence[torch.Generator],
    device: torch.device | str | None = None,
    *,
    checked: bool = True,
) -> ManyBatch:
    """One batch per generator, equal to ``task.sample(n, generator)`` for each, stacked, on
    ``device``.

    The random draws are made on the CPU, generator by generator, exactly as
    :meth:`Task.sample` makes them, so the same generators give the same batch on every device;
    the tokens are then moved once (pinned and asynchronous on CUDA). When the task does not
    override ``sample``, the (deterministic) labelling is done once for all models together, on
    ``device``.

    Args:
        task: The task.
        n: Sequences per generator.
        generators: One CPU generator per model.
        device: Where the batch goes (None: the CPU, where it is drawn).
        checked: Label through :meth:`Task.targets_for` with its data checks; False skips the
            checks that read values back to the host (a training step calls them once, on its
            first batch; see :func:`_label`).

    Example:
        >>> from mhainterp.tasks import get_task
        >>> gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
        >>> batch = sample_many(get_task("reverse"), 8, gens)
        >>> batch.tokens.shape, batch.padded
        (torch.Size([2, 8, 16]), False)
    """
    device = torch.device(DRAW_DEVICE if device is None else device)
    if type(task).sample is not Task.sample:
        batches = [task.sample(n, generator=g) for g in generators]
        fields = [torch.stack([getattr(b, f) for b in batches]) for f in _BATCH_FIELDS]
        padded = not bool(fields[-1].all())
        return ManyBatch(*(_to_device(x, device) for x in fields), padded=padded)
    M, T = len(generators), task.seq_len
    tokens, lengths = _draw(task, n, generators, device.type == "cuda", _draw_threads(device))
    padded = task.variable_length and bool((lengths < T).any())
    tokens = _to_device(tokens, device)
    if task.variable_length:
        lengths = _to_device(lengths, device)
        padding_mask = torch.arange(T, device=device)[None, :] < lengths[:, None]  # (M * n, T)
    else:  # every sequence is seq_len long: no lengths to move
        padding_mask = torch.ones((M * n, T), dtype=torch.bool, device=device)
    if task.pad_token is not None:
        tokens = tokens.masked_fill(~padding_mask, task.pad_token)
    targets, mask = _label(task, tokens, padding_mask, checked, padded)
    all_scored = mask is padding_mask and not padded  # _label: every position of every row

    def split(x: Tensor) -> Tensor:
        return x.view(M, n, *x.shape[1:])

    fields = (split(tokens), split(targets), split(mask), split(padding_mask))
    return ManyBatch(*fields, padded=padded, all_scored=all_scored)


_BATCH_FIELDS = ("tokens", "targets", "mask", "padding_mask")


def _draw(
    task: Task, n: int, generators: Sequence[torch.Generator], pin: bool, threads: int = 1
) -> tuple[Tensor, Tensor]:
    """Each generator's lengths and tokens, the same draws in the same order as
    :meth:`Task.sample`, written into one buffer on the CPU: ``[M * n, T]`` tokens and
    ``[M * n]`` lengths (in pinned memory when ``pin``, so that the copy to the GPU does not
    wait for the host).

    On a GPU this loop is the part of a step the host keeps: one draw per generator, about
    13-35 us per model-step on a busy 2-core CPU, as long as the reference's whole GPU step
    at h = 1 (issue 30: 40,000 model-steps/s). So a task that keeps :class:`Task`'s own
    uniform draws gets them straight into the buffer (``randint(..., out=)``: the same
    numbers, without a tensor per model and the copy that joins them; 0.73-0.97x the time),
    and ``threads > 1`` splits the generators into contiguous spans drawn by a thread each
    (torch releases the GIL while it draws; every generator stays in one thread, so the
    numbers do not depend on ``threads``).
    """
    M, T = len(generators), task.seq_len
    where = {"dtype": torch.long, "device": DRAW_DEVICE, "pin_memory": pin}
    tokens = torch.empty((M, n, T), **where)
    lengths = torch.empty((M, n), **where)
    draw = _draw_uniform if _uniform_draws(task) else _draw_with_task

    def span(bounds: tuple[int, int]) -> None:
        for m in range(*bounds):
            draw(task, n, generators[m], tokens[m], lengths[m])

    spans = _spans(M, threads)
    if len(spans) == 1:
        span(spans[0])
    else:
        list(_draw_pool(len(spans)).map(span, spans))  # list(): raise a thread's error here
    return tokens.view(M * n, T), lengths.view(M * n)


def _draw_uniform(task: Task, n: int, g: torch.Generator, tokens: Tensor, lengths: Tensor) -> None:
    """:meth:`Task.sample_lengths` and :meth:`Task.sample_tokens`' draws, into ``lengths`` and
    ``tokens`` (``[n]``, ``[n, T]``)."""
    if task.variable_length:  # Task.sample_lengths draws only then
        torch.randint(task.min_len, task.seq_len + 1, (n,), generator=g, out=lengths)
    else:
        lengths.fill_(task.seq_len)
    torch.randint(0, task.d_vocab, (n, task.seq_len), generator=g, out=tokens)


def _draw_with_task(
    task: Task, n: int, g: torch.Generator, tokens: Tensor, lengths: Tensor
) -> None:
    """The task's own ``sample_lengths`` and ``sample_tokens``, as :meth:`Task.sample` calls
    them, copied into ``lengths`` and ``tokens``."""
    lengths.copy_(task.sample_lengths(n, g))
    tokens.copy_(task.sample_tokens(n, lengths, g))


def _uniform_draws(task: Task) -> bool:
    """Whether ``task`` draws lengths and tokens with :class:`Task`'s own methods (uniform
    lengths in ``[min_len, seq_len]``, uniform tokens in ``[0, d_vocab)``)."""
    own = type(task)
    return own.sample_lengths is Task.sample_lengths and own.sample_tokens is Task.sample_tokens


_MIN_SPAN = 64
"""Fewest generators a draw thread takes: below it the hand-off costs more than it saves."""


def _spans(M: int, threads: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of at most ``threads`` contiguous spans of ``M`` generators, each of at
    least :data:`_MIN_SPAN` (one span when ``M`` is small).

    Example:
        >>> _spans(900, 4), _spans(100, 4)
        ([(0, 225), (225, 450), (450, 675), (675, 900)], [(0, 100)])
    """
    k = max(1, min(threads, M // _MIN_SPAN))
    bounds = [round(M * i / k) for i in range(k + 1)]
    return list(itertools.pairwise(bounds))


@functools.lru_cache(maxsize=4)
def _draw_pool(threads: int) -> ThreadPoolExecutor:
    """The threads that draw a GPU group's batches (made once per count, idle between steps)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="mhainterp-draw")


def _draw_threads(device: torch.device) -> int:
    """Threads that draw a step's batches: on CUDA, where the host's draw is on the step's
    critical path, up to 8 of this process's CPUs, one left for launching the GPU's work;
    elsewhere 1 (on the CPU the cores are training)."""
    if device.type != "cuda":
        return 1
    return max(1, min(8, len(available_cpus()) - 1))


def _to_device(x: Tensor, device: torch.device) -> Tensor:
    """``x`` (drawn on the CPU) on ``device``: asynchronous from pinned memory on CUDA."""
    if x.device == device:
        return x
    if device.type == "cuda":
        return (x if x.is_pinned() else x.pin_memory()).to(device, non_blocking=True)
    return x.to(device)


def _label(
    task: Task, tokens: Tensor, padding_mask: Tensor, checked: bool, padded: bool = True
) -> tuple[Tensor, Tensor]:
    """Targets and scored mask of ``tokens``, as :meth:`Task.targets_for` returns them.

    ``checked=False`` makes the same labels without ``targets_for``'s data checks (token and
    target ranges), which read values back to the host and so would stall a GPU step: the
    task's ``compute_targets``, the mask joined with the padding and unscored targets set to
    ``IGNORE_INDEX``, as :meth:`Task.label_tokens` does (``tests/test_batched.py`` proves the
    two equal for every built-in task). A task that overrides ``targets_for`` or
    ``label_tokens`` is always labelled through them. Where the task scores exactly the real
    positions (its mask *is* ``padding_mask``), the join is skipped, and so is the fill when
    nothing is padded (``padded=False``): the same labels, up to three ops fewer a step.
    """
    own_labels = (
        type(task).targets_for is not Task.targets_for
        or type(task).label_tokens is not Task.label_tokens
    )
    if checked or own_labels:
        return task.targets_for(tokens, padding_mask)
    targets, mask = task.compute_targets(tokens, padding_mask)
    if mask is padding_mask:  # every real position scored
        if not padded:  # ... and every position is real: nothing to ignore
            return targets.long(), mask
    else:
        mask = mask.bool() & padding_mask  # (N, T)
    scored = mask if task.n_targets == 1 else mask[:, :, None].expand_as(targets)
    return targets.long().masked_fill(~scored, IGNORE_INDEX), mask


# ----- the optimiser -----------------------------------------------------------------------------
@torch.no_grad()
def _clip_per_model(grad: Float[Tensor, "M P"], max_norm: float | None) -> Float[Tensor, " M"]:
    """Scale each row to norm <= max_norm as clip_grad_norm_ does; return the norms before."""
    norms = torch.linalg.vector_norm(grad, dim=1)  # (M,)
    if max_norm is not None:
        coef = (max_norm / (norms + _CLIP_EPS)).clamp(max=1.0)
        grad.mul_(coef[:, None])
    return norms


@torch.no_grad()
def _adamw_step(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
) -> None:
    """torch.optim.AdamW's (single-tensor, CPU default) update, over the whole buffer at once.

    AdamW is element-wise, so one update of the ``[M, P]`` buffer is ``M`` independent AdamW
    updates; the same ops in the same order as ``torch.optim.adam._single_tensor_adam``.
    """
    beta1, beta2 = betas
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1 ** float(step)
    bias_correction2 = 1 - beta2 ** float(step)
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(_ADAM_EPS)
    param.addcdiv_(exp_avg, denom, value=-step_size)


# ----- training ----------------------------------------------------------------------------------
def _check_configs(configs: Sequence[TrainConfig]) -> TrainConfig:
    reference = {k: v for k, v in configs[0].to_dict().items() if k not in _FREE_TRAIN_FIELDS}
    for i, config in enumerate(configs[1:], start=1):
        if not isinstance(config, TrainConfig):
            raise TypeError(f"configs[{i}] must be a TrainConfig, got {type(config).__name__}")
        other = config.to_dict()
        diff = sorted(k for k in reference if reference[k] != other[k])
        if diff:
            raise ParameterError(
                f"configs[{i}] is invalid: models trained together may differ only in "
                f"{list(_FREE_TRAIN_FIELDS)}, but configs[{i}] differs from configs[0] in {diff}"
            )
    return configs[0]


def _training_device(
    models: Sequence[HookedMHATransformer], device: torch.device | str | None
) -> torch.device:
    """Where the group trains: ``device``, or (None) where the models' parameters are; the
    models must all be on one device either way."""
    devices = sorted({str(model_device(model)) for model in models})
    if len(devices) > 1:
        raise ParameterError(
            f"models is invalid: models on one device (a group trains in one place), got models "
            f"on {devices}; move them with model.to(device) first"
        )
    return model_device(models[0]) if device is None else resolve_device(device)


def _sum_dtype(device: torch.device) -> torch.dtype:
    """Loss sums in float64, as :func:`train` sums Python floats (MPS has no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _interval_means(losses: np.ndarray, dtype: torch.dtype) -> list[float]:
    """Each row's mean of ``losses`` ``[steps, M]`` (one logging interval, on the host): the
    running sum ``0 + l_1 + l_2 + ...`` in ``dtype``, step by step in order
    (``np.add.accumulate`` adds down the steps one at a time: the same IEEE additions a
    running sum on the device makes, without its two ops a step), over the step count.

    Example:
        >>> _interval_means(np.array([[1.0, -0.0], [2.0, -0.0]], dtype=np.float32), torch.float64)
        [1.5, 0.0]
    """
    host = losses.astype(np.dtype(str(dtype).removeprefix("torch.")))
    start = np.zeros((1, host.shape[1]), dtype=host.dtype)  # 0 + l_1, as the sum starts
    sums = np.add.accumulate(np.concatenate([start, host]), axis=0)[-1]
    return (sums / host.dtype.type(len(host))).tolist()


@contextlib.contextmanager
def _matmul_tf32(device: torch.device, allow: bool) -> Iterator[None]:
    """On CUDA, TF32 matmuls inside the block as ``allow`` says (restored after); elsewhere
    nothing."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class _Group:
    """The mutable state of one :func:`train_many` call (rows = models still training).

    Everything a step touches lives on the training device. A model whose loss stops being
    finite keeps training (on its own rows: no op mixes models) until the end of the logging
    interval, when the host looks: it then leaves with the last good weights and the message of
    the step where its loss first went bad, as :func:`train` leaves such a model.
    """

    def __init__(self, models, task, configs, run_dirs, order, device):
        self.task = task
        self.device = device
        self.config = configs[order[0]]
        self.index = list(order)  # row -> input index
        self.models = models
        self.configs = configs
        self.run_dirs = run_dirs
        self.stack = StackedModels.from_models([models[i] for i in order])
        # The big activations go to buffers kept from step to step where the allocator gives
        # fresh pages (the CPU: page-faulted each step); CUDA's and MPS's caching allocators
        # already reuse their blocks, and CUDA's gathers keep their deterministic backward.
        self.work = None if device.type in ("cuda", "mps") else Workspace()
        self.exp_avg = torch.zeros_like(self.stack.flat)
        self.exp_avg_sq = torch.zeros_like(self.stack.flat)
        self.generators = [torch.Generator().manual_seed(configs[i].seed) for i in order]
        self.last_good = self.stack.flat.clone()
        M = len(order)
        self.sum_dtype = _sum_dtype(device)
        # each step's losses of the current logging interval, read at its end
        interval = min(self.config.log_every, self.config.steps)
        self.losses = torch.zeros(interval, M, dtype=self.stack.flat.dtype, device=device)
        self.n_interval = 0
        self.n_steps = 0
        self.rows: dict[int, list[dict[str, Any]]] = {i: [] for i in order}
        self.messages: dict[int, str] = {}

    def drop(self, keep: list[int]) -> None:
        """Keep only the given rows (models that diverged leave the group)."""
        index = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        self.stack = self.stack.select(keep)
        for name in ("exp_avg", "exp_avg_sq", "last_good"):
            setattr(self, name, getattr(self, name).index_select(0, index))
        self.losses = self.losses.index_select(1, index)
        self.generators = [self.generators[r] for r in keep]
        self.index = [self.index[r] for r in keep]

    def diverge(self, bad: dict[int, tuple[int, float]]) -> None:
        """Restore the last good weights of diverged rows (row -> the step and loss where its
        loss went bad) and save them as train() does."""
        for row, (step, loss) in bad.items():
            i = self.index[row]
            model = self.models[i]
            self.stack.write_to(row, model, self.last_good)
            try:
                save_diverged(
                    model, self.task, self.configs[i], self.rows[i], step, loss, self.run_dirs[i]
                )
            except TrainingDivergedError as error:
                self.messages[i] = str(error)
        self.drop([r for r in range(len(self.index)) if r not in bad])

    def step(self, step: int, lr: float) -> Tensor:
        """One optimiser step of every row; returns each row's gradient norm ``[M]``, before
        clipping. Nothing is read back to the host."""
        config, stack = self.config, self.stack
        # The first batch is labelled with the task's data checks; later ones skip them.
        batch = sample_many(
            self.task, config.batch_size, self.generators, self.device, checked=self.n_steps == 0
        )
        pad = batch.padding_mask if batch.padded else None
        logits = batched_logits(stack, batch.tokens, pad, work=self.work)
        n_scored = None
        if batch.all_scored:  # the same count every step: a constant of the group
            count = batch.targets[0].numel()

            def full() -> Tensor:
                return torch.full((len(stack),), count, dtype=torch.int64, device=self.device)

            n_scored = stack.constant(("n_scored", count), full)
        V_out = stack.cfg.d_vocab_out
        losses = batched_loss(
            logits, batch.targets, batch.mask, V_out, labelled=True, n_scored=n_scored
        )  # (M,)
        self.losses[self.n_interval].copy_(losses.detach())  # (M,): the host reads them at
        # the end of the interval (its mean loss, and the first step of a loss not finite)
        with warnings.catch_warnings():
            # The gradients are row slices of one buffer (strided by design).
            warnings.filterwarnings("ignore", message=".*gradient layout contract.*")
            losses.sum().backward()  # rows are independent: a bad row's NaNs stay in its row
        norms = _clip_per_model(stack.grad, config.grad_clip)
        _adamw_step(
            stack.flat,
            stack.grad,
            self.exp_avg,
            self.exp_avg_sq,
            step + 1,
            lr,
            config.betas,
            config.weight_decay,
        )
        stack.grad.zero_()
        self.n_interval += 1
        self.n_steps += 1
        return norms

    @staticmethod
    def _first_bad(step: int, history: np.ndarray) -> dict[int, tuple[int, float]]:
        """Each row whose loss stopped being finite in ``history`` ``[steps, M]``, the interval
        ending at ``step`` -> the first such step and its loss."""
        bad = {}
        first_step = step + 1 - len(history)
        for row in np.flatnonzero(~np.isfinite(history).all(axis=0)).tolist():
            i = int(np.flatnonzero(~np.isfinite(history[:, row]))[0])
            bad[row] = (first_step + i, float(history[i, row]))
        return bad

    def end_interval(self, step: int, lr: float, norms: Tensor) -> None:
        """The host looks (once per ``log_every`` steps): diverged rows leave, the others get
        their ``metrics.csv`` row (and an evaluation when ``eval_every`` says so)."""
        history = self.losses[: self.n_interval].to(DRAW_DEVICE).numpy()  # (steps, M)
        means = _interval_means(history, self.sum_dtype)
        bad = self._first_bad(step, history)
        if bad:
            self.diverge(bad)
            if not self.index:
                return
            keep = [row for row in range(len(means)) if row not in bad]
            norms, means = norms[keep], [means[row] for row in keep]
        self.log(step, lr, norms.tolist(), means)

    def log(self, step: int, lr: float, norms: list[float], means: list[float]) -> None:
        config = self.config
        do_eval = config.eval_every and (
            (step + 1) % config.eval_every == 0 or step + 1 == config.steps
        )
        for row, i in enumerate(self.index):
            entry = {"step": step + 1, "loss": means[row], "lr": lr, "grad_norm": norms[row]}
            if do_eval:
                self.stack.write_to(row, self.models[i])
                metrics = evaluate(self.models[i], self.task, n_eval=config.n_eval)
                entry.update(eval_loss=metrics["loss"], eval_accuracy=metrics["accuracy"])
            self.rows[i].append(entry)
        self.n_interval = 0
        self.last_good.copy_(self.stack.flat)


def train_many(
    models: Sequence[HookedMHATransformer],
    task: Task,
    configs: TrainConfig | Sequence[TrainConfig] | None = None,
    *,
    run_dirs: Sequence[str | os.PathLike[str] | None] | None = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
    device: torch.device | str | None = None,
    tf32: bool = False,
) -> list[Run]:
    """Train several models together; each ends as if trained alone by :func:`train`.

    Args:
        models: Models that fit ``task`` and differ at most in ``n_heads`` and ``seed``
            (see :func:`check_batchable`), all on one device. They are trained in place, like
            :func:`train` does, and handed back on the training device.
        task: The task all models learn.
        configs: One :class:`TrainConfig` per model (they may differ only in ``seed``, the
            data-order seed), or one config for all (then all models see the same data).
        run_dirs: One run folder (or None) per model; each is written by
            :func:`~mhainterp.training.save_run` exactly as :func:`train` writes it.
        progress: Show a tqdm progress bar.
        on_step: Called after every step with the number of models that took it (for
            progress reporting from worker processes).
        device: Where to train (``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``auto``); None: where
            the models' parameters are. Models elsewhere are moved there first.
        tf32: On CUDA, let the step's matmuls use TF32 (about 10 mantissa bits: logits differ
            from fp32's by ~1e-3 relative). Off by default: these matmuls are too small for
            the tensor cores to set the speed, and in full fp32 a CUDA run agrees with the CPU
            run within the tolerance ``tests/test_gpu.py`` states. Evaluations are always fp32.

    Returns:
        One :class:`~mhainterp.training.Run` per model, in input order.

    Raises:
        BatchDivergedError: some models' loss became NaN/inf. The others finished (their
            results are in ``error.results``); each diverged model holds, and its run folder
            saves, its last good weights, with the message :func:`train` would have raised.

    Example:
        >>> from mhainterp.config import TrainConfig
        >>> from mhainterp.tasks import get_task
        >>> from mhainterp.training import build_model
        >>> task = get_task("count_previous")
        >>> models = [build_model(task, n_heads=h, seed=s) for h in (1, 4) for s in (0, 1)]
        >>> configs = [TrainConfig(steps=20, seed=m.cfg.seed) for m in models]
        >>> results = train_many(models, task, configs, progress=False)
        >>> len(results)
        4
    """
    models = list(models)
    if configs is None:
        configs = TrainConfig()
    configs = [configs] * len(models) if isinstance(configs, TrainConfig) else list(configs)
    run_dirs = [None] * len(models) if run_dirs is None else list(run_dirs)
    for name, values in (("configs", configs), ("run_dirs", run_dirs)):
        if len(values) != len(models):
            raise ParameterError(
                f"{name} is invalid: one entry per model ({len(models)}), got {len(values)}"
            )
    device = _training_device(models, device)
    check_batchable(models)
    for model in models:
        check_compatible(model, task)
    config = _check_configs(configs)
    if device != model_device(models[0]):
        for model in models:
            model.to(device)
    # Rows sorted by head count, so each head count's attention core is one contiguous slice.
    order = sorted(range(len(models)), key=lambda i: models[i].cfg.n_heads)
    group = _Group(models, task, configs, run_dirs, order, device)
    checkpoint = GroupCheckpoint(group)
    start = checkpoint.restore()  # 0 unless an interrupted call of these runs saved its state
    heads = sorted({m.cfg.n_heads for m in models})
    bar = tqdm(
        range(start, config.steps),
        desc=f"train {task.name} {len(models)} models h={heads}",
        disable=not progress,
        leave=False,
    )
    for step in bar:
        lr = lr_at(step, config)
        with _matmul_tf32(device, tf32):
            norms = group.step(step, lr)
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            group.end_interval(step, lr, norms)
            checkpoint.save_if_due(step + 1)
        if on_step is not None:
            on_step(len(group.index))
        if not group.index:
            break
    try:
        results = _finish(group, models, task, configs, run_dirs)
    except BatchDivergedError:  # every run folder is written, the diverged ones too
        checkpoint.remove()
        raise
    checkpoint.remove()  # a failed write (a full disk) keeps it: the rerun resumes
    return results


def _finish(group: _Group, models, task, configs, run_dirs) -> list[Run]:
    results: list[Run | None] = [None] * len(models)
    for row, i in enumerate(group.index):
        model = models[i]
        group.stack.write_to(row, model)
        model.eval()
        metrics_df = pd.DataFrame(group.rows[i])
        eval_metrics = evaluate(model, task, n_eval=configs[i].n_eval)
        eval_metrics["final_train_loss"] = float(metrics_df["loss"].iloc[-1])
        eval_metrics["status"] = "finished"
        saved: Path | None = None
        if run_dirs[i] is not None:
            saved = save_run(model, task, run_dirs[i], configs[i], metrics_df, eval_metrics)
        results[i] = Run(saved, model, task, model.cfg, configs[i], metrics_df, eval_metrics)
    if group.messages:
        raise BatchDivergedError(results, group.messages)
    return results  # type: ignore[return-value]
