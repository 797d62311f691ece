"""Known outputs of the shared Markdown/HTML blocks (mhainterp.render)."""

from __future__ import annotations

import base64
import math
from pathlib import Path

import pandas as pd

from mhainterp.render import (
    Bullets,
    Heading,
    Image,
    Paragraph,
    Table,
    format_value,
    html_table,
    markdown_table,
    render_html,
    render_markdown,
)


def test_format_value_cells():
    assert format_value(0.123456) == "0.123"
    assert format_value(0.123456, digits=1) == "0.1"
    assert format_value(0.00012) == "1.2e-04"  # below the shown precision, but not zero
    assert format_value(0.0) == "0.000"
    assert format_value(math.nan) == "" and format_value(None) == ""
    assert format_value(3) == "3" and format_value("h=4 better") == "h=4 better"


def test_markdown_table_escapes_pipes_and_newlines():
    df = pd.DataFrame({"heads": ["L0H0|L0H1", "two\nlines"], "acc": [0.5, math.nan]})
    assert markdown_table(df) == (
        "| heads | acc |\n|---|---|\n| L0H0\\|L0H1 | 0.500 |\n| two lines |  |"
    )


def test_render_markdown_blocks(tmp_path):
    figure = tmp_path / "figs" / "acc.png"
    blocks = [
        Heading("Title", 1),
        Paragraph("Some text."),
        Bullets(["a", "b"]),
        Table(pd.DataFrame({"h": [1]}), "Caption"),
        Image(figure, "Accuracy"),
    ]
    assert render_markdown(blocks, tmp_path) == (
        "# Title\n\nSome text.\n\n- a\n- b\n\n*Caption*\n\n| h |\n|---|\n| 1 |\n\n"
        "![Accuracy](figs/acc.png)\n\n*Accuracy* (data: `figs/acc.csv`)\n"
    )


def test_render_html_escapes_and_embeds_images(tmp_path):
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG fake")
    page = render_html(
        [Heading("a < b", 2), Bullets(["<script>"]), Image(png, "fig & co")], "T & T"
    )
    assert "<title>T &amp; T</title>" in page
    assert "<h2>a &lt; b</h2>" in page and "<li>&lt;script&gt;</li>" in page
    data = base64.b64encode(b"\x89PNG fake").decode("ascii")
    assert f'<img alt="fig &amp; co" src="data:image/png;base64,{data}">' in page
    assert 'src="http' not in page and "href=" not in page


def test_html_table_formats_cells_like_markdown():
    table = html_table(pd.DataFrame({"p": [0.123456], "who": ["<b>"]}))
    assert "<td>0.123</td>" in table and "<td>&lt;b&gt;</td>" in table


def test_wide_tables_are_split_and_keep_their_key_column():
    from mhainterp.render import Table, render_markdown, split_columns

    wide = pd.DataFrame([list(range(16))], columns=[f"c{i}" for i in range(16)])
    parts = split_columns(wide)
    assert [len(p.columns) for p in parts] == [8, 8, 2]
    assert all(p.columns[0] == "c0" for p in parts)
    md = render_markdown([Table(wide)], Path("."))
    assert md.count("| c0 |") == 3 and "c15" in md
