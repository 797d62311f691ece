"""Whether a head is needed: backed up by similar heads (pairs, groups), redundant, or dead.

==============  =========================================================================
``redundancy``  similar heads that back each other up: pairwise and group ablation
==============  =========================================================================
"""
