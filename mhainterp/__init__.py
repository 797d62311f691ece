"""mhainterp: do attention heads really specialize?

Train small TransformerLens-style hookable multi-head attention models on synthetic tasks whose
answers are known, compare head counts across seeds, and look inside the heads.

    >>> from mhainterp import get_task, build_model, train, TrainConfig
    >>> task = get_task("reverse", seq_len=16, d_vocab=10)
    >>> result = train(build_model(task, n_heads=4), task, TrainConfig(steps=500))  # doctest: +SKIP

Every name below is imported on first use (PEP 562), so ``import mhainterp`` and the
``mhainterp`` command start without loading torch and TransformerLens until a name needs them
(``mhainterp --help`` no longer waits for them, and Ctrl-C during that load is the command's
own one-line message).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what static tools and IDEs see: the same names, imported eagerly
    from mhainterp.ablation import (
        Ablator,
        ablate,
        evaluate_head_sets,
        head_importance,
        head_sets_table,
        pairwise_ablation,
        register_method,
    )
    from mhainterp.analyze import (
        analyze_run,
    )
    from mhainterp.attribution import (
        gradient_importance,
        prune_curve,
    )
    from mhainterp.capture import (
        average_patterns,
        example_patterns,
        head_statistics,
    )
    from mhainterp.config import (
        ModelConfig,
        SweepConfig,
        TrainConfig,
    )
    from mhainterp.data import (
        as_batch,
    )
    from mhainterp.explore import (
        explore,
    )
    from mhainterp.heads import (
        format_heads,
        head_label,
        resolve_heads,
    )
    from mhainterp.model import (
        HookedMHATransformer,
        MultiHeadAttention,
        TransformerBlock,
    )
    from mhainterp.model.handbuilt import (
        handbuilt_model,
    )
    from mhainterp.pretrained import (
        load_pretrained,
    )
    from mhainterp.report import (
        write_report,
    )
    from mhainterp.runtime import (
        device_context,
        threads_context,
    )
    from mhainterp.similarity import (
        cluster_heads,
        cross_model_similarity,
        head_map_mds,
        head_similarity,
        match_heads,
    )
    from mhainterp.specialization import (
        DivisionSettings,
        SpecializationSettings,
        attach_division,
        division_of_labour,
        headline_stability,
        specialization_test,
        specialize_folder,
        sweep_specialization,
    )
    from mhainterp.sweep import (
        SweepSummary,
        run_sweep,
        summarize,
    )
    from mhainterp.tasks import (
        Batch,
        Task,
        get_task,
        list_tasks,
        load_task_module,
        register_axis,
        register_task,
    )
    from mhainterp.training import (
        Run,
        build_model,
        evaluate,
        load_run,
        save_run,
        train,
    )
    from mhainterp.validation import (
        ParameterError,
    )

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "ablate": "mhainterp.ablation",
    "Ablator": "mhainterp.ablation",
    "evaluate_head_sets": "mhainterp.ablation",
    "head_importance": "mhainterp.ablation",
    "head_sets_table": "mhainterp.ablation",
    "pairwise_ablation": "mhainterp.ablation",
    "analyze_run": "mhainterp.analyze",
    "gradient_importance": "mhainterp.attribution",
    "prune_curve": "mhainterp.attribution",
    "average_patterns": "mhainterp.capture",
    "example_patterns": "mhainterp.capture",
    "head_statistics": "mhainterp.capture",
    "ModelConfig": "mhainterp.config",
    "SweepConfig": "mhainterp.config",
    "TrainConfig": "mhainterp.config",
    "as_batch": "mhainterp.data",
    "explore": "mhainterp.explore",
    "handbuilt_model": "mhainterp.model.handbuilt",
    "format_heads": "mhainterp.heads",
    "head_label": "mhainterp.heads",
    "resolve_heads": "mhainterp.heads",
    "HookedMHATransformer": "mhainterp.model",
    "MultiHeadAttention": "mhainterp.model",
    "TransformerBlock": "mhainterp.model",
    "write_report": "mhainterp.report",
    "cluster_heads": "mhainterp.similarity",
    "cross_model_similarity": "mhainterp.similarity",
    "head_map_mds": "mhainterp.similarity",
    "head_similarity": "mhainterp.similarity",
    "match_heads": "mhainterp.similarity",
    "load_pretrained": "mhainterp.pretrained",
    "DivisionSettings": "mhainterp.specialization",
    "SpecializationSettings": "mhainterp.specialization",
    "attach_division": "mhainterp.specialization",
    "division_of_labour": "mhainterp.specialization",
    "headline_stability": "mhainterp.specialization",
    "specialize_folder": "mhainterp.specialization",
    "specialization_test": "mhainterp.specialization",
    "sweep_specialization": "mhainterp.specialization",
    "run_sweep": "mhainterp.sweep",
    "summarize": "mhainterp.sweep",
    "SweepSummary": "mhainterp.sweep",
    "Batch": "mhainterp.tasks",
    "get_task": "mhainterp.tasks",
    "list_tasks": "mhainterp.tasks",
    "load_task_module": "mhainterp.tasks",
    "register_task": "mhainterp.tasks",
    "Task": "mhainterp.tasks",
    "build_model": "mhainterp.training",
    "evaluate": "mhainterp.training",
    "load_run": "mhainterp.training",
    "Run": "mhainterp.training",
    "save_run": "mhainterp.training",
    "train": "mhainterp.training",
    "ParameterError": "mhainterp.validation",
    "register_method": "mhainterp.ablation",
    "register_axis": "mhainterp.tasks",
    "device_context": "mhainterp.runtime",
    "threads_context": "mhainterp.runtime",
}
"""Public name -> the module that defines it."""

__all__ = sorted(_EXPORTS)  # derived: a public name is added to _EXPORTS (and the block above)


# ``explore`` is the subpackage, callable as its function (``mhainterp.explore(run)``): one
# object, so ``import mhainterp.explore.server as server`` works too. Light: the explorer loads
# on use.
from mhainterp import explore  # noqa: E402  (the subpackage, see mhainterp/explore)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (and keep the name here after that)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mhainterp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
