"""Figures, each drawn from a tidy DataFrame and saved as a PNG beside the CSV it came from.

Sub-modules: ``headcount`` (the head-count experiment), and one per analysis.
"""

from mhainterp.figures._common import save_figure
from mhainterp.figures.headcount import plot_head_count_accuracy, plot_training_curves

__all__ = ["plot_head_count_accuracy", "plot_training_curves", "save_figure"]
