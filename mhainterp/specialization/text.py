"""Small text helpers shared by the verdicts and the report: Markdown tables of DataFrames."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

__all__ = ["format_value", "markdown_table"]


def format_value(value: Any, digits: int = 3) -> str:
    """A table cell: floats to ``digits`` significant decimals, NaN/None as empty.

    Example:
        >>> format_value(0.123456), format_value(float("nan")), format_value(3)
        ('0.123', '', '3')
    """
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value != 0 and abs(value) < 10 ** (-digits):
            return f"{value:.1e}"
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub-flavoured Markdown table of ``df`` (index dropped; ``|`` escaped).

    Example:
        >>> print(markdown_table(pd.DataFrame({"h": [1], "acc": [0.5]})))
        | h | acc |
        |---|---|
        | 1 | 0.500 |
    """

    def cell(value: Any) -> str:
        return format_value(value, digits).replace("|", "\\|").replace("\n", " ")

    header = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])
