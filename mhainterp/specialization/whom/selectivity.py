"""Selectivity, division index and the same-function distance: pure functions of profiles.

The statistics of :func:`mhainterp.specialization.whom.division.division_of_labour`, kept apart
from the engine passes and the tables (formulas in that module's docstring):

- ``effective_values``: ``n_eff = exp(H(p))`` of a clipped, normalised profile;
- ``helped_share``: the share of a profile's absolute damage that is negative, which the
  clipping leaves out;
- ``implied_index``: the index along one axis that the profiles along another give through
  the data alone (where the axes go together);
- ``selectivity``: ``1 - n_eff / K`` (the share of values spared; K-invariant; one value of K
  scores ``1 - 1/K``);
- ``division_index``: ``1 - mean pairwise cosine`` of the defined units' profiles;
- ``same_function_distance``: ``1 - cos`` between each unit's profiles in two copies of the
  model.
- ``normal_null_means``: each value's mean damage with the values shuffled among the scored
  triples, from the shuffle's exact mean and covariance (the heads' selectivity null for
  sampling noise);
- ``interval`` / ``upper``: bootstrap quantiles (row 0 of a resampled table is the observed).

Shapes: U units (heads or groups), K values of an axis, B resamples (leading dims ``...``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mhainterp.runtime import DRAW_DEVICE

__all__ = [
    "SELECTIVITY_MEANING",
    "division_index",
    "effective_values",
    "helped_share",
    "implied_index",
    "interval",
    "normal_null_means",
    "same_function_distance",
    "selectivity",
    "upper",
]

SELECTIVITY_MEANING = (
    "Selectivity (1 − n_eff/K, with n_eff the values a head's damage covers, counted evenly, "
    "of an axis's K values) is 0 for even damage and 1 − m/K for m values damaged alike: "
    "1 − 1/K for one value (0.9 of 10), never 1"
)
"""What a selectivity value means, in the words every report and caption reuses (a test
checks the one-value figure against :func:`selectivity`)."""


def effective_values(
    profiles: Float[Tensor, "... U K"], defined: Bool[Tensor, " U"]
) -> Float[Tensor, "... U"]:
    """``exp(H(p))`` with ``p = d / sum(d)`` of each clipped profile: the number of values it
    serves, counted evenly (1 for one value, m for m values served alike); NaN where not
    ``defined`` or the clipped profile is all zero.

    Example:
        >>> p = torch.tensor([[0.6, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2], [0.5, 0.5, 0.0, 0.0]])
        >>> effective_values(p, torch.tensor([True, True, True])).tolist()
        [1.0, 4.0, 2.0]
    """
    d = profiles.clamp(min=0).double()
    total = d.sum(-1, keepdim=True)
    p = d / total.clamp(min=1e-300)
    n_eff = torch.exp(-torch.special.xlogy(p, p).sum(-1))
    return torch.where(defined & (total[..., 0] > 0), n_eff, math.nan)


def selectivity(
    profiles: Float[Tensor, "... U K"],
    defined: Bool[Tensor, " U"],
    n_values: int | Tensor | None = None,
) -> Float[Tensor, "... U"]:
    """``1 - n_eff / K``: the share of the K values a profile spares (``n_values``: K when the
    profiles are padded with zeros past their values, broadcast against ``[..., U]``; default
    the last dimension). 0 for even damage; a profile on one value scores ``1 - 1/K``, never 1.

    Example:
        >>> two = torch.tensor([[1.0, 0.0]])
        >>> eight = torch.tensor([[1.0] * 4 + [0.0] * 4])
        >>> ten = torch.tensor([[0.0] + [1.0] * 9])
        >>> yes = torch.tensor([True])
        >>> [round(float(selectivity(p, yes)[0]), 3) for p in (two, eight, ten)]
        [0.5, 0.5, 0.1]
    """
    K = profiles.shape[-1] if n_values is None else n_values
    return 1.0 - effective_values(profiles, defined) / K


def helped_share(profiles: Float[Tensor, "... U K"]) -> Float[Tensor, "... U"]:
    """The share of a profile's absolute damage that is negative: the values on which removing
    the head *helps*. The selectivity and the division index clip these at 0, so this is what
    they leave out (``[-5, 0.02, 0]`` scores a near-maximal selectivity on a damage of 0.02).
    Given for every profile, ``defined`` or not (a harmful head's all-negative profile is not
    defined, and it is the one this column must show); NaN where the profile is all zero.

    Example:
        >>> p = torch.tensor([[-1.0, 1.0], [-5.0, 0.02], [0.4, 0.1]])
        >>> [round(float(v), 3) for v in helped_share(p)]
        [0.5, 0.996, 0.0]
    """
    d = profiles.double()
    magnitude = d.abs().sum(-1)
    share = (-d).clamp(min=0).sum(-1) / magnitude.clamp(min=1e-300)
    return torch.where(magnitude > 0, share, math.nan)


def implied_index(
    given: Float[Tensor, "A A K K"],
    profiles: Float[Tensor, "A U K"],
    defined: Bool[Tensor, " U"],
    keep: Bool[Tensor, "A K"],
) -> Float[Tensor, "A A"]:
    """``[x, y]``: the division index along axis ``x`` that the units' profiles along axis
    ``y`` give through the data alone, ``d_u(x_i) = sum_j P(y_j | x_i) d_u(y_j)``
    (``given``, :func:`~.profiles.value_given`): what a division along ``y`` shows along ``x``
    where the two go together in the data (positions and target classes often do). NaN on
    the diagonal and where the index is undefined.

    Example:
        >>> given = torch.tensor([[[[1.0, 0], [0, 1]], [[1, 0], [0, 1]]],
        ...                       [[[1, 0], [0, 1]], [[1, 0], [0, 1]]]])  # y fixed by x
        >>> p = torch.tensor([[[1.0, 0], [0, 1]], [[0.5, 0.5], [0.5, 0.5]]])
        >>> out = implied_index(given, p, torch.tensor([True, True]), torch.ones(2, 2).bool())
        >>> [[round(float(v), 6) for v in row] for row in out]
        [[nan, 0.0], [1.0, nan]]
    """
    implied = torch.einsum("xyij,yuj->xyui", given.double(), profiles.double())  # (A, A, U, K)
    implied = torch.where(keep[:, None, None, :], implied, 0.0)  # x's own kept values
    index = division_index(implied, defined)
    diagonal = torch.eye(len(keep), dtype=torch.bool, device=index.device)
    return torch.where(diagonal, math.nan, index)


def _unit(profiles: Tensor) -> Tensor:
    d = profiles.clamp(min=0).double()
    return d / d.norm(dim=-1, keepdim=True).clamp(min=1e-300)


def division_index(
    profiles: Float[Tensor, "... U K"], defined: Bool[Tensor, "... U"]
) -> Float[Tensor, "..."]:
    """``1 - mean pairwise cosine`` of the clipped profiles of the ``defined`` units (NaN with
    fewer than 2 such units whose clipped profile is not all zero). ``defined`` broadcasts
    against the leading dims (one mask per method of a stack).

    Example:
        >>> p = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.3, 0.3]])
        >>> float(division_index(p, torch.tensor([True, True, False])))
        1.0
        >>> float(division_index(p[[0, 0]], torch.tensor([True, True])))
        0.0
    """
    d = profiles.clamp(min=0).double()
    use = (defined & (d.norm(dim=-1) > 0)).double()  # (..., U)
    unit = _unit(profiles)
    cos = unit @ unit.transpose(-1, -2)  # (..., U, U)
    pair = use[..., :, None] * use[..., None, :]
    pair = pair * (1.0 - torch.eye(d.shape[-2], dtype=pair.dtype, device=pair.device))
    n_pairs = pair.sum((-1, -2))
    mean_cos = (cos * pair).sum((-1, -2)) / n_pairs.clamp(min=1)
    return torch.where(n_pairs > 0, 1.0 - mean_cos, math.nan)


def same_function_distance(
    first: Float[Tensor, "... U K"], second: Float[Tensor, "... U K"], defined: Bool[Tensor, " U"]
) -> Float[Tensor, "..."]:
    """Mean over the ``defined`` units of ``1 - cos`` between a unit's profile in ``first``
    and in ``second`` (two copies of the model, one or both noisy): the division index that
    heads doing the same job score. A profile that is all zero in one copy only counts as
    distance 1 (nothing in common); a unit all zero in both is left out; NaN without units.

    Example:
        >>> a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> b = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
        >>> round(float(same_function_distance(a, b, torch.tensor([True, True]))), 4)
        0.1464
    """
    cos = (_unit(first) * _unit(second)).sum(-1)  # (..., U); 0 where either is all zero
    seen = (first.clamp(min=0).sum(-1) > 0) | (second.clamp(min=0).sum(-1) > 0)
    use = (defined & seen).double()  # a unit that damages nothing in both copies says nothing
    n = use.sum(-1)
    return torch.where(n > 0, ((1.0 - cos) * use).sum(-1) / n.clamp(min=1), math.nan)


def _psd_sqrt(cov: Float[Tensor, "d d"]) -> Float[Tensor, "d d"]:
    """A matrix ``R`` with ``R R^T = cov`` for a positive semi-definite ``cov``."""
    eigval, eigvec = torch.linalg.eigh(cov)
    return eigvec * eigval.clamp(min=0).sqrt()


def normal_null_means(
    damage: Float[Tensor, "H N"],
    counts: Mapping[str, Int[Tensor, " K"]],
    m_total: int,
    generator: torch.Generator,
) -> dict[str, Float[Tensor, "M H K"]]:
    """The same null drawn from its normal approximation with the exact permutation moments.

    Shuffling the values among the triples makes the per-value sums ``S_v`` (heads stacked) the
    sums of a partition of the N triples into groups of sizes ``n_v``, drawn without
    replacement. Their mean is ``n_v xbar`` and their covariance is a Kronecker product::

        Cov(S_v[h], S_u[g]) = sigma_hg * (n_v delta_vu - n_v n_u / N) * N / (N - 1)

    with ``sigma`` the heads' covariance of the damage over the triples. Draws are
    ``n xbar + A Z B^T`` (``A A^T = sigma``, ``B B^T`` the value part, ``Z`` standard normal):
    O(M H K) work instead of O(M H N). ``counts``: per axis, the ``n_v`` (triples of each
    value; they sum to N).
    """
    x = damage.double()
    H, N = x.shape
    mean = x.mean(1)  # (H,)
    centred = x - mean[:, None]
    A = _psd_sqrt(centred @ centred.T / N)  # (H, H)
    out = {}
    for axis, per_value in counts.items():
        n = per_value.double()  # (K,)
        B = _psd_sqrt((torch.diag(n) - torch.outer(n, n) / N) * N / max(N - 1, 1))
        # Each axis its own float32 draw, in order (float64 draws cost 6x more): the same
        # numbers as one call per axis with the generator passed on.
        Z = torch.randn(m_total, H, len(n), generator=generator, device=DRAW_DEVICE)
        Z = Z.to(x.device, torch.float64)
        sums = mean[:, None] * n[None] + A @ Z @ B.T  # (M, H, K)
        out[axis] = sums / n.clamp(min=1)
    return out


def interval(draws: Float[Tensor, " B ..."], alpha: float) -> tuple[Tensor, Tensor]:
    """The ``1 - alpha`` percentile interval of the resamples ``draws[1:]`` (NaN-aware)."""
    q = torch.tensor([alpha / 2, 1 - alpha / 2], dtype=torch.float64, device=draws.device)
    low, high = torch.nanquantile(draws[1:].double(), q, dim=0)  # one sort for both ends
    return low, high


def upper(draws: Float[Tensor, " B ..."], alpha: float) -> Tensor:
    """The upper ``1 - alpha`` quantile of the resamples ``draws[1:]`` (NaN-aware)."""
    return torch.nanquantile(draws[1:].double(), 1 - alpha, dim=0)
