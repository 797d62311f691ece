"""Verdicts: the numbers of a specialization test and the sentences generated from them.

Nothing here is fixed text with blanks for decoration: every count, list and comparison in the
sentences is read from the fields, so a different result gives a different verdict (the tests
change the numbers and check that the text follows).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mhainterp.specialization.corrections import correction_name

__all__ = ["RunVerdict", "Verdict", "format_p", "group_key"]


def format_p(p: float) -> str:
    """``"p = 0.03"``, ``"p < 1e-10"`` for tiny values, ``"p n/a"`` for NaN.

    Example:
        >>> format_p(0.0312), format_p(1e-40), format_p(float("nan"))
        ('p = 0.031', 'p < 1e-10', 'p n/a')
    """
    if p is None or math.isnan(p):
        return "p n/a"
    if p < 1e-10:
        return "p < 1e-10"
    return f"p = {p:.2g}"


def _join(items: list[str], empty: str = "none") -> str:
    return ", ".join(items) if items else empty


def _mean_std(values: list[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "n/a"
    if len(finite) == 1:
        return f"{finite[0]:.2f}"
    return f"{np.mean(finite):.2f} ± {np.std(finite, ddof=1):.2f}"


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
        mixed: Heads that mix several significant roles: label -> ``"previous+mirror"``.
        weak: Unspecialized heads with a significant role below ``min_effect``: label -> role.
        weak_effects: Their effect sizes.
        supported: Role heads whose ablation hurts their relation's target.
        largest_p_adj: The largest corrected p-value among the role heads (NaN if none).
        alpha, correction, min_effect, min_damage, n_init: The settings used.
        causal_selectivity, causal_null, causal_p: Model selectivity, its null mean and p
            (NaN on single-target tasks).
        accuracy: The model's accuracy on the evaluation batch.
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

    @property
    def total_heads(self) -> int:
        return self.n_heads * self.n_layers

    @property
    def n_role(self) -> int:
        return len(self.role_heads)

    @property
    def n_redundant(self) -> int:
        return sum(len(g) for g in self.redundant_groups)

    @property
    def roles_found(self) -> list[str]:
        return sorted(set(self.role_heads.values()))

    def role_sentence(self) -> str:
        """The role counts, e.g. "2 of 4 heads hold a distinct role (...): L0H0 previous"."""
        total = self.total_heads
        head_word = "head" if total == 1 else "heads"
        verb = "holds" if self.n_role == 1 else "hold"
        criteria = (
            f"each p < {self.alpha:g} after {correction_name(self.correction)} correction "
            f"against both nulls, effect ≥ {self.min_effect:g}"
        )
        text = f"{self.n_role} of {total} {head_word} {verb} a distinct role ({criteria})"
        if self.role_heads:
            listed = [
                f"{h} {r} (effect {self.role_effects.get(h, math.nan):.2f})"
                for h, r in self.role_heads.items()
            ]
            text += ": " + ", ".join(listed)
            text += f"; largest corrected p {self.largest_p_adj:.2g}"
        return text + "."

    def other_sentence(self) -> str:
        """Redundant, dead and unspecialized heads, and weak preferences."""
        unspecialized = [
            f"{h} mixes {self.mixed[h]}" if h in self.mixed else h for h in self.unspecialized
        ]
        roles = self.redundant_roles or [""] * len(self.redundant_groups)
        groups = [
            " = ".join(g) + (f": {r}" if r else "")
            for g, r in zip(self.redundant_groups, roles, strict=False)
        ]
        parts = [
            f"{self.n_redundant} redundant ({_join(groups)})",
            f"{len(self.dead)} dead ({_join(self.dead)})",
            f"{len(self.unspecialized)} unspecialized ({_join(unspecialized)})",
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
                "accuracy)."
            )
        else:
            causal = (
                f"Causal selectivity {self.causal_selectivity:.2f} vs permutation null "
                f"{self.causal_null:.2f} ({format_p(self.causal_p)})."
            )
        if self.role_heads:
            causal += (
                f" Ablation backs {len(self.supported)} of {self.n_role} role heads (removing "
                f"the head costs its relation's target ≥ {self.min_damage:g} accuracy)."
            )
        return causal

    @property
    def text(self) -> str:
        """The whole verdict of this run, generated from the fields above."""
        header = f"{self.task}, h={self.n_heads}" + (
            f" x {self.n_layers} layers" if self.n_layers > 1 else ""
        )
        header += f", seed {self.seed}"
        if not math.isnan(self.accuracy):
            header += f" (accuracy {self.accuracy:.3f})"
        return " ".join(
            [header + ":", self.role_sentence(), self.other_sentence(), self.causal_sentence()]
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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
            :func:`~mhainterp.specialization.consistency.cross_seed_consistency`).
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
        """Summary of several seeds of one task and head count."""
        first = runs[0]
        counts = [r.n_role for r in runs]
        found: dict[str, int] = {}
        for r in runs:
            for role in r.roles_found:
                found[role] = found.get(role, 0) + 1
        roles = [f"{role} ({k}/{len(runs)} seeds)" for role, k in sorted(found.items())]
        copied: dict[str, int] = {}  # roles held by redundant groups (not distinct roles)
        for r in runs:
            for role in dict.fromkeys(x for x in r.redundant_roles if x):
                copied[role] = copied.get(role, 0) + 1
        if copied:
            roles += [
                f"{role} held by a redundant group ({k}/{len(runs)} seeds)"
                for role, k in sorted(copied.items())
            ]
        heads = "head" if first.total_heads == 1 else "heads"
        per_seed = ", ".join(map(str, counts))
        redundant = _mean_std([float(r.n_redundant) for r in runs])
        dead = _mean_std([float(len(r.dead)) for r in runs])
        text = (
            f"{first.task}, h={first.n_heads}, {len(runs)} seeds: "
            f"{_mean_std([float(c) for c in counts])} of {first.total_heads} {heads} hold a "
            f"distinct role (per seed: {per_seed}); redundant {redundant}, dead {dead}. "
            f"Roles found: {_join(roles)}."
        )
        selectivity = [r.causal_selectivity for r in runs]
        if any(not math.isnan(s) for s in selectivity):
            text += (
                f" Causal selectivity {_mean_std(selectivity)} vs null "
                f"{_mean_std([r.causal_null for r in runs])}."
            )
        summary = self.consistency.get(key)
        if summary:
            text += (
                f" Cross-seed consistency of role profiles {summary['consistency']:.2f} vs "
                f"random matching {summary['random_matching']:.2f} and role-shuffled null "
                f"{summary['null_shuffled']:.2f} ({format_p(summary['p_value'])})"
            )
            text += " (one head: any matching is the same)." if first.total_heads == 1 else "."
        return text

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
            "One run per task and head count: no seed spread is known; rerun with >= 3 seeds "
            "before generalising."
            if max(sizes) == 1
            else f"{_span(sizes)} seeds per task and head count; ± is the sample standard "
            "deviation over seeds, which is coarse with so few."
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
            "Causal selectivity treats targets as exchangeable: a target that removing any "
            "head hurts looks selective; read the head x target matrix too.",
        ]

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
