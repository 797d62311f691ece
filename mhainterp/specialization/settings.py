"""Every setting of the specialization test, labels and division of labour, in one family.

Two frozen, validated dataclasses live here, and nothing else does:

- :class:`SpecializationSettings`: every threshold of
  :func:`~mhainterp.specialization.specialization_test` (where a head looks, whether it is
  needed), and the fields the division of labour shares with it;
- :class:`DivisionSettings`: every gate and size of
  :func:`~mhainterp.specialization.division_of_labour` (whom a head serves).

The two are one family: the fields both tests use, :data:`SHARED_FIELDS` (``n_eval, alpha,
correction, min_damage, seed, method``), have the same name and meaning in both, and
:attr:`SpecializationSettings.division` derives the division's settings from them, name for
name, with nothing mapped by hand. ``SpecializationSettings(n_eval=64).division.n_eval`` is
64, so ``mhainterp specialize --n-eval 64`` evaluates 64 sequences in both tests. The division's
own gates (``n_bootstrap``, ``serve_share``, ...) stay in :class:`DivisionSettings` only: a
caller who wants other division gates passes ``settings.division.replace(n_bootstrap=100)``
to the division. Two classes joined by a derivation, rather than one class with the division
nested in it, keep the layout of the saved ``specialization.json`` (the labels' settings,
compared field by field to decide reuse) and ``division.json`` (the division's) as it was.

The ablation method is called ``method`` in both (saved settings that say
``ablation_method``, the old name, load through :func:`mhainterp.runs.migrate_settings`).

What each field allows is a table, the class's ``_parameter_constraints`` (as
scikit-learn's), walked on construction by :func:`mhainterp.validation.validate`: a bad value
is one line naming the field, the value and what is allowed. Both classes are frozen:
``dataclasses.replace`` (or :meth:`DivisionSettings.replace`) makes a changed, validated copy.

This module is a leaf of ``specialization/``: it imports none of its sub-packages, which all
read their settings from here.

Example:
    >>> settings = SpecializationSettings(n_eval=64, alpha=0.01, method="zero")
    >>> settings.division.n_eval, settings.division.alpha, settings.division.method
    (64, 0.01, 'zero')
    >>> DivisionSettings(method="zero").replace(n_bootstrap=100).n_bootstrap
    100
    >>> [name for name, _ in DivisionSettings().perturbations()][:2]
    ['min_damage x 0.8', 'min_damage x 1.25']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from mhainterp.ablation import METHODS, Method
from mhainterp.config import DEFAULT_N_EVAL
from mhainterp.similarity import SIMILARITY_METHODS, SimilarityMethod
from mhainterp.stats import CORRECTIONS, Correction
from mhainterp.validation import (
    ConstraintList,
    Interval,
    Options,
    SomeOf,
    check_keys,
    check_option,
    invalid,
    validate,
)

__all__ = [
    "DIVISION_GATES",
    "SCREENS",
    "SCREEN_FIELDS",
    "SHARED_FIELDS",
    "THRESHOLDS",
    "DivisionSettings",
    "SpecializationSettings",
    "resolve_settings",
]

SHARED_FIELDS: tuple[str, ...] = ("n_eval", "alpha", "correction", "min_damage", "seed", "method")
"""The fields :class:`SpecializationSettings` and :class:`DivisionSettings` share, by the same
name: :attr:`SpecializationSettings.division` copies them."""

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


_COUNT = Interval(int, 1)
_SHARE = Interval(float, 0, 1, closed="right")  # a share that must be positive
_AT_LEAST_ZERO = Interval(float, 0)
_SEED = Interval(int, 0)


@dataclass(frozen=True)
class SpecializationSettings:
    """Every knob of :func:`specialization_test`, validated on construction.

    Args:
        n_eval: Sequences of the task's evaluation set used (held out from training), by the
            labels and by the division of labour (:attr:`division`). Saved settings that say
            ``n_sequences`` (the old name) load through :func:`mhainterp.runs.migrate_settings`.
        alpha: Significance level after correction.
        correction: ``"holm"`` (family-wise), ``"bh"`` (false discovery rate) or ``"none"``.
        min_effect: Smallest effect size ``(score - chance) / (1 - chance)`` that counts as a
            role.
        n_init: Untrained null models per run (seeds matched: the run's seed, +1, ...).
        method: The ablation method, ``"mean"``, ``"zero"`` or ``"resample"`` (saved
            settings that say ``ablation_method``, the old name, load through
            :func:`mhainterp.runs.migrate_settings`).
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

    _parameter_constraints: ClassVar[dict[str, ConstraintList]] = {
        "n_eval": [_COUNT],
        "n_permutations": [_COUNT],
        "n_shuffles": [_COUNT],
        "n_init": [Interval(int, 2)],
        "seed": [_SEED],
        "alpha": [_SHARE],
        "min_similarity": [_SHARE],
        "backup_ratio": [_SHARE],
        "min_selectivity": [_SHARE],
        "mix_ratio": [_SHARE],
        "min_evenness": [_SHARE],
        "min_effect": [_AT_LEAST_ZERO],
        "min_joint_damage": [_AT_LEAST_ZERO],
        "dead_tol": [_AT_LEAST_ZERO],
        "min_damage": [_AT_LEAST_ZERO],
        "correction": [Options(CORRECTIONS)],
        "method": [Options(METHODS)],
        "similarity_method": [Options(SIMILARITY_METHODS)],
    }

    n_eval: int = DEFAULT_N_EVAL
    alpha: float = 0.05
    correction: Correction = "holm"
    min_effect: float = 0.3
    n_init: int = 4
    method: Method = "mean"
    similarity_method: SimilarityMethod = "js"
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
        validate(self)

    @property
    def division(self) -> DivisionSettings:
        """The division of labour's settings that go with these: :data:`SHARED_FIELDS` from
        here (the same evaluation size, level, correction, damage gate, seed and ablation
        method), the division's own gates at their defaults.

        Example:
            >>> SpecializationSettings(n_eval=64).division.n_eval
            64
        """
        return DivisionSettings(**{name: getattr(self, name) for name in SHARED_FIELDS})

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
        if name in _LABEL_SHARES:
            value = min(value, 1.0)
        return dataclasses.replace(self, **{name: value})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecializationSettings:
        check_keys("SpecializationSettings", data, (f.name for f in dataclasses.fields(cls)))
        return cls(**data)


_LABEL_SHARES = ("min_evenness", "mix_ratio", "min_similarity", "backup_ratio")


DIVISION_GATES: tuple[str, ...] = (
    "min_damage",
    "min_loss_increase",
    "serve_share",
    "alpha",
    "noise",
    "min_count",
    "min_selectivity_gain",
    "min_index",
)
"""The gates :meth:`DivisionSettings.perturbations` moves x 0.8 and x 1.25."""
SCREENS: tuple[str, ...] = ("none", "attribution")
"""How the division's exact profiles are chosen: every head, or the heads an attribution
screen keeps (:mod:`~mhainterp.specialization.whom.screen`)."""
SCREEN_FIELDS: tuple[str, ...] = ("screen", "screen_margin", "screen_sample")

_DIVISION_SHARES = ("serve_share", "alpha", "noise", "min_selectivity_gain", "min_index")  # < 1


@dataclass(frozen=True)
class DivisionSettings:
    """Every knob of the division test (see :mod:`~mhainterp.specialization.whom.division`);
    :attr:`SpecializationSettings.division` gives the ones that go with the labels'.

    Args:
        method: The primary ablation method (the heads table, the profiles, the null).
        methods: The methods the call must agree under (the primary one is always run).
        n_eval: Sequences of a Task's evaluation set.
        min_damage: Accuracy a head (or group) must cost when removed, or add when kept alone,
            for its profile to be defined (0.01).
        min_loss_increase: The same in mean cross-entropy (nats, 0.01): an accuracy change
            alone can be argmax flips at near-ties.
        min_count: Scored triples a value needs to count in the indices (10).
        serve_share: A served value's damage is at least this share of the head's largest.
        min_selectivity_gain: The effect a head needs to be specialized along an axis: its
            selectivity at least this much above its null's (``selectivity_gain``, 0.075):
            significance alone is not a finding (two heads that split the target classes
            are 0.06 more selective over positions than their layer; a head that serves 10
            of 11 positions is 0.09 more selective than its layer's flat job).
        min_index: The effect a split needs to be divided: a division index below this
            (0.02, a mean cosine of 0.98 between the profiles) is no division, whatever its
            interval; under every method, so a negligible index never makes an axis
            "method-dependent".
        alpha: 1 - the level of every interval; the null's upper quantile is 1 - alpha.
        correction: Multiple-comparison correction of the heads' ``p_adj``.
        n_bootstrap: Bootstrap resamples of the sequences (intervals and the null's spread).
        n_noise: Noisy copies of the model in the same-function null (>= 1). With 1 (the
            default) the original on the even sequences is compared with its copy on the odd
            ones (half an engine pass); with 2 or more, the copies are compared with each other
            both ways round (each copy is one more engine pass on every sequence).
        noise: Relative weight noise of a noisy copy (std / RMS of each head's matrix).
        max_accuracy_change: A noisy copy must keep the accuracy within this; the noise is
            halved (up to 4 times) until it does.
        group_similarity: Backed-up heads whose kept-alone contributions (per scored triple)
            have at least this cosine form a group (when no groups are given).
        n_attention: Sequences of the attention-side view.
        seed: Seed of the bootstrap and of the noise.
        screen: ``"none"`` (every head's profiles computed exactly, the default) or
            ``"attribution"``: every head is first screened by attribution patching
            (:mod:`~mhainterp.specialization.whom.screen`), and only the heads whose estimated
            damage reaches ``screen_margin`` x the damage gate, the heads of layers the
            estimate misses, and a seeded random ``screen_sample`` share of the rest are
            computed exactly; the others keep their estimated profiles (``evidence``
            "attribution-screened").
        screen_margin: A head is screened out only when its estimate is below this share of
            the gate (0.5: half of ``min_loss_increase``).
        screen_sample: Share of the screened-out heads computed exactly anyway (at random,
            seeded by ``seed``, at least one), to check the screen (0.05: on SmolLM2, 16
            sentences, 0.1 sampled 24 heads beside the 34 the estimates kept, and every
            exact head costs about five forwards of the division; the 24 sampled heads'
            exact damages stayed below the gate).
    """

    _parameter_constraints: ClassVar[dict[str, ConstraintList]] = {
        "method": [Options(METHODS)],
        "methods": [SomeOf(METHODS)],
        "n_eval": [_COUNT],
        "min_damage": [Interval(float, 0.0)],
        "min_loss_increase": [Interval(float)],
        "min_count": [_COUNT],
        "serve_share": [Interval(float, 0.0, 1.0)],
        "min_selectivity_gain": [Interval(float, 0.0, 1.0)],
        "min_index": [Interval(float, 0.0, 1.0)],
        "alpha": [Interval(float, 0.0, 1.0, closed="neither")],
        "correction": [Options(CORRECTIONS)],
        "n_bootstrap": [Interval(int, 10)],
        "n_noise": [_COUNT],
        "noise": [Interval(float, 0.0, 1.0, closed="neither")],
        "max_accuracy_change": [Interval(float, 0.0)],
        "group_similarity": [Interval(float, 0.0, 1.0)],
        "n_attention": [_COUNT],
        "seed": [_SEED],
        "screen": [Options(SCREENS)],
        "screen_margin": [Interval(float, 0.0, 1.0, closed="right")],
        "screen_sample": [Interval(float, 0.0, 1.0)],
    }

    method: Method = "mean"
    methods: tuple[Method, ...] = METHODS
    n_eval: int = DEFAULT_N_EVAL
    min_damage: float = 0.01
    min_loss_increase: float = 0.01
    min_count: int = 10
    serve_share: float = 0.5
    min_selectivity_gain: float = 0.075
    min_index: float = 0.02
    alpha: float = 0.05
    correction: Correction = "holm"
    n_bootstrap: int = 200
    n_noise: int = 1
    noise: float = 0.1
    max_accuracy_change: float = 0.02
    group_similarity: float = 0.9
    n_attention: int = 256
    seed: int = 0
    screen: str = "none"
    screen_margin: float = 0.5
    screen_sample: float = 0.05

    def __post_init__(self) -> None:
        if isinstance(self.methods, Mapping):  # the default: every method registered now
            object.__setattr__(self, "methods", tuple(self.methods))
        validate(self)
        methods = (self.methods,) if isinstance(self.methods, str) else tuple(self.methods)
        ordered = (self.method, *[m for m in METHODS if m in methods and m != self.method])
        object.__setattr__(self, "methods", ordered)

    def replace(self, **changes: Any) -> DivisionSettings:
        """A validated copy with ``changes`` (unknown names raise)."""
        known = {f.name for f in dataclasses.fields(self)}
        for name in changes:
            if name not in known:
                raise invalid(name, changes[name], f"a DivisionSettings field: {sorted(known)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (``methods`` as a list), for JSON. With ``screen``
        "none" the screen's fields are left out: a result saved before screening existed
        (or without it) reads, and is reused, as it was."""
        out = dataclasses.asdict(self)
        out["methods"] = list(self.methods)
        if self.screen == "none":
            for name in SCREEN_FIELDS:
                out.pop(name)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DivisionSettings:
        """Settings back from :meth:`to_dict` (unknown keys are ignored: older files)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "methods" in values:
            values["methods"] = tuple(values["methods"])
        return cls(**values)

    def perturbations(self) -> list[tuple[str, DivisionSettings]]:
        """``(name, settings)`` moving each gate of :data:`DIVISION_GATES` x 0.8 and x 1.25
        (shares capped below 1, counts rounded) and making each other method the primary."""
        out = []
        for gate in DIVISION_GATES:
            for factor in (0.8, 1.25):
                value = getattr(self, gate) * factor
                if gate == "min_count":
                    value = max(1, round(value))
                elif gate in _DIVISION_SHARES:
                    value = min(value, 0.99)
                out.append((f"{gate} x {factor}", self.replace(**{gate: value})))
        for method in METHODS:
            if method != self.method:
                out.append((f"method={method}", self.replace(method=method)))
        return out


def resolve_settings(
    settings: DivisionSettings | SpecializationSettings | None = None, **changes: Any
) -> DivisionSettings:
    """The :class:`DivisionSettings` that ``settings`` stands for (itself; a
    :class:`SpecializationSettings`' :attr:`~SpecializationSettings.division`; None: the
    defaults), then ``changes`` (None values ignored).

    Example:
        >>> resolve_settings(None, method="zero", alpha=None).method
        'zero'
        >>> resolve_settings(SpecializationSettings(n_eval=64)).n_eval
        64
    """
    if settings is None:
        base = DivisionSettings()
    elif isinstance(settings, DivisionSettings):
        base = settings
    elif isinstance(settings, SpecializationSettings):
        base = settings.division
    else:
        raise invalid("settings", settings, "a DivisionSettings, a SpecializationSettings or None")
    given = {k: v for k, v in changes.items() if v is not None}
    return base.replace(**given) if given else base
