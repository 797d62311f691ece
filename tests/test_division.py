"""Division of labour: known answers on hand-set heads, the nulls, untrained models, files."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from mhainterp import division_of_labour
from mhainterp.handbuilt_split import split_batch, split_heads_model
from mhainterp.specialization import DivisionResult, target_damage
from mhainterp.specialization.whom.damage import _small_unique
from mhainterp.specialization.whom.division import (
    HEADS_COLUMNS,
    INDEX_COLUMNS,
    PROFILE_COLUMNS,
    division_index,
    entropy_selectivity,
    triple_damage,
)
from mhainterp.tasks import get_task
from mhainterp.tasks.templates import first_position_template, previous_token_template
from mhainterp.training import build_model
from mhainterp.validation import ParameterError

A, B = [0, 1, 2, 3], [4, 5, 6, 7, 8]
FAST = dict(method="zero", n_permutations=200, n_init=0)


@pytest.fixture(scope="module")
def batch():
    return split_batch(256)


def _row(result: DivisionResult, head: str, by: str) -> pd.Series:
    table = result.heads
    return table[(table.head_label == head) & (table.by == by)].iloc[0]


def _index(result: DivisionResult, by: str) -> pd.Series:
    return result.index.set_index("by").loc[by]


# ----------------------------------------------------------------------------- formulas


def test_selectivity_formula_known_values():
    p = torch.tensor([[0.6, 0, 0, 0], [0.2, 0.2, 0.2, 0.2], [0.5, 0.5, 0, 0], [-0.1, 0, 0, 0]])
    si = entropy_selectivity(p, torch.tensor([True, True, True, True]))
    assert si[:3].tolist() == pytest.approx([1.0, 0.0, 0.5])
    assert math.isnan(si[3])  # an all-negative (clipped to zero) profile has no shape
    assert math.isnan(entropy_selectivity(p[:1], torch.tensor([False]))[0])  # no damage: NaN


def test_division_index_known_values():
    disjoint = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0]])
    same = torch.tensor([[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.5, 1.0, 0.0]])
    both = torch.tensor([True, True])
    assert float(division_index(disjoint, both)) == pytest.approx(1.0)
    assert float(division_index(same, torch.tensor([True, True, True]))) == pytest.approx(0.0)
    half = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])  # cos = 1/2
    assert float(division_index(half, both)) == pytest.approx(0.5)
    assert math.isnan(division_index(disjoint, torch.tensor([True, False])))


# ----------------------------------------------------------------------------- known answers


def test_heads_that_split_the_target_classes(batch):
    model = split_heads_model([("target", A), ("target", B)])
    result = division_of_labour(model, batch, **FAST)
    assert list(result.heads.columns) == HEADS_COLUMNS
    assert list(result.index.columns) == INDEX_COLUMNS
    assert list(result.profiles.columns) == PROFILE_COLUMNS
    assert set(result.index.by) == {"token", "position", "target_class"}
    assert result.skipped == {"target": "a single-target model"}
    first, second = _row(result, "L0H0", "target_class"), _row(result, "L0H1", "target_class")
    assert (first.serves, second.serves) == ("0,1,2,3", "4,5,6,7,8")
    assert bool(first.specialized) and bool(second.specialized)
    # Damage falls evenly on 4 (resp. 5) of 9 classes: 1 - log m / log 9.
    assert first.selectivity == pytest.approx(1 - math.log(4) / math.log(9))
    assert second.selectivity == pytest.approx(1 - math.log(5) / math.log(9))
    for by in ("token", "position"):
        for head in ("L0H0", "L0H1"):
            row = _row(result, head, by)
            assert not row.specialized and row.serves == "" and row.selectivity < 0.01
    assert _index(result, "target_class")["index"] == pytest.approx(1.0)
    assert bool(_index(result, "target_class").divided)
    for by in ("token", "position"):
        assert _index(result, by)["index"] < 0.02 and not _index(result, by).divided
    # The profile itself: exactly 1 on the served classes, 0 elsewhere; the clean model is exact.
    prof = result.profiles.query("by == 'target_class' and head_label == 'L0H0'")
    assert prof.set_index("value")["damage"].to_dict() == {
        str(v): (1.0 if v in A else 0.0) for v in range(9)
    }
    assert (prof.clean_accuracy == 1.0).all()


def test_heads_that_split_the_query_tokens(batch):
    model = split_heads_model([("query", A), ("query", B)])
    result = division_of_labour(model, batch, **FAST)
    assert _row(result, "L0H0", "token").serves == "0,1,2,3"
    assert _row(result, "L0H1", "token").serves == "4,5,6,7,8"
    assert result.heads.query("by == 'token'").specialized.all()
    assert not result.heads.query("by != 'token'").specialized.any()
    assert _index(result, "token")["index"] == pytest.approx(1.0)
    assert _index(result, "token").divided
    assert not _index(result, "position").divided and not _index(result, "target_class").divided


def test_two_identical_heads_divide_nothing(batch):
    model = split_heads_model([("all", None), ("all", None)])
    result = division_of_labour(model, batch, **FAST)
    assert (result.heads.total_damage == 0).all()  # each alone is backed up by the other
    assert result.heads.selectivity.isna().all() and result.heads.p_adj.isna().all()
    assert not result.heads.specialized.any() and (result.heads.serves == "").all()
    assert result.index["index"].isna().all() and (result.index.n_damaging == 0).all()
    assert not result.index.divided.any()


def test_a_lone_useful_head_has_a_profile_but_no_index(batch):
    model = split_heads_model([("all", None), ("target", A)])  # L0H1 is backed up on A
    result = division_of_labour(model, batch, **FAST)
    assert _row(result, "L0H0", "target_class").serves == "4,5,6,7,8"
    assert math.isnan(_row(result, "L0H1", "target_class").selectivity)
    assert result.index["index"].isna().all() and (result.index.n_damaging == 1).all()


# ----------------------------------------------------------------------------- nulls


def test_normal_null_matches_exact_permutations(batch):
    model = split_heads_model([("query", A), ("query", B)])
    normal = division_of_labour(model, batch, **FAST)
    exact = division_of_labour(model, batch, **{**FAST, "null": "exact"})
    for column in ("specialized", "serves"):
        assert normal.heads[column].tolist() == exact.heads[column].tolist()
    assert normal.heads.selectivity.tolist() == exact.heads.selectivity.tolist()
    np.testing.assert_allclose(normal.heads.null_mean, exact.heads.null_mean, atol=3e-4)
    np.testing.assert_allclose(normal.index.null_index, exact.index.null_index, atol=2e-3)


def test_target_axis_equals_causal_target_damage():
    task = get_task("multi_relation", seq_len=8, d_vocab=5)
    model = build_model(task, d_model=32, n_heads=4, seed=3)
    result = division_of_labour(
        model, task, by="target", n_eval=64, n_permutations=20, n_init=0, min_damage=0.0
    )
    damage = target_damage(model, task.eval_batch(64), method="mean")
    profile = result.profiles.pivot(index="head_label", columns="value", values="damage")
    expected = pd.DataFrame(damage.matrix.numpy(), index=damage.heads, columns=task.target_names)
    np.testing.assert_allclose(
        profile[task.target_names].to_numpy(), expected.to_numpy(), atol=1e-6
    )


def _untrained_calls_nothing(seed: int) -> bool:
    task = get_task("count_previous", seq_len=8, d_vocab=5)
    model = build_model(task, d_model=32, n_heads=4, seed=seed)
    result = division_of_labour(model, task, n_eval=128, n_permutations=100, n_init=2,
                                n_init_eval=64, seed=seed)  # fmt: skip
    return not result.heads.specialized.any() and not result.index.divided.any()


def test_untrained_models_are_not_specialized_in_95_percent_of_20_seeds():
    # Tiny models on purpose: they flip the most argmaxes when a head is removed (see the
    # damage gate in the module docstring). About 1 s for all 20.
    clean = sum(_untrained_calls_nothing(seed) for seed in range(20))
    assert clean >= 19


def test_untrained_null_is_reported(batch):
    model = split_heads_model([("target", A), ("target", B)])
    result = division_of_labour(model, batch, method="zero", n_permutations=200, n_init=2)
    # The hand-set model's untrained twins (same cfg, seeds 0, 1) do no damage at all.
    assert result.heads.null_init_mean.isna().all()
    assert result.settings["n_init"] == 2
    assert _row(result, "L0H0", "target_class").serves == "0,1,2,3"


# ----------------------------------------------------------------------------- attention view


def test_attention_view_conditions_on_the_query_token(batch):
    model = split_heads_model([("query", A), ("query", B)])
    tokens = batch.tokens
    relations = {
        "previous": previous_token_template(tokens),
        "first": first_position_template(tokens),
    }
    result = division_of_labour(model, batch, by="token", relations=relations, **FAST)
    view = result.attention.query("head_label == 'L0H0'").pivot(
        index="value", columns="relation", values="mass"
    )
    for v in range(9):
        on_previous = view.loc[str(v), "previous"]
        assert on_previous == pytest.approx(1.0 if v in A else 0.0, abs=1e-3)
        assert view.loc[str(v), "first"] == pytest.approx(0.0 if v in A else 1.0, abs=1e-3)
    n_queries = result.attention.query("relation == 'previous' and head_label == 'L0H0'")
    assert n_queries.n_queries.sum() == int(batch.mask.sum())


def test_attention_view_uses_the_task_relations():
    task = get_task("count_previous", seq_len=8, d_vocab=5)
    model = build_model(task, d_model=32, n_heads=2, seed=0)
    result = division_of_labour(model, task, n_eval=32, n_permutations=10, n_init=0)
    assert set(result.attention.relation) == set(task.relation_names)
    assert set(result.attention.by) == {"token", "position"}


# ----------------------------------------------------------------------------- files, errors


def test_save_and_load_round_trip(tmp_path, batch):
    model = split_heads_model([("query", A), ("query", B)])
    result = division_of_labour(model, batch, **FAST)
    paths = result.save(tmp_path / "analysis")
    assert sorted(p.name for p in paths) == [
        "division.json",
        "division_attention.csv",
        "division_heads.csv",
        "division_index.csv",
        "division_profiles.csv",
    ]
    back = DivisionResult.load(tmp_path / "analysis")
    pd.testing.assert_frame_equal(back.heads, result.heads, check_dtype=False)
    pd.testing.assert_frame_equal(back.index, result.index, check_dtype=False)
    assert back.profiles.value.tolist() == result.profiles.value.tolist()
    assert back.settings == result.settings and back.skipped == result.skipped
    with pytest.raises(FileNotFoundError, match="division.json is missing"):
        DivisionResult.load(tmp_path)


def test_bad_arguments(batch):
    model = split_heads_model([("query", A), ("query", B)])
    with pytest.raises(ParameterError, match="by='colour' is invalid"):
        division_of_labour(model, batch, by="colour", **FAST)
    with pytest.raises(ParameterError, match="n_init=1 is invalid"):
        division_of_labour(model, batch, method="zero", n_init=1)
    with pytest.raises(TypeError, match="has no targets"):
        division_of_labour(model, batch.tokens, **FAST)


def test_triple_damage_counts_every_scored_triple(batch):
    model = split_heads_model([("target", A), ("target", B)])
    td = triple_damage(model, batch, method="zero")
    assert td.damage.shape == (2, int(batch.mask.sum()))
    assert td.value_names["position"] == [str(t) for t in range(2, 12)]
    # Head 0 serves exactly the triples whose target class is in A.
    in_a = torch.isin(batch.targets[batch.mask], torch.tensor(A)).float()
    assert torch.equal(td.damage[0], in_a)


# ----------------------------------------------------------------------------- folders, CLI


def _run_folder(path):
    from mhainterp.config import TrainConfig
    from mhainterp.handbuilt import handbuilt_model
    from mhainterp.training import evaluate, save_run

    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "uniform", "dead"], d_head=18)
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    saved = {**evaluate(model, task, n_eval=64), "status": "finished"}
    return save_run(path, model, task, TrainConfig(steps=1), metrics, saved)


def test_specialize_command_saves_the_division_and_the_report_shows_it(tmp_path, capsys):
    from mhainterp.cli import main
    from mhainterp.report import write_report

    run = _run_folder(tmp_path / "run")
    args = ["specialize", str(run), "--by", "token,position", "--n-eval", "64", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # One head does damage (the previous-token head): a profile, but no index.
    assert "run: division index: token n/a (1 damaging head(s)); position n/a" in out
    saved = DivisionResult.load(run / "analysis")
    assert saved.settings["by_asked"] == ["token", "position"]
    previous = saved.heads.query("head_label == 'L0H0'")
    assert (
        previous.selectivity.notna().all()
        and saved.heads.query("head_label != 'L0H0'")["selectivity"].isna().all()
    )
    stamp = (run / "analysis" / "division.json").stat().st_mtime_ns
    assert main(args) == 0  # same thresholds and axes: reused, not recomputed
    assert (run / "analysis" / "division.json").stat().st_mtime_ns == stamp
    md, _ = write_report(run, tmp_path / "report")
    text = md.read_text(encoding="utf-8")
    assert "## Whom do the heads serve? (division of labour)" in text
    assert "division_profiles.png" in text and (run / "analysis/division_profiles.png").is_file()
    capsys.readouterr()
    assert main(["specialize", str(run), "--by", "colour", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "by='colour' is invalid" in err[0]


def test_division_vs_heads_figure_draws_every_axis():
    from mhainterp.figures.division import division_vs_heads

    table = pd.DataFrame(
        {
            "task": "t", "n_heads": [2, 2, 4, 4], "seed": [0, 1, 0, 1], "by": "token",
            "index": [0.1, 0.2, 0.5, 0.6], "null_index": 0.01, "null_index_std": 0.005,
        }
    )  # fmt: skip
    fig = division_vs_heads(pd.concat([table, table.assign(by="position")]))
    ax = fig.axes[0]
    assert [a.get_title() for a in fig.axes] == ["by token", "by position"]
    line = ax.lines[0]
    assert line.get_ydata().tolist() == pytest.approx([0.15, 0.55])
    with pytest.raises(ValueError, match="missing columns"):
        division_vs_heads(table.drop(columns="null_index"))


def test_many_heads_each_serving_one_token_are_all_specialized():
    # 24 heads x 3 axes = 72 tests: with the p-value floor 1/1001 of 1000 draws, Holm's
    # smallest adjusted p would be 72/1001 = 0.072 and no head could pass; the draws are
    # raised to 2 * 72 / alpha = 2880 so the floor sits below alpha / 2.
    n = 24
    model = split_heads_model([("query", [t]) for t in range(n)], d_vocab=n + 1, d_head=25)
    result = division_of_labour(
        model, split_batch(512, d_vocab=n + 1), "token,position,target_class",
        method="zero", n_init=0,
    )  # fmt: skip
    token = result.heads.query("by == 'token'")
    assert token["specialized"].all()
    assert token["serves"].tolist() == [str(t) for t in range(n)]
    assert not result.heads.query("by != 'token'")["specialized"].any()
    assert result.settings["n_null_draws"] == 2880


def test_small_unique_is_torch_unique_for_ids():
    ids = torch.tensor([5, 2, 5, 9, 2])
    unique, inverse = _small_unique(ids)
    assert unique.tolist() == [2, 5, 9] and inverse.tolist() == [1, 0, 1, 2, 0]


def test_causal_selectivity_draws_enough_for_holm_over_many_heads():
    # 60 heads, each wholly serving one of two targets: every p is at the floor 1 / (1 + M).
    # With M = 1000 Holm's smallest adjusted p would be 60/1001 > 0.05; the draws are raised
    # to 2 * 60 / 0.05 = 2400, so all 60 pass.
    from mhainterp.specialization import causal_selectivity
    from mhainterp.specialization.corrections import adjust_pvalues
    from mhainterp.specialization.whom.causal import TargetDamage

    H, n = 60, 40
    damage = torch.zeros(H, n, 2, dtype=torch.float64)
    for h in range(H):
        damage[h, :, h % 2] = 1.0
    heads = [f"L0H{h}" for h in range(H)]
    td = TargetDamage(heads, ["a", "b"], damage, torch.zeros(H), torch.ones(2))
    result = causal_selectivity(td, n_permutations=1000, generator=torch.Generator().manual_seed(0))
    assert result.n_permutations == 2400
    p = result.heads["p_selectivity"].to_numpy()
    assert np.allclose(p, 1 / 2401)
    assert (adjust_pvalues(p, "holm") < 0.05).all()
