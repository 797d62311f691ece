"""One label per head, from the evidence: dead > redundant > a role > unspecialized.

- ``"dead"``: dead by function (:mod:`~mhainterp.specialization.needed.dead`): it writes
  (almost) nothing into the residual stream (``output_ratio < dead_tol``) AND removing it
  costs nothing, alone and with the other quiet heads; never dead and needed together, and a
  dead head holds no relation (where it looks carries nothing: a hand-set head with no
  weights is exactly uniform, which is not counting);
- ``"backed up"``: it is redundant with another live head (:mod:`.redundancy`) and not
  needed: removing it alone costs nothing because a partner carries its work ("redundant" is
  not a separate state: one vocabulary). A needed head is never backed up, whatever its
  partners: removing it alone costs accuracy. It may still *hold* a relation (column ``role``);
- a role name (e.g. ``"previous"``): its best significant role (largest effect among the roles
  with corrected ``p < alpha`` against both nulls and ``effect >= min_effect``; among roles
  within 0.01 of that effect the most specific one, the smallest ``chance``), unless the head
  **mixes** roles: a second significant role, neither nested in nor containing the first (on
  the queries both count, restricted to visible keys), has at least ``mix_ratio`` of the first
  one's effect. A head that splits its attention between two relations holds neither as a
  distinct role;
- ``"count:<set>"`` (e.g. ``count:same_token_upto+sink``): the best role is a set of several
  keys (with or without the sink) and the head spreads over it evenly, ``evenness >=
  min_evenness`` (:mod:`.roles`): a counting head. ``count:uniform+sink`` is a head spread
  evenly over every visible key, a BOS sink among them, beyond untrained heads (tracr's
  SelectorWidth of an always-true selector, its ``length`` program);
- ``"unspecialized"``: none of the above (mixing heads included; ``mixed_roles`` says which);
- ``"serves <axis>"`` (e.g. ``serves token``), once the division of labour is attached
  (:func:`~mhainterp.specialization.seeds.combine.attach_division`): an unspecialized head that
  serves a subset along an axis the heads divide. "unspecialized" beside a verdict that the
  heads divide the work along token read as a contradiction; where a head looks is still
  its ``holds`` (none) and :func:`where_label` gives the label before the division.

Nesting matters because some templates contain others (``self`` is inside
``same_token_upto``, any set inside its ``+sink`` variant): a head on the inner one scores
high on both, which is not mixing.

Besides the one label, every head gets the verdict's flags (:data:`FLAG_COLUMNS`): it
``holds`` a relation (its distinct role, even when backed up), is ``needed`` (removing it alone
costs at least ``min_damage`` accuracy on some target), ``backed_up`` (not needed, and redundant;
or holding a relation in a tested group of heads holding it whose joint removal costs at least
``min_joint_damage``: the others carry its work, though no single survivor carries all of it,
as with eight mirror heads any one of which can go), or ``dead``;
whom it *serves* is the division test's (:mod:`.division`, column ``serves`` there).

:func:`decide_labels` is the decision alone, from saved evidence, so the stability test can
re-label a run under other thresholds without a forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import pandas as pd

from mhainterp.heads import HEAD_SET_SEPARATOR, parse_head_label
from mhainterp.specialization.settings import SpecializationSettings
from mhainterp.specialization.where.roles import COUNT_PREFIX, DESCRIPTIVE_ROLES, base_relation
from mhainterp.stats import adjust_pvalues
from mhainterp.tasks import Task

__all__ = [
    "BACKED_UP",
    "findings",
    "head_finding",
    "FLAG_COLUMNS",
    "LABELS_OTHER",
    "HeadDecision",
    "decide_labels",
    "label_heads",
    "mixed_roles",
    "role_targets",
    "serving_label",
    "where_label",
]

BACKED_UP = "backed up"
"""The label of a head whose work a partner carries (the redundancy test's "redundant")."""

UNSPECIALIZED = "unspecialized"
LABELS_OTHER = (UNSPECIALIZED, BACKED_UP, "dead")
"""Labels that are not roles."""
SERVES_PREFIX = "serves "
"""How the label of an unspecialized head that serves a subset of a divided axis starts."""

FLAG_COLUMNS = ["holds", "needed", "backed_up", "dead"]
"""The verdict's per-head flags (module docstring): what a head does, not one label."""

SPECIFIC_TOL = 0.01
"""Roles within this effect of the best one are ties; the most specific (smallest chance) wins."""


@dataclass
class HeadDecision:
    """One head's label and what it rests on."""

    label: str
    role: str  # the distinct role held ("" when none); count:... for a counting head
    best: str  # the role row behind ``role`` ("" when none)
    mixed: list[str]
    significant: list[str]
    dead: bool
    partners: list[str]


def serving_label(label: str, axes: list[str]) -> str:
    """The label of a head once whom it serves is known: an unspecialized head that serves a
    subset along the divided ``axes`` is labelled by them; any other label stays.

    Example:
        >>> serving_label("unspecialized", ["token"]), serving_label("mirror", ["position"])
        ('serves token', 'mirror')
        >>> serving_label("unspecialized", [])
        'unspecialized'
    """
    if where_label(label) != UNSPECIALIZED or not axes:
        return where_label(label)
    return SERVES_PREFIX + "+".join(axes)


def where_label(label: str) -> str:
    """The label from where a head looks alone (before the division was attached).

    Example:
        >>> where_label("serves token+position"), where_label("previous")
        ('unspecialized', 'previous')
    """
    return UNSPECIALIZED if str(label).startswith(SERVES_PREFIX) else str(label)


def head_finding(
    holds: str,
    serves: str | None,
    needed: bool,
    backed_up: bool,
    dead: bool,
    harm: float | None = None,
    mixed: str = "",
) -> str:
    """What a head does on every axis, in one phrase: where it looks, whom it serves, whether
    it is needed. A dead head's finding is "dead" alone: it writes almost nothing and removing
    it costs nothing, so where it looks and whom it "serves" would describe nothing. A head
    whose damage is not shown to fall on a subset "serves no subset shown": not "every value
    alike", which no test showed (its profile may be undefined, or not beyond its null).

    Args:
        holds: The relation it holds ("" for none).
        serves: Whom it serves (``"position: 0,1,2; token: 3"``), "" when it serves no subset,
            None when the division of labour was not measured.
        needed, backed_up, dead: Its flags.
        harm: Where the head is harmful, how much removing it improves its most-helped target
            (``removal_gain``); None where it is not.
        mixed: The roles it mixes (``mixed_roles``, ``";"``-joined; "" for none): such a head
            holds no one relation, but it does not look at "no known relation" either.

    Example:
        >>> head_finding("previous", "position: 1,2,3", True, False, False)
        'looks at previous; serves position: 1,2,3; needed'
        >>> head_finding("", None, False, True, False)
        'looks at no known relation; whom it serves not measured; backed up'
        >>> head_finding("", "", False, False, True)
        'dead'
        >>> head_finding("", "", False, True, False, mixed="previous;first")
        'mixes previous and first; serves no subset shown; backed up'
        >>> head_finding("", "", False, True, False, harm=0.02)[-62:]
        'backed up; also harmful: removing it improves a target by 0.02'
        >>> head_finding("previous", "", False, False, False, harm=0.45)
        'looks at previous; serves no subset shown; harmful: removing it improves a target by 0.45'
    """
    if dead:
        return "dead"
    if holds:
        where = f"looks at {holds}"
    elif mixed:
        where = f"mixes {' and '.join(mixed.split(';'))}"
    else:
        where = "looks at no known relation"
    if serves is None:
        whom = "whom it serves not measured"
    else:
        whom = f"serves {serves}" if serves else "serves no subset shown"
    need = "needed" if needed else BACKED_UP if backed_up else "not needed"
    if harm is not None:  # "not needed" would call a head that costs accuracy a harmless spare
        hurts = f"harmful: removing it improves a target by {harm:.2f}"
        need = f"{need}; also {hurts}" if needed or backed_up else hurts
    return f"{where}; {whom}; {need}"


def role_targets(task: Task) -> dict[str, str]:
    """Which target each of the task's relations solves: relation ``i`` -> target ``i`` when
    there are as many relations as targets (``multi_relation``), every relation -> the target
    of a single-target task, else nothing.

    Example:
        >>> from mhainterp.tasks import get_task
        >>> role_targets(get_task("multi_relation"))["same_token_upto"]
        'count_previous'
    """
    relations = task.relation_names
    targets = task.target_names
    if len(targets) == 1:
        return {rel: targets[0] for rel in relations}
    if len(relations) == len(targets):
        return dict(zip(relations, targets, strict=True))
    return {}


def mixed_roles(
    significant: pd.DataFrame, nested: Collection[tuple[str, str]], mix_ratio: float
) -> list[str]:
    """The roles a head mixes (its best one first), or ``[]`` when it has one distinct role.

    Args:
        significant: The head's significant roles (``role, effect``), any order.
        nested: ``(inner, outer)`` pairs of roles whose templates nest on the data.
        mix_ratio: A second role counts when its effect is at least this x the best one's.

    Example:
        >>> rows = pd.DataFrame({"role": ["previous", "mirror"], "effect": [0.55, 0.5]})
        >>> mixed_roles(rows, nested=set(), mix_ratio=0.5)
        ['previous', 'mirror']
    """
    rows = [
        _Significant(str(role), float(effect), math.nan, math.nan)
        for role, effect in zip(significant["role"], significant["effect"], strict=True)
    ]
    return _mixed(rows, nested, mix_ratio)


@dataclass(frozen=True)
class _Significant:
    """One significant role of a head, as plain numbers (the labelling rules run per head and
    per perturbed setting: pandas per head cost most of the specialization test)."""

    role: str
    effect: float
    chance: float
    evenness: float


def _mixed(
    rows: list[_Significant], nested: Collection[tuple[str, str]], mix_ratio: float
) -> list[str]:
    """:func:`mixed_roles` of a head's significant roles (in the role table's order)."""
    if len(rows) < 2:
        return []
    # largest effect first; ties keep the table's order (a stable sort, as pandas' was)
    ordered = sorted(rows, key=lambda r: r.effect, reverse=True)
    best, best_effect = ordered[0].role, ordered[0].effect
    others = [
        r.role
        for r in ordered[1:]
        if (r.role, best) not in nested
        and (best, r.role) not in nested
        and r.effect >= mix_ratio * best_effect
    ]
    return [best, *others] if others else []


def _top_rows(roles: pd.DataFrame) -> pd.DataFrame:
    """Per head: the row of its largest-effect testable role, significant or not."""
    testable = roles[~roles["role"].isin(DESCRIPTIVE_ROLES)].copy()
    testable["_effect"] = testable["effect"].fillna(-math.inf)
    ordered = testable.sort_values("_effect", ascending=False, kind="stable")
    return ordered.drop_duplicates("head_label").set_index("head_label")


def _best_role(significant: list[_Significant]) -> _Significant:
    """The largest-effect significant role; among ties (within :data:`SPECIFIC_TOL`) the most
    specific one (smallest chance), so a head on ``self`` is not called ``same_token_upto``."""
    top = max(r.effect for r in significant)
    ties = [r for r in significant if r.effect >= top - SPECIFIC_TOL]
    # smallest chance first, a NaN chance last; among equals the first in the table's order
    # (min keeps the first, as pandas' stable sort did)
    return min(ties, key=_chance_order)


def _chance_order(row: _Significant) -> tuple[bool, float]:
    """Sort key: by chance, NaN last."""
    return (math.isnan(row.chance), 0.0 if math.isnan(row.chance) else row.chance)


def decide_labels(
    roles: pd.DataFrame,
    output_ratio: Mapping[str, float],
    partners: Mapping[str, list[str]],
    settings: SpecializationSettings,
    nested: Collection[tuple[str, str]] = (),
    dead: Collection[str] | None = None,
    needed: Collection[str] = (),
) -> dict[str, HeadDecision]:
    """The label of every head from saved evidence (no forward pass): the rules of the module
    docstring under ``settings``.

    Args:
        roles: One run's role table with ``p_adj`` (significance is re-decided here from
            ``p_adj < alpha`` and ``effect >= min_effect``), ``chance`` and ``evenness``.
        output_ratio: Head label -> RMS of its write / RMS of the residual stream.
        partners: Head label -> heads it is redundant with (dead ones are dropped here).
        settings: Thresholds.
        nested: ``(inner, outer)`` role pairs whose templates nest.
        dead: The dead heads (:func:`~mhainterp.specialization.needed.dead.dead_heads`: quiet
            AND costing nothing when removed); None: every quiet head (``output_ratio <
            dead_tol``), the nomination alone, for callers without damage evidence.
        needed: The needed heads (removing one alone costs ``min_damage`` accuracy on some
            target): never backed up, so their partners are dropped.

    Returns:
        Head label -> :class:`HeadDecision`, in the role table's head order.

    Example:
        >>> roles = pd.DataFrame({"head_label": ["L0H0"], "role": ["same_token_upto"],
        ...     "p_adj": [1e-9], "effect": [0.9], "chance": [0.2], "evenness": [0.97]})
        >>> decide_labels(roles, {"L0H0": 1.0}, {}, SpecializationSettings())["L0H0"].label
        'count:same_token_upto'
    """
    by_head = _significant_roles(roles, settings)
    if dead is None:
        dead = {h for h, r in output_ratio.items() if r < settings.dead_tol}
    dead_set, needed_set = set(dead), set(needed)
    out = {}
    for label in dict.fromkeys(roles["head_label"].tolist()):
        is_dead = label in dead_set
        # A needed head is not backed up (removing it alone costs accuracy): no partners.
        partner = [p for p in partners.get(label, []) if p not in dead_set]
        partner = [] if label in needed_set else partner
        significant = by_head.get(label, [])
        mixed = _mixed(significant, nested, settings.mix_ratio)
        chosen = _best_role(significant) if significant and not mixed else None
        best = role = chosen.role if chosen else ""
        if chosen and not math.isnan(chosen.evenness) and chosen.evenness >= settings.min_evenness:
            role = COUNT_PREFIX + best
        if is_dead:  # it writes nothing and removing it costs nothing: it holds nothing
            name, role = "dead", ""
        elif partner:
            name = BACKED_UP
        else:
            name = role or "unspecialized"
        out[label] = HeadDecision(
            name, role, best, mixed, [r.role for r in significant], is_dead, partner
        )
    return out


def _significant_roles(
    roles: pd.DataFrame, settings: SpecializationSettings
) -> dict[str, list[_Significant]]:
    """Head label -> its significant testable roles (corrected ``p < alpha`` and ``effect >=
    min_effect``), in the role table's order."""
    # plain lists: pandas filtering here cost ten times the rest, once per setting tried
    names = roles["role"].tolist()
    p_adj = roles["p_adj"].to_numpy(dtype=float).tolist()
    effect = roles["effect"].to_numpy(dtype=float).tolist()
    rows = [
        i
        for i, (role, p, e) in enumerate(zip(names, p_adj, effect, strict=True))
        if role not in DESCRIPTIVE_ROLES and p < settings.alpha and e >= settings.min_effect
    ]
    out: dict[str, list[_Significant]] = {}
    if not rows:
        return out
    labels = roles["head_label"].tolist()
    chance = roles["chance"].to_numpy(dtype=float).tolist()
    evenness = roles["evenness"].to_numpy(dtype=float).tolist()
    for i in rows:
        found = _Significant(names[i], effect[i], chance[i], evenness[i])
        out.setdefault(labels[i], []).append(found)
    return out


def _support(
    name: str,
    role: str,
    causal: pd.Series,
    damage: pd.Series,
    targets: dict[str, str],
    min_damage: float,
) -> bool | None:
    """Does ablation back a role head? None for heads without a role label."""
    if name in LABELS_OTHER:
        return None
    target = targets.get(base_relation(role))
    if target is None:
        return False
    hurts = float(damage.get(target, 0.0)) >= min_damage
    if len(damage) > 1:  # several targets: the role's target must be the one hurt most
        return bool(hurts and causal["causal_target"] == target)
    return bool(hurts)


def label_heads(
    roles: pd.DataFrame,
    output_ratio: dict[str, float],
    partners: dict[str, list[str]],
    damage: pd.DataFrame,
    causal_heads: pd.DataFrame,
    settings: SpecializationSettings,
    targets: dict[str, str],
    nested: Collection[tuple[str, str]] = (),
    covered: Collection[str] = (),
    dead: Collection[str] | None = None,
) -> pd.DataFrame:
    """Label each head of one run and collect its evidence.

    Args:
        roles: The run's role table with ``p_adj`` and ``significant``.
        output_ratio: Head label -> RMS of its write / RMS of the residual stream.
        partners: Head label -> heads it is redundant with.
        damage: Tidy head x target damage (``head_label, target, damage``).
        causal_heads: Per head: ``head_label, total_damage, loss_increase, causal_target,
            selectivity, p_selectivity`` (selectivity NaN on a single-target task).
        settings: Thresholds.
        targets: Relation name -> the target it solves (:func:`role_targets`).
        nested: ``(inner, outer)`` role pairs whose templates nest (see the module docstring).
        covered: Heads in a tested group sharing their role whose joint removal hurts
            (``damage_all >= min_joint_damage``): backed up when not needed alone.
        dead: The dead heads by function (see :func:`decide_labels`).

    Returns:
        One row per head with ``head_label, layer, head, label, role, role_effect,
        role_p_adj, role_evenness, roles, mixed_roles, top_role, top_score, top_effect,
        top_p_adj, explained, unexplained, explained_chance, output_ratio, holds, needed,
        backed_up, dead, harmful, removal_gain, redundant_with, total_damage, loss_increase,
        causal_target, causal_selectivity, causal_p_adj, causal_specialized, causal_support, serves,
        finding``; ``finding`` says what the head does on every axis (:func:`head_finding`;
        ``serves`` is filled when the division of labour is attached); ``role`` (=
        ``holds``) is the distinct role ("" when none; ``count:<set>`` for a counting head),
        ``roles`` every significant one, ``top_*`` the largest effect whether significant or
        not, ``explained`` the share of the head's attention on the union of the known roles
        (``unexplained`` the rest, ``explained_chance`` what a blind head gets),
        ``redundant_with`` a head set ``"L0H1,L0H2"``, ``causal_support`` whether removing a
        role head hurts its relation's target most (None for heads without a role);
        ``removal_gain`` what removing the head alone improves its most-helped target by (0
        when it improves none; ``total_damage`` clips these at 0) and ``harmful`` whether that
        is at least ``min_damage`` (a live head only).
    """
    top = _top_rows(roles)
    by_target = damage.pivot(index="head_label", columns="target", values="damage")
    needed_heads = [h for h, m in by_target.max(axis=1).items() if float(m) >= settings.min_damage]
    decisions = decide_labels(roles, output_ratio, partners, settings, nested, dead, needed_heads)
    by_role = roles.set_index(["head_label", "role"])
    explained = by_role.xs("explained", level="role") if "explained" in set(roles["role"]) else None
    causal = causal_heads.set_index("head_label")
    causal["causal_p_adj"] = adjust_pvalues(
        causal["p_selectivity"].to_numpy(float), settings.correction
    )
    records = []
    for label, d in decisions.items():
        layer, head = parse_head_label(label)
        name, role = d.label, d.role
        best_row = by_role.loc[(label, d.best)] if d.best else None
        c = causal.loc[label]
        needed = bool(float(by_target.loc[label].max()) >= settings.min_damage)
        # what removing it gains on its most-helped target (signed damage below 0)
        gain = max(0.0, -float(by_target.loc[label].min()))
        selectivity, p_adj = float(c["selectivity"]), float(c["causal_p_adj"])
        has_top = label in top.index
        share = float(explained.loc[label, "score"]) if explained is not None else math.nan
        share = min(max(share, 0.0), 1.0) if not math.isnan(share) else share  # float dust
        records.append(
            {
                "head_label": label,
                "layer": layer,
                "head": head,
                "label": name,
                "role": role,
                "role_effect": float(best_row["effect"]) if best_row is not None else math.nan,
                "role_p_adj": float(best_row["p_adj"]) if best_row is not None else math.nan,
                "role_evenness": (
                    float(best_row["evenness"]) if best_row is not None else math.nan
                ),
                "roles": ";".join(d.significant),
                # ";" as in ``roles``: role names hold "+" themselves ("same_token+sink")
                "mixed_roles": ";".join(d.mixed),
                "top_role": top.loc[label, "role"] if has_top else "",
                "top_score": float(top.loc[label, "score"]) if has_top else math.nan,
                "top_effect": float(top.loc[label, "effect"]) if has_top else math.nan,
                "top_p_adj": float(top.loc[label, "p_adj"]) if has_top else math.nan,
                "explained": share,
                "unexplained": 1.0 - share,
                "explained_chance": (
                    float(explained.loc[label, "chance"]) if explained is not None else math.nan
                ),
                "output_ratio": float(output_ratio[label]),
                "holds": role,
                "needed": needed,
                "backed_up": not d.dead
                and not needed
                and (bool(d.partners) or (bool(role) and label in covered)),
                "dead": d.dead,
                "harmful": not d.dead and gain >= settings.min_damage,
                "removal_gain": gain,
                "redundant_with": HEAD_SET_SEPARATOR.join(d.partners),
                "total_damage": float(c["total_damage"]),
                "loss_increase": float(c["loss_increase"]),
                "causal_target": c["causal_target"],
                "causal_selectivity": selectivity,
                "causal_p_adj": p_adj,
                "causal_specialized": bool(
                    not math.isnan(selectivity)
                    and p_adj < settings.alpha
                    and selectivity >= settings.min_selectivity
                ),
                "causal_support": _support(
                    name, role, c, by_target.loc[label], targets, settings.min_damage
                ),
            }
        )
    table = pd.DataFrame(records)
    table["serves"] = None  # the division test fills it (attach_division)
    table["finding"] = findings(table)
    return table


def findings(heads: pd.DataFrame) -> list[str]:
    """:func:`head_finding` of every row of a per-head table (``holds, serves, needed,
    backed_up, dead``; ``serves`` None or NaN: not measured)."""
    serves = heads["serves"] if "serves" in heads.columns else [None] * len(heads)
    harmful = heads["harmful"] if "harmful" in heads.columns else [False] * len(heads)
    gains = heads["removal_gain"] if "removal_gain" in heads.columns else [0.0] * len(heads)
    mixed = heads["mixed_roles"] if "mixed_roles" in heads.columns else [""] * len(heads)
    return [
        head_finding(
            str(h) if isinstance(h, str) else "",
            s if isinstance(s, str) else None,
            bool(n),
            bool(b),
            bool(d),
            float(g) if bool(x) else None,
            m if isinstance(m, str) else "",
        )
        for h, s, n, b, d, x, g, m in zip(
            heads["holds"],
            serves,
            heads["needed"],
            heads["backed_up"],
            heads["dead"],
            harmful,
            gains,
            mixed,
            strict=True,
        )
    ]
