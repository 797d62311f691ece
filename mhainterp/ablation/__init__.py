"""Which heads matter: ablation by editing ``hook_z``.

- :mod:`~mhainterp.ablation.engine`: the one engine (any head sets, one batched pass,
  per-position outputs) and the :func:`ablate` context manager;
- :mod:`~mhainterp.ablation.replacement`: the registry of methods (:data:`METHODS`; the
  built-ins zero, mean, resample; one :class:`Replacement` subclass each, added with
  :func:`register_method`) and the values an ablated head's z becomes, from one clean capture
  of the reference;
- :mod:`~mhainterp.ablation.tables`: importance, head-set and pairwise tables over it (head sets
  are evaluated by :func:`evaluate_head_sets`, :func:`head_sets_table` lays its result out);
- :mod:`~mhainterp.ablation.interactive`: :class:`Ablator`, toggle heads and see the metrics.

Gradient importance and pruning curves are in :mod:`mhainterp.attribution`; every table of a
run, both kinds side by side, in :func:`mhainterp.analyze.ablation_tables`.

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``config``, ``data``, ``fast``, ``heads``, ``model``, ``protocol``, ``registry``,
``runtime``, ``scoring``, ``tasks``, ``validation``.
"""

from mhainterp.ablation.engine import AblationResult, ablate, evaluate_head_sets
from mhainterp.ablation.interactive import Ablator
from mhainterp.ablation.replacement import (
    METHODS,
    Method,
    Replacement,
    check_method,
    method_order,
    register_method,
)
from mhainterp.ablation.tables import head_importance, head_sets_table, pairwise_ablation
from mhainterp.heads import resolve_heads

__all__ = [
    "METHODS",
    "AblationResult",
    "Ablator",
    "Method",
    "Replacement",
    "ablate",
    "check_method",
    "evaluate_head_sets",
    "head_importance",
    "head_sets_table",
    "method_order",
    "pairwise_ablation",
    "register_method",
    "resolve_heads",
]
