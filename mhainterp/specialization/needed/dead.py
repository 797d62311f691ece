"""Dead by function: a head is dead only if it writes almost nothing AND removing it costs
nothing, alone and together with the other quiet heads.

A small write is not the same as no work: a head whose output is tiny but which the readout
amplifies (hand-built: :func:`mhainterp.model.handbuilt.handbuilt_model` with a small
``copy_weights``) can carry the whole task. So the norm only nominates: the **quiet** heads
are those whose write is below ``dead_tol`` of the residual stream's RMS; each is dead when

- removing it alone costs less than ``min_damage`` accuracy on every target (the head x target
  damage of :func:`~mhainterp.specialization.whom.causal.target_damage`), and
- removing it together with the other *candidates* (the quiet heads that pass the first
  test) costs nothing more than removing the others without it: the cost of the whole set
  minus the cost of the set without this head is below ``min_joint_damage`` loss and
  ``min_damage`` accuracy (:func:`quiet_ablations` removes the set and each leave-one-out
  subset, one batched pass).

Two quiet heads that back each other up (either alone can go, not both) are therefore not
dead, while a silent head beside them still is. A dead head is never needed (removing it alone
costs less than ``min_damage`` by construction), and a quiet head that is needed is not a
candidate at all.

The joint ablation is run for the candidate set of every setting the stability test tries
(``dead_tol`` and ``min_damage`` moved), so labels can be re-decided from the saved evidence
(:data:`QUIET_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from mhainterp.ablation import evaluate_head_sets, head_sets_table
from mhainterp.data import Batch
from mhainterp.heads import HEAD_SET_SEPARATOR
from mhainterp.model import HookedMHATransformer
from mhainterp.protocol import scored_by_loss
from mhainterp.specialization.settings import SpecializationSettings

__all__ = [
    "PRETRAINED_QUIET_SET",
    "QUIET_COLUMNS",
    "candidates",
    "dead_heads",
    "quiet_ablations",
    "quiet_heads",
]

PRETRAINED_QUIET_SET = 16
"""The largest set of quiet candidates removed, with each of its leave-one-out subsets, on a
pretrained model: c candidates cost c + 1 forwards per distinct set and per perturbed
setting, and on SmolLM2 (16 sentences) this step ran past 10 minutes. Toy models remove every
set."""

QUIET_COLUMNS = ["heads", "loss_increase", "accuracy_drop"]
"""Columns of :func:`quiet_ablations`: one row per distinct set of quiet heads (a head set
``"L0H1,L0H3"``) of candidates (:func:`candidates`), the loss increase and accuracy drop of
removing the set together."""


def quiet_heads(output_ratio: Mapping[str, float], dead_tol: float) -> list[str]:
    """Heads whose write is below ``dead_tol`` of the residual stream's RMS, in order.

    Example:
        >>> quiet_heads({"L0H0": 0.5, "L0H1": 0.001}, 0.01)
        ['L0H1']
    """
    return [head for head, ratio in output_ratio.items() if float(ratio) < dead_tol]


def candidates(
    output_ratio: Mapping[str, float],
    max_damage: Mapping[str, float],
    settings: SpecializationSettings,
) -> list[str]:
    """The quiet heads whose removal alone costs less than ``min_damage`` on every target.

    Example:
        >>> candidates({"L0H0": 0.001, "L0H1": 0.001}, {"L0H0": 0.8, "L0H1": 0.0},
        ...            SpecializationSettings())
        ['L0H1']
    """
    quiet = quiet_heads(output_ratio, settings.dead_tol)
    return [h for h in quiet if float(max_damage.get(h, 0.0)) < settings.min_damage]


def quiet_ablations(
    model: HookedMHATransformer,
    batch: Batch,
    output_ratio: Mapping[str, float],
    max_damage: Mapping[str, float],
    variants: Sequence[SpecializationSettings],
    method: str,
    progress: bool = False,
) -> pd.DataFrame:
    """Remove each distinct candidate set (:func:`candidates`, one per setting in
    ``variants``) and each of its leave-one-out subsets as a whole, in one batched pass.

    On a pretrained model (scored by its loss) a candidate set of more than
    :data:`PRETRAINED_QUIET_SET` heads is not removed: its heads are judged by the single-head
    test alone (:func:`dead_heads` counts it untested).

    Returns:
        Columns :data:`QUIET_COLUMNS`; empty when no setting has a candidate.
    """
    largest = PRETRAINED_QUIET_SET if scored_by_loss(model) else None
    sets = []
    for variant in variants:
        found = candidates(output_ratio, max_damage, variant)
        if largest is not None and len(found) > largest:
            continue  # c + 1 forwards for c candidates: too many; the single-head test decides
        sets += [tuple(found), *(tuple(h for h in found if h != keep) for keep in found)]
    sets = [s for s in dict.fromkeys(sets) if s]
    if not sets:
        return pd.DataFrame(columns=QUIET_COLUMNS)
    result = evaluate_head_sets(
        model,
        batch,
        [[], *(list(s) for s in sets)],
        method,
        progress=progress,
        desc="quiet heads removed",
    )
    table = head_sets_table(result).iloc[1:]  # after the clean model
    return pd.DataFrame(
        {
            "heads": [HEAD_SET_SEPARATOR.join(s) for s in sets],
            "loss_increase": table["delta_loss"].to_numpy(float),
            "accuracy_drop": -table["delta_accuracy"].to_numpy(float),
        },
        columns=QUIET_COLUMNS,
    )


def dead_heads(
    output_ratio: Mapping[str, float],
    max_damage: Mapping[str, float],
    quiet: pd.DataFrame,
    settings: SpecializationSettings,
) -> tuple[set[str], int]:
    """The dead heads under ``settings`` (module docstring), from saved evidence.

    Args:
        output_ratio: Head label -> RMS of its write / RMS of the residual stream.
        max_damage: Head label -> its largest accuracy drop over targets when removed alone.
        quiet: :func:`quiet_ablations`' table.
        settings: ``dead_tol``, ``min_damage`` and ``min_joint_damage``.

    Returns:
        ``(dead, n_untested)``: the dead heads and 1 when a set these settings need was never
        removed (then only the single-head tests decide).

    Example:
        >>> quiet = pd.DataFrame({"heads": ["L0H1"], "loss_increase": [0.0],
        ...                       "accuracy_drop": [0.0]})
        >>> dead_heads({"L0H0": 0.5, "L0H1": 0.001}, {"L0H1": 0.0}, quiet,
        ...            SpecializationSettings())
        ({'L0H1'}, 0)
    """
    alone = candidates(output_ratio, max_damage, settings)
    if not alone:
        return set(), 0
    cost = {
        heads: (loss, drop)
        for heads, loss, drop in zip(
            quiet.get("heads", []),
            quiet.get("loss_increase", []),
            quiet.get("accuracy_drop", []),
            strict=True,
        )
    }
    cost[""] = (0.0, 0.0)  # removing nothing costs nothing
    whole = HEAD_SET_SEPARATOR.join(alone)
    dead, untested = set(), 0
    for head in alone:
        rest = HEAD_SET_SEPARATOR.join(h for h in alone if h != head)
        if whole not in cost or rest not in cost:
            untested, known = 1, True  # only the single-head test decides
        else:
            extra_loss = float(cost[whole][0]) - float(cost[rest][0])
            extra_drop = float(cost[whole][1]) - float(cost[rest][1])
            known = extra_loss < settings.min_joint_damage and extra_drop < settings.min_damage
        if known:
            dead.add(head)
    return dead, untested
