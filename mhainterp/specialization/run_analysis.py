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


# ----------------------------------------------------------------------------- one run


def analyse_run(inp: RunInput, settings: SpecializationSettings, progress: bool) -> dict[str, Any]:
    """All tables and the verdict of one run.

    Returns:
        The tables of :class:`~mhainterp.specialization.verdict.result.SpecializationResult`
        but ``consistency`` and ``runs`` (one run has no seeds to compare), by name, and
        ``"verdict"``: the run's :class:`~.verdict.sentences.RunVerdict`.
        :func:`~mhainterp.specialization.seeds.combine.single_result` makes the result of them.
    """
    model, task = inp.model, inp.task
    batch = task.eval_batch(settings.n_eval)
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
    damage = target_damage(
        model,
        batch,
        method=settings.method,
        target_names=task.target_names,
        progress=progress,
    )
    variants = [settings] + [v for _, _, v in variant_settings(settings)]
    generator = torch.Generator().manual_seed(settings.seed)
    if len(task.target_names) >= 2:
        selectivity = causal_selectivity(
            damage,
            min_damage=settings.min_damage,
            n_permutations=settings.n_permutations,
            alpha=settings.alpha,  # the draws are raised so Holm over the heads can pass
            generator=generator,
        )
        causal_heads, causal_matrix = selectivity.heads, selectivity.matrix
        model_numbers = (selectivity.selectivity, selectivity.null_mean, selectivity.p_value)
    else:
        causal_heads = head_damage_table(damage)
        causal_heads["causal_target"] = [
            task.target_names[0] if d >= settings.min_damage else ""
            for d in causal_heads["total_damage"]
        ]
        causal_heads["selectivity"] = math.nan
        causal_heads["p_selectivity"] = math.nan
        causal_matrix = damage.frame()
        model_numbers = (math.nan, math.nan, math.nan)
    max_damage = causal_matrix.groupby("head_label")["damage"].max().astype(float).to_dict()
    quiet = quiet_ablations(model, batch, ratio, max_damage, variants, settings.method)

    def dead_under(variant: SpecializationSettings) -> list[str]:
        """Dead by function under ``variant`` (quiet AND costing nothing when removed)."""
        found = dead_heads(ratio, max_damage, quiet, variant)[0]
        return [h for h in ratio if h in found]

    dead = dead_under(settings)
    nested = nested_roles(templates, visible_keys(mask, model.cfg.causal))
    similarity = head_similarity(model, batch, method=settings.similarity_method)
    # Gather the evidence every perturbed setting of the stability test needs, so relabelling
    # never runs the model: pairs down to the loosest similarity gate, and the candidate
    # groups of every variant (similar components, heads sharing a role).
    loosest = min(v.min_similarity for v in variants)
    pairs = redundancy_pairs(
        model, batch, settings, dead=dead, similarity=similarity, evidence_similarity=loosest
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
        for head, d in decide_labels(roles, ratio, {}, variant, nested, dead_v).items():
            if d.role and not d.dead:
                held.setdefault(d.role, []).append(head)
        candidates += [(f"role:{r}", m) for r, m in held.items() if len(m) >= 3]
    groups = redundancy_groups(
        model, batch, settings, groups=candidates, dead=dead, similarity=similarity
    )
    evidence = RunEvidence(roles, ratio, pairs, groups, nested, max_damage, quiet)
    decisions, _, _ = relabel(evidence, settings)
    partners = {h: d.partners for h, d in decisions.items() if d.partners}
    groups = _mark_tested_groups(groups, decisions, similarity, settings, dead)
    heads = label_heads(
        roles,
        ratio,
        partners,
        causal_matrix,
        causal_heads,
        settings,
        role_targets(task),
        nested,
        covered=_covered(groups, decisions, settings),
        dead=dead,
    )
    stability = run_stability(
        inp.run, evidence, dict(zip(heads["head_label"], heads["label"])), settings
    )
    accuracy = float(evaluate(model, batch)["accuracy"])
    unit = "accuracy"
    if isinstance(model, BridgedModel):  # damage is a loss increase; accuracy says little
        accuracy = math.nan
        unit = "embedding metric" if model.cfg.objective == "embedding" else "nats of loss"
    meta = {"run": inp.run, "task": task.name, "n_heads": model.cfg.n_heads, "seed": inp.seed}
    heads = _with_meta(heads, meta)[HEAD_COLUMNS]
    verdict = _run_verdict(
        heads, roles, model, settings, accuracy, model_numbers, inp, stability, unit
    )
    return {
        "heads": heads,
        "roles": _with_meta(roles, meta),
        "causal": _with_meta(causal_matrix, meta),
        "redundancy": _with_meta(pairs, meta),
        "redundancy_groups": _with_meta(groups, meta),
        "init_null": _with_meta(init, meta),
        "nested": pd.DataFrame(sorted(nested), columns=["inner", "outer"]).pipe(
            _with_meta, {"run": inp.run}
        ),
        "stability": stability,
        "quiet": quiet.assign(run=inp.run)[["run", *quiet.columns]],
        "verdict": verdict,
    }


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
