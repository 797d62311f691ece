"""Cross-seed consistency against the head-shuffled null (each role's marginals kept), and role
profiles of a relation whose effect is undefined (a template covering the whole prefix)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.specialization import cross_seed_consistency, role_profiles, specialization_test
from mhainterp.specialization.nulls import HEADS_SHUFFLED_NULL
from mhainterp.tasks import get_task
from mhainterp.tasks.builtin import PreviousTokenTask

ROLES = ["previous", "mirror", "first", "self"]


def _roles(effects: np.ndarray) -> pd.DataFrame:
    """A run's role table from a heads x roles effect matrix."""
    return pd.DataFrame(
        [
            {"head_label": f"L0H{h}", "role": role, "effect": float(effects[h, r])}
            for h in range(effects.shape[0])
            for r, role in enumerate(ROLES)
        ]
    )


def test_every_head_sharing_one_role_is_not_consistent_beyond_the_null():
    # Independent seeds whose heads all hold one common role (with noise): matching them is
    # easy (consistency near 1) but no more than dealing the pooled heads out at random.
    rng = np.random.default_rng(0)
    p_values = []
    for replicate in range(40):
        runs = {}
        for seed in range(3):
            effects = np.zeros((4, len(ROLES)))
            effects[:, 0] = rng.uniform(0.6, 1.0, 4)
            effects[:, 1:] = rng.uniform(0.0, 0.2, (4, len(ROLES) - 1))
            runs[f"s{seed}"] = _roles(effects)
        _, summary = cross_seed_consistency(runs, n_shuffles=99, seed=replicate)
        assert summary["consistency"] > 0.95  # looks consistent ...
        assert summary["margin"] == pytest.approx(
            summary["consistency"] - summary["random_matching"]
        )
        p_values.append(summary["p_value"])
    # ... but beyond the null in no more than chance: 40 replicates, alpha 0.05.
    assert np.mean(np.array(p_values) < 0.05) <= 0.15
    assert summary["null"] == HEADS_SHUFFLED_NULL and summary["p_floor"] == pytest.approx(0.01)


def test_the_same_division_in_every_seed_is_consistent_beyond_the_null():
    # Each seed has one head per role (in another order): dealing pooled heads at random
    # rarely gives every seed one of each, so the observed 1.0 is beyond the null.
    runs = {f"s{s}": _roles(np.eye(4)[np.random.default_rng(s).permutation(4)]) for s in range(3)}
    _, summary = cross_seed_consistency(runs, n_shuffles=199)
    assert summary["consistency"] == pytest.approx(1.0)
    assert summary["random_matching"] == pytest.approx(0.25)
    assert summary["null_shuffled"] < 0.8
    assert summary["p_value"] < 0.05


def test_role_profiles_keep_a_role_with_undefined_effect():
    # A template covering the whole visible prefix has chance 1: its effect is NaN for every
    # head, and pivot_table used to drop the column (KeyError "['prefix'] not in index").
    roles = pd.DataFrame(
        {
            "head_label": ["L0H0", "L0H0", "L0H1", "L0H1"],
            "role": ["previous", "prefix", "previous", "prefix"],
            "effect": [0.9, math.nan, 0.1, math.nan],
        }
    )
    profiles = role_profiles(roles)
    assert profiles.columns.tolist() == ["previous", "prefix"]
    assert profiles.to_numpy().tolist() == [[0.9, 0.0], [0.1, 0.0]]


class _PrefixTask(PreviousTokenTask):
    """previous_token with a user relation that covers the whole causal prefix."""

    name = "previous_token_prefix"

    def compute_relations(self, tokens, padding_mask):
        relations = super().compute_relations(tokens, padding_mask)
        n, T = tokens.shape
        relations["prefix"] = torch.tril(torch.ones(T, T)).expand(n, T, T).clone()
        return relations


def test_specialization_and_consistency_with_a_whole_prefix_template():
    task = _PrefixTask(seq_len=16, d_vocab=10)
    assert get_task("previous_token", seq_len=16, d_vocab=10).relation_names != task.relation_names
    model = handbuilt_model(["previous", "uniform"], d_head=18)
    result = specialization_test(model, task, n_eval=32, n_permutations=50)
    roles = result.roles
    assert roles.loc[roles["role"] == "prefix", "effect"].isna().all()
    assert result.heads.set_index("head_label").loc["L0H0", "label"] == "previous"
    _, summary = cross_seed_consistency({"a": roles, "b": roles}, n_shuffles=20)
    assert summary["consistency"] == pytest.approx(1.0)
