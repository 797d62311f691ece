"""Whom a head serves: where its causal effect falls (tokens, positions, target classes, targets).

========================  ===================================================================
``damage``                per (sequence, position, target) damage of removing heads, shared
                          by the division and causal tests
``selectivity``           the selectivity and division indices, and their permutation nulls
``division``              :func:`division_of_labour`: whom each head serves, against nulls
``division_result``       its result object (columns, save/load)
``division_attention``    the attention-side view of the same axes
``causal``                head x target damage and causal selectivity on multi-target tasks
========================  ===================================================================
"""
