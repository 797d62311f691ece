"""The verdict: per-head labels, the run's sentences and their stability.

==================  ==========================================================================
``labels``          one label per head and the flags holds / needed / backed_up / dead
``sentences``       the verdict objects whose text is generated from the numbers
``division_words``  a division row's call and evidence in words, and the headline clause
``stability``       labels re-decided with every threshold moved, from the saved evidence
``result``          :class:`~.result.SpecializationResult`: the tables' columns, save and load
==================  ==========================================================================

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``ablation``, ``heads``, ``io``, ``provenance``, ``render``, ``runs``,
``specialization.needed``, ``specialization.settings``, ``specialization.where``,
``specialization.whom``, ``stats``, ``tasks``.
"""
