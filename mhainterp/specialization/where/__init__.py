"""Where a head looks: role scores against relation templates, and their nulls.

==========  =============================================================================
``roles``   share of each head's attention on each relation template of the task, with the
            permutation null (keys shuffled within the mask)
``nulls``   the initialisation null (the same architecture untrained, matched seeds) and
            the p-values of both nulls combined
==========  =============================================================================

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``capture``, ``config``, ``heads``, ``model``, ``pretrained``, ``protocol``,
``runtime``, ``stats``, ``tasks``, ``validation``.
"""
