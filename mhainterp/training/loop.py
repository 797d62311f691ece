"""Train one model on one task, evaluate it on the task's fixed set, save and load run folders.

A run folder (DESIGN.md, "Results and files")::

    config.json        {"model": ModelConfig, "train": TrainConfig,
                        "task": {"name", "params", "module"}}
    model.safetensors  the weights; its metadata key "mhainterp.model" repeats the architecture
                       fields (ARCHITECTURE_FIELDS), so load_run refuses a config that disagrees
    metrics.csv        the training curve: step, loss, lr, grad_norm (+ eval columns if eval_every)
    eval.json          final metrics on the fixed evaluation set; written last = "run finished"
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from mhainterp.config import ModelConfig, TrainConfig
from mhainterp.data import DEFAULT_N_EVAL, as_batch, batch_for_model, target_names
from mhainterp.errors import RunFolderError, TrainingDivergedError
from mhainterp.io import (
    allocation_failures,
    atomic_path,
    ensure_writable_dir,
    read_json,
    reported_os_error,
    require_memory,
    write_csv,
    write_json,
)
from mhainterp.model import HookedMHATransformer
from mhainterp.runs import (
    CHECKPOINT_FILE,
    METRIC_COLUMNS,
    RUN_FILES,
    check_dtype_name,
    check_metrics,
    check_tensors,
    migrate_config,
    read_eval,
    run_status,
)
from mhainterp.runtime import (
    eval_mode,
    model_device,
    resolve_device,
    terminate_as_interrupt,
    work_threads,
)
from mhainterp.scoring import Totals, position_scores, totals
from mhainterp.tasks import Batch, Task, task_from_record, task_record
from mhainterp.validation import ParameterError, check_int, invalid

__all__ = [
    "ARCHITECTURE_FIELDS",
    "Run",
    "build_model",
    "train",
    "evaluate",
    "save_run",
    "load_run",
    "run_folder_state",
    "run_config_differences",
    "saved_config_matches",
    "lr_at",
    "count_parameters",
    "itemsize",
    "training_memory",
    "training_what",
    "run_identity",
    "write_checkpoint",
    "read_checkpoint",
    "CHECKPOINT_SECONDS",
    "check_compatible",
    "save_diverged",
]

METADATA_KEY = "mhainterp.model"
"""The one safetensors metadata key (one key: safetensors writes several in random order, and
a run's files must be byte-identical for the same seed)."""

ARCHITECTURE_FIELDS = (
    "n_layers",
    "n_heads",
    "d_model",
    "d_head",
    "d_mlp",
    "d_vocab",
    "d_vocab_out",
    "n_ctx",
    "n_targets",
    "causal",
    "attn_only",
    "normalization_type",
    "act_fn",
    "positional_embedding_type",
    "dtype",
)
"""ModelConfig fields that ``model.safetensors`` repeats in its metadata and :func:`load_run`
checks against ``config.json``: the fused weights ``[d_model, d_model]`` do not reveal
``n_heads``, and no shape reveals ``causal``."""


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


# What training needs in memory, estimated before anything is allocated: train() and
# build_model() refuse a size that cannot fit with one line (how much is needed, how much is
# available: mhainterp.io.require_memory) instead of ending in the allocator's traceback.


def count_parameters(config: ModelConfig) -> int:
    """Parameters of a model of ``config``, counted on torch's meta device (nothing allocated)."""
    meta = ModelConfig.from_dict({**config.to_dict(), "device": "meta"})
    with torch.device("meta"):
        return sum(p.numel() for p in HookedMHATransformer(meta).parameters())


def itemsize(config: ModelConfig) -> int:
    """Bytes per element of the model's dtype."""
    return torch.empty((), dtype=getattr(torch, config.to_dict()["dtype"])).element_size()


def training_memory(config: ModelConfig, train_config: TrainConfig) -> int:
    """A lower bound on the bytes :func:`train` allocates: weights, gradients, two AdamW
    moments and the last good copy (5 x parameters); one step's activations, kept for the
    backward pass; the fixed evaluation set (tokens, targets, mask: int64)."""
    n = config.n_ctx
    per_token = config.n_layers * (8 * config.d_model + 3 * config.n_heads * n)
    if not config.attn_only:
        per_token += config.n_layers * 2 * config.d_mlp
    per_token += 2 * config.d_vocab_out * config.n_targets
    activations = 2 * train_config.batch_size * n * per_token * itemsize(config)
    batch_tokens = 3 * 8 * n * (train_config.batch_size + train_config.n_eval)
    return 5 * count_parameters(config) * itemsize(config) + activations + batch_tokens


def training_what(config: ModelConfig, train_config: TrainConfig) -> str:
    """What the estimate is of, for the refusal's one line."""
    return (
        f"training (d_model={config.d_model}, batch_size={train_config.batch_size}, "
        f"n_eval={train_config.n_eval})"
    )


def build_model(
    task: Task, *, device: Any = "auto", **model_overrides: Any
) -> HookedMHATransformer:
    """A model shaped for ``task`` (context, vocabularies, targets, causality, min layers),
    on ``device`` (``auto``: CUDA when available, else the CPU;
    :func:`mhainterp.runtime.resolve_device`). The weights are the same on every device: they
    are drawn on the CPU from the config's seed, then moved.

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
    batch = batch_for_model(model, as_batch(data, n_eval=n_eval, needs_targets=True))
    check_int("batch_size", batch_size, minimum=1)
    with eval_mode(model):
        result: Totals | None = None
        for start in range(0, len(batch), batch_size):
            part = batch[start : start + batch_size]
            tokens, padding_mask = model.validate_inputs(part.tokens, part.padding_mask)
            part_totals = totals(
                position_scores(model.logits(tokens, padding_mask), part.targets, part.mask)
            )
            result = part_totals if result is None else result + part_totals
    out: dict[str, Any] = result.metrics(target_names(data, model.cfg.n_targets))[0]
    out["n_sequences"] = len(batch)
    out["n_scored"] = int(result.scored.sum())
    return out


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
) -> Run:
    """Train ``model`` on fresh batches of ``task`` with AdamW; evaluate; optionally save.

    The data order comes from ``config.seed`` alone (a ``torch.Generator``); the initial weights
    from ``model.cfg.seed``. The same two seeds give identical loss curves and weights.

    With ``run_dir``, an interrupted run resumes: every :data:`CHECKPOINT_SECONDS` (at a logged
    step) the training state is saved to ``run_dir/checkpoint.pt``, and a later ``train`` of
    the same run continues from it, to the same weights and curve as an uninterrupted run.

    Args:
        model: A model that fits the task (see :func:`build_model`).
        task: The task to sample training batches from.
        config: Training settings (defaults: :class:`TrainConfig`).
        run_dir: If given, the run folder to write (see module docstring).
        progress: Show a tqdm progress bar.
        threads: torch threads while training (restored afterwards); None:
            ``$MHAINTERP_THREADS``, else :data:`mhainterp.runtime.DEFAULT_THREADS` (1), as the
            sweep executors' workers use; 0 keeps torch's current setting.
        resume: Continue from ``run_dir``'s checkpoint of this very run, if there is one
            (False: start over; ``mhainterp train --overwrite``).

    Raises:
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
        ensure_writable_dir(run_dir, "run folder")
    require_memory(training_memory(model.cfg, config), training_what(model.cfg, config))
    with work_threads(threads):
        return _train(model, task, config, run_dir, progress, resume)


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


CHECKPOINT_SECONDS = 30.0
"""How often :func:`train` saves its state for a resume (at the first logged step after this
many seconds): at most this much training is lost to an interruption, and a run shorter than
this writes no checkpoint at all."""


class Checkpoint:
    """The training state of one run in ``run_dir/checkpoint.pt``: weights, optimizer moments,
    the data generator's state and the curve so far, with the run's config, so that a resumed
    run ends equal to an uninterrupted one. Written atomically; read back with
    ``torch.load(weights_only=True)`` (tensors, numbers and strings only). A checkpoint of
    another run is ignored and replaced; a damaged one is refused, naming the file.
    """

    def __init__(self, run_dir: Path, model: HookedMHATransformer, task: Task, config: TrainConfig):
        self.path = run_dir / CHECKPOINT_FILE
        self.run_dir, self.model, self.task, self.config = run_dir, model, task, config
        self.saved_at = time.monotonic()

    def begin(self) -> None:
        """Write ``config.json`` (unless it already records this run)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not saved_config_matches(self.run_dir, self.model, self.task, self.config):
            write_json(self.run_dir / "config.json", run_config(self.model, self.task, self.config))

    def restore(self, optimizer: Any, generator: torch.Generator) -> tuple[int, list[dict]]:
        """Load this run's checkpoint into the model, optimizer and generator; ``(step, rows)``
        to continue from, ``(0, [])`` when there is none (or it is another run's)."""
        if not self.path.is_file():
            return 0, []
        state = read_checkpoint(self.path, "the run")  # then loaded into the model where it is
        if state.get("config") != self._config():
            return 0, []  # another run's: this one starts over and replaces it
        self.model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        return int(state["step"]), list(state["rows"])

    def save_if_due(
        self, step: int, optimizer: Any, generator: torch.Generator, rows: list
    ) -> None:
        """Save the state after ``step`` if :data:`CHECKPOINT_SECONDS` have passed."""
        if time.monotonic() - self.saved_at < CHECKPOINT_SECONDS:
            return
        state = {
            "format": 1,
            "config": self._config(),
            "step": step,
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": _to_cpu(optimizer.state_dict()),
            "generator": generator.get_state(),
            "rows": rows,
        }
        write_checkpoint(state, self.path)
        self.saved_at = time.monotonic()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _config(self) -> str:
        return run_identity(self.model, self.task, self.config)


def write_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Save a checkpoint's ``state`` (tensors, numbers, strings) to ``path`` atomically,
    through a Python file, so that a full disk is the OSError naming ``path`` (torch's own
    file writer says "unexpected pos")."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as file:
            torch.save(state, file)
    except OSError as error:  # a Python file's error names no file: name the checkpoint
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


def read_checkpoint(path: Path, what: str) -> dict[str, Any]:
    """The state :func:`write_checkpoint` saved at ``path``, on the CPU, tensors, numbers and
    strings only (``torch.load(weights_only=True)``).

    Args:
        path: the checkpoint file.
        what: what it trains, for the message when it is damaged: "the run", "its runs".

    Raises:
        RunFolderError: the file is damaged (truncated, not a torch file, foreign objects);
            one line naming it and saying to delete it to train ``what`` from the start.

    Example:
        >>> state = read_checkpoint(run_dir / "checkpoint.pt", "the run")  # doctest: +SKIP
    """
    try:
        # read on the CPU (where it was written); the caller copies it to its device
        return torch.load(path, map_location="cpu", weights_only=True)  # see above
    except Exception as error:  # truncated, not a torch file, foreign objects
        raise RunFolderError(
            f"{path} is damaged ({type(error).__name__}); delete it to train {what} from the start"
        ) from None


def run_identity(model: HookedMHATransformer, task: Task, config: TrainConfig) -> str:
    """The run's config as a checkpoint compares it (without where it trains): a JSON string,
    equal for the same run on any device."""
    saved = run_config(model, task, config)
    return json.dumps(_what_the_run_is(json.loads(json.dumps(saved, default=list))), sort_keys=True)


def _to_cpu(value: Any) -> Any:
    """An optimizer state dict with every tensor on the CPU (a checkpoint loads anywhere)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


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


def save_run(
    model: HookedMHATransformer,
    task: Task,
    run_dir: str | os.PathLike[str],
    train_config: TrainConfig,
    metrics: pd.DataFrame,
    eval_metrics: dict[str, Any],
) -> Path:
    """Write ``model``'s run folder ``run_dir`` atomically, file by file, ``eval.json`` last.

    ``config.json`` records the configs and the task (by name and module, never as code);
    ``model.safetensors`` carries the :data:`ARCHITECTURE_FIELDS` in its metadata; ``metrics``
    is the training curve (an empty frame keeps the header), ``eval_metrics`` the final
    evaluation and status. Returns ``run_dir`` as a ``Path``.

    Example:
        >>> import tempfile
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> model = handbuilt_model(["previous", "dead"], d_head=18)
        >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     run = save_run(model, task, Path(folder, "run"), TrainConfig(), pd.DataFrame(), {})
        ...     sorted(path.name for path in run.iterdir())
        ['config.json', 'eval.json', 'metrics.csv', 'model.safetensors']
    """
    if not isinstance(model, HookedMHATransformer):
        raise invalid("model", model, "a HookedMHATransformer: save_run(model, task, run_dir, ...)")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "config.json", run_config(model, task, train_config))
    state = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    try:
        with atomic_path(run_dir / "model.safetensors") as tmp:
            save_file(state, str(tmp), metadata=_weights_metadata(model.cfg))
    except SafetensorError as error:  # a full disk, say: reported as the OSError it is
        raise reported_os_error(error, run_dir / "model.safetensors") from error
    if metrics.columns.empty:  # diverged before the first logged step: keep the header
        metrics = pd.DataFrame(columns=list(METRIC_COLUMNS))
    write_csv(run_dir / "metrics.csv", metrics)
    write_json(run_dir / "eval.json", eval_metrics)
    return run_dir


def run_config(
    model: HookedMHATransformer | ModelConfig, task: Task, train_config: TrainConfig
) -> dict[str, Any]:
    """The content of a run's ``config.json`` (``model``: the model, or its config)."""
    cfg = model.cfg if isinstance(model, HookedMHATransformer) else model
    return {
        "model": cfg.to_dict(),
        "train": train_config.to_dict(),
        "task": task_record(task),  # name, params and defining module; never code
        "versions": {"torch": torch.__version__},
    }


def _architecture(model_config: dict[str, Any]) -> dict[str, Any]:
    return {name: model_config.get(name) for name in ARCHITECTURE_FIELDS}


def _weights_metadata(cfg: ModelConfig) -> dict[str, str]:
    return {METADATA_KEY: json.dumps(_architecture(cfg.to_dict()), sort_keys=True)}


def run_folder_state(
    run_dir: str | os.PathLike[str],
    model: HookedMHATransformer | ModelConfig,
    task: Task,
    train_config: TrainConfig,
) -> str:
    """What ``run_dir`` holds, compared with the run that ``train`` would write there
    (``model``: the model, or its config).

    Returns:
        ``"empty"`` (no run files), ``"same finished"`` (this very run, finished, every file
        whole), ``"same unfinished"`` (this run, killed or diverged: redoing it loses nothing),
        or ``"different"`` (another run, or a config.json that cannot be read: overwriting
        loses it).

    Raises:
        RunFolderError: a file of this very run, finished, is damaged (:func:`load_run`), or
            eval.json is (:func:`mhainterp.runs.run_status`).

    Example:
        >>> run_folder_state("runs/rev_h4", model, task, TrainConfig())  # doctest: +SKIP
        'same finished'
    """
    run_dir = Path(run_dir)
    status = run_status(run_dir)
    if status == "empty":
        return "empty"
    if not saved_config_matches(run_dir, model, task, train_config):
        return "different"
    if status == "finished":
        read_eval(run_dir, require=("final_train_loss",))  # train() records it
        load_run(run_dir, verify=False)  # "nothing to do" only over whole, readable files
        return "same finished"
    return "same unfinished"


def _saved_config(run_dir: str | os.PathLike[str]) -> Any:
    """``run_dir/config.json`` in the current format (:func:`~mhainterp.runs.migrate_config`)."""
    saved = read_json(Path(run_dir) / "config.json")
    return migrate_config(saved) if isinstance(saved, dict) else saved


NOT_THE_RUN = ("device",)
"""Model-config fields that say where a run was trained, not what it is: a run trained on a GPU
is the same run on the CPU, so comparing a saved config with a planned one ignores them."""


def _what_the_run_is(config: Any) -> Any:
    """A run config without :data:`NOT_THE_RUN` (for comparisons)."""
    if isinstance(config, dict) and isinstance(config.get("model"), dict):
        model = {k: v for k, v in config["model"].items() if k not in NOT_THE_RUN}
        return {**config, "model": model}
    return config


def saved_config_matches(
    run_dir: str | os.PathLike[str],
    model: HookedMHATransformer | ModelConfig,
    task: Task,
    train_config: TrainConfig,
) -> bool:
    """Whether ``run_dir/config.json`` records this run (its model, train and task sections;
    False when it cannot be read)."""
    try:
        saved = _what_the_run_is(_saved_config(run_dir))
    except (OSError, ValueError):
        return False
    wanted = json.loads(json.dumps(run_config(model, task, train_config), default=list))
    wanted = _what_the_run_is(wanted)
    keys = ("model", "train", "task")
    return isinstance(saved, dict) and all(saved.get(k) == wanted[k] for k in keys)


def run_config_differences(
    run_dir: str | os.PathLike[str],
    model: HookedMHATransformer | ModelConfig,
    task: Task,
    train_config: TrainConfig,
) -> str:
    """How the run saved in ``run_dir`` differs from this one, for messages
    (``"task: 'reverse' there, 'sort' here; model.n_heads: 8 there, 4 here"``)."""
    try:
        saved = _saved_config(run_dir)
    except (OSError, ValueError) as error:
        return f"its config.json cannot be read: {error}"
    if not isinstance(saved, dict):
        return "its config.json is not a run config"
    saved = _what_the_run_is(saved)
    wanted = json.loads(json.dumps(run_config(model, task, train_config), default=list))
    wanted = _what_the_run_is(wanted)
    diffs = []
    for section in ("task", "model", "train"):
        there, here = saved.get(section), wanted[section]
        if section == "task" and isinstance(there, dict) and there.get("name") != here["name"]:
            diffs.append(f"task: {there.get('name')!r} there, {here['name']!r} here")
            continue
        if not isinstance(there, dict):
            diffs.append(f"{section}: missing there")
            continue
        for key in sorted(set(there) | set(here)):
            if there.get(key) != here.get(key):
                diffs.append(f"{section}.{key}: {there.get(key)!r} there, {here.get(key)!r} here")
    if not diffs:
        return "the same settings, unfinished"
    return "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")


def load_run(path: str | os.PathLike[str], *, device: Any = "auto", verify: bool = True) -> Run:
    """Rebuild the exact model, task and configs of a saved run, refusing a damaged folder.

    The model is loaded on ``device`` (``auto``: CUDA when available, else the CPU; see
    :func:`mhainterp.runtime.resolve_device`), whatever device the run was trained on: its
    ``config.json`` records that device, and loading never needs it.

    Checks: every run file is readable; ``config.json`` is a valid config; ``model.safetensors``
    is a whole safetensors file whose tensors fit the config; its metadata (written since the
    run format carried it) agrees with ``config.json`` on every :data:`ARCHITECTURE_FIELDS`.
    A run saved before that has no metadata: with ``verify`` its weights must then reproduce the
    loss recorded in ``eval.json`` on the task's fixed evaluation set (this catches a config
    whose ``n_heads`` or ``causal`` disagrees with the weights); when ``eval.json`` records no
    loss either, it loads with a warning.

    Raises:
        FileNotFoundError: a run file is missing.
        RunFolderError: a file is damaged or two files disagree; the message names them.

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
    config_path, weights_path = path / "config.json", path / "model.safetensors"
    device = str(resolve_device(device))
    model_config, train_config, task = _read_config(config_path, device)
    state, metadata = _read_weights(weights_path, device)
    if metadata is not None:
        _check_architecture(config_path, weights_path, model_config, metadata)
    model = HookedMHATransformer(model_config)
    check_tensors(weights_path, config_path, state, model)
    model.load_state_dict(state)
    model.eval()
    saved_eval = read_eval(path)
    metrics_path = path / "metrics.csv"
    try:
        metrics = pd.read_csv(metrics_path)
    except (ValueError, UnicodeDecodeError) as error:  # EmptyDataError, ParserError
        reason = " ".join(str(error).split())
        raise RunFolderError(f"{metrics_path} is not a readable CSV table ({reason})") from None
    check_metrics(metrics_path, metrics, train_config, saved_eval)
    if metadata is None and verify:
        _verify_legacy(path, model, task, train_config, saved_eval)
    return Run(
        path=path,
        model=model,
        task=task,
        model_config=model_config,
        train_config=train_config,
        metrics=metrics,
        eval=saved_eval,
    )


def _read_config(config_path: Path, device: str) -> tuple[ModelConfig, TrainConfig, Task]:
    config = read_json(config_path)
    keys = ("model", "train", "task")
    if not isinstance(config, dict) or not all(isinstance(config.get(k), dict) for k in keys):
        raise RunFolderError(f"{config_path} is not a run config: it needs objects {list(keys)}")
    try:
        config = migrate_config(config)  # old run folders (mhainterp.runs)
        check_dtype_name(config["model"].get("dtype", "float32"))
        model_config = ModelConfig.from_dict({**config["model"], "device": device})
        train_config = TrainConfig.from_dict(config["train"])
        task = task_from_record(config["task"], config_path)  # imports nothing
    except (ValueError, TypeError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise RunFolderError(f"{config_path}: {message}") from None
    return model_config, train_config, task


def _read_weights(
    weights_path: Path, device: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    try:
        with safe_open(str(weights_path), framework="pt", device=device) as weights:
            metadata = weights.metadata() or {}
            state = {name: weights.get_tensor(name) for name in weights.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as error:
        raise RunFolderError(
            f"{weights_path} is damaged ({error}); retrain this run (rerun the sweep, or "
            "train with --overwrite)"
        ) from None
    if METADATA_KEY not in metadata:
        return state, None
    try:
        architecture = json.loads(metadata[METADATA_KEY])
    except json.JSONDecodeError:
        architecture = None
    if not isinstance(architecture, dict):
        raise RunFolderError(
            f"{weights_path} has damaged metadata ({METADATA_KEY!r} is "
            f"{metadata[METADATA_KEY][:40]!r}, not an object of architecture fields); retrain "
            "this run (rerun the sweep, or train with --overwrite)"
        )
    return state, architecture


def _check_architecture(
    config_path: Path, weights_path: Path, model_config: ModelConfig, saved: dict[str, Any]
) -> None:
    configured = _architecture(model_config.to_dict())
    diffs = [
        f"{name}={configured[name]!r} in config.json but {saved[name]!r} in the weights"
        for name in ARCHITECTURE_FIELDS
        if name in saved and saved[name] != configured[name]
    ]
    if diffs:
        raise RunFolderError(
            f"{config_path} disagrees with {weights_path.name}: {'; '.join(diffs)}. The files "
            "are from different runs; restore the right config.json or retrain the run"
        )


LEGACY_LOSS_RTOL = 1e-4


def _verify_legacy(
    path: Path,
    model: HookedMHATransformer,
    task: Task,
    train_config: TrainConfig,
    saved_eval: dict[str, Any],
) -> None:
    """Weights without metadata: they must reproduce the loss that eval.json recorded."""
    recorded = saved_eval.get("loss")
    if not isinstance(recorded, (int, float)) or not math.isfinite(recorded):
        warnings.warn(
            f"{path / 'model.safetensors'} has no architecture metadata (saved by an older "
            "mhainterp) and eval.json records no loss, so n_heads and causal in config.json "
            "cannot be checked against the weights",
            stacklevel=3,
        )
        return
    loss = evaluate(model, task, n_eval=train_config.n_eval)["loss"]
    if abs(loss - recorded) > LEGACY_LOSS_RTOL * max(1.0, abs(recorded)):
        raise RunFolderError(
            f"{path / 'config.json'} disagrees with model.safetensors: the weights, read with "
            f"this config (n_heads={model.cfg.n_heads}, causal={model.cfg.causal}), give loss "
            f"{loss:.4g} where eval.json recorded {recorded:.4g} (the weights carry no "
            "architecture metadata: saved by an older mhainterp). Restore the right "
            "config.json or retrain the run"
        )
