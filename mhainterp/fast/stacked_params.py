"""The parameters of ``M`` same-shaped models in one ``[M, P]`` buffer, for
:func:`mhainterp.fast.stacked.train_many`.

The layout is derived from ``model.named_parameters()`` (:func:`_param_layout`); the forward
pass reads the buffer through the slot views of :func:`_slot_layout`.

Shapes: M models, P parameters per model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mhainterp.config import ModelConfig
from mhainterp.model import HookedMHATransformer
from mhainterp.validation import ParameterError, invalid

__all__ = ["StackedModels", "check_batchable"]

# Fields that may differ between models trained together (everything else must be equal).
_FREE_MODEL_FIELDS = ("n_heads", "d_head", "seed")
# Not compared either: where the models are (train_many checks one device for all on its own).
_WHERE = ("device",)

# ----- parameters of M models in one buffer ------------------------------------------------------
_FUSED_QKV = tuple(f"attn.{x}_proj.{kind}" for kind in ("weight", "bias") for x in "qkv")


def _param_layout(model: HookedMHATransformer) -> list[tuple[str, tuple[int, ...]]]:
    """The model's own parameters (``named_parameters``: names and shapes) in buffer order.

    The one change to the model's order: each attention's Q, K and V weights are moved next to
    each other, then their biases, so that one ``[3d, d]`` view projects all three at once.
    """
    params = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    shapes = dict(params)
    layout: list[tuple[str, tuple[int, ...]]] = []
    for name, shape in params:
        if name.endswith(_FUSED_QKV[0]):  # the first of a fused group: emit the whole group
            prefix = name[: -len(_FUSED_QKV[0])]
            layout += [(prefix + part, shapes[prefix + part]) for part in _FUSED_QKV]
        elif not name.endswith(_FUSED_QKV):
            layout.append((name, shape))
    return layout


def _layout_of(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """:func:`_param_layout` of a model built from ``cfg`` (the layout depends on it alone)."""
    return _param_layout(HookedMHATransformer(cfg))


def _slot_layout(cfg: ModelConfig) -> dict[str, tuple[list[str], tuple[int, ...]]]:
    """Forward-pass weights (slots) -> (the model parameters they span, the slot's shape).

    A slot spans consecutive parameters of :func:`_param_layout`; ``W_qkv`` is the Q, K and V
    weights stacked as ``[3d, d]`` (nn.Linear layout: out x in).
    """
    d, slots = cfg.d_model, {}
    slots["embed"] = (["embed.weight"], (cfg.d_vocab, d))
    slots["pos_embed"] = (["pos_embed.weight"], (cfg.n_ctx, d))
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        if cfg.normalization_type == "LN":
            slots[p + "ln1.w"] = ([p + "ln1.weight"], (d,))
            slots[p + "ln1.b"] = ([p + "ln1.bias"], (d,))
        slots[p + "W_qkv"] = ([p + f"attn.{x}_proj.weight" for x in "qkv"], (3 * d, d))
        slots[p + "b_qkv"] = ([p + f"attn.{x}_proj.bias" for x in "qkv"], (3 * d,))
        slots[p + "W_O"] = ([p + "attn.o_proj.weight"], (d, d))
        slots[p + "b_O"] = ([p + "attn.o_proj.bias"], (d,))
        if not cfg.attn_only:
            if cfg.normalization_type == "LN":
                slots[p + "ln2.w"] = ([p + "ln2.weight"], (d,))
                slots[p + "ln2.b"] = ([p + "ln2.bias"], (d,))
            slots[p + "W_in"] = ([p + "mlp.fc_in.weight"], (cfg.d_mlp, d))
            slots[p + "b_in"] = ([p + "mlp.fc_in.bias"], (cfg.d_mlp,))
            slots[p + "W_out"] = ([p + "mlp.fc_out.weight"], (d, cfg.d_mlp))
            slots[p + "b_out"] = ([p + "mlp.fc_out.bias"], (d,))
    if cfg.normalization_type == "LN":
        slots["ln_final.w"] = (["ln_final.weight"], (d,))
        slots["ln_final.b"] = (["ln_final.bias"], (d,))
    n_out = cfg.n_targets * cfg.d_vocab_out
    slots["W_U"] = (["unembed.weight"], (n_out, d))
    slots["b_U"] = (["unembed.bias"], (n_out,))
    return slots


def _shape_key(cfg: ModelConfig) -> dict[str, Any]:
    return {k: v for k, v in cfg.to_dict().items() if k not in _FREE_MODEL_FIELDS + _WHERE}


def check_batchable(models: Sequence[HookedMHATransformer]) -> None:
    """Raise ``ValueError`` unless the models can be trained together by
    :func:`~mhainterp.fast.stacked.train_many`.

    They must be :class:`HookedMHATransformer` s with equal configs except ``n_heads`` (and the
    derived ``d_head``) and ``seed``, no hooks attached, and the standard parameters only.

    Example:
        >>> check_batchable([build_model(task, n_heads=h) for h in (1, 4, 8)])  # doctest: +SKIP
    """
    if len(models) == 0:
        raise invalid("models", models, "a non-empty list of models")
    for i, model in enumerate(models):
        if not isinstance(model, HookedMHATransformer):
            raise TypeError(
                f"models[{i}] must be a HookedMHATransformer, got {type(model).__name__}"
            )
        hooked = [name for name, hp in model.hook_dict.items() if hp.fwd_hooks or hp.bwd_hooks]
        if hooked:
            raise ParameterError(
                f"models[{i}] is invalid: a model without hooks (batched training does not run "
                f"them), got hooks attached at {hooked[:3]}. Remove them (model.reset_hooks()) "
                "or train the model with train()"
            )
        expected = dict(_layout_of(model.cfg))
        actual = {name: tuple(p.shape) for name, p in model.named_parameters()}
        if actual != expected:
            extra = sorted(set(actual) - set(expected))
            raise ParameterError(
                f"models[{i}] is invalid: only the standard HookedMHATransformer parameters are "
                f"supported, got parameters {extra or sorted(actual)} batched training lacks"
            )
    reference = _shape_key(models[0].cfg)
    for i, model in enumerate(models[1:], start=1):
        key = _shape_key(model.cfg)
        diff = sorted(k for k in reference if reference[k] != key.get(k))
        if diff:
            raise ParameterError(
                f"models[{i}] is invalid: models trained together may differ only in "
                f"{list(_FREE_MODEL_FIELDS)}, but models[{i}] differs from models[0] in {diff}. "
                "Group them by shape first"
            )


class StackedModels:
    """The parameters of ``M`` same-shaped models in one ``[M, P]`` buffer, with its gradient.

    Each forward-pass weight is a leaf tensor ``[M, *shape]`` that is a *view* of row slices of
    ``flat``, with its ``.grad`` a view of ``grad``. Autograd accumulates gradients in
    place into those views, so after ``backward()`` the whole gradient is ``grad``, and an
    optimiser step or a per-model norm is one op over the buffer.

    Attributes:
        flat: ``[M, P]`` parameters, row ``m`` = model ``m`` (its own layout, see ``offsets``).
        grad: ``[M, P]`` gradients.
        slots: Forward weight name -> leaf view ``[M, *shape]``.
        offsets: Model parameter name -> (start column, shape).
        n_heads: Head count of each row.

    Example:
        >>> models = [build_model(task, n_heads=h, seed=0) for h in (4, 8)]  # doctest: +SKIP
        >>> StackedModels.from_models(models).flat.shape  # doctest: +SKIP
        torch.Size([2, 18960])
    """

    def __init__(
        self,
        flat: Float[Tensor, "M P"],
        cfg: ModelConfig,
        n_heads: Sequence[int],
        layout: list[tuple[str, tuple[int, ...]]] | None = None,
    ):
        self.cfg = cfg
        self.layout = _layout_of(cfg) if layout is None else layout
        self.n_heads = list(n_heads)
        self.flat = flat
        self.grad = torch.zeros_like(flat)
        self.offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
        start = 0
        for name, shape in self.layout:
            self.offsets[name] = (start, shape)
            start += math.prod(shape)
        if start != flat.shape[1]:
            raise ValueError(f"flat has {flat.shape[1]} columns; the layout needs {start}")
        self._constants: dict[Any, Tensor] = {}
        self.slots: dict[str, Tensor] = {}
        for slot, (names, shape) in _slot_layout(cfg).items():
            first = self.offsets[names[0]][0]
            stop = first + math.prod(shape)
            view = flat[:, first:stop].view(len(flat), *shape)
            view.requires_grad_(True)
            view.grad = self.grad[:, first:stop].view(len(flat), *shape)
            self.slots[slot] = view

    @classmethod
    def from_models(cls, models: Sequence[HookedMHATransformer]) -> StackedModels:
        """Copy the models' weights into one buffer (checked with :func:`check_batchable`)."""
        check_batchable(models)
        cfg = models[0].cfg
        layout = _param_layout(models[0])
        rows = []
        for model in models:
            params = dict(model.named_parameters())
            rows.append(torch.cat([params[name].detach().reshape(-1) for name, _ in layout]))
        return cls(torch.stack(rows), cfg, [m.cfg.n_heads for m in models], layout)

    def __len__(self) -> int:
        return self.flat.shape[0]

    def constant(self, key: Any, make: Callable[[], Tensor]) -> Tensor:
        """A tensor that depends only on this stack's shape and a step's (``key`` names it):
        ``make()`` the first time, the same tensor after (the forward's index offsets and
        causal mask, made once per group instead of once per step). The stack's rows never
        change (:meth:`select` makes a new stack), so nothing here goes stale."""
        if key not in self._constants:
            self._constants[key] = make()
        return self._constants[key]

    def select(self, rows: Sequence[int]) -> StackedModels:
        """A new stack holding only ``rows`` (copies)."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.flat.device)
        return StackedModels(
            self.flat.index_select(0, index), self.cfg, [self.n_heads[r] for r in rows], self.layout
        )

    def state_dict(self, row: int, flat: Tensor | None = None) -> dict[str, Tensor]:
        """Model ``row``'s parameters by model parameter name (views of ``flat``)."""
        flat = self.flat if flat is None else flat
        return {
            name: flat[row, start : start + math.prod(shape)].view(shape)
            for name, (start, shape) in self.offsets.items()
        }

    @torch.no_grad()
    def write_to(self, row: int, model: HookedMHATransformer, flat: Tensor | None = None) -> None:
        """Copy row ``row`` (of ``flat``, default ``flat``) into ``model``'s parameters."""
        values = self.state_dict(row, flat)
        for name, param in model.named_parameters():
            param.copy_(values[name])

    def head_groups(self) -> list[tuple[int, int, int]]:
        """``(start, stop, n_heads)`` for each run of consecutive rows with one head count."""
        groups: list[tuple[int, int, int]] = []
        for row, h in enumerate(self.n_heads):
            if groups and groups[-1][2] == h:
                groups[-1] = (groups[-1][0], row + 1, h)
            else:
                groups.append((row, row + 1, h))
        return groups
