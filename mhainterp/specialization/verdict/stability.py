"""Stable conclusions: re-label every run with each threshold x 0.8 and x 1.25.

A label that changes when a threshold moves by a fifth rests on that threshold, not on the
model. :func:`label_stability` re-applies the labelling rules (:func:`.labels.decide_labels`,
:func:`.redundancy.redundant_under`) to the evidence a specialization test saved (role table
with ``p_adj``/``effect``/``chance``/``evenness``, output ratios, pair and group ablations,
nested role pairs, the head x target damage), once per threshold of
:data:`~.settings.THRESHOLDS` and factor, and counts the heads whose label differs from the
run's own. Nothing is recomputed: no forward pass, no ablation, so it costs milliseconds.

Evidence a perturbed setting would need but the run did not gather (a pair or group that only
a looser gate tests) is counted in ``n_untested`` and treated as not redundant; the test
gathers pair ablations down to ``min_similarity x 0.8`` and group ablations for every
perturbed setting's candidate groups, so on a trained run's own results ``n_untested`` is
0. On a pretrained model the pair ablations are capped
(:data:`~mhainterp.specialization.needed.redundancy.PRETRAINED_MAX_PAIRS`): a looser gate's
pairs can lie past the cap, and the verdict names that setting as not tested.

Example:
    >>> table = label_stability(result)  # doctest: +SKIP
    >>> table.groupby("threshold").share_changed.max()  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from mhainterp.heads import HEAD_SET_SEPARATOR, head_set_labels
from mhainterp.specialization.needed.dead import QUIET_COLUMNS, dead_heads
from mhainterp.specialization.needed.redundancy import GROUP_COLUMNS, redundant_under
from mhainterp.specialization.settings import THRESHOLDS, DivisionSettings, SpecializationSettings
from mhainterp.specialization.verdict.labels import HeadDecision, decide_labels, where_label
from mhainterp.specialization.whom.division_calls import specialized_rule

if TYPE_CHECKING:  # run_analysis imports this module
    from mhainterp.specialization.verdict.result import SpecializationResult

__all__ = [
    "FACTORS",
    "STABILITY_COLUMNS",
    "RunEvidence",
    "DIVISION_THRESHOLD",
    "division_stability",
    "flip_summary",
    "label_stability",
    "relabel",
    "run_evidence",
    "run_stability",
    "stability_summary",
    "variant_settings",
]

FACTORS = (0.8, 1.25)
"""How far each threshold is moved."""

STABILITY_COLUMNS = [
    "run",
    "threshold",
    "factor",
    "value",
    "n_heads",
    "n_changed",
    "share_changed",
    "changed",
    "n_untested",
]
"""Columns of :func:`label_stability`: one row per (run, threshold, factor); ``changed`` is the
head set whose label differs (``"L0H1,L0H3"``), ``share_changed = n_changed / n_heads``."""

_PAIR_COLUMNS = ["head_a", "head_b", "similarity", "damage_joint", "backup"]
DIVISION_THRESHOLD = "min_selectivity_gain"
"""The division's per-head effect gate, the threshold of :func:`division_stability`'s rows."""


@dataclass
class RunEvidence:
    """What one run's labels rest on, as saved by :func:`specialization_test`.

    Attributes:
        roles: Role table (``head_label, role, p_adj, effect, chance, evenness``).
        output_ratio: Head label -> RMS of its write / RMS of the residual stream.
        pairs: Pair table (``head_a, head_b, similarity, damage_joint, backup``).
        groups: Group table (``heads, damage_all, backup``).
        nested: ``(inner, outer)`` role pairs whose templates nest.
        max_damage: Head label -> its largest accuracy drop over targets.
        quiet: The quiet sets removed as a whole (:func:`.dead.quiet_ablations`).
    """

    roles: pd.DataFrame
    output_ratio: dict[str, float]
    pairs: pd.DataFrame
    groups: pd.DataFrame
    nested: Collection[tuple[str, str]]
    max_damage: dict[str, float]
    quiet: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)

    def __post_init__(self) -> None:
        if not len(self.pairs) or not set(_PAIR_COLUMNS) <= set(self.pairs.columns):
            self.pairs = pd.DataFrame(columns=_PAIR_COLUMNS)
        if not len(self.groups) or not set(GROUP_COLUMNS) <= set(self.groups.columns):
            self.groups = pd.DataFrame(columns=GROUP_COLUMNS)
        if not len(self.quiet) or not set(QUIET_COLUMNS) <= set(self.quiet.columns):
            self.quiet = pd.DataFrame(columns=QUIET_COLUMNS)


def relabel(
    evidence: RunEvidence, settings: SpecializationSettings
) -> tuple[dict[str, HeadDecision], dict[str, bool], int]:
    """Every head's label under ``settings`` from saved evidence.

    Returns:
        ``(decisions, needed, n_untested)``: head -> :class:`~.labels.HeadDecision`, head ->
        whether removing it costs ``>= min_damage`` accuracy on some target, and the number
        of pairs/groups these settings test that the evidence does not cover.
    """
    ratio = evidence.output_ratio
    dead, untested_dead = dead_heads(ratio, evidence.max_damage, evidence.quiet, settings)
    first = decide_labels(evidence.roles, ratio, {}, settings, evidence.nested, dead)
    role_of = {h: d.role for h, d in first.items()}
    partners, untested = redundant_under(evidence.pairs, evidence.groups, settings, dead, role_of)
    untested += untested_dead
    needed = {h: evidence.max_damage.get(h, 0.0) >= settings.min_damage for h in first}
    decisions = decide_labels(
        evidence.roles,
        ratio,
        partners,
        settings,
        evidence.nested,
        dead,
        needed=[h for h, n in needed.items() if n],
    )
    return decisions, needed, untested


def variant_settings(
    settings: SpecializationSettings, factors: Sequence[float] = FACTORS
) -> list[tuple[str, float, SpecializationSettings]]:
    """``(threshold, factor, settings)`` for every threshold of :data:`THRESHOLDS` x factor.

    Example:
        >>> [(n, f) for n, f, _ in variant_settings(SpecializationSettings())][:2]
        [('min_effect', 0.8), ('min_effect', 1.25)]
    """
    return [(name, f, settings.scaled(name, f)) for name in THRESHOLDS for f in factors]


def run_evidence(result: SpecializationResult, run: str) -> RunEvidence:
    """The evidence one run's labels rest on, from a result's tables."""

    def of(name: str) -> pd.DataFrame:
        table = getattr(result, name)
        return table[table["run"] == run] if "run" in table.columns else table.iloc[:0]

    heads = of("heads")
    causal = of("causal")
    nested = of("nested")
    return RunEvidence(
        roles=of("roles"),
        output_ratio=dict(zip(heads["head_label"], heads["output_ratio"].astype(float))),
        pairs=of("redundancy"),
        groups=of("redundancy_groups"),
        nested={(a, b) for a, b in zip(nested.get("inner", []), nested.get("outer", []))},
        max_damage=causal.groupby("head_label")["damage"].max().astype(float).to_dict()
        if len(causal)
        else {},
        quiet=of("quiet"),
    )


def run_stability(
    run: str,
    evidence: RunEvidence,
    labels: dict[str, str],
    settings: SpecializationSettings,
    factors: Sequence[float] = FACTORS,
) -> pd.DataFrame:
    """One run's rows of :func:`label_stability`: its ``labels`` (head -> label under
    ``settings``) against the labels under every perturbed setting."""
    rows = []
    for name, factor, variant in variant_settings(settings, factors):
        decisions, _, untested = relabel(evidence, variant)
        changed = [h for h, d in decisions.items() if d.label != labels.get(h)]
        rows.append(
            {
                "run": run,
                "threshold": name,
                "factor": factor,
                "value": float(getattr(variant, name)),
                "n_heads": len(decisions),
                "n_changed": len(changed),
                "share_changed": len(changed) / len(decisions) if decisions else math.nan,
                "changed": HEAD_SET_SEPARATOR.join(changed),
                "n_untested": untested,
            }
        )
    return pd.DataFrame(rows, columns=STABILITY_COLUMNS)


def label_stability(
    result: SpecializationResult, factors: Sequence[float] = FACTORS
) -> pd.DataFrame:
    """Re-label every run of a :class:`~mhainterp.specialization.SpecializationResult` with each
    threshold x each factor and count the labels that change (module docstring). What
    :func:`~mhainterp.specialization_test` stores as ``result.stability``; call it again on a
    saved result to try other factors.

    Returns:
        One row per (run, threshold, factor), columns :data:`STABILITY_COLUMNS`.
    """
    tables = []
    for run in dict.fromkeys(result.heads["run"]):
        own = result.heads[result.heads["run"] == run]
        # where a head looks: a label that says whom it serves is re-decided by
        # division_stability, from the division's own evidence
        labels = dict(zip(own["head_label"], own["label"].map(where_label)))
        evidence = run_evidence(result, run)
        tables.append(run_stability(run, evidence, labels, result.settings, factors))
    if not tables:
        return pd.DataFrame(columns=STABILITY_COLUMNS)
    return pd.concat(tables, ignore_index=True)


def division_stability(
    heads: pd.DataFrame,
    settings: DivisionSettings | None = None,
    factors: Sequence[float] = FACTORS,
) -> pd.DataFrame:
    """The division's per-head effect gate moved: each head's ``specialized`` flags re-decided
    from a saved heads table (:attr:`~mhainterp.specialization.DivisionResult.heads`) with
    ``min_selectivity_gain`` x each factor (:func:`~.division_calls.specialized_rule`; no
    forward pass), counting the heads whose specialized axes change.

    Args:
        heads: A division's heads table (``run`` optional: one block of rows per run).
        settings: The division's settings (default :class:`DivisionSettings`): ``alpha`` and
            ``min_selectivity_gain``.
        factors: How far the gate moves.

    Returns:
        Columns :data:`STABILITY_COLUMNS`, ``threshold`` "min_selectivity_gain".

    Example:
        >>> heads = pd.DataFrame({"head_label": ["L0H0", "L0H1"], "by": ["position"] * 2,
        ...     "basis": ["single"] * 2, "p_adj": [0.001, 0.001], "n_values": [10, 10],
        ...     "selectivity_gain": [0.5, 0.07], "served_values": ["2,3", "2,3,4"]})
        >>> division_stability(heads)[["factor", "changed"]].values.tolist()
        [[0.8, 'L0H1'], [1.25, '']]
    """
    settings = settings or DivisionSettings()
    rows = []
    runs = heads.groupby("run", sort=False) if "run" in heads.columns else [("", heads)]
    for run, own in runs:
        decided = {f: _specialized_axes(own, settings, f) for f in (1.0, *factors)}
        labels = list(dict.fromkeys(own["head_label"]))
        for factor in factors:
            changed = [h for h in labels if decided[factor][h] != decided[1.0][h]]
            rows.append(
                {
                    "run": run,
                    "threshold": DIVISION_THRESHOLD,
                    "factor": factor,
                    "value": settings.min_selectivity_gain * factor,
                    "n_heads": len(labels),
                    "n_changed": len(changed),
                    "share_changed": len(changed) / len(labels) if labels else math.nan,
                    "changed": HEAD_SET_SEPARATOR.join(changed),
                    "n_untested": 0,
                }
            )
    return pd.DataFrame(rows, columns=STABILITY_COLUMNS)


def _specialized_axes(
    heads: pd.DataFrame, settings: DivisionSettings, factor: float
) -> dict[str, frozenset[str]]:
    """Head label -> the axes it is specialized along with the effect gate x ``factor``."""
    served = heads["served_values"].fillna("").astype(str)
    n_served = served.map(lambda v: len(head_set_labels(v))).to_numpy()
    flags = specialized_rule(
        (heads["basis"].fillna("").astype(str) != "").to_numpy(),
        heads["p_adj"].to_numpy(float),
        heads["selectivity_gain"].to_numpy(float),
        n_served < heads["n_values"].to_numpy(int),
        settings.alpha,
        settings.min_selectivity_gain * factor,
    )
    out: dict[str, set[str]] = {h: set() for h in heads["head_label"]}
    for head, axis, flag in zip(heads["head_label"], heads["by"], flags, strict=True):
        if flag:
            out[head].add(str(axis))
    return {h: frozenset(a) for h, a in out.items()}


def flip_summary(stability: pd.DataFrame) -> dict[str, Any]:
    """What a run's verdict says of its stability rows: ``flips`` (threshold -> heads changed
    by either factor), ``flip_heads`` (changed by any), ``n_untested`` and ``untested`` (per
    perturbed setting, the tests it lacks: its "0 changed" does not show the labels survive).

    Example:
        >>> t = pd.DataFrame({"threshold": ["min_effect", "min_effect", DIVISION_THRESHOLD],
        ...     "changed": ["L0H1", "L0H1,L0H2", "L0H3"], "n_untested": [0, 0, 0]})
        >>> summary = flip_summary(t)
        >>> summary["flips"], summary["flip_heads"]
        ({'min_effect': 2, 'min_selectivity_gain': 1}, ['L0H1', 'L0H2', 'L0H3'])
    """
    flips, every = {}, []
    for name, rows in stability.groupby("threshold", sort=False):
        changed = rows["changed"].fillna("").astype(str)  # NaN: read back from an empty cell
        heads = {h for c in changed for h in head_set_labels(c)}
        flips[str(name)] = len(heads)
        every += sorted(heads)
    lacking = stability[stability["n_untested"] > 0] if len(stability) else stability
    return {
        "flips": flips,
        "flip_heads": sorted(set(every), key=every.index),
        "n_untested": int(stability["n_untested"].sum()) if len(stability) else 0,
        # per perturbed setting ("min_similarity x 0.8"): the tests it needs and the run lacks
        "untested": {
            f"{t} x {f:g}": int(n)
            for t, f, n in zip(
                lacking.get("threshold", []),
                lacking.get("factor", []),
                lacking.get("n_untested", []),
                strict=True,
            )
        },
    }


def stability_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per threshold (and ``"any"``, a head changed by at least one perturbation): the share of
    head labels that change, pooled over runs, per factor and both.

    Returns:
        Columns ``threshold, share_x0.8, share_x1.25, share_any, n_heads`` (shares of all the
        runs' heads; ``share_any`` counts a head once if either factor changes it).

    Example:
        >>> t = pd.DataFrame({"run": ["r"] * 2, "threshold": ["mix_ratio"] * 2,
        ...     "factor": [0.8, 1.25], "n_heads": [4, 4], "changed": ["L0H1", ""]})
        >>> row = stability_summary(t).iloc[0]
        >>> row["threshold"], float(row["share_any"])
        ('mix_ratio', 0.25)
    """
    if not len(table):
        return pd.DataFrame(columns=["threshold", "share_any", "n_heads"])
    total = int(table.drop_duplicates("run")["n_heads"].sum())
    rows = []
    names = list(dict.fromkeys(table["threshold"]))
    for name in [*names, "any"]:
        part = table if name == "any" else table[table["threshold"] == name]
        row: dict[str, object] = {"threshold": name}
        union: set[tuple[str, str]] = set()
        for factor, rows_f in part.groupby("factor", sort=True):
            heads = {
                (run, h)
                for run, changed in zip(rows_f["run"], rows_f["changed"], strict=True)
                for h in str(changed).split(HEAD_SET_SEPARATOR)
                if h and h != "nan"
            }
            row[f"share_x{factor:g}"] = len(heads) / total if total else math.nan
            union |= heads
        row["share_any"] = len(union) / total if total else math.nan
        row["n_heads"] = total
        rows.append(row)
    return pd.DataFrame(rows)
