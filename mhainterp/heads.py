"""Head names: ``L{layer}H{head}`` for one head, ``"L0H1,L0H3"`` for a set, everywhere.

A set written by one function (a table's ``heads`` column, a pruning step) can be fed back to
any other (``evaluate_head_sets``, ``Ablator.set``, the CLI's ``--heads``): one separator, ``","``.

Example:
    >>> head_label(0, 3)
    'L0H3'
    >>> format_heads([(0, 3), (0, 1)])
    'L0H1,L0H3'
    >>> parse_head_label("L1H2", n_layers=2, n_heads=4)
    (1, 2)

Every head list is read here: :func:`resolve_heads` with a model (checked against its shape),
:func:`head_set_labels` and :func:`parse_head_label` without one (a table's labels).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Protocol

from mhainterp.validation import ParameterError, invalid

__all__ = [
    "HEAD_SET_SEPARATOR",
    "HeadSpec",
    "ModelWithHeads",
    "all_head_labels",
    "all_heads",
    "format_heads",
    "head_label",
    "head_set_labels",
    "parse_head_label",
    "resolve_heads",
]

HEAD_SET_SEPARATOR = ","
HeadSpec = str | tuple[int, int]
"""One head: a label ``"L0H1"`` or a ``(layer, head)`` pair."""


class ModelWithHeads(Protocol):
    """What :func:`resolve_heads` reads of a model: ``cfg.n_layers`` and ``cfg.n_heads``.

    Every model of the toolkit has them (:class:`mhainterp.protocol.HookedModel`); heads.py
    sits below the model and the protocol, so it names only this, importing neither.
    """

    cfg: Any


_LABEL = re.compile(r"L(\d+)H(\d+)")


def head_label(layer: int, head: int) -> str:
    """The toolkit-wide head name, e.g. ``head_label(0, 3) == "L0H3"``."""
    return f"L{layer}H{head}"


def all_heads(n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """Every ``(layer, head)`` pair, layer-major."""
    return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]


def all_head_labels(n_layers: int, n_heads: int) -> list[str]:
    """Every head's label, layer-major (a model's ``head_labels``).

    Example:
        >>> all_head_labels(2, 2)
        ['L0H0', 'L0H1', 'L1H0', 'L1H1']
    """
    return [head_label(layer, head) for layer, head in all_heads(n_layers, n_heads)]


def parse_head_label(
    label: str, n_layers: int | None = None, n_heads: int | None = None
) -> tuple[int, int]:
    """``"L0H3"`` -> ``(0, 3)``, checked against the model's shape; without the shape (a
    table's labels), its form only.

    Raises:
        ParameterError: for a malformed or out-of-range label, listing the valid labels.

    Example:
        >>> parse_head_label("L12H3")
        (12, 3)
        >>> parse_head_label("L2H0", n_layers=2, n_heads=4)
        Traceback (most recent call last):
        mhainterp.validation.ParameterError: head='L2H0' is invalid: valid heads for this model: ...
    """
    if n_layers is None or n_heads is None:
        match = _LABEL.fullmatch(label) if isinstance(label, str) else None
        if match is None:
            raise invalid("head", label, "a head label like 'L0H3'")
        return int(match[1]), int(match[2])
    valid = all_head_labels(n_layers, n_heads)
    if isinstance(label, str) and label in valid:
        layer_text, head_text = label[1:].split("H")
        return int(layer_text), int(head_text)
    raise invalid("head", label, f"valid heads for this model: {', '.join(valid)}")


def resolve_heads(model: ModelWithHeads, heads: str | Iterable[HeadSpec]) -> list[tuple[int, int]]:
    """Turn head names into sorted, de-duplicated ``(layer, head)`` pairs for ``model``.

    Args:
        model: The model; only its ``cfg.n_layers`` and ``cfg.n_heads`` are read.
        heads: ``"L0H1"``, ``"L0H1,L0H3"``, a list of labels, or ``(layer, head)`` pairs; an
            empty string or list is the empty set.

    Raises:
        ParameterError: for an unknown head (``"L0H9"`` on 8 heads) or something that is not a
            head, listing the valid heads.

    Example:
        >>> resolve_heads(model, "L0H3,L0H1")  # doctest: +SKIP
        [(0, 1), (0, 3)]
    """
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if isinstance(heads, str):
        heads = head_set_labels(heads)
    if not isinstance(heads, Iterable):
        raise ParameterError(
            f"heads is invalid: a list of head labels like ['L0H1', 'L0H3'] or 'L0H1,L0H3', "
            f"got {type(heads).__name__}"
        )
    pairs: set[tuple[int, int]] = set()
    for spec in heads:
        if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(i, int) for i in spec):
            spec = head_label(*spec)
        if not isinstance(spec, str):
            raise invalid(
                "head",
                spec,
                f"a label like 'L0H1' or a (layer, head) pair; valid heads for this model: "
                f"{', '.join(all_head_labels(n_layers, n_heads))}",
            )
        pairs.add(parse_head_label(spec.strip(), n_layers, n_heads))
    return sorted(pairs)


def head_set_labels(heads: str) -> list[str]:
    """The labels of a head set as written, in order: ``"L0H3, L0H1"`` -> ``["L0H3", "L0H1"]``
    (blanks and empty parts dropped; the labels are not checked: :func:`parse_head_label`).

    Example:
        >>> head_set_labels("L0H3, L0H1,")
        ['L0H3', 'L0H1']
    """
    return [part.strip() for part in heads.split(HEAD_SET_SEPARATOR) if part.strip()]


def format_heads(pairs: Iterable[tuple[int, int]]) -> str:
    """``[(0, 3), (0, 1)]`` -> ``"L0H1,L0H3"`` (sorted; ``""`` for no heads)."""
    return HEAD_SET_SEPARATOR.join(head_label(*pair) for pair in sorted(pairs))
