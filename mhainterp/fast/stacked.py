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

Shapes: M models, B batch, T positions, d d_model, h heads, P parameters per model.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from mhainterp.config import TrainConfig
from mhainterp.fast.stacked_forward import batched_logits, batched_loss
from mhainterp.fast.stacked_params import StackedModels, check_batchable
from mhainterp.model import HookedMHATransformer
from mhainterp.tasks import Task
from mhainterp.training import (
    Run,
    TrainingDivergedError,
    _check_compatible,
    _diverged,
    evaluate,
    lr_at,
    save_run,
)
from mhainterp.validation import ParameterError

__all__ = ["BatchDivergedError", "ManyBatch", "sample_many", "train_many"]

_FREE_TRAIN_FIELDS = ("seed",)
_ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which training.train uses
_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


class BatchDivergedError(TrainingDivergedError):
    """Some models of a :func:`train_many` group diverged; the others finished.

    Attributes:
        results: One entry per model, in input order: its :class:`~mhainterp.training.Run`, or
            None for a model that diverged (its run folder, if any, holds the last good weights with
            ``eval.json`` status "diverged", exactly as :func:`~mhainterp.training.train`
            leaves it).
        messages: Input index -> the divergence message :func:`train` would have raised.
    """

    def __init__(self, results: list[Run | None], messages: dict[int, str]) -> None:
        self.results = results
        self.messages = messages
        lines = [f"model {i}: {message}" for i, message in sorted(messages.items())]
        super().__init__(f"{len(messages)} of {len(results)} models diverged:\n" + "\n".join(lines))


@dataclass
class ManyBatch:
    """Batches of ``M`` models stacked: tokens/mask/padding ``[M, B, T]``, targets
    ``[M, B, T(, k)]``."""

    tokens: Tensor
    targets: Tensor
    mask: Tensor
    padding_mask: Tensor


def sample_many(task: Task, n: int, generators: Sequence[torch.Generator]) -> ManyBatch:
    """One batch per generator, equal to ``task.sample(n, generator)`` for each, stacked.

    The random draws are made generator by generator, exactly as :meth:`Task.sample` makes
    them; when the task does not override ``sample``, the (deterministic) labelling is done once
    for all models together.

    Example:
        >>> gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
        >>> sample_many(get_task("reverse"), 8, gens).tokens.shape  # doctest: +SKIP
        torch.Size([2, 8, 16])
    """
    M = len(generators)
    if type(task).sample is not Task.sample:
        batches = [task.sample(n, generator=g) for g in generators]
        return ManyBatch(*(torch.stack([getattr(b, f) for b in batches]) for f in _BATCH_FIELDS))
    token_rows, length_rows = [], []
    for g in generators:
        lengths = task.sample_lengths(n, g)  # the same draws, in the same order, as Task.sample
        token_rows.append(task.sample_tokens(n, lengths, g).long())
        length_rows.append(lengths)
    tokens = torch.cat(token_rows)  # (M * n, T)
    padding_mask = torch.arange(task.seq_len)[None, :] < torch.cat(length_rows)[:, None]
    if task.pad_token is not None:
        tokens = tokens.masked_fill(~padding_mask, task.pad_token)
    targets, mask = task.targets_for(tokens, padding_mask)

    def split(x: Tensor) -> Tensor:
        return x.view(M, n, *x.shape[1:])

    return ManyBatch(split(tokens), split(targets), split(mask), split(padding_mask))


_BATCH_FIELDS = ("tokens", "targets", "mask", "padding_mask")


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


class _Group:
    """The mutable state of one :func:`train_many` call (rows = models still training)."""

    def __init__(self, models, task, configs, run_dirs, order):
        self.task = task
        self.config = configs[order[0]]
        self.index = list(order)  # row -> input index
        self.models = models
        self.configs = configs
        self.run_dirs = run_dirs
        self.stack = StackedModels.from_models([models[i] for i in order])
        self.exp_avg = torch.zeros_like(self.stack.flat)
        self.exp_avg_sq = torch.zeros_like(self.stack.flat)
        self.generators = [torch.Generator().manual_seed(configs[i].seed) for i in order]
        self.last_good = self.stack.flat.clone()
        self.loss_sum = torch.zeros(len(order), dtype=torch.float64)
        self.n_interval = 0
        self.rows: dict[int, list[dict[str, Any]]] = {i: [] for i in order}
        self.messages: dict[int, str] = {}

    def drop(self, keep: list[int]) -> None:
        """Keep only the given rows (models that diverged leave the group)."""
        index = torch.as_tensor(keep, dtype=torch.long)
        self.stack = self.stack.select(keep)
        self.exp_avg = self.exp_avg.index_select(0, index)
        self.exp_avg_sq = self.exp_avg_sq.index_select(0, index)
        self.last_good = self.last_good.index_select(0, index)
        self.loss_sum = self.loss_sum.index_select(0, index)
        self.generators = [self.generators[r] for r in keep]
        self.index = [self.index[r] for r in keep]

    def diverge(self, bad: list[int], step: int, losses: list[float]) -> None:
        """Restore the last good weights of diverged rows, save them as train() does."""
        for row in bad:
            i = self.index[row]
            model = self.models[i]
            self.stack.write_to(row, model, self.last_good)
            try:
                _diverged(
                    model,
                    self.task,
                    self.configs[i],
                    self.rows[i],
                    step,
                    losses[row],
                    self.run_dirs[i],
                )
            except TrainingDivergedError as error:
                self.messages[i] = str(error)
        self.drop([r for r in range(len(self.index)) if r not in bad])

    def log(self, step: int, lr: float, norms: list[float]) -> None:
        means = (self.loss_sum / self.n_interval).tolist()
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
        self.loss_sum.zero_()
        self.n_interval = 0
        self.last_good.copy_(self.stack.flat)

    def step(self, step: int) -> None:
        config, stack = self.config, self.stack
        lr = lr_at(step, config)
        batch = sample_many(self.task, config.batch_size, self.generators)
        logits = batched_logits(stack, batch.tokens, _padding(batch))
        losses = batched_loss(logits, batch.targets, batch.mask, stack.cfg.d_vocab_out)
        values = losses.tolist()
        bad = [row for row, v in enumerate(values) if not math.isfinite(v)]
        total = losses.sum() if not bad else torch.where(losses.isfinite(), losses, 0.0).sum()
        with warnings.catch_warnings():
            # The gradients are row slices of one buffer (strided by design).
            warnings.filterwarnings("ignore", message=".*gradient layout contract.*")
            total.backward()
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
        self.loss_sum += torch.tensor(values, dtype=torch.float64)
        self.n_interval += 1
        if bad:
            # Like train(): the model stops at the step whose loss was not finite.
            self.diverge(bad, step, values)
            if not self.index:
                return
            norms = norms[[r for r in range(len(values)) if r not in bad]]
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            self.log(step, lr, norms.tolist())


def _padding(batch: ManyBatch) -> Tensor | None:
    # Fixed-length tasks have no padding; skipping the mask keeps the fast path.
    return None if bool(batch.padding_mask.all()) else batch.padding_mask


def train_many(
    models: Sequence[HookedMHATransformer],
    task: Task,
    configs: TrainConfig | Sequence[TrainConfig] | None = None,
    *,
    run_dirs: Sequence[str | os.PathLike[str] | None] | None = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> list[Run]:
    """Train several models together; each ends as if trained alone by :func:`train`.

    Args:
        models: Models that fit ``task`` and differ at most in ``n_heads`` and ``seed``
            (see :func:`check_batchable`). They are trained in place, like :func:`train` does.
        task: The task all models learn.
        configs: One :class:`TrainConfig` per model (they may differ only in ``seed``, the
            data-order seed), or one config for all (then all models see the same data).
        run_dirs: One run folder (or None) per model; each is written by
            :func:`~mhainterp.training.save_run` exactly as :func:`train` writes it.
        progress: Show a tqdm progress bar.
        on_step: Called after every step with the number of models that took it (for
            progress reporting from worker processes).

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
    check_batchable(models)
    for model in models:
        _check_compatible(model, task)
    config = _check_configs(configs)
    # Rows sorted by head count, so each head count's attention core is one contiguous slice.
    order = sorted(range(len(models)), key=lambda i: models[i].cfg.n_heads)
    group = _Group(models, task, configs, run_dirs, order)
    heads = sorted({m.cfg.n_heads for m in models})
    bar = tqdm(
        range(config.steps),
        desc=f"train {task.name} {len(models)} models h={heads}",
        disable=not progress,
        leave=False,
    )
    for step in bar:
        group.step(step)
        if on_step is not None:
            on_step(len(group.index))
        if not group.index:
            break
    return _finish(group, models, task, configs, run_dirs)


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
