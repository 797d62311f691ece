"""Configuration dataclasses: the model, one training run, and a head-count sweep.

Every config validates itself on construction and raises ``ValueError`` naming the field, the
value and what is allowed, so a typo fails at the line that made it, not deep inside torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from transformer_lens.config import TransformerLensConfig

from mhainterp.validation import invalid

__all__ = ["ModelConfig", "TrainConfig", "SweepConfig", "config_to_dict"]

_NORMALIZATION_TYPES = (None, "LN")
_ACT_FNS = ("relu", "gelu")
_POSITIONAL_EMBEDDING_TYPES = ("standard",)
_FLAGS = (
    "causal", "attn_only", "use_attn_result", "use_split_qkv_input", "use_attn_in",
    "use_hook_mlp_in",
)  # fmt: skip


def _require(condition: bool, name: str, value: Any, allowed: str) -> None:
    """Raise the toolkit's one error (:mod:`mhainterp.validation`) unless ``condition`` holds."""
    if not condition:
        raise invalid(name, value, allowed)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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

    Example:
        >>> cfg = ModelConfig(d_model=64, n_heads=4, n_ctx=16, d_vocab=10, d_vocab_out=16)
        >>> cfg.d_head
        16
    """

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
    normalization_type: str | None = None
    use_attn_in: bool = False
    use_hook_mlp_in: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_layers", "n_ctx", "d_vocab", "n_targets", "seed"):
            value = getattr(self, name)
            _require(_is_int(value), name, value, "must be an int")
        for name in ("d_model", "n_heads", "n_layers", "n_ctx", "d_vocab", "n_targets"):
            value = getattr(self, name)
            _require(value >= 1, name, value, "must be >= 1")
        _require(
            self.d_model % self.n_heads == 0,
            "n_heads",
            self.n_heads,
            f"must divide d_model={self.d_model}; allowed n_heads: {_divisors(self.d_model)}",
        )
        derived_d_head = self.d_model // self.n_heads
        if self.d_head in (-1, None):
            self.d_head = derived_d_head
        _require(
            _is_int(self.d_head) and self.d_head == derived_d_head,
            "d_head",
            self.d_head,
            f"must equal d_model // n_heads = {derived_d_head} (or be omitted)",
        )
        if self.d_vocab_out in (-1, None):
            self.d_vocab_out = self.d_vocab
        _require(
            _is_int(self.d_vocab_out) and self.d_vocab_out >= 1,
            "d_vocab_out",
            self.d_vocab_out,
            "must be an int >= 1",
        )
        _require(
            self.normalization_type in _NORMALIZATION_TYPES,
            "normalization_type",
            self.normalization_type,
            f"allowed: {_NORMALIZATION_TYPES}",
        )
        for name in _FLAGS:
            value = getattr(self, name)
            _require(isinstance(value, bool), name, value, "must be True or False")
        _require(
            not (self.use_attn_in and self.use_split_qkv_input),
            "use_attn_in",
            self.use_attn_in,
            "cannot be True together with use_split_qkv_input (TransformerLens's rule)",
        )
        _require(_is_number(self.eps) and self.eps > 0, "eps", self.eps, "must be a number > 0")
        _require(self.act_fn in _ACT_FNS, "act_fn", self.act_fn, f"allowed: {_ACT_FNS}")
        _require(
            self.positional_embedding_type in _POSITIONAL_EMBEDDING_TYPES,
            "positional_embedding_type",
            self.positional_embedding_type,
            f"allowed: {_POSITIONAL_EMBEDDING_TYPES} (a learned embedding)",
        )
        _require(
            self.n_key_value_heads in (None, self.n_heads),
            "n_key_value_heads",
            self.n_key_value_heads,
            "grouped-query attention is not supported; leave it None",
        )
        if isinstance(self.dtype, str):
            self.dtype = getattr(torch, self.dtype.removeprefix("torch."))
        if isinstance(self.device, torch.device):
            self.device = str(self.device)  # keeps the config JSON-serialisable
        # The parent fills device (cuda if available) and d_mlp (4 * d_model).
        super().__post_init__()
        _require(
            _is_int(self.d_mlp) and self.d_mlp >= 1, "d_mlp", self.d_mlp, "must be an int >= 1"
        )

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
        """Rebuild from :meth:`to_dict` output; unknown keys raise ``ValueError``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config_dict) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}; allowed: {sorted(known)}")
        return cls(**config_dict)

    def __repr__(self) -> str:
        return f"ModelConfig({json.dumps(self.to_dict(), sort_keys=True)})"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
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

    steps: int = 2000
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int | None = None
    lr_schedule: str = "cosine"
    grad_clip: float | None = 1.0
    seed: int = 0
    n_eval: int = 1024
    log_every: int = 50
    eval_every: int = 0

    def __post_init__(self) -> None:
        if self.warmup_steps is None and _is_int(self.steps):
            self.warmup_steps = min(100, self.steps // 10)
        for name in ("steps", "batch_size", "warmup_steps", "seed", "n_eval", "log_every"):
            value = getattr(self, name)
            _require(_is_int(value), name, value, "must be an int")
        _require(self.steps >= 1, "steps", self.steps, "must be >= 1")
        _require(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        _require(self.n_eval >= 1, "n_eval", self.n_eval, "must be >= 1")
        _require(self.log_every >= 1, "log_every", self.log_every, "must be >= 1")
        _require(
            _is_int(self.eval_every) and self.eval_every >= 0,
            "eval_every",
            self.eval_every,
            "must be an int >= 0",
        )
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            _require(_is_number(value), name, value, "must be a number")
        _require(
            self.grad_clip is None or _is_number(self.grad_clip),
            "grad_clip",
            self.grad_clip,
            "must be a number or None",
        )
        _require(self.lr > 0, "lr", self.lr, "must be > 0")
        _require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        # nan fails the comparisons above; inf passes them and makes the first step diverge.
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            _require(math.isfinite(value), name, value, "must be a finite number")
        _require(
            0 <= self.warmup_steps <= self.steps,
            "warmup_steps",
            self.warmup_steps,
            f"must lie in [0, steps={self.steps}]",
        )
        _require(
            self.lr_schedule in ("constant", "cosine"),
            "lr_schedule",
            self.lr_schedule,
            "allowed: 'constant', 'cosine'",
        )
        _require(
            self.grad_clip is None or self.grad_clip > 0,
            "grad_clip",
            self.grad_clip,
            "must be > 0 or None",
        )
        self.betas = tuple(float(b) for b in self.betas)  # JSON round-trips tuples as lists
        _require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "betas",
            self.betas,
            "must be two floats in [0, 1)",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> TrainConfig:
        if "eval_size" in config_dict:  # the field's name in runs saved before it was n_eval
            config_dict = {**config_dict}
            config_dict.setdefault("n_eval", config_dict.pop("eval_size"))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config_dict) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}; allowed: {sorted(known)}")
        return cls(**config_dict)


@dataclass
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

    task: str = "count_previous"
    task_params: dict[str, Any] = field(default_factory=dict)
    n_heads: list[int] = field(default_factory=lambda: [1, 4, 8])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    model: dict[str, Any] = field(default_factory=lambda: {"d_model": 64})
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if isinstance(self.train, dict):
            self.train = TrainConfig.from_dict(self.train)
        _require(
            len(self.n_heads) >= 1 and all(_is_int(h) and h >= 1 for h in self.n_heads),
            "n_heads",
            self.n_heads,
            "must be a non-empty list of ints >= 1",
        )
        _require(len(set(self.n_heads)) == len(self.n_heads), "n_heads", self.n_heads, "no repeats")
        _require(
            len(self.seeds) >= 1 and all(_is_int(s) for s in self.seeds),
            "seeds",
            self.seeds,
            "must be a non-empty list of ints",
        )
        _require(len(set(self.seeds)) == len(self.seeds), "seeds", self.seeds, "no repeats")
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(self.model) - known)
        _require(
            not unknown, "model", self.model, f"unknown fields {unknown}; allowed: {sorted(known)}"
        )
        for forbidden in ("n_heads", "seed", "d_head"):
            _require(
                forbidden not in self.model,
                f"model[{forbidden!r}]",
                self.model.get(forbidden),
                "is set per run by the sweep; remove it",
            )
        d_model = self.model.get("d_model", ModelConfig.d_model)
        bad = [h for h in self.n_heads if d_model % h]
        _require(not bad, "n_heads", self.n_heads, f"{bad} do not divide d_model={d_model}")

    @property
    def n_runs(self) -> int:
        return len(self.n_heads) * len(self.seeds)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["train"] = self.train.to_dict()
        return out

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> SweepConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(config_dict) - known)
        if unknown:
            raise ValueError(f"unknown SweepConfig fields {unknown}; allowed: {sorted(known)}")
        return cls(**config_dict)


def config_to_dict(config: ModelConfig | TrainConfig | SweepConfig) -> dict[str, Any]:
    """JSON-serialisable dict of any of the configs above."""
    return config.to_dict()
