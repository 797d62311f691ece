"""Figures, each drawn from a tidy DataFrame and saved as a PNG beside the CSV it came from.

Sub-modules: ``headcount`` (the head-count experiment), ``patterns`` and ``similarity``
(capture), ``ablation``. Every function returns a matplotlib Figure; ``save_figure`` writes it.
"""

from mhainterp.figures._common import save_figure
from mhainterp.figures.ablation import (
    gradient_vs_ablation_figure,
    importance_figure,
    pairwise_figure,
    prune_curve_figure,
    save_ablation_figures,
)
from mhainterp.figures.headcount import plot_head_count_accuracy, plot_training_curves
from mhainterp.figures.patterns import plot_average_patterns, plot_example_patterns
from mhainterp.figures.similarity import plot_head_map, plot_similarity_heatmap

__all__ = [
    "gradient_vs_ablation_figure",
    "importance_figure",
    "pairwise_figure",
    "plot_average_patterns",
    "plot_example_patterns",
    "plot_head_count_accuracy",
    "plot_head_map",
    "plot_similarity_heatmap",
    "plot_training_curves",
    "prune_curve_figure",
    "save_ablation_figures",
    "save_figure",
]
