"""Redundancy: pairs of heads that look alike *and* stand in for each other.

Two heads are **redundant** when both hold:

1. they are similar: ``head_similarity`` (:mod:`mhainterp.similarity`, default ``"js"``, the
   Jensen-Shannon similarity of their attention) is at least ``min_similarity``;
2. they back each other up: in :func:`mhainterp.ablation.pairwise_ablation` (loss), removing
   both hurts clearly (``damage_joint >= min_joint_damage``) and mostly beyond the sum of the
   two single removals: ``backup = interaction / damage_joint >= backup_ratio`` with
   ``interaction = damage_joint - (damage_a + damage_b)``. For exact copies ``backup`` is near
   1: either copy alone does the job, so each single removal costs almost nothing.

Similar heads that do not back each other up (e.g. two heads that each carry half of a signal)
are *not* redundant; heads that back each other up with different patterns are not either
(they are then two routes to the answer, not copies). Dead heads are never redundant.

A pair test misses larger groups: with eight mirror heads, removing any two costs nothing, so
no pair "hurts when both go". :func:`redundancy_groups` tests a group of heads as a whole:
remove the whole group (``damage_all``), then remove all of it but one member, for each member
(``damage_keep_one``). The group is **redundant** when removing it hurts clearly
(``damage_all >= min_joint_damage``) and one survivor on average keeps most of its job:
``backup = 1 - mean(damage_keep_one) / damage_all >= backup_ratio``. The groups tested are
every connected component of three or more similar live heads (``basis`` "similarity") and,
in :func:`~mhainterp.specialization.specialization_test`, every set of three or more live heads
holding the same role (``basis`` "role:<name>"): heads that find the same relation need not have
similar patterns overall, and the question is whether any one of them could do the job alone.
Pairs are left to the pair test, whose rule (the *sum* of the two single damages) is stricter
than this one's mean for two heads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mhainterp.ablation import evaluate_head_sets, head_sets_table, pairwise_ablation
from mhainterp.ablation.replacement import CleanCache
from mhainterp.heads import HEAD_SET_SEPARATOR
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import scored_by_loss
from mhainterp.similarity import head_similarity
from mhainterp.specialization.settings import SpecializationSettings
from mhainterp.tasks import Batch

__all__ = [
    "GROUP_COLUMNS",
    "PRETRAINED_GROUP_SIZE",
    "PRETRAINED_MAX_PAIRS",
    "REDUNDANCY_COLUMNS",
    "redundancy_groups",
    "redundant_under",
    "similar_groups",
    "redundancy_pairs",
]

REDUNDANCY_COLUMNS = [
    "head_a",
    "head_b",
    "similarity",
    "damage_a",
    "damage_b",
    "damage_joint",
    "interaction",
    "backup",
    "similar",
    "backs_up",
    "redundant",
]


def redundancy_pairs(
    model: HookedMHATransformer,
    batch: Batch,
    settings: SpecializationSettings | None = None,
    *,
    dead: Iterable[str] = (),
    similarity: pd.DataFrame | None = None,
    pairwise: pd.DataFrame | None = None,
    evidence_similarity: float | None = None,
    singles: Mapping[str, float] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Every pair of heads with its similarity, pairwise-ablation backup and verdict.

    Args:
        model: The model.
        batch: Evaluation batch (and ablation reference).
        settings: The thresholds (default :class:`SpecializationSettings`): it uses
            ``method`` (for :func:`~mhainterp.ablation.pairwise_ablation`),
            ``similarity_method`` (a :func:`~mhainterp.similarity.head_similarity` method),
            ``min_similarity`` (at or above which two heads count as similar),
            ``backup_ratio`` (``interaction / damage_joint`` at or above which they back each
            other up) and ``min_joint_damage`` (loss increase, in nats, removing both must
            cause at least).
        dead: Labels of dead heads (never redundant).
        similarity: A precomputed square similarity matrix (skips computing it).
        pairwise: A precomputed ``pairwise_ablation`` table (skips computing it).
        evidence_similarity: Ablate the pairs at or above this similarity (default
            ``min_similarity``); lower it to keep the evidence a looser gate needs (the
            stability test re-labels with ``min_similarity`` x 0.8 without a forward pass).
        singles: On a pretrained model, heads whose single-removal loss increase is already
            known exactly (the specialization test's damage step): not removed again
            (:func:`~mhainterp.ablation.pairwise_ablation`'s ``singles``).
        progress: A progress bar over the pairwise ablation's forwards.

    Returns:
        One row per unordered pair (layer-major), columns :data:`REDUNDANCY_COLUMNS`; damages
        are loss increases. Only pairs of live heads that each have a similar partner are
        ablated (other pairs cannot be redundant); the rest have NaN damages. Empty (with those
        columns) for a one-head model.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> batch = get_task("previous_token").eval_batch(128)
        >>> pairs = redundancy_pairs(handbuilt_model(["previous", "previous"], d_head=18), batch)
        >>> pairs[["head_a", "head_b", "redundant"]].values.tolist()
        [['L0H0', 'L0H1', True]]
    """
    settings = settings or SpecializationSettings()
    if len(model.head_labels) < 2:
        return pd.DataFrame(columns=REDUNDANCY_COLUMNS)
    if similarity is None:
        similarity = head_similarity(model, batch, method=settings.similarity_method)
    dead = set(dead)
    labels = list(similarity.index)
    pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]]
    if pairwise is None:
        gate = settings.min_similarity if evidence_similarity is None else evidence_similarity
        pairwise = _similar_pairwise(
            model,
            batch,
            min(gate, settings.min_similarity),
            settings,
            similarity,
            pairs,
            dead,
            singles,
            progress,
        )
    loss = pairwise[pairwise["metric"] == "loss"].set_index(["head_a", "head_b"])
    rows = []
    for a, b in pairs:
        sim = float(similarity.loc[a, b])
        r = loss.loc[(a, b)] if (a, b) in loss.index else None
        joint = float(r["damage_joint"]) if r is not None else np.nan
        interaction = float(r["interaction"]) if r is not None else np.nan
        backup = interaction / joint if joint > 0 else np.nan
        similar = sim >= settings.min_similarity
        backs_up = bool(joint >= settings.min_joint_damage and backup >= settings.backup_ratio)
        rows.append(
            {
                "head_a": a,
                "head_b": b,
                "similarity": sim,
                "damage_a": float(r["damage_a"]) if r is not None else np.nan,
                "damage_b": float(r["damage_b"]) if r is not None else np.nan,
                "damage_joint": joint,
                "interaction": interaction,
                "backup": backup,
                "similar": similar,
                "backs_up": backs_up,
                "redundant": bool(similar and backs_up and a not in dead and b not in dead),
            }
        )
    return pd.DataFrame(rows, columns=REDUNDANCY_COLUMNS)


PRETRAINED_MAX_PAIRS = 64
"""The most pairs ablated on a pretrained model, the most similar first (down to the
stability test's looser gate), even when more pass ``min_similarity``. On MiniLM (8
sentences, js) the loosest gate, 0.72, passes 1,151 of 2,556 pairs (305 s of pairwise
ablation), 0.9 passes 30. On SmolLM2 the 167 heads that put most of their attention on the first
token all look alike (thousands of pairs at 0.9): on 16 sentences its 256 most similar pairs
(similarity 0.93-0.99) took 7.4 min and none was redundant (13 cost 0.01 nats removed together;
the largest backup among those was 0.27, against the 0.5 gate). A pair left out keeps its row
with NaN damages and is not redundant; a looser gate's label that needs it reads it as not
backed up."""


def _similar_pairwise(
    model: HookedMHATransformer,
    batch: Batch,
    gate: float,
    settings: SpecializationSettings,
    similarity: pd.DataFrame,
    pairs: list[tuple[str, str]],
    dead: set[str],
    singles: Mapping[str, float] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Pairwise ablation among the live heads that have a similar partner (only those pairs
    can be redundant, and ablating every pair of a 16-head model would take 120 passes)."""
    similar = {h for a, b in pairs if similarity.loc[a, b] >= gate for h in (a, b)}
    heads = sorted(similar - dead, key=list(similarity.index).index)
    if len(heads) < 2:
        return pd.DataFrame(columns=["head_a", "head_b", "metric"])
    if scored_by_loss(model):  # a pretrained model: hundreds of heads, the similar pairs only
        alive = set(heads)
        chosen = [(a, b) for a, b in pairs if similarity.loc[a, b] >= gate and {a, b} <= alive]
        chosen.sort(key=lambda pair: -float(similarity.loc[pair]))
        chosen = chosen[:PRETRAINED_MAX_PAIRS]
        return pairwise_ablation(
            model, batch, settings.method, pairs=chosen, singles=singles, progress=progress
        )
    return pairwise_ablation(model, batch, settings.method, heads=heads, progress=progress)


PRETRAINED_GROUP_SIZE = 16
"""The largest group removed as a whole on a pretrained model (a model scored by its loss);
a larger one keeps its row with NaN damages and is never redundant. Testing a group of g
heads takes g + 1 forwards: on MiniLM (64 sentences) the stability test's loosest similarity
gate, 0.72, joins 71 of 72 heads into one component (72 forwards, half the time of every
group test together; its backup was 0.01), and on SmolLM2 most heads share the "first"
role. Toy models (at most tens of heads) test every group."""

GROUP_COLUMNS = [
    "basis",
    "heads",
    "size",
    "damage_all",
    "damage_keep_one_mean",
    "damage_keep_one_max",
    "backup",
    "redundant",
]


def similar_groups(
    similarity: pd.DataFrame, min_similarity: float, dead: Iterable[str] = (), min_size: int = 3
) -> list[list[str]]:
    """Connected components (of at least ``min_size`` live heads) of the graph joining heads
    whose similarity is at least ``min_similarity``, each in layer-major order.

    Example:
        >>> sim = pd.DataFrame(np.eye(4) + [[0, .95, .95, 0], [.95, 0, 0, 0], [.95, 0, 0, 0],
        ...                    [0, 0, 0, 0]], index=list("abcd"), columns=list("abcd"))
        >>> similar_groups(sim, 0.9)
        [['a', 'b', 'c']]
    """
    dead = set(dead)
    labels = [h for h in similarity.index if h not in dead]
    rows, columns = similarity.index.get_indexer(labels), similarity.columns.get_indexer(labels)
    linked = similarity.to_numpy()[np.ix_(rows, columns)] >= min_similarity  # (m, m)
    position = {h: i for i, h in enumerate(labels)}
    seen: set[str] = set()
    groups = []
    for start in labels:
        if start in seen:
            continue
        component, frontier = {start}, [start]
        while frontier:
            head = frontier.pop()
            for other in labels:
                if other not in component and linked[position[head], position[other]]:
                    component.add(other)
                    frontier.append(other)
        seen |= component
        if len(component) >= min_size:
            groups.append([h for h in labels if h in component])
    return groups


def redundancy_groups(
    model: HookedMHATransformer,
    batch: Batch,
    settings: SpecializationSettings | None = None,
    *,
    dead: Iterable[str] = (),
    similarity: pd.DataFrame | None = None,
    groups: Sequence[tuple[str, Sequence[str]]] = (),
    evidence_joint_damage: float | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Groups of heads tested as a whole: their group-ablation backup and verdict.

    Args:
        model, batch, settings, dead, similarity: As in :func:`redundancy_pairs` (here
            ``min_joint_damage`` applies to removing the whole group and ``backup_ratio`` to
            the group's backup).
        groups: More ``(basis, heads)`` groups to test (e.g. heads sharing a role) besides the
            similar groups (:func:`similar_groups`); a set of heads is tested once, its bases
            joined by ``+``; sets of fewer than three heads are skipped.
        evidence_joint_damage: On a pretrained model, the groups whose whole removal costs
            less than this (default ``min_joint_damage``) are not removed again one member
            kept (their keep-one damages are NaN: they cannot be redundant); lower it to keep
            the evidence a looser gate needs. A toy model keeps every group's.
        progress: A progress bar over the groups' forwards.

    Returns:
        One row per group, columns :data:`GROUP_COLUMNS`: ``basis``, ``heads`` as a head set
        ``"L0H0,L0H1,L0H2"``, damages as loss increases, ``backup`` (see the module docstring) and
        ``redundant``. Empty (with those columns) when there is no group to test. On a
        pretrained model a group of more than :data:`PRETRAINED_GROUP_SIZE` heads is not
        removed: its damages are NaN and it is not redundant.

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> batch = get_task("previous_token").eval_batch(128)
        >>> model = handbuilt_model(["previous"] * 3, d_head=18)
        >>> redundancy_groups(model, batch)[["heads", "redundant"]].values.tolist()
        [['L0H0,L0H1,L0H2', True]]
    """
    settings = settings or SpecializationSettings()
    if similarity is None:
        similarity = head_similarity(model, batch, method=settings.similarity_method)
    order = list(similarity.index)
    bases: dict[tuple[str, ...], list[str]] = {}
    similar = similar_groups(similarity, settings.min_similarity, dead)
    candidates = [("similarity", g) for g in similar]
    for basis, members in [*candidates, *groups]:
        key = tuple(sorted(set(members), key=order.index))
        if len(key) >= 3 and basis not in bases.setdefault(key, []):
            bases[key].append(basis)
    if not bases:
        return pd.DataFrame(columns=GROUP_COLUMNS)
    groups = [list(key) for key in bases]
    pretrained = scored_by_loss(model)
    largest = PRETRAINED_GROUP_SIZE if pretrained else None
    tested = [g for g in groups if largest is None or len(g) <= largest]
    gate = settings.min_joint_damage if evidence_joint_damage is None else evidence_joint_damage
    removed = _group_damages(
        model, batch, settings.method, tested, gate if pretrained else None, progress
    )
    rows = []
    for group in groups:
        damage_all, keep_one = removed.get(tuple(group), (np.nan, np.full(len(group), np.nan)))
        backup = 1.0 - float(keep_one.mean()) / damage_all if damage_all > 0 else np.nan
        rows.append(
            {
                "basis": "+".join(bases[tuple(group)]),
                "heads": HEAD_SET_SEPARATOR.join(group),
                "size": len(group),
                "damage_all": damage_all,
                "damage_keep_one_mean": float(keep_one.mean()),
                "damage_keep_one_max": float(keep_one.max()),
                "backup": backup,
                "redundant": bool(
                    damage_all >= settings.min_joint_damage and backup >= settings.backup_ratio
                ),
            }
        )
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def _group_damages(
    model: HookedMHATransformer,
    batch: Batch,
    method: str,
    groups: list[list[str]],
    gate: float | None,
    progress: bool = False,
) -> dict[tuple[str, ...], tuple[float, np.ndarray]]:
    """Per group, the loss increase of removing it whole and ``[g]`` of removing all of it but
    each member. With a ``gate`` the whole groups run first, and only those that cost at least
    ``gate`` are removed again one member kept (the others keep NaN there: a group whose
    removal costs less cannot be redundant); without, all in one pass."""
    out: dict[tuple[str, ...], tuple[float, np.ndarray]] = {}
    if not groups:
        return out
    cache = CleanCache() if gate is not None else None  # clean prefixes shared by two passes
    whole = groups if gate is not None else []
    if whole:
        damage = _set_damages(model, batch, method, whole, cache, progress)
        out = {
            tuple(g): (float(d), np.full(len(g), np.nan))
            for g, d in zip(whole, damage, strict=True)
        }
        groups = [g for g, d in zip(whole, damage, strict=True) if d >= gate]
    head_sets = []
    for group in groups:
        head_sets += [] if whole else [group]  # remove the whole group
        head_sets += [[h for h in group if h != keep] for keep in group]  # keep one member
    damage = _set_damages(model, batch, method, head_sets, cache, progress)
    start = 0
    for group in groups:
        if not whole:
            out[tuple(group)] = (float(damage[start]), np.full(len(group), np.nan))
            start += 1
        out[tuple(group)] = (out[tuple(group)][0], damage[start : start + len(group)])
        start += len(group)
    return out


def _set_damages(
    model: HookedMHATransformer,
    batch: Batch,
    method: str,
    head_sets: list[list[str]],
    cache: CleanCache | None,
    progress: bool,
) -> np.ndarray:
    """``[S]`` the loss increase of removing each head set (one engine pass)."""
    if not head_sets:
        return np.array([])
    result = evaluate_head_sets(
        model,
        batch,
        [[], *head_sets],
        method,
        progress=progress,
        desc="groups removed whole",
        cache=cache,
    )
    return head_sets_table(result).iloc[1:]["delta_loss"].to_numpy()  # after the clean model


def _split_heads(members: str) -> list[str]:
    """A saved head set back into labels (old ``;`` sets are migrated on reading,
    :func:`mhainterp.runs.migrate_results`)."""
    return [h for h in members.split(HEAD_SET_SEPARATOR) if h]


def redundant_under(
    pairs: pd.DataFrame,
    groups: pd.DataFrame,
    settings: SpecializationSettings,
    dead: Iterable[str],
    role_of: dict[str, str],
) -> tuple[dict[str, list[str]], int]:
    """Who is redundant with whom under ``settings``, from saved pair and group evidence (no
    forward pass): the rules of the module docstring, re-applied.

    A pair is redundant when ``similarity >= min_similarity``, ``damage_joint >=
    min_joint_damage``, ``backup >= backup_ratio`` and neither head is dead. The groups that
    count are the similar components at this ``min_similarity`` (:func:`similar_groups`, built
    from the pairs' similarities) and the sets of three or more live heads holding the same
    role (``role_of``); each is redundant when ``damage_all >= min_joint_damage`` and ``backup
    >= backup_ratio``.

    Args:
        pairs: :func:`redundancy_pairs`' table (similarities for every pair).
        groups: :func:`redundancy_groups`' table (the groups whose ablations were run).
        settings: The thresholds.
        dead: Dead heads under these settings.
        role_of: Head label -> the role it holds under these settings ("" for none).

    Returns:
        ``(partners, n_untested)``: head label -> its redundant partners, and how many pairs or
        groups these settings would test that the saved evidence does not cover (counted as
        not redundant).

    Example:
        >>> pairs = pd.DataFrame({"head_a": ["L0H0"], "head_b": ["L0H1"], "similarity": [0.95],
        ...     "damage_joint": [0.4], "backup": [0.9]})
        >>> redundant_under(pairs, pd.DataFrame(columns=GROUP_COLUMNS),
        ...                 SpecializationSettings(), [], {})
        ({'L0H0': ['L0H1'], 'L0H1': ['L0H0']}, 0)
    """
    dead = set(dead)
    linked: list[tuple[str, str]] = []
    untested = 0
    heads = list(dict.fromkeys([*pairs["head_a"], *pairs["head_b"]]))
    for a, b, sim, joint, backup in zip(
        pairs["head_a"],
        pairs["head_b"],
        pairs["similarity"],
        pairs["damage_joint"],
        pairs["backup"],
        strict=True,
    ):
        if a in dead or b in dead or not float(sim) >= settings.min_similarity:
            continue
        if np.isnan(float(joint)):
            untested += 1
        elif float(joint) >= settings.min_joint_damage and float(backup) >= settings.backup_ratio:
            linked.append((a, b))
    candidates: list[tuple[str, ...]] = []
    if heads:
        # filled as an array, not cell by cell: the stability test calls this per variant
        # (a .loc per pair was 13 s of MiniLM's verdict)
        where = {head: i for i, head in enumerate(heads)}
        a_index = np.array([where[a] for a in pairs["head_a"]], dtype=int)
        b_index = np.array([where[b] for b in pairs["head_b"]], dtype=int)
        values = np.eye(len(heads))
        similarity = pairs["similarity"].to_numpy(dtype=float)
        values[a_index, b_index] = similarity
        values[b_index, a_index] = similarity
        sim = pd.DataFrame(values, index=heads, columns=heads)
        candidates += [tuple(g) for g in similar_groups(sim, settings.min_similarity, dead)]
    held: dict[str, list[str]] = {}
    for head, role in role_of.items():
        if role and head not in dead:
            held.setdefault(role, []).append(head)
    candidates += [tuple(members) for members in held.values() if len(members) >= 3]
    saved = {tuple(_split_heads(h)): i for i, h in enumerate(groups["heads"])}
    for members in dict.fromkeys(candidates):
        row = saved.get(members)
        if row is None:
            untested += 1
            continue
        damage_all, backup = (
            float(groups["damage_all"].iloc[row]),
            float(groups["backup"].iloc[row]),
        )
        if damage_all >= settings.min_joint_damage and backup >= settings.backup_ratio:
            linked += [(a, b) for i, a in enumerate(members) for b in members[i + 1 :]]
    partners: dict[str, list[str]] = {}
    for a, b in linked:
        for head, other in ((a, b), (b, a)):
            if other not in partners.setdefault(head, []):
                partners[head].append(other)
    return partners, untested
