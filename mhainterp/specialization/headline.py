"""Stability of the headline: does the verdict SENTENCE survive moving every gate?

:mod:`.verdict.stability` re-decides the labels with each label threshold x 0.8 / x 1.25 from saved
evidence. The headline (does the model divide the work, along what) rests on more: the damage
gates, ``alpha``, ``n_eval``, the ablation method, and the division test's own gates
(``min_gain``, ``min_loss_increase``, ``serve_share``, or, once the division test has a settings
object with ``perturbations()``, every gate it names). :func:`headline_stability` re-runs the
specialization test and the division of labour under each such perturbation and reports, per
perturbation, whether the run's headline sentence changes and the share of head labels that
flip; :func:`headline_summary` pools them: the share of verdict sentences that change beside
the share of labels.

This re-runs the whole analysis once per perturbation (40 for the defaults: with the
unperturbed one, 41 x the cost of the specialization test and the division of labour,
:func:`n_analyses`), so it is opt-in and says how long it will take:
:func:`headline_stability_folder` (``mhainterp specialize --headline-stability``) saves it per
run as ``analysis/headline_stability.csv`` with the pooled shares in
``analysis/headline_stability.json``.

A pretrained model's verdict takes minutes to an hour, so
:func:`pretrained_headline_stability` re-decides it instead of re-running it: every gate the
labels read from the specialization test's saved evidence (no forward pass), every gate the
division reads from the division's own engine passes (``passes=``, running only the head sets
a moved gate adds). The moves that change what is measured (``n_eval``, the ablation method,
the noise of the same-function null) would each be a new verdict; they are listed as not run
(``.attrs["not_run"]``, and ``not_run`` in the JSON), never silently left out.

Example:
    >>> table = headline_stability(model, task, by="position")  # doctest: +SKIP
    >>> headline_summary(table)  # doctest: +SKIP
    {'n_perturbations': 30, 'share_sentences_changed': 0.1, 'share_labels_changed': 0.02}
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from mhainterp.ablation import METHODS
from mhainterp.errors import RunFolderError
from mhainterp.io import write_csv, write_json
from mhainterp.model import HookedMHATransformer
from mhainterp.render import Block, Paragraph, Table, estimate_line
from mhainterp.runs import find_runs, read_saved_meta, read_table
from mhainterp.runtime import uses_work_threads
from mhainterp.specialization.battery import specialization_test
from mhainterp.specialization.seeds.combine import attach_division
from mhainterp.specialization.settings import THRESHOLDS, DivisionSettings, SpecializationSettings
from mhainterp.specialization.verdict.division_words import headline_call
from mhainterp.specialization.verdict.labels import where_label
from mhainterp.specialization.verdict.result import SpecializationResult
from mhainterp.specialization.verdict.stability import FACTORS, relabel, run_evidence
from mhainterp.specialization.whom.division import division_of_labour
from mhainterp.specialization.whom.division_result import DivisionResult
from mhainterp.tasks import AXES, Task
from mhainterp.training import load_run

__all__ = [
    "HEADLINE_COLUMNS",
    "HEADLINE_FILE",
    "compare_headlines",
    "gate_perturbations",
    "headline_stability",
    "headline_stability_folder",
    "headline_summary",
    "n_analyses",
    "headline_stability_blocks",
    "pretrained_headline_stability",
    "save_headline_stability",
]

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
HEADLINE_FILE = "headline_stability.csv"
"""Where :func:`headline_stability_folder` saves a run's table (under ``analysis/``; the pooled
shares and the unperturbed headline go beside it, in ``headline_stability.json``)."""


@dataclasses.dataclass(frozen=True)
class Perturbation:
    """One moved gate: its name, the specialization settings and the division settings."""

    name: str
    settings: SpecializationSettings
    division: DivisionSettings


def gate_perturbations(
    settings: SpecializationSettings,
    division_settings: DivisionSettings | None = None,
    factors: Sequence[float] = FACTORS,
) -> list[Perturbation]:
    """Every gate moved by each factor, ``n_eval`` halved and doubled, and every other
    ablation method: the specialization test's (labels) and the division test's
    (:meth:`DivisionSettings.perturbations`: its gates, noise and primary method).

    Args:
        settings: The unperturbed specialization settings.
        division_settings: The unperturbed division settings (default
            ``settings.division``: the specialization settings' shared fields).
        factors: How far each label gate moves.

    Example:
        >>> names = [p.name for p in gate_perturbations(SpecializationSettings())]
        >>> names[:2], "alpha x0.8" in names, "division method=zero" in names
        (['min_effect x0.8', 'min_effect x1.25'], True, True)
    """
    division = division_settings or settings.division
    out = []
    for name in (*THRESHOLDS, "alpha"):
        for factor in factors:
            value = min(getattr(settings, name) * factor, 1.0) if name == "alpha" else None
            moved = (
                dataclasses.replace(settings, alpha=value)
                if name == "alpha"
                else settings.scaled(name, factor)
            )
            out.append(Perturbation(f"{name} x{factor:g}", moved, division))
    for factor in (0.5, 2.0):
        # at least 2: mean and resample ablation refuse one sequence (its own z)
        n_eval = max(2, round(settings.n_eval * factor))
        moved = dataclasses.replace(settings, n_eval=n_eval)
        out.append(Perturbation(f"n_eval x{factor:g}", moved, division.replace(n_eval=n_eval)))
    for method in METHODS:
        if method != settings.method:
            moved = dataclasses.replace(settings, method=method)
            out.append(Perturbation(f"method={method}", moved, division))
    for name, moved_division in division.perturbations():
        out.append(Perturbation(f"division {name}", settings, moved_division))
    return out


def _headline(result: SpecializationResult) -> str:
    """The headline clauses of every run of ``result``, joined (one run: one clause)."""
    return "; ".join(headline_call(run.calls, restated=run.restated) for run in result.verdict.runs)


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


@uses_work_threads
def headline_stability(
    model: HookedMHATransformer,
    data: Task,
    settings: SpecializationSettings | None = None,
    *,
    by: Sequence[str] | str = AXES,
    division_settings: DivisionSettings | None = None,
    factors: Sequence[float] = FACTORS,
    on_analysis: Callable[[], None] | None = None,
) -> pd.DataFrame:
    """Re-run the specialization test and the division of labour under every perturbation of
    :func:`gate_perturbations` and compare the headline with the unperturbed one.

    Args:
        model: The model.
        data: Its task (the evaluation set of each setting's ``n_eval`` is drawn from it).
        settings: The unperturbed settings.
        by: Axes of the division of labour; empty: labels only (no division headline).
        division_settings: The unperturbed division settings (see :func:`gate_perturbations`).
        factors: How far each gate moves.
        on_analysis: Called after each analysis (the unperturbed one, then one per
            perturbation: :func:`n_analyses` in all), e.g. to advance a progress bar.

    Returns:
        One row per perturbation, columns :data:`HEADLINE_COLUMNS`; ``.attrs["headline"]`` is
        the unperturbed headline.
    """
    settings = settings or SpecializationSettings()
    division_settings = division_settings or settings.division

    def run(s: SpecializationSettings, division: DivisionSettings) -> SpecializationResult:
        result = specialization_test(model, data, settings=s)
        if by:
            result = attach_division(result, division_of_labour(model, data, by, settings=division))
        if on_analysis is not None:
            on_analysis()
        return result

    base = run(settings, division_settings)
    perturbed = [
        (p.name, run(p.settings, p.division))
        for p in gate_perturbations(settings, division_settings, factors)
    ]
    table = compare_headlines(base, perturbed)
    table.attrs["headline"] = _headline(base)
    return table


MEASURED = ("n_eval", "method=", "division method=", "division noise")
"""Perturbations that change what is measured (the sequences, the ablation method, the null's
copies): :func:`pretrained_headline_stability` lists them as not run."""


def pretrained_headline_stability(
    model: Any,
    data: Task,
    result: SpecializationResult,
    division: DivisionResult,
    *,
    by: Sequence[str] | str = AXES,
    factors: Sequence[float] = FACTORS,
    progress: bool = False,
) -> pd.DataFrame:
    """:func:`headline_stability` of a verdict already computed (a pretrained model's), by
    re-deciding it under every perturbation that changes a gate, not what is measured.

    - A label gate (or ``alpha`` of the labels) moved: the labels re-decided from the saved
      evidence (:func:`~.verdict.stability.relabel`); the headline is the division's, so it
      stays.
    - A division gate moved: :func:`division_of_labour` again with ``passes=`` the
      division's own (only the head sets the moved gate adds are run), attached to the
      result.
    - ``n_eval``, the ablation method and the null's noise (:data:`MEASURED`): not run, named
      in ``.attrs["not_run"]``.

    Args:
        model: The model the verdict is of.
        data: Its task (a :class:`~mhainterp.tasks.text.TextTask`).
        result: The specialization test's result, the division attached.
        division: The division (its ``passes``: a division loaded from disk has none, so the
            first moved gate runs every pass once, the others reuse them).
        by: The division's axes.
        factors: How far each gate moves.
        progress: A bar over the re-decided divisions.

    Returns:
        Columns :data:`HEADLINE_COLUMNS`; ``.attrs``: ``headline`` (the unperturbed one) and
        ``not_run`` (the perturbations not run).
    """
    settings = result.settings
    division_settings = DivisionSettings.from_dict(division.settings)
    perturbations = gate_perturbations(settings, division_settings, factors)
    measured = [p for p in perturbations if p.name.startswith(MEASURED)]
    base_labels = dict(zip(result.heads["head_label"], result.heads["label"]))
    rows = []
    run = str(result.heads["run"].iloc[0]) if len(result.heads) else ""
    evidence = run_evidence(result, run)
    headline = _headline(result)
    for p in perturbations:
        if p in measured or p.division != division_settings:
            continue
        decisions, _, _ = relabel(evidence, p.settings)
        changed = sum(d.label != where_label(base_labels.get(h, "")) for h, d in decisions.items())
        rows.append(_row(p.name, headline, False, len(decisions), changed))
    passes = division.passes
    moved = [p for p in perturbations if p not in measured and p.division != division_settings]
    for p in tqdm(moved, desc="headline stability", disable=not progress, unit="gate"):
        again = division_of_labour(model, data, by, settings=p.division, passes=passes)
        passes = again.passes  # a division loaded from disk: the first run fills them
        variant = attach_division(result, again)
        rows.append(compare_headlines(result, [(p.name, variant)]).iloc[0].to_dict())
    table = pd.DataFrame(rows, columns=HEADLINE_COLUMNS)
    table.attrs["headline"] = headline
    table.attrs["not_run"] = [p.name for p in measured]
    return table


def _row(name: str, headline: str, changed: bool, n_labels: int, n_changed: int) -> dict:
    return {
        "perturbation": name,
        "headline": headline,
        "changed": changed,
        "n_labels": n_labels,
        "n_labels_changed": n_changed,
        "share_labels_changed": n_changed / n_labels if n_labels else float("nan"),
    }


def save_headline_stability(folder: str | os.PathLike[str], table: pd.DataFrame) -> list[Path]:
    """``folder/headline_stability.csv`` and ``.json`` (the unperturbed headline, the pooled
    shares of :func:`headline_summary` and, where some were not run, ``not_run``)."""
    folder = Path(folder)
    summary = {"headline": table.attrs["headline"], **headline_summary(table)}
    if table.attrs.get("not_run"):
        summary["not_run"] = list(table.attrs["not_run"])
    return [
        write_csv(folder / HEADLINE_FILE, table),
        write_json(folder / HEADLINE_FILE.replace(".csv", ".json"), summary),
    ]


def n_analyses(settings: SpecializationSettings | None = None) -> int:
    """How many analyses (specialization test + division of labour) one run's
    :func:`headline_stability` makes: the unperturbed one and one per perturbation.

    Example:
        >>> n_analyses(SpecializationSettings())
        41
    """
    return 1 + len(gate_perturbations(settings or SpecializationSettings()))


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


def headline_stability_folder(
    path: str | os.PathLike[str],
    settings: SpecializationSettings | None = None,
    *,
    by: Sequence[str] | str = AXES,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
) -> list[tuple[Path, pd.DataFrame]]:
    """:func:`headline_stability` of every finished run at ``path`` (a run, sweep or folder
    of sweeps), saved as ``analysis/headline_stability.csv`` and ``.json`` (the unperturbed
    ``headline`` and :func:`headline_summary`) per run.

    It is long work (:func:`n_analyses` analyses per run: 8 min 52 s for one h = 8 run on 2
    busy cores), so it says what is about to run before it starts, then, once the first
    analysis is done, how long it took and the whole extrapolated from it; a bar counts the
    analyses.

    Args:
        path: A run, sweep or folder of sweeps.
        settings: The unperturbed settings.
        by: Axes of the division of labour.
        progress: Show the bar and, without ``echo``, write the two lines beside it.
        echo: Where the two lines go (the CLI passes ``print``; default: beside the bar when
            ``progress``, else nowhere).

    Returns:
        ``(run folder, table)`` per run.

    Example:
        >>> for run_dir, table in headline_stability_folder("runs/x"):  # doctest: +SKIP
        ...     print(run_dir.name, headline_summary(table))
    """
    say = echo or (tqdm.write if progress else _silent)
    runs = find_runs(path)
    per_run = n_analyses(settings)
    total = per_run * len(runs)
    say(
        f"headline stability: {len(runs)} run(s) x {per_run} analyses (the specialization "
        "test and the division of labour, once unperturbed and once per moved gate or "
        "method); the first analysis is timed to estimate the rest"
    )
    bar = tqdm(total=total, desc="headline stability", unit="analysis", disable=not progress)
    done = []  # a disabled bar counts nothing
    start = time.perf_counter()

    def analysed() -> None:
        bar.update()
        done.append(1)
        if len(done) == 1:
            say(estimate_line("headline stability", "analysis", total, time.perf_counter() - start))

    out = []
    with bar:
        for run_dir in runs:
            run = load_run(run_dir)
            table = headline_stability(run.model, run.task, settings, by=by, on_analysis=analysed)
            save_headline_stability(Path(run_dir) / "analysis", table)
            out.append((Path(run_dir), table))
    return out


def headline_stability_blocks(analysis_dir: Path) -> list[Block]:
    """The saved headline stability (``mhainterp specialize --headline-stability``), if any,
    for a report: the share of perturbations that change the verdict sentence, beside the
    share of labels, the perturbations not run (a pretrained model's), and the perturbations
    that change it."""
    table_path = analysis_dir / HEADLINE_FILE
    summary_path = table_path.with_suffix(".json")
    if not summary_path.is_file() or not table_path.is_file():
        return []
    keys = ("headline", "n_perturbations", "share_sentences_changed", "share_labels_changed")
    summary = read_saved_meta(summary_path, keys)
    n = summary["n_perturbations"]
    table = read_table(table_path)
    missing = [c for c in ("perturbation", "headline", "changed") if c not in table.columns]
    if missing:
        raise RunFolderError(
            f"{table_path} lacks the column(s) {', '.join(missing)}; delete it and run "
            "mhainterp specialize --headline-stability again"
        )
    changed = table[table["changed"].astype(bool)]
    not_run = list(summary.get("not_run", []))
    moved = (
        "each gate moved x 0.8 and x 1.25 (re-decided from the verdict's own evidence and "
        f"passes; not run: {', '.join(not_run)}, each a new verdict)"
        if not_run
        else "each gate moved x 0.8 and x 1.25, n_eval halved and doubled, and each other "
        "ablation method"
    )
    text = (
        f"Headline stability: with {moved} ({n} perturbations), the verdict sentence changes "
        f"in {len(changed)} of {n} ({summary['share_sentences_changed']:.0%}); "
        f"{summary['share_labels_changed']:.0%} of head labels change."
    )
    blocks: list[Block] = [Paragraph(text)]
    if len(changed):
        shown = changed[["perturbation", "headline"]].rename(
            columns={"headline": "headline under it"}
        )
        blocks.append(Table(shown, f"Unperturbed: {summary['headline']}"))
    return blocks


def _silent(text: str) -> None:
    """Say nothing (quiet: tests, ``--quiet``)."""
