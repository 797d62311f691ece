"""Reports: ``report.md`` and a self-contained ``report.html`` for a run, a sweep, or a folder
of sweeps, with every finding and caveat generated from the numbers.

:func:`write_report` recognises three kinds of folder:

- a **run** folder (``config.json``, ``model.safetensors``, ``eval.json``; see
  :mod:`mhainterp.training`): the run's settings and accuracy, the specialization test (labels,
  verdict, role-score heatmap, head x target damage), and every figure ``mhainterp analyze``
  left in ``analysis/``;
- a **sweep** folder (``sweep.json`` + ``results.csv``; see :mod:`mhainterp.sweep`): the seed
  table of the head-count experiment (:func:`mhainterp.sweep.summarize`), its figures
  (``head_count_accuracy.png``, ``training_curves.png``), specialization,
  redundancy and accuracy against head count
  (:func:`~mhainterp.specialization.sweep_specialization`), cross-seed consistency, and the
  ``analysis/`` figures of any run that has them;
- a **folder of sweeps** (sub-folders with ``sweep.json``, like ``runs/quickstart/``): one
  section per sweep after a summary of all of them.

The report reads saved results only: it runs no model and no test. The specialization results
come from :func:`~mhainterp.specialization.specialize_folder` (``mhainterp specialize``; the
``mhainterp report`` command and the demo run it first), under each run's ``analysis/`` and, for
a sweep, in the sweep folder. Where they are missing (or were made with other settings than the
``settings`` asked for), the report says so in their place and names the command that writes
them. It draws no figure either: the figures are drawn beside their tables by
:func:`mhainterp.figures.saved.save_folder_figures` (``mhainterp specialize``, ``mhainterp
report`` and the demo call it after computing); a figure that is not there is named, with the
command that draws it. The Markdown refers to the figures by
relative path; the HTML embeds them as base64 PNG and has no external ``src`` or ``href``, so it
can be mailed as one file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from mhainterp.figures.division import SWEEP_FIGURE
from mhainterp.figures.saved import (
    FIGURE_COMMAND,
    OWN_FIGURES,
    division_figures,
    head_count_figures,
    run_specialization_figures,
    saved_divisions,
    sweep_specialization_figures,
)
from mhainterp.io import read_json, write_text
from mhainterp.render import (
    Block,
    Bullets,
    Heading,
    Image,
    Paragraph,
    Table,
    render_html,
    render_markdown,
)
from mhainterp.runs import (
    folder_kind,
    read_results,
    sweep_folders,
)
from mhainterp.specialization import (
    SpecializationResult,
    SpecializationSettings,
    Verdict,
    saved_specialization,
)
from mhainterp.specialization.folders import SweepSpecialization
from mhainterp.specialization.headline import headline_stability_blocks
from mhainterp.specialization.nulls import HEADS_SHUFFLED_NULL, ROLE_NULLS, SAME_FUNCTION_NULL
from mhainterp.specialization.seeds.summary import BLOCK_MARK, display_summary
from mhainterp.specialization.verdict.division_words import BASIS_NAMES
from mhainterp.specialization.whom.selectivity import SELECTIVITY_MEANING
from mhainterp.sweep.compare import POWER_NOTE_MARK, comparison_display
from mhainterp.sweep.summary import ACCURACY_BLOCK_MARK, TRAIN_LOSS_HEADER

__all__ = ["write_report"]

SWEEP_ANALYSIS_FIGURES = (
    "average_patterns",
    "similarity_js",
    "ablation_importance",
    "ablation_pairwise",
)
"""The ``analyze`` figures a sweep report embeds per analysed run (a run report embeds all);
the others are listed by name."""
RUN_HEADING = "Do the heads specialize?"
MAX_RUN_LINES = 12
"""Runs listed one line each in a section; beyond, the first ones and where the rest are (a
sweep of 100 seeds per head count would list 300)."""
SWEEP_HEADING = "Do the heads specialize, and how does that change with h?"


# ----------------------------------------------------------------------------- sections


DOES_H_MATTER_CAPTION = (
    "Does h matter? Per task, the accuracy (left) and the division index per axis (right) "
    "against h at equal parameter count: seed mean with its 95% t interval "
    "(does_h_matter.csv)."
)


def _figures(figures: list[tuple[Path, str]], folder: Path) -> list[Block]:
    """The figures that exist, embedded with their captions, and a note naming the missing
    ones and the command that draws them."""
    blocks: list[Block] = [Image(path, caption) for path, caption in figures if path.is_file()]
    missing = [path.name for path, _ in figures if not path.is_file()]
    if missing:
        blocks.append(
            Paragraph(
                f"Figures not drawn yet: {', '.join(missing)}. Draw them with "
                f"`{FIGURE_COMMAND} {folder}` (`mhainterp report` does this before writing), "
                "then write the report again."
            )
        )
    return blocks


def _caveats(verdict_caveats: list[str]) -> list[Block]:
    return [Heading("Caveats", 2), Bullets(verdict_caveats)]


def _analysis_blocks(run_dir: Path, level: int, only: tuple[str, ...] | None = None) -> list[Block]:
    """The figures ``mhainterp analyze`` wrote in ``run_dir/analysis`` (not the report's own):
    all of them, or those named in ``only`` with the rest listed by name."""
    folder = run_dir / "analysis"
    pngs = sorted(p for p in folder.glob("*.png") if p.stem not in OWN_FIGURES)
    if not pngs:
        return []
    shown = [p for p in pngs if only is None or p.stem in only]
    blocks: list[Block] = [Heading(f"Inside {run_dir.name} (mhainterp analyze)", level)]
    blocks += [Image(p, f"{run_dir.name}: {p.stem.replace('_', ' ')}") for p in shown]
    rest = [p.name for p in pngs if p not in shown]
    if rest:
        blocks.append(Paragraph(f"Also in {run_dir.name}/analysis/: {', '.join(rest)}."))
    return blocks


def _head_table(result: SpecializationResult) -> pd.DataFrame:
    columns = {
        "head_label": "head",
        "finding": "what it does (where it looks; whom it serves; needed)",
        "label": "attention label",
        "holds": "holds",
        "needed": "needed",
        "backed_up": "backed up",
        "dead": "dead",
        "top_role": "best role",
        "top_score": "score",
        "top_effect": "effect",
        "top_p_adj": "p (corrected)",
        "explained": "explained",
        "unexplained": "unexplained",
        "output_ratio": "write / resid",
        "total_damage": "acc drop if removed",
        "causal_target": "hurts most",
        "causal_selectivity": "selectivity",
        "redundant_with": "backed up by",
    }
    return result.heads[list(columns)].rename(columns=columns)


_HEAD_CAPTION = (
    "Per head: what it does on every axis, then the evidence. holds = the relation it holds "
    "(count:… = spread evenly over the set, +sink = with the first position as a sink), needed "
    "= removing it alone costs accuracy, backed up = removing it alone costs nothing because "
    "others carry its work, dead = writes almost nothing and removing it costs nothing; "
    "explained = share of its attention on the union of the known relations."
)


def _stability_table(result: SpecializationResult) -> pd.DataFrame | None:
    """Share of the head labels that change with each threshold x 0.8 / x 1.25."""
    from mhainterp.specialization.verdict.stability import stability_summary

    table = getattr(result, "stability", None)
    if table is None or not len(table):
        return None
    summary = stability_summary(table)
    return summary.rename(columns={"threshold": "threshold moved", "n_heads": "heads"})


_STABILITY_CAPTION = (
    "Labels re-decided from the saved evidence with each threshold x 0.8 and x 1.25, and the "
    "division's per-head flags (whom a head serves) with its effect gate min_selectivity_gain "
    "moved alike: the share of heads whose label or flags change (any = by at least one of "
    "the moves)."
)


_GROUP_CAPTION = (
    "Groups of three or more heads (alike, or holding one role) removed as a whole: loss "
    "increase with all removed, and with all but one removed (mean over which one is kept). "
    "backup = 1 − kept-one / all; backed up when at least the backup ratio."
)


def _group_table(result: SpecializationResult) -> pd.DataFrame:
    columns = {
        "basis": "grouped by",
        "heads": "heads",
        "damage_all": "loss ↑, all removed",
        "damage_keep_one_mean": "loss ↑, one kept",
        "backup": "backup",
        "redundant": "backed up",
    }
    return result.redundancy_groups[list(columns)].rename(columns=columns)


def _specialization_blocks(result: SpecializationResult, run_dir: Path, level: int) -> list[Block]:
    paths = run_specialization_figures(result, run_dir / "analysis")
    blocks: list[Block] = [
        Heading(RUN_HEADING, level),
        Paragraph(
            f"Role scores on {result.settings.n_eval} held-out sequences; a role needs "
            f"corrected p < {result.settings.alpha:g} against its nulls ({ROLE_NULLS}) and "
            f"effect ≥ {result.settings.min_effect:g}."
        ),
        Bullets(result.verdict.lines),
        Table(_head_table(result), _HEAD_CAPTION),
    ]
    stability = _stability_table(result)
    if stability is not None:
        blocks.append(Table(stability, _STABILITY_CAPTION))
    blocks += headline_stability_blocks(run_dir / "analysis")
    if len(result.redundancy_groups):
        blocks.append(Table(_group_table(result), _GROUP_CAPTION))
    captions = {
        "role_scores": "Share of each head's attention on each relation template (** = role: "
        "beats both nulls after correction with effect ≥ min_effect; * = significant but "
        "below min_effect, not a role).",
        "causal_matrix": "Accuracy lost on each target when one head is removed.",
        "consistency": "Cross-seed consistency of role profiles vs its nulls.",
    }
    return blocks + _figures([(p, captions[p.stem]) for p in paths], run_dir)


def _missing(
    heading: str, folder: Path, what: str, settings: SpecializationSettings | None, level: int
) -> list[Block]:
    """The section that stands where a saved result is missing: its heading and a note."""
    which = " made with the settings asked for" if settings is not None else ""
    note = (
        f"Not in this report: {folder} has no saved {what}{which}. Compute them with "
        f"`mhainterp specialize {folder}` (`mhainterp report` does this before writing), then "
        "write the report again."
    )
    return [Heading(heading, level), Paragraph(note)]


def _run_blocks(
    run_dir: Path, settings: SpecializationSettings | None, level: int
) -> tuple[list[Block], Verdict]:
    config = read_json(run_dir / "config.json")
    saved = read_json(run_dir / "eval.json")
    model, train = config["model"], config["train"]
    task = config["task"]
    accuracy = ", ".join(
        f"{k} {v:.3f}" for k, v in saved.items() if k.startswith("accuracy") and v == v
    )
    shape = f"h={model['n_heads']} heads of d_head={model['d_head']} in d_model={model['d_model']}"
    blocks: list[Block] = [
        Paragraph(
            f"Task {task['name']} ({_params(task['params'])}); {shape}, {model['n_layers']} "
            f"layer(s), seed {model['seed']}; {train['steps']} steps at lr {train['lr']}. "
            f"Evaluation: loss {saved['loss']:.4f}; {accuracy}."
        )
    ]
    result = saved_specialization(run_dir, settings)
    if result is None:
        blocks += _missing(RUN_HEADING, run_dir, "specialization results", settings, level)
    else:
        blocks += _specialization_blocks(result, run_dir, level)
    blocks += _division_blocks([run_dir], None, level)
    blocks += _analysis_blocks(run_dir, level)
    return blocks, result.verdict if result is not None else Verdict([])


def _division_blocks(run_dirs: list[Path], sweep_dir: Path | None, level: int) -> list[Block]:
    """Whom the heads serve: the saved division of labour (``analysis/division_*`` per run,
    ``division_sweep.csv`` per sweep) as the index vs h and the heatmaps
    :func:`~mhainterp.figures.saved.division_figures` draws; nothing when none is saved."""
    saved = saved_divisions(run_dirs)
    if not saved:
        return []
    blocks: list[Block] = [
        Heading("Whom do the heads serve? (division of labour)", level),
        Paragraph(
            "Removing one head costs accuracy on some query tokens, positions or target classes "
            f"more than on others. {SELECTIVITY_MEANING}. The division "
            "index (1 - mean pairwise cosine of the heads' damage profiles) is 0 when every "
            "head damages the same values and 1 when their values are disjoint. Both are "
            f"tested against {SAME_FUNCTION_NULL}: an axis is divided when the index's 95% "
            "interval lies above that null's upper 95% quantile, the number each line shows "
            "after 'vs null'. A value that removing any head hurts (a fragile class) makes "
            "every head look selective; the index does not count it."
        ),
        Bullets(_run_lines([f"{d.name}: {r.summary_line()}" for d, r in saved], sweep_dir)),
    ]
    captions = []
    for path in division_figures(saved, sweep_dir):
        if path.name == SWEEP_FIGURE:
            captions.append(
                (
                    path,
                    "Division index vs h: each seed a point (a box per head count beyond "
                    "20 seeds), the seed mean a line; grey band: the null's mean to its upper "
                    f"95% quantile (the null: {SAME_FUNCTION_NULL}).",
                )
            )
        else:
            result = dict(saved).get(path.parent.parent)
            captions.append((path, _profile_caption(path.parent.parent.name, result)))
    return blocks + _figures(captions, sweep_dir if sweep_dir is not None else run_dirs[0])


def _profile_caption(run_name: str, result: Any) -> str:
    """The heatmap's caption: each axis's call and the profiles it rests on, which the
    figure draws (the single-head heatmap of a call on kept-head profiles showed nothing).

    Example:
        >>> from types import SimpleNamespace
        >>> index = pd.DataFrame({"by": ["token", "position"], "call": ["not divided",
        ...     "divided"], "basis": ["kept", "kept"]})
        >>> _profile_caption("h8_seed0", SimpleNamespace(index=index)).split(" (")[1][:46]
        'by token: not divided, kept-head profiles; by '
    """
    calls = []
    index = getattr(result, "index", None)
    if index is not None and {"by", "call", "basis"} <= set(index.columns):
        for by, call, basis in zip(index["by"], index["call"], index["basis"], strict=True):
            named = BASIS_NAMES.get(basis, "no basis: single-head shown")
            calls.append(f"by {by}: {call}, {named}")
    listed = f" ({'; '.join(calls)})" if calls else ""
    return (
        f"{run_name}: each axis drawn on the profiles its call rests on{listed}. "
        f"{PROFILE_KEY} * = the head serves the value: significantly more selective than its "
        "layer's whole job, by an effect ≥ min_selectivity_gain, on this profile."
    )


PROFILE_KEY = (
    "Single-head profiles: accuracy lost on each value when the head is removed alone; "
    "kept-head profiles: accuracy the head adds kept alone in its layer (the rest of the "
    "layer removed); group profiles: accuracy lost when a backed-up group is removed."
)
"""What each basis' heatmap shows, said once per caption."""


def _run_lines(lines: list[str], sweep_dir: Path | None) -> list[str]:
    """``lines``, one per run, cut to :data:`MAX_RUN_LINES` with a last line saying where the
    others are.

    Example:
        >>> lines = _run_lines([f"h4_seed{s}: ..." for s in range(100)], Path("sweep"))
        >>> len(lines), lines[-1][:39]
        (13, "... and 88 more runs: every run's index")
    """
    if len(lines) <= MAX_RUN_LINES:
        return lines
    where = "division_sweep.csv" if sweep_dir is not None else "each run's analysis/ folder"
    rest = len(lines) - MAX_RUN_LINES
    return [
        *lines[:MAX_RUN_LINES],
        f"... and {rest} more runs: every run's index is in {where}; the seed table gives "
        "them per head count.",
    ]


def _seeds_text(seeds: list[int]) -> str:
    """``0-99`` for a run of consecutive seeds, ``0, 1, 5`` otherwise (cut after 10 values).

    Example:
        >>> _seeds_text(list(range(100))), _seeds_text([0, 1, 5])
        ('0-99 (100 seeds)', '0, 1, 5')
    """
    ordered = sorted(seeds)
    if len(ordered) > 3 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]} ({len(ordered)} seeds)"
    if len(ordered) > 10:
        return f"{', '.join(map(str, ordered[:10]))}, ... ({len(ordered)} seeds)"
    return ", ".join(map(str, ordered))


def _params(params: dict[str, Any]) -> str:
    """``"seq_len=16, d_vocab=10"`` (or ``"defaults"`` when empty)."""
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"


def _params_sentence(results: pd.DataFrame) -> str:
    """Whether the head counts share one parameter count, from the results table."""
    counts = sorted(set(int(n) for n in results["n_params"]))
    if len(counts) == 1:
        return f"Only the head count changes; every run has {counts[0]:,} parameters."
    return f"Parameter counts differ between runs: {', '.join(f'{n:,}' for n in counts)}."


def _summary_display(table: pd.DataFrame) -> pd.DataFrame:
    out = table.drop(columns=["task"]).rename(
        columns={
            "final_train_loss_mean": TRAIN_LOSS_HEADER,
            "val_accuracy_mean": "val acc (seed mean)",
            "val_accuracy_std": "std",
        }
    )
    return out


def _saved_sweep(
    sweep_dir: Path, settings: SpecializationSettings | None
) -> SweepSpecialization | None:
    """The sweep's saved specialization results (None if missing or made otherwise)."""
    try:
        spec = SweepSpecialization.load(sweep_dir)
    except FileNotFoundError:
        return None
    if settings is not None and spec.result.settings != settings:
        return None
    return spec


@dataclass
class _SweepFindings:
    """What a sweep adds to the report's Findings: sentences, and the table of every
    comparison behind them (one per task)."""

    lines: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)


def _sweep_blocks(
    sweep_dir: Path, settings: SpecializationSettings | None, level: int
) -> tuple[list[Block], Verdict, _SweepFindings]:
    """A sweep's section, its verdict, and its findings."""
    from mhainterp.sweep import SweepSummary

    config = read_json(sweep_dir / "sweep.json")
    results = read_results(sweep_dir)
    try:
        summary = SweepSummary.load(sweep_dir)
    except FileNotFoundError:
        summary = None
    spec = _saved_sweep(sweep_dir, settings)
    train = config["train"]
    blocks: list[Block] = [
        Paragraph(
            f"Task {config['task']} ({_params(config['task_params'])}); "
            f"model {_params(config['model'])}; "
            f"h ∈ {{{', '.join(map(str, config['n_heads']))}}} × seeds "
            f"{{{_seeds_text(list(config['seeds']))}}}; {train['steps']} steps at lr "
            f"{train['lr']}. {_params_sentence(results)}"
        ),
    ]
    if summary is None:
        blocks += _missing("Head count vs accuracy", sweep_dir, "seed table", None, level)
    else:
        blocks += _seed_table_blocks(summary, level, in_findings=spec is not None)
    blocks += _figures(_head_count_captions(results, sweep_dir), sweep_dir)
    if spec is None:
        what = "sweep-level specialization results"
        blocks += _missing(SWEEP_HEADING, sweep_dir, what, settings, level)
    else:
        blocks += _sweep_specialization_blocks(spec, sweep_dir, level)
    blocks += _division_blocks([Path(r) for r in results["run_dir"]], sweep_dir, level)
    for row in results.itertuples(index=False):
        blocks += _analysis_blocks(Path(row.run_dir), level, SWEEP_ANALYSIS_FIGURES)
    if spec is None:
        notes = [] if summary is None else summary.notes
        accuracy = [n for n in notes if ACCURACY_BLOCK_MARK in n or _is_power_note(n)]
        return blocks, Verdict([]), _SweepFindings(accuracy)
    return blocks, spec.result.verdict, _findings(spec, sweep_dir.name)


def _seed_table_blocks(summary: Any, level: int, in_findings: bool) -> list[Block]:
    """The saved seed table and its notes, and the accuracy comparisons unless the Findings
    hold them (then in one Holm family with the other measures: one Holm p per comparison)."""
    blocks: list[Block] = [
        Heading("Head count vs accuracy", level),
        Table(_summary_display(summary.table), "Seed table (mean and sample std over seeds)."),
    ]
    notes = _without_power_note(summary.notes)
    if in_findings:
        notes = [n for n in notes if ACCURACY_BLOCK_MARK not in n]
        notes.append(
            "The accuracy of adjacent head counts is compared in the Findings, in one Holm "
            "family with the other measures of the task."
        )
    elif len(summary.comparisons):
        for task, rows in summary.comparisons.groupby("task", sort=False):
            m = int(rows["n_holm"].max())
            caption = (
                f"{task}: accuracy of adjacent head counts. {COMPARISON_RULE} Holm over the "
                f"{m} tested comparisons of this table at {summary.alpha:g}."
            )
            blocks.append(Table(comparison_display(rows), caption))
    return [*blocks, Bullets(notes)]


COMPARISON_RULE = (
    "Difference of seed means (b - a) with its 95% interval (Welch t below 10 seeds per head "
    "count, it assumes a normal seed spread; percentile bootstrap over seeds from 10); the "
    "exact permutation test below 10 seeds per head count, whose floor is the smallest p its "
    "n allows, Welch's test from 10."
)
"""How every head-count comparison is made, said once per table."""


def _is_power_note(note: str) -> bool:
    """Whether ``note`` is :func:`mhainterp.sweep.compare.seed_power_note`'s sentence."""
    return POWER_NOTE_MARK in note


def _without_power_note(notes: list[str]) -> list[str]:
    """``notes`` less what n seeds can show: Findings says it once (it was said three times,
    and once more per task in a report of several sweeps)."""
    return [n for n in notes if not _is_power_note(n)]


def _findings(spec: SweepSpecialization, sweep_name: str) -> _SweepFindings:
    """Per task: its one-line answer (:func:`~mhainterp.specialization.seeds.summary.answers`:
    does h matter, by how much, with the number that carries it and its test), and the table
    of every comparison behind it, whose numbers the line quotes. The longer evidence (per
    head count verdicts, what n would settle the rest, what n seeds can show) follows in the
    sweep's section."""
    # a sweep not named after its task (two sweeps of one task in a study) is named in its
    # line, as in its table's caption: two "- reverse: ..." lines could not be told apart
    out = [
        line if task == sweep_name else f"{task} ({sweep_name}){line[len(task) :]}"
        for task, line in spec.answers.items()
    ]
    tables = []
    for task, rows in spec.comparisons.groupby("task", sort=False):
        families = ", ".join(
            f"{family} over {int(part['n_holm'].max())}"
            for family, part in rows.groupby("family", sort=False)
        )
        where = task if task == sweep_name else f"{task} ({sweep_name})"
        caption = (
            f"{where}: every comparison behind the answer, {BLOCK_MARK} on each "
            f"measure where it is defined at both. {COMPARISON_RULE} Holm within each "
            f"question's family at {spec.result.settings.alpha:g} ({families})."
        )
        tables.append(Table(comparison_display(rows), caption))
    return _SweepFindings(out, tables)


def _head_count_captions(results: pd.DataFrame, sweep_dir: Path) -> list[tuple[Path, str]]:
    """The sweep's accuracy and training-curve figures with their captions."""
    accuracy, curves = head_count_figures(results, sweep_dir)
    return [
        (
            accuracy,
            "Validation accuracy per head count (points = seeds, with a quartile box from 20 "
            "seeds; bars = mean ± std).",
        ),
        (curves, "Training loss, one line per run."),
    ]


def _sweep_stability_blocks(result: SpecializationResult) -> list[Block]:
    """Per head count: the share of head labels each threshold x 0.8 / x 1.25 changes."""
    from mhainterp.specialization.verdict.stability import stability_summary

    table = getattr(result, "stability", None)
    if table is None or not len(table) or "run" not in result.heads.columns:
        return []
    h_of = dict(zip(result.heads["run"], result.heads["n_heads"], strict=False))
    rows = []
    for h, part in table.groupby(table["run"].map(h_of), sort=True):
        summary = stability_summary(part)
        rows.append({"h": int(h), **dict(zip(summary["threshold"], summary["share_any"]))})
    frame = pd.DataFrame(rows).fillna(0.0)
    return [Table(frame.round(3), _STABILITY_CAPTION.replace("(any", "per head count (any"))]


_SWEEP_CAPTIONS = {
    "specialization_vs_heads": "Relations covered and heads per relation (counts), backed-up and "
    "dead shares of heads, and accuracy vs h (points = seeds).",
    "consistency": "Cross-seed consistency of role profiles vs random matching and the null the "
    f"p is computed against: {HEADS_SHUFFLED_NULL}.",
    "role_scores": "Role scores of each head count's seed whose heads hold the most relations.",
    "causal_matrix": "Head x target damage of each head count's seed holding the most relations.",
}


def _sweep_specialization_blocks(
    spec: SweepSpecialization, sweep_dir: Path, level: int
) -> list[Block]:
    result = spec.result
    tables = display_summary(spec.summary, result.settings.alpha)
    notes = [n for n in spec.notes if BLOCK_MARK not in n]  # the Findings' table holds those
    blocks: list[Block] = [
        Heading(SWEEP_HEADING, level),
        *[Table(table, f"{caption}.") for caption, table in tables],
        Bullets(notes),
        Paragraph(
            "Verdicts per head count (the profiles they rest on are drawn, each axis on its "
            "call's basis, under 'Whom do the heads serve?'):"
            if len(result.division)
            else "Verdicts per head count:"
        ),
        Bullets(result.verdict.lines),
    ]
    blocks += _sweep_stability_blocks(result)
    paths = sweep_specialization_figures(spec, sweep_dir)
    return blocks + _figures([(p, _SWEEP_CAPTIONS[p.stem]) for p in paths], sweep_dir)


# ----------------------------------------------------------------------------- public API


def write_report(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    settings: SpecializationSettings | None = None,
    **overrides: Any,
) -> tuple[Path, Path]:
    """Write ``report.md`` and a self-contained ``report.html`` for a run, sweep or sweeps,
    from saved results only (compute the specialization results first with
    :func:`~mhainterp.specialization.specialize_folder`).

    Args:
        path: A run folder, a sweep folder, or a folder of sweep folders.
        out: Where to write the two files (default: ``path``).
        settings: Show only specialization results saved with these settings
            (``**overrides`` replace fields, e.g. ``n_eval=128``); results saved with
            other settings count as missing. None (and no overrides): whatever is saved.
        **overrides: :class:`~mhainterp.specialization.SpecializationSettings` fields.

    Returns:
        ``(report.md path, report.html path)``.

    Raises:
        FileNotFoundError: If ``path`` is not one of the three kinds of folder.

    Example:
        >>> from mhainterp.figures.saved import save_folder_figures
        >>> from mhainterp.specialization import specialize_folder
        >>> specialize_folder("runs/quickstart")  # doctest: +SKIP
        >>> save_folder_figures("runs/quickstart")  # doctest: +SKIP
        >>> md, html_path = write_report("runs/quickstart")  # doctest: +SKIP
    """
    path = Path(path)
    kind = folder_kind(path)
    if overrides:
        base = settings or SpecializationSettings()
        settings = SpecializationSettings.from_dict({**base.to_dict(), **overrides})
    out_dir = Path(out) if out is not None else path
    title = f"mhainterp report: {path.resolve().name}"
    blocks: list[Block] = [Heading(title, 1)]
    if kind == "run":
        body, verdict = _run_blocks(path, settings, level=2)
        blocks += body
    elif kind == "sweep":
        body, verdict, findings = _sweep_blocks(path, settings, level=2)
        blocks += [Heading("Findings", 2), Bullets(findings.lines), *findings.tables, *body]
    else:
        sections, runs, lines, tables = [], [], [], []
        for sweep in sweep_folders(path):
            body, sweep_verdict, sweep_findings = _sweep_blocks(sweep, settings, 3)
            sections += [Heading(f"Sweep {sweep.name}", 2), *body]
            # a sentence two sweeps share (what n seeds can show) is said once
            lines += [f for f in sweep_findings.lines if f not in lines]
            tables += sweep_findings.tables
            runs += sweep_verdict.runs
        verdict = Verdict(runs)
        study_figure = path / "does_h_matter.png"  # written by mhainterp.analyze.study
        figure = _figures([(study_figure, DOES_H_MATTER_CAPTION)], out_dir)
        blocks += [Heading("Findings", 2), Bullets(lines)]
        blocks += [*(figure if study_figure.is_file() else []), *tables, *sections]
    blocks += _caveats(verdict.caveats)
    md_path = write_text(out_dir / "report.md", render_markdown(blocks, out_dir))
    html_path = write_text(out_dir / "report.html", render_html(blocks, title))
    return md_path, html_path
