"""Across seeds and head counts: combine runs, consistency across seeds, the sweep summary.

===============  ========================================================================
``combine``      combine per-run results; attach the division of labour
``consistency``  the same roles across seeds: matched heads vs random matching
``summary``      the summary per task and head count, and the head-count comparisons
===============  ========================================================================

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``ablation``, ``heads``, ``render``, ``similarity``, ``specialization.nulls``,
``specialization.settings``, ``specialization.verdict``, ``specialization.where``,
``specialization.whom``, ``stats``, ``sweep``, ``tasks``, ``validation``.
"""
