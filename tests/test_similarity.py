"""Known-answer tests for mhainterp.similarity and the similarity figures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch.testing import assert_close

import mhainterp.similarity.measures as similarity_module
from mhainterp.config import ModelConfig
from mhainterp.figures.similarity import plot_head_map, plot_similarity_heatmap
from mhainterp.model import HookedMHATransformer
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.similarity import (
    SIMILARITY_METHODS,
    cluster_heads,
    cross_model_similarity,
    dissimilarity,
    head_map_mds,
    head_separation,
    head_similarity,
    match_heads,
    similarity_frame,
)

T, V = 16, 10
PATTERN_METHODS = ("js", "pattern_corr", "cka", "separation")


@pytest.fixture(scope="module")
def model():
    # Heads 0 and 2 are identical previous-token heads, head 1 is uniform.
    return handbuilt_model(["previous", "uniform", "previous"], seq_len=T, d_vocab=V)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, V, (24, T), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def similarities(model, tokens):
    return {method: head_similarity(model, tokens, method) for method in SIMILARITY_METHODS}


def _bits_entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


@pytest.mark.parametrize("method", PATTERN_METHODS)
def test_identical_pair_ranks_most_similar(similarities, method):
    sim = similarities[method]
    assert list(sim.index) == ["L0H0", "L0H1", "L0H2"] == list(sim.columns)
    off_diagonal = sim.where(~np.eye(3, dtype=bool)).stack()
    assert off_diagonal.idxmax() in {("L0H0", "L0H2"), ("L0H2", "L0H0")}
    assert_close(sim.loc["L0H0", "L0H2"], 1.0, atol=1e-6, rtol=0)
    assert sim.loc["L0H0", "L0H1"] < 0.5
    np.testing.assert_allclose(sim.to_numpy(), sim.to_numpy().T, atol=1e-9)


def test_js_known_values(similarities, model, tokens):
    js = similarities["js"]
    # A head compared with itself: divergence exactly 0, similarity exactly 1.
    assert (np.diag(js.to_numpy()) == 1.0).all()
    # One-hot on q-1 vs uniform over the q+1 visible keys, averaged over q = 1..T-1.
    divergences = []
    for q in range(1, T):
        n = q + 1
        m = np.array([(1 + 1 / n) / 2] + [1 / (2 * n)] * (n - 1))
        divergences.append(_bits_entropy(m) - math.log2(n) / 2)
    assert_close(js.loc["L0H0", "L0H1"], 1 - float(np.mean(divergences)), atol=1e-6, rtol=0)
    # Previous vs first-position: the same key only at q = 1, disjoint (JS = 1 bit) elsewhere.
    other = handbuilt_model(["previous", "first"], seq_len=T, d_vocab=V, d_head=18)
    sim = head_similarity(other, tokens, "js")
    assert_close(sim.loc["L0H0", "L0H1"], 1 / (T - 1), atol=1e-6, rtol=0)


def test_pattern_corr_and_cka_self(similarities):
    np.testing.assert_allclose(np.diag(similarities["pattern_corr"]), 1.0, atol=1e-9)
    np.testing.assert_allclose(np.diag(similarities["cka"]), 1.0, atol=1e-9)


def test_streaming_does_not_change_similarity(model, tokens, similarities, monkeypatch):
    for method in ("js", "pattern_corr", "cka", "separation"):
        small = head_similarity(model, tokens, method, batch_size=5)
        np.testing.assert_allclose(small, similarities[method], atol=1e-9)
    # Chunking inside a batch (to bound memory) does not change the result either.
    for method in ("js", "separation"):
        whole = head_similarity(model, tokens[:6], method)
        with monkeypatch.context() as patch:
            patch.setattr(similarity_module, "_CHUNK_ELEMENTS", 1)  # smallest possible chunks
            chunked = head_similarity(model, tokens[:6], method)
        np.testing.assert_allclose(chunked, whole, atol=1e-9)


def _random_model(**overrides) -> HookedMHATransformer:
    cfg = dict(
        d_model=32,
        n_heads=4,
        n_layers=2,
        n_ctx=8,
        d_vocab=7,
        causal=True,
        seed=3,
        normalization_type="LN",
        attn_only=False,
    )
    return HookedMHATransformer(ModelConfig(**{**cfg, **overrides}))


def _padded(n: int = 12, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 7, (n, 8), generator=generator)
    lengths = torch.randint(3, 9, (n,), generator=generator)
    return tokens, torch.arange(8)[None] < lengths[:, None]


def _linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x - x.mean(0), y - y.mean(0)
    return float((y.T @ x).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm()))


def test_cka_equals_direct_computation_on_hook_result():
    model = _random_model()
    tokens, mask = _padded()
    sim = head_similarity(model, tokens, "cka", padding_mask=mask, batch_size=5)
    _, cache = model.run_with_cache(tokens, padding_mask=mask)
    with torch.no_grad():
        cache.compute_head_results()  # hook_result fires only under use_attn_result (TL's rule)
    outputs = {
        f"L{layer}H{head}": cache["result", layer][:, :, head][mask].double()
        for layer in range(2)
        for head in range(4)
    }
    for a, b in [("L0H0", "L0H0"), ("L0H1", "L0H3"), ("L0H2", "L1H1")]:
        assert_close(sim.loc[a, b], _linear_cka(outputs[a], outputs[b]), atol=1e-6, rtol=1e-6)
    # Across models with different head counts (same d_model).
    other = _random_model(n_heads=2, seed=5)
    cross = cross_model_similarity(model, other, tokens, "cka", mask, batch_size=5)
    _, cache_b = other.run_with_cache(tokens, padding_mask=mask)
    with torch.no_grad():
        cache_b.compute_head_results()
    for a, (layer, head) in [("L0H1", (1, 0)), ("L1H3", (0, 1))]:
        theirs = cache_b["result", layer][:, :, head][mask].double()
        expected = _linear_cka(outputs[a], theirs)
        assert_close(cross.loc[a, f"L{layer}H{head}"], expected, atol=1e-6, rtol=1e-6)


def test_weight_space_similarity(similarities):
    # QK: the previous heads have identical QK circuits; the uniform head has none (all zero),
    # which matches nothing else.
    qk = similarities["qk"]
    assert qk.to_numpy().round(6).tolist() == [[1, 0, 1], [0, 1, 0], [1, 0, 1]]
    # OV: all three heads copy the attended token (W_V W_O = scaled identity on tokens), so
    # weight-space OV similarity cannot tell them apart while pattern methods can.
    np.testing.assert_allclose(similarities["ov"], np.ones((3, 3)), atol=1e-9)


def test_ov_is_frobenius_cosine():
    model = _random_model()
    ov = head_similarity(model, method="ov")
    attn0, attn1 = model.blocks[0].attn, model.blocks[1].attn
    with torch.no_grad():
        a = attn0.W_V[1].double() @ attn0.W_O[1].double()
        b = attn1.W_V[2].double() @ attn1.W_O[2].double()
    expected = float((a * b).sum() / (a.norm() * b.norm()))
    assert_close(ov.loc["L0H1", "L1H2"], expected, atol=1e-9, rtol=1e-9)


def _one_hot_inputs(tokens: torch.Tensor) -> torch.Tensor:
    """The hand-built model's layer input: one-hot token + one-hot position."""
    x = torch.zeros(*tokens.shape, V + T, dtype=torch.float64)
    x.scatter_(-1, tokens[..., None], 1.0)
    x[:, torch.arange(T), V + torch.arange(T)] = 1.0
    return x


def test_separation_known_distances(tokens):
    model = handbuilt_model(["previous", "first", "uniform"], seq_len=T, d_vocab=V)
    table = head_separation(model, tokens).set_index(["head_a", "head_b"])
    x = _one_hot_inputs(tokens)
    distances, scaled = {"first": [], "uniform": []}, {"first": [], "uniform": []}
    for seq in range(tokens.shape[0]):
        for q in range(1, T):
            previous = x[seq, q - 1]
            contexts = {"first": x[seq, 0], "uniform": x[seq, : q + 1].mean(0)}
            bound = math.sqrt(2 + 2 * (len(set(tokens[seq, : q + 1].tolist())) > 1))
            for name, context in contexts.items():
                distance = float((previous - context).norm())
                distances[name].append(distance)
                scaled[name].append(distance / bound)
    for name, label in [("first", "L0H1"), ("uniform", "L0H2")]:
        row = table.loc[("L0H0", label)]
        assert_close(row.distance, float(np.mean(distances[name])), atol=1e-6, rtol=0)
        assert_close(row.scaled_distance, float(np.mean(scaled[name])), atol=1e-6, rtol=0)
        assert_close(row.similarity, 1 - row.scaled_distance, atol=1e-12, rtol=0)
    assert_close(table.loc[("L0H1", "L0H1")].distance, 0.0, atol=1e-9, rtol=0)
    assert set(table.n_queries) == {tokens.shape[0] * (T - 1)}


def test_bidirectional_known_answers(tokens):
    # Mirror (k = T-1-q) and self (k = q) never share a key when T is even.
    model = handbuilt_model(["mirror", "self"], seq_len=T, d_vocab=V, d_head=18, causal=False)
    js = head_similarity(model, tokens, "js")
    assert_close(js.loc["L0H0", "L0H1"], 0.0, atol=1e-6, rtol=0)
    table = head_separation(model, tokens).set_index(["head_a", "head_b"])
    x = _one_hot_inputs(tokens)
    distances, scaled = [], []
    for seq in range(tokens.shape[0]):
        bound = math.sqrt(2 + 2 * (len(set(tokens[seq].tolist())) > 1))  # every key is visible
        for q in range(T):
            distance = float((x[seq, T - 1 - q] - x[seq, q]).norm())
            distances.append(distance)
            scaled.append(distance / bound)
    row = table.loc[("L0H0", "L0H1")]
    assert_close(row.distance, float(np.mean(distances)), atol=1e-6, rtol=0)
    assert_close(row.scaled_distance, float(np.mean(scaled)), atol=1e-6, rtol=0)
    assert row.n_queries == tokens.shape[0] * T  # bidirectional: every query sees T keys


def test_separation_with_one_head_reference(model, tokens):
    reference = handbuilt_model(["previous"], seq_len=T, d_vocab=V, d_head=48)
    table = head_separation(model, tokens, reference=reference).set_index(["head_a", "head_b"])
    # The reference's previous head has the same context vectors as the model's.
    assert_close(table.loc[("L0H0", "ref:L0H0")].distance, 0.0, atol=1e-6, rtol=0)
    assert_close(
        table.loc[("L0H1", "ref:L0H0")].distance,
        table.loc[("L0H1", "L0H0")].distance,
        atol=1e-9,
        rtol=0,
    )
    square = head_similarity(model, tokens, "separation", reference=reference)
    assert list(square.index) == ["L0H0", "L0H1", "L0H2", "ref:L0H0"]
    assert_close(square.loc["L0H2", "ref:L0H0"], 1.0, atol=1e-6, rtol=0)


def test_separation_multilayer_layernorm_matches_direct():
    model = _random_model()
    tokens, mask = _padded()
    table = head_separation(model, tokens, mask, batch_size=5).set_index(["head_a", "head_b"])
    _, cache = model.run_with_cache(tokens, padding_mask=mask)
    contexts = []
    with torch.no_grad():
        for layer, head in [(0, 0), (1, 1)]:
            x = model.blocks[layer].ln1(cache["resid_pre", layer]).double()
            contexts.append(cache["pattern", layer][:, head].double() @ x)  # (n, T, d_model)
    counted = mask.clone()
    counted[:, 0] = False  # causal position 0 sees a single key
    distance = (contexts[0] - contexts[1]).norm(dim=-1)[counted].mean()
    assert_close(table.loc[("L0H0", "L1H1")].distance, float(distance), atol=1e-6, rtol=1e-6)
    assert ((table.similarity >= 0) & (table.similarity <= 1)).all()


def test_hungarian_recovers_permutation(tokens):
    kinds = ["previous", "uniform", "first", "self"]
    permutation = [2, 0, 3, 1]  # head j of model B does what head permutation[j] of A does
    model_a = handbuilt_model(kinds, seq_len=T, d_vocab=V)
    model_b = handbuilt_model([kinds[i] for i in permutation], seq_len=T, d_vocab=V)
    for method in ("js", "pattern_corr", "cka"):
        pairs = match_heads(cross_model_similarity(model_a, model_b, tokens, method))
        found = dict(zip(pairs.head_b, pairs.head_a, strict=True))
        assert found == {f"L0H{j}": f"L0H{i}" for j, i in enumerate(permutation)}, method
        np.testing.assert_allclose(pairs.similarity, 1.0, atol=1e-6)


def test_matching_across_head_counts(tokens):
    model_a = handbuilt_model(["previous", "uniform", "first", "self"], seq_len=T, d_vocab=V)
    model_b = handbuilt_model(["self", "previous"], seq_len=T, d_vocab=V, d_head=24)
    sim = cross_model_similarity(model_a, model_b, tokens, "js")
    assert sim.shape == (4, 2)
    pairs = match_heads(sim)
    matched = pairs.dropna(subset=["head_a", "head_b"])
    assert dict(zip(matched.head_a, matched.head_b, strict=True)) == {
        "L0H0": "L0H1",
        "L0H3": "L0H0",
    }
    assert sorted(pairs.loc[pairs.head_b.isna(), "head_a"]) == ["L0H1", "L0H2"]


def test_clustering_and_mds(similarities):
    js = similarities["js"]
    clusters = cluster_heads(js).set_index("head_label")
    assert clusters.loc["L0H0", "cluster"] == clusters.loc["L0H2", "cluster"]
    assert clusters.loc["L0H1", "cluster"] != clusters.loc["L0H0", "cluster"]
    # The identical heads are neighbours in the leaf order.
    assert abs(clusters.loc["L0H0", "order"] - clusters.loc["L0H2", "order"]) == 1
    assert cluster_heads(js, n_clusters=1)["cluster"].tolist() == [1, 1, 1]
    mds = head_map_mds(js)
    assert list(mds.columns) == ["head_label", "x", "y"]
    xy = mds.set_index("head_label")
    assert math.dist(xy.loc["L0H0"], xy.loc["L0H2"]) < 1e-3
    # MDS preserves the one non-zero distance of this three-point configuration.
    expected = dissimilarity(js).loc["L0H0", "L0H1"]
    assert_close(math.dist(xy.loc["L0H0"], xy.loc["L0H1"]), expected, atol=1e-3, rtol=0)


def test_bad_arguments(model, tokens):
    with pytest.raises(
        ValueError, match="one of 'js', 'pattern_corr', 'cka', 'ov', 'qk', 'separation'"
    ):
        head_similarity(model, tokens, "cosine")
    with pytest.raises(
        ValueError,
        match=r"data=None is invalid: tokens \(a Task, a Batch or \[n, pos\] .* method='js'",
    ):
        head_similarity(model, method="js")
    with pytest.raises(
        ValueError, match="method='js' is invalid: 'separation' when a reference is given"
    ):
        head_similarity(model, tokens, "js", reference=model)
    with pytest.raises(ValueError, match="reference is invalid: a one-head model"):
        head_separation(model, tokens, reference=model)
    with pytest.raises(ValueError, match="one of 'js', 'pattern_corr', 'cka'"):
        cross_model_similarity(model, model, tokens, "ov")
    other = handbuilt_model(["self", "previous"], seq_len=T, d_vocab=V, d_head=32)
    with pytest.raises(
        ValueError, match=r"model_b is invalid: a model with model_a's d_model=\d+ \(cka"
    ):
        cross_model_similarity(model, other, tokens, "cka")
    with pytest.raises(ValueError, match="similarity is invalid: a square table"):
        cluster_heads(pd.DataFrame(np.ones((2, 3))))
    with pytest.raises(TypeError, match="HookedMHATransformer"):
        head_similarity("model", tokens)


def test_similarity_figures_write_png_and_csv(tmp_path, similarities):
    js = similarities["js"]
    fig = plot_similarity_heatmap(js, method="js", path=tmp_path / "js.png")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "head" and "js" in fig.get_suptitle()  # above the colour bar
    assert fig.axes[1].get_ylabel() == "similarity (js)"  # the colour bar
    assert (tmp_path / "js.png").stat().st_size > 1000
    saved = pd.read_csv(tmp_path / "js.csv")
    assert list(saved.columns) == [
        "method",
        "head_a",
        "head_b",
        "similarity",
        "cluster_a",
        "cluster_b",
    ]
    assert len(saved) == 9 and set(saved.method) == {"js"}
    merged = saved.merge(similarity_frame(js), on=["head_a", "head_b"], suffixes=("", "_m"))
    np.testing.assert_allclose(merged.similarity, merged.similarity_m, atol=1e-12)
    pair = saved[(saved.head_a == "L0H0") & (saved.head_b == "L0H2")]
    assert pair.cluster_a.item() == pair.cluster_b.item()
    # Identical heads are drawn next to each other.
    order = [t.get_text() for t in ax.get_yticklabels()]
    assert abs(order.index("L0H0") - order.index("L0H2")) == 1

    mds = head_map_mds(js)
    clusters = cluster_heads(js)
    fig = plot_head_map(mds, clusters=clusters, method="js", path=tmp_path / "map.png")
    assert fig.axes[0].get_xlabel() == "MDS dimension 1"
    saved = pd.read_csv(tmp_path / "map.csv")
    assert list(saved.columns) == ["head_label", "x", "y", "group"]
    np.testing.assert_allclose(saved[["x", "y"]], mds[["x", "y"]], atol=1e-12)
    assert saved.group.tolist() == [f"cluster {c}" for c in clusters.cluster]


def test_cross_model_heatmap_is_not_clustered(tmp_path, tokens):
    model_a = handbuilt_model(["previous", "first"], seq_len=T, d_vocab=V, d_head=18)
    model_b = handbuilt_model(["first", "previous", "self"], seq_len=T, d_vocab=V)
    sim = cross_model_similarity(model_a, model_b, tokens)
    fig = plot_similarity_heatmap(sim, method="js", path=tmp_path / "cross.png")
    assert fig.axes[0].get_xlabel() == "model B head"
    saved = pd.read_csv(tmp_path / "cross.csv")
    assert len(saved) == 6 and "cluster_a" not in saved
