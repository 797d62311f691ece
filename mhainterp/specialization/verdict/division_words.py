"""A division row in words: its call (:func:`axis_call`), its evidence (index, interval and
null, the basis it rests on, the methods it agrees under) and the headline clause a set of
calls makes (:func:`headline_call`), axes that only follow another named with it.

The verdict's sentences (:mod:`.sentences`) put these into run and seed-group verdicts; the
report, the figures' titles and the seed summaries name bases and undefined indices with the
same words (:data:`BASIS_NAMES`, :data:`UNDEFINED_INDEX`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import Any

from mhainterp.ablation.replacement import method_order
from mhainterp.heads import head_set_labels, parse_head_label
from mhainterp.render import format_index, format_p
from mhainterp.specialization.settings import DivisionSettings
from mhainterp.specialization.whom.division_calls import (
    CALLS,
    restated_axis,
    zero_artefact,
    zero_left_out_text,
)

__all__ = [
    "BASIS_NAMES",
    "SEEDS_DISAGREE",
    "SERVING_CALLS",
    "UNCALLED_MIN_GAIN",
    "UNDEFINED_INDEX",
    "axis_call",
    "basis_text",
    "compared_unit_labels",
    "division_axes",
    "division_text",
    "headline_call",
    "is_finite",
    "layer_of",
    "with_layers",
]

UNDEFINED_INDEX = "undefined (fewer than 2 heads do damage)"
"""How an index that single-head removal cannot define is written (never "nan vs null nan")."""

BASIS_NAMES = {
    "single": "single-head profiles",
    "kept": "kept-head profiles",
    "group": "group profiles",
}
"""How each basis of a division call is named, in sentences and figure titles alike."""


def with_layers(heads: list[str]) -> str:
    """Heads joined, each with its layer named when they span several layers (a layer-0
    previous-token head compared with a layer-1 induction head says so).

    Example:
        >>> with_layers(["L0H3", "L1H1"])
        'L0H3 (layer 0) and L1H1 (layer 1)'
        >>> with_layers(["L0H0", "L0H1", "L1H2"])
        'L0H0, L0H1 (layer 0) and L1H2 (layer 1)'
        >>> with_layers(["L0H0", "L0H2"])
        'L0H0, L0H2'
        >>> with_layers(compared_unit_labels("(L0H0,L1H1),L1H2"))  # a group: its first layer
        '(L0H0,L1H1) (layer 0) and L1H2 (layer 1)'
    """
    by_layer: dict[str, list[str]] = {}
    for head in heads:
        by_layer.setdefault(layer_of(head), []).append(head)
    if len(by_layer) < 2:
        return ", ".join(heads)
    parts = [f"{', '.join(h)} (layer {layer})" for layer, h in by_layer.items()]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def layer_of(unit: str) -> str:
    """``"0"`` for ``L0H3`` (a group ``(L0H0,L0H1)``: its first head's layer)."""
    return str(parse_head_label(head_set_labels(unit.strip("()"))[0])[0])


def compared_unit_labels(units: str) -> list[str]:
    """The units of :func:`~mhainterp.specialization.seeds.combine.compared_units`, split at
    the commas between them, not inside a group.

    Example:
        >>> compared_unit_labels("(L0H0,L1H1),L1H2")
        ['(L0H0,L1H1)', 'L1H2']
    """
    return [u.strip() for u in _UNIT.findall(units) if u.strip()]


_UNIT = re.compile(r"\([^)]*\)|[^,()]+")  # a parenthesised group, or one head label


def _methods() -> tuple[str, ...]:
    """The ablation methods in the order a sentence names them: the division's default first."""
    return method_order(DivisionSettings().method)


UNCALLED_MIN_GAIN = 0.0
"""How far above its null a division row without a call (only the index, its null and ``p``)
must put its index to be "divided" (:func:`axis_call`): any amount, with ``p < alpha``. A row
the calibrated test wrote has its own call, taken with ``min_index`` and
``min_selectivity_gain``."""

SERVING_CALLS = ("divided", "method-dependent")
"""Calls whose index a headline shows beside them: the axes it claims or hedges on."""

SEEDS_DISAGREE = "seeds disagree"
"""The call of a group of seeds on an axis where no call has a majority of the seeds and the
seeds' defined calls differ (3 divided, 3 not): not "cannot tell", which means undefined."""


def axis_call(d: dict[str, Any], alpha: float = 0.05) -> str:
    """The call of one division row: its own ``call`` (the calibrated test) where it has one;
    for a row without one (a division table given with only the index and its null),
    ``divided`` or ``p < alpha`` and an index at least the division
    :data:`UNCALLED_MIN_GAIN` above its null, and "cannot tell" where the index is undefined.

    Example:
        >>> axis_call({"by": "token", "index": float("nan"), "null_index": 0.0, "p": 1.0})
        'cannot tell'
        >>> axis_call({"by": "token", "call": "method-dependent", "index": 0.3})
        'method-dependent'
    """
    call = d.get("call")
    if isinstance(call, str) and call in CALLS:
        return call
    if not is_finite(d.get("index")):
        return "cannot tell"
    divided = str(d.get("divided"))  # a bool, or its text after a CSV round trip
    if divided in ("True", "False"):
        return "divided" if divided == "True" else "not divided"
    beyond = (
        is_finite(d.get("p"))
        and float(d["p"]) < alpha
        and float(d["index"]) - float(d["null_index"]) >= UNCALLED_MIN_GAIN
    )
    return "divided" if beyond else "not divided"


def division_axes(division: list[dict[str, Any]], alpha: float) -> list[str]:
    """The axes along which the heads divide the work: those whose call is "divided"
    (:func:`axis_call`).

    Example:
        >>> division_axes([{"by": "token", "index": 0.4, "null_index": 0.1, "p": 0.001},
        ...                {"by": "position", "index": 0.1, "null_index": 0.1, "p": 0.5}], 0.05)
        ['token']
    """
    return [str(d["by"]) for d in division if axis_call(d, alpha) == "divided"]


def is_finite(value: Any) -> bool:
    try:
        return not math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def _null_text(d: dict[str, Any], null: str) -> str:
    """``same-function null's 95% quantile 0.09``, the line the call uses, where the row has
    it; else the null's mean (a row with only the index and its null), ``null 0.05``."""
    if is_finite(d.get("null_high")):
        return f"{null}'s 95% quantile {format_index(float(d['null_high']))}"
    return f"{null} {format_index(float(d['null_index']))}"


def _index_text(d: dict[str, Any], leaders: Collection[str] = ()) -> str:
    """The evidence of one axis: index with its CI against the null, or why it is undefined;
    where its division may only restate that of one of ``leaders`` (the axes called divided or
    method-dependent beside it), which one."""
    if not is_finite(d.get("index")):
        reason = d.get("reason")
        return UNDEFINED_INDEX + (f"; {reason}" if isinstance(reason, str) and reason else "")
    text = f"index {format_index(float(d['index']))}"
    if is_finite(d.get("ci_low")) and is_finite(d.get("ci_high")):
        low, high = format_index(float(d["ci_low"])), format_index(float(d["ci_high"]))
        text += f" [95% CI {low}, {high}]"
    null = "same-function null" if "call" in d else "null"
    floor = float(d["p_floor"]) if is_finite(d.get("p_floor")) else None
    p = float(d["p"]) if is_finite(d.get("p")) else math.nan
    text += f" vs {_null_text(d, null)} ({format_p(p, floor)})"
    basis = d.get("basis")
    if isinstance(basis, str) and basis in BASIS_NAMES:
        text += f", on {BASIS_NAMES[basis]}"
    units = compared_unit_labels(str(d.get("units") or ""))
    if len({layer_of(u) for u in units}) > 1:
        text += f", comparing {with_layers(units)}"
    methods = [
        f"{m} {format_index(float(d[f'index_{m}']))}"
        for m in _methods()
        if is_finite(d.get(f"index_{m}"))
    ]
    if axis_call(d) == "method-dependent" and methods:
        text += f"; by method: {', '.join(methods)}"
    calls = {m: d.get(f"call_{m}") for m in _methods()}
    if zero_artefact(calls, str(d.get("by"))) and axis_call(d) != "method-dependent":
        text += f"; {zero_left_out_text(d)}"
    other = restated_axis(d)
    if other in leaders and axis_call(d) in SERVING_CALLS:
        text += (
            f"; {other}'s profiles alone give {format_index(float(d['index_explained']))} here, "
            "through "
            f"how {d.get('by')} and {other} go together in these data, so this may only "
            f"restate the division by {other}"
        )
    return text


def division_text(division: list[dict[str, Any]], alpha: float) -> str:
    """ "Division of labour: by token divided (index 0.31 [0.25, 0.36] vs null 0.05, p < 0.001);
    by position cannot tell (undefined ...)"."""
    if not division:
        return (
            "Division of labour not measured (no division table): this verdict does not say "
            "whether the heads divide the work."
        )
    leaders = {str(d["by"]) for d in division if axis_call(d, alpha) in SERVING_CALLS}
    parts = [f"by {d['by']} {axis_call(d, alpha)} ({_index_text(d, leaders)})" for d in division]
    return f"Division of labour: {'; '.join(parts)}."


def _divided_text(divided: list[str], restated: dict[str, str]) -> str:
    """The divided axes, each that only follows another named with the one it follows, to the
    end of the chain (token -> target_class -> position: both follow position); axes that
    restate each other (a cycle) are named together, as the data cannot tell them apart.

    Example:
        >>> _divided_text(["token", "position", "target_class"],
        ...               {"token": "target_class", "target_class": "position"})
        'position (token, target_class follow it in these data)'
        >>> _divided_text(["token", "position", "target_class"],
        ...               {"position": "target_class", "target_class": "position"})[:39]
        'token, position or target_class (these '
    """
    follows = {a: o for a, o in restated.items() if a in divided and o in divided}

    def lead(axis: str) -> tuple[str, ...]:
        """The root axis a chain ends at, or the axes of the cycle it runs into."""
        path = [axis]
        while path[-1] in follows:
            nxt = follows[path[-1]]
            if nxt in path:  # a cycle: the axes from nxt on restate each other
                cycle = path[path.index(nxt) :]
                return tuple(a for a in divided if a in cycle)
            path.append(nxt)
        return (path[-1],)

    groups: dict[tuple[str, ...], list[str]] = {}
    for axis in divided:
        leaders = lead(axis)
        groups.setdefault(leaders, [])
        if axis not in leaders:
            groups[leaders].append(axis)
    parts = []
    for leaders, led in groups.items():
        part = " or ".join(leaders)
        notes = []
        if len(leaders) > 1:
            notes.append("these axes go together in the data: which one is not told apart")
        if led:
            verb = "follows" if len(led) == 1 else "follow"
            notes.append(f"{', '.join(led)} {verb} {'it' if len(leaders) == 1 else 'them'} in "
                         "these data")  # fmt: skip
        parts.append(part + (f" ({'; '.join(notes)})" if notes else ""))
    return ", ".join(parts)


def headline_call(
    calls: dict[str, str], *, group: bool = False, restated: dict[str, str] | None = None
) -> str:
    """One clause for a set of per-axis calls: "the heads divide the work along token",
    "the heads do not divide the work along any axis tested", "cannot tell whether the heads
    divide the work", or "whether the heads divide the work along token depends on the
    ablation method", joined when the axes differ; for a group of seeds
    (:meth:`.sentences.Verdict.group_calls`, ``group=True``: some seed has a defined call) also "the
    seeds disagree whether the heads divide the work along position", and a "cannot tell"
    on every axis is said as undefined in most seeds, not in every one.

    Example:
        >>> headline_call({"token": "divided", "position": "cannot tell"})
        'the heads divide the work along token (cannot tell along position)'
        >>> headline_call({"position": SEEDS_DISAGREE}, group=True)
        'the seeds disagree whether the heads divide the work along position'
        >>> headline_call({"position": "divided", "target_class": "divided"},
        ...               restated={"target_class": "position"})
        'the heads divide the work along position (target_class follows it in these data)'

    ``restated``: divided axes whose division may only restate another divided axis's
    (:func:`restated_axis`), said as following it, not as a division of their own.
    """
    if not calls:
        return "the division of labour was not measured"
    by: dict[str, list[str]] = {
        c: [a for a, k in calls.items() if k == c] for c in (*CALLS, SEEDS_DISAGREE)
    }
    disagree = ", ".join(by[SEEDS_DISAGREE])
    if by["divided"]:
        text = f"the heads divide the work along {_divided_text(by['divided'], restated or {})}"
    elif by["method-dependent"]:
        text = (
            f"whether the heads divide the work along {', '.join(by['method-dependent'])} "
            "depends on the ablation method"
        )
    elif by["not divided"]:
        text = "the heads do not divide the work along " + (
            "any axis tested" if not by["cannot tell"] else ", ".join(by["not divided"])
        )
    elif disagree:
        text = f"the seeds disagree whether the heads divide the work along {disagree}"
    elif group:
        return "cannot tell whether the heads divide the work (no axis defined in most seeds)"
    else:
        return "cannot tell whether the heads divide the work (every axis undefined)"
    rest = []
    if by["divided"] and by["method-dependent"]:
        rest.append(f"method-dependent along {', '.join(by['method-dependent'])}")
    if disagree and not text.startswith("the seeds disagree"):
        rest.append(f"the seeds disagree along {disagree}")
    if by["cannot tell"]:
        rest.append(f"cannot tell along {', '.join(by['cannot tell'])}")
    return text + (f" ({'; '.join(rest)})" if rest else "")


def basis_text(division: list[dict[str, Any]]) -> str:
    """``; basis: kept-head profiles under mean, zero and resample ablation``: the profiles
    the calls rest on and the methods they agree under, each against its own null.

    Example:
        >>> basis_text([{"basis": "kept", "index_mean": 0.3, "index_zero": 0.2}])
        '; basis: kept-head profiles under mean and zero ablation'
    """
    # An axis that is undefined everywhere has no basis (""): nothing to name.
    bases = sorted({d["basis"] for d in division if d.get("basis") in BASIS_NAMES})
    if not bases:
        return ""
    methods = [m for m in _methods() if any(is_finite(d.get(f"index_{m}")) for d in division)]
    named = ", ".join(BASIS_NAMES[b] for b in bases)
    if not methods:
        return f"; basis: {named}"
    listed = methods[0] if len(methods) == 1 else f"{', '.join(methods[:-1])} and {methods[-1]}"
    return f"; basis: {named} under {listed} ablation"
