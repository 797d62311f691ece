"""Models with hand-set weights whose heads are known: the toolkit's ground truth.

Analyses are tested on these before they are trusted on trained models.

==================  ========================================================================
``relations``       :func:`handbuilt_model`: one head per relation (previous, mirror, self,
                    first, uniform, dead, counting); :func:`feature_model`, the one-hot
                    residual layout the others build on
``split``           :func:`split_heads_model`, :func:`head_copies_model` (their data is
                    :func:`mhainterp.tasks.split_batch`):
                    heads that divide the work (or do not), the division-of-labour tests'
                    ground truth
``induction``       :func:`induction_circuit_model`, :func:`offset_head_model`: the two-layer
                    induction circuit and the one-layer heads that must fail it
``selector_width``  :func:`selector_width_model`: tracr's SelectorWidth, one head spread
                    evenly over the BOS and every real token, whose output is the length
==================  ========================================================================

They build on the rest of :mod:`mhainterp.model`, which does not import them, and import nothing
above it (the split heads' data, a task :class:`~mhainterp.tasks.Batch`, lives in
:mod:`mhainterp.tasks.split_data`).

Example:
    >>> from mhainterp.model.handbuilt import handbuilt_model
    >>> handbuilt_model(["previous", "uniform", "dead"]).cfg.n_heads
    3

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``config``, ``model``, ``runtime``, ``validation``.
"""

from mhainterp.model.handbuilt.induction import induction_circuit_model, offset_head_model
from mhainterp.model.handbuilt.relations import HEAD_KINDS, feature_model, handbuilt_model
from mhainterp.model.handbuilt.selector_width import selector_width_model
from mhainterp.model.handbuilt.split import (
    SPLIT_KINDS,
    head_copies_model,
    split_heads_model,
)

__all__ = [
    "HEAD_KINDS",
    "SPLIT_KINDS",
    "feature_model",
    "handbuilt_model",
    "head_copies_model",
    "induction_circuit_model",
    "offset_head_model",
    "selector_width_model",
    "split_heads_model",
]
