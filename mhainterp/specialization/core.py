"""``specialization_test``: label every head and state the verdict, with the evidence.

For each run (a trained model and its task), on ``n_eval`` sequences of the task's fixed
evaluation set (held out from training):

1. role scores and their two nulls (:mod:`.roles`, :mod:`.nulls`), p-values corrected over every
   head x role test of the run;
2. each head's residual write, for the *dead* test (``output_ratio < dead_tol``);
3. single-head ablations: the head x target damage matrix and, on multi-target tasks, causal
   selectivity with its permutation null (:mod:`.causal`);
4. redundancy from similarity + pairwise and group backup (:mod:`.redundancy`);
5. with several runs of one task and head count: cross-seed consistency (:mod:`.consistency`);
6. the labels re-decided with every threshold x 0.8 and x 1.25 from the saved evidence
   (:mod:`.stability`; table ``stability``).

Each head then gets one **label** (:mod:`.labels`): ``"dead"`` > ``"redundant"`` > its distinct
role (e.g. ``"previous"``, or ``"count:same_token_upto+sink"`` for a counting head) >
``"unspecialized"`` (which includes heads that mix two relations), the flags ``holds``,
``needed``, ``backed_up``, ``dead``, and the share of its attention the known roles
``explained``; the run gets a :class:`~.verdict.RunVerdict` whose text is generated from the
tables. Whom the heads serve (the division test) enters as an optional ``division`` table
(``run, by, index, null_index, p``): pass ``division=`` or use :func:`attach_division`; without
it the verdict does not claim that the heads divide the work.

Example:
    >>> result = specialization_test("runs/quickstart/reverse/runs/h4_seed0")  # doctest: +SKIP
    >>> print(result.verdict.text)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from mhainterp.capture import visible_keys
from mhainterp.io import read_json, write_csv, write_json, write_text
from mhainterp.model import HookedMHATransformer
from mhainterp.similarity import head_similarity
from mhainterp.specialization.causal import causal_selectivity, head_damage_table, target_damage
from mhainterp.specialization.consistency import cross_seed_consistency
from mhainterp.specialization.labels import LABELS_OTHER, decide_labels, label_heads, role_targets
from mhainterp.specialization.nulls import (
    combine_nulls,
    init_null_scores,
    init_null_summary,
    init_p_values,
    matched_seeds,
)
from mhainterp.specialization.redundancy import (
    redundancy_groups,
    redundancy_pairs,
    similar_groups,
)
from mhainterp.specialization.roles import (
    base_relation,
    capture_role_sums,
    nested_roles,
    role_frame,
    role_templates,
)
from mhainterp.specialization.settings import SpecializationSettings
from mhainterp.specialization.stability import (
    RunEvidence,
    relabel,
    run_stability,
    variant_settings,
)
from mhainterp.specialization.verdict import RunVerdict, Verdict, group_key
from mhainterp.tasks import Task
from mhainterp.training import Run, evaluate, load_run

__all__ = [
    "HEAD_COLUMNS",
    "RUN_COLUMNS",
    "SpecializationResult",
    "SpecializationSettings",
    "attach_division",
    "combine_results",
    "specialization_test",
]

HEAD_COLUMNS = [
    "run",
    "task",
    "n_heads",
    "seed",
    "layer",
    "head",
    "head_label",
    "label",
    "role",
    "role_effect",
    "role_p_adj",
    "role_evenness",
    "roles",
    "mixed_roles",
    "top_role",
    "top_score",
    "top_effect",
    "top_p_adj",
    "explained",
    "unexplained",
    "explained_chance",
    "output_ratio",
    "holds",
    "needed",
    "backed_up",
    "dead",
    "redundant_with",
    "total_damage",
    "loss_increase",
    "causal_target",
    "causal_selectivity",
    "causal_p_adj",
    "causal_specialized",
    "causal_support",
]
"""Columns of :attr:`SpecializationResult.heads` (see :func:`label_heads`)."""

_TEXT_COLUMNS = (
    "role", "holds", "roles", "mixed_roles", "top_role", "redundant_with", "causal_target",
    "changed",
)  # fmt: skip
"""String columns whose empty values CSV reads back as NaN."""

RUN_COLUMNS = [
    "run",
    "task",
    "n_heads",
    "n_layers",
    "seed",
    "accuracy",
    "n_role",
    "n_redundant",
    "n_dead",
    "n_unspecialized",
    "n_weak",
    "n_relations",
    "heads_per_relation",
    "n_needed",
    "n_backed_up",
    "frac_role",
    "frac_redundant",
    "frac_dead",
    "frac_needed",
    "frac_backed_up",
    "n_label_flips",
    "frac_label_flips",
    "specialized_along",
    "roles_found",
    "mean_top_effect",
    "causal_selectivity",
    "causal_null",
    "causal_p",
    "verdict",
]
"""Columns of :attr:`SpecializationResult.runs`: one row per run, counts of each label
(``n_*``, counts) and shares (``frac_*`` = count / all heads), ``n_relations`` (relations some
live head holds, a count), ``heads_per_relation`` (a count), ``n_label_flips`` (heads whose
label changes with a threshold x 0.8 or x 1.25), ``specialized_along`` (axes whose division
index beats its null, ``,``-joined; empty when none or not measured), ``mean_top_effect``
(mean over heads of their best effect)."""


# ----------------------------------------------------------------------------- result


@dataclass
class SpecializationResult:
    """Everything :func:`specialization_test` found, as tidy tables plus the verdict.

    Attributes:
        heads: One row per (run, head), columns :data:`HEAD_COLUMNS`.
        roles: One row per (run, head, role): role scores with both nulls (``score, chance,
            effect, perm_std, z_perm, p_perm, init_mean, init_std, init_n, z_init, p_init, p,
            p_adj, significant``; see :mod:`.roles` and :mod:`.nulls`).
        causal: Head x target damage matrix (``run, head_label, layer, head, target,
            baseline_accuracy, ablated_accuracy, damage``).
        redundancy: Head pairs (``run`` + :data:`.redundancy.REDUNDANCY_COLUMNS`).
        redundancy_groups: Groups of three or more similar heads, tested as a whole
            (``run`` + :data:`.redundancy.GROUP_COLUMNS`).
        consistency: Run pairs of the same task and head count
            (:data:`.consistency.CONSISTENCY_COLUMNS` + ``task``); empty for one run.
        init_null: The null models' role scores (``run, init_seed, ...``).
        runs: One row per run, columns :data:`RUN_COLUMNS`.
        nested: Role pairs whose templates nest on the data (``run, inner, outer``): saved so
            labels can be re-decided without the data.
        stability: The labels re-decided with each threshold x 0.8 / x 1.25 (``run`` +
            :data:`.stability.STABILITY_COLUMNS`).
        verdict: The :class:`~.verdict.Verdict`.
        settings: The settings used.
        division: Optional division indices per run and axis (``run, by, index,
            null_index, p``; empty when the division test was not run).
    """

    heads: pd.DataFrame
    roles: pd.DataFrame
    causal: pd.DataFrame
    redundancy: pd.DataFrame
    redundancy_groups: pd.DataFrame
    consistency: pd.DataFrame
    init_null: pd.DataFrame
    runs: pd.DataFrame
    nested: pd.DataFrame
    stability: pd.DataFrame
    verdict: Verdict
    settings: SpecializationSettings
    division: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)

    TABLES = (
        "heads", "roles", "causal", "redundancy", "redundancy_groups", "consistency",
        "init_null", "runs", "nested", "stability",
    )  # fmt: skip
    OPTIONAL_TABLES = ("division",)

    def to_markdown(self) -> str:
        """The verdict, its caveats and the per-head table as Markdown."""
        from mhainterp.render import markdown_table

        columns = ["run", "head_label", "label", "holds", "needed", "backed_up", "dead"]
        columns += ["top_role", "top_effect", "top_p_adj", "explained", "unexplained"]
        columns += ["total_damage", "causal_target", "causal_selectivity"]
        lines = ["**Verdict.** " + line for line in self.verdict.lines]
        lines += ["", *[f"- {c}" for c in self.verdict.caveats], ""]
        lines.append(markdown_table(self.heads[columns]))
        return "\n".join(lines) + "\n"

    def save(self, out_dir: str | os.PathLike[str], prefix: str = "specialization") -> list[Path]:
        """Write every table as ``{prefix}_{name}.csv``, ``{prefix}.json`` (settings and
        verdict) and ``{prefix}.md``; return the paths."""
        out_dir = Path(out_dir)
        paths = [
            write_csv(out_dir / f"{prefix}_{name}.csv", getattr(self, name)) for name in self.TABLES
        ]
        for name in self.OPTIONAL_TABLES:
            if len(getattr(self, name)):
                paths.append(write_csv(out_dir / f"{prefix}_{name}.csv", getattr(self, name)))
        meta = {"settings": self.settings.to_dict(), "verdict": self.verdict.to_dict()}
        paths.append(write_json(out_dir / f"{prefix}.json", meta))
        paths.append(write_text(out_dir / f"{prefix}.md", self.to_markdown()))
        return paths

    @classmethod
    def load(
        cls, out_dir: str | os.PathLike[str], prefix: str = "specialization"
    ) -> SpecializationResult:
        """Read back what :meth:`save` wrote."""
        out_dir = Path(out_dir)
        meta = read_json(out_dir / f"{prefix}.json")
        tables = {}
        for name in cls.TABLES:
            path = out_dir / f"{prefix}_{name}.csv"
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} is missing: {out_dir} was written by an older mhainterp or only in "
                    "part; run the specialization test again to rewrite it"
                )
            try:
                tables[name] = pd.read_csv(path, keep_default_na=True)
            except pd.errors.EmptyDataError:
                tables[name] = pd.DataFrame()
            text = [c for c in _TEXT_COLUMNS if c in tables[name].columns]
            tables[name] = tables[name].fillna(dict.fromkeys(text, ""))
        for name in cls.OPTIONAL_TABLES:
            path = out_dir / f"{prefix}_{name}.csv"
            tables[name] = pd.read_csv(path) if path.is_file() else pd.DataFrame()
        return cls(
            **tables,
            verdict=Verdict.from_dict(meta["verdict"]),
            settings=SpecializationSettings.from_dict(meta["settings"]),
        )


# ----------------------------------------------------------------------------- inputs


@dataclass
class _RunInput:
    model: HookedMHATransformer
    task: Task
    run: str
    seed: int


def _resolve(run_or_runs: Any, task: Task | None) -> list[_RunInput]:
    items = (
        list(run_or_runs)
        if isinstance(run_or_runs, (list, tuple)) and not _is_model_task_pair(run_or_runs)
        else [run_or_runs]
    )
    if not items:
        raise ValueError("run_or_runs is empty: give a run folder, a Run, a model or a list")
    inputs = [_resolve_one(item, task, i) for i, item in enumerate(items)]
    names = _unique_names([i.run for i in inputs])
    for inp, name in zip(inputs, names, strict=True):
        inp.run = name
    return inputs


def _is_model_task_pair(value: Any) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], HookedMHATransformer)
        and isinstance(value[1], Task)
    )


def _resolve_one(item: Any, task: Task | None, index: int) -> _RunInput:
    if isinstance(item, (str, os.PathLike)):
        item = load_run(item)
    if isinstance(item, Run):
        return _RunInput(item.model, task or item.task, str(item.path), item.model_config.seed)
    if _is_model_task_pair(item):
        item, task = item
    if isinstance(item, HookedMHATransformer):
        if task is None:
            raise ValueError("task= is required when a model (not a run folder or Run) is given")
        return _RunInput(item, task, f"model{index}", item.cfg.seed)
    raise TypeError(
        "run_or_runs must be a run folder, a training.Run, a HookedMHATransformer (with task=), "
        f"a (model, task) pair, or a list of these; got {type(item).__name__}"
    )


def _unique_names(paths: list[str]) -> list[str]:
    """Shortest path suffixes that tell the runs apart (``h4_seed0``, ``reverse/runs/h4_seed0``)."""
    parts = [Path(p).parts or (p,) for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{name}#{i}" for i, name in enumerate(paths)]


# ----------------------------------------------------------------------------- one run


def _analyse(inp: _RunInput, settings: SpecializationSettings, progress: bool) -> dict[str, Any]:
    """All tables and the verdict of one run."""
    model, task = inp.model, inp.task
    batch = task.eval_batch(settings.n_eval)
    tokens, mask = batch.tokens, batch.padding_mask
    templates = role_templates(tokens, mask, task=task, causal=model.cfg.causal)
    relations = list(task.relations(tokens[:1], mask[:1]))
    sums = capture_role_sums(model, tokens, mask, templates, outputs=True)
    roles = role_frame(sums, relations)
    seeds = matched_seeds(model.cfg.seed, settings.n_init)
    init = init_null_scores(model.cfg, tokens, mask, templates, seeds, progress=progress)
    roles = init_p_values(roles, init_null_summary(init))
    roles = combine_nulls(
        roles, alpha=settings.alpha, correction=settings.correction, min_effect=settings.min_effect
    )
    ratio_tensor = sums.output_ratio()
    ratio = {label: float(ratio_tensor.flatten()[i]) for i, label in enumerate(model.head_labels)}
    dead = [label for label, r in ratio.items() if r < settings.dead_tol]
    damage = target_damage(
        model,
        batch,
        method=settings.ablation_method,
        target_names=task.target_names,
        progress=progress,
    )
    generator = torch.Generator().manual_seed(settings.seed)
    if len(task.target_names) >= 2:
        selectivity = causal_selectivity(
            damage,
            min_damage=settings.min_damage,
            n_permutations=settings.n_permutations,
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
    nested = nested_roles(templates, visible_keys(mask, model.cfg.causal))
    similarity = head_similarity(model, batch, method=settings.similarity_method)
    # Gather the evidence every perturbed setting of the stability test needs, so relabelling
    # never runs the model: pairs down to the loosest similarity gate, and the candidate
    # groups of every variant (similar components, heads sharing a role).
    variants = [settings] + [v for _, _, v in variant_settings(settings)]
    loosest = min(v.min_similarity for v in variants)
    pairs = redundancy_pairs(
        model, batch, settings, dead=dead, similarity=similarity, evidence_similarity=loosest
    )
    candidates: list[tuple[str, list[str]]] = []
    similar_sets: set[tuple[str, ...]] = set()
    for variant in variants:
        dead_v = [h for h, r in ratio.items() if r < variant.dead_tol]
        gate = variant.min_similarity
        basis = "similarity" if gate == settings.min_similarity else f"similarity@{gate:g}"
        for g in similar_groups(similarity, gate, dead_v):
            if tuple(g) not in similar_sets:  # named after the first gate that finds it
                similar_sets.add(tuple(g))
                candidates.append((basis, g))
        held: dict[str, list[str]] = {}
        for head, d in decide_labels(roles, ratio, {}, variant, nested).items():
            if d.role and not d.dead:
                held.setdefault(d.role, []).append(head)
        candidates += [(f"role:{r}", m) for r, m in held.items() if len(m) >= 3]
    groups = redundancy_groups(
        model, batch, settings, groups=candidates, dead=dead, similarity=similarity
    )
    max_damage = causal_matrix.groupby("head_label")["damage"].max().astype(float).to_dict()
    evidence = RunEvidence(roles, ratio, pairs, groups, nested, max_damage)
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
    )
    stability = run_stability(
        inp.run, evidence, dict(zip(heads["head_label"], heads["label"])), settings
    )
    accuracy = float(evaluate(model, batch)["accuracy"])
    meta = {"run": inp.run, "task": task.name, "n_heads": model.cfg.n_heads, "seed": inp.seed}
    heads = _with_meta(heads, meta)[HEAD_COLUMNS]
    verdict = _run_verdict(heads, roles, model, settings, accuracy, model_numbers, inp, stability)
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
        "verdict": verdict,
    }


def _covered(
    groups: pd.DataFrame, decisions: dict[str, Any], settings: SpecializationSettings
) -> set[str]:
    """Heads of a tested group that shares their role and whose joint removal hurts."""
    out: set[str] = set()
    for members, damage in zip(groups.get("heads", []), groups.get("damage_all", []), strict=True):
        heads = str(members).split(",")
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
    frame = frame.copy()
    for i, (key, value) in enumerate(meta.items()):
        if key in frame.columns:
            frame = frame.drop(columns=key)
        frame.insert(i, key, value)
    return frame


def _groups(partners: pd.Series) -> list[list[str]]:
    """Connected groups of redundant heads from the ``redundant_with`` column."""
    groups: list[set[str]] = []
    for head, linked in partners.items():
        if not linked:
            continue
        members = {head, *linked.split(",")}
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
    inp: _RunInput,
    stability: pd.DataFrame,
) -> RunVerdict:
    role_rows = heads[~heads["label"].isin(LABELS_OTHER)]
    unspecialized = heads[heads["label"] == "unspecialized"]
    weak = unspecialized[
        (unspecialized["top_p_adj"] < settings.alpha)
        & (unspecialized["top_effect"] > 0)
        & (unspecialized["top_effect"] < settings.min_effect)
        & (unspecialized["mixed_roles"] == "")
    ]
    groups = _groups(heads[heads["label"] == "redundant"].set_index("head_label")["redundant_with"])
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
        relations=_relations(heads),
        needed=heads.loc[heads["needed"].astype(bool), "head_label"].tolist(),
        backed_up=heads.loc[heads["backed_up"].astype(bool), "head_label"].tolist(),
        **_flips(stability),
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


def _flips(stability: pd.DataFrame) -> dict[str, Any]:
    """``flips`` (threshold -> heads changed by either factor), ``flip_heads``, ``n_untested``."""
    flips, every = {}, []
    for name, rows in stability.groupby("threshold", sort=False):
        heads = {h for c in rows["changed"] for h in str(c).split(",") if h and h != "nan"}
        flips[str(name)] = len(heads)
        every += sorted(heads)
    return {
        "flips": flips,
        "flip_heads": sorted(set(every), key=every.index),
        "n_untested": int(stability["n_untested"].sum()) if len(stability) else 0,
    }


def _run_row(verdict: RunVerdict, heads: pd.DataFrame) -> dict[str, Any]:
    total = verdict.total_heads
    return {
        "run": verdict.run,
        "task": verdict.task,
        "n_heads": verdict.n_heads,
        "n_layers": verdict.n_layers,
        "seed": verdict.seed,
        "accuracy": verdict.accuracy,
        "n_role": verdict.n_role,
        "n_redundant": verdict.n_redundant,
        "n_dead": len(verdict.dead),
        "n_unspecialized": len(verdict.unspecialized),
        "n_weak": len(verdict.weak),
        "n_relations": verdict.n_relations,
        "heads_per_relation": verdict.heads_per_relation,
        "n_needed": len(verdict.needed),
        "n_backed_up": len(verdict.backed_up),
        "frac_role": verdict.n_role / total,
        "frac_redundant": verdict.n_redundant / total,
        "frac_dead": len(verdict.dead) / total,
        "frac_needed": len(verdict.needed) / total,
        "frac_backed_up": len(verdict.backed_up) / total,
        "n_label_flips": len(verdict.flip_heads),
        "frac_label_flips": len(verdict.flip_heads) / total,
        "specialized_along": ",".join(verdict.specialized_axes),
        "roles_found": ";".join(verdict.roles_found),
        "mean_top_effect": float(heads["top_effect"].clip(lower=0).mean()),
        "causal_selectivity": verdict.causal_selectivity,
        "causal_null": verdict.causal_null,
        "causal_p": verdict.causal_p,
        "verdict": verdict.text,
    }


# ----------------------------------------------------------------------------- public API


def specialization_test(
    run_or_runs: Any,
    task: Task | None = None,
    settings: SpecializationSettings | None = None,
    *,
    progress: bool = False,
    division: pd.DataFrame | None = None,
    **overrides: Any,
) -> SpecializationResult:
    """Do the heads specialize? Label every head and state the verdict, with the evidence.

    Args:
        run_or_runs: A run folder, a :class:`~mhainterp.training.Run`, a model (with
            ``task=``), a ``(model, task)`` pair, or a list of these (e.g. the seeds of one
            head count, which adds cross-seed consistency).
        task: The task, when models are given (overrides a run's own task otherwise).
        settings: A :class:`SpecializationSettings`; ``**overrides`` replace its fields.
        progress: Show progress bars.
        division: Optional division indices (``run, by, index, null_index, p``; the run
            names as in the result, or no ``run`` column for a single run): see
            :func:`attach_division`.
        **overrides: Settings fields, e.g. ``alpha=0.01, n_eval=512``.

    Returns:
        A :class:`SpecializationResult` (``.heads``, ``.verdict.text`` ...).

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
        >>> result = specialization_test(handbuilt_model(["previous", "dead"], d_head=18), task)
        >>> result.heads["label"].tolist()
        ['previous', 'dead']
    """
    if task is not None and not isinstance(task, Task):
        raise TypeError(
            f"specialization_test needs the Task itself, got a {type(task).__name__}: the role "
            "templates come from task.relations() and the held-out set from task.eval_batch(); "
            "pass the Task (its evaluation size is settings.n_eval)"
        )
    settings = settings or SpecializationSettings()
    if overrides:
        settings = SpecializationSettings.from_dict({**settings.to_dict(), **overrides})
    inputs = _resolve(run_or_runs, task)
    singles = []
    for inp in tqdm(inputs, desc="specialization", disable=not progress or len(inputs) == 1):
        singles.append(_single_result(_analyse(inp, settings, progress), settings))
    result = combine_results(singles) if len(singles) > 1 else singles[0]
    return result if division is None else attach_division(result, division)


DIVISION_COLUMNS = ["run", "by", "index", "null_index", "p"]
"""Columns of :attr:`SpecializationResult.division` (one row per run and axis)."""


def attach_division(result: SpecializationResult, division: pd.DataFrame) -> SpecializationResult:
    """The result with division indices attached and its verdict and ``runs`` regenerated:
    "specialized" in the sentences then means dividing the work, along the axes whose index
    beats its null.

    Args:
        result: A :class:`SpecializationResult`.
        division: ``by, index, null_index, p`` per axis (e.g. ``division_of_labour(...).index``)
            and ``run`` naming the result's runs; without ``run``, the result must hold one run.

    Example:
        >>> index = pd.DataFrame({"by": ["token"], "index": [0.02], "null_index": [0.03],
        ...                       "p": [0.6]})
        >>> attach_division(result, index).verdict.runs[0].specialized_axes  # doctest: +SKIP
        []
    """
    frame = division.copy()
    runs = list(result.runs["run"])
    if "run" not in frame.columns:
        if len(runs) != 1:
            raise ValueError(
                f"division has no 'run' column but the result holds {len(runs)} runs; add a "
                "'run' column naming them"
            )
        frame.insert(0, "run", runs[0])
    missing = [c for c in DIVISION_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"division lacks columns {missing}; needs {DIVISION_COLUMNS}")
    unknown = sorted(set(frame["run"]) - set(runs))
    if unknown:
        raise ValueError(f"division names runs {unknown} that the result lacks; runs: {runs}")
    rows = frame[DIVISION_COLUMNS].to_dict("records")
    verdicts = []
    for v in result.verdict.runs:
        mine = [{k: r[k] for k in DIVISION_COLUMNS[1:]} for r in rows if r["run"] == v.run]
        verdicts.append(dataclasses.replace(v, division=mine))
    verdict = Verdict(verdicts, result.verdict.consistency)
    table = result.runs.copy()
    by_run = {v.run: v for v in verdicts}
    table["specialized_along"] = [",".join(by_run[r].specialized_axes) for r in table["run"]]
    table["verdict"] = [by_run[r].text for r in table["run"]]
    return dataclasses.replace(result, division=frame, verdict=verdict, runs=table)


def _single_result(
    tables: dict[str, Any], settings: SpecializationSettings
) -> SpecializationResult:
    verdict = tables.pop("verdict")
    runs = pd.DataFrame([_run_row(verdict, tables["heads"])], columns=RUN_COLUMNS)
    return SpecializationResult(
        **tables,
        consistency=pd.DataFrame(),
        runs=runs,
        verdict=Verdict([verdict]),
        settings=settings,
    )


def combine_results(results: Sequence[SpecializationResult]) -> SpecializationResult:
    """Stack the results of several runs and add cross-seed consistency per task/head count.

    The settings of the first result are used for the consistency null.

    Example:
        >>> combined = combine_results([specialization_test(r) for r in runs])  # doctest: +SKIP
    """
    if not results:
        raise ValueError("combine_results needs at least one result")
    settings = results[0].settings
    stacked = {
        name: pd.concat([getattr(r, name) for r in results], ignore_index=True)
        for name in (*SpecializationResult.TABLES, *SpecializationResult.OPTIONAL_TABLES)
        if name != "consistency"
    }
    run_verdicts = [v for r in results for v in r.verdict.runs]
    tables, summaries = [], {}
    for key, group in stacked["runs"].groupby(["task", "n_heads", "n_layers"], sort=False):
        if len(group) < 2:
            continue
        runs = list(group["run"])
        roles = {run: stacked["roles"][stacked["roles"]["run"] == run] for run in runs}
        heads = stacked["heads"]
        labels = {
            run: dict(zip(h["head_label"], h["label"], strict=True))
            for run, h in heads[heads["run"].isin(runs)].groupby("run", sort=False)
        }
        pairs, summary = cross_seed_consistency(
            roles, labels, n_shuffles=settings.n_shuffles, seed=settings.seed
        )
        pairs.insert(0, "task", key[0])
        tables.append(pairs)
        summaries[group_key(key[0], int(key[1]))] = summary
    consistency = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    return SpecializationResult(
        **stacked,
        consistency=consistency,
        verdict=Verdict(run_verdicts, summaries),
        settings=settings,
    )
