"""Settings of the specialization test: every threshold in one validated dataclass.

Example:
    >>> SpecializationSettings(alpha=0.01).correction
    'holm'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mhainterp.ablation import check_method
from mhainterp.data import DEFAULT_N_EVAL
from mhainterp.similarity import SIMILARITY_METHODS
from mhainterp.stats import CORRECTIONS
from mhainterp.validation import check_float, check_int, check_keys, check_option, invalid

__all__ = ["THRESHOLDS", "SpecializationSettings"]

THRESHOLDS = (
    "min_effect",
    "min_evenness",
    "mix_ratio",
    "dead_tol",
    "min_similarity",
    "backup_ratio",
    "min_joint_damage",
    "min_damage",
)
"""The thresholds a label rests on, each perturbed x 0.8 and x 1.25 by the stability test
(:func:`~mhainterp.specialization.verdict.stability.label_stability`). ``alpha`` is a significance
level, not an effect threshold, and is left out; so are the null sizes."""


@dataclass
class SpecializationSettings:
    """Every knob of :func:`specialization_test`, validated on construction.

    Args:
        n_eval: Sequences of the task's evaluation set used (held out from training). Saved
            settings that say ``n_sequences`` (the old name) load through
            :func:`mhainterp.runs.migrate_settings`.
        alpha: Significance level after correction.
        correction: ``"holm"`` (family-wise), ``"bh"`` (false discovery rate) or ``"none"``.
        min_effect: Smallest effect size ``(score - chance) / (1 - chance)`` that counts as a
            role.
        n_init: Untrained null models per run (seeds matched: the run's seed, +1, ...).
        ablation_method: ``"mean"``, ``"zero"`` or ``"resample"``.
        similarity_method: :func:`~mhainterp.similarity.head_similarity` method for redundancy.
        min_similarity: Similarity for two heads to count as similar.
        backup_ratio: Share of the joint damage beyond the singles that counts as backup.
        min_joint_damage: Loss increase (nats) that removing a redundant pair must cause.
        dead_tol: A head whose write is below this fraction of the residual stream's RMS is
            dead.
        min_damage: Accuracy drop that counts as damage (selectivity, ablation support).
        min_selectivity: Selectivity index for a head to be causally specialized.
        mix_ratio: A head whose second significant role (not nested in or containing the
            first) has at least this fraction of the first one's effect *mixes* the two and is
            labelled unspecialized.
        min_evenness: A head whose best role is a set of several keys and which spreads its
            attention over that set at least this evenly (overlap with the uniform
            distribution over the set, 1 = uniform) is *counting* over it (label
            ``count:<set>``; see :mod:`.roles`).
        n_permutations: Draws of the causal permutation null.
        n_shuffles: Draws of the head-shuffled consistency null (heads dealt across seeds).
        seed: Seed of every null's random generator.
    """

    n_eval: int = DEFAULT_N_EVAL
    alpha: float = 0.05
    correction: str = "holm"
    min_effect: float = 0.3
    n_init: int = 4
    ablation_method: str = "mean"
    similarity_method: str = "js"
    min_similarity: float = 0.9
    backup_ratio: float = 0.5
    min_joint_damage: float = 0.005
    dead_tol: float = 0.01
    min_damage: float = 0.01
    min_selectivity: float = 0.5
    mix_ratio: float = 0.5
    min_evenness: float = 0.8
    n_permutations: int = 1000
    n_shuffles: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_eval", "n_permutations", "n_shuffles"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("n_init", self.n_init, minimum=2)
        check_int("seed", self.seed, minimum=0)
        for name in (
            "alpha",
            "min_similarity",
            "backup_ratio",
            "min_selectivity",
            "mix_ratio",
            "min_evenness",
        ):
            if check_float(name, getattr(self, name), minimum=0, maximum=1) == 0:
                raise invalid(name, getattr(self, name), "a finite number > 0 and <= 1")
        for name in ("min_effect", "min_joint_damage", "dead_tol", "min_damage"):
            check_float(name, getattr(self, name), minimum=0)
        check_option("correction", self.correction, CORRECTIONS)
        check_method(self.ablation_method)
        check_option("similarity_method", self.similarity_method, SIMILARITY_METHODS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def scaled(self, name: str, factor: float) -> SpecializationSettings:
        """A copy with threshold ``name`` multiplied by ``factor`` (clipped to 1 where the
        threshold is a share that may not exceed 1).

        Example:
            >>> SpecializationSettings().scaled("min_similarity", 1.25).min_similarity
            1.0
        """
        check_option("name", name, THRESHOLDS)
        value = getattr(self, name) * factor
        if name in _SHARES:
            value = min(value, 1.0)
        return dataclasses.replace(self, **{name: value})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecializationSettings:
        check_keys("SpecializationSettings", data, (f.name for f in dataclasses.fields(cls)))
        return cls(**data)


_SHARES = ("min_evenness", "mix_ratio", "min_similarity", "backup_ratio")
