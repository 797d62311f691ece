"""The labelling rules of :func:`decide_labels` on hand-written role tables: which of tied roles
a head holds (the most specific, then the table's order, a NaN chance last), which roles it
mixes (largest effect first, ties in the table's order, nested roles excluded) and when it
counts. The rules run on plain lists (issue 38: pandas per head was half the specialization
test); these pin the order pandas' stable sorts gave."""

from __future__ import annotations

import math

import pandas as pd

from mhainterp.specialization import SpecializationSettings
from mhainterp.specialization.verdict.labels import decide_labels, mixed_roles

NAN = math.nan


def _roles(*rows: tuple[str, float, float, float]) -> pd.DataFrame:
    """One head's significant roles: ``(role, effect, chance, evenness)`` each."""
    return pd.DataFrame(
        [
            {"head_label": "L0H0", "role": r, "p_adj": 1e-9, "effect": e, "chance": c,
             "evenness": v}
            for r, e, c, v in rows
        ]
    )  # fmt: skip


def _decision(roles: pd.DataFrame, nested=None, **settings):
    """The head's decision; unless ``nested`` is given, every pair of its roles nests (so no
    two of them mix)."""
    if nested is None:
        nested = {(a, b) for a in roles["role"] for b in roles["role"]}
    return decide_labels(roles, {"L0H0": 1.0}, {}, SpecializationSettings(**settings), nested)[
        "L0H0"
    ]


def test_among_tied_roles_the_most_specific_then_the_first_in_the_table_wins():
    # within 0.01 of the best effect: the smallest chance wins, whatever its effect
    assert _decision(_roles(("previous", 0.9, 0.3, NAN), ("self", 0.895, 0.1, NAN))).best == "self"
    # equal chance: the first row of the table
    tied = _roles(("previous", 0.9, 0.2, NAN), ("self", 0.9, 0.2, NAN))
    assert _decision(tied).best == "previous"
    assert _decision(tied.iloc[::-1]).best == "self"
    # a NaN chance sorts last
    unknown = _roles(("previous", 0.9, NAN, NAN), ("self", 0.9, 0.5, NAN))
    assert _decision(unknown).best == "self"
    # beyond the tolerance the effect decides
    assert _decision(_roles(("previous", 0.9, 0.3, NAN), ("self", 0.85, 0.1, NAN))).best == (
        "previous"
    )


def test_mixed_roles_lead_with_the_largest_effect_and_keep_the_tables_order_among_ties():
    rows = _roles(("mirror", 0.5, 0.1, NAN), ("previous", 0.6, 0.1, NAN), ("self", 0.5, 0.1, NAN))
    assert mixed_roles(rows, set(), 0.5) == ["previous", "mirror", "self"]
    assert mixed_roles(rows, {("self", "previous")}, 0.5) == ["previous", "mirror"]
    assert mixed_roles(rows, set(), 0.9) == []  # 0.5 < 0.9 x 0.6
    decision = _decision(rows, set(), mix_ratio=0.5)
    assert (decision.label, decision.role, decision.mixed) == (
        "unspecialized", "", ["previous", "mirror", "self"]
    )  # fmt: skip
    assert decision.significant == ["mirror", "previous", "self"]  # the table's order


def test_a_head_counts_only_with_a_known_evenness_at_the_gate():
    even = _decision(_roles(("same_token_upto", 0.9, 0.2, 0.97)))
    assert (even.label, even.best) == ("count:same_token_upto", "same_token_upto")
    assert _decision(_roles(("same_token_upto", 0.9, 0.2, NAN))).label == "same_token_upto"
    insignificant = _roles(("previous", 0.9, 0.2, NAN)).assign(p_adj=0.5)
    assert _decision(insignificant).label == "unspecialized"
