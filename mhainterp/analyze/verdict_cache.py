"""Resumable stages of a pretrained model's verdict: each stage's result saved when it finishes.

The verdict on a pretrained model takes minutes (the division, then the specialization test).
:func:`stage_cache` names a folder ``out/cache/<key>/`` whose key hashes everything the results
depend on (the model's provenance, the text, ``n_eval``, the BOS prefix, the settings, the axes
and the screen), so an interrupted run started again with the same arguments reloads the
finished stages, and a run with other arguments never does. Each stage is written by its own
``save`` (atomic files, its JSON marker last: a stage killed half-way reads as not saved). A
damaged stage file is refused with one line naming it and the fix.

Example:
    >>> cache = stage_cache("runs/minilm", model, "stdlib", 64, True, settings)  # doctest: +SKIP
    >>> cache.load("division", DivisionResult.load) is None  # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mhainterp.errors import OutdatedResultError, RunFolderError
from mhainterp.io import write_json
from mhainterp.specialization.whom.screen import SCREEN_RULE

__all__ = ["StageCache", "stage_cache"]

T = TypeVar("T")

CACHE_FOLDER = "cache"


@dataclass(frozen=True)
class StageCache:
    """Where the stages of one verdict are saved (``folder``), and their key's inputs."""

    folder: Path
    key: dict[str, Any]

    def load(self, stage: str, loader: Callable[[Path, str], T]) -> T | None:
        """The saved result of ``stage`` (``loader(folder, stage)``), or None when it has not
        finished.

        Raises:
            RunFolderError: A file of the stage is damaged (the message names it, and says to
                delete the cache folder to recompute).
        """
        if not (self.folder / f"{stage}.json").is_file():  # its marker is written last
            return None
        try:
            return loader(self.folder, stage)
        except OutdatedResultError:  # an older version's tables: recompute them
            return None
        except (RunFolderError, ValueError, KeyError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RunFolderError(
                f"the saved stage {stage!r} in {self.folder} is damaged ({first}); delete "
                f"{self.folder} and run the command again to recompute it"
            ) from None

    def save(self, stage: str, saver: Callable[[Path, str], Any]) -> None:
        """Save ``stage`` with ``saver(folder, stage)`` (atomic files, marker last)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        key = self.folder / "key.json"
        if not key.is_file():
            write_json(key, self.key)
        saver(self.folder, stage)


def stage_cache(
    out: str | os.PathLike[str],
    model: Any,
    text: Any,
    n_eval: int,
    bos: bool,
    settings: Any,
    by: Any = None,
    screen: str = "none",
) -> StageCache:
    """The :class:`StageCache` of one verdict in ``out/cache/``, keyed by its inputs.

    Example:
        >>> from types import SimpleNamespace
        >>> from mhainterp.specialization import SpecializationSettings
        >>> m = SimpleNamespace(provenance={"source": "x"})
        >>> a = stage_cache("o", m, "stdlib", 8, True, SpecializationSettings())
        >>> b = stage_cache("o", m, "stdlib", 16, True, SpecializationSettings())
        >>> a.folder != b.folder, a.folder.parent.as_posix()
        (True, 'o/cache')
    """
    key = {
        "model": dict(getattr(model, "provenance", {}) or {}),
        "text": str(text),
        "text_sha256": _file_digest(text),
        "n_eval": int(n_eval),
        "bos": bool(bos),
        "settings": settings.to_dict(),
        "by": None if by is None else (by if isinstance(by, str) else list(by)),
        "screen": screen,
        "screen_rule": SCREEN_RULE,  # a verdict saved under another screen rule is rerun
    }
    text_key = json.dumps(key, sort_keys=True, default=str)
    digest = hashlib.sha256(text_key.encode()).hexdigest()[:16]
    return StageCache(Path(out) / CACHE_FOLDER / digest, key)


def _file_digest(text: Any) -> str | None:
    """A text file's SHA-256 (its sentences may change under the same name); None for a
    named source such as ``"stdlib"``."""
    path = Path(str(text))
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
