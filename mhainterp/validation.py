"""The one parameter validator: one message format, one error type.

Every user-facing parameter check in the toolkit goes through these functions, so every bad
argument reads the same way::

    n_eval=0 is invalid: an integer >= 1

A settings class declares what each field allows in a table, as scikit-learn's
``_parameter_constraints``, and its ``__post_init__`` calls :func:`validate`, which walks it::

    _parameter_constraints = {
        "n_eval": [Interval(int, 1)],
        "grad_clip": [Interval(float, 0, closed="right"), None],
    }

A field is valid when any of its constraints allows it (``None`` in the list: None is allowed);
the error says what all of them allow together. What relates two fields (``n_heads`` divides
``d_model``) stays in ``__post_init__``, after the table.

:class:`ParameterError` subclasses both ``ValueError`` and ``TypeError`` (as scikit-learn's
``InvalidParameterError`` does), so callers may catch either; the CLI turns it into one line.

Example:
    >>> check_int("n_eval", 1024, minimum=1)
    1024
    >>> check_option("method", "mean", ("zero", "mean", "resample"))
    'mean'
    >>> check_option("method", "max", ("zero", "mean"))
    Traceback (most recent call last):
    ...
    mhainterp.validation.ParameterError: method='max' is invalid: one of 'zero', 'mean'
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

__all__ = [
    "MAX_PORT",
    "MAX_SEED",
    "Constraint",
    "ConstraintList",
    "DistinctList",
    "Interval",
    "Options",
    "ParameterError",
    "BOOLEAN",
    "SEED_RANGE",
    "Satisfies",
    "SomeOf",
    "allowed_text",
    "check_bool",
    "check_float",
    "check_int",
    "check_keys",
    "check_option",
    "check_port",
    "check_seed",
    "check_type",
    "invalid",
    "validate",
]

T = TypeVar("T")

MAX_SEED = 2**63 - 1
"""Largest seed: seeds go to ``torch.Generator.manual_seed``, which takes a signed 64-bit int."""

MAX_PORT = 65535
"""Largest TCP port (0 asks the system for any free one)."""


class ParameterError(ValueError, TypeError):
    """A parameter has a value or type that is not allowed (the message says what is)."""


def invalid(name: str, value: Any, allowed: str) -> ParameterError:
    """The error for ``name=value``, in the toolkit's one format (raise it yourself).

    Example:
        >>> str(invalid("heads", "L0H9", "one of L0H0..L0H3"))
        "heads='L0H9' is invalid: one of L0H0..L0H3"
    """
    return ParameterError(f"{name}={_show(value)} is invalid: {allowed}")


def _show(value: Any) -> str:
    """``repr(value)``, its middle cut past 80 characters (200 for a path or text: a message
    names the file, and the file's name is at the end), so a huge value stays one line.

    Example:
        >>> _show("/tmp/" + "d" * 300 + "/dots.txt")[-10:]
        "/dots.txt'"
    """
    text = repr(value)
    limit = 200 if isinstance(value, (str, os.PathLike)) else 80
    if len(text) <= limit:
        return text
    head = (limit - 3) // 2
    return text[:head] + "..." + text[-(limit - 3 - head) :]


# ----------------------------------------------------------------------------- constraints


class Constraint(Protocol):
    """One entry of a ``_parameter_constraints`` list: what it allows, and says so in words."""

    def allows(self, value: Any) -> bool: ...

    def describe(self, value: Any) -> str: ...


@dataclass(frozen=True)
class Interval:
    """An integer (``kind=int``: a Python or NumPy int, not a bool) or a finite number
    (``kind=float``: an int or float, not a bool, NaN or inf) between ``low`` and ``high``
    (None: unbounded); ``closed`` says which ends are allowed; ``note`` is added in brackets.

    Example:
        >>> Interval(float, 0, 1, closed="right").describe(0)
        'a finite number > 0 and <= 1'
        >>> Interval(int, 1).allows(True), Interval(int, 1).allows(3)
        (False, True)
    """

    kind: type
    low: float | None = None
    high: float | None = None
    closed: Literal["both", "left", "right", "neither"] = "both"
    note: str = ""

    def allows(self, value: Any) -> bool:
        number = self.number(value)
        if number is None:
            return False
        open_low, open_high = (
            self.closed in ("right", "neither"),
            self.closed in ("left", "neither"),
        )
        if self.low is not None and (number < self.low or (open_low and number == self.low)):
            return False
        return self.high is None or not (number > self.high or (open_high and number == self.high))

    def number(self, value: Any) -> int | float | None:
        """``value`` as this kind (``operator.index`` for an int), or None if it is not one."""
        if isinstance(value, bool):
            return None
        if self.kind is int:
            try:
                return operator.index(value)
            except TypeError:
                return None
        if isinstance(value, (int, float)) and math.isfinite(value):
            return value
        return None

    def describe(self, value: Any = None) -> str:
        kind = "an integer" if self.kind is int else "a finite number"
        low = ">=" if self.closed in ("both", "left") else ">"
        high = "<=" if self.closed in ("both", "right") else "<"
        bounds = [f"{low} {self.low}"] if self.low is not None else []
        bounds += [f"{high} {self.high}"] if self.high is not None else []
        text = " ".join([kind, " and ".join(bounds)]) if bounds else kind
        return f"{text} ({self.note})" if self.note else text


@dataclass(frozen=True)
class Options:
    """One of ``values``, compared with ``==`` and the same type (``1`` is not ``True``);
    ``values`` may be a registry, read at each check (so a method registered later is allowed).

    Example:
        >>> Options((None, "LN")).describe("RMS")
        "one of None, 'LN'"
    """

    values: tuple[Any, ...]

    def allows(self, value: Any) -> bool:
        return any(type(value) is type(option) and value == option for option in self.values)

    def describe(self, value: Any = None) -> str:
        return "one of " + ", ".join(repr(option) for option in self.values)


@dataclass(frozen=True)
class SomeOf:
    """One or more of ``values``: one of them, or a non-empty tuple or list of them.

    Example:
        >>> SomeOf(("zero", "mean")).allows(("mean",)), SomeOf(("zero", "mean")).allows(())
        (True, False)
    """

    values: tuple[Any, ...]

    def allows(self, value: Any) -> bool:
        one = Options(self.values)
        if one.allows(value):
            return True
        return isinstance(value, (tuple, list)) and bool(value) and all(map(one.allows, value))

    def describe(self, value: Any = None) -> str:
        return "one or more of " + ", ".join(repr(option) for option in self.values)


@dataclass(frozen=True)
class DistinctList:
    """A non-empty list (or tuple) of distinct Python numbers that ``each`` allows; ``what``
    names them in words (``"seeds, each in [0, 9]"``).

    Example:
        >>> DistinctList(Interval(int, 1), "head counts").describe([4, 4])
        'a list of distinct head counts (no repeats)'
    """

    each: Interval
    what: str

    def allows(self, value: Any) -> bool:
        return self._valid_items(value) and len(set(value)) == len(value)

    def _valid_items(self, value: Any) -> bool:
        return isinstance(value, (list, tuple)) and bool(value) and all(map(self._item, value))

    def _item(self, item: Any) -> bool:
        # a Python number, not a NumPy one: the list is written to JSON as it is
        kinds = (int, float) if self.each.kind is float else self.each.kind
        return isinstance(item, kinds) and self.each.allows(item)

    def describe(self, value: Any = None) -> str:
        if self._valid_items(value):  # only a repeat is wrong: say that
            return f"a list of distinct {self.what} (no repeats)"
        return f"a non-empty list of {self.what}"


@dataclass(frozen=True)
class Satisfies:
    """A value for which ``test`` is true; ``what`` says in words which those are (for the
    shapes no other constraint names, such as AdamW's two betas).

    Example:
        >>> Satisfies(lambda v: v == 2, "two").describe(3)
        'two'
    """

    test: Callable[[Any], bool]
    what: str

    def allows(self, value: Any) -> bool:
        try:
            return bool(self.test(value))
        except (TypeError, ValueError):
            return False

    def describe(self, value: Any = None) -> str:
        return self.what


SEED_RANGE = Interval(int, 0, MAX_SEED, note="2**63 - 1")
"""A seed torch accepts (``torch.Generator.manual_seed`` takes a signed 64-bit int)."""

BOOLEAN = Satisfies(lambda value: isinstance(value, bool), "True or False")
"""True or False (not 1, not ``"yes"``)."""

ConstraintList = Sequence[Constraint | None]


def allowed_text(constraints: ConstraintList, value: Any = None) -> str:
    """What ``constraints`` allow together, in words (``None`` last: ``..., or None``).

    Example:
        >>> allowed_text([None, Interval(float, 0, closed="neither")])
        'a finite number > 0, or None'
    """
    words = [c.describe(value) for c in constraints if c is not None]
    text = " or ".join(words)
    if any(c is None for c in constraints):
        text = f"{text}, or None" if text else "None"
    return text


def _allows(constraint: Constraint | None, value: Any) -> bool:
    return value is None if constraint is None else constraint.allows(value)


def validate(owner: Any, constraints: Mapping[str, ConstraintList] | None = None) -> None:
    """Check every field of ``owner`` that its class's ``_parameter_constraints`` (or
    ``constraints``) names, in the table's order; the first one no constraint allows raises
    :class:`ParameterError` in the one format, naming the field, its value and what is allowed.

    Example:
        >>> class Settings:
        ...     _parameter_constraints = {"alpha": [Interval(float, 0, 1, closed="neither")]}
        ...     alpha = 1.5
        >>> validate(Settings())
        Traceback (most recent call last):
        ...
        mhainterp.validation.ParameterError: alpha=1.5 is invalid: a finite number > 0 and < 1
    """
    table = type(owner)._parameter_constraints if constraints is None else constraints
    for name, allowed in table.items():
        value = getattr(owner, name)
        if not any(_allows(constraint, value) for constraint in allowed):
            raise invalid(name, value, allowed_text(allowed, value))


# ----------------------------------------------------------------------------- single checks


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``int(value)`` if it is an integer (a Python or NumPy int, not a bool) within bounds."""
    interval = Interval(int, minimum, maximum)
    if interval.allows(value):
        return operator.index(value)
    raise invalid(name, value, interval.describe())


def check_float(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    inclusive: bool = True,
) -> float:
    """``float(value)`` if it is a finite real number within the bounds (NaN and inf refused)."""
    interval = Interval(float, minimum, maximum, closed="both" if inclusive else "neither")
    if interval.allows(value):
        return float(value)
    raise invalid(name, value, interval.describe())


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is True or False."""
    if BOOLEAN.allows(value):
        return value
    raise invalid(name, value, BOOLEAN.describe())


def check_seed(name: str, value: Any) -> int:
    """``value`` if it is a seed torch accepts: an integer with ``0 <= seed <= MAX_SEED``.

    Example:
        >>> check_seed("seed", 2**63 - 1)
        9223372036854775807
        >>> check_seed("seed", 2**64)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mhainterp.validation.ParameterError: seed=18446744073709551616 is invalid: an integer...
    """
    if SEED_RANGE.allows(value):
        return operator.index(value)
    raise invalid(name, value, SEED_RANGE.describe())


def check_port(name: str, value: Any) -> int:
    """``value`` if it is a TCP port: an integer with ``0 <= port <= 65535`` (0: any free port).

    Example:
        >>> check_port("--port", 70000)
        Traceback (most recent call last):
        ...
        mhainterp.validation.ParameterError: --port=70000 is invalid: an integer >= 0 ...
    """
    try:
        return check_int(name, value, minimum=0, maximum=MAX_PORT)
    except ParameterError:
        allowed = f"an integer >= 0 and <= {MAX_PORT} (0: any free port)"
        raise invalid(name, value, allowed) from None


def check_option(name: str, value: Any, options: Iterable[T]) -> T:
    """``value`` if it is one of ``options`` (compared with ``==``, types must match)."""
    allowed = Options(tuple(options))
    for option in allowed.values:
        if type(value) is type(option) and value == option:
            return option
    raise invalid(name, value, allowed.describe())


def check_keys(name: str, mapping: Any, known: Iterable[str]) -> None:
    """Refuse keys of ``mapping`` that are not in ``known`` (a misspelt field, say).

    Example:
        >>> check_keys("config", {"step": 1}, ("steps", "lr"))
        Traceback (most recent call last):
        ...
        mhainterp.validation.ParameterError: config keys=['step'] is invalid: only 'lr', 'steps'
    """
    known = sorted(known)
    unknown = sorted(set(mapping) - set(known))
    if unknown:
        raise invalid(f"{name} keys", unknown, "only " + ", ".join(repr(k) for k in known))


def check_type(name: str, value: Any, types: type | tuple[type, ...], allowed: str) -> Any:
    """``value`` if it is an instance of ``types``; ``allowed`` says what is, in words."""
    if isinstance(value, types):
        return value
    raise ParameterError(f"{name} is invalid: {allowed}, got {type(value).__name__}")
