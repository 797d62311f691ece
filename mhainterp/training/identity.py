"""Which run a folder holds: the content of a run's ``config.json`` and its comparison with a
run that is planned for that folder.

A run is its model, training and task settings; where it trained (:data:`NOT_THE_RUN`) is not
part of it, so a run trained on a GPU is the same run on the CPU. The trainer
(:func:`~mhainterp.training.train`), the checkpoints and the sweep ask these questions before
they redo or overwrite anything.

Example:
    >>> from mhainterp.model.handbuilt import handbuilt_model
    >>> from mhainterp.tasks import get_task
    >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
    >>> sorted(run_config(handbuilt_model(["previous", "dead"], d_head=18), task, TrainConfig()))
    ['model', 'task', 'train', 'versions']
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from mhainterp.config import ModelConfig, TrainConfig
from mhainterp.io import read_json
from mhainterp.model import HookedMHATransformer
from mhainterp.runs import migrate_config
from mhainterp.tasks import Task, task_record

__all__ = [
    "NOT_THE_RUN",
    "run_config",
    "run_config_differences",
    "run_identity",
    "saved_config_matches",
]


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


def run_identity(model: HookedMHATransformer, task: Task, config: TrainConfig) -> str:
    """The run's config as a checkpoint compares it (without where it trains): a JSON string,
    equal for the same run on any device."""
    saved = run_config(model, task, config)
    return json.dumps(_what_the_run_is(json.loads(json.dumps(saved, default=list))), sort_keys=True)
