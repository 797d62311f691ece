"""Train one model on one task, evaluate it on the task's fixed set, save and load run folders.

A run folder (DESIGN.md, "Results and files")::

    config.json        {"model": ModelConfig, "train": TrainConfig,
                        "task": {"name", "params", "module"}}
    model.safetensors  the weights
    metrics.csv        the training curve: step, loss, lr, grad_norm (+ eval columns if eval_every)
    eval.json          final metrics on the fixed evaluation set; written last = "run finished"
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from mhainterp.config import ModelConfig, TrainConfig
from mhainterp.data import DEFAULT_N_EVAL, as_batch, target_names
from mhainterp.io import atomic_path, read_json, write_csv, write_json
from mhainterp.model import HookedMHATransformer
from mhainterp.scoring import Totals, position_scores, totals
from mhainterp.tasks import Batch, Task, task_from_record, task_record
from mhainterp.validation import check_int

__all__ = [
    "TrainingDivergedError",
    "Run",
    "build_model",
    "train",
    "evaluate",
    "save_run",
    "load_run",
    "is_finished_run",
    "lr_at",
]

RUN_FILES = ("config.json", "model.safetensors", "metrics.csv", "eval.json")


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite; the model holds the last good weights."""


@dataclass
class Run:
    """A trained model with its task, configs and results: what :func:`train` returns and
    :func:`load_run` rebuilds from a run folder.

    Attributes:
        path: The run folder, or None for a run trained without ``run_dir``.
        model: The model (in eval mode).
        task: The task it was trained on.
        model_config: ``model.cfg``.
        train_config: The training settings.
        metrics: The training curve, one row per logged step (columns: step, loss, lr,
            grad_norm; plus eval_loss, eval_accuracy when ``eval_every > 0``).
        eval: Final metrics on the fixed evaluation set (see :func:`evaluate`), plus
            ``final_train_loss`` and ``status``.
    """

    path: Path | None
    model: HookedMHATransformer
    task: Task
    model_config: ModelConfig
    train_config: TrainConfig
    metrics: pd.DataFrame
    eval: dict[str, Any] = field(default_factory=dict)


def build_model(task: Task, **model_overrides: Any) -> HookedMHATransformer:
    """A model shaped for ``task`` (context, vocabularies, targets, causality, min layers).

    Example:
        >>> task = get_task("reverse", seq_len=16, d_vocab=10)
        >>> build_model(task, d_model=64, n_heads=8, seed=0).cfg.d_head
        8
    """
    kwargs = {**task.model_kwargs(), "device": "cpu", **model_overrides}
    if kwargs["n_layers"] < task.min_layers:
        raise ValueError(
            f"n_layers={kwargs['n_layers']} is too few for task {task.name!r}: "
            f"it needs at least {task.min_layers}"
        )
    return HookedMHATransformer(ModelConfig(**kwargs))


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


def _check_compatible(model: HookedMHATransformer, task: Task) -> None:
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
        raise ValueError(
            f"model does not fit task {task.name!r}: "
            + "; ".join(problems)
            + ". Build it with mhainterp.training.build_model(task, ...)"
        )


@torch.no_grad()
def evaluate(
    model: HookedMHATransformer,
    data: Task | Batch,
    *,
    n_eval: int = DEFAULT_N_EVAL,
    batch_size: int = 1024,
) -> dict[str, Any]:
    """Loss and accuracy on the scored positions of ``data`` (a Task's fixed evaluation set).

    Returns:
        ``{"loss", "accuracy", "n_sequences", "n_scored"}`` plus, for multi-target tasks,
        ``"accuracy/<target>"`` per target. Accuracy is over scored (position, target) pairs
        (:mod:`mhainterp.scoring`).

    Example:
        >>> evaluate(model, get_task("reverse"))["accuracy"]  # doctest: +SKIP
        0.97
    """
    batch = as_batch(data, n_eval=n_eval, needs_targets=True)
    check_int("batch_size", batch_size, minimum=1)
    was_training = model.training
    model.eval()
    try:
        result: Totals | None = None
        for start in range(0, len(batch), batch_size):
            part = batch[start : start + batch_size]
            tokens, padding_mask = model.validate_inputs(part.tokens, part.padding_mask)
            part_totals = totals(
                position_scores(model.logits(tokens, padding_mask), part.targets, part.mask)
            )
            result = part_totals if result is None else result + part_totals
    finally:
        model.train(was_training)
    out: dict[str, Any] = result.metrics(target_names(data, model.cfg.n_targets))[0]
    out["n_sequences"] = len(batch)
    out["n_scored"] = int(result.scored.sum())
    return out


def train(
    model: HookedMHATransformer,
    task: Task,
    config: TrainConfig | None = None,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> Run:
    """Train ``model`` on fresh batches of ``task`` with AdamW; evaluate; optionally save.

    The data order comes from ``config.seed`` alone (a ``torch.Generator``); the initial weights
    from ``model.cfg.seed``. The same two seeds give identical loss curves and weights.

    Args:
        model: A model that fits the task (see :func:`build_model`).
        task: The task to sample training batches from.
        config: Training settings (defaults: :class:`TrainConfig`).
        run_dir: If given, the run folder to write (see module docstring).
        progress: Show a tqdm progress bar.

    Raises:
        TrainingDivergedError: the loss became NaN/inf. The model is restored to the last good
            weights, and, with ``run_dir``, those are saved with ``eval.json`` status "diverged".

    Example:
        >>> task = get_task("reverse")
        >>> run = train(build_model(task), task, TrainConfig(steps=500), progress=False)
        >>> run.eval["accuracy"]  # doctest: +SKIP
    """
    config = config or TrainConfig()
    _check_compatible(model, task)
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
    )
    model.train()
    rows: list[dict[str, Any]] = []
    interval_losses: list[float] = []
    last_good = _snapshot(model)
    bar = tqdm(
        range(config.steps),
        desc=f"train {task.name} h={model.cfg.n_heads}",
        disable=not progress,
        leave=False,
    )
    for step in bar:
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = task.sample(config.batch_size, generator=generator)
        # Fixed-length tasks have no padding: skipping the all-True mask saves ~5% per step.
        padding_mask = batch.padding_mask if task.variable_length else None
        logits = model.logits(batch.tokens, padding_mask)
        loss = model.loss(logits, batch.targets, batch.mask)
        loss_value = loss.detach().item()
        if not math.isfinite(loss_value):
            model.load_state_dict(last_good)
            _diverged(model, task, config, rows, step, loss_value, run_dir)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = config.grad_clip if config.grad_clip is not None else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
        optimizer.step()
        interval_losses.append(loss_value)
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            row = {
                "step": step + 1,
                "loss": sum(interval_losses) / len(interval_losses),
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
    model.eval()
    metrics_df = pd.DataFrame(rows)
    eval_metrics = evaluate(model, task, n_eval=config.n_eval)
    eval_metrics["final_train_loss"] = float(metrics_df["loss"].iloc[-1])
    eval_metrics["status"] = "finished"
    saved = None
    if run_dir is not None:
        saved = save_run(run_dir, model, task, config, metrics_df, eval_metrics)
    return Run(saved, model, task, model.cfg, config, metrics_df, eval_metrics)


def _snapshot(model: HookedMHATransformer) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _diverged(
    model: HookedMHATransformer,
    task: Task,
    config: TrainConfig,
    rows: list[dict[str, Any]],
    step: int,
    loss_value: float,
    run_dir: str | os.PathLike[str] | None,
) -> None:
    good_step = rows[-1]["step"] if rows else 0
    message = (
        f"training diverged: loss={loss_value} at step {step + 1}. The model was restored to the "
        f"weights after step {good_step}. Try a lower lr (now {config.lr}), warmup_steps, or "
        "grad_clip."
    )
    model.eval()
    if run_dir is not None:
        status = {"status": "diverged", "message": message, "last_good_step": good_step}
        save_run(run_dir, model, task, config, pd.DataFrame(rows), status)
        message += f" Last good weights saved in {run_dir}."
    raise TrainingDivergedError(message)


def save_run(
    run_dir: str | os.PathLike[str],
    model: HookedMHATransformer,
    task: Task,
    train_config: TrainConfig,
    metrics: pd.DataFrame,
    eval_metrics: dict[str, Any],
) -> Path:
    """Write a run folder atomically, file by file, with ``eval.json`` last."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        run_dir / "config.json",
        {
            "model": model.cfg.to_dict(),
            "train": train_config.to_dict(),
            "task": task_record(task),  # name, params and defining module; never code
            "versions": {"torch": torch.__version__},
        },
    )
    state = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    with atomic_path(run_dir / "model.safetensors") as tmp:
        save_file(state, str(tmp))
    write_csv(run_dir / "metrics.csv", metrics)
    write_json(run_dir / "eval.json", eval_metrics)
    return run_dir


def is_finished_run(run_dir: str | os.PathLike[str]) -> bool:
    """True when every run file exists and ``eval.json`` says the run finished."""
    run_dir = Path(run_dir)
    if not all((run_dir / name).is_file() for name in RUN_FILES):
        return False
    try:
        return read_json(run_dir / "eval.json").get("status") == "finished"
    except ValueError:  # a corrupt eval.json means: not finished
        return False


def load_run(path: str | os.PathLike[str], *, device: str = "cpu") -> Run:
    """Rebuild the exact model, task and configs of a saved run.

    Example:
        >>> run = load_run("runs/quickstart/count_previous/h4_seed0")  # doctest: +SKIP
        >>> run.model.cfg.n_heads, run.eval["accuracy"]  # doctest: +SKIP
    """
    path = Path(path)
    missing = [name for name in RUN_FILES if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path} is not a complete run folder: missing {', '.join(missing)}"
        )
    config = read_json(path / "config.json")
    model_config = ModelConfig.from_dict({**config["model"], "device": device})
    model = HookedMHATransformer(model_config)
    model.load_state_dict(load_file(str(path / "model.safetensors"), device=device))
    model.eval()
    task = task_from_record(config["task"], path / "config.json")  # imports nothing
    return Run(
        path=path,
        model=model,
        task=task,
        model_config=model_config,
        train_config=TrainConfig.from_dict(config["train"]),
        metrics=pd.read_csv(path / "metrics.csv"),
        eval=read_json(path / "eval.json"),
    )
