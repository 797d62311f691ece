"""Configuration dataclasses: the model, one training run, and a head-count sweep.

Every config validates itself on construction through :mod:`mhainterp.validation` and raises its
``ParameterError`` (a ``ValueError``) naming the field, the value and what is allowed, so a typo
fails at the line that made it, not deep inside torch. What each field allows is a table, the
class's ``_parameter_constraints`` (as scikit-learn's), walked by
:func:`~mhainterp.validation.validate`; ``__post_init__`` adds only what relates two fields.

:class:`TrainConfig` and :class:`SweepConfig` are frozen (``dataclasses.replace`` makes a
changed copy, validated). :class:`ModelConfig` cannot be: it subclasses TransformerLens's
mutable config, and ``model.to(device)`` keeps its ``device`` equal to where the weights are.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import torch
from transformer_lens.config import TransformerLensConfig

from mhainterp.runtime import resolve_device
from mhainterp.validation import (
    BOOLEAN,
    MAX_SEED,
    SEED_RANGE,
    ConstraintList,
    DistinctList,
    Interval,
    Options,
    Satisfies,
    check_int,
    check_keys,
    invalid,
    validate,
)

__all__ = [
    "DEFAULT_N_EVAL",
    "LRSchedule",
    "ModelConfig",
    "NormalizationType",
    "TrainConfig",
    "SweepConfig",
    "config_to_dict",
]

DEFAULT_N_EVAL = 1024
"""Sequences of a Task's evaluation set when a function is given a Task (``n_eval``): the one
default that training, every analysis and the CLI's ``--n-eval`` share."""

NormalizationType = Literal[None, "LN"]
"""``None`` (no LayerNorm, the seed's model) or ``"LN"`` (pre-norm)."""

LRSchedule = Literal["constant", "cosine"]
"""The learning-rate schedule after warm-up."""

_ACT_FNS = ("relu", "gelu")
_FLAGS = (
    "causal",
    "attn_only",
    "use_attn_result",
    "use_split_qkv_input",
    "use_attn_in",
    "use_hook_mlp_in",
)
_COUNT = Interval(int, 1)


@dataclass
class ModelConfig(TransformerLensConfig):
    """Shape and options of a :class:`~mhainterp.model.HookedMHATransformer`.

    Subclasses TransformerLens's ``TransformerLensConfig`` so TransformerLens utilities that read
    ``model.cfg`` (``n_layers``, ``n_heads``, ``d_head``, ``n_ctx``, ``device``, ``dtype``...) work.

    ``d_head`` is derived as ``d_model // n_heads``; passing it is optional and it must then agree.
    The attention parameter count, ``4 * (d_model**2 + d_model)``, does not depend on ``n_heads``.

    Args:
        d_model: Width of the residual stream.
        n_heads: Number of attention heads per layer; must divide ``d_model``.
        n_layers: Number of transformer blocks (>= 1).
        n_ctx: Maximum sequence length (the learned positional embedding has this many rows).
        d_vocab: Input vocabulary size (token ids lie in ``[0, d_vocab)``).
        d_vocab_out: Output classes per target; defaults to ``d_vocab``.
        n_targets: Independent classification targets per position (``multi_relation`` has 3).
            Logits are ``[batch, pos, d_vocab_out]`` for one target and
            ``[batch, pos, n_targets, d_vocab_out]`` for several.
        causal: Mask future keys (decoder-style) when True; bidirectional when False.
        attn_only: Attention-only blocks (the seed's model) when True; attention + MLP otherwise.
        normalization_type: ``None`` (no LayerNorm, the seed's model) or ``"LN"`` (pre-norm).
        act_fn: MLP activation, ``"relu"`` or ``"gelu"``.
        use_attn_result: Compute each head's residual write and fire ``attn.hook_result``
            (``[batch, pos, head, d_model]``), as TransformerLens's flag of the same name. Off
            (the default), heads are merged before W_O and ``hook_result`` never fires, even
            with a hook attached.
        use_split_qkv_input: TransformerLens's flag: fire ``hook_q_input``, ``hook_k_input``,
            ``hook_v_input`` (the residual stream repeated per head, before ln1).
        use_attn_in: TransformerLens's flag: fire ``hook_attn_in`` (one per-head copy of the
            attention input for Q, K and V). Excludes ``use_split_qkv_input``.
        use_hook_mlp_in: TransformerLens's flag: fire ``hook_mlp_in`` (the MLP input, before ln2).
        seed: Initialisation seed; the same seed gives bit-identical initial weights.
        device: Where the model is built; None (or ``"auto"``): decided by
            :func:`mhainterp.runtime.resolve_device` (the command's ``--device``, else
            ``$MHAINTERP_DEVICE``, else CUDA when available, else the CPU). A name given is
            kept as given: a saved config records where it was trained, loading never needs it.

    Example:
        >>> cfg = ModelConfig(d_model=64, n_heads=4, n_ctx=16, d_vocab=10, d_vocab_out=16)
        >>> cfg.d_head
        16
    """

    _parameter_constraints: ClassVar[dict[str, ConstraintList]] = {
        "d_model": [_COUNT],
        "n_heads": [_COUNT],
        "n_layers": [_COUNT],
        "n_ctx": [_COUNT],
        "d_vocab": [_COUNT],
        "n_targets": [_COUNT],
        "seed": [SEED_RANGE],
        "d_vocab_out": [_COUNT],
        "normalization_type": [Options(get_args(NormalizationType))],
        **{flag: [BOOLEAN] for flag in _FLAGS},
        "eps": [Interval(float, 0, closed="right")],
        "act_fn": [Options(_ACT_FNS)],
        "positional_embedding_type": [Options(("standard",))],
        "d_mlp": [_COUNT, None],
    }

    # Redeclared with defaults so that d_head may be omitted (the parent requires it).
    d_model: int = 64
    d_head: int = -1
    n_layers: int = 1
    n_ctx: int = 16
    n_heads: int = 4
    d_vocab: int = 10
    d_vocab_out: int = -1
    n_targets: int = 1
    causal: bool = False
    attn_only: bool = True
    normalization_type: NormalizationType = None
    use_attn_in: bool = False
    use_hook_mlp_in: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.d_vocab_out in (-1, None):
            self.d_vocab_out = self.d_vocab
        validate(self)
        if self.d_model % self.n_heads:
            raise invalid(
                "n_heads",
                self.n_heads,
                f"a divisor of d_model={self.d_model}: one of {_divisors(self.d_model)}",
            )
        derived_d_head = self.d_model // self.n_heads
        if self.d_head in (-1, None):
            self.d_head = derived_d_head
        if (
            isinstance(self.d_head, bool)
            or self.d_head != derived_d_head
            or not _is_int(self.d_head)
        ):
            raise invalid(
                "d_head", self.d_head, f"d_model // n_heads = {derived_d_head} (or omitted)"
            )
        if self.use_attn_in and self.use_split_qkv_input:
            raise invalid(
                "use_attn_in",
                self.use_attn_in,
                "False when use_split_qkv_input is True (TransformerLens's rule)",
            )
        if self.n_key_value_heads not in (None, self.n_heads):
            raise invalid(
                "n_key_value_heads",
                self.n_key_value_heads,
                "None (grouped-query attention is not supported)",
            )
        if isinstance(self.dtype, str):
            self.dtype = getattr(torch, self.dtype.removeprefix("torch."))
        if isinstance(self.device, torch.device):
            self.device = str(self.device)  # keeps the config JSON-serialisable
        if self.device is None or self.device == "auto":  # TransformerLens's default ignores
            self.device = str(resolve_device(None))  # --device and $MHAINTERP_DEVICE
        # The parent fills d_mlp (4 * d_model).
        super().__post_init__()

    @property
    def n_attn_params(self) -> int:
        """Attention parameters per layer: ``4 * (d_model**2 + d_model)``, independent of h."""
        return 4 * (self.d_model * self.d_model + self.d_model)

    def to_dict(self) -> dict[str, Any]:
        """All fields as JSON-serialisable values (dtype as its name)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["dtype"] = str(self.dtype).removeprefix("torch.")
        return out

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> ModelConfig:
        """Rebuild from :meth:`to_dict` output; unknown keys raise ``ParameterError``."""
        check_keys("ModelConfig", config_dict, _field_names(cls))
        return cls(**config_dict)

    def __repr__(self) -> str:
        return f"ModelConfig({json.dumps(self.to_dict(), sort_keys=True)})"


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _two_betas(betas: Any) -> bool:
    """AdamW's betas: two numbers in [0, 1) (a tuple or a list, as JSON gives it back)."""
    return (
        isinstance(betas, (tuple, list))
        and len(betas) == 2
        and all(_is_number(b) and math.isfinite(b) and 0 <= b < 1 for b in betas)
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class TrainConfig:
    """How one model is trained.

    One ``seed`` controls the order of the training data; the model's initialisation is controlled
    by ``ModelConfig.seed`` (the sweep sets both to the run's seed).

    Args:
        steps: Optimiser steps.
        batch_size: Sequences per step (fresh sequences each step, drawn from the seed's stream).
        lr: Peak AdamW learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        warmup_steps: Linear warm-up steps from 0 to ``lr`` (0 disables warm-up). Default
            (None): 10% of ``steps``, at most 100.
        lr_schedule: ``"constant"`` after warm-up, or ``"cosine"`` decay to 10% of ``lr``.
        grad_clip: Max global gradient norm, or None for no clipping.
        seed: Data-order seed.
        n_eval: Sequences in the task's fixed evaluation set.
        log_every: Steps between rows of ``metrics.csv``.
        eval_every: Steps between evaluations on the fixed set during training (0: only at end).

    Example:
        >>> TrainConfig(steps=1000, lr=3e-3).batch_size
        128
    """

    _parameter_constraints: ClassVar[dict[str, ConstraintList]] = {
        "steps": [_COUNT],
        "warmup_steps": [Interval(int, 0), None],  # None: 10% of steps; <= steps (below)
        "batch_size": [_COUNT],
        "n_eval": [_COUNT],
        "log_every": [_COUNT],
        "eval_every": [Interval(int, 0)],
        "seed": [SEED_RANGE],
        "lr": [Interval(float, 0, closed="right")],
        "weight_decay": [Interval(float, 0)],
        "grad_clip": [Interval(float, 0, closed="right"), None],
        "lr_schedule": [Options(get_args(LRSchedule))],
        "betas": [Satisfies(_two_betas, "two numbers in [0, 1)")],
    }

    steps: int = 2000
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int | None = None
    lr_schedule: LRSchedule = "cosine"
    grad_clip: float | None = 1.0
    seed: int = 0
    n_eval: int = DEFAULT_N_EVAL
    log_every: int = 50
    eval_every: int = 0

    def __post_init__(self) -> None:
        validate(self)
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", min(100, self.steps // 10))
        check_int("warmup_steps", self.warmup_steps, minimum=0, maximum=self.steps)
        # JSON round-trips tuples as lists
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> TrainConfig:
        check_keys("TrainConfig", config_dict, _field_names(cls))
        return cls(**config_dict)


@dataclass(frozen=True)
class SweepConfig:
    """The head-count experiment: everything fixed except ``n_heads`` (and the seed).

    Args:
        task: Registered task name.
        task_params: Keyword parameters for :func:`mhainterp.tasks.get_task`.
        n_heads: Head counts to compare; each must divide ``model['d_model']``.
        seeds: Seeds; each run uses the seed for both initialisation and data order.
        model: Extra :class:`ModelConfig` fields shared by all runs (``d_model``, ``n_layers``...).
        train: Training settings shared by all runs (its ``seed`` is replaced per run).

    Example:
        >>> SweepConfig(task="reverse", n_heads=[1, 4, 8], seeds=[0, 1, 2]).n_runs
        9
    """

    _parameter_constraints: ClassVar[dict[str, ConstraintList]] = {
        "n_heads": [DistinctList(_COUNT, "head counts, each an integer >= 1")],
        "seeds": [DistinctList(SEED_RANGE, f"seeds, each in [0, {MAX_SEED}]")],
    }

    task: str = "count_previous"
    task_params: dict[str, Any] = field(default_factory=dict)
    n_heads: list[int] = field(default_factory=lambda: [1, 4, 8])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    model: dict[str, Any] = field(default_factory=lambda: {"d_model": 64})
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):
            object.__setattr__(self, "train", TrainConfig.from_dict(self.train))
        validate(self)
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(self.model) - known)
        if unknown:
            allowed = f"ModelConfig fields only, not {unknown}; known: {sorted(known)}"
            raise invalid("model", self.model, allowed)
        for forbidden in ("n_heads", "seed", "d_head"):
            if forbidden in self.model:
                raise invalid(
                    f"model[{forbidden!r}]",
                    self.model[forbidden],
                    "not given: it is set per run by the sweep; remove it",
                )
        d_model = self.model.get("d_model", ModelConfig.d_model)
        bad = [h for h in self.n_heads if d_model % h]
        if bad:
            raise invalid(
                "n_heads",
                self.n_heads,
                f"head counts that divide d_model; {bad} do not divide d_model={d_model}",
            )

    @property
    def n_runs(self) -> int:
        return len(self.n_heads) * len(self.seeds)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["train"] = self.train.to_dict()
        return out

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> SweepConfig:
        check_keys("SweepConfig", config_dict, _field_names(cls))
        return cls(**config_dict)


def config_to_dict(config: ModelConfig | TrainConfig | SweepConfig) -> dict[str, Any]:
    """JSON-serialisable dict of any of the configs above."""
    return config.to_dict()
