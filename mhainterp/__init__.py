"""mhainterp: do attention heads really specialize?

Train small TransformerLens-style hookable multi-head attention models on synthetic tasks whose
answers are known, compare head counts across seeds, and look inside the heads.

    >>> from mhainterp import get_task, build_model, train, TrainConfig
    >>> task = get_task("reverse", seq_len=16, d_vocab=10)
    >>> result = train(build_model(task, n_heads=4), task, TrainConfig(steps=500))  # doctest: +SKIP
"""

# Registers the "batched" and "ray" sweep executors next to the default "local" one.
import mhainterp.executors  # noqa: F401
from mhainterp.ablation import (
    Ablator,
    ablate,
    ablate_sets,
    gradient_importance,
    head_importance,
    pairwise_ablation,
    prune_curve,
)
from mhainterp.analyze import analyze_run
from mhainterp.capture import average_patterns, example_patterns, head_statistics
from mhainterp.config import ModelConfig, SweepConfig, TrainConfig
from mhainterp.explore import explore
from mhainterp.handbuilt import handbuilt_model
from mhainterp.model import HookedMHATransformer, MultiHeadAttention, TransformerBlock, head_label
from mhainterp.similarity import (
    cluster_heads,
    cross_model_similarity,
    head_map_mds,
    head_similarity,
    match_heads,
)
from mhainterp.sweep import SweepSummary, run_sweep, summarize
from mhainterp.tasks import Batch, Task, get_task, list_tasks, register_task
from mhainterp.training import Run, build_model, evaluate, load_run, save_run, train

__version__ = "0.1.0"

__all__ = [
    "Ablator",
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
    "register_task",
    "run_sweep",
    "save_run",
    "summarize",
    "train",
]
