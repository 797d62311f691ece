"""One planned run of a sweep (:class:`RunSpec`), the plan (:func:`plan_sweep`) and how one run is
trained (:func:`execute_run`).

The sweep (:mod:`~mhainterp.sweep.run`) and every executor (:mod:`~mhainterp.sweep.executors`)
share these, so they live below both: the executors never import the sweep that starts them.

Example:
    >>> from mhainterp.config import SweepConfig
    >>> config = SweepConfig(task="reverse", n_heads=[1, 2], seeds=[0])
    >>> specs = plan_sweep(config, "out", device="cpu")
    >>> [(spec.n_heads, spec.seed, spec.run_dir.as_posix()) for spec in specs]
    [(1, 0, 'out/runs/h1_seed0'), (2, 0, 'out/runs/h2_seed0')]
    >>> specs[0].model_config.device
    'cpu'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mhainterp.config import ModelConfig, SweepConfig, TrainConfig
from mhainterp.runtime import resolve_device
from mhainterp.tasks import Task, get_task
from mhainterp.training import build_model, train

__all__ = ["RunSpec", "execute_run", "plan_sweep"]


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: everything needed to train it in any process."""

    task_name: str
    task_params: dict[str, Any]
    model_config: ModelConfig
    train_config: TrainConfig
    run_dir: Path

    @property
    def n_heads(self) -> int:
        return self.model_config.n_heads

    @property
    def seed(self) -> int:
        return self.model_config.seed

    def build_task(self) -> Task:
        return get_task(self.task_name, **self.task_params)


def plan_sweep(
    config: SweepConfig,
    out_dir: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
) -> list[RunSpec]:
    """The runs of a sweep, head count major, then seed, each to be trained on ``device``.

    Args:
        config: The sweep.
        out_dir: The sweep folder.
        device: Where the runs train, recorded in each run's ``ModelConfig.device`` (so in its
            ``config.json``; loading and resuming never need it). None: the sweep's
            ``model["device"]`` if it names one, else decided by
            :func:`mhainterp.runtime.resolve_device`.
    """
    out_dir = Path(out_dir)
    task = get_task(config.task, **config.task_params)
    where = str(resolve_device(config.model.get("device") if device is None else device))
    specs = []
    for n_heads in config.n_heads:
        for seed in config.seeds:
            model_kwargs = {**task.model_kwargs(), **config.model, "device": where}
            model_config = ModelConfig(**{**model_kwargs, "n_heads": n_heads, "seed": seed})
            train_config = TrainConfig.from_dict({**config.train.to_dict(), "seed": seed})
            specs.append(
                RunSpec(
                    task_name=task.name,
                    task_params=dict(task.params),
                    model_config=model_config,
                    train_config=train_config,
                    run_dir=out_dir / "runs" / f"h{n_heads}_seed{seed}",
                )
            )
    return specs


def execute_run(spec: RunSpec, *, progress: bool = False) -> Path:
    """Train one planned run and write its folder (used by every executor)."""
    task = spec.build_task()
    model = build_model(task, **spec.model_config.to_dict())
    train(model, task, spec.train_config, run_dir=spec.run_dir, progress=progress)
    return spec.run_dir
