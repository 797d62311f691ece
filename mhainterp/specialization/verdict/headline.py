"""Stability of the headline: does the verdict SENTENCE survive moving every gate?

:mod:`.stability` re-decides the labels with each label threshold x 0.8 / x 1.25 from saved
evidence. The headline (does the model divide the work, along what) rests on more: the damage
gates, ``alpha``, ``n_eval``, the ablation method, and the division test's own gates
(``min_gain``, ``min_loss_increase``, ``serve_share``, or, once the division test has a settings
object with ``perturbations()``, every gate it names). :func:`headline_stability` re-runs the
specialization test and the division of labour under each such perturbation and reports, per
perturbation, whether the run's headline sentence changes and the share of head labels that
flip; :func:`headline_summary` pools them: the share of verdict sentences that change beside
the share of labels.

This re-runs the model once per perturbation (about 30 for the defaults), so it is opt-in.

Example:
    >>> table = headline_stability(model, task, by="position")  # doctest: +SKIP
    >>> headline_summary(table)  # doctest: +SKIP
    {'n_perturbations': 30, 'share_sentences_changed': 0.1, 'share_labels_changed': 0.02}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pandas as pd

from mhainterp.ablation import METHODS
from mhainterp.specialization.battery import specialization_test
from mhainterp.specialization.seeds.combine import attach_division
from mhainterp.specialization.verdict.result import SpecializationResult
from mhainterp.specialization.verdict.sentences import headline_call
from mhainterp.specialization.verdict.settings import THRESHOLDS, SpecializationSettings
from mhainterp.specialization.verdict.stability import FACTORS
from mhainterp.specialization.whom.division import division_of_labour
from mhainterp.specialization.whom.settings import DIVISION_DEFAULTS

__all__ = [
    "DIVISION_GATES",
    "HEADLINE_COLUMNS",
    "compare_headlines",
    "gate_perturbations",
    "headline_stability",
    "headline_summary",
]

DIVISION_GATES = ("min_gain", "min_loss_increase", "serve_share")
"""The division test's gates that :class:`SpecializationSettings` does not hold (moved by
keyword until the division test has its own settings object)."""

HEADLINE_COLUMNS = [
    "perturbation",
    "headline",
    "changed",
    "n_labels",
    "n_labels_changed",
    "share_labels_changed",
]
"""Columns of :func:`compare_headlines`: one row per perturbation; ``headline`` is the run's
headline clause under it, ``changed`` whether it differs from the unperturbed one."""


@dataclasses.dataclass(frozen=True)
class Perturbation:
    """One moved gate: its name, the settings, and division keywords (or settings)."""

    name: str
    settings: SpecializationSettings
    division: dict[str, Any]


def gate_perturbations(
    settings: SpecializationSettings,
    division_settings: Any = None,
    factors: Sequence[float] = FACTORS,
) -> list[Perturbation]:
    """Every gate moved by each factor, ``n_eval`` halved and doubled, and every other
    ablation method.

    Args:
        settings: The unperturbed specialization settings.
        division_settings: The division test's settings object when it has
            ``perturbations()`` (-> ``(name, settings)`` pairs); None: its gates in
            :data:`DIVISION_GATES` are moved by keyword from their defaults.
        factors: How far each gate moves.

    Example:
        >>> names = [p.name for p in gate_perturbations(SpecializationSettings())]
        >>> names[:2], "alpha x0.8" in names, "ablation_method=zero" in names
        (['min_effect x0.8', 'min_effect x1.25'], True, True)
    """
    out = []
    for name in (*THRESHOLDS, "alpha"):
        for factor in factors:
            value = min(getattr(settings, name) * factor, 1.0) if name == "alpha" else None
            moved = (
                dataclasses.replace(settings, alpha=value)
                if name == "alpha"
                else settings.scaled(name, factor)
            )
            out.append(Perturbation(f"{name} x{factor:g}", moved, {}))
    for factor in (0.5, 2.0):
        moved = dataclasses.replace(settings, n_eval=max(1, round(settings.n_eval * factor)))
        out.append(Perturbation(f"n_eval x{factor:g}", moved, {}))
    for method in METHODS:
        if method != settings.ablation_method:
            moved = dataclasses.replace(settings, ablation_method=method)
            out.append(Perturbation(f"ablation_method={method}", moved, {}))
    if division_settings is not None and hasattr(division_settings, "perturbations"):
        for name, moved in division_settings.perturbations():
            out.append(Perturbation(f"division {name}", settings, {"settings": moved}))
    else:
        for gate in DIVISION_GATES:
            for factor in factors:
                value = DIVISION_DEFAULTS[gate] * factor
                value = min(value, 1.0) if gate == "serve_share" else value
                out.append(Perturbation(f"division {gate} x{factor:g}", settings, {gate: value}))
    return out


def _headline(result: SpecializationResult) -> str:
    """The headline clauses of every run of ``result``, joined (one run: one clause)."""
    return "; ".join(headline_call(run.calls) for run in result.verdict.runs)


def compare_headlines(
    base: SpecializationResult, variants: Sequence[tuple[str, SpecializationResult]]
) -> pd.DataFrame:
    """Per perturbation: its headline, whether it differs from ``base``'s, and the labels that
    flip (heads matched by run and head label).

    Returns:
        Columns :data:`HEADLINE_COLUMNS`.
    """
    want = _headline(base)
    labels = dict(zip(zip(base.heads["run"], base.heads["head_label"]), base.heads["label"]))
    rows = []
    for name, result in variants:
        mine = dict(
            zip(zip(result.heads["run"], result.heads["head_label"]), result.heads["label"])
        )
        changed = sum(mine.get(key) != label for key, label in labels.items())
        headline = _headline(result)
        rows.append(
            {
                "perturbation": name,
                "headline": headline,
                "changed": headline != want,
                "n_labels": len(labels),
                "n_labels_changed": changed,
                "share_labels_changed": changed / len(labels) if labels else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS)


def headline_stability(
    model: Any,
    data: Any,
    settings: SpecializationSettings | None = None,
    *,
    by: Sequence[str] | str = ("token", "position", "target_class", "target"),
    division_settings: Any = None,
    factors: Sequence[float] = FACTORS,
) -> pd.DataFrame:
    """Re-run the specialization test and the division of labour under every perturbation of
    :func:`gate_perturbations` and compare the headline with the unperturbed one.

    Args:
        model: The model.
        data: Its task (the evaluation set of each setting's ``n_eval`` is drawn from it).
        settings: The unperturbed settings.
        by: Axes of the division of labour; empty: labels only (no division headline).
        division_settings: See :func:`gate_perturbations`.
        factors: How far each gate moves.

    Returns:
        One row per perturbation, columns :data:`HEADLINE_COLUMNS`; ``.attrs["headline"]`` is
        the unperturbed headline.
    """
    settings = settings or SpecializationSettings()

    def run(s: SpecializationSettings, division: dict[str, Any]) -> SpecializationResult:
        result = specialization_test(model, data, settings=s)
        if not by:
            return result
        keywords = {"settings": s, "n_eval": s.n_eval, "method": s.ablation_method, **division}
        index = division_of_labour(model, data, by, **keywords).index
        return attach_division(result, index)

    if division_settings is not None:
        base = run(settings, {"settings": division_settings})
    else:
        base = run(settings, {})
    perturbed = [(p.name, run(p.settings, p.division)) for p in gate_perturbations(
        settings, division_settings, factors)]  # fmt: skip
    table = compare_headlines(base, perturbed)
    table.attrs["headline"] = _headline(base)
    return table


def headline_summary(table: pd.DataFrame) -> dict[str, float]:
    """The share of verdict sentences that change and the share of labels that flip, pooled
    over perturbations.

    Example:
        >>> t = pd.DataFrame({"changed": [True, False, False, False], "n_labels": [4] * 4,
        ...                   "n_labels_changed": [1, 0, 0, 1]})
        >>> headline_summary(t)
        {'n_perturbations': 4, 'share_sentences_changed': 0.25, 'share_labels_changed': 0.125}
    """
    n = len(table)
    labels = int(table["n_labels"].sum()) if n else 0
    return {
        "n_perturbations": n,
        "share_sentences_changed": float(table["changed"].mean()) if n else float("nan"),
        "share_labels_changed": (
            float(table["n_labels_changed"].sum()) / labels if labels else float("nan")
        ),
    }
