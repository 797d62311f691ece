"""The verdict: per-head labels, the run's sentences and their stability.

==============  =========================================================================
``labels``      one label per head and the flags holds / needed / backed_up / dead
``sentences``   the verdict objects whose text is generated from the numbers
``stability``   labels re-decided with every threshold moved, from the saved evidence
``result``      :class:`~.result.SpecializationResult`: the tables' columns, save and load
==============  =========================================================================
"""
