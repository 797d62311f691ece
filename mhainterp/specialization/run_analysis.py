"""The analysis of one run: every table that
:func:`~mhainterp.specialization.battery.specialization_test` makes for one model and its task,
and the run's :class:`~mhainterp.specialization.verdict.sentences.RunVerdict`.

The steps (roles and nulls, dead test, ablations, redundancy, labels, stability) are listed in
:mod:`mhainterp.specialization.battery`; this module runs them in that order on one run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from mhainterp.capture import visible_keys
from mhainterp.heads import head_set_labels
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import BridgedModel
from mhainterp.runs import HEAD_KEYS, lead_with_head
from mhainterp.similarity import head_similarity
from mhainterp.specialization.needed.dead import dead_heads, quiet_ablations
from mhainterp.specialization.needed.redundancy import (
    redundancy_groups,
    redundancy_pairs,
    similar_groups,
)
from mhainterp.specialization.settings import SpecializationSettings
from mhainterp.specialization.verdict.labels import (
    BACKED_UP,
    LABELS_OTHER,
    decide_labels,
    label_heads,
    role_targets,
)
from mhainterp.specialization.verdict.result import HEAD_COLUMNS
from mhainterp.specialization.verdict.sentences import RunVerdict
from mhainterp.specialization.verdict.stability import (
    RunEvidence,
    flip_summary,
    relabel,
    run_stability,
    variant_settings,
)
from mhainterp.specialization.where.nulls import (
    combine_nulls,
    init_null_pool,
    init_null_summary,
    init_p_values,
)
from mhainterp.specialization.where.roles import (
    base_relation,
    capture_role_sums,
    nested_roles,
    role_frame,
    role_templates,
)
from mhainterp.specialization.whom.causal import (
    causal_selectivity,
    head_damage_table,
    target_damage,
)
from mhainterp.specialization.whom.damage import TripleDamage
from mhainterp.tasks import Task
from mhainterp.training import evaluate

# The seam battery.specialization_test builds on (users call specialization_test itself).
__all__ = ["RunInput", "analyse_run"]


@dataclass
class RunInput:
    """One run to analyse: the model, its task, its name in the tables and its seed (what
    :func:`~mhainterp.specialization.battery.specialization_test` resolves each of its inputs
    to)."""

    model: HookedMHATransformer
    task: Task
    run: str
    seed: int
    exact: frozenset[str] | None = None
    """Under the division's attribution screen (a pretrained model): the heads it computed
    exactly, the only ones the single-head damage removes (the others: their estimates)."""
    single_damage: TripleDamage | None = None
    """That division's single-head damage per triple, when it was computed in this process
    with the same method and batch: the damage step then runs no pass."""
    pretrained: bool = False
    """A pretrained model: its ``seed`` only seeds the nulls, so the verdict does not name it."""


# ----------------------------------------------------------------------------- one run


def analyse_run(inp: RunInput, settings: SpecializationSettings, progress: bool) -> dict[str, Any]:
    """All tables and the verdict of one run, in the battery's order (each step one function
    below, reading what the steps before it found):

    1. :func:`_where`: where each head looks, against the random-weight and key-permutation
       nulls;
    2. :func:`_damage`: what removing each head costs, per target (whom it serves);
    3. :func:`_needed`: dead heads and redundant pairs and groups, with the evidence every
       perturbed setting of the stability test needs (so relabelling never runs the model);
    4. :func:`_labels`: one label per head, and how they change when a threshold moves;
    5. :func:`_verdict`: the run's sentences.

    Returns:
        The tables of :class:`~mhainterp.specialization.verdict.result.SpecializationResult`
        but ``consistency`` and ``runs`` (one run has no seeds to compare), by name, and
        ``"verdict"``: the run's :class:`~mhainterp.specialization.RunVerdict`.
        :func:`~mhainterp.specialization.seeds.combine.single_result` makes the result of them.
    """
    batch = inp.task.eval_batch(settings.n_eval)
    where = _where(inp, batch, settings, progress)
    damage = _damage(inp, batch, settings, progress)
    needed = _needed(inp.model, batch, settings, where, damage, progress)
    heads, groups, stability = _labels(inp, settings, where, damage, needed)
    heads, verdict = _verdict(inp, batch, settings, heads, where, damage, stability)
    meta = _meta(inp)
    return {
        "heads": heads,
        "roles": _with_meta(where.roles, meta),
        "causal": _with_meta(damage.matrix, meta),
        "redundancy": _with_meta(needed.pairs, meta),
        "redundancy_groups": _with_meta(groups, meta),
        "init_null": _with_meta(where.init, meta),
        "nested": pd.DataFrame(sorted(where.nested), columns=["inner", "outer"]).pipe(
            _with_meta, {"run": inp.run}
        ),
        "stability": stability,
        "quiet": needed.quiet.assign(run=inp.run)[["run", *needed.quiet.columns]],
        "verdict": verdict,
    }


def _meta(inp: RunInput) -> dict[str, Any]:
    """The columns that name the run in each of its tables."""
    return {
        "run": inp.run,
        "task": inp.task.name,
        "n_heads": inp.model.cfg.n_heads,
        "seed": inp.seed,
    }


@dataclass
class _Where:
    """Where each head looks (step 1)."""

    roles: pd.DataFrame  # one row per (head, role): score, nulls, corrected p, effect
    init: pd.DataFrame  # the random-weight null's draws
    ratio: dict[str, float]  # head -> its output's share of the attention layer's output
    nested: set[tuple[str, str]]  # (inner, outer) role templates, inner inside outer


def _where(inp: RunInput, batch: Any, settings: SpecializationSettings, progress: bool) -> _Where:
    """Role scores of every head against the random-weight null (same architecture, random
    init) and the key permutation, corrected over the run's head x role pairs."""
    model, task = inp.model, inp.task
    tokens, mask = batch.tokens, batch.padding_mask
    templates = role_templates(tokens, mask, task=task, causal=model.cfg.causal)
    relations = list(task.relations(tokens[:1], mask[:1]))
    sums = capture_role_sums(model, tokens, mask, templates, outputs=True)
    roles = role_frame(sums, relations)
    # the random-weight null: our config's models, or a pretrained model's architecture
    architecture = model if isinstance(model, BridgedModel) else model.cfg
    init = init_null_pool(
        architecture, tokens, mask, templates, inp.seed, settings.n_init, progress=progress
    )
    roles = init_p_values(roles, init_null_summary(init))
    roles = combine_nulls(
        roles, alpha=settings.alpha, correction=settings.correction, min_effect=settings.min_effect
    )
    ratio_tensor = sums.output_ratio()
    ratio = {label: float(ratio_tensor.flatten()[i]) for i, label in enumerate(model.head_labels)}
    nested = nested_roles(templates, visible_keys(mask, model.cfg.causal))
    return _Where(roles, init, ratio, nested)


@dataclass
class _Damage:
    """What removing each head costs (step 2)."""

    heads: pd.DataFrame  # per head: total damage, the target it serves, its selectivity
    matrix: pd.DataFrame  # head x target damage
    numbers: tuple[float, float, float]  # the model's selectivity, its null mean, p (or NaN)
    max_damage: dict[str, float]  # head -> its largest damage on any target
    exact_loss: dict[str, float] | None = None  # pretrained: exact single-removal loss increases


def _damage(inp: RunInput, batch: Any, settings: SpecializationSettings, progress: bool) -> _Damage:
    """Each head's damage per target (``settings.method``), and with two or more targets its
    causal selectivity against a permutation null."""
    task = inp.task
    damage = target_damage(
        inp.model,
        batch,
        method=settings.method,
        target_names=task.target_names,
        progress=progress,
        exact=inp.exact,
        seed=settings.seed,
        triples=inp.single_damage,
    )
    generator = torch.Generator().manual_seed(settings.seed)
    if len(task.target_names) >= 2:
        selectivity = causal_selectivity(
            damage,
            min_damage=settings.min_damage,
            n_permutations=settings.n_permutations,
            alpha=settings.alpha,  # the draws are raised so Holm over the heads can pass
            generator=generator,
        )
        heads, matrix = selectivity.heads, selectivity.matrix
        numbers = (selectivity.selectivity, selectivity.null_mean, selectivity.p_value)
    else:
        heads = head_damage_table(damage)
        heads["causal_target"] = [
            task.target_names[0] if d >= settings.min_damage else "" for d in heads["total_damage"]
        ]
        heads["selectivity"] = math.nan
        heads["p_selectivity"] = math.nan
        matrix = damage.frame()
        numbers = (math.nan, math.nan, math.nan)
    max_damage = matrix.groupby("head_label")["damage"].max().astype(float).to_dict()
    exact_loss = None  # a pretrained model's exact single removals: the pair test reuses them
    if isinstance(inp.model, BridgedModel) and "loss_increase" in heads.columns:
        loss = dict(zip(heads["head_label"], heads["loss_increase"].astype(float), strict=True))
        exact_loss = {h: v for h, v in loss.items() if inp.exact is None or h in inp.exact}
    return _Damage(heads, matrix, numbers, max_damage, exact_loss)


@dataclass
class _Needed:
    """Dead and redundant heads (step 3), with the evidence of every perturbed setting."""

    evidence: RunEvidence
    dead: list[str]  # dead under the run's own settings, in head order
    similarity: pd.DataFrame  # head x head similarity (``settings.similarity_method``)
    pairs: pd.DataFrame  # redundant pairs, down to the loosest similarity gate
    groups: pd.DataFrame  # candidate groups of every variant, tested
    quiet: pd.DataFrame  # the quiet-ablation evidence of the dead test


def _needed(
    model: HookedMHATransformer,
    batch: Any,
    settings: SpecializationSettings,
    where: _Where,
    damage: _Damage,
    progress: bool = False,
) -> _Needed:
    """Dead heads (quiet AND costing nothing when removed), and redundant pairs and groups.

    Gathers the evidence every perturbed setting of the stability test needs, so relabelling
    never runs the model: pairs down to the loosest similarity gate, and the candidate groups
    of every variant (similar components, heads sharing a role)."""
    variants = [settings] + [v for _, _, v in variant_settings(settings)]
    ratio, max_damage = where.ratio, damage.max_damage
    quiet = quiet_ablations(model, batch, ratio, max_damage, variants, settings.method, progress)

    def dead_under(variant: SpecializationSettings) -> list[str]:
        """Dead by function under ``variant`` (quiet AND costing nothing when removed)."""
        found = dead_heads(ratio, max_damage, quiet, variant)[0]
        return [h for h in ratio if h in found]

    dead = dead_under(settings)
    similarity = head_similarity(model, batch, method=settings.similarity_method)
    loosest = min(v.min_similarity for v in variants)
    pairs = redundancy_pairs(
        model,
        batch,
        settings,
        dead=dead,
        similarity=similarity,
        evidence_similarity=loosest,
        singles=damage.exact_loss,
        progress=progress,
    )
    candidates: list[tuple[str, list[str]]] = []
    similar_sets: set[tuple[str, ...]] = set()
    for variant in variants:
        dead_v = dead_under(variant)
        gate = variant.min_similarity
        basis = "similarity" if gate == settings.min_similarity else f"similarity@{gate:g}"
        for g in similar_groups(similarity, gate, dead_v):
            if tuple(g) not in similar_sets:  # named after the first gate that finds it
                similar_sets.add(tuple(g))
                candidates.append((basis, g))
        held: dict[str, list[str]] = {}
        for head, d in decide_labels(where.roles, ratio, {}, variant, where.nested, dead_v).items():
            if d.role and not d.dead:
                held.setdefault(d.role, []).append(head)
        candidates += [(f"role:{r}", m) for r, m in held.items() if len(m) >= 3]
    groups = redundancy_groups(
        model,
        batch,
        settings,
        groups=candidates,
        dead=dead,
        similarity=similarity,
        evidence_joint_damage=min(v.min_joint_damage for v in variants),
        progress=progress,
    )
    evidence = RunEvidence(where.roles, ratio, pairs, groups, where.nested, max_damage, quiet)
    return _Needed(evidence, dead, similarity, pairs, groups, quiet)


def _labels(
    inp: RunInput,
    settings: SpecializationSettings,
    where: _Where,
    damage: _Damage,
    needed: _Needed,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One label per head (dead > backed up > role > unspecialized, with the flags), the
    groups marked with what these settings test, and the labels' stability.

    Returns:
        ``(heads, groups, stability)``.
    """
    decisions, _, _ = relabel(needed.evidence, settings)
    partners = {h: d.partners for h, d in decisions.items() if d.partners}
    groups = _mark_tested_groups(needed.groups, decisions, needed.similarity, settings, needed.dead)
    heads = label_heads(
        where.roles,
        where.ratio,
        partners,
        damage.matrix,
        damage.heads,
        settings,
        role_targets(inp.task),
        where.nested,
        covered=_covered(groups, decisions, settings),
        dead=needed.dead,
    )
    stability = run_stability(
        inp.run, needed.evidence, dict(zip(heads["head_label"], heads["label"])), settings
    )
    return heads, groups, stability


def _verdict(
    inp: RunInput,
    batch: Any,
    settings: SpecializationSettings,
    heads: pd.DataFrame,
    where: _Where,
    damage: _Damage,
    stability: pd.DataFrame,
) -> tuple[pd.DataFrame, RunVerdict]:
    """The heads table in its saved columns, and the run's :class:`RunVerdict`."""
    model = inp.model
    accuracy = float(evaluate(model, batch)["accuracy"])
    unit = "accuracy"
    if isinstance(model, BridgedModel):  # damage is a loss increase; accuracy says little
        accuracy = math.nan
        unit = "embedding metric" if model.cfg.objective == "embedding" else "nats of loss"
    heads = _with_meta(heads, _meta(inp))[HEAD_COLUMNS]
    verdict = _run_verdict(
        heads, where.roles, model, settings, accuracy, damage.numbers, inp, stability, unit
    )
    return heads, verdict


def _covered(
    groups: pd.DataFrame, decisions: dict[str, Any], settings: SpecializationSettings
) -> set[str]:
    """Heads of a tested group that shares their role and whose joint removal hurts."""
    out: set[str] = set()
    for members, damage in zip(groups.get("heads", []), groups.get("damage_all", []), strict=True):
        heads = head_set_labels(str(members))
        roles = {decisions[h].role for h in heads if h in decisions}
        if len(roles) == 1 and "" not in roles and float(damage) >= settings.min_joint_damage:
            out |= set(heads)
    return out


def _mark_tested_groups(
    groups: pd.DataFrame,
    decisions: dict[str, Any],
    similarity: pd.DataFrame,
    settings: SpecializationSettings,
    dead: list[str],
) -> pd.DataFrame:
    """``redundant`` of each group under the run's own settings: only groups these settings
    test (the similar components at ``min_similarity``, the heads sharing a role) can be;
    the other rows are evidence kept for the stability test."""
    if not len(groups):
        return groups
    tested = {",".join(g) for g in similar_groups(similarity, settings.min_similarity, dead)}
    held: dict[str, list[str]] = {}
    for head, d in decisions.items():
        if d.role and not d.dead:
            held.setdefault(d.role, []).append(head)
    tested |= {",".join(m) for m in held.values() if len(m) >= 3}
    groups = groups.copy()
    groups["redundant"] = groups["redundant"].astype(bool) & groups["heads"].isin(tested)
    return groups


def _with_meta(frame: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """``frame`` with the run's ``meta`` columns in front, after ``head_label, layer, head``
    in a per-head table (DESIGN: per-head tables lead with them)."""
    frame = lead_with_head(frame.copy())
    start = len(HEAD_KEYS) if set(HEAD_KEYS) <= set(frame.columns) else 0
    for i, (key, value) in enumerate(meta.items()):
        if key in frame.columns:
            frame = frame.drop(columns=key)
        frame.insert(start + i, key, value)
    return frame


# ----------------------------------------------------------------------------- the run's verdict


def _groups(partners: pd.Series) -> list[list[str]]:
    """Connected groups of redundant heads from the ``redundant_with`` column."""
    groups: list[set[str]] = []
    for head, linked in partners.items():
        if not linked:
            continue
        members = {head, *head_set_labels(linked)}
        merged = [g for g in groups if g & members]
        for g in merged:
            members |= g
            groups.remove(g)
        groups.append(members)
    return [sorted(g) for g in groups]


def _shared_role(roles: list[str]) -> str:
    """The role every head of a group holds, or "" when they differ or hold none."""
    return roles[0] if roles and all(r == roles[0] for r in roles) else ""


def _run_verdict(
    heads: pd.DataFrame,
    roles: pd.DataFrame,
    model: HookedMHATransformer,
    settings: SpecializationSettings,
    accuracy: float,
    causal: tuple[float, float, float],
    inp: RunInput,
    stability: pd.DataFrame,
    unit: str = "accuracy",
) -> RunVerdict:
    role_rows = heads[~heads["label"].isin(LABELS_OTHER)]
    unspecialized = heads[heads["label"] == "unspecialized"]
    weak = unspecialized[
        (unspecialized["top_p_adj"] < settings.alpha)
        & (unspecialized["top_effect"] > 0)
        & (unspecialized["top_effect"] < settings.min_effect)
        & (unspecialized["mixed_roles"] == "")
    ]
    groups = _groups(heads[heads["label"] == BACKED_UP].set_index("head_label")["redundant_with"])
    role_of = dict(zip(heads["head_label"], heads["role"], strict=True))
    return RunVerdict(
        run=inp.run,
        task=inp.task.name,
        n_heads=model.cfg.n_heads,
        n_layers=model.cfg.n_layers,
        seed=inp.seed,
        seed_shown=not inp.pretrained,
        n_targets=len(inp.task.target_names),
        role_heads=dict(zip(role_rows["head_label"], role_rows["label"], strict=True)),
        role_effects=dict(zip(role_rows["head_label"], role_rows["role_effect"], strict=True)),
        redundant_groups=groups,
        redundant_roles=[_shared_role([role_of[h] for h in group]) for group in groups],
        dead=heads.loc[heads["label"] == "dead", "head_label"].tolist(),
        unspecialized=unspecialized["head_label"].tolist(),
        mixed={h: m for h, m in zip(heads["head_label"], heads["mixed_roles"], strict=True) if m},
        weak=dict(zip(weak["head_label"], weak["top_role"], strict=True)),
        weak_effects=dict(zip(weak["head_label"], weak["top_effect"], strict=True)),
        supported=role_rows.loc[role_rows["causal_support"] == True, "head_label"].tolist(),  # noqa: E712
        largest_p_adj=float(role_rows["role_p_adj"].max()) if len(role_rows) else math.nan,
        alpha=settings.alpha,
        correction=settings.correction,
        min_effect=settings.min_effect,
        min_damage=settings.min_damage,
        n_init=settings.n_init,
        causal_selectivity=causal[0],
        causal_null=causal[1],
        causal_p=causal[2],
        accuracy=accuracy,
        damage_unit=unit,
        relations=_relations(heads),
        needed=heads.loc[heads["needed"].astype(bool), "head_label"].tolist(),
        backed_up=heads.loc[heads["backed_up"].astype(bool), "head_label"].tolist(),
        harmful=dict(
            zip(
                heads.loc[heads["harmful"].astype(bool), "head_label"],
                heads.loc[heads["harmful"].astype(bool), "removal_gain"].astype(float),
                strict=True,
            )
        ),
        **flip_summary(stability),
    )


def _relations(heads: pd.DataFrame) -> dict[str, list[str]]:
    """Relation -> the live heads holding it (redundant ones included). A counting head
    holds the relation it counts over (``count:same_token_upto+sink`` -> ``same_token_upto``):
    how it reads a relation is its label, which relation it covers is this."""
    out: dict[str, list[str]] = {}
    for head, role, dead in zip(heads["head_label"], heads["holds"], heads["dead"], strict=True):
        if role and not bool(dead):
            out.setdefault(base_relation(str(role)), []).append(head)
    return out
