"""Known-answer tests for mhainterp.capture and the pattern figures, on hand-built models."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch.testing import assert_close
from transformer_lens.head_detector import detect_head

from mhainterp.capture import (
    TemplateMass,
    attention_patterns,
    average_patterns,
    average_relations,
    example_patterns,
    head_statistics,
    offset_profile,
    patterns_frame,
    relations_frame,
    visible_keys,
)
from mhainterp.config import ModelConfig
from mhainterp.data import as_batch
from mhainterp.figures.patterns import plot_average_patterns, plot_example_patterns
from mhainterp.model import HookedMHATransformer
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.tasks import first_position_template, get_task
from mhainterp.validation import ParameterError

T, V = 16, 10
# Mean over queries q = 1..T-1 of 1 / (q + 1): a causal uniform head's weight on any one key.
UNIFORM_WEIGHT = sum(1.0 / (q + 1) for q in range(1, T)) / (T - 1)


@pytest.fixture(scope="module")
def model():
    return handbuilt_model(["previous", "uniform", "previous"], seq_len=T, d_vocab=V)


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=T, d_vocab=V)


@pytest.fixture(scope="module")
def stats(model, task):
    return head_statistics(model, task.eval_batch(256))


def _table(stats: pd.DataFrame) -> pd.DataFrame:
    return stats.pivot(index="metric", columns="head_label", values="value")


def _padded_data(n: int = 40, seed: int = 0):
    """Tokens of varying real length (2..T) with padding token V at the end."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (n,), generator=generator)
    mask = torch.arange(T)[None] < lengths[:, None]
    tokens = torch.randint(0, V, (n, T), generator=generator).masked_fill(~mask, V)
    return tokens, mask, lengths


def test_template_mass_known_answers(model, task):
    stats = head_statistics(model, task.eval_batch(256))  # a Batch carries no relations
    assert not stats["metric"].str.startswith("relation_mass").any()
    table = _table(head_statistics(model, task, relations=task, n_eval=256))
    # Exact previous-token heads put all their weight on the previous-token relation.
    assert_close(table.loc["relation_mass:previous", "L0H0"], 1.0, atol=1e-9, rtol=0)
    assert_close(table.loc["relation_mass:previous", "L0H2"], 1.0, atol=1e-9, rtol=0)
    # The uniform head's weight on the previous key at query q is 1 / (q + 1).
    assert_close(table.loc["relation_mass:previous", "L0H1"], UNIFORM_WEIGHT, atol=1e-6, rtol=0)


def test_template_mass_accumulator_by_hand():
    # Two batches of one 3-position sequence, two heads; the template marks key 0 for query 1
    # and keys 0, 2 for query 2; row 0 is empty and never counts.
    head_a = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
    head_b = torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 1, 0]])
    patterns = torch.stack([head_a, head_b])[None, None]  # (1, 1, 2, 3, 3)
    template = torch.tensor([[[0.0, 0, 0], [1, 0, 0], [1, 0, 1]]])
    mass = TemplateMass()
    rows = mass.add_template("t", patterns, template, torch.ones(1, 3).bool())
    assert rows.tolist() == [[False, True, True]]
    mass.add_template("t", patterns, template, torch.tensor([[True, False, True]]))
    # Head a: 0.5 (q = 1) + 0.7 (q = 2), then 0.7 again; head b: 0 everywhere.
    assert mass.counts == {"t": 3.0}
    assert_close(mass.mean("t"), torch.tensor([[1.9 / 3, 0.0]], dtype=torch.float64))
    mass.add(patterns, {"u": template}, torch.zeros(1, 3).bool())
    assert mass.counts["u"] == 0.0 and bool(mass.mean("u").isnan().all())  # nothing counted
    with pytest.raises(ParameterError, match=r"relations\['t'\] is invalid: \[batch, q, k\]"):
        mass.add_template("t", patterns, template[:, :2], torch.ones(1, 3).bool())


def test_task_as_data_uses_its_relations_and_eval_set(model, task):
    stats = head_statistics(model, task, n_eval=64)
    table = _table(stats)
    assert "relation_mass:previous" in table.index
    n_rows = stats.loc[stats.metric == "relation_mass:previous", "n_queries"].iloc[0]
    assert n_rows == 64 * (T - 1)  # every query but position 0 has a previous token


def test_entropy_confidence_and_masses(stats):
    table = _table(stats)
    # Normalised entropy: exactly 1 for the uniform head, 0 for the one-hot heads.
    assert_close(table.loc["entropy", "L0H1"], 1.0, atol=1e-6, rtol=0)
    assert table.loc["entropy", "L0H0"] < 1e-6
    assert_close(table.loc["confidence", "L0H0"], 1.0, atol=1e-9, rtol=0)
    assert_close(table.loc["confidence", "L0H1"], UNIFORM_WEIGHT, atol=1e-6, rtol=0)
    # Position 0 is the previous key only for query 1: 1 of the T - 1 counted queries.
    assert_close(table.loc["first_mass", "L0H0"], 1.0 / (T - 1), atol=1e-9, rtol=0)
    assert_close(table.loc["first_mass", "L0H1"], UNIFORM_WEIGHT, atol=1e-6, rtol=0)
    assert table.loc["self_mass", "L0H0"] < 1e-9
    assert_close(table.loc["self_mass", "L0H1"], UNIFORM_WEIGHT, atol=1e-6, rtol=0)
    # Queries that see one key (position 0) are left out: 256 sequences x (T - 1) queries.
    assert set(stats.loc[stats.metric == "entropy", "n_queries"]) == {256 * (T - 1)}


def test_offset_profile(stats):
    profile = offset_profile(stats)
    assert sorted(profile["offset"].unique()) == list(range(-(T - 1), 1))  # causal: k <= q
    totals = profile.groupby("head_label")["mass"].sum()
    np.testing.assert_allclose(totals.to_numpy(), np.ones(3), atol=1e-6, rtol=0)
    prev = profile[profile.head_label == "L0H0"].set_index("offset")["mass"]
    assert_close(prev[-1], 1.0, atol=1e-9, rtol=0)
    # Uniform: offset -d is visible to queries d..T-1, each giving 1 / (q + 1).
    uniform = profile[profile.head_label == "L0H1"].set_index("offset")["mass"]
    expected = sum(1.0 / (q + 1) for q in range(3, T)) / (T - 1)
    assert_close(uniform[-3], expected, atol=1e-6, rtol=0)


def test_template_mass_equals_transformer_lens_detect_head():
    # With a template whose every row is non-empty the two definitions coincide exactly.
    model = handbuilt_model(["previous", "uniform", "first"], seq_len=T, d_vocab=V)
    tokens = torch.randint(0, V, (1, T - 1), generator=torch.Generator().manual_seed(1))
    template = first_position_template(tokens)
    ours = head_statistics(model, tokens, relations={"first": template})
    ours = ours[ours.metric == "relation_mass:first"]["value"].to_numpy()
    theirs = detect_head(model, " ".join(map(str, tokens[0].tolist())), template[0])
    assert_close(torch.tensor(ours), theirs[0].double(), atol=1e-6, rtol=0)


def test_padding_queries_and_keys_excluded():
    model = handbuilt_model(["previous", "uniform"], seq_len=T, d_vocab=V + 1, d_head=20)
    tokens, mask, lengths = _padded_data()
    stats = head_statistics(model, tokens, mask, relations=get_task("previous_token"))
    table = _table(stats)
    # Counted queries: real ones that see >= 2 real keys, i.e. positions 1..L-1.
    n_expected = int((lengths - 1).sum())
    assert set(stats.loc[stats.metric == "entropy", "n_queries"]) == {n_expected}
    # Padding keys get no weight, so the uniform head is still exactly uniform on real keys.
    assert_close(table.loc["entropy", "L0H1"], 1.0, atol=1e-6, rtol=0)
    assert_close(table.loc["relation_mass:previous", "L0H0"], 1.0, atol=1e-9, rtol=0)
    expected = sum(sum(1.0 / (q + 1) for q in range(1, int(n))) for n in lengths) / n_expected
    assert_close(table.loc["confidence", "L0H1"], expected, atol=1e-6, rtol=0)


def test_streaming_average_equals_all_at_once():
    model = handbuilt_model(["previous", "uniform", "first"], seq_len=T, d_vocab=V + 1)
    tokens, mask, _ = _padded_data(n=37, seed=3)
    streamed = average_patterns(model, tokens, mask, batch_size=5)
    _, cache = model.run_with_cache(tokens, padding_mask=mask)
    pattern = cache["pattern", 0] * mask[:, None, :, None]  # (n, h, q, k), padding queries out
    at_once = pattern.sum(0) / mask.sum(0).clamp(min=1)[None, :, None]
    assert_close(streamed[0], at_once, atol=1e-6, rtol=1e-6)
    assert_close(average_patterns(model, tokens, mask, batch_size=1000), streamed)
    # Statistics do not depend on the batch size either.
    one = head_statistics(model, tokens, mask, batch_size=4)
    whole = head_statistics(model, tokens, mask, batch_size=1000)
    np.testing.assert_allclose(one["value"], whole["value"], atol=1e-9, rtol=1e-9)


def test_statistics_of_a_multilayer_model():
    cfg = ModelConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        n_ctx=8,
        d_vocab=7,
        causal=True,
        seed=2,
        normalization_type="LN",
        attn_only=False,
    )
    model = HookedMHATransformer(cfg)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 7, (10, 8), generator=generator)
    mask = torch.arange(8)[None] < torch.randint(2, 9, (10, 1), generator=generator)
    stats = head_statistics(model, tokens, mask, batch_size=3)
    assert sorted(stats.head_label.unique()) == [
        f"L{lay}H{h}" for lay in range(2) for h in range(4)
    ]
    totals = offset_profile(stats).groupby("head_label")["mass"].sum()
    np.testing.assert_allclose(totals, 1.0, atol=1e-6)
    table = _table(stats)
    assert ((table.loc["entropy"] > 0) & (table.loc["entropy"] <= 1 + 1e-9)).all()
    # The same numbers straight from run_with_cache: confidence of L1H2.
    _, cache = model.run_with_cache(tokens, padding_mask=mask)
    counted = mask.clone()
    counted[:, 0] = False
    expected = cache["pattern", 1][:, 2].amax(-1)[counted].mean()
    assert_close(table.loc["confidence", "L1H2"], float(expected), atol=1e-6, rtol=0)


def test_average_patterns_of_known_heads(model, task):
    avg = average_patterns(model, task.eval_batch(32))
    assert avg.shape == (1, 3, T, T)
    expected_prev = torch.diag(torch.ones(T - 1), -1)
    expected_prev[0, 0] = 1.0  # query 0 can only see itself
    assert_close(avg[0, 0], expected_prev, atol=1e-6, rtol=0)
    expected_uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    assert_close(avg[0, 1], expected_uniform, atol=1e-6, rtol=0)
    frame = patterns_frame(avg)
    assert list(frame.columns) == ["head_label", "layer", "head", "query", "key", "weight"]
    row = frame[(frame.head_label == "L0H1") & (frame["query"] == 3) & (frame.key == 2)]
    assert_close(float(row.weight.iloc[0]), 0.25, atol=1e-6, rtol=0)


def test_average_relations_and_frame(task):
    templates = average_relations(task, task.eval_batch(16))
    assert_close(templates["previous"], torch.diag(torch.ones(T - 1), -1))
    frame = relations_frame(templates)
    assert list(frame.columns) == ["relation", "query", "key", "weight"]
    assert len(frame) == T * T and frame.weight.sum() == T - 1


def test_example_patterns_rows(model):
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, V, V] + [V] * (T - 8)])
    mask = tokens != V
    model11 = handbuilt_model(["previous", "uniform"], seq_len=T, d_vocab=V + 1, d_head=20)
    example = example_patterns(model11, tokens, padding_mask=mask)
    assert len(example) == 2 * 6 * 6  # heads x real queries x real keys
    prev = example[(example.head_label == "L0H0") & (example["query"] == 4)]
    assert prev.set_index("key")["weight"].round(6).tolist() == [0, 0, 0, 1, 0, 0]
    assert prev["query_token"].unique().tolist() == [5]
    assert prev["key_token"].tolist() == [3, 1, 4, 1, 5, 9]
    patterns = attention_patterns(model, (torch.arange(T) % V)[None])
    assert patterns.shape == (1, 1, 3, T, T)


def test_visible_keys_and_inputs():
    mask = torch.tensor([[True, True, False]])
    assert visible_keys(mask, causal=False)[0].int().tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 0]]
    batch = as_batch(torch.tensor([1, 2, 3]))  # one sequence
    assert batch.tokens.shape == (1, 3) and bool(batch.padding_mask.all())


def test_bad_inputs(model, task):
    with pytest.raises(TypeError, match="Task, a Batch"):
        head_statistics(model, [[1, 2, 3]])
    with pytest.raises(ValueError, match="padding_mask is only used"):
        average_patterns(model, task, torch.ones(4, T, dtype=torch.bool))
    with pytest.raises(ValueError, match="batch_size"):
        average_patterns(model, task.eval_batch(4), batch_size=0)
    with pytest.raises(ValueError, match=r"relations\['bad'\] is invalid"):
        head_statistics(model, task.eval_batch(4), relations={"bad": torch.ones(4, T, T - 1)})
    with pytest.raises(ValueError, match="index=7"):
        example_patterns(model, task.eval_batch(4), index=7)


def test_pattern_figures_write_png_and_csv(tmp_path, model, task):
    batch = task.eval_batch(16)
    patterns = patterns_frame(average_patterns(model, batch))
    templates = relations_frame(average_relations(task, batch))
    fig = plot_average_patterns(patterns, templates, path=tmp_path / "average.png")
    texts = [t.get_text() for t in fig.axes[0].texts]  # the panels: one tiled image
    assert [t for t in texts if t.startswith(("L", "template"))] == [
        "L0H0", "L0H1", "L0H2", "template: previous",
    ]  # fmt: skip
    assert "query position" in texts
    assert (tmp_path / "average.png").stat().st_size > 1000
    saved = pd.read_csv(tmp_path / "average.csv")
    assert list(saved.columns) == ["panel", "kind", "query", "key", "weight"]
    assert len(saved) == 4 * T * T
    assert saved.groupby("kind").size().to_dict() == {"head": 3 * T * T, "template": T * T}
    prev = saved[(saved.panel == "L0H0") & (saved["query"] == 5) & (saved.key == 4)]
    assert math.isclose(prev.weight.iloc[0], 1.0, abs_tol=1e-6)

    example = example_patterns(model, batch, index=2)
    fig = plot_example_patterns(example, path=tmp_path / "example.png")
    tokens = batch.tokens[2].tolist()
    labels = [f"{i}:{token}" for i, token in enumerate(tokens)]
    tiles = fig.axes[0]  # the panels: one tiled image; keys under each column, queries left
    assert [t.get_text() for t in tiles.texts if t.get_text() in labels][:2] == labels[:2]
    assert [t.get_text() for t in tiles.get_yticklabels()][: len(labels)] == labels
    assert (tmp_path / "example.png").stat().st_size > 1000
    saved = pd.read_csv(tmp_path / "example.csv")
    pd.testing.assert_frame_equal(saved, example, check_dtype=False)


def test_figure_rejects_wrong_table():
    with pytest.raises(ValueError, match="missing columns"):
        plot_average_patterns(pd.DataFrame({"head_label": ["L0H0"]}))


def test_stack_patterns_refuses_no_layers_and_a_mask_of_another_shape():
    from mhainterp.capture import stack_patterns
    from mhainterp.validation import ParameterError

    with pytest.raises(ParameterError, match="layers=\\[\\] is invalid: one"):
        stack_patterns([], torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(
        ParameterError, match=r"padding_mask=\(2, 4\) is invalid: \[B, T\] = \(2, 3\)"
    ):
        stack_patterns([torch.ones(2, 1, 3, 3)], torch.ones(2, 4, dtype=torch.bool))
    out = stack_patterns([torch.ones(2, 1, 3, 3)], torch.tensor([[True, True, False]] * 2))
    assert out.shape == (2, 1, 1, 3, 3) and out[:, :, :, 2].sum() == 0
