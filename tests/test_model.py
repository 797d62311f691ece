"""Tests of mhainterp.model: the MHA layer, the hooked transformer and its TransformerLens contract.

Every test checks real values: exact tensors (``torch.equal``) where the computation is exact,
``torch.testing.assert_close`` against an independent computation (``torch.nn.MultiheadAttention``,
einsums over the per-head views, hand-computed cross-entropy) where it is floating point, and
closed-form numbers on the hand-built model (:mod:`mhainterp.model.handbuilt`) whose heads are
known.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close
from transformer_lens import ActivationCache
from transformer_lens.head_detector import detect_head
from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

from mhainterp.config import ModelConfig
from mhainterp.heads import head_label, parse_head_label
from mhainterp.model import (
    HookedMHATransformer,
    LayerNorm,
    MultiHeadAttention,
    StopForward,
    merge_heads,
    split_heads,
)
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.validation import ParameterError

D_MODEL, N_HEADS, N_CTX, D_VOCAB = 32, 4, 8, 10
D_HEAD = D_MODEL // N_HEADS


def make_model(**overrides) -> HookedMHATransformer:
    """A small random model on CPU (seeded, so every test sees the same weights)."""
    kwargs = dict(
        d_model=D_MODEL, n_heads=N_HEADS, n_layers=1, n_ctx=N_CTX, d_vocab=D_VOCAB,
        causal=False, attn_only=True, device="cpu", seed=0,
    )  # fmt: skip
    kwargs.update(overrides)
    return HookedMHATransformer(ModelConfig(**kwargs)).eval()


def random_tokens(batch: int = 3, seq_len: int = N_CTX, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, D_VOCAB, (batch, seq_len), generator=torch.Generator().manual_seed(seed)
    )


def right_padding_mask(lengths: list[int], seq_len: int = N_CTX) -> torch.Tensor:
    """[batch, pos] bool, True for the first ``lengths[b]`` positions (real tokens)."""
    return torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]


# ----- seed step 1: split/merge ---------------------------------------------------------------
B1, T1, DM1, H1 = 2, 5, 8, 4  # the seed's numbers
DH1 = DM1 // H1


def seed_arange() -> torch.Tensor:
    return torch.arange(B1 * T1 * DM1, dtype=torch.float32).reshape(B1, T1, DM1)


def test_split_heads_shape_and_values_follow_the_seed():
    x = seed_arange()
    xh = split_heads(x, H1)
    assert xh.shape == (B1, H1, T1, DH1) == (2, 4, 5, 2)
    # Head 0 at position t holds features 0..1 of position t: rows t * d_model + (0, 1).
    expected_head0 = torch.tensor(
        [[0.0, 1.0], [8.0, 9.0], [16.0, 17.0], [24.0, 25.0], [32.0, 33.0]]
    )
    assert torch.equal(xh[0, 0], expected_head0)
    # Head 3 holds the last d_head features of every position.
    assert torch.equal(xh[1, 3], x[1, :, 6:8])
    # In general: head h at position t is x[b, t, h * d_head:(h + 1) * d_head].
    for h in range(H1):
        assert torch.equal(xh[:, h], x[:, :, h * DH1 : (h + 1) * DH1])


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8])
def test_split_then_merge_is_the_identity(n_heads):
    x = seed_arange()
    assert torch.equal(merge_heads(split_heads(x, n_heads)), x)


def test_tempting_reshape_mixes_positions_into_a_head():
    x = seed_arange()
    right = split_heads(x, H1)
    wrong = x.reshape(B1, H1, T1, DH1)  # same shape, wrong values
    assert wrong.shape == right.shape
    assert not torch.equal(wrong, right)
    # The wrong head 0 is just the first 10 numbers of sequence 0: positions 0,0,0,0,1.
    assert torch.equal(wrong[0, 0], torch.arange(10, dtype=torch.float32).reshape(5, 2))
    position_of = (wrong[0, 0] // DM1).long()  # position each value came from
    assert position_of[:, 0].tolist() == [0, 0, 0, 0, 1]
    # The right split keeps one position per row.
    assert (right[0, 0] // DM1).long()[:, 0].tolist() == [0, 1, 2, 3, 4]
    # Merging the wrong split does not give x back.
    assert not torch.equal(merge_heads(wrong), x)


def test_tempting_reshape_is_harmless_only_for_one_head():
    x = seed_arange()
    assert torch.equal(x.reshape(B1, 1, T1, DM1), split_heads(x, 1))
    assert not torch.equal(x.reshape(B1, 2, T1, DM1 // 2), split_heads(x, 2))


def test_model_q_uses_the_right_split():
    model = make_model()
    tokens = random_tokens()
    _, cache = model.run_with_cache(tokens)
    attn = model.blocks[0].attn
    q_fused = attn.q_proj(cache["resid_pre", 0])  # (B, T, d_model)
    # hook_q is [B, T, h, d_head]; split_heads gives [B, h, T, d_head].
    assert_close(cache["q", 0], split_heads(q_fused, N_HEADS).transpose(1, 2))


# ----- parameter count ------------------------------------------------------------------------
@pytest.mark.parametrize("n_heads", [1, 2, 4, 8, 16])
def test_attention_parameter_count_is_16640_for_every_head_count(n_heads):
    cfg = ModelConfig(d_model=64, n_heads=n_heads, n_ctx=16, d_vocab=10, device="cpu")
    attn = MultiHeadAttention(cfg)
    n_params = sum(p.numel() for p in attn.parameters())
    assert n_params == 16_640 == 4 * (64 * 64 + 64)
    assert cfg.n_attn_params == 16_640
    # Per-head views cover exactly the same numbers.
    assert attn.W_Q.numel() + attn.W_K.numel() + attn.W_V.numel() + attn.W_O.numel() == 4 * 64 * 64
    assert attn.b_Q.numel() + attn.b_K.numel() + attn.b_V.numel() + attn.b_O.numel() == 4 * 64


def test_whole_model_parameter_count_does_not_depend_on_head_count():
    counts = {
        h: HookedMHATransformer(
            ModelConfig(d_model=64, n_heads=h, n_layers=2, n_ctx=16, d_vocab=10, device="cpu")
        ).n_params
        for h in (1, 2, 4, 8, 16)
    }
    # embed 10*64 + pos 16*64 + 2 layers * 16640 + unembed 64*10+10
    expected = 10 * 64 + 16 * 64 + 2 * 16_640 + 64 * 10 + 10
    assert counts == dict.fromkeys(counts, expected)


# ----- equivalence with torch.nn.MultiheadAttention -------------------------------------------
def torch_mha_from(attn: MultiHeadAttention) -> nn.MultiheadAttention:
    """A torch MHA with our fused weights copied in (q, k, v stacked in in_proj)."""
    d_model = attn.cfg.d_model
    ref = nn.MultiheadAttention(d_model, attn.n_heads, batch_first=True, dropout=0.0)
    with torch.no_grad():
        ref.in_proj_weight.copy_(
            torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        )
        ref.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        ref.out_proj.weight.copy_(attn.o_proj.weight)
        ref.out_proj.bias.copy_(attn.o_proj.bias)
    return ref.eval()


@pytest.mark.parametrize(
    ("causal", "padded"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["bidirectional", "causal", "padding", "causal+padding"],
)
def test_attention_matches_torch_multihead_attention(causal, padded):
    model = make_model(causal=causal)
    tokens = random_tokens()
    padding_mask = right_padding_mask([8, 5, 2]) if padded else None
    _, cache = model.run_with_cache(tokens, padding_mask=padding_mask)
    x = cache["resid_pre", 0]  # attention input (no LayerNorm in this model)

    ref = torch_mha_from(model.blocks[0].attn)
    attn_mask = torch.triu(torch.ones(N_CTX, N_CTX, dtype=torch.bool), 1) if causal else None
    key_padding_mask = None if padding_mask is None else ~padding_mask  # torch: True = ignore
    with torch.no_grad():
        out, weights = ref(
            x, x, x,
            attn_mask=attn_mask, key_padding_mask=key_padding_mask,
            need_weights=True, average_attn_weights=False,
        )  # fmt: skip
    assert weights.shape == (3, N_HEADS, N_CTX, N_CTX)
    assert_close(cache["pattern", 0], weights)
    assert_close(cache["attn_out", 0], out)


def test_attention_module_called_directly_matches_torch():
    model = make_model(causal=True)
    attn = model.blocks[0].attn
    x = torch.randn(2, N_CTX, D_MODEL, generator=torch.Generator().manual_seed(1))
    ref = torch_mha_from(attn)
    mask = torch.triu(torch.ones(N_CTX, N_CTX, dtype=torch.bool), 1)
    with torch.no_grad():
        expected, _ = ref(x, x, x, attn_mask=mask, need_weights=False)
        assert_close(attn(x), expected)


# ----- patterns, scores, results --------------------------------------------------------------
def test_pattern_rows_sum_to_one_and_causal_future_gets_exactly_zero():
    model = make_model(causal=True)
    _, cache = model.run_with_cache(random_tokens())
    pattern = cache["pattern", 0]  # (B, h, T, T)
    assert_close(pattern.sum(-1), torch.ones(3, N_HEADS, N_CTX))
    future = torch.triu(torch.ones(N_CTX, N_CTX, dtype=torch.bool), 1)
    assert torch.all(pattern[..., future] == 0)
    assert torch.all(pattern[..., ~future] > 0)
    assert torch.equal(pattern[:, :, 0, 0], torch.ones(3, N_HEADS))  # query 0 sees only key 0


def test_padding_keys_get_exactly_zero_and_change_nothing_for_real_tokens():
    model = make_model()
    tokens = random_tokens()
    padding_mask = right_padding_mask([8, 5, 2])
    logits, cache = model.run_with_cache(tokens, padding_mask=padding_mask)
    pattern = cache["pattern", 0]
    assert_close(pattern.sum(-1), torch.ones(3, N_HEADS, N_CTX))
    assert torch.all(pattern[1, :, :, 5:] == 0)
    assert torch.all(pattern[2, :, :, 2:] == 0)
    assert torch.all(pattern[1, :, :, :5] > 0)
    # The real part of sequence 1 gives the same logits as running it alone, unpadded.
    assert_close(logits[1, :5], model(tokens[1:2, :5])[0])
    assert_close(logits[2, :2], model(tokens[2:3, :2])[0])


def test_query_that_sees_only_padding_attends_nowhere_without_nan():
    model = make_model(causal=True)
    tokens = random_tokens(batch=1)
    padding_mask = torch.tensor([[False, False, True, True, True, True, True, True]])
    logits, cache = model.run_with_cache(tokens, padding_mask=padding_mask)
    pattern = cache["pattern", 0]
    assert not torch.isnan(logits).any()
    # Queries 0 and 1 can see only keys 0..q, all padding: their rows are all zero.
    assert torch.equal(pattern[0, :, :2], torch.zeros(N_HEADS, 2, N_CTX))
    assert_close(pattern[0, :, 2:].sum(-1), torch.ones(N_HEADS, N_CTX - 2))


@pytest.mark.parametrize("causal", [False, True])
def test_attn_scores_are_scaled_pre_softmax_with_minus_inf_where_masked(causal):
    model = make_model(causal=causal)
    padding_mask = right_padding_mask([8, 6, 3])
    _, cache = model.run_with_cache(random_tokens(), padding_mask=padding_mask)
    scores, pattern = cache["attn_scores", 0], cache["pattern", 0]
    q, k = cache["q", 0], cache["k", 0]  # (B, T, h, d_head)
    blocked = ~padding_mask[:, None, None, :].expand(-1, N_HEADS, N_CTX, -1)
    if causal:
        blocked = blocked | torch.triu(torch.ones(N_CTX, N_CTX, dtype=torch.bool), 1)
    by_hand = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D_HEAD)
    assert torch.equal(torch.isneginf(scores), blocked)
    assert torch.isfinite(scores[~blocked]).all()
    assert_close(scores[~blocked], by_hand[~blocked])
    assert_close(torch.softmax(scores, dim=-1), pattern)
    assert torch.all(pattern[blocked] == 0)


def test_head_results_plus_b_O_sum_to_attn_out():
    model = make_model(causal=True, use_attn_result=True)
    _, cache = model.run_with_cache(random_tokens())
    result = cache["result", 0]  # (B, T, h, d_model)
    assert result.shape == (3, N_CTX, N_HEADS, D_MODEL)
    assert_close(result.sum(dim=2) + model.blocks[0].attn.b_O, cache["attn_out", 0])
    # Without use_attn_result the hook does not fire (TransformerLens's semantics), and
    # TransformerLens recomputes the same results from hook_z and W_O.
    _, cache_without_result = make_model(causal=True).run_with_cache(random_tokens())
    assert "blocks.0.attn.hook_result" not in cache_without_result
    stacked = cache_without_result.stack_head_results(layer=-1)  # (h, B, T, d_model)
    assert_close(stacked, cache["result", 0].permute(2, 0, 1, 3))


def test_result_path_and_fused_path_give_the_same_logits():
    tokens = random_tokens()
    fused = make_model(n_layers=2)(tokens)
    per_head = make_model(n_layers=2, use_attn_result=True)(tokens)
    assert_close(per_head, fused)
    # A hook on hook_result fires only under use_attn_result (it does not switch paths).
    seen: list[str] = []
    for flag, fired in ((False, []), (True, ["blocks.0.attn.hook_result"])):
        seen.clear()
        model = make_model(n_layers=2, use_attn_result=flag)
        logits = model.run_with_hooks(
            tokens,
            fwd_hooks=[("blocks.0.attn.hook_result", lambda act, hook: seen.append(hook.name))],
        )
        assert seen == fired
        assert_close(logits, fused)


# ----- TransformerLens utilities on our model -------------------------------------------------
def test_detect_head_finds_the_handbuilt_previous_token_heads():
    model = handbuilt_model(["previous", "uniform", "previous"])
    tokens = model.to_tokens("1 2 3 4 5")
    assert tokens.tolist() == [[1, 2, 3, 4, 5]]
    scores = detect_head(model, "1 2 3 4 5", "previous_token_head")
    assert scores.shape == (1, 3)
    # "mul" score = attention on (q, q-1) / total attention. Query 0 has no previous token, so a
    # perfect previous head scores 4/5 on 5 tokens; the uniform head puts 1/(q+1) on q-1.
    uniform = (1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 5
    assert_close(scores, torch.tensor([[4 / 5, uniform, 4 / 5]]), atol=1e-4, rtol=0)
    # Excluding column 0 (the BOS convention) the previous heads score ~1.
    scores_no_bos = detect_head(model, "1 2 3 4 5", "previous_token_head", exclude_bos=True)
    uniform_no_bos = (1 / 3 + 1 / 4 + 1 / 5) / (1 / 2 + 2 / 3 + 3 / 4 + 4 / 5)
    assert_close(scores_no_bos, torch.tensor([[1.0, uniform_no_bos, 1.0]]), atol=1e-4, rtol=0)


def test_patching_head_outputs_gives_known_values():
    model = handbuilt_model(["previous", "uniform", "dead"])
    W_U = model.unembed.weight  # (V + 1, d_model)
    clean = random_tokens(batch=4, seq_len=16, seed=1)
    corrupted = random_tokens(batch=4, seq_len=16, seed=2)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        # mean logit of the clean previous token (positions 1..T-1)
        return logits[:, 1:].gather(-1, clean[:, :-1, None]).mean()

    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
        corrupted_logits, corrupted_cache = model.run_with_cache(corrupted)
        patched = get_act_patch_attn_head_out_all_pos(model, corrupted, clean_cache, metric)
    assert patched.shape == (1, 3)

    # The model is linear after attention: patching head h swaps its result in the residual.
    def expected(head: int) -> torch.Tensor:
        attn = model.blocks[0].attn
        clean_result, corrupted_result = (
            attn.head_results(c["z", 0]) for c in (clean_cache, corrupted_cache)
        )
        delta = clean_result[:, :, head] - corrupted_result[:, :, head]
        return metric(corrupted_logits + delta @ W_U.T)

    with torch.no_grad():
        assert_close(patched[0], torch.stack([expected(h) for h in range(3)]))
        baseline = metric(corrupted_logits)
        clean_value = metric(model(clean))
    # Nobody reads the dead head (and it writes nothing): patching it changes nothing.
    assert patched[0, 2].item() == baseline.item()
    # The previous-token head carries the answer: patching it gets the metric most of the way.
    assert patched[0, 0] > baseline + 0.5 * (clean_value - baseline)


# ----- per-head views ---------------------------------------------------------------------------
def test_per_head_views_have_transformer_lens_shapes():
    model = make_model(n_layers=2)
    attn = model.blocks[0].attn
    assert attn.W_Q.shape == attn.W_K.shape == attn.W_V.shape == (N_HEADS, D_MODEL, D_HEAD)
    assert attn.W_O.shape == (N_HEADS, D_HEAD, D_MODEL)
    assert attn.b_Q.shape == attn.b_K.shape == attn.b_V.shape == (N_HEADS, D_HEAD)
    assert attn.b_O.shape == (D_MODEL,)
    assert model.W_Q.shape == (2, N_HEADS, D_MODEL, D_HEAD)
    assert model.W_O.shape == (2, N_HEADS, D_HEAD, D_MODEL)
    assert torch.equal(model.W_K[1], model.blocks[1].attn.W_K)


def test_per_head_views_recompute_the_hooked_activations():
    model = make_model(causal=True, use_attn_result=True)
    attn = model.blocks[0].attn
    _, cache = model.run_with_cache(random_tokens())
    x = cache["resid_pre", 0]
    for h in range(N_HEADS):
        assert_close(x @ attn.W_Q[h] + attn.b_Q[h], cache["q", 0][:, :, h])
        assert_close(x @ attn.W_K[h] + attn.b_K[h], cache["k", 0][:, :, h])
        assert_close(x @ attn.W_V[h] + attn.b_V[h], cache["v", 0][:, :, h])
        assert_close(cache["z", 0][:, :, h] @ attn.W_O[h], cache["result", 0][:, :, h])
    # z of head h is its pattern applied to its values.
    assert_close(cache["z", 0], torch.einsum("bhqk,bkhd->bqhd", cache["pattern", 0], cache["v", 0]))


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("W_Q", (N_HEADS, D_MODEL, D_HEAD)),
        ("W_K", (N_HEADS, D_MODEL, D_HEAD)),
        ("W_V", (N_HEADS, D_MODEL, D_HEAD)),
        ("W_O", (N_HEADS, D_HEAD, D_MODEL)),
        ("b_Q", (N_HEADS, D_HEAD)),
        ("b_K", (N_HEADS, D_HEAD)),
        ("b_V", (N_HEADS, D_HEAD)),
        ("b_O", (D_MODEL,)),
    ],
)
def test_assigning_a_per_head_view_writes_through(name, shape):
    model = make_model()
    attn = model.blocks[0].attn
    value = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    setattr(attn, name, value)
    assert torch.equal(getattr(attn, name), value)
    changed = sorted(k for k, v in model.state_dict().items() if not torch.equal(v, before[k]))
    proj = {"Q": "q_proj", "K": "k_proj", "V": "v_proj", "O": "o_proj"}[name[-1]]
    part = "weight" if name.startswith("W") else "bias"
    assert changed == [f"blocks.0.attn.{proj}.{part}"]


def test_assigned_head_weights_drive_the_forward_pass():
    model = make_model()
    attn = model.blocks[0].attn
    W_Q = torch.zeros(N_HEADS, D_MODEL, D_HEAD)
    W_Q[2, 0, 0] = 1.0  # head 2, q[0] = x[0]
    attn.W_Q = W_Q
    attn.b_Q = torch.zeros(N_HEADS, D_HEAD)
    _, cache = model.run_with_cache(random_tokens())
    x = cache["resid_pre", 0]
    assert torch.equal(cache["q", 0][:, :, [0, 1, 3]], torch.zeros(3, N_CTX, 3, D_HEAD))
    assert torch.equal(cache["q", 0][:, :, 2, 0], x[..., 0])


@pytest.mark.parametrize("name", ["W_Q", "W_O", "b_K", "b_O"])
def test_assigning_a_wrong_shape_raises_value_error(name):
    attn = make_model().blocks[0].attn
    with pytest.raises(ValueError, match=rf"{name[0]}_.*shape .*got \(3, 5\)"):
        setattr(attn, name, torch.zeros(3, 5))
    with pytest.raises(ValueError, match="is invalid: a tensor of shape"):
        setattr(attn, name, [[0.0]])


# ----- hooks and caches -------------------------------------------------------------------------
def test_run_with_cache_returns_an_activation_cache_with_tl_names():
    model = make_model(n_layers=2, causal=True, use_attn_result=True)
    logits, cache = model.run_with_cache(random_tokens())
    assert isinstance(cache, ActivationCache)
    assert_close(logits, model(random_tokens()))
    assert cache["pattern", 0].shape == (3, N_HEADS, N_CTX, N_CTX)
    assert cache["attn_scores", 1].shape == (3, N_HEADS, N_CTX, N_CTX)
    for name in ("q", "k", "v", "z"):
        assert cache[name, 1].shape == (3, N_CTX, N_HEADS, D_HEAD)
    assert cache["result", 0].shape == (3, N_CTX, N_HEADS, D_MODEL)
    assert torch.equal(cache["pattern", 1], cache["blocks.1.attn.hook_pattern"])
    assert torch.equal(cache["resid_pre", 1], cache["resid_post", 0])
    assert_close(cache["resid_pre", 0], cache["hook_embed"] + cache["hook_pos_embed"])
    # TransformerLens's residual decomposition adds back up to the final residual stream.
    components = cache.decompose_resid(layer=-1)  # embed, pos_embed, attn_out L0, attn_out L1
    assert components.shape[0] == 4
    assert_close(components.sum(0), cache["resid_post", 1])


def test_remove_batch_dim():
    model = make_model(causal=True)
    tokens = random_tokens(batch=1)
    _, batched = model.run_with_cache(tokens)
    _, unbatched = model.run_with_cache(tokens, remove_batch_dim=True)
    assert unbatched["pattern", 0].shape == (N_HEADS, N_CTX, N_CTX)
    assert torch.equal(unbatched["pattern", 0], batched["pattern", 0][0])
    expected_q = batched["q", 0][0].clone()
    batched.remove_batch_dim()
    assert torch.equal(batched["q", 0], expected_q)


def test_hooks_are_removed_after_run_with_hooks():
    model = make_model()
    tokens = random_tokens()
    clean = model(tokens)

    def zero_attn(act, hook):
        return torch.zeros_like(act)

    ablated = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_attn_out", zero_attn)])
    assert not torch.allclose(ablated, clean)
    assert all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values())
    assert torch.equal(model(tokens), clean)


def test_zeroing_one_head_in_hook_z_changes_only_that_heads_result():
    model = make_model(causal=True, use_attn_result=True)
    tokens = random_tokens()
    _, clean = model.run_with_cache(tokens)
    saved = {}

    def zero_head_1(z, hook):
        z[:, :, 1] = 0.0
        return z

    def save(act, hook):
        saved["result"] = act.detach().clone()

    model.run_with_hooks(
        tokens,
        fwd_hooks=[("blocks.0.attn.hook_z", zero_head_1), ("blocks.0.attn.hook_result", save)],
    )
    result = saved["result"]
    assert torch.equal(result[:, :, 1], torch.zeros(3, N_CTX, D_MODEL))
    assert not torch.equal(clean["result", 0][:, :, 1], result[:, :, 1])
    for h in (0, 2, 3):
        assert_close(result[:, :, h], clean["result", 0][:, :, h], atol=0, rtol=0)


# ----- input validation -------------------------------------------------------------------------
def test_tokens_outside_the_vocabulary_raise():
    model = make_model()
    with pytest.raises(ValueError, match=r"\[0, d_vocab=10\).*\[0, 10\]"):
        model(torch.tensor([[0, 10, 3]]))
    with pytest.raises(ValueError, match=r"\[0, d_vocab=10\).*\[-1, 3\]"):
        model(torch.tensor([[-1, 3]]))


def test_sequence_longer_than_n_ctx_raises():
    model = make_model()
    with pytest.raises(
        ValueError, match=r"tokens is invalid: a sequence length in \[1, n_ctx=8\], got 9"
    ):
        model(torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"sequence length in \[1, n_ctx=8\], got 0;"):
        model(torch.zeros(2, 0, dtype=torch.long))


def test_float_and_bool_tokens_raise_value_error():
    model = make_model()
    with pytest.raises(ValueError, match=r"integer ids.*float32.*\.long\(\)"):
        model(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"integer ids.*torch\.bool"):
        model(torch.tensor([[True, False]]))


def test_model_needs_a_model_config():
    with pytest.raises(TypeError, match="cfg must be a ModelConfig, got dict"):
        HookedMHATransformer({"d_model": 64})


def test_non_tensor_tokens_raise_type_error():
    model = make_model()
    with pytest.raises(TypeError, match=r"torch\.Tensor.*got list.*to_tokens"):
        model([[1, 2, 3]])


def test_bad_shapes_and_padding_masks_raise():
    model = make_model()
    tokens = random_tokens()
    with pytest.raises(ValueError, match=r"\[batch, pos\], got shape \(1, 3, 8\)"):
        model(tokens[None])
    with pytest.raises(ValueError, match=r"padding_mask is invalid: the tokens' shape \(3, 8\).*"
                       r"got \(3, 7\)"):  # fmt: skip
        model(tokens, padding_mask=torch.ones(3, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"padding_mask is invalid: a bool tensor"):
        model(tokens, padding_mask=torch.ones(3, 8))
    with pytest.raises(ValueError, match=r"return_type='probs' is invalid: one of 'logits'"):
        model(tokens, return_type="probs")
    with pytest.raises(
        ValueError, match=r"targets=None is invalid: a targets tensor when return_type="
    ):
        model(tokens, return_type="loss")


def test_one_dimensional_tokens_get_a_batch_axis():
    model = make_model()
    tokens = random_tokens(batch=1)
    assert_close(model(tokens[0]), model(tokens))
    mask = right_padding_mask([5])
    assert_close(model(tokens[0], padding_mask=mask[0]), model(tokens, padding_mask=mask))


@pytest.mark.parametrize(
    ("seq", "expected"),
    [
        ("3 1 4", [[3, 1, 4]]),
        ("3,1,4", [[3, 1, 4]]),
        (" 3, 1 ,4 ", [[3, 1, 4]]),
        ([3, 1, 4], [[3, 1, 4]]),
        ([[3, 1, 4], [1, 5, 9]], [[3, 1, 4], [1, 5, 9]]),
        (torch.tensor([2, 7]), [[2, 7]]),
    ],
)
def test_to_tokens_parses_strings_and_lists(seq, expected):
    tokens = make_model().to_tokens(seq)
    assert tokens.dtype == torch.long
    assert tokens.tolist() == expected


def test_to_tokens_rejects_what_it_cannot_read():
    model = make_model()
    with pytest.raises(
        ValueError, match=r"tokens='a b' is invalid: integer ids separated by spaces"
    ):
        model.to_tokens("a b")
    with pytest.raises(ValueError, match=r"d_vocab=10"):
        model.to_tokens("3 12")


def test_head_labels():
    model = make_model(n_layers=2, n_heads=2)
    assert model.head_labels == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert head_label(1, 3) == "L1H3"
    assert parse_head_label("L1H0", 2, 2) == (1, 0)
    with pytest.raises(ValueError, match=r"head='L2H0' is invalid: .*L0H0, L0H1, L1H0, L1H1"):
        parse_head_label("L2H0", 2, 2)
    assert parse_head_label("L12H3") == (12, 3)  # a table's label: its form only
    for malformed in ("L1", "H1L0", "L1H2,L0H0", " L1H2", 3):
        with pytest.raises(ValueError, match="a head label like 'L0H3'"):
            parse_head_label(malformed)


# ----- seeds ------------------------------------------------------------------------------------
def test_same_seed_gives_identical_weights_regardless_of_global_rng():
    torch.manual_seed(123)
    a = make_model(seed=7, n_layers=2, attn_only=False, normalization_type="LN")
    torch.manual_seed(456)
    b = make_model(seed=7, n_layers=2, attn_only=False, normalization_type="LN")
    c = make_model(seed=8, n_layers=2, attn_only=False, normalization_type="LN")
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys() == sc.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    random_keys = [k for k in sa if "ln" not in k]  # LayerNorms start at 1 / 0 for every seed
    assert all(not torch.equal(sa[k], sc[k]) for k in random_keys)


# ----- variants ---------------------------------------------------------------------------------
def test_two_layers_chain_the_residual_stream():
    model = make_model(n_layers=2, causal=True)
    _, cache = model.run_with_cache(random_tokens())
    assert "blocks.1.attn.hook_pattern" in cache
    for layer in range(2):
        assert_close(
            cache["resid_post", layer], cache["resid_pre", layer] + cache["attn_out", layer]
        )
    logits = model.unembed(cache["resid_post", 1])
    assert_close(logits, model(random_tokens()))


def test_mlp_blocks_have_resid_mid_and_mlp_out():
    model = make_model(attn_only=False)
    _, cache = model.run_with_cache(random_tokens())
    assert {"blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out"} <= set(cache.keys())
    mlp = model.blocks[0].mlp
    assert_close(cache["resid_mid", 0], cache["resid_pre", 0] + cache["attn_out", 0])
    assert_close(cache["mlp_out", 0], mlp.fc_out(torch.relu(mlp.fc_in(cache["resid_mid", 0]))))
    assert_close(cache["resid_post", 0], cache["resid_mid", 0] + cache["mlp_out", 0])
    attn_only = make_model()
    assert not hasattr(attn_only.blocks[0], "mlp")
    assert "blocks.0.hook_mlp_out" not in attn_only.hook_dict


def test_layernorm_variant_normalises_the_attention_input():
    model = make_model(normalization_type="LN")
    assert isinstance(model.blocks[0].ln1, LayerNorm)
    assert isinstance(model.ln_final, LayerNorm)
    _, cache = model.run_with_cache(random_tokens())
    x = cache["resid_pre", 0]
    normed = (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        x.var(-1, unbiased=False, keepdim=True) + 1e-5
    )
    with torch.no_grad():
        assert_close(model.blocks[0].attn(normed), cache["attn_out", 0])
    assert isinstance(make_model().blocks[0].ln1, nn.Identity)


def test_several_targets_give_logits_per_target():
    model = make_model(n_targets=3, d_vocab_out=5)
    tokens = random_tokens()
    logits = model(tokens)
    assert logits.shape == (3, N_CTX, 3, 5)
    flat = model.unembed(model.run_with_cache(tokens)[1]["resid_post", 0])  # (B, T, 15)
    assert_close(logits, flat.reshape(3, N_CTX, 3, 5))
    targets = torch.randint(0, 5, (3, N_CTX, 3), generator=torch.Generator().manual_seed(4))
    loss = model(tokens, return_type="loss", targets=targets)
    assert_close(loss, F.cross_entropy(logits.reshape(-1, 5), targets.reshape(-1)))


# ----- loss -------------------------------------------------------------------------------------
LOGITS = torch.tensor([[[1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, -1.0, 0.0, 1.0]]])


def nll(row: list[float], target: int) -> float:
    return math.log(sum(math.exp(v) for v in row)) - row[target]


def test_loss_ignores_minus_100_targets():
    model = make_model(d_vocab_out=4)
    targets = torch.tensor([[2, -100, 0]])
    expected = (nll([1, 2, 3, 0], 2) + nll([2, -1, 0, 1], 0)) / 2
    assert model.loss(LOGITS, targets).item() == pytest.approx(expected, rel=1e-6)


def test_loss_ignores_positions_outside_the_loss_mask():
    model = make_model(d_vocab_out=4)
    targets = torch.tensor([[2, 1, 0]])
    loss_mask = torch.tensor([[True, True, False]])
    expected = (nll([1, 2, 3, 0], 2) + nll([0, 0, 0, 0], 1)) / 2
    assert model.loss(LOGITS, targets, loss_mask).item() == pytest.approx(expected, rel=1e-6)
    assert nll([0, 0, 0, 0], 1) == pytest.approx(math.log(4))


def test_loss_mask_applies_to_every_target():
    model = make_model(d_vocab_out=4, n_targets=2)
    logits = torch.stack([LOGITS, LOGITS.flip(-1)], dim=2)  # (1, 3, 2, 4)
    targets = torch.tensor([[[2, 3], [-100, 1], [0, 0]]])
    loss_mask = torch.tensor([[True, True, False]])
    expected = (nll([1, 2, 3, 0], 2) + nll([0, 3, 2, 1], 3) + nll([0, 0, 0, 0], 1)) / 3
    assert model.loss(logits, targets, loss_mask).item() == pytest.approx(expected, rel=1e-6)


def test_loss_refuses_float_or_misshapen_targets_in_the_one_format():
    model = make_model(d_vocab_out=4)
    with pytest.raises(ParameterError, match=r"targets='a torch.float32 tensor' is invalid: an "):
        model.loss(LOGITS, torch.tensor([[2.0, 1.0, 0.0]]))
    with pytest.raises(
        ParameterError,
        match=r"targets='a tensor of shape \(1, 2\)' is invalid: shape \(1, 3\), matching",
    ):
        model.loss(LOGITS, torch.tensor([[2, 1]]))


def test_forward_both_returns_logits_and_loss():
    model = make_model()
    tokens = random_tokens()
    targets = tokens.flip(-1)
    logits, loss = model(tokens, return_type="both", targets=targets)
    assert_close(logits, model(tokens))
    assert_close(loss, F.cross_entropy(logits.reshape(-1, D_VOCAB), targets.reshape(-1)))
    assert model(tokens, return_type=None) is None


# ----- TransformerLens parity: LayerNorm hooks, layout weights, prompts ----------------------
def ln_model() -> HookedMHATransformer:
    model = make_model(n_layers=2, attn_only=False, normalization_type="LN")
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # non-trivial LayerNorm weights
        for name, param in model.named_parameters():
            if ".ln" in name or name.startswith("ln_final"):
                param.add_(0.3 * torch.randn(param.shape, generator=generator))
    return model


def test_layernorm_hooks_hold_the_scale_and_the_normalised_input():
    model = ln_model()
    _, cache = model.run_with_cache(random_tokens())
    x = cache["resid_pre", 1]
    centred = x - x.mean(-1, keepdim=True)
    scale = torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + model.cfg.eps)
    assert cache["blocks.1.ln1.hook_scale"].shape == (3, N_CTX, 1)
    assert_close(cache["blocks.1.ln1.hook_scale"], scale)
    assert_close(cache["blocks.1.ln1.hook_normalized"], centred / scale)
    ln1 = model.blocks[1].ln1
    expected = F.layer_norm(x, (D_MODEL,), ln1.weight, ln1.bias, eps=model.cfg.eps)
    assert_close(ln1(x), expected)  # TL's formula computes torch's LayerNorm
    assert ln1.w is ln1.weight and ln1.b is ln1.bias
    assert {"blocks.0.ln1.weight", "blocks.0.ln2.bias", "ln_final.weight"} <= set(
        model.state_dict()
    )


def test_apply_ln_helpers_equal_the_cached_normalised_inputs():
    model = ln_model()
    with torch.no_grad():
        _, cache = model.run_with_cache(random_tokens())
        # Components of a layer's input, scaled by its cached LayerNorm scale, add up to the
        # normalised input that LayerNorm saw.
        parts = cache.decompose_resid(layer=1, apply_ln=True)
        assert_close(parts.sum(0), cache["blocks.1.ln1.hook_normalized"])
        parts = cache.decompose_resid(layer=1, mlp_input=True, apply_ln=True)
        assert_close(parts.sum(0), cache["blocks.1.ln2.hook_normalized"])
        heads = cache.stack_head_results(layer=-1, apply_ln=True, incl_remainder=True)
        assert heads.shape == (2 * N_HEADS + 1, 3, N_CTX, D_MODEL)
        assert_close(heads.sum(0), cache["ln_final.hook_normalized"])
        accumulated = cache.accumulated_resid(layer=-1, apply_ln=True)
        assert_close(accumulated[-1], model.ln_final(cache["resid_post", 1]))
        unscaled = cache.decompose_resid(layer=-1, apply_ln=False)
        assert_close(unscaled.sum(0), cache["resid_post", 1])
        answers = random_tokens(seed=9)
        attrs = cache.logit_attrs(unscaled, answers)  # (components, B, T)
        direct = (cache["ln_final.hook_normalized"] * model.W_U.T[answers]).sum(-1)
        assert_close(attrs.sum(0), direct)


def test_transformer_lens_layout_weights():
    model = make_model(n_layers=2, attn_only=False)
    mlp = model.blocks[1].mlp
    assert torch.equal(model.W_in[1], mlp.fc_in.weight.T)
    assert model.W_in.shape == (2, D_MODEL, 4 * D_MODEL)
    assert torch.equal(model.b_in[1], mlp.fc_in.bias)
    assert torch.equal(model.W_out[1], mlp.fc_out.weight.T)
    assert torch.equal(model.b_out[0], model.blocks[0].mlp.fc_out.bias)
    for name in ("b_Q", "b_K", "b_V"):
        assert model.__getattribute__(name).shape == (2, N_HEADS, D_HEAD)
    assert torch.equal(model.b_Q[1], model.blocks[1].attn.b_Q)
    assert torch.equal(model.b_O[1], model.blocks[1].attn.o_proj.bias)
    assert torch.equal(model.W_E_pos, torch.cat([model.embed.weight, model.pos_embed.weight]))
    assert_close(model.QK.AB, model.W_Q @ model.W_K.transpose(-2, -1))
    assert_close(model.OV.AB, model.W_V @ model.W_O)
    assert model.QK.shape == (2, N_HEADS, D_MODEL, D_MODEL)
    assert_close(model.blocks[0].attn.OV.AB, model.OV.AB[0])
    assert model.all_head_labels[:2] == ["L0H0", "L0H1"] and len(model.all_head_labels) == 8
    assert not hasattr(make_model(), "W_in")  # attention-only: no MLP weights


def test_to_tokens_takes_lists_of_strings_and_rejects_ragged_rows():
    model = make_model()
    assert model.to_tokens(["1 2 3", "3 2 1"]).tolist() == [[1, 2, 3], [3, 2, 1]]
    assert model.to_tokens(["1,2", "3 4"]).shape == (2, 2)
    with pytest.raises(
        ValueError,
        match=r"seq is invalid: equal-length sequences, got lengths \[2, 3\].*padding_mask",
    ):
        model.to_tokens(["1 2", "3 4 5"])
    with pytest.raises(ValueError, match=r"equal-length sequences, got lengths"):
        model.to_tokens([[1, 2], [3]])
    assert model.to_single_token("7") == 7
    with pytest.raises(ValueError, match="one token id"):
        model.to_single_token("1 2")


def test_detect_head_takes_a_list_of_prompts():
    model = handbuilt_model(["previous", "uniform", "previous"])
    scores = detect_head(model, ["1 2 3 4 5", "5 4 3 2 1"], "previous_token_head")
    one = detect_head(model, "1 2 3 4 5", "previous_token_head")
    assert_close(scores, one)  # the handbuilt heads do not depend on the tokens
    assert_close(scores[0, 0], torch.tensor(4 / 5))


def test_optional_hook_flags_follow_transformer_lens_rules():
    model = make_model(attn_only=False, normalization_type="LN")
    seen: list[str] = []

    def record(act, hook):
        seen.append(hook.name)

    names = ["blocks.0.hook_q_input", "blocks.0.hook_attn_in", "blocks.0.hook_mlp_in"]
    model.run_with_hooks(random_tokens(), fwd_hooks=[(n, record) for n in names])
    assert seen == []  # they exist (no error) but fire only behind their flags
    model.set_use_attn_in(True)
    model.set_use_hook_mlp_in(True)
    with pytest.raises(
        ValueError, match="use_split_qkv_input=True is invalid: False while use_attn_in is on"
    ):
        model.set_use_split_qkv_input(True)
    logits = model.run_with_hooks(random_tokens(), fwd_hooks=[(n, record) for n in names])
    assert seen == ["blocks.0.hook_attn_in", "blocks.0.hook_mlp_in"]
    model.set_use_attn_in(False)
    model.set_use_hook_mlp_in(False)
    assert_close(logits, model(random_tokens()))
    with pytest.raises(ValueError, match="use_attn_in"):
        ModelConfig(use_attn_in=True, use_split_qkv_input=True)


def test_stop_forward_ends_its_own_forward_and_lets_another_through():
    """A forward that stops early inside another's hooks (a bridge's own _run under a capture
    hook) must not swallow the outer stop: each ``with`` catches only its own instance."""
    model = make_model()
    outer, inner, seen = StopForward(), StopForward(), []

    def stop_at_layer_0(z, hook):
        seen.append(hook.name)
        raise outer

    for _ in range(2):  # an instance is reused chunk after chunk
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", stop_at_layer_0)]), outer:
            with inner:
                model(random_tokens())
            pytest.fail("the inner with caught the outer stop")
        assert outer.__traceback__ is None  # the caught stop keeps no frames (activations)
    assert seen == ["blocks.0.attn.hook_z"] * 2
    assert not model.hook_dict["blocks.0.attn.hook_z"].fwd_hooks  # hooks removed
