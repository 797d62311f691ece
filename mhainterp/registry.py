"""``Registry``: things registered by name (the ablation methods, the division axes), read
as a mapping in registration order.

Every column list, default and help text that names the methods or the axes iterates its
registry when it is needed, not when a module is imported, so one registration reaches them
all; :meth:`Registry.temporary` restores a registry after a block (tests, a notebook's
experiment). Imports nothing heavy: the command's ``--help`` may read one.

Example:
    >>> colours = Registry("colour")
    >>> colours.register("red", 0xFF0000)
    16711680
    >>> with colours.temporary():
    ...     _ = colours.register("blue", 0x0000FF)
    ...     list(colours)
    ['red', 'blue']
    >>> list(colours), colours.check("red")
    (['red'], 'red')
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from mhainterp.validation import check_option, check_type, invalid

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Entries by name, in registration order; iterating gives the names.

    Args:
        option: The parameter name a lookup's error names (``"method"``, ``"axis"``).
    """

    def __init__(self, option: str) -> None:
        self.option = option
        self._entries: dict[str, T] = {}

    # A registry is one object, passed around and used as a default: hashed by identity
    __hash__ = object.__hash__

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Register ``entry`` as ``name`` (last in the order) and return it.

        Raises:
            ParameterError: ``name`` is taken (and ``replace`` is False) or not a word.
        """
        check_type(f"{self.option} name", name, str, "a non-empty string")
        if not name.isidentifier():
            raise invalid(f"{self.option} name", name, "a Python identifier (it names columns)")
        if name in self._entries and not replace:
            raise invalid(
                f"{self.option} name", name, "a name not registered yet (or replace=True)"
            )
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (refused when it is not registered)."""
        del self._entries[self.check(name)]

    def check(self, name: object) -> str:
        """``name`` if it is registered (the one message format otherwise)."""
        return check_option(self.option, name, tuple(self._entries))

    @contextlib.contextmanager
    def temporary(self) -> Iterator[Registry[T]]:
        """The registry as it is, restored after the block whatever was (un)registered in it."""
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)

    def __getitem__(self, name: str) -> T:
        return self._entries[self.check(name)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str, default: T | None = None) -> T | None:
        return self._entries.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.option!r}: {', '.join(self._entries)})"
