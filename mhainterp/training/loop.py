"""Train one model on one task: :func:`build_model` shapes a model for the task, :func:`train`
trains it with AdamW (resuming from its checkpoint) and evaluates it, :func:`save_diverged`
ends a run whose loss went bad.

The stacked trainer (:mod:`mhainterp.fast.stacked`) shares :func:`lr_at`,
:func:`check_compatible` and :func:`save_diverged`, so a run reads the same from both.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from mhainterp.config import ModelConfig, TrainConfig
from mhainterp.errors import TrainingDivergedError
from mhainterp.io import allocation_failures, ensure_writable_dir, require_memory
from mhainterp.model import HookedMHATransformer
from mhainterp.runs import check_free_folder, run_status
from mhainterp.runtime import model_device, resolve_device, terminate_as_interrupt, work_threads
from mhainterp.tasks import Task
from mhainterp.training.checkpoints import Checkpoint
from mhainterp.training.evaluation import evaluate
from mhainterp.training.identity import run_config_differences, saved_config_matches
from mhainterp.training.memory import count_parameters, itemsize, training_memory, training_what
from mhainterp.training.run_folder import Run, save_run
from mhainterp.validation import ParameterError, check_int, invalid

__all__ = [
    "build_model",
    "check_compatible",
    "lr_at",
    "save_diverged",
    "train",
]


def build_model(
    task: Task, *, device: str | torch.device | None = None, **model_overrides: Any
) -> HookedMHATransformer:
    """A model shaped for ``task`` (context, vocabularies, targets, causality, min layers),
    on ``device`` (None or ``"auto"``: decided by :func:`mhainterp.runtime.resolve_device`).
    The weights are the same on every device: they are drawn on the CPU from the config's seed,
    then moved.

    Example:
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("reverse", seq_len=16, d_vocab=10)
        >>> build_model(task, d_model=64, n_heads=8, seed=0).cfg.d_head
        8
    """
    kwargs = {**task.model_kwargs(), **model_overrides, "device": str(resolve_device(device))}
    if kwargs["n_layers"] < task.min_layers:
        raise invalid(
            "n_layers",
            kwargs["n_layers"],
            f"an integer >= {task.min_layers} for task {task.name!r}",
        )
    config = ModelConfig(**kwargs)
    n_params = count_parameters(config)
    require_memory(n_params * itemsize(config), f"a model of {n_params:,} parameters")
    with allocation_failures(f"building a model of {n_params:,} parameters"):
        return HookedMHATransformer(config)


def lr_at(step: int, config: TrainConfig) -> float:
    """Learning rate used at optimiser step ``step`` (0-based): linear warm-up, then schedule."""
    if config.warmup_steps and step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return config.lr
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = 0.1 * config.lr
    return floor + (config.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def check_compatible(model: HookedMHATransformer, task: Task) -> None:
    """Raise a ParameterError naming every way ``model`` does not fit ``task`` (context
    length, input and output vocabulary, number of targets); used by :func:`train` and the
    batched trainer.
    """
    cfg = model.cfg
    problems = []
    if cfg.n_ctx < task.seq_len:
        problems.append(f"n_ctx={cfg.n_ctx} < task seq_len={task.seq_len}")
    if cfg.d_vocab < task.d_vocab_in:
        problems.append(f"d_vocab={cfg.d_vocab} < task input vocabulary {task.d_vocab_in}")
    if cfg.d_vocab_out < task.d_vocab_out:
        problems.append(f"d_vocab_out={cfg.d_vocab_out} < task classes {task.d_vocab_out}")
    if cfg.n_targets != task.n_targets:
        problems.append(f"n_targets={cfg.n_targets} != task n_targets={task.n_targets}")
    if problems:
        raise ParameterError(
            f"model is invalid: a model that fits task {task.name!r}, got "
            + "; ".join(problems)
            + ". Build it with mhainterp.training.build_model(task, ...)"
        )
    if cfg.causal and not task.causal:  # allowed (an experiment may want it), never silent
        warnings.warn(
            f"a causal model on task {task.name!r}, whose targets need later positions too: "
            "it cannot see them, so it cannot solve the task (--bidirectional, or "
            "build_model's default, lets it)",
            stacklevel=2,
        )


def _signals_and_memory(function: Callable[..., Run]) -> Callable[..., Run]:
    """Around :func:`train`: SIGTERM ends it as Ctrl-C does (:func:`terminate_as_interrupt`),
    and a failed allocation is one line (:func:`mhainterp.io.allocation_failures`)."""

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Run:
        with terminate_as_interrupt(), allocation_failures("training"):
            return function(*args, **kwargs)

    return guarded


@_signals_and_memory
def train(
    model: HookedMHATransformer,
    task: Task,
    config: TrainConfig | None = None,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    threads: int | None = None,
    resume: bool = True,
    overwrite: bool = False,
) -> Run:
    """Train ``model`` on fresh batches of ``task`` with AdamW; evaluate; optionally save.

    The data order comes from ``config.seed`` alone (a ``torch.Generator``); the initial weights
    from ``model.cfg.seed``. The same two seeds give identical loss curves and weights.

    With ``run_dir``, an interrupted run resumes: every
    :data:`~mhainterp.training.CHECKPOINT_SECONDS` (at a logged step) the training state is
    saved to ``run_dir/checkpoint.pt``, and a later ``train`` of the same run continues from
    it, to the same weights and curve as an uninterrupted run.

    Args:
        model: A model that fits the task (see :func:`build_model`).
        task: The task to sample training batches from.
        config: Training settings (defaults: :class:`TrainConfig`).
        run_dir: If given, the run folder to write (see module docstring).
        progress: Show a tqdm progress bar.
        threads: torch threads while training (restored afterwards); None: the innermost
            :func:`mhainterp.runtime.threads_context`, else ``$MHAINTERP_THREADS``, else
            :data:`mhainterp.runtime.DEFAULT_THREADS` (1), as the sweep executors' workers
            use; 0 keeps torch's current setting.
        resume: Continue from ``run_dir``'s checkpoint of this very run, if there is one
            (False: start over; ``mhainterp train --overwrite``).
        overwrite: Replace another finished run already in ``run_dir`` (one of other
            settings); without it that run is kept and ``train`` refuses, as ``mhainterp train``
            does without ``--overwrite``. The same run, finished or not, is always trained
            again (resumed from its checkpoint when ``resume``).

    Raises:
        ParameterError: ``run_dir`` is empty, holds a sweep (``sweep.json``) or sweep folders,
            or, without ``overwrite``, another finished run.
        TrainingDivergedError: the loss became NaN/inf. The model is restored to the last good
            weights, and, with ``run_dir``, those are saved with ``eval.json`` status "diverged".

    Example:
        >>> from mhainterp.config import TrainConfig
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("reverse")
        >>> run = train(build_model(task), task, TrainConfig(steps=20), progress=False)
        >>> sorted(run.eval)[:3]
        ['accuracy', 'final_train_loss', 'loss']
    """
    config = config or TrainConfig()
    check_compatible(model, task)
    if threads is not None:
        check_int("threads", threads, minimum=0)
    if run_dir is not None:  # fail before training, not after it
        check_free_folder(run_dir, "run", "run_dir")
        ensure_writable_dir(run_dir, "run folder")
        if not overwrite:
            _refuse_another_finished_run(Path(run_dir), model, task, config)
    require_memory(training_memory(model.cfg, config), training_what(model.cfg, config))
    with work_threads(threads):
        return _train(model, task, config, run_dir, progress, resume)


def _refuse_another_finished_run(
    run_dir: Path, model: HookedMHATransformer, task: Task, config: TrainConfig
) -> None:
    """A finished run of other settings in ``run_dir`` is kept unless ``overwrite`` says
    otherwise (as ``mhainterp train``); an unfinished one is redone, as a sweep redoes it."""
    if run_status(run_dir) != "finished" or saved_config_matches(run_dir, model, task, config):
        return
    differences = run_config_differences(run_dir, model, task, config)
    raise invalid(
        "run_dir",
        str(run_dir),
        f"a folder free for this run, but it already holds another run, finished "
        f"({differences}); to keep that one, choose another run_dir; to replace it, pass "
        "overwrite=True",
    )


def _train(
    model: HookedMHATransformer,
    task: Task,
    config: TrainConfig,
    run_dir: str | os.PathLike[str] | None,
    progress: bool,
    resume: bool = True,
) -> Run:
    """The training loop of :func:`train` (arguments checked there)."""
    generator = torch.Generator().manual_seed(config.seed)  # data drawn on the CPU, then moved
    device = model_device(model)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
    )
    checkpoint = None if run_dir is None else Checkpoint(Path(run_dir), model, task, config)
    rows: list[dict[str, Any]] = []
    start = 0
    if checkpoint is not None:
        checkpoint.begin()  # config.json first: the folder reads as this run, unfinished
        if resume:
            start, rows = checkpoint.restore(optimizer, generator)
    model.train()
    interval_losses: list[torch.Tensor] = []
    last_good = _snapshot(model)
    bar = tqdm(
        range(start, config.steps),
        desc=f"train {task.name} h={model.cfg.n_heads}",
        disable=not progress,
        leave=False,
        initial=start,
        total=config.steps,
    )
    for step in bar:
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = task.sample(config.batch_size, generator=generator).to(device)
        # Fixed-length tasks have no padding: skipping the all-True mask saves ~5% per step.
        padding_mask = batch.padding_mask if task.variable_length else None
        logits = model.logits(batch.tokens, padding_mask)
        loss = model.loss(logits, batch.targets, batch.mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = config.grad_clip if config.grad_clip is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        # The losses stay on the device until the interval's end: the host reads them (and
        # looks for a loss that is not finite) once per log_every steps, not once per step.
        interval_losses.append(loss.detach())
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            losses, grad_norm = _read_interval(interval_losses, grad_norm)
            bad = next((i for i, value in enumerate(losses) if not math.isfinite(value)), None)
            if bad is not None:  # weights and rows are still those of the last logged step
                model.load_state_dict(last_good)
                bad_step = step + 1 - len(losses) + bad
                save_diverged(model, task, config, rows, bad_step, losses[bad], run_dir)
            row = {
                "step": step + 1,
                "loss": sum(losses) / len(losses),
                "lr": lr,
                "grad_norm": grad_norm,
            }
            if config.eval_every and (
                (step + 1) % config.eval_every == 0 or step + 1 == config.steps
            ):
                metrics = evaluate(model, task, n_eval=config.n_eval)
                row.update(eval_loss=metrics["loss"], eval_accuracy=metrics["accuracy"])
                model.train()
            rows.append(row)
            bar.set_postfix(loss=f"{row['loss']:.3f}")
            interval_losses = []
            last_good = _snapshot(model)
            if checkpoint is not None and step + 1 < config.steps:
                checkpoint.save_if_due(step + 1, optimizer, generator, rows)
    model.eval()
    metrics_df = pd.DataFrame(rows)
    eval_metrics = evaluate(model, task, n_eval=config.n_eval)
    eval_metrics["final_train_loss"] = float(metrics_df["loss"].iloc[-1])
    eval_metrics["status"] = "finished"
    saved = None
    if run_dir is not None:
        saved = save_run(model, task, run_dir, config, metrics_df, eval_metrics)
        checkpoint.remove()  # finished: eval.json says so, nothing to resume
    return Run(saved, model, task, model.cfg, config, metrics_df, eval_metrics)


def _read_interval(
    losses: list[torch.Tensor], grad_norm: torch.Tensor
) -> tuple[list[float], float]:
    """An interval's losses and its last gradient norm, read by the host in one copy.

    float64 holds every float32 value exactly, so the numbers are those ``.item()`` gives.
    """
    values = torch.stack([*(loss.double() for loss in losses), grad_norm.double()]).tolist()
    return values[:-1], values[-1]


def _snapshot(model: HookedMHATransformer) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def save_diverged(
    model: HookedMHATransformer,
    task: Task,
    config: TrainConfig,
    rows: list[dict[str, Any]],
    step: int,
    loss_value: float,
    run_dir: str | os.PathLike[str] | None,
) -> None:
    """End a run whose loss went bad: raise TrainingDivergedError, having saved ``model`` (its
    last good weights) in ``run_dir``, if given, with a ``"diverged"`` status.

    ``rows`` are the metrics logged so far (the last one's step is the last good step);
    ``step`` and ``loss_value`` where the loss went bad. Used by :func:`train` and the batched
    trainer, so a diverged run reads the same from both.
    """
    good_step = rows[-1]["step"] if rows else 0
    message = (
        f"training diverged: loss={loss_value} at step {step + 1}. The model was restored to the "
        f"weights after step {good_step}. Try a lower lr (now {config.lr}), warmup_steps, or "
        "grad_clip."
    )
    model.eval()
    if run_dir is not None:
        status = {"status": "diverged", "message": message, "last_good_step": good_step}
        save_run(model, task, run_dir, config, pd.DataFrame(rows), status)
        message += f" Last good weights saved in {run_dir}."
    raise TrainingDivergedError(message)
