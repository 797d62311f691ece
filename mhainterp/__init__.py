"""mhainterp: do attention heads really specialize?

Train small TransformerLens-style hookable multi-head attention models on synthetic tasks whose
answers are known, compare head counts across seeds, and look inside the heads.

    >>> from mhainterp import get_task, build_model, train, TrainConfig
    >>> task = get_task("reverse", seq_len=16, d_vocab=10)
    >>> result = train(build_model(task, n_heads=4), task, TrainConfig(steps=500))  # doctest: +SKIP
"""

from mhainterp.ablation import (
    Ablator,
    ablate,
    ablate_sets,
    evaluate_head_sets,
    head_importance,
    pairwise_ablation,
)
from mhainterp.analyze import analyze_run
from mhainterp.attribution import gradient_importance, prune_curve
from mhainterp.capture import average_patterns, example_patterns, head_statistics
from mhainterp.config import ModelConfig, SweepConfig, TrainConfig
from mhainterp.data import as_batch
from mhainterp.explore import explore
from mhainterp.handbuilt import handbuilt_model
from mhainterp.heads import format_heads, head_label, resolve_heads
from mhainterp.model import HookedMHATransformer, MultiHeadAttention, TransformerBlock
from mhainterp.report import write_report
from mhainterp.similarity import (
    cluster_heads,
    cross_model_similarity,
    head_map_mds,
    head_similarity,
    match_heads,
)
from mhainterp.specialization import (
    division_of_labour,
    specialization_test,
    sweep_specialization,
)
from mhainterp.sweep import SweepSummary, run_sweep, summarize
from mhainterp.tasks import Batch, Task, get_task, list_tasks, load_task_module, register_task
from mhainterp.training import Run, build_model, evaluate, load_run, save_run, train
from mhainterp.validation import ParameterError

__version__ = "0.1.0"

__all__ = [
    "Ablator",
    "ParameterError",
    "as_batch",
    "division_of_labour",
    "evaluate_head_sets",
    "format_heads",
    "resolve_heads",
    "specialization_test",
    "sweep_specialization",
    "write_report",
    "ablate",
    "ablate_sets",
    "analyze_run",
    "average_patterns",
    "cluster_heads",
    "cross_model_similarity",
    "example_patterns",
    "explore",
    "gradient_importance",
    "head_importance",
    "head_map_mds",
    "head_similarity",
    "head_statistics",
    "match_heads",
    "pairwise_ablation",
    "prune_curve",
    "Batch",
    "HookedMHATransformer",
    "ModelConfig",
    "MultiHeadAttention",
    "Run",
    "SweepConfig",
    "SweepSummary",
    "Task",
    "TrainConfig",
    "TransformerBlock",
    "build_model",
    "evaluate",
    "get_task",
    "handbuilt_model",
    "head_label",
    "list_tasks",
    "load_run",
    "load_task_module",
    "register_task",
    "run_sweep",
    "save_run",
    "summarize",
    "train",
]
