"""Seed statistics: exact known values, and simulations showing that the final "beyond the seed
spread" rule fires at most at rate alpha when there is no true difference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mhainterp.stats import (
    beyond_seed_spread,
    compare_seeds,
    exact_permutation_p,
    fisher_p,
    holm_block,
    seed_power_note,
    smallest_p,
    welch_test,
)
from mhainterp.validation import ParameterError

ALPHA = 0.05
N_SIM = 2000
"""Simulated studies per case; the binomial error of a rate of 0.05 is then 0.005."""


def _binomial_bound(rate: float, n: int) -> float:
    """rate + 3 binomial standard errors: a false-positive rate above this is not noise."""
    return rate + 3 * math.sqrt(rate * (1 - rate) / n)


def test_zero_variance_welch_is_exact_not_zero():
    # scipy says p = 0 for two constant groups that differ; the exact permutation p of 3 vs 3
    # is 2 / C(6, 3) = 0.1 (only the two most extreme splits are as far apart).
    assert welch_test([1, 1, 1], [0, 0, 0]) == (math.inf, pytest.approx(0.1))
    assert compare_seeds([0, 0, 0], [1, 1, 1]) == {
        "diff": 1.0,
        "p": pytest.approx(0.1),
        "test": "exact permutation",
    }
    assert exact_permutation_p([1, 2], [3, 4]) == pytest.approx(2 / 6)


def test_exact_tests_known_values():
    # Fisher 3/3 yes vs 0/3 yes: 2 tables as extreme of C(6, 3) = 20 -> 0.1.
    assert fisher_p([1, 1, 1], [0, 0, 0]) == pytest.approx(0.1)
    assert fisher_p([1, 1, 0], [1, 0, 0]) == pytest.approx(1.0)
    assert smallest_p(3, 3) == pytest.approx(0.1)
    assert smallest_p(5, 5) == pytest.approx(2 / 252)
    note = seed_power_note(3, 0.05, n_comparisons=9)
    assert "cannot reach p < 0.05 (its smallest p is 0.1)" in note
    assert "below 0.0056" in note
    assert "can reach" in seed_power_note(5)


def test_holm_over_the_block():
    assert holm_block([0.01, 0.04, 0.03, math.nan]) == [
        pytest.approx(0.03),
        pytest.approx(0.06),
        pytest.approx(0.06),
        None,
    ]
    assert beyond_seed_spread([0.01, 0.04, 0.03, math.nan]) == [True, False, False, None]
    with pytest.raises(ParameterError, match="alpha"):
        beyond_seed_spread([0.5], alpha=2.0)
    with pytest.raises(ParameterError, match="kind"):
        compare_seeds([0, 1], [1, 0], kind="binary")


def _false_rate(draw, kind: str, n_comparisons: int = 1) -> float:
    """Share of simulated studies where some comparison of a block is called beyond."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(N_SIM):
        p = [compare_seeds(*draw(rng), kind)["p"] for _ in range(n_comparisons)]
        hits += any(bool(b) for b in beyond_seed_spread(p, ALPHA))
    return hits / N_SIM


def test_no_true_difference_normal_data_fires_at_most_alpha():
    rate = _false_rate(lambda rng: (rng.normal(0.8, 0.05, 3), rng.normal(0.8, 0.05, 3)), "graded")
    assert rate <= _binomial_bound(ALPHA, N_SIM), rate


@pytest.mark.slow
def test_no_true_difference_block_of_nine_fires_at_most_alpha():
    # The case: 9 comparisons in one Findings line; family-wise after Holm.
    def draw(rng):
        return rng.normal(0.0, 1.0, 3), rng.normal(0.0, 1.0, 3)

    rate = _false_rate(draw, "graded", n_comparisons=9)
    assert rate <= _binomial_bound(ALPHA, N_SIM), rate


@pytest.mark.parametrize("share", [0.3, 0.5, 0.7])
def test_no_true_difference_yes_no_fires_at_most_alpha(share):
    def draw(rng):
        return (rng.random(3) < share).astype(float), (rng.random(3) < share).astype(float)

    rate = _false_rate(draw, "yes/no")
    assert rate <= _binomial_bound(ALPHA, N_SIM), rate


def test_a_real_difference_is_found():
    # Power check (the test can fail): 3 seeds at 0.5 vs 0.9 with spread 0.02.
    rng = np.random.default_rng(1)
    found = sum(
        bool(
            beyond_seed_spread(
                [compare_seeds(rng.normal(0.5, 0.02, 3), rng.normal(0.9, 0.02, 3))["p"]]
            )[0]
        )
        for _ in range(200)
    )
    assert found >= 190
