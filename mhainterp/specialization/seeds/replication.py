"""Does a finding replicate? Head-count comparisons re-tested on seeds they were not derived from.

A claim rests on the comparisons beyond the seed spread on one set of seeds (the reference);
:func:`replication` re-reads the same comparisons on held-out seeds (the same protocol rerun with
other seeds) and says, per claimed comparison, whether it holds there: beyond the spread again,
in the same direction. A claim that does not replicate is stated as such, never dropped.

Example:
    >>> import pandas as pd
    >>> row = {"task": "t", "family": "accuracy", "measure": "accuracy", "quantity": "accuracy",
    ...        "n_heads_a": 4, "n_heads_b": 8, "diff": 0.006, "p_holm": 0.01, "beyond": True}
    >>> held = {**row, "diff": 0.003, "p_holm": 0.195, "beyond": False}
    >>> table = replication(pd.DataFrame([row]), pd.DataFrame([held]))
    >>> bool(table.loc[0, "replicates"]), float(table.loc[0, "p_holm_held_out"])
    (False, 0.195)
"""

from __future__ import annotations

import pandas as pd

__all__ = ["REPLICATION_COLUMNS", "replication"]

REPLICATION_COLUMNS = [
    "task",
    "family",
    "measure",
    "quantity",
    "n_heads_a",
    "n_heads_b",
    "diff",
    "p_holm",
    "diff_held_out",
    "p_holm_held_out",
    "beyond_held_out",
    "replicates",
]
"""One row per comparison beyond the seed spread on the reference seeds: its difference and Holm
p there, the same on the held-out seeds, and ``replicates``: beyond the spread on the held-out
seeds too, with a difference of the same sign."""

_KEY = ["task", "measure", "n_heads_a", "n_heads_b"]


def replication(reference: pd.DataFrame, held_out: pd.DataFrame) -> pd.DataFrame:
    """Each comparison beyond the spread in ``reference``, re-read in ``held_out``.

    Args:
        reference: Head-count comparisons on the seeds the claims come from
            (:data:`mhainterp.sweep.compare.HEAD_COUNT_COLUMNS`).
        held_out: The same comparisons on other seeds.

    Returns:
        :data:`REPLICATION_COLUMNS`; a comparison the held-out seeds cannot make (undefined
        there) has NaN held-out values and does not replicate.
    """
    beyond = reference[reference["beyond"].map(lambda v: v is True or v == True)]  # noqa: E712
    other = held_out[[*_KEY, "diff", "p_holm", "beyond"]].rename(
        columns={"diff": "diff_held_out", "p_holm": "p_holm_held_out", "beyond": "beyond_held_out"}
    )
    table = beyond.merge(other, on=_KEY, how="left")
    same_sign = (table["diff"] > 0) == (table["diff_held_out"] > 0)
    held = table["beyond_held_out"].map(lambda v: v is True or v == True)  # noqa: E712
    table["replicates"] = (held & same_sign).astype(bool)
    return table[REPLICATION_COLUMNS].reset_index(drop=True)
