"""Across seeds and head counts: combine runs, consistency across seeds, the sweep summary.

===============  ========================================================================
``combine``      combine per-run results; attach the division of labour
``consistency``  the same roles across seeds: matched heads vs random matching
``over_sweep``   :func:`sweep_specialization` (specialization vs h) and
                 :func:`specialize_folder` (compute and save what a report reads)
===============  ========================================================================
"""
