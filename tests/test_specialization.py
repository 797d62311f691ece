"""Known answers for the specialization test: hand-built heads are labelled exactly, untrained
heads are not called specialized, copies are redundant, the corrections match hand-computed
values, the nulls match their definitions, and the verdict text follows the numbers."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from torch.testing import assert_close

from mhainterp.ablation import ablate, head_importance, pairwise_ablation
from mhainterp.capture import visible_keys
from mhainterp.config import ModelConfig
from mhainterp.figures.specialization import (
    causal_matrix_figure,
    consistency_figure,
    role_heatmap,
    save_specialization_figures,
    specialization_vs_heads,
)
from mhainterp.model import HookedMHATransformer
from mhainterp.model.handbuilt import handbuilt_model, selector_width_model
from mhainterp.specialization import (
    HEAD_COLUMNS,
    THRESHOLDS,
    RunVerdict,
    SpecializationResult,
    SpecializationSettings,
    TargetDamage,
    Verdict,
    adjust_pvalues,
    attach_division,
    benjamini_hochberg,
    causal_selectivity,
    combine_nulls,
    cross_seed_consistency,
    holm,
    init_models,
    init_p_values,
    label_stability,
    model_selectivity,
    nested_roles,
    permutation_null_samples,
    profile_similarity,
    redundancy_groups,
    redundancy_pairs,
    role_scores,
    role_templates,
    selectivity_index,
    similar_groups,
    specialization_summary,
    specialization_test,
    stability_summary,
    summary_columns,
    target_damage,
)
from mhainterp.specialization.seeds.summary import display_summary
from mhainterp.specialization.verdict.stability import RunEvidence, relabel, run_stability
from mhainterp.specialization.where.nulls import MIN_INIT_ONLY_POOL
from mhainterp.specialization.where.roles import RoleSums, role_frame
from mhainterp.tasks import get_task, uniform_template
from mhainterp.tasks.builtin import CountPreviousTask
from mhainterp.training import build_model, evaluate

T, V = 16, 10


# ----------------------------------------------------------------------------- builders


def multi_relation_model(kinds: list[str], d_head: int = 16) -> HookedMHATransformer:
    """A hand-set 1-layer model for ``multi_relation`` (3 targets, bidirectional).

    Kinds: ``"previous"`` (attend to q-1, copy the token into block A, read by the previous
    target), ``"mirror"`` (attend to T-1-q, copy into block B, read by the mirror target),
    ``"mix"`` (attend half to q-1 and half to T-1-q, copy into block A), ``"dead"`` (all
    zero). The count target is never computed (its logits are 0), so no head's removal can
    change it. mhainterp.model.handbuilt has one target only, hence this builder.
    """
    n, n_out = len(kinds), max(V + 1, T)
    d_model = n * d_head
    cfg = ModelConfig(
        d_model=d_model,
        n_heads=n,
        n_layers=1,
        n_ctx=T,
        d_vocab=V,
        d_vocab_out=n_out,
        n_targets=3,
        causal=False,
        attn_only=True,
        normalization_type=None,
        device="cpu",
    )
    model = HookedMHATransformer(cfg)
    block = {"previous": V + T, "mirror": V + T + V, "mix": V + T}  # start of each copy block
    scale = 30.0 * d_head**0.5
    W_Q, W_K, W_V = (torch.zeros(n, d_model, d_head) for _ in range(3))
    W_O = torch.zeros(n, d_head, d_model)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.embed.weight[:, :V] = torch.eye(V)
        model.pos_embed.weight[:, V : V + T] = torch.eye(T)
        for h, kind in enumerate(kinds):
            if kind == "dead":
                continue
            for q in range(T):
                keys = {"previous": [q - 1], "mirror": [T - 1 - q], "mix": [q - 1, T - 1 - q]}
                for k in keys[kind]:
                    if k >= 0:
                        W_Q[h, V + q, k] = scale
            W_K[h, V : V + T, :T] = torch.eye(T)
            W_V[h, :V, :V] = torch.eye(V)
            W_O[h, :V, block[kind] : block[kind] + V] = torch.eye(V)
        attn = model.blocks[0].attn
        attn.W_Q, attn.W_K, attn.W_V, attn.W_O = W_Q, W_K, W_V, W_O
        unembed = model.unembed.weight  # (3 * n_out, d_model), target-major
        for t, kind in enumerate(["previous", "mirror"]):
            rows = slice(t * n_out, t * n_out + V)
            unembed[rows, block[kind] : block[kind] + V] = 20.0 * torch.eye(V)
        unembed[V, V] = 40.0  # previous target, class V ("no previous token") at t = 0
    return model.eval()


@pytest.fixture(scope="module")
def multi_task():
    return get_task("multi_relation", seq_len=T, d_vocab=V)


@pytest.fixture(scope="module")
def previous_task():
    return get_task("previous_token", seq_len=T, d_vocab=V)


@pytest.fixture(scope="module")
def hand_result(multi_task):
    return specialization_test(multi_relation_model(["previous", "mirror", "dead"]), multi_task)


# ----------------------------------------------------------------------------- corrections


def test_holm_and_bh_match_hand_computed_values():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> cummax.
    np.testing.assert_allclose(holm(p), [0.03, 0.06, 0.06, 0.02])
    # BH: 4p/rank = 0.02, 0.02, 0.04, 0.04 -> cummin from the top.
    np.testing.assert_allclose(benjamini_hochberg(p), [0.02, 0.04, 0.04, 0.02])
    p = [0.01, 0.02, 0.03, 0.04, 0.05]
    np.testing.assert_allclose(holm(p), [0.05, 0.08, 0.09, 0.09, 0.09])
    np.testing.assert_allclose(benjamini_hochberg(p), [0.05] * 5)
    # Adjusted values are capped at 1.
    np.testing.assert_allclose(holm([0.6, 0.9]), [1.0, 1.0])


def test_corrections_leave_nan_out_of_the_family():
    np.testing.assert_allclose(holm([0.04, math.nan, 0.01]), [0.04, math.nan, 0.02])
    np.testing.assert_allclose(benjamini_hochberg([0.04, math.nan, 0.01]), [0.04, math.nan, 0.02])
    np.testing.assert_allclose(adjust_pvalues([0.2, 0.01], "none"), [0.2, 0.01])
    with pytest.raises(ValueError, match="correction='bonferroni' is invalid: one of 'holm'"):
        adjust_pvalues([0.1], "bonferroni")
    with pytest.raises(ValueError, match=r"values in \[0, 1\]"):
        holm([1.5])


# ----------------------------------------------------------------------------- roles and nulls


def test_permutation_null_moments_by_hand():
    # One sequence of 3 positions, bidirectional; the head is one-hot on the previous key.
    patterns = torch.tensor([[1.0, 0, 0], [1, 0, 0], [0, 1, 0]])[None, None, None]  # (1,1,1,3,3)
    tokens = torch.tensor([[4, 5, 6]])
    template = role_templates(tokens)["previous"]
    sums = RoleSums()
    sums.add_batch(patterns, {"previous": template}, visible_keys(torch.ones(1, 3).bool(), False))
    row = role_frame(sums).iloc[0]
    # Rows q = 1, 2 count (row 0 has no previous key): score 1. Per row s=1 of n=3 keys:
    # E = 1/3; Var = s(n-s)/(n-1) * sigma^2 = 1 * mean((w - 1/3)^2) = 2/9; the mean of two
    # rows has Var = (2/9 + 2/9) / 4 = 1/9, sd 1/3, so z = (1 - 1/3) / (1/3) = 2.
    assert row["score"] == pytest.approx(1.0)
    assert row["chance"] == pytest.approx(1 / 3)
    assert row["perm_std"] == pytest.approx(1 / 3)
    assert row["z_perm"] == pytest.approx(2.0)
    assert row["p_perm"] == pytest.approx(stats.norm.sf(2.0))
    assert row["effect"] == pytest.approx(1.0)


def test_exact_permutation_moments_match_monte_carlo():
    # A random causal head on padded data: the exact null mean/sd equal the Monte Carlo ones.
    task = get_task("count_previous", seq_len=8, d_vocab=3, min_len=5)
    model = build_model(task, d_model=16, n_heads=1, seed=3)
    batch = task.eval_batch(24)
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.tokens, batch.padding_mask)
    patterns = cache["pattern", 0][:, 0] * batch.padding_mask[:, :, None]  # (n, T, T)
    templates = role_templates(batch.tokens, batch.padding_mask, task=task, causal=True)
    visible = visible_keys(batch.padding_mask, causal=True)
    sums = RoleSums()
    sums.add_batch(patterns[:, None, None], templates, visible)
    exact = role_frame(sums).set_index("role")
    for role in ("same_token_upto", "previous", "first_position", "same_token_upto+sink"):
        draws = permutation_null_samples(
            patterns,
            templates[role],
            visible,
            n_permutations=4000,
            generator=torch.Generator().manual_seed(1),
        )
        assert float(draws.mean()) == pytest.approx(exact.loc[role, "chance"], abs=0.004)
        assert float(draws.std()) == pytest.approx(exact.loc[role, "perm_std"], rel=0.06)


def test_role_scores_known_values(previous_task):
    # Causal, no padding: the previous role counts queries 1..T-1 (query 0 has no previous key
    # and sees one key). Exact previous head: 1; uniform head: the mean of 1 / (q + 1); a head
    # on position 0 is on the previous key only at q = 1.
    model = handbuilt_model(["previous", "uniform", "first"])
    roles = role_scores(model, previous_task, n_eval=128)
    previous = roles[roles["role"] == "previous"]
    uniform = sum(1.0 / (q + 1) for q in range(1, T)) / (T - 1)
    np.testing.assert_allclose(previous["score"], [1.0, uniform, 1.0 / (T - 1)], atol=1e-6)
    assert previous["n_queries"].tolist() == [128 * (T - 1)] * 3
    assert previous["chance"].iloc[0] == pytest.approx(uniform)  # s = 1 of q + 1 keys


def test_role_sums_mass_is_capture_template_mass():
    # RoleSums keeps its masses in capture's accumulator, with the role's query rule: a query
    # counts when it sees >= 2 keys and one of its template keys is visible.
    patterns = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.25, 0.25, 0.5]])[None, None, None]
    template = torch.tensor([[[1.0, 0, 0], [1, 0, 0], [0, 0, 1]]])  # keys 0, 0, 2
    sums = RoleSums()
    sums.add_batch(patterns, {"mine": template}, visible_keys(torch.ones(1, 3).bool(), True))
    # Query 0 sees one key: left out. Masses 0.5 (q = 1) and 0.5 (q = 2).
    assert sums.mass.counts == {"mine": 2.0}
    assert_close(sums.mass.mean("mine"), torch.tensor([[0.5]], dtype=torch.float64))
    assert role_frame(sums).loc[0, "score"] == pytest.approx(0.5)


def test_role_templates_drop_generic_duplicates():
    task = get_task("count_previous", seq_len=6, d_vocab=3)
    tokens = task.eval_batch(4).tokens
    causal = role_templates(tokens, task=task, causal=True)
    # The task's set includes the query itself, so the generic same_token (other copies: in a
    # causal model the earlier ones) is another template; sets of several keys get a +sink
    # variant, and the union of the testable ones is "explained".
    assert list(causal) == [
        "same_token_upto",
        "previous",
        "self",
        "first_position",
        "same_token",
        "mirror",
        "uniform",
        "same_token_upto+sink",
        "same_token+sink",
        "explained",
    ]
    task = get_task("multi_relation", seq_len=6, d_vocab=3)
    tokens = task.eval_batch(4).tokens
    # Bidirectional: the generic same_token (every other copy) differs from the task's sets.
    generic = role_templates(tokens, task=task, causal=False)
    assert "same_token" in generic and "mirror+sink" not in generic  # mirror marks one key
    sink = generic["same_token_upto+sink"]
    assert torch.equal(sink[:, :, 0], torch.ones_like(sink[:, :, 0]))  # every query: key 0
    assert torch.equal(
        torch.maximum(sink[:, :, 1:], generic["same_token_upto"][:, :, 1:]), sink[:, :, 1:]
    )


def test_init_null_matches_the_runs_starting_point(multi_task):
    model = build_model(multi_task, d_model=32, n_heads=4, seed=7)
    (null,) = init_models(model.cfg, [7])
    for name, tensor in model.state_dict().items():
        assert_close(null.state_dict()[name], tensor)


def test_init_p_value_is_the_predictive_t_test():
    roles = pd.DataFrame({"role": ["a", "uniform", "uniform+sink"], "score": [0.9, 0.9, 0.9]})
    summary = pd.DataFrame(
        {
            "role": ["a", "uniform", "uniform+sink"],
            "init_mean": [0.1, 0.1, 0.1],
            "init_std": [0.1, 0.1, 0.1],
            "init_n": [8, 8, 8],
        }
    )
    out = init_p_values(roles, summary)
    assert out.loc[0, "z_init"] == pytest.approx(8.0)
    assert out.loc[0, "p_init"] == pytest.approx(stats.t.sf(8.0 / math.sqrt(1 + 1 / 8), df=7))
    assert math.isnan(out.loc[1, "p_init"])  # descriptive role: not tested
    # uniform+sink (counting over every key) has no permutation null: untrained heads alone
    assert out.loc[2, "p_init"] == pytest.approx(out.loc[0, "p_init"])
    combined = combine_nulls(
        pd.DataFrame({"p_perm": [0.001, 0.02, 0.5], "p_init": [0.004, 0.001, 0.001]}).assign(
            effect=[0.9, 0.9, 0.1]
        ),
        alpha=0.05,
        correction="holm",
        min_effect=0.3,
    )
    # p = max(p_perm, p_init) = 0.004, 0.02, 0.5; Holm: 0.012, 0.04, 0.5.
    np.testing.assert_allclose(combined["p_adj"], [0.012, 0.04, 0.5])
    assert combined["significant"].tolist() == [True, True, False]


# ----------------------------------------------------------------------------- known models


def test_previous_mirror_dead_heads_are_labelled_exactly(hand_result):
    heads = hand_result.heads.set_index("head_label")
    assert heads["label"].tolist() == ["previous", "mirror", "dead"]
    assert heads.loc["L0H0", "role_effect"] == pytest.approx(1.0, abs=1e-6)
    assert heads.loc["L0H1", "role_effect"] == pytest.approx(1.0, abs=1e-6)
    assert heads.loc["L0H2", "output_ratio"] == 0.0
    assert heads["causal_target"].tolist() == ["previous", "mirror", ""]
    assert heads.loc[["L0H0", "L0H1"], "causal_selectivity"].tolist() == [1.0, 1.0]
    assert heads["causal_support"].tolist()[:2] == [True, True]
    assert hand_result.redundancy["redundant"].tolist() == [False, False, False]


def test_hand_model_causal_matrix_and_selectivity(hand_result):
    matrix = hand_result.causal.pivot(index="head_label", columns="target", values="damage")
    # Removing the previous head loses the previous target except at t = 0 (class V from the
    # position) and where the mean-ablated copy still wins; nothing else moves.
    assert matrix.loc["L0H0", "mirror"] == 0.0 and matrix.loc["L0H0", "count_previous"] == 0.0
    assert matrix.loc["L0H1", "previous"] == 0.0 and matrix.loc["L0H1", "count_previous"] == 0.0
    assert (matrix.loc["L0H2"] == 0.0).all()
    assert matrix.loc["L0H0", "previous"] > 0.5 and matrix.loc["L0H1", "mirror"] > 0.5
    run = hand_result.runs.iloc[0]
    assert run["causal_selectivity"] == pytest.approx(1.0)
    assert run["causal_null"] < 0.2
    assert run["causal_p"] == pytest.approx(1 / 1001)


def test_hand_model_verdict_text(hand_result):
    text = hand_result.verdict.text
    assert "multi_relation, h=3, seed 0" in text
    assert (
        "2 of 3 heads hold 2 relations (mirror: 1 head (L0H1); previous: 1 head (L0H0); "
        "each p < 0.05 after Holm correction against both nulls, effect ≥ 0.3); 2 of 3 needed"
    ) in text
    assert "0 backed up, 1 dead." in text
    assert "Division of labour not measured (no division table)" in text
    assert "Labels are stable: none changes with any threshold x 0.8 or x 1.25." in text
    assert (
        "Labels: 0 backed up by a partner (none); 1 dead (L0H2); 0 unspecialized in where they "
        "look (none)."
    ) in text
    null = hand_result.runs.iloc[0]["causal_null"]
    assert f"Causal selectivity 1.00 vs permutation null {null:.2f} (p = 0.001)" in text
    assert "Ablation backs 2 of 2 role heads" in text


def test_a_head_that_mixes_two_relations_is_unspecialized(multi_task):
    model = multi_relation_model(["previous", "mix"], d_head=24)
    result = specialization_test(model, multi_task, n_eval=128)
    heads = result.heads.set_index("head_label")
    assert heads["label"].tolist() == ["previous", "unspecialized"]
    # Half the weight on each key, all of it where the two keys coincide (q = 8) or only one
    # exists (q = 0, mirror): previous = (1 + 14 / 2) / 15 over q = 1..15,
    # mirror = (1 + 1 + 14 / 2) / 16 over q = 0..15. Both are significant roles.
    scores = result.roles[result.roles["head_label"] == "L0H1"].set_index("role")["score"]
    assert scores["previous"] == pytest.approx(8 / 15, abs=1e-6)
    assert scores["mirror"] == pytest.approx(9 / 16, abs=1e-6)
    assert heads.loc["L0H1", "roles"].split(";") == ["previous", "mirror"]
    assert heads.loc["L0H1", "mixed_roles"] == "mirror;previous"
    assert heads.loc["L0H1", "finding"].startswith("mixes mirror and previous;")  # not "no known"
    assert (
        "1 unspecialized in where they look (L0H1 mixes mirror and previous)" in result.verdict.text
    )


def test_handbuilt_bidirectional_previous_mirror_dead(previous_task):
    task = get_task("reverse", seq_len=T, d_vocab=V)
    model = handbuilt_model(["previous", "mirror", "dead"], causal=False)
    result = specialization_test(model, task, n_eval=128)
    assert result.heads["label"].tolist() == ["previous", "mirror", "dead"]


@pytest.mark.parametrize(
    ("kinds", "labels"),
    [
        (["previous", "previous"], ["backed up", "backed up"]),
        (["previous", "previous", "previous"], ["backed up"] * 3),
        (["previous", "uniform", "previous"], ["backed up", "unspecialized", "backed up"]),
    ],
)
def test_copies_are_redundant(previous_task, kinds, labels):
    model = handbuilt_model(kinds, d_head=18)
    result = specialization_test(model, previous_task, n_eval=128)
    assert result.heads["label"].tolist() == labels
    copies = [f"L0H{i}" for i, k in enumerate(kinds) if k == "previous"]
    pairs = result.redundancy[result.redundancy["redundant"]]
    assert sorted(set(pairs["head_a"]) | set(pairs["head_b"])) == copies
    assert (pairs["similarity"] > 0.999).all() and (pairs["backup"] > 0.99).all()
    text = result.verdict.text
    assert f"{len(copies)} backed up by a partner ({' = '.join(copies)}: previous)" in text
    # Backed up, not holding nothing: the copies hold one relation between them.
    assert f"{len(copies)} of {len(kinds)} heads hold 1 relation (previous: " in text
    assert result.heads["redundant_with"].iloc[0] == ",".join(copies[1:])
    groups = result.redundancy_groups
    if len(copies) == 3:  # one group, found by similarity and by the shared role
        assert groups["basis"].tolist() == ["similarity+role:previous"]
        assert groups["heads"].tolist() == [",".join(copies)]
        assert groups["redundant"].tolist() == [True]
    else:
        assert groups.empty  # pairs are the pair test's


def test_a_group_of_copies_is_tested_as_a_whole(previous_task):
    model = handbuilt_model(["previous"] * 3, d_head=18)
    batch = previous_task.eval_batch(128)
    groups = redundancy_groups(model, batch)
    assert groups["heads"].tolist() == ["L0H0,L0H1,L0H2"]
    row = groups.iloc[0]
    clean = evaluate(model, batch)["loss"]
    with ablate(model, ["L0H0", "L0H1", "L0H2"], "mean", reference=batch):
        removed = evaluate(model, batch)["loss"]
    with ablate(model, ["L0H1", "L0H2"], "mean", reference=batch):
        kept_first = evaluate(model, batch)["loss"]
    assert row["damage_all"] == pytest.approx(removed - clean, abs=1e-5)
    assert row["damage_keep_one_max"] == pytest.approx(kept_first - clean, abs=1e-5)  # symmetric
    assert row["damage_keep_one_mean"] == pytest.approx(kept_first - clean, abs=1e-5)
    assert row["damage_all"] > 0.5 and row["backup"] > 0.9 and bool(row["redundant"])


def test_redundancy_reads_its_thresholds_from_the_settings(previous_task):
    model = handbuilt_model(["previous"] * 3, d_head=18)
    batch = previous_task.eval_batch(64)
    pairs = redundancy_pairs(model, batch)  # defaults: exact copies are similar and redundant
    assert pairs["similar"].all() and pairs["redundant"].all()
    # No removal of these heads costs 50 nats, so nothing passes that joint-damage bar.
    strict = SpecializationSettings(min_joint_damage=50.0)
    strict_pairs = redundancy_pairs(model, batch, strict)
    assert strict_pairs["similar"].all() and not strict_pairs["redundant"].any()
    assert not redundancy_groups(model, batch, strict)["redundant"].any()
    # The ablation method comes from the settings too.
    zero = redundancy_pairs(model, batch, SpecializationSettings(method="zero"))
    direct = pairwise_ablation(model, batch, "zero")
    direct = direct[direct["metric"] == "loss"]["damage_joint"].to_numpy()
    np.testing.assert_allclose(zero["damage_joint"].to_numpy(), direct)


def test_similar_heads_nobody_needs_are_not_a_redundant_group(previous_task):
    model = handbuilt_model(["previous", "uniform", "uniform", "uniform"], d_head=16)
    groups = redundancy_groups(model, previous_task.eval_batch(128))
    assert groups["heads"].tolist() == ["L0H1,L0H2,L0H3"]  # identical patterns
    # Removing them costs nothing (here it even lowers the loss a little): nothing to back up.
    assert groups.loc[0, "damage_all"] < 0.005
    assert not bool(groups.loc[0, "redundant"])


def test_extra_groups_are_tested_once_with_their_bases(previous_task):
    model = handbuilt_model(["previous"] * 3 + ["uniform"], d_head=16)
    extra = [
        ("role:previous", ["L0H2", "L0H0", "L0H1"]),  # the similar group again, another order
        ("role:uniform", ["L0H3", "L0H0"]),  # fewer than three heads: skipped
        ("mine", ["L0H0", "L0H3", "L0H1"]),
    ]
    groups = redundancy_groups(model, previous_task.eval_batch(64), groups=extra)
    assert groups[["basis", "heads"]].values.tolist() == [
        ["similarity+role:previous", "L0H0,L0H1,L0H2"],
        ["mine", "L0H0,L0H1,L0H3"],
    ]


def test_similar_groups_are_connected_components_of_live_heads():
    labels = ["L0H0", "L0H1", "L0H2", "L0H3", "L0H4"]
    sim = pd.DataFrame(np.eye(5), index=labels, columns=labels)
    for a, b in [("L0H0", "L0H1"), ("L0H1", "L0H2"), ("L0H3", "L0H4")]:  # a chain and a pair
        sim.loc[a, b] = sim.loc[b, a] = 0.95
    assert similar_groups(sim, 0.9) == [["L0H0", "L0H1", "L0H2"]]
    assert similar_groups(sim, 0.9, min_size=2) == [["L0H0", "L0H1", "L0H2"], ["L0H3", "L0H4"]]
    assert similar_groups(sim, 0.9, dead=["L0H1"], min_size=2) == [["L0H3", "L0H4"]]
    assert similar_groups(sim, 0.96) == []


@pytest.mark.parametrize("task_name", ["count_previous", "multi_relation"])
def test_untrained_models_are_not_called_specialized(task_name):
    task = get_task(task_name, seq_len=T, d_vocab=V)
    with_role, with_p = [], []
    for seed in range(5):
        model = build_model(task, d_model=64, n_heads=4, seed=seed)
        result = specialization_test(model, task, n_eval=128, n_permutations=200)
        with_role.append(int((~result.heads["label"].isin(["unspecialized", "dead"])).sum()))
        testable = result.roles[result.roles["role"] != "uniform"]
        with_p.append(int(testable.groupby("head_label")["p_adj"].min().lt(0.05).sum()))
    # At alpha = 0.05 after Holm correction: no head has a role in any seed, and even without
    # the effect-size gate (p-values alone) most seeds have no significant head.
    assert with_role == [0, 0, 0, 0, 0]
    assert sum(count > 0 for count in with_p) <= 1


# ----------------------------------------------------------------------------- causal pieces


def test_selectivity_index_known_values():
    matrix = torch.tensor([[0.6, 0.0, 0.0], [0.2, 0.2, 0.2], [0.3, 0.1, -0.2], [0.0, 0.0, 0.0]])
    index = selectivity_index(matrix, min_damage=0.01)
    # Row 3: clipped damages (0.3, 0.1, 0): (3 * 0.3 / 0.4 - 1) / 2 = 0.625.
    assert_close(index[:3], torch.tensor([1.0, 0.0, 0.625]))
    assert math.isnan(float(index[3]))
    # Damage-weighted: (0.6 * 1 + 0.6 * 0 + 0.4 * 0.625) / 1.6.
    assert float(model_selectivity(matrix)) == pytest.approx(0.85 / 1.6)


def test_target_damage_equals_head_importance(multi_task):
    task = get_task("multi_relation", seq_len=8, d_vocab=5)
    model = build_model(task, d_model=32, n_heads=4, seed=1)
    batch = task.eval_batch(64)
    damage = target_damage(model, batch, method="mean", target_names=task.target_names)
    table = head_importance(model, batch, method="mean")
    for t, name in enumerate(task.target_names):
        assert_close(
            damage.matrix[:, t],
            torch.tensor(-table[f"delta_accuracy/target{t}"].to_numpy(), dtype=torch.float64),
        )
        assert name == task.target_names[t]
    assert_close(
        damage.loss_increase, torch.tensor(table["delta_loss"].to_numpy(), dtype=torch.float64)
    )


def test_selectivity_null_of_an_even_head():
    # Every sequence loses 0.1 on each target: no target is special, the null says so.
    damage = TargetDamage(
        heads=["L0H0", "L0H1"],
        target_names=["a", "b"],
        damage=torch.stack([torch.full((50, 2), 0.1), torch.tensor([[0.2, 0.0]] * 50)]).double(),
        loss_increase=torch.zeros(2, dtype=torch.float64),
        baseline_accuracy=torch.ones(2, dtype=torch.float64),
    )
    result = causal_selectivity(damage, n_permutations=199)
    assert result.heads["selectivity"].tolist() == [0.0, 1.0]
    assert result.heads["p_selectivity"].tolist()[0] == 1.0
    assert result.heads["p_selectivity"].tolist()[1] == pytest.approx(1 / 200)
    assert result.selectivity == pytest.approx(0.5)  # (0.2 * 0 + 0.2 * 1) / 0.4


# ----------------------------------------------------------------------------- consistency


def _roles_table(effects: dict[str, list[float]]) -> pd.DataFrame:
    rows = [
        {"head_label": head, "role": role, "effect": value}
        for head, values in effects.items()
        for role, value in zip(["previous", "mirror"], values, strict=True)
    ]
    return pd.DataFrame(rows)


def test_consistency_matches_permuted_heads():
    a = _roles_table({"L0H0": [1.0, 0.0], "L0H1": [0.0, 1.0]})
    b = _roles_table({"L0H0": [0.0, 0.9], "L0H1": [0.8, 0.0]})
    sim = profile_similarity(
        *(
            t.pivot(index="head_label", columns="role", values="effect")[["previous", "mirror"]]
            for t in (a, b)
        )
    )
    assert sim.to_numpy().tolist() == [[0.0, 1.0], [1.0, 0.0]]
    labels = {
        "a": {"L0H0": "previous", "L0H1": "mirror"},
        "b": {"L0H0": "mirror", "L0H1": "previous"},
    }
    pairs, summary = cross_seed_consistency({"a": a, "b": b}, labels, n_shuffles=50)
    assert pairs.loc[0, "matched"] == "L0H0=L0H1,L0H1=L0H0"
    assert summary["consistency"] == 1.0
    assert summary["random_matching"] == 0.5  # mean of the matrix: a random matching's mean
    assert summary["label_agreement"] == 1.0 and summary["label_agreement_random"] == 0.5


# ----------------------------------------------------------------------------- verdict text


def _verdict(**changes) -> RunVerdict:
    base = dict(
        run="r",
        task="multi_relation",
        n_heads=4,
        n_layers=1,
        seed=0,
        n_targets=3,
        role_heads={"L0H0": "previous", "L0H1": "mirror", "L0H3": "same_token_upto"},
        role_effects={"L0H0": 0.9, "L0H1": 0.8, "L0H3": 0.4},
        relations={"previous": ["L0H0"], "mirror": ["L0H1"], "same_token_upto": ["L0H3"]},
        needed=["L0H0", "L0H1"],
        dead=["L0H2"],
        supported=["L0H0", "L0H1"],
        largest_p_adj=0.004,
        alpha=0.01,
        causal_selectivity=0.8,
        causal_null=0.2,
        causal_p=0.001,
        accuracy=0.95,
    )
    return RunVerdict(**{**base, **changes})


def test_verdict_text_is_generated_from_the_numbers():
    text = _verdict().text
    assert text.startswith(
        "multi_relation, h=4, seed 0 (accuracy 0.950): Headline: the division of labour was not "
        "measured. 3 of 4 heads hold 3 relations (mirror: 1 "
        "head (L0H1); previous: 1 head (L0H0); same_token_upto: 1 head (L0H3); each p < 0.01 "
        "after Holm correction"
    )
    assert (
        "; 2 of 4 needed (removing one alone costs ≥ 0.01 accuracy), 0 backed up, 1 dead." in text
    )
    assert "1 dead (L0H2)" in text
    assert "Causal selectivity 0.80 vs permutation null 0.20 (p = 0.001)" in text
    assert "Ablation backs 2 of 3 role heads" in text
    changed = _verdict(
        role_heads={"L0H1": "mirror"},
        role_effects={"L0H1": 0.55},
        relations={"mirror": ["L0H1"]},
        dead=[],
        unspecialized=["L0H0", "L0H2", "L0H3"],
        supported=[],
        causal_selectivity=0.35,
        causal_null=0.31,
        causal_p=0.2,
        correction="bh",
    ).text
    assert "1 of 4 heads holds 1 relation (mirror: 1 head (L0H1)" in changed
    assert "Benjamini-Hochberg" in changed
    assert "3 unspecialized in where they look (L0H0, L0H2, L0H3)" in changed
    assert "Causal selectivity 0.35 vs permutation null 0.31 (p = 0.2)" in changed
    assert changed != text
    assert "Causal selectivity: not applicable (one target)." in _verdict(n_targets=1).text
    undefined = _verdict(causal_selectivity=math.nan, causal_null=math.nan).text
    assert "Causal selectivity: undefined (no head's removal costs ≥ 0.01 accuracy)." in undefined


def test_group_verdict_summarises_seeds():
    one = dict(role_heads={"L0H0": "previous"}, relations={"previous": ["L0H0"]})
    runs = [_verdict(seed=0), _verdict(seed=1, **one), _verdict(seed=2)]
    verdict = Verdict(
        runs,
        {
            "multi_relation/h4": {
                "consistency": 0.9,
                "random_matching": 0.4,
                "null_shuffled": 0.5,
                "p_value": 0.01,
            }
        },
    )
    (line,) = verdict.lines
    # Counts (relations, heads per relation) and shares (needed, redundant, dead) apart.
    assert line.startswith(
        "multi_relation, h=4, 4 heads, 3 seeds (mean ± std): relations covered 2.33 ± 1.15 (a "
        "count; per seed 3, 1, 3), heads per relation 1.00 ± 0.00 (a count); needed share "
        "0.50 ± 0.00 (needed but holding no known relation 0.08 ± 0.14), backed-up share "
        "0.00 ± 0.00, dead share 0.25 ± 0.00."
    )
    assert "mirror (2/3 seeds), previous (3/3 seeds), same_token_upto (2/3 seeds)" in line
    assert (
        "0.90, +0.50 over a random matching (0.40); null used: heads shuffled across seeds, "
        "0.50 (p = 0.01)"
    ) in line
    assert verdict.caveats[2].startswith("3 seeds per task and head count")


def test_group_verdict_names_roles_held_by_redundant_groups():
    copies = dict(role_heads={}, role_effects={}, dead=[], supported=[], needed=[])
    group = ["L0H0", "L0H1", "L0H2", "L0H3"]
    held = dict(relations={"mirror": group}, backed_up=group)
    runs = [
        _verdict(seed=0, redundant_groups=[group], redundant_roles=["mirror"], **held, **copies),
        _verdict(seed=1, redundant_groups=[group], redundant_roles=["mirror"], **held, **copies),
        _verdict(seed=2, unspecialized=group, relations={}, **copies),
    ]
    (line,) = Verdict(runs).lines
    assert "relations covered 0.67 ± 0.58 (a count; per seed 1, 1, 0)" in line
    # Undefined for the seed with none, and the n says so.
    assert (
        "heads per relation 4.00 ± 0.00 (a count; n = 2 of 3 seeds, those with a relation)" in line
    )
    assert "backed-up share 0.67 ± 0.58, dead share 0.00" in line
    assert "Relations: mirror (2/3 seeds)" in line


def test_verdict_counts_equal_the_head_table(hand_result):
    heads = hand_result.heads
    n_role = int((~heads["label"].isin(["unspecialized", "backed up", "dead"])).sum())
    n_holding = int((heads["holds"] != "").sum())
    assert f"{n_holding} of {len(heads)} heads hold" in hand_result.verdict.text
    assert hand_result.runs.iloc[0]["n_role"] == n_role
    assert hand_result.runs.iloc[0]["n_relations"] == 2
    assert hand_result.runs.iloc[0]["heads_per_relation"] == 1.0
    assert hand_result.runs.iloc[0]["n_needed"] == int(heads["needed"].sum()) == 2


# ----------------------------------------------------------------------------- plumbing


def test_settings_and_input_errors(multi_task):
    with pytest.raises(ValueError, match="alpha=0 is invalid"):
        SpecializationSettings(alpha=0)
    with pytest.raises(ValueError, match="correction='bonferroni' is invalid: one of 'holm'"):
        SpecializationSettings(correction="bonferroni")
    with pytest.raises(ValueError, match="method='median' is invalid"):
        SpecializationSettings(method="median")
    with pytest.raises(ValueError, match="data=None is invalid: a Task when a model"):
        specialization_test(multi_relation_model(["dead"], d_head=48))
    with pytest.raises(TypeError, match="run_or_model must be"):
        specialization_test(42, multi_task)


def test_specialization_test_takes_model_then_data_by_name():
    """DESIGN.md's ``specialization_test(run_or_model, data, settings=...)``, by keyword too."""
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "dead"], d_head=18)
    result = specialization_test(
        run_or_model=model, data=task, settings=SpecializationSettings(n_eval=32)
    )
    assert result.heads["label"].tolist() == ["previous", "dead"]


def test_result_round_trips_through_files(hand_result, tmp_path):
    hand_result.save(tmp_path)
    loaded = SpecializationResult.load(tmp_path)
    assert loaded.verdict.text == hand_result.verdict.text
    assert loaded.settings == hand_result.settings
    pd.testing.assert_frame_equal(
        loaded.heads[["head_label", "label", "role_effect"]],
        hand_result.heads[["head_label", "label", "role_effect"]],
    )
    assert len(loaded.roles) == len(hand_result.roles)


def test_figures_show_the_tables(hand_result, tmp_path):
    fig = role_heatmap(hand_result.roles)
    texts = [t.get_text() for t in fig.axes[0].texts]
    roles = list(dict.fromkeys(hand_result.roles["role"]))
    # Row L0H0, column "previous" is the exact previous head: score 1.00, a significant role.
    assert texts[roles.index("previous")] == "1.00**"
    fig = causal_matrix_figure(hand_result.causal)
    assert fig.axes[0].get_xlabel() == "target"
    paths = save_specialization_figures(hand_result, tmp_path)
    assert [p.name for p in paths] == ["role_scores.png", "causal_matrix.png"]
    saved = pd.read_csv(tmp_path / "role_scores.csv")
    np.testing.assert_allclose(saved["score"], hand_result.roles["score"])
    runs = pd.DataFrame(
        {
            "task": ["t"] * 4,
            "n_heads": [1, 1, 2, 2],
            "seed": [0, 1, 0, 1],
            "n_relations": [1, 1, 2, 3],
            "heads_per_relation": [1.0, 1.0, 1.0, math.nan],
            "frac_backed_up": [0.0, 0.0, 0.5, 0.0],
            "frac_dead": [0.0, 0.0, 0.0, 0.5],
            "accuracy": [0.5, 0.6, 0.8, 0.9],
        }
    )
    fig = specialization_vs_heads(runs)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == [
        "relations covered (a count)",
        "heads per relation (a count)",
        "backed-up share of heads",
        "dead share of heads",
        "validation accuracy",
    ]
    assert fig.axes[0].get_ylim()[1] == pytest.approx(3.5)  # a count: up to the largest seen
    assert fig.axes[1].get_ylim()[1] == pytest.approx(1.5)  # NaN (no relation) left out
    assert fig.axes[2].get_ylim() == pytest.approx((-0.05, 1.05))  # a share
    pairs = pd.DataFrame(
        {
            "task": ["t"],
            "n_heads": [2],
            "consistency": [0.9],
            "random_matching": [0.5],
            "null_shuffled": [0.6],
        }
    )
    assert consistency_figure(pairs).axes[0].get_title() == "t: same roles across seeds?"


def test_summary_table_known_values():
    runs = pd.DataFrame(
        {
            "run": ["a", "b", "c", "d"],
            "task": ["t"] * 4,
            "n_heads": [1, 1, 4, 4],
            "n_relations": [1, 1, 2, 0],
            "heads_per_relation": [1.0, 1.0, 1.5, math.nan],
            "frac_needed": [1.0, 1.0, 0.75, 0.5],
            "frac_backed_up": [0.0, 0.0, 0.25, 0.5],
            "frac_redundant": [0.0, 0.0, 0.25, 0.25],
            "frac_dead": [0.0, 0.0, 0.0, 0.25],
            "frac_label_flips": [0.0, 0.0, 0.25, 0.0],
            "specialized_along": ["", "", "token", "token,position"],
            "causal_selectivity": [math.nan] * 4,
            "causal_null": [math.nan] * 4,
            "val_accuracy": [0.6, 0.7, 0.9, 0.9],
        }
    )
    division = pd.DataFrame(
        {
            "run": ["a", "b", "c", "c", "d", "d"],
            "by": ["token", "token", "token", "position", "token", "position"],
            "index": [math.nan, math.nan, 0.3, 0.1, 0.2, 0.3],
            "null_index": [math.nan, math.nan, 0.01, 0.05, 0.03, 0.05],
            "p": [math.nan, math.nan, 0.001, 0.2, 0.001, 0.001],
        }
    )
    consistency = {
        "t/h4": {"consistency": 0.8, "random_matching": 0.3, "null_shuffled": 0.4, "p_value": 0.02}
    }
    table = specialization_summary(runs, consistency, division)
    assert list(table.columns) == summary_columns()
    h1, h4 = table.set_index("n_heads").loc[1], table.set_index("n_heads").loc[4]
    # counts: relations covered over every seed, heads per relation over the seeds with one
    assert h4["n_relations_mean"] == 1.0 and h4["n_relations_std"] == pytest.approx(math.sqrt(2))
    assert h4["heads_per_relation_mean"] == 1.5 and math.isnan(h4["heads_per_relation_std"])
    assert h4["n_seeds_with_relation"] == 1 and h1["n_seeds_with_relation"] == 2
    # shares of all heads
    assert h4["frac_needed_mean"] == pytest.approx(0.625)
    assert h4["frac_backed_up_mean"] == pytest.approx(0.375)
    assert h4["frac_dead_mean"] == pytest.approx(0.125)
    assert h4["frac_label_flips_mean"] == pytest.approx(0.125)
    # division: index over the seeds where it is defined, its null, seeds beyond it
    assert h4["division_token_mean"] == pytest.approx(0.25)
    assert h4["division_token_std"] == pytest.approx(math.sqrt(0.005))
    assert h4["division_token_null"] == pytest.approx(0.02)
    assert (h4["division_token_n_defined"], h4["division_token_n_beyond"]) == (2, 2)
    assert (h4["division_position_n_defined"], h4["division_position_n_beyond"]) == (2, 1)
    assert (h1["division_token_n_measured"], h1["division_token_n_defined"]) == (2, 0)
    assert h1["division_token_n_beyond"] == 0 and math.isnan(h1["division_token_mean"])
    assert h1["division_position_n_measured"] == 0 and h4["division_target_n_measured"] == 0
    assert h4["accuracy_mean"] == pytest.approx(0.9) and h4["accuracy_std"] == 0.0
    assert h4["consistency"] == 0.8 and h4["consistency_p"] == 0.02
    assert math.isnan(h1["consistency"])
    tables = display_summary(table)
    assert all(len(t.columns) <= 8 for _, t in tables)  # none scrolls at 1,280 px
    shown = {column: t[column].tolist() for _, t in tables for column in t.columns}
    assert "redundant" not in shown  # one vocabulary: backed up
    assert shown["relations covered (count)"] == ["1.00 ± 0.00", "1.00 ± 1.41"]
    assert shown["by token"] == [
        "undefined (fewer than 2 heads do damage)",
        "0.25 ± 0.07 vs null mean 0.02 (2/2 divided)",  # no null_high saved: the mean, named
    ]
    assert shown["by position"] == ["not measured", "0.20 ± 0.14 vs null mean 0.05 (1/2 divided)"]
    assert "by target" not in shown  # not measured: no column
    assert "causal selectivity" not in shown  # single-target: no column
    assert shown["margin"][1] == pytest.approx(0.5)  # consistency over random matching


# ----------------------------------------------------------------------------- counting, nesting


class _BosCountTask(CountPreviousTask):
    """count_previous with a BOS: token 0 at position 0 and nowhere else (a clean sink)."""

    name = "count_previous_bos"

    def sample_tokens(self, n, lengths, generator):
        tokens = torch.randint(1, self.d_vocab, (n, self.seq_len), generator=generator)
        tokens[:, 0] = 0
        return tokens


@pytest.fixture(scope="module")
def count_task():
    return get_task("count_previous", seq_len=T, d_vocab=V)


def test_a_counting_head_gets_the_counting_label(count_task):
    # Uniform over the copies of the query's token up to itself: the task's own set, spread
    # exactly evenly; its attention is all on known relations.
    model = handbuilt_model(["count", "previous"], d_head=18)
    result = specialization_test(model, count_task, n_eval=64, n_permutations=100)
    heads = result.heads.set_index("head_label")
    assert heads["label"].tolist() == ["count:same_token_upto", "previous"]
    assert heads.loc["L0H0", "role_evenness"] == pytest.approx(1.0, abs=1e-6)
    assert math.isnan(heads.loc["L0H1", "role_evenness"])  # one key: nothing to spread over
    assert heads["explained"].tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
    assert heads["unexplained"].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    # It also puts mass on self (nested in the set): not mixing.
    assert (
        "self" in heads.loc["L0H0", "roles"].split(";") and heads.loc["L0H0", "mixed_roles"] == ""
    )
    assert result.verdict.runs[0].relations == {"same_token_upto": ["L0H0"], "previous": ["L0H1"]}


def test_a_counting_head_with_a_sink_gets_the_sink_label():
    task = _BosCountTask(seq_len=T, d_vocab=V)
    model = handbuilt_model(["count_sink", "previous"], d_head=18)
    result = specialization_test(model, task, n_eval=64, n_permutations=100)
    heads = result.heads.set_index("head_label")
    assert heads["label"].tolist() == ["count:same_token_upto+sink", "previous"]
    assert heads.loc["L0H0", "role_evenness"] == pytest.approx(1.0, abs=1e-6)
    roles = result.roles[result.roles["head_label"] == "L0H0"].set_index("role")
    # With c earlier copies the sink gets 1 / (c + 2): all mass on set + sink, part on each.
    assert roles.loc["same_token_upto+sink", "score"] == pytest.approx(1.0, abs=1e-6)
    batch = task.eval_batch(64)
    counts = batch.targets[:, 1:].double()  # queries 1..T-1 (query 0 sees one key)
    assert roles.loc["first_position", "score"] == pytest.approx(
        float((1.0 / (counts + 2)).mean()), abs=1e-6
    )


def test_evenness_by_hand():
    # One query (q = 2) sees 3 keys; the set is keys {0, 1}: weights 0.3, 0.1 -> within the set
    # 0.75, 0.25 -> overlap with (0.5, 0.5) = 0.5 + 0.25. Query 1's set has one key: left out.
    patterns = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.3, 0.1, 0.6]])[None, None, None]
    template = torch.tensor([[[0.0, 0, 0], [1, 0, 0], [1, 1, 0]]])
    sums = RoleSums()
    sums.add_batch(patterns, {"set": template}, visible_keys(torch.ones(1, 3).bool(), True))
    assert sums.evenness.counts == {"set": 1.0}
    assert role_frame(sums).loc[0, "evenness"] == pytest.approx(0.75)


def test_nesting_is_decided_on_the_queries_both_roles_count():
    # inner marks key 0 for q = 1, where outer marks nothing; on q = 2, the only query both
    # count, inner {1} sits inside outer {0, 1}. Decided on all queries, inner would not nest.
    inner = torch.tensor([[[0.0, 0, 0], [1, 0, 0], [0, 1, 0]]])
    outer = torch.tensor([[[0.0, 0, 0], [0, 0, 0], [1, 1, 0]]])
    visible = visible_keys(torch.ones(1, 3).bool(), True)
    nested = nested_roles({"inner": inner, "outer": outer}, visible)
    assert nested == {("inner", "outer")}
    apart = torch.tensor([[[0.0, 0, 0], [0, 0, 0], [0, 0, 1]]])  # q = 2 only, key 2: not in
    assert nested_roles({"inner": inner, "apart": apart}, visible) == set()


class _LengthTask(CountPreviousTask):
    """tracr's ``length``: a BOS (token 0) at position 0, then tokens of a random length; the
    target at every position is the length. Its selector is always true: the relation
    ``select_all`` marks every token but the BOS."""

    name = "length_bos"
    causal = False

    @property
    def d_vocab_out(self) -> int:
        return self.seq_len + 1

    def sample_tokens(self, n, lengths, generator):
        tokens = torch.randint(1, self.d_vocab, (n, self.seq_len), generator=generator)
        tokens[:, 0] = 0
        return tokens

    def compute_targets(self, tokens, padding_mask):
        return padding_mask.sum(-1, keepdim=True).expand_as(tokens).clone(), padding_mask

    def compute_relations(self, tokens, padding_mask):
        every = uniform_template(tokens, padding_mask)
        every[..., 0] = 0.0
        return {"select_all": every}


def test_a_selector_width_head_counts_over_every_key():
    # tracr's SelectorWidth of an always-true selector: uniform over the BOS and every token,
    # so the BOS's share 1 / (n + 1) encodes the length. Its mass on any set is chance (no
    # permutation test can see it); more even than any untrained head, it counts.
    task = _LengthTask(seq_len=8, d_vocab=9, min_len=3)
    model = handbuilt_model(["uniform", "previous"], causal=False, d_head=18, seq_len=8)
    result = specialization_test(model, task, n_eval=128, n_permutations=100)
    heads = result.heads.set_index("head_label")
    assert heads["label"].tolist() == ["count:uniform+sink", "previous"]
    assert heads.loc["L0H0", "role_evenness"] == pytest.approx(1.0, abs=1e-6)
    roles = result.roles.query("head_label == 'L0H0'").set_index("role")
    assert roles.loc["select_all", "effect"] == pytest.approx(0.0, abs=1e-6)  # mass = chance
    every = roles.loc["uniform+sink"]
    assert math.isnan(every["p_perm"]) and every["p_adj"] < 0.05 and every["effect"] == 1.0
    assert result.verdict.runs[0].relations == {"uniform": ["L0H0"], "previous": ["L0H1"]}
    # An untrained model of that architecture is among its own untrained null: no counting.
    untrained = HookedMHATransformer(model.cfg)
    labels = specialization_test(untrained, task, n_eval=128, n_permutations=100).heads["label"]
    assert not labels.str.startswith("count:").any()
    # Without a BOS a uniform head averages, it counts nothing: no uniform+sink role.
    plain = specialization_test(
        handbuilt_model(["uniform", "previous"], d_head=18),
        get_task("previous_token"),
        n_eval=64,
        n_permutations=100,
    )
    assert plain.heads["label"].tolist() == ["unspecialized", "previous"]
    assert "uniform+sink" not in set(plain.roles["role"])


def test_a_one_head_selector_width_model_is_a_counting_head():
    # tracr's length program alone: one head, uniform over the BOS and every real token, whose
    # output is the length. Its 4 untrained seeds gave the init null 4 draws (3 degrees of
    # freedom): p_adj 0.15 for a score of 1.00, "unspecialized". Its pool now holds 32 heads.
    task = _LengthTask(seq_len=8, d_vocab=9, min_len=2)
    model = selector_width_model(seq_len=8, d_vocab=task.d_vocab_in, d_model=16)
    result = specialization_test(model, task, n_eval=128)
    head = result.heads.iloc[0]
    assert (head["label"], head["top_role"], head["top_score"]) == (
        "count:uniform+sink",
        "uniform+sink",
        pytest.approx(1.0, abs=1e-6),
    )
    assert head["needed"] and head["total_damage"] > 0.5  # removing it loses the length
    assert head["role_p_adj"] < 0.001
    pool = result.init_null.query("role == 'uniform+sink'")
    assert len(pool) == MIN_INIT_ONLY_POOL  # 4 matched seeds + 28 more, one head each
    assert len(result.init_null.query("role == 'self'")) == 4  # the other roles: n_init


# ----------------------------------------------------------------------------- stability


def _evidence(effect: float, backup: float) -> RunEvidence:
    roles = pd.DataFrame(
        {
            "head_label": ["L0H0", "L0H1", "L0H2"],
            "role": ["previous"] * 3,
            "p_adj": [1e-6] * 3,
            "effect": [effect, 0.9, 0.9],
            "chance": [0.1] * 3,
            "evenness": [math.nan] * 3,
        }
    )
    pairs = pd.DataFrame(
        {
            "head_a": ["L0H0", "L0H0", "L0H1"],
            "head_b": ["L0H1", "L0H2", "L0H2"],
            "similarity": [0.1, 0.1, 0.95],
            "damage_joint": [math.nan, math.nan, 0.3],
            "backup": [math.nan, math.nan, backup],
        }
    )
    groups = pd.DataFrame(  # the three share a role: tested as a group, which backs nothing up
        {"basis": ["role:previous"], "heads": ["L0H0,L0H1,L0H2"], "size": [3],
         "damage_all": [0.5], "damage_keep_one_mean": [0.45], "damage_keep_one_max": [0.5],
         "backup": [0.1], "redundant": [False]}
    )  # fmt: skip
    ratio = {"L0H0": 1.0, "L0H1": 1.0, "L0H2": 1.0}
    return RunEvidence(roles, ratio, pairs, groups, set(), {"L0H0": 0.2})


def test_relabelling_counts_exactly_the_labels_that_move():
    # L0H0's effect 0.33 passes min_effect 0.3 but not 0.375 (x 1.25); L0H1 = L0H2 back each
    # other up at 0.55, which passes backup_ratio 0.5 but not 0.625. Nothing else moves.
    settings = SpecializationSettings()
    evidence = _evidence(effect=0.33, backup=0.55)
    decisions, needed, untested = relabel(evidence, settings)
    labels = {h: d.label for h, d in decisions.items()}
    assert labels == {"L0H0": "previous", "L0H1": "backed up", "L0H2": "backed up"}
    assert needed == {"L0H0": True, "L0H1": False, "L0H2": False} and untested == 0
    table = run_stability("r", evidence, labels, settings)
    moved = table[table["n_changed"] > 0][["threshold", "factor", "changed"]].values.tolist()
    assert moved == [
        ["min_effect", 1.25, "L0H0"],
        ["min_similarity", 1.25, "L0H1,L0H2"],  # 0.95 < 1.0 (0.9 x 1.25, capped at 1)
        ["backup_ratio", 1.25, "L0H1,L0H2"],
    ]
    assert len(table) == 2 * len(THRESHOLDS)
    summary = stability_summary(table).set_index("threshold")
    assert summary.loc["any", "share_any"] == 1.0  # every head moves under some threshold
    assert summary.loc["min_effect", "share_x1.25"] == pytest.approx(1 / 3)
    assert summary.loc["dead_tol", "share_any"] == 0.0
    # Clear margins: only the similarity gate capped at 1 (above 0.95) still moves the pair.
    stable = run_stability("r", _evidence(0.9, 0.9), labels, settings)
    assert stable.loc[stable["threshold"] != "min_similarity", "n_changed"].sum() == 0


def test_a_needed_head_is_never_backed_up():
    # L0H1 and L0H2 pass the redundancy test (backup 0.9), but removing L0H1 alone costs 0.17
    # accuracy: it is needed, so not backed up (the README's definitions exclude both); its
    # partner L0H2, which costs nothing alone, is backed up by it.
    evidence = _evidence(effect=0.9, backup=0.9)
    evidence.max_damage = {"L0H0": 0.2, "L0H1": 0.17}
    decisions, needed, _ = relabel(evidence, SpecializationSettings())
    labels = {h: d.label for h, d in decisions.items()}
    assert labels == {"L0H0": "previous", "L0H1": "previous", "L0H2": "backed up"}
    assert needed == {"L0H0": True, "L0H1": True, "L0H2": False}
    assert decisions["L0H1"].partners == [] and decisions["L0H2"].partners == ["L0H1"]


def test_saved_results_relabel_to_the_same_table(previous_task, tmp_path):
    # The stability test reads only saved tables: re-running it on a loaded result gives the
    # same table, and the run's own labels come back under the unchanged settings.
    model = handbuilt_model(["previous", "previous", "uniform"], d_head=16)
    result = specialization_test(model, previous_task, n_eval=64, n_permutations=100)
    result.save(tmp_path)
    loaded = SpecializationResult.load(tmp_path)
    pd.testing.assert_frame_equal(
        label_stability(loaded)[["threshold", "factor", "n_changed"]],
        result.stability[["threshold", "factor", "n_changed"]],
    )
    assert result.stability["n_untested"].sum() == 0
    run = result.verdict.runs[0]
    assert run.relations == {"previous": ["L0H0", "L0H1"]} and run.heads_per_relation == 2.0
    assert run.backed_up == ["L0H0", "L0H1"]


def test_per_head_tables_lead_with_head_label_layer_head(hand_result, tmp_path):
    # DESIGN: per-head tables lead with head_label, layer, head; then the run's columns.
    lead = ["head_label", "layer", "head", "run", "task", "n_heads", "seed"]
    assert list(hand_result.heads.columns) == HEAD_COLUMNS
    assert HEAD_COLUMNS[:8] == [*lead, "label"]
    assert list(hand_result.roles.columns[:8]) == [*lead, "role"]
    assert list(hand_result.causal.columns) == [
        *lead, "target", "baseline_accuracy", "ablated_accuracy", "damage",
    ]  # fmt: skip
    assert list(hand_result.init_null.columns[:9]) == [*lead, "init_seed", "role"]
    # Tables not per head keep the run first.
    assert list(hand_result.runs.columns[:3]) == ["run", "task", "n_heads"]
    assert list(hand_result.nested.columns) == ["run", "inner", "outer"]
    # A folder saved with the old order (run, task, n_heads, seed, layer, head, head_label,
    # ...) loads by name, in the new order, with the same values.
    hand_result.save(tmp_path)
    old_order = ["run", "task", "n_heads", "seed", "layer", "head", "head_label"]
    for name in ("heads", "roles", "causal"):
        table = getattr(hand_result, name)
        rest = [c for c in table.columns if c not in old_order]
        table[old_order + rest].to_csv(tmp_path / f"specialization_{name}.csv", index=False)
    loaded = SpecializationResult.load(tmp_path)
    assert list(loaded.heads.columns) == HEAD_COLUMNS
    for name in ("roles", "causal"):
        assert list(getattr(loaded, name).columns) == list(getattr(hand_result, name).columns)
    assert loaded.heads["label"].tolist() == hand_result.heads["label"].tolist()
    pd.testing.assert_series_equal(loaded.causal["damage"], hand_result.causal["damage"])


# ----------------------------------------------------------------------------- division in verdicts


def test_mirror_copies_read_as_one_relation_and_no_division():
    # Reverse's picture: every head attends to the mirror, any one can go at no cost. With a
    # division table whose indices sit inside their nulls, the verdict must say exactly that.
    task = get_task("reverse", seq_len=T, d_vocab=V)
    model = handbuilt_model(["mirror"] * 4, causal=False)
    result = specialization_test(model, task, n_eval=64, n_permutations=100)
    assert result.heads["label"].tolist() == ["backed up"] * 4
    assert result.heads["holds"].tolist() == ["mirror"] * 4
    assert not result.heads["needed"].any()
    text = result.verdict.text
    assert "4 of 4 heads hold 1 relation (mirror: 4 heads (L0H0, L0H1, L0H2, L0H3);" in text
    assert "0 of 4 needed" in text and "4 backed up, 0 dead." in text
    assert "does not say whether the heads divide the work" in text
    assert re.search(r"\bspecialized\b", text) is None  # no division claimed without the table
    inside = pd.DataFrame(
        {"by": ["token", "position"], "index": [0.01, 0.02], "null_index": [0.02, 0.02],
         "p": [0.7, 0.5]}
    )  # fmt: skip
    attached = attach_division(result, inside)
    text = attached.verdict.text
    assert (
        "Division of labour: by token not divided (index 0.01 vs null 0.02 (p = 0.7)); by "
        "position not divided (index 0.02 vs null 0.02 (p = 0.5))."
    ) in text
    assert "Headline: the heads do not divide the work along any axis tested." in text
    assert attached.runs.iloc[0]["specialized_along"] == ""
    beyond = inside.assign(index=[0.4, 0.02], p=[0.001, 0.5])
    assert "Headline: the heads divide the work along token." in (
        attach_division(result, beyond).verdict.text
    )
    # Undefined indices say why, never "nan vs null nan".
    undefined = inside.assign(index=[float("nan")] * 2, null_index=[float("nan")] * 2)
    text = attach_division(result, undefined).verdict.text
    assert "nan" not in text
    assert "by token cannot tell (undefined (fewer than 2 heads do damage))" in text
    assert "Headline: cannot tell whether the heads divide the work" in text


def test_group_verdict_reads_the_division_of_every_seed():
    rows = [{"by": "token", "index": 0.02, "null_index": 0.03, "p": 0.6}]
    mirror = dict(relations={"mirror": [f"L0H{i}" for i in range(8)]}, n_heads=8, n_targets=1)
    runs = [_verdict(seed=s, division=rows, **mirror) for s in range(3)]
    (line,) = Verdict(runs).lines
    assert "relations covered 1.00 ± 0.00 (a count; per seed 1, 1, 1), heads per relation " in line
    assert "8.00 ± 0.00 (a count)" in line
    assert (
        "Division of labour: by token 0.02 ± 0.00 vs null 0.03 ± 0.00, divided in 0/3 seeds: "
        "the heads do not divide the work along any axis tested." in line
    )
    assert Verdict(runs).headlines() == {
        "multi_relation": [
            "h=8 (8 heads, 3 seeds): the heads do not divide the work along any axis tested "
            "(0/3 seeds divided by token)."
        ]
    }


def test_settings_scale_within_bounds():
    assert SpecializationSettings().scaled("backup_ratio", 1.25).backup_ratio == 0.625
    assert SpecializationSettings().scaled("min_similarity", 1.25).min_similarity == 1.0
    with pytest.raises(ValueError, match="name='alpha' is invalid"):
        SpecializationSettings().scaled("alpha", 0.8)


def test_eight_mirror_copies_are_backed_up_and_their_label_rests_on_the_backup_ratio():
    # Eight copies, each writing 1/8: removing any one costs nothing; keeping one of the eight
    # keeps a little more than half of the job (group backup 0.54), so the label "redundant"
    # rests on backup_ratio 0.5 and moves at x 1.25 (0.625), and on nothing else.
    task = get_task("reverse", seq_len=T, d_vocab=V)
    model = handbuilt_model(["mirror"] * 8, causal=False)
    result = specialization_test(model, task, n_eval=64, n_permutations=100)
    heads = [f"L0H{i}" for i in range(8)]
    assert result.heads["label"].tolist() == ["backed up"] * 8
    assert result.redundancy_groups["backup"].iloc[0] == pytest.approx(0.535, abs=0.005)
    run = result.verdict.runs[0]
    assert run.flips == {name: 8 if name == "backup_ratio" else 0 for name in THRESHOLDS}
    assert "8 of 8 heads hold 1 relation (mirror: 8 heads (" + ", ".join(heads) in run.text
    assert "0 of 8 needed" in run.text and "8 backed up, 0 dead." in run.text
    assert "This verdict rests on thresholds: 8 of 8 labels change" in run.text
    assert "(backup_ratio: 8 heads; heads L0H0" in run.text  # a count, not a threshold's value
    assert result.verdict.caveats[4].endswith(
        "x 1.25 (from the saved evidence) changes 8 of 8 head labels."
    )
    assert "no division test is in these results" in result.verdict.caveats[5]
    # With the stricter ratio no single survivor is enough: the heads hold the mirror, none is
    # redundant, and all are still backed up (the others carry the work of any one).
    strict = specialization_test(model, task, n_eval=64, n_permutations=100, backup_ratio=0.625)
    assert strict.heads["label"].tolist() == ["mirror"] * 8
    assert strict.heads["backed_up"].all() and not strict.heads["needed"].any()


def test_a_division_table_survives_saving(previous_task, tmp_path):
    model = handbuilt_model(["previous", "uniform"], d_head=18)
    index = pd.DataFrame({"by": ["position"], "index": [0.5], "null_index": [0.1], "p": [0.002]})
    result = specialization_test(
        model, previous_task, n_eval=64, n_permutations=100, division=index
    )
    assert result.runs.iloc[0]["specialized_along"] == "position"
    result.save(tmp_path)
    loaded = SpecializationResult.load(tmp_path)
    assert loaded.division[["run", "by", "p"]].values.tolist() == [["model0", "position", 0.002]]
    assert loaded.verdict.runs[0].specialized_axes == ["position"]
    assert loaded.verdict.text == result.verdict.text
    with pytest.raises(
        ValueError, match=r"division is invalid: a table with columns .* missing \['null_index'\]"
    ):
        attach_division(result, index.drop(columns="null_index"))
