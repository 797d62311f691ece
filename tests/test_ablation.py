"""Ablation with known answers: a hand-built model with two identical previous-token heads and a
uniform head (mhainterp.model.handbuilt), plus equality checks against naive per-head loops."""

from __future__ import annotations

import copy
import re

import numpy as np
import pandas as pd
import pytest
import torch
from torch.testing import assert_close

from mhainterp.ablation import (
    METHODS,
    Ablator,
    ablate,
    evaluate_head_sets,
    head_importance,
    head_sets_table,
    pairwise_ablation,
    resolve_heads,
)
from mhainterp.ablation.replacement import CleanCache
from mhainterp.analyze import ablation_tables
from mhainterp.attribution import (
    compare_importance,
    gradient_importance,
    importance_agreement,
    prune_curve,
)
from mhainterp.fast.linear_readout import applies as _readout_is_linear
from mhainterp.figures.ablation import (
    gradient_vs_ablation_figure,
    importance_figure,
    pairwise_figure,
    pairwise_matrix,
    prune_curve_figure,
    save_ablation_figures,
)
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.scoring import position_scores
from mhainterp.tasks import get_task
from mhainterp.training import build_model, evaluate
from mhainterp.validation import ParameterError

PREV_A, UNIFORM, PREV_B = "L0H0", "L0H1", "L0H2"


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=16, d_vocab=10)


@pytest.fixture(scope="module")
def model():
    return handbuilt_model(["previous", "uniform", "previous"])


@pytest.fixture(scope="module")
def batch(task):
    return task.eval_batch(256)


@pytest.fixture(scope="module")
def multi_task():
    # Multi-target and padded: exercises per-target columns and padding-aware references.
    return get_task("multi_relation", seq_len=8, d_vocab=5, min_len=5)


@pytest.fixture(scope="module")
def multi_model(multi_task):
    return build_model(multi_task, d_model=32, n_heads=4, n_layers=2, seed=3)


@pytest.fixture(scope="module")
def multi_batch(multi_task):
    return multi_task.eval_batch(64)


def uniform_only_accuracy(batch) -> float:
    """Known answer when only the uniform head is left: at t >= 1 the model predicts the most
    frequent token among positions 0..t (the first one on ties); t = 0 is always right."""
    tokens, targets = batch.tokens, batch.targets
    correct = total = 0
    for seq, target in zip(tokens.tolist(), targets.tolist(), strict=True):
        for t in range(len(seq)):
            counts = [seq[: t + 1].count(c) for c in range(10)]
            prediction = 10 if t == 0 else counts.index(max(counts))
            correct += prediction == target[t]
            total += 1
    return correct / total


def all_dead_accuracy(batch) -> float:
    """Known answer with every head removed: class 10 at t = 0, class 0 (all logits tie) after."""
    t = torch.arange(batch.tokens.shape[1]).expand_as(batch.tokens)
    right = (t == 0) | (batch.targets == 0)
    return float(right.float().mean())


# ----------------------------------------------------------------------------- known answers


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_single_heads_backup_and_uniform(model, batch, method):
    table = head_importance(model, batch, method).set_index("head_label")
    assert list(table.index) == [PREV_A, UNIFORM, PREV_B]
    assert table["baseline_accuracy"].eq(1.0).all()
    # Uniform head: nobody needs it. One previous head: the other one backs it up.
    assert table.loc[UNIFORM, "delta_accuracy"] == 0.0
    assert abs(table.loc[UNIFORM, "delta_loss"]) < 1e-4
    assert table.loc[PREV_A, "accuracy"] == 1.0
    assert table.loc[PREV_B, "accuracy"] == 1.0
    assert_close(table.loc[PREV_A, "delta_loss"], table.loc[PREV_B, "delta_loss"])


def test_both_previous_heads_destroy_accuracy(model, batch):
    expected = uniform_only_accuracy(batch)
    assert expected < 0.45
    with ablate(model, [PREV_A, PREV_B]):
        metrics = evaluate(model, batch)
    assert metrics["accuracy"] == pytest.approx(expected, abs=1e-12)
    ablator = Ablator(model, batch).set([PREV_A, PREV_B])
    assert ablator.evaluate()["accuracy"] == pytest.approx(expected, abs=1e-12)


def test_head_sets_table_known_answers(model, batch):
    result = evaluate_head_sets(model, batch, [[PREV_A, PREV_B], [UNIFORM], [], "L0H2,L0H0"])
    table = head_sets_table(result)
    assert table["heads"].tolist() == ["L0H0,L0H2", "L0H1", "", "L0H0,L0H2"]
    assert table["n_ablated"].tolist() == [2, 1, 0, 2]
    assert table.loc[0, "accuracy"] == pytest.approx(uniform_only_accuracy(batch), abs=1e-12)
    assert table.loc[1, "accuracy"] == 1.0  # nobody needs the uniform head
    assert table.loc[2, "delta_loss"] == 0.0 and table.loc[2, "delta_accuracy"] == 0.0
    with ablate(model, [PREV_A, PREV_B], "zero"):
        joint = evaluate(model, batch)
    assert table.loc[3, "loss"] == pytest.approx(joint["loss"], abs=1e-5)
    with pytest.raises(TypeError, match="head_sets must be a list of head sets"):
        evaluate_head_sets(model, batch, "L0H0")
    with pytest.raises(ValueError, match="L0H9"):
        evaluate_head_sets(model, batch, [["L0H9"]])
    no_clean = evaluate_head_sets(model, batch, [[UNIFORM]])
    with pytest.raises(ValueError, match=r"result=.*'L0H1'.* is invalid: .*include the clean"):
        head_sets_table(no_clean)


def test_pairwise_shows_backup(model, batch):
    table = pairwise_ablation(model, batch, "zero")
    acc = table[table["metric"] == "accuracy"].set_index(["head_a", "head_b"])
    assert list(acc.index) == [(PREV_A, UNIFORM), (PREV_A, PREV_B), (UNIFORM, PREV_B)]
    expected_drop = 1.0 - uniform_only_accuracy(batch)
    backup = acc.loc[(PREV_A, PREV_B)]
    assert backup["damage_a"] == 0.0 and backup["damage_b"] == 0.0
    assert backup["damage_joint"] == pytest.approx(expected_drop, abs=1e-12)
    assert backup["interaction"] == pytest.approx(expected_drop, abs=1e-12)  # joint >> sum
    assert acc.loc[(PREV_A, UNIFORM), "interaction"] == 0.0
    assert acc.loc[(UNIFORM, PREV_B), "interaction"] == 0.0
    loss = table[table["metric"] == "loss"].set_index(["head_a", "head_b"])
    assert loss["interaction"].idxmax() == (PREV_A, PREV_B)
    assert set(table.columns) >= {"damage_sum", "ablated_joint", "baseline", "method"}


def test_pairwise_subset_of_heads(model, batch):
    table = pairwise_ablation(model, batch, heads="L0H2,L0H0")
    assert table[["head_a", "head_b"]].drop_duplicates().values.tolist() == [[PREV_A, PREV_B]]


@pytest.mark.parametrize("rescore", [True, False])
def test_prune_curve_known_order(model, batch, rescore):
    curve = prune_curve(model, batch, "zero", rescore=rescore)
    assert curve["n_heads_left"].tolist() == [3, 2, 1, 0]
    assert curve["removed"].tolist()[:2] == ["", UNIFORM]  # the useless head goes first
    assert set(curve["removed"].tolist()[2:]) == {PREV_A, PREV_B}
    assert curve["accuracy"].tolist()[:3] == [1.0, 1.0, 1.0]  # one previous head suffices
    assert curve["accuracy"].iloc[3] == pytest.approx(all_dead_accuracy(batch), abs=1e-12)
    # ``pruned`` is a head set (sorted, the format every function accepts); ``removed`` the order.
    assert curve["pruned"].iloc[1] == UNIFORM
    assert curve["pruned"].iloc[3] == ",".join(sorted([UNIFORM, PREV_A, PREV_B]))


@pytest.mark.parametrize("rescore", [True, False])
def test_prune_curve_on_a_head_subset_keeps_the_others(model, batch, rescore):
    curve = prune_curve(model, batch, "zero", rescore=rescore, heads=[PREV_A, UNIFORM])
    assert curve["n_heads_left"].tolist() == [2, 1, 0]
    assert curve["removed"].tolist() == ["", UNIFORM, PREV_A]  # PREV_B is never removed
    assert curve["accuracy"].tolist() == [1.0, 1.0, 1.0]  # the kept previous head suffices


# ----------------------------------------------------------------------------- batched == naive


def naive_importance(model, batch, method, target_names=None):
    rows = []
    for label in model.head_labels:
        with ablate(model, [label], method, reference=batch):
            rows.append({"head_label": label, **evaluate(model, batch)})
    return pd.DataFrame(rows).set_index("head_label")


@pytest.mark.parametrize("method", METHODS)
def test_batched_importance_equals_naive_loop(model, batch, method):
    batched = head_importance(model, batch, method).set_index("head_label")
    naive = naive_importance(model, batch, method)
    for column in ("loss", "accuracy"):
        np.testing.assert_allclose(
            batched[column].to_numpy(), naive[column].to_numpy(), atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("method", METHODS)
def test_batched_importance_equals_naive_loop_multilayer_multitarget(
    multi_model, multi_task, multi_batch, method
):
    # max_rows=100 forces several chunks (copies and sequences) through the batched pass.
    batched = head_importance(multi_model, multi_batch, method, max_rows=100)
    batched = batched.set_index("head_label")
    naive = naive_importance(multi_model, multi_batch, method)
    columns = ["loss", "accuracy", "accuracy/target0", "accuracy/target1", "accuracy/target2"]
    for column in columns:
        np.testing.assert_allclose(
            batched[column].to_numpy(), naive[column].to_numpy(), atol=1e-5, rtol=0
        )
    baseline = evaluate(multi_model, multi_batch)
    assert_close(batched["baseline_loss"].iloc[0], baseline["loss"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        batched["delta_accuracy/target1"].to_numpy(),
        batched["accuracy/target1"].to_numpy() - baseline["accuracy/target1"],
        atol=1e-6,
        rtol=0,
    )
    named = head_importance(multi_model, multi_task, method, n_eval=64)
    assert "delta_accuracy/mirror" in named.columns  # a Task gives its target names


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "name, params",
    [("count_previous", {}), ("multi_relation", {"min_len": 7})],  # 3 targets, padded
)
def test_linear_readout_equals_the_full_forward(method, name, params):
    """On a one-layer attention-only model the copies' logits are the clean logits plus each
    replaced head's change read out through W_O[h] @ W_U (class-major, several targets and
    padding included); a hook after hook_z forces the full per-copy forward, and both give the
    same table (near-ties are re-scored exactly)."""
    task = get_task(name, seq_len=12, d_vocab=6, **params)
    model = build_model(task, n_heads=4, seed=3, d_model=32, n_layers=1)
    batch = task.eval_batch(200)
    assert _readout_is_linear(model, 0)
    assert bool((~batch.padding_mask).any()) == ("min_len" in params)
    fast = head_importance(model, batch, method)
    with model.hooks(fwd_hooks=[("blocks.0.hook_attn_out", lambda x, hook: x)]):
        assert not _readout_is_linear(model, 0)
        full = head_importance(model, batch, method)
    np.testing.assert_allclose(fast["loss"], full["loss"], atol=1e-5, rtol=0)
    for column in [c for c in full.columns if c.startswith("accuracy")]:
        assert fast[column].tolist() == full[column].tolist(), column
    assert full["delta_loss"].abs().max() > 1e-3  # ablations do change the output
    for name in ("hook_unembed", "unembed.hook_in", "blocks.0.hook_resid_post"):
        with model.hooks(fwd_hooks=[(name, lambda x, hook: x)]):
            assert not _readout_is_linear(model, 0), name  # a user's hook must see every copy


@pytest.mark.parametrize("method", ["mean", "resample"])
@pytest.mark.parametrize("which", ["linear_readout", "two_layers"])
def test_the_batch_as_its_own_reference_runs_its_clean_forward_once(which, method, model, batch):
    """Mean and resample ablation of a batch against itself: the clean forward that gives the
    replacement also gives the copies' clean prefix, so the model runs clean once, not twice,
    and every score is bit-identical to the two-forward path (an explicit reference, which is
    not the evaluated batch object, takes that path). Several chunks keep their own."""
    m, b = model, batch
    if which == "two_layers":  # the full per-copy forward, from either layer
        two = get_task("count_previous", seq_len=8, d_vocab=5)
        m, b = build_model(two, d_model=32, n_heads=4, n_layers=2, seed=3), two.eval_batch(64)
    sets = [[], [(0, 0)], [(0, 1), (m.cfg.n_layers - 1, 2)]]
    calls = []
    original = m.logits

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    m.logits = counted  # the clean forwards; the copies run from the prefix on
    try:
        once = evaluate_head_sets(m, b, sets, method, per_position=True)
        n_once = len(calls)
        calls.clear()
        twice = evaluate_head_sets(m, b, sets, method, reference=b, per_position=True)
        n_twice = len(calls)
        calls.clear()
        chunked = evaluate_head_sets(m, b, sets, method, per_position=True, max_rows=16)
    finally:
        del m.logits
    assert (n_once, n_twice) == (1, 2)
    assert len(calls) > 2  # several chunks: the prefixes are each chunk's own forward
    assert torch.equal(once.totals.loss_sum, twice.totals.loss_sum)
    assert torch.equal(once.totals.correct, twice.totals.correct)
    assert torch.equal(once.scores.nll, twice.scores.nll)
    assert torch.equal(once.scores.correct, twice.scores.correct)
    # other chunk shapes sum in another order: equal to rounding, not to the bit
    assert_close(once.scores.nll, chunked.scores.nll, rtol=1e-6, atol=1e-6)
    assert torch.equal(once.totals.correct, chunked.totals.correct)


def test_pairwise_equals_naive_joint_ablation(multi_model, multi_batch):
    table = pairwise_ablation(multi_model, multi_batch, "mean", max_rows=150)
    row = table[(table["head_a"] == "L0H1") & (table["head_b"] == "L1H3")]
    row = row.set_index("metric")
    with ablate(multi_model, ["L0H1", "L1H3"], "mean", reference=multi_batch):
        joint = evaluate(multi_model, multi_batch)
    assert_close(row.loc["loss", "ablated_joint"], joint["loss"], atol=1e-5, rtol=0)
    assert_close(row.loc["accuracy", "ablated_joint"], joint["accuracy"], atol=1e-5, rtol=0)
    assert len(table) == 28 * 5  # 8 heads -> 28 pairs, 5 metrics


# ----------------------------------------------------------------------------- semantics


def clean_z(model, batch, layer=0):
    _, cache = model.run_with_cache(batch.tokens, batch.padding_mask)
    return cache["z", layer]  # (n, T, h, d_head)


def ablated_z(model, batch, heads, method, reference, layer=0, generator=None):
    with ablate(model, heads, method, reference=reference, generator=generator):
        _, cache = model.run_with_cache(batch.tokens, batch.padding_mask)
    return cache["z", layer]


def test_ablating_no_heads_is_exactly_the_baseline(model, batch):
    expected = model(batch.tokens)
    for method in METHODS:
        with ablate(model, [], method, reference=batch):
            assert torch.equal(model(batch.tokens), expected)
        ablator = Ablator(model, batch, method=method)
        assert ablator.toggle(PREV_A).toggle(PREV_A).evaluate() == {
            **ablator.baseline_,
            "delta_loss": 0.0,
            "delta_accuracy": 0.0,
        }
    assert_close(ablator.baseline_["loss"], evaluate(model, batch)["loss"], atol=1e-7, rtol=0)


def test_ablation_edits_only_the_listed_heads(multi_model, multi_batch):
    clean = clean_z(multi_model, multi_batch, layer=0)
    zeroed = ablated_z(multi_model, multi_batch, ["L0H2"], "zero", None, layer=0)
    assert torch.equal(zeroed[:, :, 2], torch.zeros_like(zeroed[:, :, 2]))
    assert torch.equal(zeroed[:, :, [0, 1, 3]], clean[:, :, [0, 1, 3]])
    assert len(multi_model.hook_dict["blocks.0.attn.hook_z"].fwd_hooks) == 0  # hooks removed


def test_mean_ablation_is_the_per_position_mean_over_real_tokens(multi_model, multi_batch):
    reference = multi_batch[:40]
    ref_z = clean_z(multi_model, reference, layer=1)[:, :, 3]  # (40, T, d_head)
    real = reference.padding_mask
    assert not real.all()  # the reference has padding, which must not enter the mean
    expected = torch.stack(
        [ref_z[real[:, t], t].mean(0) for t in range(real.shape[1])]
    )  # (T, d_head)
    got = ablated_z(multi_model, multi_batch, ["L1H3"], "mean", reference, layer=1)[:, :, 3]
    assert_close(got, expected.expand_as(got), atol=1e-6, rtol=1e-6)


def test_resample_takes_other_sequences_and_is_reproducible(multi_model, multi_task):
    batch = multi_task.sample(12, torch.Generator().manual_seed(5))
    clean = clean_z(multi_model, batch)[:, :, 1]  # (12, T, d_head)
    got = ablated_z(
        multi_model, batch, ["L0H1"], "resample", batch, generator=torch.Generator().manual_seed(7)
    )[:, :, 1]
    real = batch.padding_mask
    mean = torch.stack([clean[real[:, t], t].mean(0) for t in range(real.shape[1])])
    donors = []
    for i in range(len(batch)):
        # The donor is the sequence whose z matches at position 0 (always real).
        matches = [j for j in range(len(batch)) if torch.allclose(got[i, 0], clean[j, 0])]
        assert len(matches) == 1
        j = matches[0]
        donors.append(j)
        both = real[j]
        assert_close(got[i, both], clean[j, both])
        assert_close(got[i, ~both], mean[~both])  # donor padding -> per-position mean
    assert sorted(donors) == list(range(len(batch)))  # a permutation...
    assert all(i != j for i, j in enumerate(donors))  # ...with no sequence keeping its own
    again = ablated_z(
        multi_model, batch, ["L0H1"], "resample", batch, generator=torch.Generator().manual_seed(7)
    )[:, :, 1]
    other = ablated_z(
        multi_model, batch, ["L0H1"], "resample", batch, generator=torch.Generator().manual_seed(8)
    )[:, :, 1]
    assert torch.equal(got, again)
    assert not torch.equal(got, other)


def test_resample_from_one_sequence_is_refused(multi_model, multi_task):
    # The single-cycle permutation of one sequence is that sequence: its own z replaced the
    # ablated head's, so the "ablation" equalled the clean run, and nothing said so.
    one = multi_task.sample(1, torch.Generator().manual_seed(5))
    said = "reference is invalid: at least 2 sequences for method='resample'"
    refused = pytest.raises(ParameterError, match=re.escape(said))
    with refused, ablate(multi_model, ["L0H1"], "resample", reference=one):
        pass
    with pytest.raises(ParameterError, match=re.escape(said)):  # the engine's tables too
        head_importance(multi_model, one, method="resample")
    # Nor the mean of one sequence: it is that sequence's own z, and every damage came out 0
    # (one sentence of text read "0 of 72 heads needed"). Zero ablation needs no reference.
    own = "reference is invalid: at least 2 sequences for method='mean' (the mean of one"
    with pytest.raises(ParameterError, match=re.escape(own)):
        head_importance(multi_model, one, method="mean")
    assert head_importance(multi_model, one, method="zero").shape[0] == 8
    # Two sequences: each takes the other's z.
    two = multi_task.sample(2, torch.Generator().manual_seed(5))
    clean = clean_z(multi_model, two)[:, :, 1]
    got = ablated_z(multi_model, two, ["L0H1"], "resample", two)[:, :, 1]
    assert torch.equal(got[0, 0], clean[1, 0]) and torch.equal(got[1, 0], clean[0, 0])


# ----------------------------------------------------------------------------- gradients


def test_gradient_importance_matches_finite_differences(multi_model, multi_batch):
    model = copy.deepcopy(multi_model).double()  # float64: finite differences need it
    batch = multi_batch[:6]
    table = gradient_importance(model, batch, normalize=False).set_index("head_label")
    eps = 1e-5
    for label in ["L0H0", "L0H3", "L1H2"]:
        layer, head = resolve_heads(model, label)[0]
        slopes = []
        for i in range(len(batch)):
            losses = []
            for scale in (1 + eps, 1 - eps):

                def gate(z, hook, scale=scale, head=head):
                    z = z.clone()
                    z[:, :, head] *= scale
                    return z

                with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", gate)]):
                    losses.append(evaluate(model, batch[i])["loss"])
            slopes.append(abs(losses[0] - losses[1]) / (2 * eps))
        expected = sum(slopes) / len(slopes)
        assert table.loc[label, "raw_importance"] == pytest.approx(expected, rel=1e-5)


def test_gradient_importance_normalised_per_layer(multi_model, multi_batch):
    table = gradient_importance(multi_model, multi_batch)
    norms = table.groupby("layer")["importance"].apply(lambda s: float((s**2).sum() ** 0.5))
    np.testing.assert_allclose(norms.to_numpy(), np.ones(2), atol=1e-6, rtol=0)
    raw = table.set_index("head_label")["raw_importance"]
    layer0 = raw[["L0H0", "L0H1", "L0H2", "L0H3"]]
    assert_close(
        table.set_index("head_label").loc["L0H2", "importance"],
        raw["L0H2"] / float((layer0**2).sum() ** 0.5),
    )


def test_gradient_importance_known_heads():
    model = handbuilt_model(["previous", "dead", "previous"])
    batch = get_task("previous_token", seq_len=16, d_vocab=10).eval_batch(64)
    table = gradient_importance(model, batch).set_index("head_label")
    assert table.loc["L0H1", "importance"] == 0.0  # a head that writes nothing
    assert_close(table.loc["L0H0", "importance"], table.loc["L0H2", "importance"])
    assert_close(table.loc["L0H0", "importance"], 2**-0.5, atol=1e-6, rtol=0)


def test_importance_agreement_is_spearman():
    heads = ["L0H0", "L0H1", "L0H2", "L0H3"]
    gradient = pd.DataFrame(
        {"head_label": heads, "layer": 0, "head": range(4), "importance": [0.1, 0.2, 0.3, 0.4]}
    )
    ablation = pd.DataFrame(
        {
            "head_label": heads * 2,
            "method": ["zero"] * 4 + ["mean"] * 4,
            "delta_loss": [1.0, 2.0, 4.0, 3.0, 4.0, 3.0, 2.0, 1.0],  # zero, then mean
        }
    )
    agreement = importance_agreement(gradient, ablation).set_index("method")
    assert list(agreement.index) == ["zero", "mean"]
    assert agreement.loc["zero", "spearman"] == pytest.approx(0.8)
    assert agreement.loc["mean", "spearman"] == pytest.approx(-1.0)
    compared = compare_importance(gradient, ablation)
    zero = compared[compared["method"] == "zero"].set_index("head_label")
    assert zero["ablation_rank"].tolist() == [4.0, 3.0, 1.0, 2.0]
    assert zero["gradient_rank"].tolist() == [4.0, 3.0, 2.0, 1.0]
    expected = r"ablation is invalid: a table with a 'delta_accuracy/x' column, got columns head_"
    with pytest.raises(ValueError, match=expected):
        compare_importance(gradient, ablation, ablation_column="delta_accuracy/x")


# ----------------------------------------------------------------------------- Ablator


def test_ablator_state_and_agreement_with_ablate(model, batch):
    ablator = Ablator(model, batch)
    assert ablator.valid_heads == [PREV_A, UNIFORM, PREV_B]
    ablator.toggle("L0H2").toggle("L0H0")
    assert ablator.heads == [PREV_A, PREV_B]
    ablator.method = "mean"
    result = ablator.evaluate()
    with ablate(model, [PREV_A, PREV_B], "mean", reference=batch):
        expected = evaluate(model, batch)
    assert_close(result["loss"], expected["loss"], atol=1e-5, rtol=0)
    assert result["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-5)
    assert result["delta_loss"] == pytest.approx(result["loss"] - ablator.baseline_["loss"])
    table = ablator.table()
    assert table.columns.tolist() == ["metric", "baseline", "ablated", "delta"]
    assert table["metric"].tolist() == ["loss", "accuracy"]
    assert ablator.set(["L0H1"]).heads == [UNIFORM]
    assert ablator.reset().heads == [] and ablator.method == "mean"
    assert "mean" in repr(ablator)


def test_ablator_per_target(multi_model, multi_task):
    ablator = Ablator(multi_model, multi_task, n_eval=64)
    result = ablator.set("L0H3").evaluate()
    assert [k for k in result if k.startswith("accuracy/")] == [
        "accuracy/previous",
        "accuracy/mirror",
        "accuracy/count_previous",
    ]
    expected = head_importance(multi_model, multi_task, n_eval=64).set_index("head_label")
    assert_close(result["accuracy/mirror"], expected.loc["L0H3", "accuracy/mirror"])


# ----------------------------------------------------------------------------- errors


def test_unknown_heads_list_the_valid_ones(multi_model):
    eight = build_model(get_task("previous_token"), d_model=64, n_heads=8)
    with pytest.raises(ValueError, match=r"'L0H9'.*valid heads.*L0H0, L0H1.*L0H7"):
        resolve_heads(eight, ["L0H9"])
    with pytest.raises(ValueError, match=r"'L3H0'.*valid heads.*L0H7$"):
        resolve_heads(eight, "L3H0")
    with pytest.raises(ValueError, match=r"'head2'.*valid heads"):
        resolve_heads(eight, ["head2"])
    with pytest.raises(TypeError, match="valid heads"):
        resolve_heads(eight, [2])
    with pytest.raises(ValueError, match="L1H3"), ablate(multi_model, ["L2H0"]):
        pass
    assert resolve_heads(multi_model, ["L1H0", (0, 2), "L1H0"]) == [(0, 2), (1, 0)]
    assert resolve_heads(multi_model, "") == []


def test_bad_method_and_missing_reference(model, batch):
    allowed = "one of 'zero', 'mean', 'resample'"
    with pytest.raises(ValueError, match=f"method='median' is invalid: {allowed}"):
        head_importance(model, batch, "median")
    with pytest.raises(ValueError, match=allowed), ablate(model, [UNIFORM], "Zero"):
        pass
    ablator = Ablator(model, batch)
    with pytest.raises(ValueError, match=allowed):
        ablator.method = "random"
    assert ablator.method == "zero"
    with pytest.raises(ValueError, match="needs reference="), ablate(model, [UNIFORM], "mean"):
        pass
    with pytest.raises(ValueError, match="valid heads"):
        ablator.toggle("L0H1", "L0H9")
    assert ablator.heads == []  # a failed toggle changes nothing
    with pytest.raises(TypeError, match="Task or a Batch"):
        head_importance(model, batch.tokens)
    with pytest.raises(ValueError, match="by='size' is invalid"):
        prune_curve(model, batch, by="size")


def test_the_ablation_tables_share_one_clean_forward_per_chunk(
    multi_model, multi_batch, monkeypatch
):
    """analyze's tables (importance by three methods, pairwise, the pruning curve's steps) run
    on one model and batch: with one CleanCache the clean prefixes are computed once per chunk
    of sequences, not once per table and pruning step, and every table is the same."""
    from mhainterp.ablation import engine

    alone = {
        "importance": pd.concat(
            [head_importance(multi_model, multi_batch, m) for m in METHODS], ignore_index=True
        ),
        "pairwise": pairwise_ablation(multi_model, multi_batch, "mean"),
        "prune_curve": prune_curve(multi_model, multi_batch, "mean", shortlist=8),
    }
    forwards = []
    real = engine._clean_prefixes
    monkeypatch.setattr(engine, "_clean_prefixes", lambda *a: forwards.append(a[2]) or real(*a))
    tables = ablation_tables(multi_model, multi_batch, pairwise_heads=None)
    for name, table in alone.items():
        pd.testing.assert_frame_equal(tables[name], table, check_exact=True)
    steps = len(tables["prune_curve"])  # 9: the clean model and 8 removals
    assert len(forwards) <= 2 < steps, forwards  # one forward for the batch (was one a step)


# ----------------------------------------------------------------------------- figures


def test_figures_and_tables(model, task, tmp_path):
    tables = ablation_tables(model, task, n_eval=128)
    assert list(tables) == [
        "importance",
        "pairwise",
        "gradient_importance",
        "importance_agreement",
        "prune_curve",
    ]
    assert tables["importance"]["method"].tolist() == [m for m in METHODS for _ in range(3)]
    matrix = pairwise_matrix(tables["pairwise"], metric="accuracy")
    assert matrix.index.tolist() == [PREV_A, UNIFORM, PREV_B]
    np.testing.assert_array_equal(matrix.to_numpy(), matrix.to_numpy().T)
    backup = tables["pairwise"].query(
        "metric == 'accuracy' and head_a == 'L0H0' and head_b == 'L0H2'"
    )
    assert matrix.loc[PREV_B, PREV_A] == backup["interaction"].item() > 0.5

    fig = importance_figure(tables["importance"])
    assert [ax.get_title() for ax in fig.axes[:2]] == [
        "Δ loss when the head is ablated",
        "Δ accuracy when the head is ablated",
    ]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [PREV_A, UNIFORM, PREV_B]
    assert "redundancy" in pairwise_figure(tables["pairwise"]).axes[0].get_title()
    assert prune_curve_figure(tables["prune_curve"]).axes[0].get_xlabel() == "heads left"
    comparison = compare_importance(tables["gradient_importance"], tables["importance"])
    fig = gradient_vs_ablation_figure(comparison, tables["importance_agreement"])
    assert len(fig.axes) >= 3 and "Spearman" in fig.axes[0].get_title()

    saved = save_ablation_figures(tables, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{name}.{ext}" for name in saved for ext in ("png", "pdf", "csv")]
    )
    csv = pd.read_csv(tmp_path / "ablation_prune_curve.csv", keep_default_na=False)
    assert csv["removed"].tolist() == tables["prune_curve"]["removed"].tolist()


def test_per_target_importance_figure(multi_model, multi_task):
    table = head_importance(multi_model, multi_task, "mean", n_eval=64)
    fig = importance_figure(table)
    assert len([ax for ax in fig.axes if ax.get_title()]) == 3
    assert fig.axes[2].get_title() == "Δ accuracy per target (mean ablation)"
    with pytest.raises(
        ValueError, match=r"importance is invalid: .* missing columns \['delta_loss'\]"
    ):
        importance_figure(table.drop(columns="delta_loss"))


def test_prune_shortlist_is_exact_while_few_heads_remain(model, batch, multi_model, multi_batch):
    """The shortlist re-scores only the least important candidates; with at most `shortlist`
    heads remaining that is every head, so the curve equals the full greedy one."""
    full = prune_curve(multi_model, multi_batch, "mean", shortlist=None)  # 2 layers x 4 heads
    pd.testing.assert_frame_equal(prune_curve(multi_model, multi_batch, "mean", shortlist=8), full)
    # The hand-built model: the first step scores all three heads and removes the useless one;
    # then one candidate per step (the two identical previous heads tie: layer-major order).
    short = prune_curve(model, batch, "zero", shortlist=1)
    pd.testing.assert_frame_equal(short, prune_curve(model, batch, "zero", shortlist=None))
    assert short["removed"].tolist() == ["", UNIFORM, PREV_A, PREV_B]
    with pytest.raises(ValueError, match="shortlist=0 is invalid: an integer >= 1"):
        prune_curve(model, batch, shortlist=0)


@pytest.mark.parametrize("k", [1, 2])
def test_class_major_scores_equal_the_model_layout(k):
    """The linear readout hands the scorer class-major logits (the class axis outermost in
    memory): the same argmax (the first of equal maxima, as torch.max), the same correctness,
    and the same cross-entropy to rounding; NaN logits fall back to torch.max's answer."""
    generator = torch.Generator().manual_seed(0)
    shape = (3, 5, 7, k, 6) if k > 1 else (3, 5, 7, 6)
    logits = torch.randn(shape, generator=generator)
    logits[0, 0, 0, ..., 2] = logits[0, 0, 0, ..., 4] = 9.0  # an exact tie: class 2 wins
    targets = torch.randint(0, 6, shape[1:-1], generator=generator)
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[1, 3:] = False
    major = logits.movedim(-1, 1).contiguous().movedim(1, -1)  # same values, class-major memory
    assert not major.is_contiguous() and torch.equal(major, logits)
    for weird in (False, True):
        if weird:
            logits[2, 1, 1] = major[2, 1, 1] = float("nan")
        model_layout = position_scores(logits, targets, mask)
        class_major = position_scores(major, targets, mask)
        assert torch.equal(class_major.predictions, model_layout.predictions)
        assert torch.equal(class_major.correct, model_layout.correct)
        assert_close(class_major.nll, model_layout.nll, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert model_layout.predictions[0, 0, 0].tolist() == [2] * k


def test_copies_split_into_chunks_share_one_readout_basis(model, batch, monkeypatch):
    """Copies over the same sequences, split into several forwards, build the linear readout's
    basis (clean logits and every head's change) once, and score as one forward does."""
    from mhainterp.fast import linear_readout

    built = []
    original = linear_readout.readout_basis
    monkeypatch.setattr(
        linear_readout, "readout_basis", lambda *a, **kw: built.append(1) or original(*a, **kw)
    )
    sets = [[], [(0, 0)], [(0, 1)], [(0, 2)], [(0, 0), (0, 2)]]
    whole = evaluate_head_sets(model, batch, sets, "mean", per_position=True)
    assert len(built) == 1
    built.clear()
    split = evaluate_head_sets(
        model, batch, sets, "mean", per_position=True, max_rows=2 * len(batch)
    )
    assert len(built) == 1  # three forwards of copies (2 + 2 + 1), one basis
    assert torch.equal(split.scores.correct, whole.scores.correct)
    assert_close(split.scores.nll, whole.scores.nll, rtol=1e-6, atol=1e-6)


def test_copies_are_split_into_even_forwards(model, batch, monkeypatch):
    """Five copies at four per forward run as 3 + 2, not 4 + 1 (a big last-but-one chunk and a
    tiny last one cost more than two even ones), and score as one forward does."""
    from mhainterp.ablation import engine

    sizes = []
    original = engine._forward_copies
    monkeypatch.setattr(
        engine, "_forward_copies",
        lambda model, part, chunk, *a, **kw: sizes.append(len(chunk))
        or original(model, part, chunk, *a, **kw),
    )  # fmt: skip
    sets = [[(0, 0)], [(0, 1)], [(0, 2)], [(0, 0), (0, 2)], [(0, 1), (0, 2)]]
    whole = evaluate_head_sets(model, batch, sets, "zero", per_position=True)
    assert sizes == [5]
    sizes.clear()
    split = evaluate_head_sets(
        model, batch, sets, "zero", per_position=True, max_rows=4 * len(batch)
    )
    assert sizes == [3, 2]
    assert torch.equal(split.scores.correct, whole.scores.correct)
    assert_close(split.scores.nll, whole.scores.nll, rtol=1e-6, atol=1e-6)


def test_a_shared_clean_cache_computes_clean_logits_and_means_once(model, batch, monkeypatch):
    """Passes of several methods over one model and batch (the division test's) share the
    clean logits of the linear readout and the per-position means through their CleanCache,
    and score exactly as passes without one."""
    from mhainterp.ablation import replacement as replacement_module
    from mhainterp.fast import linear_readout

    sets = [[], [(0, 0)], [(0, 1), (0, 2)]]
    alone = {m: evaluate_head_sets(model, batch, sets, m, per_position=True) for m in METHODS}
    counted = {"clean logits": 0, "means": 0}
    original_means = replacement_module._per_position_mean
    original_basis = linear_readout.readout_basis

    def means(*args):
        counted["means"] += 1
        return original_means(*args)

    def basis(model, layer, resid_pre, z, values, clean=None):
        counted["clean logits"] += clean is None
        return original_basis(model, layer, resid_pre, z, values, clean)

    monkeypatch.setattr(replacement_module, "_per_position_mean", means)
    monkeypatch.setattr(linear_readout, "readout_basis", basis)
    cache = CleanCache()
    shared = {
        m: evaluate_head_sets(model, batch, sets, m, per_position=True, cache=cache)
        for m in ("mean", "zero", "resample")
    }
    # one layer: one clean-logits product and one mean table for the three methods
    assert counted == {"clean logits": 1, "means": 1}
    for m in METHODS:
        assert torch.equal(shared[m].scores.correct, alone[m].scores.correct)
        assert torch.equal(shared[m].scores.nll, alone[m].scores.nll)


def test_a_configuration_scored_before_on_a_cache_is_taken_from_it_bit_for_bit(
    multi_model, multi_batch, monkeypatch
):
    """A later pass on the same CleanCache and replacement values runs only the configurations
    it has not scored (the pruning curve's first step is the importance table's singles);
    those it takes have the bits of a fresh run, whatever ran beside them; another method's
    values are not taken."""
    from mhainterp.ablation import engine

    heads = [(layer, head) for layer in range(2) for head in range(4)]
    singles = [[h] for h in heads]
    pairs = [[a, b] for i, a in enumerate(heads) for b in heads[i + 1 :]]
    run = []
    real = engine._run_masks
    monkeypatch.setattr(engine, "_run_masks", lambda m, b, masks, *a, **k: run.append(
        masks.shape[0]) or real(m, b, masks, *a, **k))  # fmt: skip
    cache = CleanCache()
    evaluate_head_sets(multi_model, multi_batch, [[], *singles], "mean", cache=cache)
    later = evaluate_head_sets(multi_model, multi_batch, [*pairs, *singles], "mean", cache=cache)
    assert run == [1 + len(heads), len(pairs)]  # the singles were not run again
    evaluate_head_sets(multi_model, multi_batch, singles, "zero", cache=cache)
    assert run[-1] == len(heads)  # other values: run
    fresh = evaluate_head_sets(multi_model, multi_batch, [*pairs, *singles], "mean")
    assert torch.equal(later.totals.loss_sum, fresh.totals.loss_sum)
    assert torch.equal(later.totals.correct, fresh.totals.correct)
    assert torch.equal(later.totals.scored, fresh.totals.scored)


def test_a_clean_cache_refuses_another_model_batch_or_reference(model, task, batch):
    """A cache holds one model's activations of one batch and reference: reused with others
    it would score them with these, so it says so instead (as ReferencePrefix does)."""
    cache, sets = CleanCache(), [[PREV_A]]
    first = evaluate_head_sets(model, batch, sets, "mean", cache=cache)
    same = task.eval_batch(256)  # equal sequences in new tensors: the cache applies
    again = evaluate_head_sets(model, same, sets, "mean", cache=cache)
    assert torch.equal(first.totals.loss_sum, again.totals.loss_sum)
    other = task.eval_batch(128)
    with pytest.raises(
        ValueError, match=r"CleanCache of the reference .*another reference \(\(128, 16\)"
    ):
        evaluate_head_sets(model, other, sets, "mean", cache=cache)
    with pytest.raises(ValueError, match=r"CleanCache of the batch .* another batch"):
        evaluate_head_sets(model, other, sets, "mean", reference=batch, cache=cache)
    with pytest.raises(ValueError, match=r"CleanCache of the batch"):
        evaluate_head_sets(model, other, sets, "zero", cache=cache)  # zero: no reference
    twin = handbuilt_model(["previous", "uniform", "previous"])
    with pytest.raises(ValueError, match="CleanCache of the model .* another model"):
        evaluate_head_sets(twin, batch, sets, "mean", cache=cache)


@pytest.mark.parametrize("method", METHODS)
def test_readout_basis_is_the_einsum_of_each_heads_change_bit_for_bit(method):
    """The linear readout's table holds the clean logits and each head's change
    ``einsum("sthd,hdv->hvst", values - z, W_O @ W_U)``, written in place by one batched
    product; bit for bit the einsum's (a rounding change would move every division table)."""
    from mhainterp.ablation.replacement import build_replacement
    from mhainterp.fast.linear_readout import readout_basis

    task = get_task("count_previous", seq_len=12, d_vocab=6)
    model = build_model(task, n_heads=4, seed=3, d_model=32, n_layers=1)
    batch = task.eval_batch(300)
    replacement = build_replacement(model, method, batch)
    z = capture_z_of(model, batch)
    resid_pre = z["resid_pre"]
    values = replacement.values(0, torch.arange(len(batch)), z["z"])
    basis = readout_basis(model, 0, resid_pre, z["z"], values)
    readout = model.blocks[0].attn.W_O @ model.W_U
    change = torch.einsum("sthd,hdv->hvst", values - z["z"], readout)
    assert torch.equal(basis.table[1:], change)
    assert torch.equal(basis.table[0], basis.clean.reshape(len(batch), 12, -1).permute(2, 0, 1))


def capture_z_of(model, batch) -> dict:
    """The clean ``hook_resid_pre`` and (contiguous) ``hook_z`` of layer 0 on ``batch``."""
    names = ("blocks.0.hook_resid_pre", "blocks.0.attn.hook_z")
    _, cache = model.run_with_cache(batch.tokens, names_filter=lambda n: n in names)
    return {
        "resid_pre": cache["blocks.0.hook_resid_pre"],
        "z": cache["blocks.0.attn.hook_z"].contiguous(),
    }


def test_scores_of_sequences_in_order_are_stacked_as_the_scatter_places_them(model, batch):
    """Per-position scores of a batch whose sequences are already longest first (every chunk
    holds them all, in order) are stacked in place: the same tensors as the general scatter
    back through the length order gives (a padded batch takes that path)."""
    from mhainterp.ablation import engine

    sets = [[], [(0, 0)], [(0, 1)], [(0, 2)], [(0, 0), (0, 2)]]
    stacked = evaluate_head_sets(model, batch, sets, "mean", per_position=True).scores
    assert bool(batch.padding_mask.all())  # in order: the stacking path ran
    jobs = [(0, [0, 1, 2], 0, len(batch)), (0, [3, 4], 0, len(batch))]
    pieces = {(0, 0): _rows(stacked, [0, 1, 2]), (3, 0): _rows(stacked, [3, 4])}
    scattered = engine._assemble(pieces, jobs, torch.arange(len(batch)), 5, batch)
    restacked = engine._stack(pieces, jobs, 5, batch)
    for name in ("nll", "correct", "predictions"):
        assert torch.equal(getattr(scattered, name), getattr(stacked, name)), name
        assert torch.equal(getattr(restacked, name), getattr(stacked, name)), name


def _rows(scores, rows: list[int]):
    from mhainterp.scoring import PositionScores

    return PositionScores(
        nll=scores.nll[rows],
        correct=scores.correct[rows],
        predictions=scores.predictions[rows],
        scored=scores.scored,
    )


def test_head_masks_mark_exactly_the_listed_heads(multi_model):
    """One ``[L, h]`` mask per head set, True at its heads only (built on the host in one
    step), and a head out of range is refused."""
    from mhainterp.ablation.engine import head_masks

    L, h = multi_model.cfg.n_layers, multi_model.cfg.n_heads
    sets = [[], [(0, 1)], [(L - 1, h - 1), (0, 0)]]
    masks = head_masks(multi_model, sets, device="cpu")
    expected = torch.zeros(len(sets), L, h, dtype=torch.bool)
    for c, pairs in enumerate(sets):
        for layer, head in pairs:
            expected[c, layer, head] = True
    assert torch.equal(masks, expected)
    with pytest.raises(IndexError, match="out of range"):
        head_masks(multi_model, [[(L, 0)]], device="cpu")
