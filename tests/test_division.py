"""Division of labour: known answers on hand-set heads, the nulls, untrained models, files."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from mhainterp import division_of_labour
from mhainterp.model.handbuilt import split_heads_model
from mhainterp.specialization import DivisionResult, target_damage
from mhainterp.specialization.whom.damage import _small_unique, triple_damage
from mhainterp.specialization.whom.division_result import (
    HEADS_COLUMNS,
    PROFILE_COLUMNS,
    index_columns,
)
from mhainterp.specialization.whom.selectivity import (
    SELECTIVITY_MEANING,
    division_index,
    helped_share,
    selectivity,
)
from mhainterp.tasks import Batch, get_task, split_batch
from mhainterp.tasks.templates import first_position_template, previous_token_template
from mhainterp.training import build_model
from mhainterp.validation import ParameterError

A, B = [0, 1, 2, 3], [4, 5, 6, 7, 8]
FAST = dict(method="zero", methods=("zero",), n_bootstrap=50)


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
    si = selectivity(p, torch.tensor([True, True, True, True]))
    assert si[:3].tolist() == pytest.approx([0.75, 0.0, 0.5])  # 1 - n_eff / K
    assert math.isnan(si[3])  # an all-negative (clipped to zero) profile has no shape
    assert math.isnan(selectivity(p[:1], torch.tensor([False]))[0])  # no damage: NaN


def test_the_stated_meaning_of_selectivity_is_what_it_computes():
    # The report said "selectivity 1 = one value"; a head serving one value of K scores 1 - 1/K.
    stated = re.search(r"1 − 1/K for one value \(([\d.]+) of (\d+)\), never 1", SELECTIVITY_MEANING)
    value, K = float(stated[1]), int(stated[2])
    yes = torch.tensor([True])
    one = torch.zeros(1, K)
    one[0, 4] = 0.3
    assert float(selectivity(one, yes)[0]) == pytest.approx(value) == pytest.approx(1 - 1 / K)
    assert "is 0 for even damage and 1 − m/K for m values damaged alike" in SELECTIVITY_MEANING
    even, three = torch.full((1, K), 0.3), torch.zeros(1, K)
    three[0, :3] = 0.3
    assert float(selectivity(even, yes)[0]) == pytest.approx(0.0)
    assert float(selectivity(three, yes)[0]) == pytest.approx(1 - 3 / K)
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    assert "`1 − 1/K` for one value of K, never 1" in readme


def test_helped_share_is_the_negative_damage_the_clipping_leaves_out():
    """The referee's profiles: ``[-5, 0.02, 0]`` has selectivity 1 - 1/3 (the most K = 3
    allows) on a damage of 0.02, while removing the head *helps* value 0 by 5; ``[-1, 1]`` and
    ``[1, -1]`` are "fully divided". The heads table reports what the clipping dropped."""
    profiles = torch.tensor([[-5.0, 0.02, 0.0], [-1.0, 1.0, 0.0], [0.3, 0.1, 0.0], [0.0] * 3])
    assert float(selectivity(profiles[:1], torch.tensor([True]))[0]) == pytest.approx(1 - 1 / 3)
    shares = helped_share(profiles).tolist()
    assert shares[:3] == pytest.approx([5 / 5.02, 0.5, 0.0])
    assert math.isnan(shares[3])  # an all-zero profile helps and hurts nothing: undefined
    # a harmful head's profile, all negative, is not defined for the selectivity; its share is 1
    assert float(helped_share(torch.tensor([[-0.4, 0.0, -0.1]]))[0]) == 1.0


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
    assert list(result.index.columns) == index_columns()
    assert list(result.profiles.columns) == PROFILE_COLUMNS
    assert set(result.index.by) == {"token", "position", "target_class"}
    assert result.skipped == {"target": "a single-target model"}
    first, second = _row(result, "L0H0", "target_class"), _row(result, "L0H1", "target_class")
    assert (first.serves, second.serves) == ("0,1,2,3", "4,5,6,7,8")
    assert bool(first.specialized) and bool(second.specialized)
    # Damage falls evenly on 4 (resp. 5) of 9 classes: 1 - m / 9 (the share spared).
    assert first.selectivity == pytest.approx(1 - 4 / 9)
    assert second.selectivity == pytest.approx(1 - 5 / 9)
    assert (first.served_share, first.basis) == (pytest.approx(4 / 9), "single")
    # removing either head only hurts: nothing left out by the clipping
    assert (first.helped_share, second.helped_share) == (0.0, 0.0)
    for by in ("token", "position"):
        for head in ("L0H0", "L0H1"):
            row = _row(result, head, by)
            assert not row.specialized and row.selectivity < 0.01
    assert _row(result, "L0H0", "token").served_values == "0,1,2,3,4,5,6,7,8"  # every token
    assert _row(result, "L0H0", "token").serves == ""  # alike: no subset of its own
    assert _index(result, "target_class")["index"] == pytest.approx(1.0)
    assert _index(result, "target_class").call == "divided"
    for by in ("token", "position"):
        row = _index(result, by)
        assert row["index"] < 0.02 and row.call == "not divided" and row.ci_low < row.null_high
    # The profile itself: exactly 1 on the served classes, 0 elsewhere; the clean model is exact.
    prof = result.profiles.query("by == 'target_class' and head_label == 'L0H0'")
    assert prof.set_index("value")["damage"].to_dict() == {
        str(v): (1.0 if v in A else 0.0) for v in range(9)
    }
    assert (prof.clean_accuracy == 1.0).all()


def test_one_working_head_per_layer_serves_its_own_positions(batch):
    """Two layers split the positions, one working head each (the other heads zeroed). The
    index between them says the work is divided by position; each head must then serve its own
    positions. Beside its own layer's job, which is the head's own job, it served nothing."""
    early, late = [2, 3, 4, 5, 6], [7, 8, 9, 10, 11]
    model = split_heads_model([("position", early), ("position", late)], n_layers=2)
    with torch.no_grad():
        for layer, head in ((0, 1), (1, 0)):
            attn = model.blocks[layer].attn
            for weight in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O):
                weight[head] = 0
    result = division_of_labour(model, batch, **FAST)
    assert _index(result, "position").call == "divided"
    assert _row(result, "L0H0", "position").serves == ",".join(map(str, early))
    assert _row(result, "L1H1", "position").serves == ",".join(map(str, late))
    for head in ("L0H0", "L1H1"):  # against the model's job, which covers every position
        assert _row(result, head, "position").null_selectivity < 0.05
        assert _row(result, head, "token").serves == ""


def test_heads_that_split_the_query_tokens(batch):
    model = split_heads_model([("query", A), ("query", B)])
    result = division_of_labour(model, batch, **FAST)
    assert _row(result, "L0H0", "token").serves == "0,1,2,3"
    assert _row(result, "L0H1", "token").serves == "4,5,6,7,8"
    assert result.heads.query("by == 'token'").specialized.all()
    assert not result.heads.query("by != 'token'").specialized.any()
    assert _index(result, "token")["index"] == pytest.approx(1.0)
    assert _index(result, "token").call == "divided"
    assert _index(result, "position").call == _index(result, "target_class").call == "not divided"


def test_two_identical_heads_divide_nothing(batch):
    model = split_heads_model([("all", None), ("all", None)])
    result = division_of_labour(model, batch, **FAST)
    assert (result.heads.total_damage == 0).all()  # each alone is backed up by the other
    assert (result.heads.kept_contribution == 1).all()  # and each alone does the whole job
    assert (result.heads.basis == "kept").all() and not result.heads.specialized.any()
    assert (result.index.n_damaging == 0).all()
    assert (result.index.call == "not divided").all()
    assert result.settings["groups"] == ["L0H0,L0H1"]  # found: the copies are one group
    assert (result.heads.group == "L0H0,L0H1").all() and (result.heads.damage_group == 1).all()
    assert result.index["index"].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-9)


def test_a_lone_useful_head_is_not_called_on_single_ablation(batch):
    model = split_heads_model([("all", None), ("target", A)])  # L0H1 is backed up on A
    result = division_of_labour(model, batch, **FAST)
    row = _row(result, "L0H0", "target_class")
    assert row.served_values == "4,5,6,7,8" and row.basis == "single"
    # Removed alone it loses only what L0H1 cannot cover (B); kept alone it carries every
    # class (kept_selectivity 0): it serves no subset of its own, so it is not specialized.
    assert row.kept_selectivity == pytest.approx(0.0, abs=1e-9)
    assert (row.specialized, row.serves) == (False, "")
    assert _row(result, "L0H1", "target_class").basis == "kept"  # backed up: its kept profile
    assert (result.index.n_damaging == 1).all() and (result.index.basis == "kept").all()
    # Kept alone, the all-doer serves every class and the A head serves A: a split with overlap.
    assert _index(result, "target_class").call == "divided"
    assert 0 < _index(result, "target_class")["index"] < 1


def test_settings_replace_the_keywords_and_perturb_every_gate():
    from mhainterp.specialization.settings import DIVISION_GATES, DivisionSettings

    s = DivisionSettings(method="zero")
    assert s.methods == ("zero", "mean", "resample")  # the primary first
    names = [name for name, _ in s.perturbations()]
    assert names == [f"{g} x {f}" for g in DIVISION_GATES for f in (0.8, 1.25)] + [
        "method=mean", "method=resample"
    ]  # fmt: skip
    moved = dict(s.perturbations())
    assert moved["min_damage x 1.25"].min_damage == pytest.approx(0.0125)
    assert moved["method=mean"].method == "mean"
    with pytest.raises(ParameterError, match="n_noise=0 is invalid"):
        s.replace(n_noise=0)
    with pytest.raises(ParameterError, match="min_gain=0.05 is invalid"):
        s.replace(min_gain=0.05)
    assert DivisionSettings.from_dict(s.to_dict()) == s


def test_target_axis_equals_causal_target_damage():
    task = get_task("multi_relation", seq_len=8, d_vocab=5)
    model = build_model(task, d_model=32, n_heads=4, seed=3)
    result = division_of_labour(
        model, task, by="target", n_eval=64, n_bootstrap=20, methods=("mean",), min_damage=0.0
    )
    damage = target_damage(model, task.eval_batch(64), method="mean")
    profile = result.profiles.pivot(index="head_label", columns="value", values="damage")
    expected = pd.DataFrame(damage.matrix.numpy(), index=damage.heads, columns=task.target_names)
    np.testing.assert_allclose(
        profile[task.target_names].to_numpy(), expected.to_numpy(), atol=1e-6
    )


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
    result = division_of_labour(model, task, n_eval=32, n_bootstrap=10, methods=("mean",))
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
        "division_basis_profiles.csv",
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


def test_an_outdated_or_damaged_saved_division_is_never_read(tmp_path, batch):
    # A table an older version saved (a column this version writes is absent) is refused in
    # one line by load() and counts as not saved for the cache, which recomputes it; a damaged
    # (0-byte) table is refused, never read as empty.
    from mhainterp.errors import OutdatedResultError, RunFolderError
    from mhainterp.specialization.whom.division_result import saved_division

    model = split_heads_model([("query", A), ("query", B)])
    division_of_labour(model, batch, **FAST).save(tmp_path / "analysis")
    assert saved_division(tmp_path) is not None
    basis = tmp_path / "analysis" / "division_basis_profiles.csv"
    index = tmp_path / "analysis" / "division_index.csv"
    pd.read_csv(index).drop(columns=["basis", "call"]).to_csv(index, index=False)
    with pytest.raises(OutdatedResultError, match="division_index.csv lacks the columns call, "):
        DivisionResult.load(tmp_path / "analysis")
    assert saved_division(tmp_path) is None
    division_of_labour(model, batch, **FAST).save(tmp_path / "analysis")
    basis.unlink()
    with pytest.raises(FileNotFoundError, match="division_basis_profiles.csv is missing"):
        DivisionResult.load(tmp_path / "analysis")
    assert saved_division(tmp_path) is None
    basis.write_bytes(b"")
    with pytest.raises(RunFolderError, match=r"division_basis_profiles.csv is empty \(0 bytes\)"):
        saved_division(tmp_path)


def test_bad_arguments(batch):
    model = split_heads_model([("query", A), ("query", B)])
    with pytest.raises(ParameterError, match="by='colour' is invalid"):
        division_of_labour(model, batch, by="colour", **FAST)
    with pytest.raises(ParameterError, match="n_bootstrap=1 is invalid"):
        division_of_labour(model, batch, method="zero", n_bootstrap=1)
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
    from mhainterp.model.handbuilt import handbuilt_model
    from mhainterp.training import evaluate, save_run

    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "uniform", "dead"], d_head=18)
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    saved = {**evaluate(model, task, n_eval=64), "status": "finished"}
    return save_run(model, task, path, TrainConfig(steps=1), metrics, saved)


def test_specialize_command_saves_the_division_and_the_report_shows_it(tmp_path, capsys):
    from mhainterp.cli import main
    from mhainterp.report import write_report

    run = _run_folder(tmp_path / "run")
    # the division rests on the default evaluation set (1,024): --n-eval reaches it too
    args = ["specialize", str(run), "--by", "token,position", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # One head does damage alone (the previous-token head); kept alone, the uniform head also
    # helps (at the first positions, where the average token is the previous one): the call
    # rests on the kept-head profiles.
    assert "run: division index: token " in out and "(kept): divided" in out
    saved = DivisionResult.load(run / "analysis")
    assert saved.settings["by_asked"] == ["token", "position"]
    assert saved.index.set_index("by").loc["position", "call"] == "divided"
    basis = saved.heads.drop_duplicates("head_label").set_index("head_label")["basis"]
    assert basis.to_dict() == {"L0H0": "single", "L0H1": "kept", "L0H2": ""}
    assert saved.heads.query("head_label == 'L0H2'")["selectivity"].isna().all()  # dead
    stamp = (run / "analysis" / "division.json").stat().st_mtime_ns
    assert main(args) == 0  # same thresholds and axes: reused, not recomputed
    assert (run / "analysis" / "division.json").stat().st_mtime_ns == stamp
    md, _ = write_report(run, tmp_path / "report")
    text = md.read_text(encoding="utf-8")
    assert "## Whom do the heads serve? (division of labour)" in text
    assert SELECTIVITY_MEANING in text and "1 = one value" not in text
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
    n = 24
    model = split_heads_model([("query", [t]) for t in range(n)], d_vocab=n + 1, d_head=25)
    result = division_of_labour(
        model, split_batch(512, d_vocab=n + 1), "token,position,target_class",
        method="zero", methods=("zero",), n_bootstrap=50,
    )  # fmt: skip
    token = result.heads.query("by == 'token'")
    assert token["specialized"].all()
    assert token["serves"].tolist() == [str(t) for t in range(n)]
    assert token["selectivity"].tolist() == pytest.approx([1 - 1 / n] * n)
    assert not result.heads.query("by != 'token'")["specialized"].any()
    assert _index(result, "token").call == "divided"


def test_small_unique_is_torch_unique_for_ids():
    ids = torch.tensor([5, 2, 5, 9, 2])
    unique, inverse = _small_unique(ids)
    assert unique.tolist() == [2, 5, 9] and inverse.tolist() == [1, 0, 1, 2, 0]


def test_causal_selectivity_draws_enough_for_holm_over_many_heads():
    # 60 heads, each wholly serving one of two targets: every p is at the floor 1 / (1 + M).
    # With M = 1000 Holm's smallest adjusted p would be 60/1001 > 0.05; the draws are raised
    # to 2 * 60 / 0.05 = 2400, so all 60 pass.
    from mhainterp.specialization import causal_selectivity
    from mhainterp.specialization.whom.causal import TargetDamage
    from mhainterp.stats import adjust_pvalues

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


# ----------------------------------------------------------------------------- every axis at once


def test_value_means_of_every_axis_at_once_equal_each_axis_alone():
    from mhainterp.specialization.whom.profiles import ValueMeans, bootstrap_weights, value_means

    generator = torch.Generator().manual_seed(0)
    n, N, C = 9, 60, 4
    sequence = torch.randint(0, n, (N,), generator=generator)
    sizes = {"a": 3, "b": 7, "c": 5}  # different K: the shorter axes are padded
    values = {k: torch.randint(0, K, (N,), generator=generator) for k, K in sizes.items()}
    correct = torch.randint(0, 2, (C, N), generator=generator).float()
    weights = bootstrap_weights(n, 6, generator)  # (7, n)
    halves = torch.arange(n) % 2 == 0
    tables = ValueMeans(sequence, values, sizes, weights, halves=halves)
    resampled, split = tables.resampled(correct), tables.halves(correct)  # (7, 3, C, 7), (14, ...)
    for a, (axis, K) in enumerate(sizes.items()):
        alone = value_means(correct, sequence, values[axis], K, weights)
        assert torch.equal(resampled[:, a, :, :K], alone)  # whole counts: exact in any order
        assert not resampled[:, a, :, K:].any()  # padding is zero
        first = value_means(correct, sequence, values[axis], K, weights * halves)
        second = value_means(correct, sequence, values[axis], K, weights * ~halves)
        assert torch.equal(split[:, a, :, :K], torch.cat([first, second]))
        loss = torch.stack([correct[:, values[axis] == v].double().mean(1) for v in range(K)], 1)
        observed = tables.observed(correct)[a, :, :K]
        assert torch.allclose(observed, torch.nan_to_num(loss), atol=1e-12)


def test_every_axis_at_once_equals_each_axis_alone():
    """The padded all-axes statistics give each axis the numbers it gets on its own: 10
    tokens, 16 positions and 7 target classes here (2 under min_count), gates off so that
    every statistic is computed on an untrained model."""
    task = get_task("count_previous", seq_len=16, d_vocab=10)
    model = build_model(task, d_model=64, n_heads=8, seed=0)
    run = dict(n_eval=256, n_bootstrap=30, min_damage=0.0, min_loss_increase=-1.0)
    together = division_of_labour(model, task, **run)
    in_index = together.profiles.query("head_label == 'L0H0'").groupby("by").in_index
    assert in_index.size().to_dict() == {"position": 16, "target_class": 7, "token": 10}
    assert in_index.sum().to_dict() == {"position": 16, "target_class": 5, "token": 10}
    assert together.index["index"].notna().all()  # the statistic itself is exercised
    # The observed numbers from the profiles table by their formulas, on the kept values only.
    heads = together.heads.set_index(["by", "head_label"])
    for axis, table in together.profiles.query("in_index").groupby("by"):
        damage = table.pivot(index="head_label", columns="value", values="damage")
        defined = heads.loc[axis].loc[damage.index, "basis"] == "single"
        d = damage.clip(lower=0).to_numpy(float)  # the table holds float32
        with np.errstate(divide="ignore", invalid="ignore"):
            share = d / d.sum(1, keepdims=True)
            n_eff = np.exp(-np.nansum(np.where(share > 0, share * np.log(share), 0.0), 1))
        mine = heads.loc[axis].loc[damage.index, "selectivity"].to_numpy(float)
        single = defined.to_numpy()  # the others' selectivity is of their kept profile
        np.testing.assert_allclose(mine[single], 1 - n_eff[single] / d.shape[1], rtol=1e-6)
        unit = d[defined.to_numpy()] / np.linalg.norm(d[defined.to_numpy()], axis=1)[:, None]
        cos = unit @ unit.T
        m = len(unit)
        index = 1 - (cos.sum() - np.trace(cos)) / (m * (m - 1))
        observed = together.index.set_index("by").loc[axis, "index_single"]
        assert observed == pytest.approx(index, rel=1e-6)
    # Columns of the heads table that do not use the shuffled null's random draws, which
    # follow the axes in order (the first axis's draws are the same either way); p_adj is
    # adjusted over every row of the table.
    # (specialized and serves follow p_adj; p and the gain use the shuffled null's draws.)
    fixed = ["selectivity", "ci_low", "ci_high", "null_selectivity", "n_eff", "served_values"]
    every = [c for c in HEADS_COLUMNS if c not in ("p_adj", "specialized", "serves")]
    for i, axis in enumerate(together.index["by"]):
        alone = division_of_labour(model, task, by=axis, **run)
        # what another axis's profiles give this one needs another axis: alone, there is none
        between = ["explained_by", "index_explained"]
        assert (alone.index["explained_by"] == "").all() and alone.index[between[1]].isna().all()
        pd.testing.assert_frame_equal(
            together.index.iloc[[i]].drop(columns=between).reset_index(drop=True),
            alone.index.drop(columns=between),
            rtol=1e-12,
        )
        columns = every if i == 0 else fixed
        mine = together.heads.query("by == @axis")[columns].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, alone.heads[columns], rtol=1e-12, check_dtype=False)


def test_a_class_under_min_count_is_left_out_of_serves_selectivity_and_index(batch):
    """Class 8 kept in 5 sequences only (5 scored triples < min_count 10): each head serves
    its 4 classes of the 8 that count, whatever it does on class 8, in every axis's tables."""
    tokens = batch.tokens.clone()
    rare = tokens[5:, 1:] == 8
    tokens[5:, 1:] = torch.where(rare, 7, tokens[5:, 1:])
    tokens[:5, 1] = 8  # exactly 5 queries have target class 8
    tokens[:5, 2:-1] = torch.where(tokens[:5, 2:-1] == 8, 0, tokens[:5, 2:-1])
    targets = batch.targets.clone()
    targets[:, 1:] = tokens[:, :-1]
    targets[~batch.mask] = batch.targets[~batch.mask]
    rare_batch = Batch(tokens, targets, batch.mask, batch.padding_mask)
    model = split_heads_model([("target", A), ("target", [4, 5, 6, 7, 8])])
    result = division_of_labour(model, rare_batch, **FAST)
    profiles = result.profiles.query("by == 'target_class' and head_label == 'L0H1'")
    assert profiles.set_index("value").loc["8", ["n_scored", "in_index", "damage"]].tolist() == [
        5,
        False,
        1.0,
    ]
    first, second = _row(result, "L0H0", "target_class"), _row(result, "L0H1", "target_class")
    assert (first.serves, second.serves) == ("0,1,2,3", "4,5,6,7")
    assert first.selectivity == pytest.approx(0.5) and second.selectivity == pytest.approx(0.5)
    assert (first.n_values, second.n_values) == (8, 8)
    assert _index(result, "target_class")["index"] == pytest.approx(1.0)


def test_attention_view_from_the_clean_run_equals_its_own_forward(monkeypatch):
    """Mean ablation keeps the patterns of its clean run for the attention view (no forward
    of its own); zero ablation has no clean run, and the view runs its own: the same table."""
    import mhainterp.specialization.whom.division_attention as view

    task = get_task("count_previous", seq_len=8, d_vocab=5)
    model = build_model(task, d_model=32, n_heads=2, seed=0)
    run = dict(n_eval=64, n_bootstrap=10, n_attention=40)
    with monkeypatch.context() as patched:
        patched.setattr(view, "iter_patterns", lambda *a, **k: pytest.fail("a second forward"))
        kept = division_of_labour(model, task, method="mean", methods=("mean",), **run)
    own = division_of_labour(model, task, method="zero", methods=("zero",), **run)
    assert len(kept.attention) > 0
    pd.testing.assert_frame_equal(kept.attention, own.attention, rtol=1e-6)


def test_two_sequences_say_why_no_axis_is_tested_and_what_to_do():
    """2 sequences of reverse give no axis 2 values with enough scored triples: the summary
    names each axis's reason and asks for more sequences, not a bare "no axis applies"."""
    task = get_task("reverse")
    model = build_model(task, d_model=32, n_heads=4, seed=0)
    line = division_of_labour(model, task.eval_batch(2)).summary_line()
    assert "no axis applies (token: fewer than 2 values with >= " in line
    assert "target: a single-target model" in line
    assert line.endswith("(too few sequences: evaluate more, n_eval / --n-eval)")
