"""The one parameter validator: one message format, one error type.

Every user-facing parameter check in the toolkit goes through these functions, so every bad
argument reads the same way::

    n_eval=0 is invalid: an integer >= 1

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
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = [
    "MAX_PORT",
    "MAX_SEED",
    "ParameterError",
    "check_bool",
    "check_float",
    "check_int",
    "check_keys",
    "check_option",
    "check_port",
    "check_seed",
    "check_type",
    "invalid",
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
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``int(value)`` if it is an integer (a Python or NumPy int, not a bool) within bounds."""
    number = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)
        except TypeError:
            number = None
    in_range = number is not None and (minimum is None or number >= minimum)
    if in_range and (maximum is None or number <= maximum):
        return number
    raise invalid(name, value, _range_text("an integer", minimum, maximum))


def check_float(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    inclusive: bool = True,
) -> float:
    """``float(value)`` if it is a finite real number within the bounds (NaN and inf refused)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value >= minimum if inclusive else value > minimum
    if ok and maximum is not None:
        ok = value <= maximum if inclusive else value < maximum
    if ok:
        return float(value)
    raise invalid(name, value, _range_text("a finite number", minimum, maximum, inclusive))


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is True or False."""
    if isinstance(value, bool):
        return value
    raise invalid(name, value, "True or False")


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
    try:
        return check_int(name, value, minimum=0, maximum=MAX_SEED)
    except ParameterError:
        raise invalid(name, value, f"an integer >= 0 and <= {MAX_SEED} (2**63 - 1)") from None


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
    options = tuple(options)
    for option in options:
        if type(value) is type(option) and value == option:
            return option
    raise invalid(name, value, "one of " + ", ".join(repr(o) for o in options))


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


def _range_text(
    kind: str, minimum: float | None, maximum: float | None, inclusive: bool = True
) -> str:
    low, high = (">=", "<=") if inclusive else (">", "<")
    if minimum is not None and maximum is not None:
        return f"{kind} {low} {minimum} and {high} {maximum}"
    if minimum is not None:
        return f"{kind} {low} {minimum}"
    if maximum is not None:
        return f"{kind} {high} {maximum}"
    return kind
