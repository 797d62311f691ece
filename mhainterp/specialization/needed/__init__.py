"""Whether a head is needed: backed up by similar heads (pairs, groups), redundant, or dead.

==============  =========================================================================
``redundancy``  similar heads that back each other up: pairwise and group ablation
==============  =========================================================================

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``ablation``, ``data``, ``heads``, ``model``, ``protocol``, ``similarity``,
``specialization.settings``, ``tasks``.
"""
