"""The division test's settings: one frozen, validated dataclass (it replaces the 21 keywords).

:class:`DivisionSettings` holds every gate and size of
:func:`~mhainterp.specialization.whom.division.division_of_labour`; what each one means is in
that module's docstring. ``.replace(**changes)`` gives a validated copy and ``.perturbations()``
the copies the headline-stability test re-runs (each gate x 0.8 and x 1.25, each other primary
ablation method).

Example:
    >>> s = DivisionSettings(method="zero")
    >>> s.replace(n_bootstrap=100).n_bootstrap, s.method
    (100, 'zero')
    >>> [name for name, _ in DivisionSettings().perturbations()][:2]
    ['min_damage x 0.8', 'min_damage x 1.25']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mhainterp.ablation import METHODS, check_method
from mhainterp.data import DEFAULT_N_EVAL
from mhainterp.stats import CORRECTIONS
from mhainterp.validation import check_float, check_int, check_option, invalid

__all__ = ["DIVISION_DEFAULTS", "DIVISION_GATES", "DivisionSettings", "resolve_settings"]

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
_SHARES = ("serve_share", "alpha", "noise", "min_selectivity_gain", "min_index")  # capped at 1


@dataclass(frozen=True)
class DivisionSettings:
    """Every knob of the division test (see :mod:`~mhainterp.specialization.whom.division`).

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
    """

    method: str = "mean"
    methods: tuple[str, ...] = METHODS
    n_eval: int = DEFAULT_N_EVAL
    min_damage: float = 0.01
    min_loss_increase: float = 0.01
    min_count: int = 10
    serve_share: float = 0.5
    min_selectivity_gain: float = 0.075
    min_index: float = 0.02
    alpha: float = 0.05
    correction: str = "holm"
    n_bootstrap: int = 200
    n_noise: int = 1
    noise: float = 0.1
    max_accuracy_change: float = 0.02
    group_similarity: float = 0.9
    n_attention: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        check_method(self.method)
        methods = tuple(self.methods) if not isinstance(self.methods, str) else (self.methods,)
        if not methods:
            raise invalid("methods", self.methods, f"one or more of {', '.join(METHODS)}")
        for m in methods:
            check_method(m)
        ordered = (self.method, *[m for m in METHODS if m in methods and m != self.method])
        object.__setattr__(self, "methods", ordered)
        check_int("n_eval", self.n_eval, minimum=1)
        check_float("min_damage", self.min_damage, minimum=0.0)
        check_float("min_loss_increase", self.min_loss_increase)
        check_int("min_count", self.min_count, minimum=1)
        check_float("serve_share", self.serve_share, minimum=0.0, maximum=1.0)
        check_float("min_selectivity_gain", self.min_selectivity_gain, minimum=0.0, maximum=1.0)
        check_float("min_index", self.min_index, minimum=0.0, maximum=1.0)
        check_float("alpha", self.alpha, minimum=0.0, maximum=1.0, inclusive=False)
        check_option("correction", self.correction, CORRECTIONS)
        check_int("n_bootstrap", self.n_bootstrap, minimum=10)
        check_int("n_noise", self.n_noise, minimum=1)
        check_float("noise", self.noise, minimum=0.0, maximum=1.0, inclusive=False)
        check_float("max_accuracy_change", self.max_accuracy_change, minimum=0.0)
        check_float("group_similarity", self.group_similarity, minimum=0.0, maximum=1.0)
        check_int("n_attention", self.n_attention, minimum=1)
        check_int("seed", self.seed, minimum=0)

    def replace(self, **changes: Any) -> DivisionSettings:
        """A validated copy with ``changes`` (unknown names raise)."""
        known = {f.name for f in dataclasses.fields(self)}
        for name in changes:
            if name not in known:
                raise invalid(name, changes[name], f"a DivisionSettings field: {sorted(known)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (``methods`` as a list), for JSON."""
        out = dataclasses.asdict(self)
        out["methods"] = list(self.methods)
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
                elif gate in _SHARES:
                    value = min(value, 0.99)
                out.append((f"{gate} x {factor}", self.replace(**{gate: value})))
        for method in METHODS:
            if method != self.method:
                out.append((f"method={method}", self.replace(method=method)))
        return out


DIVISION_DEFAULTS: dict[str, Any] = {**DivisionSettings().to_dict(), "min_gain": 0.0}
"""The defaults as a dict. ``min_gain`` (0.0) is kept for old readers of rows without a call:
the effects are now ``min_index`` (the index) and ``min_selectivity_gain`` (a head)."""

_SHARED = {"alpha": "alpha", "correction": "correction", "min_damage": "min_damage",
           "seed": "seed", "ablation_method": "method", "n_eval": None}  # fmt: skip


def resolve_settings(settings: Any = None, **changes: Any) -> DivisionSettings:
    """A :class:`DivisionSettings` from ``settings`` (DivisionSettings, None, or anything with
    :class:`~mhainterp.specialization.SpecializationSettings`' shared fields: ``alpha,
    correction, min_damage, seed, ablation_method``), then ``changes`` (None values ignored).

    Example:
        >>> resolve_settings(None, method="zero", alpha=None).method
        'zero'
    """
    if isinstance(settings, DivisionSettings):
        base = settings
    else:
        base = DivisionSettings()
        if settings is not None:
            taken = {
                mine: getattr(settings, theirs)
                for theirs, mine in _SHARED.items()
                if mine is not None and hasattr(settings, theirs)
            }
            base = base.replace(**taken)
    given = {k: v for k, v in changes.items() if v is not None}
    return base.replace(**given) if given else base
