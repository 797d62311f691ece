"""Selectivity and division indices, and their label-permutation nulls.

The statistics of :func:`mhainterp.specialization.whom.division.division_of_labour`, kept apart from
the engine pass and the tables: pure functions of damage profiles.

- ``entropy_selectivity``: ``1 - H(p) / log K`` of a head's clipped, normalised damage profile
  over an axis's K values (0 for even damage, 1 for one value; NaN for a head without damage);
- ``division_index``: ``1 - mean pairwise cosine`` of the damaging heads' profiles (0 when they
  damage the same values, 1 when their values are disjoint; NaN with fewer than two);
- ``exact_null_means`` / ``normal_null_means``: each value's mean damage with the values
  shuffled among the scored triples, by real permutations or from the shuffle's exact mean and
  covariance.

Shapes: H heads, N scored triples, K values of an axis, M null draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = ["division_index", "entropy_selectivity", "exact_null_means", "normal_null_means"]

_MAX_GATHER = 1 << 24  # elements of one permuted [H, m, N] block (~64 MB of float32)


def entropy_selectivity(
    profiles: Float[Tensor, "... H K"], defined: Bool[Tensor, " H"]
) -> Float[Tensor, "... H"]:
    """``1 - H(p) / log K`` of each clipped damage profile; NaN where not ``defined`` or the
    clipped profile is all zero.

    Example:
        >>> p = torch.tensor([[0.6, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2], [0.5, 0.5, 0.0, 0.0]])
        >>> entropy_selectivity(p, torch.tensor([True, True, True])).tolist()
        [1.0, 0.0, 0.5]
    """
    K = profiles.shape[-1]
    d = profiles.clamp(min=0).double()
    total = d.sum(-1, keepdim=True)
    p = d / total.clamp(min=1e-300)
    entropy = -torch.special.xlogy(p, p).sum(-1)
    index = (1.0 - entropy / math.log(K)).clamp(0.0, 1.0)
    ok = defined & (total[..., 0] > 0)
    return torch.where(ok, index, math.nan)


def division_index(
    profiles: Float[Tensor, "... H K"], defined: Bool[Tensor, " H"]
) -> Float[Tensor, "..."]:
    """``1 - mean pairwise cosine`` of the clipped profiles of the ``defined`` heads (NaN with
    fewer than 2 such heads whose clipped profile is not all zero).

    Example:
        >>> p = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.3, 0.3]])
        >>> float(division_index(p, torch.tensor([True, True, False])))
        1.0
        >>> float(division_index(p[[0, 0]], torch.tensor([True, True])))
        0.0
    """
    d = profiles.clamp(min=0).double()
    norm = d.norm(dim=-1)  # (..., H)
    use = (defined & (norm > 0)).double()
    unit = d / norm.clamp(min=1e-300)[..., None]
    cos = unit @ unit.transpose(-1, -2)  # (..., H, H)
    pair = use[..., :, None] * use[..., None, :]
    pair = pair * (1.0 - torch.eye(d.shape[-2], dtype=pair.dtype))
    n_pairs = pair.sum((-1, -2))
    mean_cos = (cos * pair).sum((-1, -2)) / n_pairs.clamp(min=1)
    return torch.where(n_pairs > 0, 1.0 - mean_cos, math.nan)


def exact_null_means(
    damage: Float[Tensor, "H N"],
    onehots: Mapping[str, Float[Tensor, "N K"]],
    m_total: int,
    generator: torch.Generator,
) -> dict[str, Float[Tensor, "M H K"]]:
    """Per axis, ``m_total`` draws of the per-value mean damage with values shuffled among the
    triples: ``mean_v = sum_i x_{h, pi(i)} [value_i = v] / n_v`` (one pi per draw, all heads)."""
    H, N = damage.shape
    counts = {axis: o.sum(0).clamp(min=1) for axis, o in onehots.items()}
    out: dict[str, list[Tensor]] = {axis: [] for axis in onehots}
    step = max(1, _MAX_GATHER // max(1, H * N))
    for start in range(0, m_total, step):
        m = min(step, m_total - start)
        perm = torch.rand(m, N, generator=generator).argsort(-1)  # (m, N)
        shuffled = damage[:, perm]  # (H, m, N)
        for axis, onehot in onehots.items():
            sums = shuffled @ onehot  # (H, m, K)
            out[axis].append((sums / counts[axis]).transpose(0, 1).double())  # (m, H, K)
    return {axis: torch.cat(parts) for axis, parts in out.items()}


def _psd_sqrt(cov: Float[Tensor, "d d"]) -> Float[Tensor, "d d"]:
    """A matrix ``R`` with ``R R^T = cov`` for a positive semi-definite ``cov``."""
    eigval, eigvec = torch.linalg.eigh(cov)
    return eigvec * eigval.clamp(min=0).sqrt()


def normal_null_means(
    damage: Float[Tensor, "H N"],
    onehots: Mapping[str, Float[Tensor, "N K"]],
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
    O(M H K) work instead of O(M H N).
    """
    x = damage.double()
    H, N = x.shape
    mean = x.mean(1)  # (H,)
    centred = x - mean[:, None]
    A = _psd_sqrt(centred @ centred.T / N)  # (H, H)
    # One float32 draw shared by the axes (sliced to each K): float64 draws cost 6x more, and
    # each axis's null only needs its own marginal (as the exact null shares one permutation).
    K_max = max((o.shape[1] for o in onehots.values()), default=0)
    Z_all = torch.randn(m_total, H, K_max, generator=generator).double()
    out = {}
    for axis, onehot in onehots.items():
        n = onehot.double().sum(0)  # (K,)
        B = _psd_sqrt((torch.diag(n) - torch.outer(n, n) / N) * N / max(N - 1, 1))
        sums = mean[:, None] * n[None] + A @ Z_all[..., : len(n)] @ B.T  # (M, H, K)
        out[axis] = sums / n.clamp(min=1)
    return out
