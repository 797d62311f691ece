"""Verdicts: the numbers of a specialization test and the sentences generated from them.

Nothing here is fixed text with blanks for decoration: every count, list and comparison in the
sentences is read from the fields, so a different result gives a different verdict (the tests
change the numbers and check that the text follows).

The vocabulary (DESIGN.md, "The question the toolkit answers"): a head can **hold** a relation
(its attention matches a role against both nulls), **serve** a subset (the division test), be
**needed** (removing it alone costs accuracy), be **backed up** (redundant) or be **dead**.
Holding a relation is not dividing the work: the sentences count relations and the heads per
relation, and call a model **specialized** only along an axis whose division index beats its
null (from the division table, when there is one; without it they do not claim division).
Counts are written as counts ("8 heads hold 1 relation") and shares as shares ("redundant
share 1.00"), never one as the other. A verdict whose labels change when a threshold moves by
x 0.8 / x 1.25 says so (:mod:`.stability`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mhainterp.render import format_p
from mhainterp.specialization.verdict.division_words import (
    SEEDS_DISAGREE,
    SERVING_CALLS,
    UNDEFINED_INDEX,
    axis_call,
    basis_text,
    division_axes,
    division_text,
    headline_call,
    is_finite,
    layer_of,
    with_layers,
)
from mhainterp.specialization.whom.division_calls import CALLS, restated_axis
from mhainterp.stats import correction_name

__all__ = [
    "RunVerdict",
    "Verdict",
    "group_key",
]


def _join(items: list[str], empty: str = "none") -> str:
    return ", ".join(items) if items else empty


def _mean_std(values: list[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "n/a"
    if len(finite) == 1:
        return f"{finite[0]:.2f}"
    return f"{np.mean(finite):.2f} ± {np.std(finite, ddof=1):.2f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _per_seed(values: list[int], most: int = 10) -> str:
    """``; per seed 1, 1, 0`` while there are at most ``most`` seeds, else nothing (the mean
    and std say it; 100 seeds would list 100 numbers)."""
    return f"; per seed {', '.join(map(str, values))}" if len(values) <= most else ""


def _untested_text(untested: dict[str, int]) -> str:
    """ "not tested: min_similarity x 0.8 needs 1,155 pair or group ablations that were not run
    (counted as not redundant), so the labels are not shown to survive it"."""
    listed = "; ".join(f"{s} needs {n:,} pair or group ablations" for s, n in untested.items())
    it = "it" if len(untested) == 1 else "them"
    return (
        f"not tested: {listed} that were not run (counted as not redundant), so the labels are "
        f"not shown to survive {it}"
    )


def _some_defined(runs: list[RunVerdict]) -> bool:
    """Whether some seed of a group has a defined call on some axis (else every axis is
    undefined in every seed, as at h = 1)."""
    return any(call != "cannot tell" for r in runs for call in r.calls.values())


def _group_index(runs: list[RunVerdict], axis: str) -> str:
    """``, index 0.28 ± 0.02 vs null q95 0.01``: an axis's index over the seeds beside the
    null's upper quantile its calls clear (seed means), "" where no seed has one.

    Example:
        >>> runs = [RunVerdict(run="r", task="t", n_heads=2, n_layers=1, seed=0, division=[
        ...     {"by": "token", "index": 0.3, "null_high": 0.02}])]
        >>> _group_index(runs, "token")
        ', index 0.30 vs null q95 0.02'
    """
    rows = [
        d for r in runs for d in r.division if str(d["by"]) == axis and is_finite(d.get("index"))
    ]
    if not rows:
        return ""
    index = _mean_std([float(d["index"]) for d in rows])
    if all(is_finite(d.get("null_high")) for d in rows):
        return f", index {index} vs null q95 {_mean_std([float(d['null_high']) for d in rows])}"
    return f", index {index} vs null {_mean_std([float(d['null_index']) for d in rows])}"


def _stability_clause(runs: list[RunVerdict]) -> str:
    """``; labels rest on thresholds: 24 of 24 head labels change when one moves x 0.8 or
    x 1.25 (backup_ratio: 24 labels, min_similarity: 18 labels)``, or "" when none changes.

    Example:
        >>> run = RunVerdict(run="r", task="t", n_heads=2, n_layers=1, seed=0,
        ...     flips={"min_effect": 1, "min_selectivity_gain": 2}, flip_heads=["L0H0", "L0H1"])
        >>> _stability_clause([run])[:59]
        '; labels rest on thresholds: 2 of 2 head labels change when'
        >>> _stability_clause([run]).split(" (")[-1]
        'min_selectivity_gain: 2 labels, min_effect: 1 label)'
    """
    flipped = sum(len(r.flip_heads) for r in runs)
    if not flipped:
        return ""
    per: dict[str, int] = {}
    for r in runs:
        for name, k in r.flips.items():
            per[name] = per.get(name, 0) + k
    worst = ", ".join(  # counts of labels, never a bare number that reads as a threshold
        f"{t}: {k} label{'s' if k != 1 else ''}"
        for t, k in sorted(per.items(), key=lambda x: -x[1])
        if k
    )
    total = sum(r.total_heads for r in runs)
    return (
        f"; labels rest on thresholds: {flipped} of {total} head labels change when one moves "
        f"x 0.8 or x 1.25 ({worst})"
    )


@dataclass
class RunVerdict:
    """The numbers behind one run's verdict.

    Attributes:
        run: Run id.
        task: Task name.
        n_heads: Heads per layer.
        n_layers: Layers.
        seed: The run's seed.
        n_targets: Targets per position of the task.
        role_heads: Head label -> role, for heads labelled with a role.
        role_effects: Head label -> effect size of that role.
        redundant_groups: Groups of heads that are redundant with each other.
        redundant_roles: Per group, the role its heads attend to ("" if none is significant).
        dead: Dead heads.
        unspecialized: Unspecialized heads.
        mixed: Heads that mix several significant roles: label -> ``"previous;mirror"`` (``";"``
            as in the head table: role names such as ``same_token+sink`` hold ``"+"``).
        weak: Unspecialized heads with a significant role below ``min_effect``: label -> role.
        weak_effects: Their effect sizes.
        supported: Role heads whose ablation hurts their relation's target.
        largest_p_adj: The largest corrected p-value among the role heads (NaN if none).
        alpha, correction, min_effect, min_damage, n_init: The settings used.
        causal_selectivity, causal_null, causal_p: Model selectivity, its null mean and p
            (NaN on single-target tasks).
        accuracy: The model's accuracy on the evaluation batch.
        damage_unit: What ``min_damage`` is in: ``"accuracy"``, or on a pretrained model
            ``"nats of loss"`` / ``"embedding metric"`` (its damage is a loss increase).
        relations: Relation (role) -> the live heads that hold it, backed up or not.
        needed: Heads whose removal alone costs ``>= min_damage`` accuracy on some target.
        harmful: Live heads whose removal alone improves a target by ``>= min_damage``:
            label -> that improvement (``removal_gain``).
        backed_up: Live heads whose work others carry (redundant, or not needed in a group
            sharing their relation whose joint removal hurts; :mod:`.labels`).
        division: Rows ``by, index, null_index, p`` of the division test (empty: not run).
        flips: Threshold -> heads whose label changes with it x 0.8 or x 1.25.
        flip_heads: Heads whose label changes under at least one of those.
        n_untested: Pairs/groups a perturbed setting tests that the saved evidence lacks.
        untested: Per perturbed setting (``"min_similarity x 0.8"``), those it lacks.
    """

    run: str
    task: str
    n_heads: int
    n_layers: int
    seed: int
    n_targets: int = 1
    role_heads: dict[str, str] = field(default_factory=dict)
    role_effects: dict[str, float] = field(default_factory=dict)
    redundant_groups: list[list[str]] = field(default_factory=list)
    redundant_roles: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    unspecialized: list[str] = field(default_factory=list)
    mixed: dict[str, str] = field(default_factory=dict)
    weak: dict[str, str] = field(default_factory=dict)
    weak_effects: dict[str, float] = field(default_factory=dict)
    supported: list[str] = field(default_factory=list)
    largest_p_adj: float = math.nan
    alpha: float = 0.05
    correction: str = "holm"
    min_effect: float = 0.3
    min_damage: float = 0.01
    n_init: int = 4
    causal_selectivity: float = math.nan
    causal_null: float = math.nan
    causal_p: float = math.nan
    accuracy: float = math.nan
    damage_unit: str = "accuracy"
    relations: dict[str, list[str]] = field(default_factory=dict)
    needed: list[str] = field(default_factory=list)
    backed_up: list[str] = field(default_factory=list)
    seed_shown: bool = True  # False for a pretrained model: its seed only seeds the nulls
    division: list[dict[str, Any]] = field(default_factory=list)
    flips: dict[str, int] = field(default_factory=dict)
    flip_heads: list[str] = field(default_factory=list)
    harmful: dict[str, float] = field(default_factory=dict)
    n_untested: int = 0
    untested: dict[str, int] = field(default_factory=dict)

    @property
    def total_heads(self) -> int:
        return self.n_heads * self.n_layers

    @property
    def n_role(self) -> int:
        return len(self.role_heads)

    @property
    def n_redundant(self) -> int:
        """Heads backed up by a partner: the members of the redundant groups that are backed
        up (a group also lists the needed partners that carry their work)."""
        backed = set(self.backed_up)
        return sum(h in backed for g in self.redundant_groups for h in g)

    @property
    def roles_found(self) -> list[str]:
        return sorted(set(self.role_heads.values()))

    @property
    def n_relations(self) -> int:
        """Relations covered: how many distinct relations some live head holds (a count)."""
        return len(self.relations)

    @property
    def n_holding(self) -> int:
        """Heads that hold a relation (a count)."""
        return sum(len(h) for h in self.relations.values())

    @property
    def holding(self) -> set[str]:
        """The heads that hold a relation."""
        return {h for heads in self.relations.values() for h in heads}

    @property
    def heads_per_relation(self) -> float:
        """Mean heads per relation covered (a count; NaN with no relation)."""
        return self.n_holding / self.n_relations if self.relations else math.nan

    @property
    def specialized_axes(self) -> list[str]:
        """Axes along which the heads divide the work (empty when none or not measured)."""
        return division_axes(self.division, self.alpha)

    @property
    def calls(self) -> dict[str, str]:
        """Axis -> its call (:data:`CALLS`)."""
        return {str(d["by"]): axis_call(d, self.alpha) for d in self.division}

    @property
    def restated(self) -> dict[str, str]:
        """Axis -> the axis its division may only restate (:func:`restated_axis`)."""
        return {str(d["by"]): o for d in self.division if (o := restated_axis(d))}

    @property
    def _seed_text(self) -> str:
        return f", seed {self.seed}" if self.seed_shown else ""

    @property
    def headline(self) -> str:
        """One sentence: does this run divide the work, along what, on what basis."""
        where = f"{_plural(self.n_relations, 'relation')} held"
        return (
            f"{self.task}, h={self.n_heads}{self._seed_text}: "
            f"{headline_call(self.calls, restated=self.restated)}"
            f"{basis_text(self.division)}{_stability_clause([self])} ({where}; "
            f"{len(self.needed)} of {self.total_heads} needed, {len(self.backed_up)} backed up, "
            f"{len(self.dead)} dead)."
        )

    def relation_sentence(self) -> str:
        """ "8 heads hold 1 relation (mirror: 8 heads, L0H0, ...)"; who is needed, backed up,
        dead."""
        total = self.total_heads
        if self.relations:
            listed = [
                f"{rel}: {_plural(len(heads), 'head')} ({self._named(heads)})"
                for rel, heads in sorted(self.relations.items())
            ]
            text = (
                f"{self.n_holding} of {total} heads {'holds' if self.n_holding == 1 else 'hold'} "
                f"{_plural(self.n_relations, 'relation')} ({'; '.join(listed)}; each p < "
                f"{self.alpha:g} after {correction_name(self.correction)} correction against "
                f"both nulls, effect ≥ {self.min_effect:g})"
            )
        else:
            text = f"No head of {total} holds a relation (none beats both nulls)"
        text += (
            f"; {len(self.needed)} of {total} needed (removing one alone costs ≥ "
            f"{self.min_damage:g} {self.damage_unit}), {len(self.backed_up)} backed up, "
            f"{len(self.dead)} dead."
        )
        if self.harmful:
            gains = ", ".join(f"{h} {g:.2f}" for h, g in self.harmful.items())
            text += (
                f" {len(self.harmful)} harmful: removing one alone improves a target by ≥ "
                f"{self.min_damage:g} {self.damage_unit} ({gains})."
            )
        return text

    def _named(self, heads: list[str]) -> str:
        """Heads joined, each with its layer in a model of several layers (its relations
        compare heads of different layers: a previous-token head in layer 0, an induction
        head in layer 1)."""
        if self.n_layers < 2:
            return ", ".join(heads)
        layers = {h: layer_of(h) for h in heads}
        return "; ".join(
            f"{', '.join(h for h in heads if layers[h] == layer)} in layer {layer}"
            for layer in dict.fromkeys(layers.values())
        )

    def stability_sentence(self) -> str:
        """Whether the labels survive each threshold x 0.8 and x 1.25."""
        untested = f" ({_untested_text(self.untested)})" if self.untested else ""
        if not self.flip_heads and untested:  # "stable" would claim the untested setting too
            return f"No label changes with a threshold x 0.8 or x 1.25 where tested{untested}."
        if not self.flip_heads:
            return "Labels are stable: none changes with any threshold x 0.8 or x 1.25."
        worst = sorted(((n, t) for t, n in self.flips.items() if n), reverse=True)
        listed = ", ".join(f"{t}: {n} head{'s' if n != 1 else ''}" for n, t in worst)
        return (
            f"This verdict rests on thresholds: {len(self.flip_heads)} of {self.total_heads} "
            f"labels change with a threshold x 0.8 or x 1.25 ({listed}; heads "
            f"{', '.join(self.flip_heads)}){untested}."
        )

    def other_sentence(self) -> str:
        """Redundant, dead and unspecialized heads, and weak preferences."""
        unspecialized = [
            f"{h} mixes {' and '.join(self.mixed[h].split(';'))}" if h in self.mixed else h
            for h in self.unspecialized
        ]
        roles = self.redundant_roles or [""] * len(self.redundant_groups)
        groups = [
            " = ".join(
                with_layers([h]) if self.n_layers < 2 else f"{h} (layer {layer_of(h)})" for h in g
            )
            + (f": {r}" if r else "")
            for g, r in zip(self.redundant_groups, roles, strict=False)
        ]
        by_group = len(self.backed_up) - self.n_redundant  # backed up, but by no one partner
        parts = [
            f"Labels: {self.n_redundant} backed up by a partner ({_join(groups)})"
            + (f", {by_group} more by a group of heads" if by_group > 0 else ""),
            f"{len(self.dead)} dead ({_join(self.dead)})",
            # "unspecialized" is about where a head looks only: the headline may still say the
            # heads divide the work (whom they serve), so the sentence names the axis.
            f"{len(self.unspecialized)} unspecialized in where they look ({_join(unspecialized)})",
        ]
        text = "; ".join(parts) + "."
        if self.weak:
            weak = [
                f"{h} {r} ({self.weak_effects.get(h, math.nan):.2f})" for h, r in self.weak.items()
            ]
            text += (
                f" {len(self.weak)} of the unspecialized attend to a relation significantly "
                f"above chance but weakly (effect < {self.min_effect:g}): {', '.join(weak)}."
            )
        return text

    def causal_sentence(self) -> str:
        """Causal selectivity against its null, and how many role heads ablation backs."""
        if self.n_targets < 2:
            causal = "Causal selectivity: not applicable (one target)."
        elif math.isnan(self.causal_selectivity):
            causal = (
                f"Causal selectivity: undefined (no head's removal costs ≥ {self.min_damage:g} "
                f"{self.damage_unit})."
            )
        else:
            causal = (
                f"Causal selectivity {self.causal_selectivity:.2f} vs permutation null "
                f"{self.causal_null:.2f} ({format_p(self.causal_p)})."
            )
        if self.role_heads:
            causal += (
                f" Ablation backs {len(self.supported)} of {self.n_role} role heads (removing "
                f"the head costs its relation's target ≥ {self.min_damage:g} {self.damage_unit})."
            )
        return causal

    @property
    def text(self) -> str:
        """The whole verdict of this run, generated from the fields above."""
        header = f"{self.task}, h={self.n_heads}" + (
            f" x {self.n_layers} layers" if self.n_layers > 1 else ""
        )
        header += self._seed_text
        if not math.isnan(self.accuracy):
            header += f" (accuracy {self.accuracy:.3f})"
        return " ".join(
            [
                header + ":",
                f"Headline: {headline_call(self.calls, restated=self.restated)}"
                f"{basis_text(self.division)}"
                f"{_stability_clause([self])}.",
                self.relation_sentence(),
                division_text(self.division, self.alpha),
                self.stability_sentence(),
                self.other_sentence(),
                self.causal_sentence(),
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["damage_unit"] == "accuracy":  # the default: saved verdicts read as before
            del out["damage_unit"]
        for empty in ("harmful", "untested"):  # likewise
            if not out[empty]:
                del out[empty]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunVerdict:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Verdict:
    """The overall verdict of one or several runs.

    Attributes:
        runs: One :class:`RunVerdict` per run.
        consistency: ``"task/h"`` -> the cross-seed consistency summary of that group (see
            :func:`~mhainterp.specialization.seeds.consistency.cross_seed_consistency`).
    """

    runs: list[RunVerdict]
    consistency: dict[str, dict[str, float]] = field(default_factory=dict)

    def groups(self) -> dict[str, list[RunVerdict]]:
        """Runs grouped by ``"task/h"`` (in order of appearance)."""
        out: dict[str, list[RunVerdict]] = {}
        for run in self.runs:
            out.setdefault(group_key(run.task, run.n_heads), []).append(run)
        return out

    def group_sentence(self, key: str, runs: list[RunVerdict]) -> str:
        """Summary of several seeds of one task and head count: graded numbers as seed mean ±
        std (n seeds), counts apart from shares, the division index against its null, and
        whether the labels survive the thresholds moving."""
        first, n = runs[0], len(runs)
        total = first.total_heads

        def share(values: list[float]) -> str:
            return _mean_std([v / total for v in values])

        found: dict[str, int] = {}
        for r in runs:
            for rel in r.relations:
                found[rel] = found.get(rel, 0) + 1
        relations = [f"{rel} ({k}/{n} seeds)" for rel, k in sorted(found.items())]
        k = sum(bool(r.relations) for r in runs)
        with_relation = "" if k == n else f"; n = {k} of {n} seeds, those with a relation"
        text = (
            f"{first.task}, h={first.n_heads}, {_plural(total, 'head')}, {_plural(n, 'seed')} "
            "(mean ± std): "
            f"relations covered {_mean_std([float(r.n_relations) for r in runs])} (a count"
            f"{_per_seed([r.n_relations for r in runs])}), heads per relation "
            f"{_mean_std([r.heads_per_relation for r in runs])} (a count{with_relation}); "
            "needed share "
            f"{share([float(len(r.needed)) for r in runs])} (needed but holding no known "
            f"relation {share([float(len(set(r.needed) - r.holding)) for r in runs])}), "
            f"backed-up share {share([float(len(r.backed_up)) for r in runs])}, dead share "
            f"{share([float(len(r.dead)) for r in runs])}. Relations: {_join(relations)} "
            "(each beats the permutation and initialisation nulls)."
        )
        text += " " + self._group_division(runs)
        flipped = [len(r.flip_heads) for r in runs]
        if any(flipped):
            per: dict[str, int] = {}
            for r in runs:
                for t, k in r.flips.items():
                    per[t] = per.get(t, 0) + k
            worst = ", ".join(
                f"{t} {k / (total * n):.2f}"
                for t, k in sorted(per.items(), key=lambda x: -x[1])
                if k
            )
            text += (
                f" This verdict rests on thresholds: a share {sum(flipped) / (total * n):.2f} of "
                "the labels change with a threshold x 0.8 or x 1.25 (share per threshold: "
                f"{worst})."
            )
        else:
            text += " Labels are stable: none changes with any threshold x 0.8 or x 1.25."
        selectivity = [r.causal_selectivity for r in runs]
        if any(not math.isnan(s) for s in selectivity):
            text += (
                f" Causal selectivity over targets {_mean_std(selectivity)} vs null "
                f"{_mean_std([r.causal_null for r in runs])}."
            )
        summary = self.consistency.get(key)
        if summary:
            margin = summary["consistency"] - summary["random_matching"]
            null = summary.get("null", "heads shuffled across seeds")
            text += (
                f" Cross-seed consistency of role profiles {summary['consistency']:.2f}, "
                f"{margin:+.2f} over a random matching ({summary['random_matching']:.2f}); "
                f"null used: {null}, {summary['null_shuffled']:.2f} "
                f"({format_p(summary['p_value'], summary.get('p_floor'))})"
            )
            text += " (one head: any matching is the same)." if total == 1 else "."
        return text

    @staticmethod
    def group_calls(runs: list[RunVerdict]) -> dict[str, str]:
        """Axis -> the call of a group of seeds: the call most seeds get; without a majority,
        :data:`SEEDS_DISAGREE` where the seeds' defined calls differ, else "cannot tell"
        (undefined in too many seeds to call it)."""
        axes = list(dict.fromkeys(a for r in runs for a in r.calls))
        out = {}
        for axis in axes:
            calls = [r.calls[axis] for r in runs if axis in r.calls]
            best = max(CALLS, key=calls.count)
            if calls.count(best) * 2 > len(calls):
                out[axis] = best
            elif len({c for c in calls if c != "cannot tell"}) > 1:
                out[axis] = SEEDS_DISAGREE
            else:
                out[axis] = "cannot tell"
        return out

    @staticmethod
    def group_restated(runs: list[RunVerdict]) -> dict[str, str]:
        """Axis -> the axis its division may only restate in most of the seeds that divide
        along it (:func:`restated_axis`)."""
        out = {}
        for axis in dict.fromkeys(a for r in runs for a in r.calls):
            divided = [r for r in runs if r.calls.get(axis) == "divided"]
            others = [r.restated.get(axis, "") for r in divided]
            best = max(set(others), key=others.count) if others else ""
            if best and others.count(best) * 2 > len(divided):
                out[axis] = best
        return out

    def headline(self, runs: list[RunVerdict]) -> str:
        """ONE sentence for a task and head count over its seeds (the report's headline)."""
        first, n = runs[0], len(runs)
        calls = self.group_calls(runs)
        restated = self.group_restated(runs)
        counts = []
        for axis in calls:  # an undefined call ("cannot tell") is not counted as "no"
            undefined = sum(r.calls.get(axis) == "cannot tell" for r in runs)
            if undefined == n:
                continue
            divided = sum(r.calls.get(axis) == "divided" for r in runs)
            counts.append(
                f"{divided}/{n} seeds divided by {axis}"
                + (f" ({undefined} undefined)" if undefined else "")
                + (_group_index(runs, axis) if calls[axis] in SERVING_CALLS else "")
            )
        evidence = f" ({'; '.join(counts)})" if counts and n > 1 else ""
        rows = [d for r in runs for d in r.division]
        return (
            f"h={first.n_heads} ({_plural(first.total_heads, 'head')}, {_plural(n, 'seed')}): "
            f"{headline_call(calls, group=_some_defined(runs), restated=restated)}{evidence}"
            f"{basis_text(rows)}"
            f"{_stability_clause(runs)}."
        )

    def headlines(self) -> dict[str, list[str]]:
        """Task -> one headline sentence per head count, in order of appearance."""
        out: dict[str, list[str]] = {}
        for runs in self.groups().values():
            out.setdefault(runs[0].task, []).append(self.headline(runs))
        return out

    @staticmethod
    def _group_division(runs: list[RunVerdict]) -> str:
        n = len(runs)
        axes = list(dict.fromkeys(str(d["by"]) for r in runs for d in r.division))
        if not axes:
            return (
                "Division of labour not measured (no division table): this verdict does not "
                "say whether the heads divide the work."
            )
        parts = []
        for axis in axes:
            rows = [d for r in runs for d in r.division if str(d["by"]) == axis]
            beats = sum(axis in r.specialized_axes for r in runs)
            defined = [d for d in rows if is_finite(d.get("index"))]
            if defined:
                quantile = all(is_finite(d.get("null_high")) for d in defined)
                null = "null's 95% quantile" if quantile else "null"
                column = "null_high" if quantile else "null_index"
                index = (
                    f"{_mean_std([float(d['index']) for d in defined])} vs {null} "
                    f"{_mean_std([float(d[column]) for d in defined])}"
                )
            else:
                index = UNDEFINED_INDEX
            parts.append(f"by {axis} {index}, divided in {beats}/{n} seeds")
        verdict = headline_call(
            Verdict.group_calls(runs),
            group=_some_defined(runs),
            restated=Verdict.group_restated(runs),
        )
        return f"Division of labour: {'; '.join(parts)}: {verdict}."

    @property
    def lines(self) -> list[str]:
        """One line per run (a single run) or per task/head-count group (several seeds)."""
        out = []
        for key, runs in self.groups().items():
            out.append(runs[0].text if len(runs) == 1 else self.group_sentence(key, runs))
        return out

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def caveats(self) -> list[str]:
        """The limits of the numbers, with the numbers they apply to."""
        if not self.runs:
            return []
        first = self.runs[0]
        n_role = sum(r.n_role for r in self.runs)
        supported = sum(len(r.supported) for r in self.runs)
        sizes = [len(runs) for runs in self.groups().values()]
        seeds = (
            "One pretrained checkpoint: there is no seed spread to know; the verdict is about "
            "this checkpoint on these sentences."
            if not first.seed_shown
            else "One run per task and head count: no seed spread is known; rerun with >= 3 "
            "seeds before generalising."
            if max(sizes) == 1
            else f"{_span(sizes)} seeds per task and head count; ± is the sample standard "
            "deviation over seeds, which is coarse with so few."
        )
        causal = (
            "Causal selectivity treats targets as exchangeable: a target that removing any "
            "head hurts looks selective; read the head x target matrix too."
            if any(r.n_targets > 1 for r in self.runs)
            else "Causal selectivity was not computed: every task here has one target."
        )
        return [
            "Attention is a clue, not an explanation: a role score says where a head looks, "
            f"not what the model uses it for; ablation backs {supported} of the {n_role} "
            "role heads found.",
            "Nulls: attention shuffled over the keys the mask allows (permutation) and "
            f"{first.n_init} untrained models of the same architecture with matched seeds "
            "(initialisation); a role must beat both, after correction for every head x "
            "role test.",
            seeds,
            causal,
            self._stability_caveat(),
            "Holding a relation is not dividing the work: "
            + (
                "'specialized' here means a division index beyond its null, along the axis named."
                if any(r.division for r in self.runs)
                else "no division test is in these results, so nothing here says the heads "
                "divide the work."
            ),
        ]

    def _stability_caveat(self) -> str:
        total = sum(r.total_heads for r in self.runs)
        flipped = sum(len(r.flip_heads) for r in self.runs)
        untested = sum(r.n_untested for r in self.runs)
        text = (
            f"Thresholds: re-deciding every label with each threshold x 0.8 and x 1.25 (from the "
            f"saved evidence) changes {flipped} of {total} head labels"
        )
        per: dict[str, int] = {}
        for r in self.runs:
            for setting, n in r.untested.items():
                per[setting] = per.get(setting, 0) + n
        if per:  # counted as not redundant, so "0 changed" there does not show they survive
            return f"{text}; {_untested_text(per)}."
        return text + (f"; {untested} tests lacked evidence." if untested else ".")

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": [r.to_dict() for r in self.runs],
            "consistency": self.consistency,
            "text": self.text,
            "caveats": self.caveats,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        return cls(
            runs=[RunVerdict.from_dict(r) for r in data.get("runs", [])],
            consistency=dict(data.get("consistency", {})),
        )

    def __str__(self) -> str:
        return self.text


def _span(values: list[int]) -> str:
    """``"3"`` or ``"2-3"``."""
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def group_key(task: str, n_heads: int) -> str:
    """``"count_previous/h4"``: how task/head-count groups are named."""
    return f"{task}/h{n_heads}"
