"""The explorer on pretrained models and real text: tiny random Llama / BERT folders built from a
``transformers`` config (no download), compared with direct ``hook_z`` edits."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local; never wait on the Hub

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_real_heads import SENTENCES, tiny_bert_folder, tiny_llama_folder  # noqa: E402

from mhainterp import cli  # noqa: E402
from mhainterp.ablation import METHODS  # noqa: E402
from mhainterp.attribution import attribution_patching  # noqa: E402
from mhainterp.explore import BadRequestError, Explorer, ExploreSession  # noqa: E402
from mhainterp.explore import session as session_module  # noqa: E402
from mhainterp.explore.text import position_bucket_names  # noqa: E402
from mhainterp.model.handbuilt import handbuilt_model  # noqa: E402
from mhainterp.pretrained import load_pretrained  # noqa: E402
from mhainterp.scoring import embedding_damage, pooled_output  # noqa: E402
from mhainterp.tasks import get_task  # noqa: E402
from mhainterp.tasks.text import TOKEN_CLASSES, text_batch  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    model = load_pretrained(tiny_llama_folder(tmp_path_factory.mktemp("llama")))
    return model, text_batch(model, SENTENCES)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    model = load_pretrained(tiny_bert_folder(tmp_path_factory.mktemp("bert")))
    return model, text_batch(model, SENTENCES)


def _zeroing(model, heads):
    """Forward hooks that zero ``heads`` (``{layer: [head, ...]}``) at ``hook_z``."""

    def edit(z, hook, layer):
        z = z.clone()
        z[:, :, heads[layer]] = 0.0
        return z

    return [
        (f"blocks.{layer}.attn.hook_z", lambda z, hook, layer=layer: edit(z, hook, layer))
        for layer in heads
    ]


def _next_token_logprobs(model, batch, hooks=()):
    """``log p(actual next token)`` at every position ``[n, T]`` with ``hooks`` in place."""
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        logits = model.logits(batch.tokens, batch.padding_mask)
    index = batch.targets.clamp(min=0)[..., None]
    return logits.float().log_softmax(-1).gather(-1, index)[..., 0]


# ----------------------------------------------------------------------------- session


def test_a_click_changes_each_tokens_log_prob_as_a_direct_hook_z_ablation(llama):
    """Zeroing L0H1 and L1H2 through the session moves each next token's log-probability by
    what zeroing them directly at hook_z does; the loss is the mean cross-entropy."""
    model, batch = llama
    session = ExploreSession(model, batch)
    session.toggle("L0H1,L1H2")
    clean = _next_token_logprobs(model, batch)
    ablated = _next_token_logprobs(model, batch, _zeroing(model, {0: [1], 1: [2]}))
    expected = ablated - clean  # (n, T)
    for index in range(len(batch)):
        shown = session.example(index)["text"]["delta_logprob"]
        for t, scored in enumerate(batch.mask[index].tolist()):
            if scored:
                assert shown[t] == pytest.approx(float(expected[index, t]), abs=6e-5)
            else:
                assert shown[t] is None
    loss = session.metrics()["overall"]["loss"]
    assert loss["ablated"] == pytest.approx(float(-ablated[batch.mask].mean()), abs=1e-5)
    assert loss["clean"] == pytest.approx(float(-clean[batch.mask].mean()), abs=1e-5)
    assert loss["ablated"] != pytest.approx(loss["clean"], abs=1e-4)


def test_restoring_the_heads_gives_zero_change_exactly(llama):
    model, batch = llama
    session = ExploreSession(model, batch)
    session.toggle("L1H0")
    assert any(d for d in session.example(0)["text"]["delta_logprob"] if d is not None)
    session.toggle("L1H0")
    for index in range(len(batch)):
        assert {d for d in session.example(index)["text"]["delta_logprob"] if d is not None} == {
            0.0
        }
    overall = session.metrics()["overall"]
    assert overall["loss"]["ablated"] == overall["loss"]["clean"]
    assert overall["accuracy"]["ablated"] == overall["accuracy"]["clean"]


def test_the_example_shows_the_tokenizers_strings_and_predictions(llama):
    model, batch = llama
    text = ExploreSession(model, batch).example(3)["text"]
    ids = batch.tokens[3].tolist()
    assert text["tokens"] == [f"w{i}" for i in ids]  # the word vocabulary: id i is "w{i}"
    assert text["tokens"][0] == "w0"  # BOS
    clean = _next_token_logprobs(model, batch)
    last = int(batch.padding_mask[3].sum()) - 1
    assert text["clean_logprob"][0] == pytest.approx(float(clean[3, 0]), abs=6e-5)
    assert text["clean_logprob"][last] is None  # the last real token: nothing to predict
    with torch.no_grad():
        top = model.logits(batch.tokens, batch.padding_mask)[3].argmax(-1).tolist()
    assert text["clean_predictions"][:3] == [f"w{i}" for i in top[:3]]


def test_metrics_group_by_the_text_axes(llama):
    """Position buckets of sentence 0 (7 tokens with BOS, 6 scored): 0 | 1-3 | 4-7."""
    model, batch = llama
    session = ExploreSession(model, batch)
    assert session.axes == ("token_class", "position", "target_frequency")
    by = session.metrics()["by"]
    n_scored = int(batch.mask.sum())
    for axis in session.axes:
        assert sum(row["n"] for row in by[axis]) == n_scored
    positions = {row["key"]: row["n"] for row in by["position"]}
    assert set(positions) <= set(position_bucket_names())
    assert positions["0"] == len(SENTENCES)  # every sentence predicts from its BOS
    assert {row["key"] for row in by["token_class"]} <= set(TOKEN_CLASSES)


def test_thumbnail_numbers_are_the_attribution_estimates(llama):
    """A next-token model's per-head numbers are attribution_patching's, per method."""
    model, batch = llama
    explorer = Explorer.from_model(model, batch)
    state = explorer.state()
    assert state["importance"] == {"source": "attribution", "quantity": "loss"}
    assert state["objective"] == "next_token"
    table = attribution_patching(model, batch, METHODS)
    for method in METHODS:
        shown = explorer.handle("method", {"method": method})["importance"]
        expected = table[table["method"] == method].set_index("head_label")["attribution"]
        assert set(shown) == set(model.head_labels)
        for label, value in shown.items():
            assert value == pytest.approx(float(expected[label]), rel=1e-5, abs=1e-7)


def test_attribution_at_load_is_one_pass_for_zero_and_mean_and_resample_when_shown(
    llama, monkeypatch
):
    """The start estimated resample too (a donor forward and the replacement path: 13 of
    SmolLM2's 23 s); zero and mean come from one forward + backward, resample when asked."""
    model, batch = llama
    asked = []
    real = session_module.attribution_patching

    def recording(m, b, methods, **options):
        asked.append(methods)
        return real(m, b, methods, **options)

    monkeypatch.setattr(session_module, "attribution_patching", recording)
    explorer = Explorer.from_model(model, batch, n_eval=len(batch))
    explorer.handle("state")
    explorer.handle("method", {"method": "mean"})
    assert asked == [("zero", "mean")]
    explorer.handle("method", {"method": "resample"})
    assert asked == [("zero", "mean"), ("resample",)]


def test_estimates_show_their_agreement_with_exact_ablation(llama):
    """Each head's Δloss≈ is an estimate; the page shows how far it can be trusted: heads
    ablated alone (a click, or the verification plan a few heads per 'verify') carry their
    exact value, and the agreement over them is verify_attribution's, step by step."""
    from mhainterp.ablation import evaluate_head_sets
    from mhainterp.attribution import attribution_agreement, verify_attribution

    model, batch = llama
    explorer = Explorer.from_model(model, batch, n_eval=len(batch))
    check = explorer.handle("state")["view"]["estimate_check"]
    assert check == {
        "exact": {},
        "n_checked": 0,
        "n_planned": 8,
        "spearman": None,
        "max_abs_error": None,
        "done": False,
    }  # 8 heads: top 8 + no others
    view = explorer.handle("toggle", {"head": "L1H2"})  # one head alone: exact, shown so
    clean, alone = evaluate_head_sets(
        model, batch, [[], ["L1H2"]], "zero", reference=batch
    ).metrics()
    assert view["estimate_check"]["exact"] == {
        "L1H2": pytest.approx(alone["loss"] - clean["loss"], abs=1e-6)
    }
    assert view["estimate_check"]["spearman"] is None  # below 3 heads: not defined
    explorer.handle("reset")
    steps = 0
    while not (check := explorer.handle("verify")["estimate_check"])["done"]:
        steps += 1
    assert steps == 3  # 7 heads left, 2 per step: 4 calls, the last one done
    estimates = attribution_patching(model, batch, ("zero", "mean"))
    verified = verify_attribution(model, batch, estimates, "zero", top_k=8, n_random=8)
    expected = attribution_agreement(verified).iloc[0]
    assert check["n_checked"] == check["n_planned"] == 8
    assert check["spearman"] == pytest.approx(expected["spearman"], abs=1e-4)
    assert check["max_abs_error"] == pytest.approx(expected["max_abs_error"], abs=1e-5)
    assert check["exact"] == pytest.approx(
        dict(zip(verified["head_label"], verified["exact"])), abs=1e-5
    )
    assert explorer.handle("verify")["estimate_check"] == check  # done: nothing more to ablate
    # our own models' importance is exact: nothing to check
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    own = Explorer.from_model(handbuilt_model(["previous", "uniform", "previous"]), task, n_eval=8)
    assert own.view()["estimate_check"] is None


def test_exact_importance_on_request_is_the_single_head_loss_change(llama):
    model, batch = llama
    session = ExploreSession(model, batch, importance="exact")
    assert session.importance_quantity == "loss"
    expected = session.evaluate(["L1H3"])["delta_loss"]
    assert session.importance()["L1H3"] == expected


def test_a_large_models_attention_comes_one_query_at_a_time(llama, monkeypatch):
    model, batch = llama
    monkeypatch.setattr(session_module, "INLINE_ATTENTION_HEADS", 4)  # 8 heads: "large"
    explorer = Explorer.from_model(model, batch)
    view = explorer.handle("toggle", {"head": "L0H0"})
    assert view["example"]["attention"] is None
    answer = explorer.handle("attention", {"query": 2})
    patterns = explorer.session.patterns(0)  # (L, h, T, T), L0H0 ablated
    assert answer["query"] == 2 and set(answer["attention"]) == set(model.head_labels)
    for layer in range(2):
        for head in range(4):
            row = answer["attention"][f"L{layer}H{head}"]
            assert row == pytest.approx(patterns[layer, head, 2].tolist(), abs=6e-4)
    with pytest.raises(ValueError, match="query=99"):
        explorer.handle("attention", {"query": 99})


def test_an_encoder_is_scored_by_its_embedding_damage(bert):
    """MiniLM-style: zeroing L1H2 costs each sentence 1 - cos of its pooled output, as a
    direct hook_z edit computes; accuracy and the frequency axis are not shown."""
    model, batch = bert
    explorer = Explorer.from_model(model, batch)
    state = explorer.state()
    assert state["objective"] == "embedding" and state["metric"]["accuracy"] is False
    assert state["importance"] == {"source": "exact", "quantity": "loss"}
    assert [axis["key"] for axis in state["axes"]] == ["token_class", "position"]
    with torch.no_grad():
        clean = pooled_output(model.logits(batch.tokens, batch.padding_mask), batch.padding_mask)
        with model.hooks(fwd_hooks=_zeroing(model, {1: [2]})):
            hidden = model.logits(batch.tokens, batch.padding_mask)
    damage = embedding_damage(clean, hidden, batch.padding_mask)  # (n,)
    view = explorer.handle("toggle", {"head": "L1H2"})
    assert view["example"]["text"]["damage"] == pytest.approx(float(damage[0]), abs=1e-5)
    lengths = batch.mask.sum(-1).double()
    expected = float((damage.double() * lengths).sum() / lengths.sum())  # per scored token
    assert view["metrics"]["overall"]["loss"]["ablated"] == pytest.approx(expected, abs=1e-5)
    assert view["metrics"]["overall"]["loss"]["clean"] == pytest.approx(0.0, abs=1e-6)
    assert view["importance"]["L1H2"] == pytest.approx(expected - 0.0, abs=1e-5)


# ----------------------------------------------------------------------------- server, CLI


def test_server_state_and_toggle_on_a_bridged_model(llama):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    import http.client

    from mhainterp.explore.server import ServerThread, build_app

    model, batch = llama
    explorer = Explorer.from_model(model, batch, name="tiny-llama", task="eight sentences")

    def request(method, path, body=None):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request(method, path, body=body, headers={})
        response = connection.getresponse()
        return response.status, json.loads(response.read())

    with ServerThread(build_app(explorer)) as server:
        status, state = request("GET", "/api/state")
        assert status == 200 and state["run"] == "tiny-llama" and state["task"] == "eight sentences"
        assert state["note"].endswith(" · weights: stored float32")
        ids = batch.tokens[0].tolist()
        assert state["view"]["example"]["text"]["tokens"] == [f"w{i}" for i in ids]
        status, view = request("POST", "/api/toggle", json.dumps({"head": "L1H2"}))
        assert status == 200 and view["ablated"] == ["L1H2"]
        direct = explorer.session.example(0)["text"]["delta_logprob"]
        assert view["example"]["text"]["delta_logprob"] == direct
        status, error = request("POST", "/api/attention", json.dumps({"query": "x"}))
        assert status == 400 and "query='x'" in error["error"]


@pytest.fixture
def explore_command(monkeypatch):
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("mhainterp.cli.explore",))


def test_cli_refuses_a_verdict_folder_beside_a_run_folder(explore_command, tmp_path, capsys):
    assert cli.main(["explore", str(tmp_path), "--verdict", str(tmp_path), "--no-browser"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "given with --model only" in err[0]


def test_cli_refuses_a_model_and_a_run_folder_together(explore_command, tmp_path, capsys):
    assert cli.main(["explore", str(tmp_path), "--model", "smollm2", "--no-browser"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--model='smollm2' is invalid: a pretrained model or a run folder" in err[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "no/such/folder"], "--model='no/such/folder' is invalid: one of smollm2"),
        (["--model", "smollm2", "--text", "missing.txt"], "--text='missing.txt' is invalid"),
        (["--model", "smollm2", "--verdict", "no/such"], "--verdict='no/such' is invalid"),
        ([], "RUN_OR_SWEEP=None is invalid: a run or sweep folder, or --model"),
    ],
)
def test_cli_bad_model_or_text_is_one_line(explore_command, capsys, argv, message):
    assert cli.main(["explore", *argv, "--no-browser"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_cli_model_explores_16_sentences_unless_n_eval_is_typed():
    from mhainterp.cli.explore import sentences_wanted
    from mhainterp.config import DEFAULT_N_EVAL

    parser = cli.build_parser()
    plain = parser.parse_args(["explore", "--model", "smollm2"])
    typed = parser.parse_args(["explore", "--model", "smollm2", "--n-eval", str(DEFAULT_N_EVAL)])
    assert plain.n_eval == DEFAULT_N_EVAL  # the toolkit's one default, for a run folder
    assert sentences_wanted(plain) == 16
    assert sentences_wanted(typed) == DEFAULT_N_EVAL


def test_notebook_widget_of_a_pretrained_model_on_a_text_file(llama, tmp_path):
    pytest.importorskip("anywidget")
    from mhainterp import explore

    model, batch = llama
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES[:3]) + "\n")
    widget = explore(model, text, n_eval=2)
    state = widget.explorer.state()
    assert state["n_eval"] == 2 and state["task"] == "sentences.txt"
    first = text_batch(model, SENTENCES[:2]).tokens[0].tolist()
    assert state["view"]["example"]["text"]["tokens"] == [f"w{i}" for i in first]
    assert explore(model, batch).explorer.state()["n_eval"] == len(SENTENCES)


# ----------------------------------------------------------------------------- a click at once


@pytest.fixture
def counted_forwards(monkeypatch):
    """Every engine pass of the Ablator (the exact work of a click), recorded; set
    ``gate`` to hold each pass until it is released (a deliberately slow exact path)."""
    import threading

    from mhainterp.ablation import interactive

    original = interactive.run_masks
    record = {"started": [], "finished": [], "gate": None, "waiting": threading.Event()}

    def run_masks(model, batch, masks, *args, **kwargs):
        record["started"].append(masks.clone())
        if record["gate"] is not None:
            record["waiting"].set()
            assert record["gate"].wait(30)
        result = original(model, batch, masks, *args, **kwargs)
        record["finished"].append(masks.clone())
        return result

    monkeypatch.setattr(interactive, "run_masks", run_masks)
    return record


def test_a_click_answers_with_its_estimate_before_any_forward_then_the_exact_view(
    llama, counted_forwards
):
    """toggle {estimate: true} answers from the attribution computed at load (no forward),
    labelled as an estimate; 'exact' {job} then runs the forward and answers the view the
    plain (synchronous) toggle answers."""
    model, batch = llama
    explorer = Explorer.from_model(model, batch, n_eval=len(batch))
    reference = Explorer.from_model(model, batch, n_eval=len(batch))
    estimates = explorer.session.importance("zero")
    counted_forwards["started"].clear()
    counted_forwards["finished"].clear()
    answer = explorer.handle("toggle", {"head": "L1H2", "estimate": True})
    assert counted_forwards["started"] == []  # answered before any exact work
    assert set(answer) == {"method", "ablated", "estimate", "job"}
    assert answer["ablated"] == ["L1H2"] and answer["estimate"]["source"] == "attribution"
    clean = reference.view()["metrics"]["overall"]["loss"]["clean"]
    assert answer["estimate"]["delta_loss"] == pytest.approx(estimates["L1H2"])
    assert answer["estimate"]["loss"] == pytest.approx(
        {"clean": clean, "ablated": clean + estimates["L1H2"]}
    )
    exact = explorer.handle("exact", {"job": answer["job"]})
    assert len(counted_forwards["started"]) == 1  # the one forward, now
    plain = reference.handle("toggle", {"head": "L1H2"})
    assert exact["metrics"] == plain["metrics"] and exact["job"] == answer["job"]
    assert exact["example"] == plain["example"] and "estimate" not in exact
    # a set: first order, so the sum of its heads' estimates
    two = explorer.handle("toggle", {"head": "L0H1", "estimate": True})["estimate"]
    assert two["delta_loss"] == pytest.approx(estimates["L1H2"] + estimates["L0H1"])
    # our own models' numbers are exact: a click answers the exact view, as before
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    own = Explorer.from_model(handbuilt_model(["previous", "uniform", "previous"]), task, n_eval=8)
    assert "metrics" in own.handle("toggle", {"head": "L0H0", "estimate": True})


def test_a_newer_click_skips_the_older_clicks_exact_work_before_its_forward(
    llama, counted_forwards
):
    model, batch = llama
    explorer = Explorer.from_model(model, batch, n_eval=len(batch))
    counted_forwards["started"].clear()
    counted_forwards["finished"].clear()
    first = explorer.handle("toggle", {"head": "L1H2", "estimate": True})["job"]
    second = explorer.handle("toggle", {"head": "L0H1", "estimate": True})["job"]
    assert explorer.handle("exact", {"job": first}) == {"job": first, "cancelled": True}
    assert counted_forwards["started"] == []  # the stale job never reached its forward
    view = explorer.handle("exact", {"job": second})
    assert view["ablated"] == ["L0H1", "L1H2"] and len(counted_forwards["started"]) == 1
    # a refused click cancels nothing: the current job stays answerable
    with pytest.raises(BadRequestError):
        explorer.handle("toggle", {"head": "L9H9", "estimate": True})
    assert "metrics" in explorer.handle("exact", {"job": second})


def test_a_newer_click_stops_the_running_exact_work_at_its_next_layer(llama, counted_forwards):
    """The older click's forward is running (held at its start by the slowed path) when the
    newer click comes: the newer click's request cancels it before waiting its turn, the
    forward stops at its first layer check (it never finishes, nothing is cached for it),
    and the newer click gets its estimate, then its exact view, the plain toggle's."""
    import threading

    model, batch = llama
    explorer = Explorer.from_model(model, batch, n_eval=len(batch))
    reference = Explorer.from_model(model, batch, n_eval=len(batch))
    first = explorer.handle("toggle", {"head": "L1H2", "estimate": True})["job"]
    counted_forwards["started"].clear()
    counted_forwards["finished"].clear()
    counted_forwards["gate"] = gate = threading.Event()
    answers = {}
    older = threading.Thread(
        target=lambda: answers.update(old=explorer.handle("exact", {"job": first}))
    )
    older.start()
    assert counted_forwards["waiting"].wait(30)  # the older click's forward has begun
    newer = threading.Thread(
        target=lambda: answers.update(
            new=explorer.handle("toggle", {"head": "L0H1", "estimate": True})
        )
    )
    newer.start()
    while explorer._jobs.current == first:  # the newer click has cancelled the older job
        newer.join(0.01)
    gate.set()  # let the older forward go on: it must stop at its first layer
    older.join(30)
    newer.join(30)
    assert answers["old"] == {"job": first, "cancelled": True}
    assert len(counted_forwards["started"]) == 1 and counted_forwards["finished"] == []
    assert not explorer.session._cached(
        explorer.session._config(["L1H2"], "zero"), per_position=True
    )
    counted_forwards["gate"] = None
    view = explorer.handle("exact", {"job": answers["new"]["job"]})
    reference.handle("toggle", {"head": "L1H2"})
    assert view["metrics"] == reference.handle("toggle", {"head": "L0H1"})["metrics"]


def test_a_click_stops_the_idle_check_of_the_estimates(llama, counted_forwards):
    """'verify' (the page's idle work) is stopped by a click as a stale job is: the click
    need not wait for its forward."""
    import threading

    model, batch = llama
    explorer = Explorer.from_model(model, batch, n_eval=len(batch))
    counted_forwards["finished"].clear()
    counted_forwards["gate"] = gate = threading.Event()
    answers = {}
    verify = threading.Thread(target=lambda: answers.update(verify=explorer.handle("verify")))
    verify.start()
    assert counted_forwards["waiting"].wait(30)
    click = threading.Thread(
        target=lambda: answers.update(
            click=explorer.handle("toggle", {"head": "L0H1", "estimate": True})
        )
    )
    click.start()
    while explorer._jobs.current == 0:
        click.join(0.01)
    gate.set()
    verify.join(30)
    click.join(30)
    assert answers["verify"] == {"cancelled": True} and counted_forwards["finished"] == []
    assert answers["click"]["ablated"] == ["L0H1"]
    counted_forwards["gate"] = None
    check = explorer.handle("verify")["estimate_check"]  # goes on later: 2 heads, and the
    assert check["n_checked"] == 3 and "L0H1" in check["exact"]  # one ablated alone now


def test_over_http_a_click_stops_the_older_clicks_exact_forward(llama, counted_forwards):
    """The server answers 'exact' from a worker thread: the newer click's request is read
    while the older forward runs, cancels it, and is answered once it has stopped."""
    pytest.importorskip("uvicorn")
    import http.client
    import threading

    from mhainterp.explore.server import ServerThread, build_app

    model, batch = llama
    explorer = Explorer.from_model(model, batch, n_eval=len(batch))

    def post(action, body):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("POST", f"/api/{action}", body=json.dumps(body))
        return json.loads(connection.getresponse().read())

    answers = {}
    with ServerThread(build_app(explorer)) as server:
        first = post("toggle", {"head": "L1H2", "estimate": True})["job"]
        counted_forwards["finished"].clear()
        counted_forwards["gate"] = gate = threading.Event()
        older = threading.Thread(target=lambda: answers.update(old=post("exact", {"job": first})))
        older.start()
        assert counted_forwards["waiting"].wait(30)
        newer = threading.Thread(
            target=lambda: answers.update(new=post("toggle", {"head": "L0H1", "estimate": True}))
        )
        newer.start()
        while explorer._jobs.current == first:
            newer.join(0.01)
        gate.set()
        older.join(60)
        newer.join(60)
        counted_forwards["gate"] = None
        view = post("exact", {"job": answers["new"]["job"]})
    assert answers["old"] == {"job": first, "cancelled": True}
    assert answers["new"]["estimate"]["source"] == "attribution"
    assert len(counted_forwards["finished"]) == 1  # the newer click's forward alone
    assert view["ablated"] == ["L0H1", "L1H2"] and "metrics" in view


def test_the_widget_answers_a_clicks_exact_view_from_a_thread(llama):
    pytest.importorskip("anywidget")
    from mhainterp.explore.widget import ExplorerWidget

    model, batch = llama
    widget = ExplorerWidget(Explorer.from_model(model, batch, n_eval=len(batch)))
    sent = []
    widget.send = sent.append
    widget._on_message(
        widget, {"id": 1, "action": "toggle", "body": {"head": "L1H2", "estimate": True}}, []
    )
    job = sent[0]["body"]["job"]
    widget._on_message(widget, {"id": 2, "action": "exact", "body": {"job": job}}, [])
    for _ in range(3000):
        if len(sent) == 2:
            break
        threading_sleep(0.01)
    assert sent[1]["id"] == 2 and sent[1]["body"]["ablated"] == ["L1H2"]
    assert sent[1]["body"]["metrics"] == widget.explorer.view()["metrics"]


def threading_sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


# ----------------------------------------------------------------------------- findings


def _verdict_folder(folder, model, heads, division=None):
    """A pretrained verdict folder as ``specialize_pretrained`` writes it (the files the
    explorer reads)."""
    import pandas as pd

    analysis = folder / "analysis"
    analysis.mkdir(parents=True)
    pd.DataFrame(heads).to_csv(analysis / "specialization_heads.csv", index=False)
    if division is not None:
        pd.DataFrame(division).to_csv(analysis / "division_heads.csv", index=False)
    (folder / "provenance.json").write_text(json.dumps(model.provenance))
    (folder / "pretrained_verdict.json").write_text(json.dumps({"sentences": [], "name": "m"}))
    return folder


UNMEASURED = "looks at no known relation; whom it serves not measured; backed up"


def test_a_pretrained_models_saved_verdict_puts_each_heads_finding_beside_its_card(llama, tmp_path):
    model, _ = llama
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    finding = "looks at previous; serves position: 9,10,11,12; needed"
    saved = _verdict_folder(
        tmp_path / "verdict",
        model,
        {"head_label": ["L0H1", "L1H2", "L1H3"], "label": ["previous", "dead", "unspecialized"],
         "holds": ["previous", "", ""], "needed": [True, False, False],
         "backed_up": [False, False, True], "dead": [False, True, False],
         "serves": ["position: 9,10,11,12", None, None],
         "finding": [finding, "dead", UNMEASURED]},
        {"head_label": ["L1H3", "L1H3"], "by": ["position", "token_class"],
         "selectivity": [0.6, 0.1], "specialized": [True, False], "serves": ["0-3", "word"]},
    )  # fmt: skip
    state = Explorer.from_text(model, text, n_eval=4, verdict=saved).state()
    shown = {h["label"]: h["finding"] for h in state["heads"]}
    assert shown["L0H1"] == finding and shown["L1H2"] == "dead"
    # not measured in the heads table, saved in the division's: composed from both
    assert shown["L1H3"] == "looks at no known relation; serves position: 0-3; backed up"
    assert shown["L0H0"] is None  # nothing saved for it: nothing invented
    assert state["verdict"] == {"saved": True, "note": f"findings from {saved}"}
    # without a verdict: said once, with the command that saves one
    bare = Explorer.from_text(model, text, n_eval=4).state()
    assert all(h["finding"] is None for h in bare["heads"])
    assert bare["verdict"]["saved"] is False
    assert "`mhainterp specialize --model " in bare["verdict"]["note"]
    assert "--verdict " in bare["verdict"]["note"]


def test_a_verdict_folder_of_another_model_or_none_at_all_is_refused(llama, tmp_path):
    model, _ = llama
    text = tmp_path / "sentences.txt"
    text.write_text("\n".join(SENTENCES) + "\n")
    other = dict(model.provenance, source="pip:someone-else==1.0")
    folder = _verdict_folder(tmp_path / "other", model, {"head_label": ["L0H0"], "label": ["x"]})
    (folder / "provenance.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="the verdict of this model"):
        Explorer.from_text(model, text, n_eval=2, verdict=folder)
    with pytest.raises(ValueError, match="a folder `mhainterp specialize --model` wrote"):
        Explorer.from_text(model, text, n_eval=2, verdict=tmp_path)
