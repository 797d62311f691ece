"""Markdown and HTML blocks shared by the summaries and the reports.

A document is a list of blocks (:class:`Heading`, :class:`Paragraph`, :class:`Bullets`,
:class:`Table`, :class:`Image`); :func:`render_markdown` and :func:`render_html` write it out.
:func:`markdown_table` (and its cell formatter :func:`format_value`) is the one Markdown table
of the toolkit: sweep summaries, specialization summaries, the CLI and the reports use it.

Example:
    >>> print(render_markdown([Heading("Result", 2), Table(pd.DataFrame({"h": [4]}))], Path(".")))
    ## Result
    <BLANKLINE>
    | h |
    |---|
    | 4 |
    <BLANKLINE>
"""

from __future__ import annotations

import base64
import html
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = [
    "Block",
    "Bullets",
    "Heading",
    "Image",
    "Paragraph",
    "Table",
    "estimate_line",
    "format_duration",
    "format_p",
    "format_value",
    "html_table",
    "markdown_table",
    "render_html",
    "render_markdown",
    "split_columns",
]

MAX_COLUMNS = 8
"""The widest table a report shows (wider ones are split): 8 columns fit 1,280 px."""


# ----------------------------------------------------------------------------- tables


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


def format_index(value: float) -> str:
    """An index or selectivity in a sentence: two decimals from 0.1, three significant digits
    below it, where two decimals make an index, its interval and its null all read "0.01".

    Example:
        >>> format_index(0.3142), format_index(0.010521), format_index(0.0)
        ('0.31', '0.0105', '0.00')
    """
    return f"{value:.2f}" if value == 0 or abs(value) >= 0.1 else f"{value:.3g}"


def format_p(p: float | None, floor: float | None = None, *, exact: bool = False) -> str:
    """A p-value in text: ``"p = 0.031"``; at its ``floor`` (the smallest value its null can
    give) ``"p < 0.001"`` for a sampled null (e.g. ``1 / (1 + M)`` for M draws: a bound, not a
    measurement) or, with ``exact`` (an exact test, whose floor is reached exactly),
    ``"p = 0.1 (the floor)"``; ``"p < 1e-10"`` for tiny values; ``"p n/a"`` for NaN or None.

    Example:
        >>> format_p(0.0312), format_p(1 / 1001, 1 / 1001), format_p(float("nan"))
        ('p = 0.031', 'p < 0.001', 'p n/a')
        >>> format_p(0.1, 0.1, exact=True)
        'p = 0.1 (the floor)'
    """
    if p is None or math.isnan(float(p)):
        return "p n/a"
    p = float(p)
    if floor is not None and not math.isnan(float(floor)) and p <= float(floor) * (1 + 1e-9):
        return f"p = {float(floor):.2g} (the floor)" if exact else f"p < {float(floor):.2g}"
    if p < 1e-10:
        return "p < 1e-10"
    return f"p = {p:.2g}"


def format_duration(seconds: float) -> str:
    """A duration as people say it: ``"14 s"``, ``"2 min 5 s"``, ``"1 h 11 min"``.

    Example:
        >>> format_duration(14.2), format_duration(125), format_duration(4264)
        ('14 s', '2 min 5 s', '1 h 11 min')
    """
    total = max(0, round(float(seconds)))
    if total >= 3600:  # to the nearest minute: seconds of an hour-long estimate are noise
        hours, minutes = divmod(round(total / 60), 60)
        return f"{hours} h {minutes} min"
    minutes, secs = divmod(total, 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def estimate_line(what: str, unit: str, n_units: int, first_seconds: float) -> str:
    """The line said before long work goes on: how long its first unit took and the whole,
    extrapolated from it (and said to be).

    Example:
        >>> print(estimate_line("headline stability", "analysis", 333, 14.2))
        headline stability: the first of 333 analyses took 14 s; about 1 h 19 min in all \
(extrapolated from the first)
    """
    plural = unit[:-2] + "es" if unit.endswith("is") else unit + "s"
    return (
        f"{what}: the first of {n_units} {plural} took {format_duration(first_seconds)}; "
        f"about {format_duration(first_seconds * n_units)} in all (extrapolated from the first)"
    )


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


def split_columns(df: pd.DataFrame, max_columns: int = MAX_COLUMNS) -> list[pd.DataFrame]:
    """``df`` cut into tables of at most ``max_columns`` columns, each repeating the first
    column (the row's key: a head, a head count, a comparison) so every part reads alone.

    Example:
        >>> wide = pd.DataFrame([range(12)], columns=[f"c{i}" for i in range(12)])
        >>> [list(t.columns) for t in split_columns(wide, 6)]  # doctest: +NORMALIZE_WHITESPACE
        [['c0', 'c1', 'c2', 'c3', 'c4', 'c5'], ['c0', 'c6', 'c7', 'c8', 'c9', 'c10'],
         ['c0', 'c11']]
    """
    if len(df.columns) <= max_columns:
        return [df]
    key, rest = df.columns[0], list(df.columns[1:])
    width = max_columns - 1
    return [df[[key, *rest[i : i + width]]] for i in range(0, len(rest), width)]


# ----------------------------------------------------------------------------- blocks


@dataclass
class Heading:
    text: str
    level: int


@dataclass
class Paragraph:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    df: pd.DataFrame
    caption: str = ""


@dataclass
class Image:
    path: Path
    caption: str


Block = Heading | Paragraph | Bullets | Table | Image


def render_markdown(blocks: list[Block], out_dir: Path) -> str:
    lines: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            lines += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            lines += [block.text, ""]
        elif isinstance(block, Bullets):
            lines += [f"- {item}" for item in block.items] + [""]
        elif isinstance(block, Table):
            if block.caption:
                lines += [f"*{block.caption}*", ""]
            for part in split_columns(block.df):
                lines += [markdown_table(part), ""]
        elif isinstance(block, Image):
            rel = Path(os.path.relpath(block.path, out_dir)).as_posix()
            lines += [
                f"![{block.caption}]({rel})",
                "",
                f"*{block.caption}* (data: `{Path(rel).with_suffix('.csv').as_posix()}`)",
                "",
            ]
    return "\n".join(lines).rstrip() + "\n"


_CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f2f2f2; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0 1.6em; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #555; }
code { background: #f5f5f5; padding: 0 3px; }
"""


def html_table(df: pd.DataFrame) -> str:
    shown = df.copy()
    for column in shown.columns:
        shown[column] = [format_value(v) for v in shown[column]]
    return shown.to_html(index=False, escape=True, border=0)


def render_html(blocks: list[Block], title: str) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{html.escape(block.text)}</p>")
        elif isinstance(block, Bullets):
            items = "".join(f"<li>{html.escape(item)}</li>" for item in block.items)
            parts.append(f"<ul>{items}</ul>")
        elif isinstance(block, Table):
            if block.caption:
                parts.append(f"<p><em>{html.escape(block.caption)}</em></p>")
            parts += [html_table(part) for part in split_columns(block.df)]
        elif isinstance(block, Image):
            data = base64.b64encode(block.path.read_bytes()).decode("ascii")
            caption = html.escape(block.caption)
            parts.append(
                f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
