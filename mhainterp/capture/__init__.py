"""Per-head capture through hooks: attention patterns, their dataset average, per-head statistics.

Everything here reads ``blocks.{l}.attn.hook_pattern`` through ``run_with_hooks`` with hooks that
keep only the patterns, one batch at a time, so a dataset of any size is summarised without ever
holding all ``[n, head, q, k]`` patterns in memory.

Inputs (``data``) may be a :class:`~mhainterp.tasks.Task` (its fixed evaluation set,
``task.eval_batch(n_eval)``, and its relation templates), a :class:`~mhainterp.tasks.Batch`, or a
``[n, pos]`` token tensor with an optional ``padding_mask`` (``[n, pos]`` bool, True = real token).

Which queries count (the same rule everywhere in this package and in :mod:`mhainterp.similarity`):

- padding queries never count;
- a key is *visible* to a query when it is a real token and, in a causal model, ``k <= q``;
- the pattern statistics (entropy, confidence, self/first/offset mass) average over the real
  queries that see at least 2 keys. A query that sees a single key (position 0 of a causal model)
  has no choice to make: its weight is 1 whatever the head does, and its normalised entropy
  ``H / log(1)`` is undefined, so it is left out rather than reported as a fake certainty;
- the relation template mass averages over the real queries whose template row is non-empty
  (see :func:`head_statistics`).

Shapes: n sequences, B a batch of them, T positions (q query, k key), L layers, h heads.

The modules, each with one job (every name is re-exported here):

- :mod:`~mhainterp.capture.core`: which queries count (:func:`visible_keys`) and the
  streaming capture (:func:`capture_activations`, :func:`iter_activations`,
  :func:`iter_patterns`, :func:`attention_patterns`);
- :mod:`~mhainterp.capture.patterns`: dataset-average patterns and relation templates, and their
  tidy tables (:func:`average_patterns`, :func:`average_relations`, :func:`example_patterns`,
  :func:`patterns_frame`, :func:`relations_frame`);
- :mod:`~mhainterp.capture.statistics`: per-head statistics and the template-mass accumulator
  (:func:`head_statistics`, :class:`TemplateMass`, :func:`offset_profile`).

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``config``, ``data``, ``heads``, ``model``, ``protocol``, ``runtime``, ``tasks``,
``validation``.
"""

from mhainterp.capture.core import (
    MIN_VISIBLE_KEYS,
    ActivationBatch,
    Data,
    PatternBatch,
    RelationSource,
    attention_patterns,
    capture_activations,
    iter_activations,
    iter_patterns,
    pattern_hook_names,
    stack_patterns,
    statistic_queries,
    visible_keys,
)
from mhainterp.capture.patterns import (
    average_patterns,
    average_relations,
    example_patterns,
    patterns_frame,
    relations_frame,
)
from mhainterp.capture.statistics import TemplateMass, head_statistics, offset_profile

__all__ = [
    "MIN_VISIBLE_KEYS",
    "Data",
    "PatternBatch",
    "ActivationBatch",
    "RelationSource",
    "TemplateMass",
    "attention_patterns",
    "average_patterns",
    "average_relations",
    "capture_activations",
    "example_patterns",
    "head_statistics",
    "iter_activations",
    "iter_patterns",
    "offset_profile",
    "pattern_hook_names",
    "patterns_frame",
    "relations_frame",
    "stack_patterns",
    "statistic_queries",
    "visible_keys",
]
