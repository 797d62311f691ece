"""Figures, each drawn from a tidy DataFrame and saved as a PNG, a vector PDF and the CSV it came
from, side by side.

Sub-modules: ``headcount`` (the head-count experiment), ``patterns`` and ``similarity``
(capture), ``ablation``, ``specialization``, ``division``, and ``saved`` (every figure of a
run or sweep folder, drawn from its saved tables by the step that computes them, for the
report to embed). Every function returns a matplotlib Figure; ``save_figure`` (in ``_common``,
the only place a figure is written) saves it. Savers take what they draw first, then where it
goes, then keywords: ``save_figure(fig, png_path, data)``, ``save_division_figures(result,
folder)``, ``plot_roles_vs_null(roles, path, title=...)``. The layout
rules every figure follows live there too: whole-number ticks on integer axes, tick labels and
cell text sized to fit (cell text dropped below 6 pt), legends outside the data, count error bars
clipped at 0.

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``attribution``, ``heads``, ``io``, ``provenance``, ``runs``, ``runtime``,
``similarity``, ``specialization``, ``sweep``, ``validation``.
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
