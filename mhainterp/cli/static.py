"""What ``mhainterp --help``, ``mhainterp <command> --help`` and ``mhainterp tasks`` show without
importing torch (which takes seconds, tens of seconds on a busy machine).

Each value below mirrors its one home in the library, named beside it; ``tests/test_first_hour.py``
checks that every mirror equals its home, so a change there fails the tests until it is copied
here. Nothing else in the CLI may hard-code these values. The two registries (ablation methods,
division axes) are read through :func:`ablation_methods` and :func:`division_axes`, which give
the live registry once the library has loaded it and the mirror before.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "ABLATION_METHODS",
    "BUILTIN_TASKS",
    "CORRECTIONS",
    "DIVISION_AXES",
    "DEFAULT_N_EVAL",
    "DEMO_SEEDS",
    "DEMO_STEPS",
    "ENTRY_POINT_GROUP",
    "SPECIALIZATION_DEFAULTS",
    "TRAIN_DEFAULTS",
    "ablation_methods",
    "division_axes",
]

DEFAULT_N_EVAL = 1024
"""``mhainterp.config.DEFAULT_N_EVAL``: the evaluation sequences of every command's ``--n-eval``."""

DEMO_STEPS = 1000
"""``mhainterp.analyze.demo.DEMO_STEPS``: the demo's training steps per run."""

DEMO_SEEDS = tuple(range(6))
"""``mhainterp.analyze.study.GRIDS["demo"].seeds``: the demo's seeds per head count."""

TRAIN_DEFAULTS: dict[str, Any] = {"steps": 2000, "batch_size": 128, "lr": 3e-3, "grad_clip": 1.0}
"""The defaults of :class:`mhainterp.config.TrainConfig` that the training options show."""

ABLATION_METHODS: dict[str, str] = {
    "zero": "the head's z set to 0 (it writes nothing)",
    "mean": "the head's z set to its per-position mean over the reference",
    "resample": "the head's z taken from another reference sequence",
}
"""``mhainterp.ablation.METHODS``: each built-in method's name and help, in registration order
(read through :func:`ablation_methods`)."""

CORRECTIONS = ("holm", "bh", "none")
"""``mhainterp.stats.CORRECTIONS``."""

DIVISION_AXES: dict[str, str] = {
    "token": "the query token",
    "position": "the query position",
    "target_class": "the class to output",
    "target": "which target (multi-target tasks)",
}
"""``mhainterp.tasks.AXES``: each built-in division axis's name and help, in registration
order, the default of ``--by`` (read through :func:`division_axes`)."""


def _registered(module: str, name: str, mirror: dict[str, str]) -> dict[str, str]:
    """``{name: help}`` of the registry ``module.name`` when that module is loaded (a
    ``--task-module`` or a notebook may have registered more), else its mirror: loading it
    here would import torch."""
    loaded = sys.modules.get(module)
    if loaded is None:
        return dict(mirror)
    return {key: entry.help for key, entry in getattr(loaded, name).items()}


def ablation_methods() -> dict[str, str]:
    """The registered ablation methods' ``{name: help}``, in order (:data:`ABLATION_METHODS`
    until :mod:`mhainterp.ablation.replacement` is loaded).

    Example:
        >>> list(ablation_methods())
        ['zero', 'mean', 'resample']
    """
    return _registered("mhainterp.ablation.replacement", "METHODS", ABLATION_METHODS)


def division_axes() -> dict[str, str]:
    """The registered division axes' ``{name: help}``, in order (:data:`DIVISION_AXES` until
    :mod:`mhainterp.tasks.axes` is loaded).

    Example:
        >>> list(division_axes())
        ['token', 'position', 'target_class', 'target']
    """
    return _registered("mhainterp.tasks.axes", "AXES", DIVISION_AXES)


SPECIALIZATION_DEFAULTS: dict[str, Any] = {
    "alpha": 0.05,
    "correction": "holm",
    "min_effect": 0.3,
    "method": "mean",
}
"""The defaults of :class:`mhainterp.specialization.SpecializationSettings` the options show."""

ENTRY_POINT_GROUP = "mhainterp.tasks"
"""``mhainterp.tasks.ENTRY_POINT_GROUP``: installed packages' tasks."""

_DEFAULTS = {"seq_len": 16, "d_vocab": 10, "min_len": 16}

BUILTIN_TASKS: dict[str, dict[str, Any]] = {
    "count_previous": {
        "summary": (
            "Count earlier copies: the target at t is how many earlier positions k < t hold "
            "the same token as t (0 .. seq_len - 1, so d_vocab_out = seq_len)."
        ),
        "relations": ["same_token_upto"],
        "targets": ["count_previous"],
        "causal": True,
        "min_layers": 1,
        "defaults": _DEFAULTS,
    },
    "histogram": {
        "summary": (
            "Token histogram: the target at t is how many positions of the whole real "
            "sequence hold the token at t, t itself included (1 .. seq_len, so d_vocab_out = "
            "seq_len + 1)."
        ),
        "relations": ["same_token"],
        "targets": ["histogram"],
        "causal": False,
        "min_layers": 1,
        "defaults": _DEFAULTS,
    },
    "induction": {
        "summary": (
            "Induction: a block of B distinct tokens, then the same block again, at the end of "
            "the sequence after seq_len - 2B prefix tokens that differ from the block."
        ),
        "relations": ["induction", "previous"],
        "targets": ["induction"],
        "causal": True,
        "min_layers": 2,
        "defaults": {**_DEFAULTS, "min_block": 4},
    },
    "multi_relation": {
        "summary": (
            'Three targets at every position at once, target_names = ["previous", "mirror", '
            '"count_previous"]: the previous token (class d_vocab at t = 0), the mirrored '
            "token tokens[L - 1 - t], and the number of earlier copies of the token at t."
        ),
        "relations": ["previous", "mirror", "same_token_upto"],
        "targets": ["previous", "mirror", "count_previous"],
        "causal": False,
        "min_layers": 1,
        "defaults": _DEFAULTS,
    },
    "previous_token": {
        "summary": (
            "Copy the previous token: the target at t is the token at t - 1; at t = 0 it is "
            "the extra class d_vocab (so d_vocab_out = d_vocab + 1)."
        ),
        "relations": ["previous"],
        "targets": ["previous_token"],
        "causal": True,
        "min_layers": 1,
        "defaults": _DEFAULTS,
    },
    "reverse": {
        "summary": (
            "Reverse the sequence: the target at t is the token at L - 1 - t of the real "
            "sequence (d_vocab_out = d_vocab)."
        ),
        "relations": ["mirror"],
        "targets": ["reverse"],
        "causal": False,
        "min_layers": 1,
        "defaults": _DEFAULTS,
    },
    "sort": {
        "summary": (
            "Sort the sequence: the target at t is the t-th smallest token of the real "
            "sequence (d_vocab_out = d_vocab)."
        ),
        "relations": ["sort_source"],
        "targets": ["sort"],
        "causal": False,
        "min_layers": 1,
        "defaults": _DEFAULTS,
    },
}
"""``mhainterp tasks``'s entry for each built-in task (:func:`mhainterp.cli.tasks.describe_task`
of the task built with its defaults)."""
