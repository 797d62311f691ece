"""The ablation tables ``mhainterp analyze`` writes: every ablation table of one run.

:func:`ablation_tables` puts the ablation engine's tables (:mod:`mhainterp.ablation`) beside
the gradient ones (:mod:`mhainterp.attribution`): importance per method, pairwise backups,
gradient importance, their agreement and the pruning curve. It sits above both, so the ablation
package does not reach up to attribution.

Example:
    >>> from mhainterp.model.handbuilt import handbuilt_model
    >>> from mhainterp.tasks import get_task
    >>> model = handbuilt_model(["previous", "uniform", "previous"])
    >>> task = get_task("previous_token", seq_len=16, d_vocab=10)
    >>> sorted(ablation_tables(model, task, methods=["zero"], n_eval=64))
    ['gradient_importance', 'importance', 'importance_agreement', 'pairwise', 'prune_curve']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from mhainterp.ablation import METHODS, Method, check_method, head_importance, pairwise_ablation
from mhainterp.ablation.replacement import CleanCache
from mhainterp.attribution import gradient_importance, importance_agreement, prune_curve
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.data import Data
from mhainterp.protocol import HookedModel
from mhainterp.training import Run

__all__ = ["TABLES", "ablation_tables", "unpack_run"]

TABLES = ("importance", "pairwise", "gradient_importance", "importance_agreement", "prune_curve")
"""The tables :func:`ablation_tables` returns, in its dict's order."""


def ablation_tables(
    run_or_model: Run | HookedModel,
    data: Data | None = None,
    *,
    method: Method = "mean",
    methods: Sequence[Method] = METHODS,
    n_eval: int = DEFAULT_N_EVAL,
    pairwise_heads: int | None = 16,
    progress: bool = False,
    on_table: Callable[[str, pd.DataFrame], None] | None = None,
) -> dict[str, pd.DataFrame]:
    """Every ablation table for a run (or a model and its data), ready to save as CSV.

    Args:
        run_or_model: A ``training.Run`` (uses its model and task) or a model.
        data: What to evaluate on; required with a model, optional with a Run.
        method: The method for the pairwise and pruning tables.
        methods: The methods for the importance table (stacked, one block per method).
        n_eval: Size of a Task's evaluation set.
        pairwise_heads: The pairwise table pairs up at most this many heads: on a larger
            model, the ones whose single ablation (``method``) raises the loss most. Pairs grow
            as h^2 (496 for 2 x 16 heads); backups of heads that matter are among these pairs.
            None: every head. The pruning curve likewise re-scores 8 candidates per step (exact
            for up to 8 heads) and 4 on models of more than 16 heads.
        progress: Show progress bars.
        on_table: Called with each table's name and the table as soon as it is computed (in
            the order importance, gradient importance, agreement, pairwise, pruning curve),
            so that its figure can be drawn while the next is computed.

    Returns:
        ``{"importance", "pairwise", "gradient_importance", "importance_agreement",
        "prune_curve"}``.

    Example:
        >>> tables = ablation_tables(load_run("runs/x/h4_seed0"))  # doctest: +SKIP
    """
    model, data = unpack_run(run_or_model, data)
    # One CleanCache for every table: the same model, sequences and reference, so the clean
    # forwards (prefixes, the reference's activations) run once, not once per table and step
    cache = CleanCache()
    options = {"n_eval": n_eval, "progress": progress}
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    tables: dict[str, pd.DataFrame] = {}

    def computed(name: str, table: pd.DataFrame) -> pd.DataFrame:
        tables[name] = table
        if on_table is not None:
            on_table(name, table)
        return table

    importance = computed(
        "importance",
        pd.concat(
            [
                head_importance(model, data, check_method(m), cache=cache, **options)
                for m in methods
            ],
            ignore_index=True,
        ),
    )
    gradient = computed("gradient_importance", gradient_importance(model, data, **options))
    computed("importance_agreement", importance_agreement(gradient, importance))
    computed(
        "pairwise",
        pairwise_ablation(
            model,
            data,
            method,
            heads=_most_damaging(importance, method, pairwise_heads),
            cache=cache,
            **options,
        ),
    )
    # Re-score 8 candidates per pruning step (exact up to 8 heads), 4 beyond 16 heads.
    computed(
        "prune_curve",
        prune_curve(
            model, data, method, shortlist=8 if n_heads <= 16 else 4, cache=cache, **options
        ),
    )
    return {name: tables[name] for name in TABLES}


def _most_damaging(importance: pd.DataFrame, method: str, n: int | None) -> list[str] | None:
    """The ``n`` heads whose ablation raises the loss most (layer-major), or None for all."""
    table = importance[importance["method"] == method]
    if n is None or len(table) <= n:
        return None
    top = table.sort_values(["delta_loss", "layer", "head"], ascending=[False, True, True])
    return table.loc[sorted(top.index[:n])]["head_label"].tolist()


def unpack_run(run_or_model: Run | HookedModel, data: Data | None) -> tuple[HookedModel, Data]:
    """``(model, data)`` from a Run (its task unless ``data`` is given) or a model + data."""
    if isinstance(run_or_model, HookedModel):
        if data is None:
            raise TypeError("data= is required when a model (not a Run) is given")
        return run_or_model, data
    model, run_task = getattr(run_or_model, "model", None), getattr(run_or_model, "task", None)
    if not isinstance(model, HookedModel):
        raise TypeError(
            "run_or_model must be a training.Run or a model (HookedMHATransformer, BridgedModel), "
            f"got "
            f"{type(run_or_model).__name__}"
        )
    return model, data if data is not None else run_task
