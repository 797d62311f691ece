"""The division of labour's axes as a registry: what a batch's scored (sequence, position,
target) triples can be grouped by.

Each axis is ONE registered :class:`DivisionAxis` (:func:`register_axis`): its name, a
one-line help, how its value at every scored triple is computed from the batch, and how a
value is named. The built-ins, in this order: the query token, its position, the class to
output, and which target (multi-target tasks). The division of labour splits damage by them,
the explorer groups loss and accuracy by them, and every per-axis column, default (``--by``)
and help text iterates :data:`AXES`.

Shapes: n sequences, T positions, N scored triples.

Example:
    >>> list(AXES)
    ['token', 'position', 'target_class', 'target']
    >>> AXES["position"].help
    'the query position'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jaxtyping import Int
from torch import Tensor

from mhainterp.registry import Registry
from mhainterp.tasks.batch import Batch
from mhainterp.validation import check_type

__all__ = ["AXES", "Axis", "DivisionAxis", "register_axis"]

Axis = str
"""The name of a registered division axis (a key of :data:`AXES`)."""

AxisValues = Callable[[Batch, Tensor, Tensor, Tensor], Int[Tensor, " N"]]


def _number(value: int, target_names: Sequence[str]) -> str:
    return str(value)


@dataclass(frozen=True)
class DivisionAxis:
    """One axis of the division of labour.

    Attributes:
        name: Its name (its key in :data:`AXES`, its columns' ``by`` and ``division_{name}``).
        help: One line for ``--help`` and the docs.
        values: ``(batch, sequence, position, target) -> [N]`` non-negative int ids of the
            axis's value at each scored triple (the three ``[N]`` index tensors of the
            triples, on the batch's device).
        label: ``(id, target_names) -> str``: how a value is named in tables (default: the
            number).
        title: What the explorer's page calls it (default: the name, ``_`` as spaces).
    """

    name: str
    help: str
    values: AxisValues
    label: Callable[[int, Sequence[str]], str] = _number
    title: str = ""

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", self.name.replace("_", " "))


AXES: Registry[DivisionAxis] = Registry("axis")
"""The division axes by name, in registration order; ``mhainterp.cli.static.DIVISION_AXES``
mirrors the built-ins' names and help for ``--help`` (the default of ``--by``)."""


def register_axis(axis: DivisionAxis, *, replace: bool = False) -> DivisionAxis:
    """Register ``axis`` under its name (last in the order) and return it.

    Raises:
        ParameterError: not a DivisionAxis, or its name is taken (and ``replace`` is False).
    """
    check_type("axis", axis, DivisionAxis, "a DivisionAxis")
    return AXES.register(axis.name, axis, replace=replace)


def _target_class(batch: Batch, i: Tensor, t: Tensor, j: Tensor) -> Tensor:
    n, T = batch.tokens.shape
    return batch.targets.reshape(n, T, -1)[i, t, j]


def _target_name(value: int, target_names: Sequence[str]) -> str:
    return target_names[value] if target_names else str(value)


for _axis in (
    DivisionAxis(
        "token", "the query token", lambda batch, i, t, j: batch.tokens[i, t], title="query token"
    ),
    DivisionAxis("position", "the query position", lambda batch, i, t, j: t),
    DivisionAxis("target_class", "the class to output", _target_class),
    DivisionAxis("target", "which target (multi-target tasks)", lambda b, i, t, j: j, _target_name),
):
    register_axis(_axis)
