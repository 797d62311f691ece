"""Whom a head serves: where its causal effect falls (tokens, positions, target classes, targets).

========================  ===================================================================
``damage``                per (sequence, position, target) damage of removing heads alone
                          (the causal test's input, and the division's attention view)
``profiles``              the engine passes (single, kept-alone, layer and group removals),
                          noisy copies, per-value means over bootstrap resamples
``selectivity``           K-invariant selectivity, division index, same-function distance
``division_calls``        gates, basis, the calls and the rows of the index and heads tables
``division``              :func:`division_of_labour`: whom each head serves, against a null
                          that keeps head function, under every ablation method
``division_result``       its result object (columns, save/load)
``division_attention``    the attention-side view of the same axes
``causal``                head x target damage and causal selectivity on multi-target tasks
========================  ===================================================================

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``ablation``, ``attribution``, ``capture``, ``data``, ``errors``, ``heads``,
``io``, ``model``, ``protocol``, ``runs``, ``runtime``, ``scoring``, ``specialization.needed``,
``specialization.settings``, ``stats``, ``tasks``, ``validation``.
"""
