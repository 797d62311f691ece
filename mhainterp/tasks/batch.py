"""``Batch``: the tensors one call to ``Task.sample`` produces.

Shapes: n sequences, pos positions (``task.seq_len``), k targets per position (``task.n_targets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from mhainterp.model.loss import IGNORE_INDEX
from mhainterp.validation import ParameterError

__all__ = ["Batch", "scored_positions"]


def scored_positions(
    targets: Int[Tensor, "n T *k"], mask: Bool[Tensor, "n T"]
) -> Bool[Tensor, "n T k"]:
    """True at scored (sequence, position, target) triples: ``mask`` and not ignored
    (:data:`~mhainterp.model.loss.IGNORE_INDEX`); what every score and total counts."""
    n, T = mask.shape
    targets = targets.reshape(n, T, -1)  # (n, T, k)
    return (targets != IGNORE_INDEX) & mask[..., None]


@dataclass(frozen=True)
class Batch:
    """A batch of task sequences with their targets and masks.

    Attributes:
        tokens: Token ids ``[n, pos]`` (int64); padding positions hold ``task.pad_token``.
        targets: Class ids ``[n, pos]`` when the task has one target, ``[n, pos, n_targets]``
            otherwise (int64); ``-100`` wherever ``mask`` is False.
        mask: ``[n, pos]`` bool, True at the positions that are scored (loss and accuracy).
        padding_mask: ``[n, pos]`` bool, True for real tokens, False for padding. Pass it to the
            model so padding keys are masked in attention.

    Indexing selects rows and always keeps the batch axis: ``batch[3]`` is a one-row batch,
    ``batch[:64]`` and ``batch[perm]`` (an index tensor or list) work as on a tensor.

    Example:
        >>> import torch
        >>> b = Batch(
        ...     tokens=torch.tensor([[1, 2, 3]]),
        ...     targets=torch.tensor([[3, 2, 1]]),
        ...     mask=torch.ones(1, 3, dtype=torch.bool),
        ...     padding_mask=torch.ones(1, 3, dtype=torch.bool),
        ... )
        >>> len(b), b[0].tokens.shape
        (1, torch.Size([1, 3]))
    """

    tokens: Int[Tensor, "n pos"]
    targets: Int[Tensor, "n pos *k"]
    mask: Bool[Tensor, "n pos"]
    padding_mask: Bool[Tensor, "n pos"]

    def __post_init__(self) -> None:
        for name in ("tokens", "targets", "mask", "padding_mask"):
            value = getattr(self, name)
            if not isinstance(value, Tensor):
                raise TypeError(f"Batch.{name} must be a torch.Tensor, got {type(value).__name__}.")
        if self.tokens.ndim != 2:
            raise ParameterError(
                f"Batch.tokens is invalid: shape [n, pos], got shape {tuple(self.tokens.shape)}."
            )
        shape = tuple(self.tokens.shape)
        for name, dtype in (("tokens", torch.int64), ("targets", torch.int64)):
            if getattr(self, name).dtype != dtype:
                raise TypeError(
                    f"Batch.{name} must be int64, got {getattr(self, name).dtype}; "
                    f"convert with .long()."
                )
        for name in ("mask", "padding_mask"):
            value = getattr(self, name)
            if value.dtype != torch.bool:
                raise TypeError(f"Batch.{name} must be bool, got {value.dtype}.")
            if tuple(value.shape) != shape:
                raise ParameterError(
                    f"Batch.{name} is invalid: the shape of tokens {shape}, "
                    f"got {tuple(value.shape)}."
                )
        if tuple(self.targets.shape[:2]) != shape or self.targets.ndim not in (2, 3):
            raise ParameterError(
                f"Batch.targets is invalid: shape {shape} or {(*shape, 'n_targets')}, "
                f"got {tuple(self.targets.shape)}."
            )

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, idx: int | slice | Tensor | list[int]) -> Batch:
        if isinstance(idx, tuple):
            raise TypeError(
                "Batch indexing selects rows only (an int, slice, list or index tensor); "
                "index the tensors themselves to select positions."
            )
        if isinstance(idx, int) and not isinstance(idx, bool):
            idx = [idx]  # keep the batch axis
        return Batch(
            tokens=self.tokens[idx],
            targets=self.targets[idx],
            mask=self.mask[idx],
            padding_mask=self.padding_mask[idx],
        )

    @property
    def n_targets(self) -> int:
        """Targets per position: 1 for ``[n, pos]`` targets, else ``targets.shape[-1]``."""
        return 1 if self.targets.ndim == 2 else self.targets.shape[-1]

    @property
    def scored(self) -> Bool[Tensor, "n pos k"]:
        """True at the scored (sequence, position, target) triples (:func:`scored_positions`)."""
        return scored_positions(self.targets, self.mask)

    @property
    def has_targets(self) -> bool:
        """Whether any triple is scored (False for a batch made from bare tokens)."""
        return bool(self.mask.any())

    @property
    def device(self) -> torch.device:
        """The device the tensors are on."""
        return self.tokens.device

    def to(self, device: torch.device | str, **kwargs: Any) -> Batch:
        """Return a copy with every tensor moved to ``device`` (``kwargs`` go to ``Tensor.to``).

        Example:
            >>> b = get_task("reverse").sample(8)  # doctest: +SKIP
            >>> b.to("cuda").tokens.device  # doctest: +SKIP
            device(type='cuda', index=0)
        """
        return Batch(
            tokens=self.tokens.to(device, **kwargs),
            targets=self.targets.to(device, **kwargs),
            mask=self.mask.to(device, **kwargs),
            padding_mask=self.padding_mask.to(device, **kwargs),
        )
