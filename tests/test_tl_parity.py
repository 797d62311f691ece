"""Our model against TransformerLens's own: same weights, same values at every shared hook.

The reference is the model TransformerLens 4.x builds from a config, ``TransformerBridge
.boot_native`` (4.x removed ``HookedTransformer``; this is the closest it offers), given our
weights. The hooks to compare are computed from the reference: every hook name it exposes
except the bridge's own wrappers (see :func:`bridge_only`), so a hook TransformerLens has and we
lack, or one whose value differs, fails. Then the ``ActivationCache`` helpers (with ``apply_ln``
both ways), one patching call and one ``detect_head`` call give the same numbers on both.

The native reference cannot turn on ``use_attn_result``, ``use_split_qkv_input`` or
``use_attn_in`` (its attention refuses them), so those hooks are checked against their
definitions and against TransformerLens's own ``ActivationCache.compute_head_results``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close
from transformer_lens.config import TransformerBridgeConfig
from transformer_lens.head_detector import detect_head
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

from mhainterp.config import ModelConfig
from mhainterp.model import HookedMHATransformer

D_MODEL, N_CTX, D_VOCAB, D_VOCAB_OUT = 32, 8, 10, 12
ATOL = 2e-5  # float32 sums of a few hundred terms

# (n_layers, n_heads, causal, attn_only, normalization_type, act_fn)
CONFIGS = [
    (1, 1, True, True, None, "relu"),
    (2, 4, False, False, "LN", "relu"),
    (1, 8, True, False, "LN", "gelu"),
    (2, 16, False, True, "LN", "relu"),
    (2, 4, True, False, None, "gelu"),
    (1, 8, False, True, None, "relu"),
]
IDS = [
    f"L{n}_h{h}_{'causal' if c else 'bidir'}_{'attn' if a else 'mlp'}_{ln or 'noLN'}_{act}"
    for n, h, c, a, ln, act in CONFIGS
]


def ours(n_layers, n_heads, causal, attn_only, normalization_type, act_fn, **flags):
    cfg = ModelConfig(
        d_model=D_MODEL, n_heads=n_heads, n_layers=n_layers, n_ctx=N_CTX, d_vocab=D_VOCAB,
        d_vocab_out=D_VOCAB_OUT, causal=causal, attn_only=attn_only,
        normalization_type=normalization_type, act_fn=act_fn, device="cpu", seed=3, **flags,
    )  # fmt: skip
    model = HookedMHATransformer(cfg).eval()
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():  # LayerNorms start at 1 / 0; random values test them properly
        for name, param in model.named_parameters():
            if "ln" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3 + (
                    1.0 if name.endswith("weight") else 0.0
                ))  # fmt: skip
    return model


def reference(model: HookedMHATransformer) -> TransformerBridge:
    """TransformerLens 4.x's native model with ``model``'s weights (and a biased unembed)."""
    cfg = model.cfg
    bridge = TransformerBridge.boot_native(
        TransformerBridgeConfig(
            d_model=cfg.d_model, d_head=cfg.d_head, n_layers=cfg.n_layers, n_ctx=cfg.n_ctx,
            n_heads=cfg.n_heads, d_vocab=cfg.d_vocab, d_vocab_out=cfg.d_vocab_out,
            d_mlp=cfg.d_mlp, act_fn=cfg.act_fn, eps=cfg.eps, attn_only=cfg.attn_only,
            normalization_type=cfg.normalization_type, seed=0,
            attention_dir="causal" if cfg.causal else "bidirectional",
        )
    )  # fmt: skip
    bridge.eval()
    unembed = bridge.unembed.original_component
    unembed.bias = nn.Parameter(torch.zeros(cfg.d_vocab_out))  # boot_native's has no b_U
    pairs = [
        (bridge.embed, model.embed), (bridge.pos_embed, model.pos_embed),
        (bridge.unembed, model.unembed),
    ]  # fmt: skip
    if cfg.normalization_type:
        pairs.append((bridge.ln_final, model.ln_final))
    for theirs, mine in zip(bridge.blocks, model.blocks):
        attn = theirs.attn
        pairs += [(attn.q, mine.attn.q_proj), (attn.k, mine.attn.k_proj)]
        pairs += [(attn.v, mine.attn.v_proj), (attn.o, mine.attn.o_proj)]
        if cfg.normalization_type:
            pairs.append((theirs.ln1, mine.ln1))
        if not cfg.attn_only:
            pairs += [(getattr(theirs.mlp, "in"), mine.mlp.fc_in)]
            pairs += [(theirs.mlp.out, mine.mlp.fc_out)]
            if cfg.normalization_type:
                pairs.append((theirs.ln2, mine.ln2))
    with torch.no_grad():
        for theirs, mine in pairs:
            target = theirs.original_component
            for name, value in mine.named_parameters(recurse=False):
                getattr(target, name).copy_(value)
    # The bridge has no tokenizer; token ids are read as ours reads them (not under test).
    bridge.to_tokens = lambda seq, **kwargs: model.to_tokens(seq)
    return bridge


def bridge_only(name: str) -> bool:
    """Hooks of the reference that are the bridge's machinery, not TransformerLens's API.

    Every bridge component is wrapped in ``<component>.hook_in`` / ``.hook_out`` (``embed``,
    ``blocks.0.attn.q``, ``blocks.0.mlp.in``, ...); TransformerLens's names for the same values
    are the aliases (``hook_embed``, ``hook_q``, ``hook_pre``, ...), which are compared. The
    unembedding's ``unembed.hook_in`` / ``hook_out`` are TransformerLens's unembed hooks and
    are kept. The per-head inputs also exist on ``attn``; TransformerLens names them on the
    block (``blocks.0.hook_q_input``), as the bridge's aliases do. ``hook_hidden_states`` is
    the bridge's view of the attention's raw output.
    """
    if name.startswith("unembed."):
        return False
    if name.rsplit(".", 1)[-1] in ("hook_in", "hook_out"):
        return True
    per_head = r"blocks\.\d+\.attn\.hook_(attn_in|q_input|k_input|v_input|hidden_states)"
    return re.fullmatch(per_head, name) is not None


def tl_hook_names(bridge: TransformerBridge) -> set[str]:
    return {name for name in bridge.hook_dict if not bridge_only(name)}


def tokens(batch: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, D_VOCAB, (batch, N_CTX), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = torch.isfinite(a) & torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), torch.isfinite(b)), "masked (-inf) entries differ"
    return float((a - b)[finite].abs().max()) if bool(finite.any()) else 0.0


# ----- the hooks --------------------------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_every_transformer_lens_hook_exists_and_has_the_reference_value(config):
    model = ours(*config)
    bridge = reference(model)
    names = tl_hook_names(bridge)
    missing = sorted(names - set(model.hook_dict))
    assert not missing, f"hooks TransformerLens has and we lack: {missing}"
    x = tokens()
    with torch.no_grad():
        logits, cache = model.run_with_cache(x)
        ref_logits, ref_cache = bridge.run_with_cache(x)
    fired = names & set(ref_cache.keys())
    assert fired == names & set(cache.keys()), "different hooks fire without flags"
    assert "blocks.0.attn.hook_pattern" in fired and "unembed.hook_out" in fired
    if config[4] == "LN":
        assert {"blocks.0.ln1.hook_scale", "ln_final.hook_normalized"} <= fired
    for name in sorted(fired):
        assert cache[name].shape == ref_cache[name].shape, name
        if name.endswith("hook_attn_scores"):
            # TL 4.3's native bridge fires its softmaxed weights here (its attention returns no
            # scores); ours are TL's pre-softmax scores (-inf where masked), which softmax to
            # the same values (README, "Coming from TransformerLens").
            assert max_diff(cache[name].softmax(-1), ref_cache[name]) < ATOL, name
            continue
        assert max_diff(cache[name], ref_cache[name]) < ATOL, name
    assert max_diff(logits, ref_logits) < ATOL


@pytest.mark.parametrize("config", CONFIGS[1:3], ids=IDS[1:3])
def test_hook_mlp_in_follows_the_flag_as_in_the_reference(config):
    model = ours(*config, use_hook_mlp_in=True)
    bridge = reference(model)
    bridge.set_use_hook_mlp_in(True)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
        _, ref_cache = bridge.run_with_cache(tokens())
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.hook_mlp_in"
        assert max_diff(cache[name], ref_cache[name]) < ATOL
        assert_close(cache[name], cache["resid_mid", layer])


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_hook_result_equals_transformer_lens_compute_head_results(config):
    model = ours(*config, use_attn_result=True)
    bridge = reference(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
        _, ref_cache = bridge.run_with_cache(tokens())
        ref_cache.compute_head_results()  # TransformerLens's definition: z @ W_O per head
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.attn.hook_result"
        assert cache[name].shape == (5, N_CTX, model.cfg.n_heads, D_MODEL)
        assert max_diff(cache[name], ref_cache[name]) < ATOL


@pytest.mark.parametrize("flag", ["use_split_qkv_input", "use_attn_in"])
@pytest.mark.parametrize("config", CONFIGS[1:4], ids=IDS[1:4])
def test_per_head_input_hooks_hold_the_repeated_residual_and_change_nothing(config, flag):
    model = ours(*config, **{flag: True})
    bridge = reference(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
        _, ref_cache = bridge.run_with_cache(tokens())
    h = model.cfg.n_heads
    inputs = ["q_input", "k_input", "v_input"] if flag == "use_split_qkv_input" else ["attn_in"]
    for layer in range(model.cfg.n_layers):
        for kind in inputs:
            value = cache[f"blocks.{layer}.hook_{kind}"]  # (B, T, h, d_model)
            assert torch.equal(value, cache["resid_pre", layer][:, :, None].expand(-1, -1, h, -1))
    for name in tl_hook_names(bridge) & set(ref_cache.keys()):  # every other value unchanged
        if not name.endswith("hook_attn_scores"):  # (see the test above)
            assert max_diff(cache[name], ref_cache[name]) < ATOL, name


def test_patching_one_heads_query_input_moves_only_that_heads_query():
    model = ours(*CONFIGS[1], use_split_qkv_input=True)
    x = tokens()
    with torch.no_grad():
        _, clean = model.run_with_cache(x)

        def shift_head_2(value, hook):
            value[:, :, 2] += 1.0
            return value

        with model.hooks(fwd_hooks=[("blocks.0.hook_q_input", shift_head_2)]):
            _, edited = model.run_with_cache(x)
    assert not torch.allclose(edited["q", 0][:, :, 2], clean["q", 0][:, :, 2])
    for head in (0, 1, 3):
        assert_close(edited["q", 0][:, :, head], clean["q", 0][:, :, head])
    assert_close(edited["k", 0], clean["k", 0])
    assert_close(edited["v", 0], clean["v", 0])


# ----- ActivationCache helpers, patching, head detection ----------------------------------------
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_activation_cache_helpers_match_the_reference_with_apply_ln_both_ways(config):
    model = ours(*config)
    bridge = reference(model)
    x = tokens()
    answers = torch.randint(0, D_VOCAB_OUT, x.shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        _, ref_cache = bridge.run_with_cache(x)
        L = model.cfg.n_layers
        for apply_ln in (False, True):
            for layer in sorted({0, L - 1, L}) if L > 1 else [0, 1]:
                for mlp_input in (
                    (False, True) if not model.cfg.attn_only and layer < L else (False,)
                ):
                    kwargs = dict(layer=layer, apply_ln=apply_ln, mlp_input=mlp_input)
                    for fn in ("decompose_resid", "accumulated_resid"):
                        a = getattr(cache, fn)(**kwargs, return_labels=True)
                        b = getattr(ref_cache, fn)(**kwargs, return_labels=True)
                        assert a[1] == b[1], (fn, kwargs)
                        assert max_diff(a[0], b[0]) < ATOL, (fn, kwargs)
            stack, labels = cache.stack_head_results(apply_ln=apply_ln, return_labels=True)
            ref_stack, ref_labels = ref_cache.stack_head_results(
                apply_ln=apply_ln, return_labels=True
            )
            assert labels == ref_labels == model.all_head_labels
            assert max_diff(stack, ref_stack) < ATOL
            resid = cache.decompose_resid(apply_ln=False)
            attrs = cache.logit_attrs(resid, answers)
            assert max_diff(attrs, ref_cache.logit_attrs(resid, answers)) < ATOL
    # The attributions add up to the answer's logit without b_U (no LN, or LN via its scale).
    final = cache["ln_final.hook_normalized"] if config[4] else cache["resid_post", L - 1]
    direct = (final * model.W_U.T[answers]).sum(-1)
    assert_close(attrs.sum(0), direct, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize(
    "config", [CONFIGS[1], CONFIGS[3], CONFIGS[5]], ids=[IDS[1], IDS[3], IDS[5]]
)
def test_patching_and_detect_head_give_the_reference_numbers(config):
    model = ours(*config)
    bridge = reference(model)
    clean, corrupted = tokens(seed=1), tokens(seed=2)
    answers = clean.roll(1, dims=1)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits.log_softmax(-1).gather(-1, answers[..., None]).mean()

    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean)
        _, ref_clean_cache = bridge.run_with_cache(clean)
        patched = get_act_patch_attn_head_out_all_pos(model, corrupted, clean_cache, metric)
        ref_patched = get_act_patch_attn_head_out_all_pos(
            bridge, corrupted, ref_clean_cache, metric
        )
    assert patched.shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert max_diff(patched, ref_patched) < ATOL
    assert float(patched.std()) > 0  # the heads differ: the comparison has something to compare
    seqs = ["1 2 3 1 2 3", "6 5 4 6 5 4"]
    for pattern in ("previous_token_head", "duplicate_token_head"):
        scores = detect_head(model, seqs, pattern)
        assert max_diff(scores, detect_head(bridge, seqs, pattern)) < ATOL
        # A list is the mean of its sequences' scores.
        one_by_one = torch.stack([detect_head(model, s, pattern) for s in seqs]).mean(0)
        assert_close(scores, one_by_one)


def test_the_readme_patching_example_runs_and_gives_its_numbers():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("Patching one of our models with TransformerLens's own function:")[1]
    code = section.split("```python\n")[1].split("```")[0]
    *body, last = code.strip().splitlines()
    namespace: dict = {}
    exec("\n".join(body), namespace)  # the README's own example
    result = eval(last.split("#")[0], namespace)
    assert_close(result, torch.tensor([[11.5875, 4.4250, 11.5875]]), atol=1e-4, rtol=0)
