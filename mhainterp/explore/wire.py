"""What crosses to the page: JSON it can parse, which has no NaN or infinity.

The server (:func:`~mhainterp.explore.server.json_bytes`) and the notebook widget's messages
(:func:`~mhainterp.explore.app.answer_message`) both send their answers through
:func:`json_ready`, so a NaN in a saved table or a computed number reaches the page as
``null``, which it shows as "not measured".

Example:
    >>> json_ready([1.0, float("nan")])
    [1.0, None]
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["json_ready"]


def json_ready(value: Any) -> Any:
    """``value`` with every NaN or infinity, however deeply nested, replaced by None (what the
    page shows as "not measured"); the notebook widget's messages go through it too.

    Example:
        >>> json_ready({"L0H1": float("nan"), "rows": [(1.5, float("-inf"))]})
        {'L0H1': None, 'rows': [[1.5, None]]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value
