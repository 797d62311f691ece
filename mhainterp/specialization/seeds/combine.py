"""Results of several runs as one: the ``runs`` table rows, :func:`combine_results` (with
cross-seed consistency) and :func:`attach_division` (the division indices and the regenerated
verdict).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pandas as pd

from mhainterp.ablation.replacement import method_order
from mhainterp.heads import HEAD_SET_SEPARATOR
from mhainterp.specialization.seeds.consistency import CONSISTENCY_COLUMNS, cross_seed_consistency
from mhainterp.specialization.settings import DivisionSettings, SpecializationSettings
from mhainterp.specialization.verdict.division_words import axis_call
from mhainterp.specialization.verdict.labels import findings, serving_label
from mhainterp.specialization.verdict.result import (
    DIVISION_COLUMNS,
    RUN_COLUMNS,
    SpecializationResult,
)
from mhainterp.specialization.verdict.sentences import RunVerdict, Verdict, group_key
from mhainterp.specialization.verdict.stability import (
    DIVISION_THRESHOLD,
    division_stability,
    flip_summary,
)
from mhainterp.specialization.whom.division_result import DivisionResult
from mhainterp.validation import ParameterError, invalid

__all__ = [
    "FLAG_EVIDENCE",
    "SERVES_QUALIFIERS",
    "attach_division",
    "combine_results",
    "compared_units",
    "single_result",
    "verdict_division_columns",
]


def verdict_division_columns() -> tuple[str, ...]:
    """The division index columns the verdict's sentences read besides :data:`DIVISION_COLUMNS`
    (the calibrated call of the verdict contract; each is carried when the table has it): the
    index and call under every registered method, the division's default method first.

    Example:
        >>> verdict_division_columns()[8:11]
        ('index_mean', 'index_zero', 'index_resample')
    """
    methods = method_order(DivisionSettings.method)
    return (
        *("divided", "call", "basis", "reason", "ci_low", "ci_high", "null_high", "p_floor"),
        *(f"index_{m}" for m in methods),
        *(f"call_{m}" for m in methods),
        "n_damaging",
        "explained_by",
        "index_explained",
    )


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


def attach_division(
    result: SpecializationResult,
    division: DivisionResult | pd.DataFrame,
    heads: pd.DataFrame | None = None,
) -> SpecializationResult:
    """The result with the division of labour attached: its verdict and ``runs`` regenerated
    ("specialized" in the sentences then means dividing the work, along the axes whose index
    beats its null), and, with the per-head rows, whom each head serves in its ``serves``,
    ``finding`` and label, and the division's effect gate moved in its stability table.

    Args:
        result: A :class:`SpecializationResult`.
        division: What :func:`~mhainterp.specialization.division_of_labour` returned (its
            index, heads and settings are used), or only its index table: ``by, index,
            null_index, p`` per axis and ``run`` naming the result's runs (without ``run``, the
            result must hold one run). The calibrated columns
            (:func:`verdict_division_columns`: ``call``, ``basis``, ``reason``, the CI, the p
            floor, the per-method indices and calls) are carried into the verdict when
            present.
        heads: Per head and axis (``head_label, by, serves, specialized`` and ``run`` as for
            ``division``; default: the result's own): whom each head serves. A head serves
            a subset of an axis when its flag says so (significant, with an effect); the
            finding says whether the heads divide that axis, and an unspecialized head that
            serves a subset of a divided axis is labelled by it (``serves token``).

    Example:
        >>> from mhainterp.model.handbuilt import handbuilt_model
        >>> from mhainterp.specialization import division_of_labour, specialization_test
        >>> from mhainterp.tasks import get_task
        >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
        >>> model = handbuilt_model(["previous", "uniform"], d_head=18)
        >>> result = specialization_test(model, task, n_eval=64)
        >>> attached = attach_division(result, division_of_labour(model, task, n_eval=64))
        >>> attached.heads["finding"].tolist()[0]
        'looks at previous; serves no subset shown; needed'
    """
    settings = DivisionSettings()
    if isinstance(division, DivisionResult):
        heads = division.heads if heads is None else heads
        settings = DivisionSettings.from_dict(division.settings)
        division = division.index
    runs = list(result.runs["run"])
    frame = _with_run(division, runs, "division")
    missing = [c for c in DIVISION_COLUMNS if c not in frame.columns]
    if missing:
        raise ParameterError(
            f"division is invalid: a table with columns {DIVISION_COLUMNS}, missing {missing}"
        )
    unknown = sorted(set(frame["run"]) - set(runs))
    if unknown:
        raise ParameterError(
            f"division is invalid: rows for the result's runs {runs}, got runs {unknown}"
        )
    head_rows = None if heads is None else _with_run(heads, runs, "heads")
    stability = result.stability
    if head_rows is not None and _has_flag_evidence(head_rows):
        stability = _with_division_stability(stability, head_rows, settings)
    carried = [*DIVISION_COLUMNS, *(c for c in verdict_division_columns() if c in frame.columns)]
    rows = frame[carried].to_dict("records")
    verdicts = []
    for v in result.verdict.runs:
        mine = [{k: r[k] for k in carried[1:]} for r in rows if r["run"] == v.run]
        if head_rows is not None:
            own = head_rows[head_rows["run"] == v.run]
            mine = [{**d, "units": compared_units(own, str(d["by"]), d.get("basis"))} for d in mine]
        flips = flip_summary(stability[stability["run"] == v.run]) if len(stability) else {}
        verdicts.append(dataclasses.replace(v, division=mine, **flips))
    verdict = Verdict(verdicts, result.verdict.consistency)
    head_table = result.heads
    if head_rows is not None:
        head_table = _with_serves(result.heads, head_rows, frame)
    return dataclasses.replace(
        result,
        division=frame,
        verdict=verdict,
        runs=_runs_table(result.runs, verdicts),
        heads=head_table,
        stability=stability,
    )


def _with_run(table: pd.DataFrame, runs: list[str], name: str) -> pd.DataFrame:
    """``table`` with a ``run`` column (added, naming the one run, when it has none)."""
    frame = table.copy()
    if "run" not in frame.columns:
        if len(runs) != 1:
            raise ParameterError(
                f"{name} is invalid: a 'run' column naming the runs when the result holds "
                f"{len(runs)} runs, got no 'run' column"
            )
        frame.insert(0, "run", runs[0])
    return frame


def _runs_table(table: pd.DataFrame, verdicts: list[RunVerdict]) -> pd.DataFrame:
    """The ``runs`` table with the columns the division changes regenerated."""
    out = table.copy()
    by_run = {v.run: v for v in verdicts}
    out["specialized_along"] = [",".join(by_run[r].specialized_axes) for r in out["run"]]
    out["verdict"] = [by_run[r].text for r in out["run"]]
    out["n_label_flips"] = [len(by_run[r].flip_heads) for r in out["run"]]
    out["frac_label_flips"] = [
        len(by_run[r].flip_heads) / by_run[r].total_heads for r in out["run"]
    ]
    return out


FLAG_EVIDENCE = frozenset({"basis", "p_adj", "n_values", "selectivity_gain", "served_values"})
"""The per-head columns :func:`division_stability` re-decides the flags from."""


def _has_flag_evidence(heads: pd.DataFrame) -> bool:
    return set(heads.columns) >= FLAG_EVIDENCE


def _with_division_stability(
    stability: pd.DataFrame, heads: pd.DataFrame, settings: DivisionSettings
) -> pd.DataFrame:
    """``stability`` with the division's effect gate moved (:func:`division_stability`),
    replacing any such rows of an earlier attachment."""
    kept = stability
    if len(stability) and "threshold" in stability.columns:
        kept = stability[stability["threshold"] != DIVISION_THRESHOLD]
    moved = division_stability(heads, settings)
    parts = [t for t in (kept, moved) if len(t)]
    return pd.concat(parts, ignore_index=True) if parts else stability


def compared_units(heads: pd.DataFrame, axis: str, basis: Any) -> str:
    """The heads (or groups) an axis's index compares on ``basis``: heads whose own profile
    is of that basis; on group profiles, the groups and the heads damaging outside them.

    Example:
        >>> heads = pd.DataFrame({"head_label": ["L0H3", "L1H1", "L1H2"], "by": "token",
        ...     "basis": ["single", "single", ""], "group": ""})
        >>> compared_units(heads, "token", "single")
        'L0H3,L1H1'
    """
    own = heads[heads["by"] == axis]
    if not isinstance(basis, str) or not basis or "basis" not in own.columns:
        return ""
    if basis == "group" and "group" in own.columns:
        groups = [g for g in dict.fromkeys(own["group"].fillna("").astype(str)) if g]
        alone = own[(own["basis"] == "single") & (own["group"].fillna("") == "")]
        return HEAD_SET_SEPARATOR.join([*(f"({g})" for g in groups), *alone["head_label"]])
    return HEAD_SET_SEPARATOR.join(own.loc[own["basis"] == basis, "head_label"].astype(str))


def _with_serves(
    heads: pd.DataFrame, division_heads: pd.DataFrame, index: pd.DataFrame
) -> pd.DataFrame:
    """``heads`` with ``serves`` ("token: 3,4; target_class: 2 (method-dependent)", "" for no
    subset), its ``finding`` and its label (:func:`~.labels.serving_label`) from the division
    test's per-head rows, each axis qualified by its call (``index``)."""
    calls = {
        (run, str(by)): axis_call(row)
        for run, by, row in zip(index["run"], index["by"], index.to_dict("records"), strict=True)
    }
    chosen = division_heads[division_heads["specialized"].astype(str) == "True"]
    serves: dict[tuple[str, str], list[str]] = {}
    divided: dict[tuple[str, str], list[str]] = {}
    for run, head, by, values in zip(
        chosen["run"], chosen["head_label"], chosen["by"], chosen["serves"], strict=True
    ):
        if not isinstance(values, str) or not values:
            continue
        call = calls.get((run, str(by)), "divided")
        serves.setdefault((run, head), []).append(f"{by}: {values}{SERVES_QUALIFIERS[call]}")
        if call == "divided":
            divided.setdefault((run, head), []).append(str(by))
    out = heads.copy()
    measured = set(division_heads["run"])
    keys = list(zip(out["run"], out["head_label"], strict=True))
    out["serves"] = ["; ".join(serves.get(k, [])) if k[0] in measured else None for k in keys]
    out["label"] = [
        serving_label(label, divided.get(k, []))
        for label, k in zip(out["label"], keys, strict=True)
    ]
    out["finding"] = findings(out)
    return out


SERVES_QUALIFIERS = {
    "divided": "",
    "method-dependent": " (method-dependent)",
    "not divided": " (not divided: the heads alike)",
    "cannot tell": " (cannot tell whether the heads divide it)",
}
"""What a head's served subset of an axis says of the axis's call: a subset the heads do not
divide is shared, not a division of labour."""


def single_result(tables: dict[str, Any], settings: SpecializationSettings) -> SpecializationResult:
    """One run's :class:`SpecializationResult` from its tables and verdict
    (:func:`~mhainterp.specialization.run_analysis.analyse_run`'s dict; its ``"verdict"`` is
    taken out of it): the runs table is the verdict's row, the consistency table empty (one
    run has no seeds to compare)."""
    verdict = tables.pop("verdict")
    runs = pd.DataFrame([_run_row(verdict, tables["heads"])], columns=RUN_COLUMNS)
    return SpecializationResult(
        **tables,
        consistency=pd.DataFrame(columns=["task", *CONSISTENCY_COLUMNS]),
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
        raise invalid("results", results, "a non-empty list of SpecializationResult")
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
    empty = pd.DataFrame(columns=["task", *CONSISTENCY_COLUMNS])  # a header, never a blank file
    consistency = pd.concat(tables, ignore_index=True) if tables else empty
    return SpecializationResult(
        **stacked,
        consistency=consistency,
        verdict=Verdict(run_verdicts, summaries),
        settings=settings,
    )
