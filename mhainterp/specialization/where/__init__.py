"""Where a head looks: role scores against relation templates, and their nulls.

==========  =============================================================================
``roles``   share of each head's attention on each relation template of the task, with the
            permutation null (keys shuffled within the mask)
``nulls``   the initialisation null (the same architecture untrained, matched seeds) and
            the p-values of both nulls combined
==========  =============================================================================
"""
