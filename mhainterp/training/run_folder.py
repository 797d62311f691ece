"""The run folder: :func:`save_run` writes it, :func:`load_run` rebuilds a :class:`Run` from it,
refusing a damaged one, and :func:`run_folder_state` says what a folder holds.

A run folder (DESIGN.md, "Results and files")::

    config.json        {"model": ModelConfig, "train": TrainConfig,
                        "task": {"name", "params", "module"}}  (mhainterp.training.identity)
    model.safetensors  the weights; its metadata key "mhainterp.model" repeats the architecture
                       fields (ARCHITECTURE_FIELDS), so load_run refuses a config that disagrees
    metrics.csv        the training curve: step, loss, lr, grad_norm (+ eval columns if eval_every)
    eval.json          final metrics on the fixed evaluation set; written last = "run finished"
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from mhainterp.config import ModelConfig, TrainConfig
from mhainterp.errors import RunFolderError
from mhainterp.io import atomic_path, read_json, reported_os_error, write_csv, write_json
from mhainterp.model import HookedMHATransformer
from mhainterp.runs import (
    METRIC_COLUMNS,
    RUN_FILES,
    check_dtype_name,
    check_metrics,
    check_not_diverged,
    check_tensors,
    migrate_config,
    read_eval,
    retrain_advice,
    run_status,
    sweep_of_run,
    weights_digest,
)
from mhainterp.runtime import resolve_device
from mhainterp.tasks import Task, task_from_record, task_record
from mhainterp.training.evaluation import evaluate
from mhainterp.training.identity import run_config, saved_config_matches
from mhainterp.validation import invalid

__all__ = [
    "ARCHITECTURE_FIELDS",
    "LEGACY_LOSS_RTOL",
    "METADATA_KEY",
    "Run",
    "SAFETENSORS_DTYPES",
    "check_run_folder",
    "load_run",
    "run_folder_state",
    "save_run",
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
    """A trained model with its task, configs and results: what
    :func:`~mhainterp.training.train` returns and :func:`load_run` rebuilds from a run folder.

    Attributes:
        path: The run folder, or None for a run trained without ``run_dir``.
        model: The model (in eval mode).
        task: The task it was trained on.
        model_config: ``model.cfg``.
        train_config: The training settings.
        metrics: The training curve, one row per logged step (columns: step, loss, lr,
            grad_norm; plus eval_loss, eval_accuracy when ``eval_every > 0``).
        eval: Final metrics on the fixed evaluation set (see :func:`evaluate`), plus
            ``final_train_loss`` (the mean training loss of the last logging window, the
            last ``log_every`` steps) and ``status``.
    """

    path: Path | None
    model: HookedMHATransformer
    task: Task
    model_config: ModelConfig
    train_config: TrainConfig
    metrics: pd.DataFrame
    eval: dict[str, Any] = field(default_factory=dict)


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
    write_json(run_dir / "eval.json", {**eval_metrics, **_trained_record(run_dir, task)})
    return run_dir


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


def load_run(
    path: str | os.PathLike[str], *, device: str | torch.device | None = None, verify: bool = True
) -> Run:
    """Rebuild the exact model, task and configs of a saved run, refusing a damaged folder.

    The model is loaded on ``device`` (None or ``"auto"``: decided by
    :func:`mhainterp.runtime.resolve_device`), whatever device the run was trained on: its
    ``config.json`` records that device, and loading never needs it.

    Checks: every run file is readable; ``config.json`` is a valid config; ``model.safetensors``
    is a whole safetensors file whose tensors fit the config; its metadata (written since the
    run format carried it) agrees with ``config.json`` on every :data:`ARCHITECTURE_FIELDS`.
    A run saved before that has no metadata: with ``verify`` its weights must then reproduce the
    loss recorded in ``eval.json`` on the task's fixed evaluation set (this catches a config
    whose ``n_heads`` or ``causal`` disagrees with the weights); when ``eval.json`` records no
    loss either, it loads with a warning. Runs saved since ``eval.json`` records the weights'
    SHA-256 and the task must match both (a flipped byte, weights copied from another run, a
    config edited to another task of the same shapes are refused).

    Raises:
        FileNotFoundError: the folder or a run file is missing.
        RunFolderError: a file is damaged or two files disagree, the message naming them; or
            the run diverged (its folder holds the last good weights, not a trained model).

    Example:
        >>> run = load_run("runs/quickstart/count_previous/h4_seed0")  # doctest: +SKIP
        >>> run.model.cfg.n_heads, run.eval["accuracy"]  # doctest: +SKIP
    """
    path = Path(path)
    saved_eval = _read_run_eval(path)
    config_path, weights_path = path / "config.json", path / "model.safetensors"
    device = str(resolve_device(device))
    model_config, train_config, task = _read_config(config_path, device)
    state, metadata = _read_weights(weights_path, device)
    if metadata is not None:
        _check_architecture(config_path, weights_path, model_config, metadata)
    model = HookedMHATransformer(model_config)
    check_tensors(weights_path, config_path, state, model)
    _check_trained_record(path, saved_eval, task)  # after the checks that name a cause
    model.load_state_dict(state)
    model.eval()
    metrics = _read_metrics(path, train_config, saved_eval)
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


def check_run_folder(path: str | os.PathLike[str]) -> None:
    """Refuse a damaged run folder as :func:`load_run` would, from its files, without loading
    the weights: the file set, ``config.json``, the weights file's header (whole, its metadata,
    every tensor's name, shape and dtype against the config), ``eval.json`` and
    ``metrics.csv``. The tensors' values are read when the run is loaded (which refuses NaN or
    infinite weights); a run saved before the weights carried metadata is loaded in full, as
    only its recorded loss can check its config.

    Raises:
        FileNotFoundError: the folder or a run file is missing.
        RunFolderError: a file is damaged or two files disagree, or the run diverged (the
            message :func:`load_run` gives).

    Example:
        >>> check_run_folder("runs/quickstart/count_previous/runs/h4_seed0")  # doctest: +SKIP
    """
    path = Path(path)
    saved_eval = _read_run_eval(path)
    config_path, weights_path = path / "config.json", path / "model.safetensors"
    model_config, train_config, task = _read_config(config_path, "meta")
    header, metadata = _read_weight_header(weights_path)
    if metadata is None:  # an old run: its weights must reproduce its loss
        load_run(path)
        return
    _check_architecture(config_path, weights_path, model_config, metadata)
    with torch.device("meta"):  # shapes and dtypes only: nothing allocated
        model = HookedMHATransformer(model_config)
    check_tensors(weights_path, config_path, header, model)
    _check_trained_record(path, saved_eval, task)  # also what the header cannot show: values
    _read_metrics(path, train_config, saved_eval)


WEIGHTS_KEY = "weights_sha256"
TASK_KEY = "trained_on"
"""In ``eval.json`` (runs saved since the record was written): the SHA-256 of the weights file
the evaluation is of, and the task (name and params) it was trained and evaluated on."""


def _trained_record(run_dir: Path, task: Task) -> dict[str, Any]:
    """What this evaluation is of, for ``eval.json``: a loader then refuses other weights (a
    damaged or swapped file) and a config.json that names another task, which the tensors'
    shapes alone cannot tell apart (reverse and sort share every shape)."""
    record = task_record(task)
    return {
        WEIGHTS_KEY: weights_digest(run_dir),
        TASK_KEY: {"name": record["name"], "params": record["params"]},
    }


def _check_trained_record(path: Path, saved_eval: dict[str, Any], task: Task) -> None:
    """Refuse weights or a task other than those ``eval.json`` recorded (runs saved before the
    record have none to check)."""
    recorded = saved_eval.get(WEIGHTS_KEY)
    if recorded is not None and recorded != weights_digest(path):
        raise RunFolderError(
            f"{path / 'model.safetensors'} is not the file this run saved: its SHA-256 differs "
            f"from the one eval.json recorded (damaged, or other weights copied in); restore "
            f"the run's own file, or {retrain_advice(path)}"
        )
    trained = saved_eval.get(TASK_KEY)
    if trained is None:
        return
    record = task_record(task)
    configured = json.loads(json.dumps({"name": record["name"], "params": record["params"]}))
    if trained != configured:
        raise RunFolderError(
            f"{path / 'config.json'} disagrees with eval.json: it names task {configured}, but "
            f"the run was trained and evaluated on {trained}; restore the run's own "
            f"config.json, or {retrain_advice(path)}"
        )


def _read_run_eval(path: Path) -> dict[str, Any]:
    """``eval.json`` of a complete run folder that did not diverge: checked before the other
    files, so that a diverged run is refused as such, not for what its weights lack."""
    _check_complete(path)
    saved_eval = read_eval(path)
    check_not_diverged(path, saved_eval)
    return saved_eval


def _check_complete(path: Path) -> None:
    if not path.is_dir():
        raise FileNotFoundError(_no_folder_message(path))
    missing = [name for name in RUN_FILES if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path} is not a complete run folder: missing {', '.join(missing)}"
        )


def _no_folder_message(path: Path) -> str:
    if path.exists():
        return f"{path} is not a folder: a run folder holds {', '.join(RUN_FILES)}"
    sweep = sweep_of_run(path)
    if sweep is not None:  # its sweep trains it again; nothing else does
        return f"run {path.name} of the sweep {sweep} is missing ({path}); rerun the sweep"
    return f"{path} does not exist"


def _read_metrics(
    path: Path, train_config: TrainConfig, saved_eval: dict[str, Any]
) -> pd.DataFrame:
    metrics_path = path / "metrics.csv"
    try:
        metrics = pd.read_csv(metrics_path)
    except (ValueError, UnicodeDecodeError) as error:  # EmptyDataError, ParserError
        reason = " ".join(str(error).split())
        raise RunFolderError(
            f"{metrics_path} is not a readable CSV table ({reason}); {retrain_advice(path)}"
        ) from None
    check_metrics(metrics_path, metrics, train_config, saved_eval)
    return metrics


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
    """The tensors of ``weights_path`` on ``device``, and its architecture metadata (None for
    weights saved before it was written)."""
    return _read_safetensors(weights_path, device, lambda weights, name: weights.get_tensor(name))


SAFETENSORS_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
"""torch's dtype of each safetensors dtype name a header may give (the ones a model's weights
may be saved in; another is refused as damaged)."""


def _read_weight_header(
    weights_path: Path,
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """As :func:`_read_weights`, from the file's header alone: each tensor as an empty tensor
    on the meta device, with its saved shape and dtype (no value is read)."""

    def header_tensor(weights: Any, name: str) -> torch.Tensor:
        saved = weights.get_slice(name)
        dtype = SAFETENSORS_DTYPES.get(saved.get_dtype())
        if dtype is None:
            raise OSError(f"tensor {name} has dtype {saved.get_dtype()}, which torch cannot hold")
        return torch.empty(saved.get_shape(), dtype=dtype, device="meta")

    return _read_safetensors(weights_path, "cpu", header_tensor)  # the header only: no data


def _read_safetensors(
    weights_path: Path, device: str, read: Callable[[Any, str], torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """``read(file, name)`` for every tensor of ``weights_path`` (opened on ``device``), and its
    architecture metadata; a damaged file or metadata is a RunFolderError naming it."""
    try:
        with safe_open(str(weights_path), framework="pt", device=device) as weights:
            metadata = weights.metadata() or {}
            state = {name: read(weights, name) for name in weights.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as error:
        raise RunFolderError(
            f"{weights_path} is damaged ({error}); {retrain_advice(weights_path.parent)}"
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
            f"{metadata[METADATA_KEY][:40]!r}, not an object of architecture fields); "
            f"{retrain_advice(weights_path.parent)}"
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
            "are from different runs; restore the right config.json, or "
            f"{retrain_advice(config_path.parent)}"
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
            f"config.json, or {retrain_advice(path)}"
        )
