"""``mhainterp/stats.py`` holds numbers only: tests, intervals, corrections and power.

The sentences that say a result in words (the head-count comparison's verdicts and sentences,
what n seeds can show) live in ``mhainterp/sweep/compare.py`` (DESIGN.md's layout card: "stats.py
the statistics ... one home; no sentences"). Two practical rules keep them out:

- **no string of prose**: outside docstrings, every string literal and f-string in stats.py has
  at most :data:`MAX_WORDS` words (whitespace-separated pieces with a letter; an f-string's
  placeholders are not words). What stats.py legitimately writes is a name, a test's ("exact
  permutation", "permutation (50,000 random splits)"), an interval method's ("none (no seed
  spread)"), a correction's ("Benjamini-Hochberg"), or the value part of an error ("values in
  [0, 1] (or NaN)"): 4 words at most. Every sentence builder has more: the shortest verdict,
  "no difference (every seed equal)", has 5, ``seed_power_note`` over 60;
- **no text formatting**: stats.py imports nothing of ours but ``mhainterp.validation``; how a p
  is printed (``mhainterp.render.format_p``) is needed by every sentence builder, and by no test.
"""

from __future__ import annotations

import ast
from pathlib import Path

STATS = Path(__file__).resolve().parents[1] / "mhainterp" / "stats.py"

MAX_WORDS = 4
"""The most words a string in stats.py may hold (docstrings aside): a name, not a sentence."""


def _words(text: str) -> int:
    return sum(any(c.isalpha() for c in piece) for piece in text.split())


def _strings(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, text)`` of every string literal and f-string outside docstrings; an
    f-string's placeholders become spaces (its literal parts are read as one text)."""
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    inner = set()  # the pieces of an f-string: counted with the f-string, not alone
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inner |= {id(value) for value in node.values}
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            inner.add(id(node.format_spec))
    found = []
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in inner:
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else " " for v in node.values)
            found.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def _prose(source: str) -> list[str]:
    return [
        f"line {line}: {text!r}"
        for line, text in _strings(ast.parse(source))
        if _words(text) > MAX_WORDS
    ]


def test_stats_holds_no_sentences() -> None:
    prose = _prose(STATS.read_text())
    assert prose == [], f"sentences belong in mhainterp/sweep/compare.py, not stats.py: {prose}"


def test_the_rule_catches_a_sentence_builder_and_spares_names() -> None:
    """The rule would fail if a sentence builder moved back (a verdict, a note), and lets the
    names stats.py writes through (a test, an interval method, an error's value)."""
    verdict = 'def v(row):\n    return "no difference (every seed equal)"\n'
    note = 'def n(k):\n    return f"{k} seeds per head count: an exact test cannot reach {k}"\n'
    joined = 'X = (\n    "with Holm over "\n    "many comparisons"\n)\n'  # implicit concatenation
    assert _prose(verdict) and _prose(note) and _prose(joined)
    names = (
        '"""A docstring may say as much as it likes, in as many words as it needs."""\n'
        'A = "none (no seed spread)"\n'
        'B = f"permutation ({10:,} random splits)"\n'
        'C = f"{1.5:+.2g}"\n'
    )
    assert _prose(names) == []


def test_stats_imports_no_text_formatting() -> None:
    tree = ast.parse(STATS.read_text())
    ours = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mhainterp")
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("mhainterp")
    }
    assert ours <= {"mhainterp.validation"}, f"stats.py formats no text; it imports {ours}"
