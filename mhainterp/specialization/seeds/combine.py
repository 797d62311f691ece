"""Results of several runs as one: the ``runs`` table rows, :func:`combine_results` (with
cross-seed consistency) and :func:`attach_division` (the division indices and the regenerated
verdict).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pandas as pd

from mhainterp.specialization.seeds.consistency import CONSISTENCY_COLUMNS, cross_seed_consistency
from mhainterp.specialization.verdict.labels import findings
from mhainterp.specialization.verdict.result import (
    DIVISION_COLUMNS,
    RUN_COLUMNS,
    SpecializationResult,
)
from mhainterp.specialization.verdict.sentences import RunVerdict, Verdict, group_key
from mhainterp.specialization.verdict.settings import SpecializationSettings
from mhainterp.validation import ParameterError, invalid

__all__ = ["VERDICT_DIVISION_COLUMNS", "attach_division", "combine_results"]

VERDICT_DIVISION_COLUMNS = (
    "divided", "call", "basis", "reason", "ci_low", "ci_high", "null_high", "p_floor",
    "index_mean", "index_zero", "index_resample", "call_mean", "call_zero", "call_resample",
    "n_damaging",
)  # fmt: skip
"""The division index columns the verdict's sentences read besides :data:`DIVISION_COLUMNS`
(the calibrated call of the verdict contract; each is carried when the table has it)."""


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
    result: SpecializationResult, division: pd.DataFrame, heads: pd.DataFrame | None = None
) -> SpecializationResult:
    """The result with division indices attached and its verdict and ``runs`` regenerated:
    "specialized" in the sentences then means dividing the work, along the axes whose index
    beats its null.

    Args:
        result: A :class:`SpecializationResult`.
        division: ``by, index, null_index, p`` per axis (e.g. ``division_of_labour(...).index``)
            and ``run`` naming the result's runs; without ``run``, the result must hold one run.
            The calibrated columns (:data:`VERDICT_DIVISION_COLUMNS`: ``call``, ``basis``,
            ``reason``, the CI, the p floor, the per-method indices and calls) are carried into
            the verdict when present.
        heads: Optional per head and axis (``head_label, by, serves, specialized`` and
            ``run`` as for ``division``; e.g. ``division_of_labour(...).heads``): whom each head
            serves, written into the head table's ``serves`` and ``finding``.

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
            raise ParameterError(
                f"division is invalid: a 'run' column naming the runs when the result holds "
                f"{len(runs)} runs, got no 'run' column"
            )
        frame.insert(0, "run", runs[0])
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
    carried = [*DIVISION_COLUMNS, *(c for c in VERDICT_DIVISION_COLUMNS if c in frame.columns)]
    rows = frame[carried].to_dict("records")
    verdicts = []
    for v in result.verdict.runs:
        mine = [{k: r[k] for k in carried[1:]} for r in rows if r["run"] == v.run]
        verdicts.append(dataclasses.replace(v, division=mine))
    verdict = Verdict(verdicts, result.verdict.consistency)
    head_table = result.heads if heads is None else _with_serves(result.heads, heads, runs)
    table = result.runs.copy()
    by_run = {v.run: v for v in verdicts}
    table["specialized_along"] = [",".join(by_run[r].specialized_axes) for r in table["run"]]
    table["verdict"] = [by_run[r].text for r in table["run"]]
    return dataclasses.replace(
        result, division=frame, verdict=verdict, runs=table, heads=head_table
    )


def _with_serves(
    heads: pd.DataFrame, division_heads: pd.DataFrame, runs: list[str]
) -> pd.DataFrame:
    """``heads`` with ``serves`` ("position: 0,1; token: 3", "" for no subset) and its
    ``finding`` from the division test's per-head rows."""
    rows = division_heads.copy()
    if "run" not in rows.columns:
        rows.insert(0, "run", runs[0])
    chosen = rows[rows["specialized"].astype(str) == "True"]
    serves: dict[tuple[str, str], list[str]] = {}
    for run, head, by, values in zip(
        chosen["run"], chosen["head_label"], chosen["by"], chosen["serves"], strict=True
    ):
        if isinstance(values, str) and values:
            serves.setdefault((run, head), []).append(f"{by}: {values}")
    out = heads.copy()
    measured = set(rows["run"])
    out["serves"] = [
        "; ".join(serves.get((run, head), [])) if run in measured else None
        for run, head in zip(out["run"], out["head_label"], strict=True)
    ]
    out["finding"] = findings(out)
    return out


def _single_result(
    tables: dict[str, Any], settings: SpecializationSettings
) -> SpecializationResult:
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
