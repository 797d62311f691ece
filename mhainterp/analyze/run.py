"""Look inside a trained run: every capture, similarity and ablation table, with its figure.

``analyze_run(run_dir)`` writes under ``run_dir/analysis/`` (each PNG beside its CSV and a vector
PDF of the same figure)::

    head_statistics.csv            entropy, confidence, offsets, self/first mass, template mass
    average_patterns.png/.csv      dataset-average pattern per head next to the task's templates
    example_patterns.png/.csv      one sequence's patterns, tokens on the axes
    similarity_{method}.png/.csv   clustered head x head similarity, one per method
    head_map.png/.csv              2-D MDS map of the heads (from the JS similarity)
    ablation_*.png/.csv            importance, pairwise (backup), pruning, gradient vs ablation
    gradient_importance.csv  importance_agreement.csv

``analyze_pretrained(model, text, out)`` (:mod:`mhainterp.analyze.pretrained`) is the branch for
a pretrained model on real text: role scores against a random-weight null, Clark et al.
categories, attribution vs exact ablation, zero vs mean.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from tqdm.auto import tqdm

from mhainterp.analyze.tables import ablation_tables
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.io import allocation_failures, remove_stale_temps, require_memory, write_csv
from mhainterp.provenance import record_analysis_source, set_aside_stale_analysis
from mhainterp.runs import find_runs, is_finished_run
from mhainterp.runtime import model_device, uses_work_threads
from mhainterp.training import Run, load_run
from mhainterp.validation import check_option

if TYPE_CHECKING:
    from mhainterp.figures.background import FigureQueue
    from mhainterp.protocol import HookedModel
    from mhainterp.tasks import Task

__all__ = ["analyze_run", "analyze_path", "analysis_memory"]

DEFAULT_METHODS = ("js", "pattern_corr", "cka", "ov", "qk", "separation")


@uses_work_threads
def analyze_run(
    run: Run | str | os.PathLike[str],
    *,
    reference: Run | str | os.PathLike[str] | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    n_eval: int = DEFAULT_N_EVAL,
    ablation: bool = True,
    progress: bool = False,
    background: bool | None = None,
) -> list[Path]:
    """Write every analysis table and figure of one run under ``run.path / "analysis"``.

    Args:
        run: A run folder or a loaded :class:`~mhainterp.training.Run`.
        reference: A one-head run of the same task, used as the reference of the
            ``"separation"`` similarity (the seeds' head separation vs the single head).
        methods: Similarity methods to compute (see ``mhainterp.similarity``).
        n_eval: Sequences of the task's fixed evaluation set to analyse.
        ablation: Also compute the ablation tables (the slowest part).
        progress: Show a progress bar over the analysis steps.
        background: Draw the figures in a second process while this one computes (None: when
            the machine has a second core; see :mod:`mhainterp.figures.background`).

    Returns:
        The paths written (CSV and PNG).

    Example:
        >>> written = analyze_run("runs/quickstart/reverse/runs/h8_seed0")  # doctest: +SKIP
    """
    run = run if isinstance(run, Run) else load_run(run)
    out = run.path / "analysis"
    what = f"analysing {run.path} with n_eval={n_eval}"
    require_memory(analysis_memory(run.model.cfg, n_eval), what)
    set_aside_stale_analysis(run.path)  # results of other weights: not mixed with these
    remove_stale_temps(out)  # of an analyze that was killed mid-write
    try:
        with allocation_failures(what):
            written = _write_analysis(
                run, reference, methods, n_eval, ablation, progress, background, out
            )
    except BaseException:
        remove_stale_temps(out)  # the temp file of a figure the stopped worker was writing
        raise
    record_analysis_source(run.path)
    return written


def analysis_memory(config: Any, n_eval: int) -> int:
    """A lower bound on the bytes :func:`analyze_run` allocates: the evaluation set (tokens,
    targets, mask: int64) and one layer's attention patterns of it (float32).

    Example:
        >>> from types import SimpleNamespace as cfg
        >>> analysis_memory(cfg(n_ctx=4, n_heads=2), 10)
        2240
    """
    return n_eval * config.n_ctx * (3 * 8 + 4 * config.n_heads * config.n_ctx)


def _write_analysis(
    run: Run,
    reference: Run | str | os.PathLike[str] | None,
    methods: Sequence[str],
    n_eval: int,
    ablation: bool,
    progress: bool,
    background: bool | None,
    out: Path,
) -> list[Path]:
    """Every table and figure of :func:`analyze_run`, written under ``out``."""
    from mhainterp.capture import (
        average_patterns,
        average_relations,
        example_patterns,
        head_statistics,
        patterns_frame,
        relations_frame,
    )
    from mhainterp.figures.background import FigureQueue
    from mhainterp.figures.patterns import plot_average_patterns, plot_example_patterns
    from mhainterp.similarity import SIMILARITY_METHODS

    model, task = run.model, run.task
    n_heads_total = model.cfg.n_heads * model.cfg.n_layers
    if reference is not None and not isinstance(reference, Run):
        reference = load_run(reference)
    reference_model = reference.model if reference is not None else None
    for method in methods:  # before any work: a typo fails now, not after the ablations
        check_option("method", method, SIMILARITY_METHODS)
    steps = ["statistics", "patterns", "similarity", "ablation" if ablation else None]
    bar = tqdm([s for s in steps if s], desc=f"analyze {run.path.name}", disable=not progress)
    written: list[Path] = []
    # Each figure is drawn in a second process as soon as its table is ready, while this one
    # computes the next (figures took a third of analyze on one core)
    with FigureQueue(background) as figures:
        similarity_inputs = [figures.keep(x) for x in (model, task, reference_model)]
        for step in bar:
            bar.set_postfix(step=step)
            if step == "statistics":
                stats = head_statistics(model, task, n_eval=n_eval)
                written.append(write_csv(out / "head_statistics.csv", stats))
            elif step == "patterns":
                average = patterns_frame(average_patterns(model, task, n_eval=n_eval))
                templates = relations_frame(average_relations(task, task, n_eval=n_eval))
                title = f"{task.name}, h={model.cfg.n_heads}: average attention vs task relations"
                figures.draw(
                    plot_average_patterns,
                    average,
                    templates,
                    title=title,
                    path=out / "average_patterns.png",
                )
                example = example_patterns(model, task, n_eval=n_eval)
                figures.draw(plot_example_patterns, example, path=out / "example_patterns.png")
                written += _pair(out, "average_patterns") + _pair(out, "example_patterns")
            elif step == "similarity" and n_heads_total > 1:
                in_worker = figures.runs_torch(model_device(model))
                for method in methods:
                    if in_worker:
                        # measure and figure both in the worker, while this process runs the
                        # ablations (one job per method: at the end, this process takes over
                        # the jobs the worker has not started)
                        figures.draw(_similarity, *similarity_inputs, method, n_eval, out)
                    else:
                        _similarity(model, task, reference_model, method, n_eval, out, figures.draw)
                written += _similarity_files(methods, out)
            elif step == "ablation":
                written += _ablation(run, n_eval, out, figures)
        bar.set_postfix(step="figures")
    return written


def _pair(out: Path, stem: str) -> list[Path]:
    return [out / f"{stem}.csv", out / f"{stem}.png", out / f"{stem}.pdf"]


def _similarity(
    model: HookedModel,
    task: Task,
    reference_model: HookedModel | None,
    method: str,
    n_eval: int,
    out: Path,
    draw: Callable[..., None] | None = None,
) -> None:
    """One similarity measure's table and heatmap (for JS also the head map); ``draw`` (None:
    here, at once) draws each figure. In the figure worker or in this process: the same
    numbers."""
    from mhainterp.figures.similarity import plot_head_map, plot_similarity_heatmap
    from mhainterp.similarity import cluster_heads, head_map_mds, head_similarity

    def draw_now(function: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        function(*args, **kwargs)

    draw = draw or draw_now
    ref_model = reference_model if method == "separation" else None
    sim = head_similarity(model, task, method=method, n_eval=n_eval, reference=ref_model)
    draw(plot_similarity_heatmap, sim, method=method, path=out / f"similarity_{method}.png")
    if method == "js":
        clusters = cluster_heads(sim)
        map_2d = head_map_mds(sim)
        draw(plot_head_map, map_2d, clusters=clusters, method=method, path=out / "head_map.png")


def _similarity_files(methods: Sequence[str], out: Path) -> list[Path]:
    """What :func:`_similarity` writes, in its order."""
    written: list[Path] = []
    for method in methods:
        written += _pair(out, f"similarity_{method}")
        if method == "js":
            written += _pair(out, "head_map")
    return written


def _ablation(run: Run, n_eval: int, out: Path, figures: FigureQueue) -> list[Path]:
    from mhainterp.figures.ablation import ABLATION_FIGURES, save_ablation_figure

    ready: dict[str, pd.DataFrame] = {}

    def draw_what_is_ready(name: str, table: pd.DataFrame) -> None:
        """Queue each figure whose last table this is (while the next table is computed)."""
        ready[name] = table
        for figure, needs in ABLATION_FIGURES.items():
            if name in needs and all(need in ready for need in needs):
                figures.draw(save_ablation_figure, figure, {k: ready[k] for k in needs}, out)

    tables = ablation_tables(run, n_eval=n_eval, on_table=draw_what_is_ready)
    written = [
        write_csv(out / f"{name}.csv", tables[name])
        for name in ("gradient_importance", "importance_agreement")
    ]
    for figure in ABLATION_FIGURES:
        png = out / f"{figure}.png"
        written += [png.with_suffix(".csv"), png, png.with_suffix(".pdf")]
    return written


def analyze_path(
    path: str | os.PathLike[str], *, progress: bool = False, **options
) -> dict[Path, list[Path]]:
    """Analyse a run folder, or every run of a sweep folder (one-head runs as references).

    Returns:
        Run folder -> paths written.
    """
    runs = find_runs(path)
    results = {}
    for run_dir in tqdm(runs, desc="analyze", disable=not progress or len(runs) == 1):
        reference = _one_head_sibling(run_dir)
        results[run_dir] = analyze_run(run_dir, reference=reference, progress=progress, **options)
    return results


def _one_head_sibling(run_dir: Path) -> Path | None:
    """``.../h1_seed{s}`` beside a sweep run ``.../h{h}_seed{s}``, if it exists and finished."""
    name = run_dir.name
    if not name.startswith("h") or "_seed" not in name:
        return None
    sibling = run_dir.parent / f"h1_{name.split('_', 1)[1]}"
    return sibling if sibling != run_dir and is_finished_run(sibling) else None
