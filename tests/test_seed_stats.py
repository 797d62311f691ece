"""Seed statistics: exact known values, simulations showing that the final "beyond the seed
spread" rule fires at most at rate alpha when there is no true difference, and the head-count
comparisons at n = 3 and n = 30: complete separations said as such, undefined outcomes kept
out of every test, the Holm family counted, intervals that cover."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mhainterp.stats import (
    ASYMPTOTIC_MIN_SEEDS,
    beyond_seed_spread,
    compare_seeds,
    difference_interval,
    exact_permutation_p,
    fisher_p,
    holm_block,
    permutation_floor,
    seeds_for_floor,
    seeds_for_power,
    seeds_to_settle,
    smallest_p,
    welch_interval,
    welch_test,
)
from mhainterp.sweep.compare import (
    compare_head_counts,
    comparison_display,
    comparison_sentence,
    seed_power_note,
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
    result = compare_seeds([0, 0, 0], [1, 1, 1])
    assert (result["diff"], result["test"], result["separated"]) == (1.0, "exact permutation", 1)
    assert result["p"] == pytest.approx(0.1) and result["p_floor"] == pytest.approx(0.1)
    assert exact_permutation_p([1, 2], [3, 4]) == pytest.approx(2 / 6)


def test_exact_tests_known_values():
    # Fisher 3/3 yes vs 0/3 yes: 2 tables as extreme of C(6, 3) = 20 -> 0.1.
    assert fisher_p([1, 1, 1], [0, 0, 0]) == pytest.approx(0.1)
    assert fisher_p([1, 1, 0], [1, 0, 0]) == pytest.approx(1.0)
    assert smallest_p(3, 3) == pytest.approx(0.1)
    assert smallest_p(5, 5) == pytest.approx(2 / 252)
    note = seed_power_note(3, 0.05, n_comparisons=9)
    assert "cannot reach p < 0.05 (its smallest p is 0.1)" in note
    assert "Holm over 9 comparisons a difference needs p below 0.0056" in note
    assert "no difference between head counts can be shown at this n" in note
    assert "from 6 seeds per head count" in note  # 2 / C(10, 5) = 0.0079 > 0.0056 > 0.0022
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


@pytest.mark.parametrize("n", [4, 30])
def test_a_real_difference_is_found(n):
    # Power check (the test can fail): 0.5 vs 0.9 with spread 0.02, at 4 seeds (exact test,
    # floor 2 / C(8, 4) = 0.029) and 30 (Welch). At 3 seeds no test can find it (floor 0.1).
    rng = np.random.default_rng(1)
    found = sum(
        bool(
            beyond_seed_spread(
                [compare_seeds(rng.normal(0.5, 0.02, n), rng.normal(0.9, 0.02, n))["p"]]
            )[0]
        )
        for _ in range(200)
    )
    assert found == 200


# ----------------------------------------------------------------------------- head counts


def _runs(values: dict[int, list[float]], column: str = "value", task: str = "t") -> pd.DataFrame:
    """A per-run table: ``{h: one value per seed}`` of one measure."""
    return pd.DataFrame(
        [
            {"task": task, "n_heads": h, "seed": s, column: v}
            for h, seeds in values.items()
            for s, v in enumerate(seeds)
        ]
    )


def test_test_and_interval_suit_n():
    # Below 10 seeds per group: exact permutation test + Welch t interval; from 10: Welch +
    # bootstrap. The switch needs both groups large.
    assert ASYMPTOTIC_MIN_SEEDS == 10
    small = compare_seeds([0.1, 0.2, 0.3], [0.4, 0.5, 0.7])
    assert (small["test"], small["ci_method"]) == ("exact permutation", "Welch t")
    rng = np.random.default_rng(0)
    large = compare_seeds(rng.normal(0, 1, 30), rng.normal(0, 1, 30))
    assert (large["test"], large["ci_method"]) == ("Welch", "bootstrap")
    assert math.isnan(large["p_floor"])
    mixed = compare_seeds(rng.normal(0, 1, 3), rng.normal(0, 1, 30))
    assert (mixed["test"], mixed["ci_method"]) == ("exact permutation", "Welch t")
    assert mixed["p_floor"] == pytest.approx(1 / math.comb(33, 3))  # unequal: no mirror split
    # 9 vs 9: 48,620 splits, all enumerated (floor exact); 30 vs 30 would be drawn at random.
    assert permutation_floor(9, 9) == pytest.approx(smallest_p(9, 9))
    assert permutation_floor(30, 30) == pytest.approx(1 / 50_001)


def test_welch_interval_known_value():
    # a = [1, 2, 3], b = [4, 5, 6]: diff 3, se sqrt(2/3), df 4, t(0.975, 4) = 2.7764.
    low, high = welch_interval([1, 2, 3], [4, 5, 6])
    assert (low, high) == pytest.approx(
        (3 - 2.7764 * math.sqrt(2 / 3), 3 + 2.7764 * math.sqrt(2 / 3)), abs=1e-3
    )
    assert all(math.isnan(v) for v in welch_interval([1, 1, 1], [2, 2, 2]))  # no spread


def test_intervals_contain_zero_for_identical_groups_and_exclude_it_for_a_shift():
    same = [0.2, 0.25, 0.3]
    small = difference_interval(same, same)
    assert small["low"] < 0 < small["high"]
    rng = np.random.default_rng(3)
    a = rng.normal(0.5, 0.1, 30)
    large = difference_interval(a, a.copy())
    assert large["method"] == "bootstrap" and large["low"] <= 0 <= large["high"]
    shifted = difference_interval(a, rng.normal(0.6, 0.1, 30))  # one std apart
    assert shifted["method"] == "bootstrap" and 0 < shifted["low"] < 0.1 < shifted["high"]


@pytest.mark.parametrize("n", [3, 30])
def test_interval_coverage_near_95_percent(n):
    # Normal seeds, no true difference: Welch t (n = 3) and the percentile bootstrap (n = 30)
    # contain the true difference 0 in about 95% of 400 studies (binomial sd 1.1%).
    rng = np.random.default_rng(n)
    covered = 0
    for _ in range(400):
        result = difference_interval(rng.normal(0, 1, n), rng.normal(0, 1, n))
        covered += result["low"] <= 0 <= result["high"]
    assert 0.91 <= covered / 400 <= 0.99, covered


def test_a_complete_separation_at_3_seeds_states_the_floor_never_within_the_spread():
    # The reverse case: needed share 1.00 ± 0.00 at h = 1, 0.00 ± 0.00 at h = 4 (and
    # the backed-up share the other way): both groups without spread, every seed apart.
    runs = _runs({1: [1.0, 1.0, 1.0], 4: [0.0, 0.0, 0.0]}, "needed").merge(
        _runs({1: [0.0, 0.0, 0.0], 4: [1.0, 1.0, 1.0]}, "backed_up")
    )
    table = compare_head_counts(runs, [("needed", "needed share"), ("backed_up", "backed-up")])
    row = table.iloc[0]
    assert (row["test"], row["separated"], row["beyond"]) == ("exact permutation", -1, False)
    assert row["p"] == pytest.approx(0.1) and row["p_floor"] == pytest.approx(0.1)
    assert row["p_holm"] == pytest.approx(0.2) and row["n_holm"] == 2
    assert row["verdict"] == "no difference shown (complete separation at the floor)"
    text = comparison_sentence(row)
    assert "every seed at h=4 is below every seed at h=1, but with 3 seeds each the exact " in text
    assert "test's floor is p = 0.1 (Holm p = 0.2 over 2): no difference shown" in text
    assert "within the seed spread" not in text
    assert "no seed spread" in text  # no interval: the std is 0 in both groups
    # The division index from 4 to 8 heads: every seed at h = 8 above every seed at h = 4.
    index = compare_head_counts(
        _runs({4: [0.07, 0.08, 0.09], 8: [0.22, 0.26, 0.30]}), [("value", "index by token")]
    ).iloc[0]
    assert (
        "every seed at h=8 exceeds every seed at h=4, but with 3 seeds each the exact "
        "test's floor is p = 0.1" in comparison_sentence(index)
    )
    assert index["ci_method"] == "Welch t" and 0 < index["ci_low"] < 0.17 < index["ci_high"]
    # The same separation at 6 seeds each reaches 2 / C(12, 6) = 0.0022: beyond, even after
    # Holm over 2.
    six = compare_head_counts(
        _runs({1: [1.0] * 6, 4: [0.0] * 6}, "needed").merge(
            _runs({1: [0.0] * 6, 4: [1.0] * 6}, "backed_up")
        ),
        [("needed", "needed share"), ("backed_up", "backed-up")],
    ).iloc[0]
    assert six["p"] == pytest.approx(2 / 924) and six["p_holm"] == pytest.approx(4 / 924)
    assert six["verdict"] == "h=4 lower" and "beyond the seed spread" in comparison_sentence(six)


def test_an_undefined_h1_outcome_is_kept_out_of_every_test():
    # h = 1 has no division index (NaN), never 0: the index is compared from h = 4 on.
    runs = _runs({1: [math.nan] * 3, 4: [0.1, 0.12, 0.14], 8: [0.3, 0.25, 0.28]}, "index")
    runs["accuracy"] = _runs({1: [0.6, 0.62, 0.61], 4: [0.99] * 3, 8: [1.0] * 3})["value"]
    table = compare_head_counts(runs, [("accuracy", "accuracy"), ("index", "division index")])
    pairs = list(zip(table["quantity"], table["n_heads_a"], table["n_heads_b"], strict=True))
    assert pairs == [("accuracy", 1, 4), ("accuracy", 4, 8), ("division index", 4, 8)]
    assert set(table["n_holm"]) == {3}  # no h = 1 index row in the family
    # One seed undefined at h = 4: left out of that group (n 2), not counted as 0.
    runs.loc[(runs["n_heads"] == 4) & (runs["seed"] == 0), "index"] = math.nan
    row = compare_head_counts(runs, [("index", "division index")]).iloc[0]
    assert (row["n_a"], row["mean_a"]) == (2, pytest.approx(0.13))
    # The same for yes/no: "cannot tell" (NaN) is not "no".
    undefined = compare_seeds([math.nan] * 3, [1.0, 1.0, 1.0], "yes/no")
    assert math.isnan(undefined["p"]) and undefined["n_a"] == 0
    assert undefined["test"] == "none (n < 2)"
    counted_as_no = compare_seeds([0.0] * 3, [1.0] * 3, "yes/no")  # what it used to be
    assert counted_as_no["p"] == pytest.approx(0.1)


def test_the_holm_count_is_the_number_of_comparisons_tested_and_printed():
    runs = _runs({1: [0.5, 0.6, 0.55], 2: [0.7, 0.72, 0.71], 4: [0.9, 0.92, 0.91]}, "acc")
    runs["share"] = [1.0, 1.0, 1.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    runs["one_seed"] = [1.0, math.nan, math.nan, 2.0, math.nan, math.nan, 3.0, 4.0, math.nan]
    measures = [("acc", "accuracy"), ("share", "needed share"), ("one_seed", "a count")]
    table = compare_head_counts(runs, measures)
    tested = table[table["p"].notna()]
    assert len(table) == 6 and len(tested) == 4  # pairs with a 1-seed group are not tested
    assert set(table["n_holm"]) == {4}
    assert tested["p_holm"].tolist() == pytest.approx(holm_block(tested["p"].tolist()))
    shown = comparison_display(table)
    assert "Holm p (over 4)" in shown.columns and (shown["Holm p (over 4)"] != "").sum() == 4
    assert all("over 4" in comparison_sentence(r) for _, r in tested.iterrows())
    untested = comparison_sentence(table[table["p"].isna()].iloc[0])
    assert untested.endswith("too few seeds to compare (n = 1 and 1)")
    assert len(shown.columns) <= 8


def test_30_seeds_reach_significance_and_3_cannot():
    rng = np.random.default_rng(7)
    a30, b30 = rng.normal(0.10, 0.05, 30), rng.normal(0.16, 0.05, 30)
    runs = pd.concat([_runs({4: list(a30), 8: list(b30)}, "index")])
    row = compare_head_counts(runs, [("index", "division index")]).iloc[0]
    assert row["test"] == "Welch" and row["p"] < 1e-4 and row["beyond"]
    assert row["ci_method"] == "bootstrap" and row["ci_low"] > 0
    assert row["verdict"] == "h=8 higher" and math.isnan(row["n_to_settle"])
    # The first three seeds of each: the same direction, but 3 seeds cannot show it.
    small = compare_head_counts(_runs({4: list(a30[:3]), 8: list(b30[:3])}, "index"),
                                [("index", "division index")]).iloc[0]  # fmt: skip
    assert small["test"] == "exact permutation" and small["p"] >= 0.1 and not small["beyond"]
    # ... and it says what n would settle it: the exact floor of 1 comparison needs 4 seeds;
    # a t test of the observed effect at 80% power needs its own n, at least that.
    assert small["n_to_settle"] >= seeds_for_floor(0.05, 1)


def test_what_n_settles_known_values():
    assert seeds_for_floor(0.05, 1) == 4  # 2 / C(8, 4) = 0.029; 2 / C(6, 3) = 0.1
    assert seeds_for_floor(0.05, 13) == 6  # 2 / C(12, 6) = 0.0022 < 0.0038 < 2 / C(10, 5)
    assert seeds_for_power(1.0, 1.0) == 17  # Cohen's d = 1, alpha 0.05, power 0.8
    assert seeds_for_power(0.5, 1.0) == 64  # the textbook 64 per group for d = 0.5
    assert seeds_for_power(0.0, 1.0) == math.inf and seeds_for_power(1.0, 0.0) == 2
    assert seeds_to_settle(1.0, 0.0, 0.0, 0.05, 13) == 6  # no spread: the floor decides
    assert seeds_to_settle(0.5, 1.0, 1.0, 0.05, 1) == 64  # above 10: Welch, the t test's n


def test_power_note_says_what_n_gives():
    three = seed_power_note(3, 0.05, 13)
    assert "its smallest p is 0.1" in three and "Welch t intervals" in three
    assert "from 6 seeds per head count" in three
    thirty = seed_power_note(30, 0.05, 13)
    assert "Welch's t test and 95% percentile bootstrap intervals" in thirty
    assert "could reach p = 1.7e-17, so the floor no longer binds" in thirty
    assert "needs p below 0.0038" in thirty


@pytest.mark.parametrize(("n_a", "n_b"), [(2, 3), (3, 4), (4, 6), (3, 3), (5, 5)])
def test_the_exact_floor_is_the_smallest_p_a_complete_separation_gives(n_a, n_b):
    """A complete separation of distinct seeds gives exact p = 1 / C(n, n_a) at unequal sizes
    (no other split is as extreme) and 2 / C at equal ones (its mirror is): the floor that
    the sentences name "the smallest n_a vs n_b seeds allow" is that p, never above it."""
    low, high = np.arange(n_a) / 10, 1 + np.arange(n_b) / 10
    p = exact_permutation_p(low, high)
    assert p == pytest.approx((2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a))
    assert smallest_p(n_a, n_b) == pytest.approx(p)
    result = compare_seeds(low, high)
    assert result["p"] == pytest.approx(result["p_floor"])
    yes_no = compare_seeds(np.zeros(n_a), np.ones(n_b), kind="yes/no")
    assert yes_no["p"] == pytest.approx(yes_no["p_floor"])


def test_an_undefined_seed_is_left_out_and_an_infinite_one_refused():
    """NaN compared with anything is False: left in, it made every split look less extreme
    and the exact p 0. Left out, [0.5, nan, 0.6] vs [0.8, 0.9, 1.0] is 2 vs 3 seeds, complete
    separation: 1 / C(5, 2). An infinite seed value has no mean to test: refused."""
    assert exact_permutation_p([0.5, math.nan, 0.6], [0.8, 0.9, 1.0]) == pytest.approx(1 / 10)
    with pytest.raises(ParameterError, match="finite"):
        compare_seeds([0.5, 0.6, math.inf], [0.8, 0.9, 1.0])


def test_a_difference_whose_own_p_passes_is_said_to_fail_after_holm_not_within_the_spread():
    """6 vs 6 seeds overlapping by one (exact p = 0.011) in a family of 8 (Holm p = 0.087): not
    beyond the spread after Holm, but not "within the seed spread" either. A difference whose
    own p does not pass (the other seven) still is."""
    h4, h8 = [0.10, 0.12, 0.14, 0.16, 0.18, 0.25], [0.20, 0.22, 0.24, 0.26, 0.28, 0.30]
    runs = pd.DataFrame(
        [{"task": "t", "n_heads": h, "m0": v} for h, vs in ((4, h4), (8, h8)) for v in vs]
    )
    for k in range(1, 8):  # seven comparisons with nothing to find, in the same family
        runs[f"m{k}"] = [0.5 + 0.01 * ((i * 7 + k) % 5) for i in range(12)]
    measures = [(f"m{k}", f"index {k}", "whom") for k in range(8)]
    rows = compare_head_counts(runs, measures)
    first = rows.iloc[0]
    assert first["n_holm"] == 8 and first["p"] < 0.05 < first["p_holm"]
    assert first["verdict"] == "no difference shown after Holm"
    sentence = comparison_sentence(first)
    assert "not shown after Holm (its own p passes, the family's does not: exact" in sentence
    assert "within the seed spread" not in sentence
    rest = rows.iloc[1:]
    assert (rest["p"] >= 0.05).all()
    assert (rest["verdict"] == "no difference shown (within the seed spread)").all()


def test_a_comparison_sentence_gives_each_side_its_n():
    """Mean ± std without n hides that a seed dropped out (undefined): each side says its n."""
    runs = pd.DataFrame(
        [{"task": "t", "n_heads": 4, "m": v} for v in (0.1, 0.2, math.nan, 0.3)]
        + [{"task": "t", "n_heads": 8, "m": v} for v in (0.5, 0.6, 0.7, 0.8)]
    )
    sentence = comparison_sentence(compare_head_counts(runs, [("m", "index")]).iloc[0])
    assert sentence.startswith("index 0.20 ± 0.10 (h=4, n=3) → 0.65 ± 0.13 (h=8, n=4): ")
