"""The explorer without a browser: session numbers with known answers, the request handler,
saved results, run discovery, the HTTP server's routes and the command line."""

from __future__ import annotations

import http.client
import json
import socket

import pandas as pd
import pytest
import torch

from mhainterp import cli
from mhainterp.ablation import ablate, head_importance
from mhainterp.config import TrainConfig
from mhainterp.explore import BadRequestError, Explorer, ExploreSession
from mhainterp.explore.app import answer_message
from mhainterp.explore.results import SavedResults
from mhainterp.explore.runs import explorable_runs
from mhainterp.io import write_json
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.tasks import get_task
from mhainterp.training import build_model, evaluate, save_run

N_EVAL = 256


def make_run(path, model, task):
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    eval_metrics = {**evaluate(model, task, n_eval=N_EVAL), "status": "finished"}
    return save_run(model, task, path, TrainConfig(seed=model.cfg.seed), metrics, eval_metrics)


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=16, d_vocab=10)


@pytest.fixture(scope="module")
def backed_up():
    """Two identical previous-token heads (each alone decides the answer) and a uniform head."""
    return handbuilt_model(["previous", "uniform", "previous"])


@pytest.fixture
def session(backed_up, task):
    return ExploreSession(backed_up, task, n_eval=N_EVAL)


# ----------------------------------------------------------------------------- session


def test_clean_metrics_equal_training_evaluate(session, backed_up, task):
    expected = evaluate(backed_up, task, n_eval=N_EVAL)
    overall = session.metrics()["overall"]
    assert overall["accuracy"] == {"clean": 1.0, "ablated": 1.0}
    assert overall["loss"]["clean"] == pytest.approx(expected["loss"], abs=1e-9)
    assert overall["n_scored"] == expected["n_scored"] == N_EVAL * 16
    assert [row["key"] for row in session.metrics()["by"]["target"]] == ["previous_token"]


def test_backup_head_then_both_heads_then_back_to_clean(session, task):
    # One previous head alone still decides every answer: accuracy stays 1.
    assert session.toggle("L0H0").metrics()["overall"]["accuracy"]["ablated"] == 1.0
    # Both zeroed = a model whose two previous heads are dead (zero z writes nothing).
    both = session.toggle("L0H2").metrics()
    dead = evaluate(handbuilt_model(["dead", "uniform", "dead"]), task, n_eval=N_EVAL)
    assert session.heads == ["L0H0", "L0H2"]
    assert both["overall"]["accuracy"]["ablated"] == pytest.approx(dead["accuracy"], abs=1e-12)
    assert both["overall"]["loss"]["ablated"] == pytest.approx(dead["loss"], rel=1e-6)
    assert dead["accuracy"] < 0.5
    restored = session.toggle("L0H0").toggle("L0H2").metrics()["overall"]
    assert restored["accuracy"]["ablated"] == restored["accuracy"]["clean"]
    assert restored["loss"]["ablated"] == restored["loss"]["clean"]


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_two_layers_equal_a_plain_ablate_forward(method):
    # Heads in both layers: layer 1's patterns change, and layer-1 heads are edited too.
    task = get_task("reverse")
    model = build_model(task, n_heads=4, n_layers=2, seed=3)
    session = ExploreSession(model, task, n_eval=N_EVAL, method=method)
    heads = ["L0H1", "L1H2", "L1H0"]
    got = session.set(heads).metrics()["overall"]
    batch = session.batch
    reference = None if method == "zero" else batch
    with ablate(model, heads, method, reference=reference) as ablated:
        expected = evaluate(ablated, batch)
        _, cache = ablated.run_with_cache(batch.tokens, padding_mask=batch.padding_mask)
    assert got["accuracy"]["ablated"] == pytest.approx(expected["accuracy"], abs=1e-12)
    assert got["loss"]["ablated"] == pytest.approx(expected["loss"], rel=1e-5)
    example = session.example(7)
    for layer in range(2):
        shown = torch.tensor(example["attention"][f"L{layer}H3"])
        assert torch.allclose(shown, cache["pattern", layer][7, 3], atol=6e-4)


def test_padded_sequences_are_not_scored_and_match_evaluate():
    task = get_task("reverse", min_len=6)
    model = build_model(task, n_heads=4, seed=2)
    session = ExploreSession(model, task, n_eval=N_EVAL, method="mean")
    got = session.set("L0H0,L0H3").metrics()["overall"]
    batch = session.batch
    with ablate(model, ["L0H0", "L0H3"], "mean", reference=batch) as ablated:
        expected = evaluate(ablated, batch)
    assert got["n_scored"] == expected["n_scored"] == int(batch.mask.sum()) < N_EVAL * 16
    assert got["accuracy"]["ablated"] == pytest.approx(expected["accuracy"], abs=1e-12)
    assert got["loss"]["ablated"] == pytest.approx(expected["loss"], rel=1e-5)
    row = int((~batch.padding_mask).any(1).nonzero()[0])  # a padded sequence
    example = session.example(row)
    assert example["real"] == batch.padding_mask[row].tolist()
    assert example["scored"] == batch.mask[row][:, None].tolist()


def test_per_target_rows_equal_evaluate_on_a_multi_target_task():
    task = get_task("multi_relation")
    model = build_model(task, n_heads=4, seed=1)
    session = ExploreSession(model, task, n_eval=N_EVAL)
    rows = session.toggle("L0H2").metrics()["by"]["target"]
    with ablate(model, ["L0H2"]) as ablated:
        expected = evaluate(ablated, session.batch)
    names = list(task.target_names)
    assert [row["key"] for row in rows] == names
    assert len(names) > 1
    for i, row in enumerate(rows):  # evaluate() names a Batch's targets target0, target1...
        assert row["accuracy"]["ablated"] == pytest.approx(expected[f"accuracy/target{i}"])


def test_groups_along_the_division_of_labours_axes(session, task):
    metrics = session.set("L0H0,L0H2").metrics()
    batch = session.batch
    assert list(metrics["by"]) == ["token", "position", "target_class", "target"]
    by_class = {row["key"]: row for row in metrics["by"]["target_class"]}
    # Class V (= 10, "no previous token" at position 0) is read from the position embedding,
    # so it stays right with both copying heads gone; every sequence has one such position.
    assert by_class["10"]["n"] == N_EVAL
    assert by_class["10"]["accuracy"] == {"clean": 1.0, "ablated": 1.0}
    counts = torch.bincount(batch.targets[batch.mask])
    assert {k: r["n"] for k, r in by_class.items()} == {
        str(k): int(c) for k, c in enumerate(counts) if c > 0
    }
    tokens = torch.bincount(batch.tokens[batch.mask])
    assert [r["n"] for r in metrics["by"]["token"]] == [int(c) for c in tokens if c > 0]
    assert sum(r["n"] for r in metrics["by"]["token"]) == metrics["overall"]["n_scored"]
    by_position = metrics["by"]["position"]
    assert [r["key"] for r in by_position] == [str(t) for t in range(16)]
    assert by_position[0]["accuracy"]["ablated"] == 1.0  # class V at position 0
    assert by_position[5]["accuracy"]["ablated"] < 0.5  # a copy the dead heads cannot make


def test_groups_are_damage_py_axes(backed_up, task):
    """The explorer's groups are the division of labour's: same value names, same counts."""
    from mhainterp.specialization.whom.damage import triple_damage

    session = ExploreSession(backed_up, task, n_eval=N_EVAL)
    damage = triple_damage(backed_up, session.batch, method="zero", names=["previous_token"])
    rows = session.toggle("L0H0", "L0H2").metrics()["by"]
    for axis, names in damage.value_names.items():
        assert [row["key"] for row in rows[axis]] == names
        per_value = torch.bincount(damage.values[axis]).tolist()
        assert [row["n"] for row in rows[axis]] == per_value


def test_example_tokens_predictions_and_attention(session):
    batch = session.batch
    example = session.set("L0H0,L0H2").example(3)
    assert example["tokens"] == batch.tokens[3].tolist()
    assert example["targets"] == batch.targets[3][:, None].tolist()
    for t in range(16):
        right = example["predictions"][t][0] == example["targets"][t][0]
        assert example["correct"][t] == [right]
    assert all(c == [True] for c in session.reset().example(3)["correct"])
    attention = example["attention"]["L0H0"]
    assert attention[3][2] > 0.999  # a previous-token head: from position 3 onto 2
    assert sum(attention[3]) == pytest.approx(1.0, abs=0.01)


def test_bad_input_raises_and_changes_nothing(session):
    session.toggle("L0H1")
    with pytest.raises(ValueError, match="L0H9"):
        session.toggle("L0H9")
    with pytest.raises(ValueError, match="method"):
        session.method = "noise"
    with pytest.raises(ValueError, match="index"):
        session.example(N_EVAL)
    assert session.heads == ["L0H1"]
    assert session.method == "zero"


def test_importance_is_the_single_head_table(task):
    model = handbuilt_model(["previous", "uniform", "dead"])
    session = ExploreSession(model, task, n_eval=N_EVAL)
    table = head_importance(model, session.batch, "mean")
    got = session.importance("mean")
    assert got == dict(zip(table["head_label"], table["delta_accuracy"]))
    assert got["L0H2"] == 0.0  # a dead head
    assert got["L0H0"] < -0.5  # the only copying head


# ----------------------------------------------------------------------------- saved results


def test_saved_results_read_and_tolerate_missing_or_broken_files(tmp_path):
    assert SavedResults.load(tmp_path) == SavedResults()
    analysis = tmp_path / "analysis"
    analysis.mkdir()
    finding = "looks at previous; serves position: 1,2; needed"
    pd.DataFrame(
        {"head_label": ["L0H0", "L0H1"], "label": ["previous", None], "finding": [finding, None]}
    ).to_csv(analysis / "specialization_heads.csv", index=False)
    pd.DataFrame(
        {"head_label": ["L0H0", "L0H0"], "method": ["zero", "mean"], "delta_accuracy": [-0.5, -0.2]}
    ).to_csv(analysis / "ablation_importance.csv", index=False)
    pd.DataFrame(
        {"head_label": ["L0H0"], "by": ["token"], "selectivity": [0.7], "p_adj": [0.01]}
    ).to_csv(analysis / "division_heads.csv", index=False)
    saved = SavedResults.load(tmp_path)
    assert saved.labels == {"L0H0": "previous"}
    assert saved.findings == {"L0H0": finding}  # what the head does on every axis
    assert saved.importance == {"mean": {"L0H0": -0.2}, "zero": {"L0H0": -0.5}}
    assert saved.division == {"L0H0": [{"by": "token", "selectivity": 0.7, "p_adj": 0.01}]}
    (analysis / "specialization_heads.csv").write_text("head_label\nL0H0\n")  # no label column
    (analysis / "division_heads.csv").write_bytes(b"\x00\xff not a csv")
    (analysis / "ablation_importance.csv").write_bytes(b"")  # damaged: 0 bytes
    assert SavedResults.load(tmp_path).labels == {}
    assert SavedResults.load(tmp_path).division == {}
    assert SavedResults.load(tmp_path).importance == {}  # computed by the page, not read


def test_a_finding_not_measured_in_the_heads_table_is_composed_from_the_saved_division(tmp_path):
    """Saved text only: the heads table's flags and the division's per-head ``serves``; a
    saved finding that measured whom the head serves is kept as it is."""
    analysis = tmp_path / "analysis"
    analysis.mkdir()
    unmeasured = "looks at previous; whom it serves not measured; needed"
    pd.DataFrame(
        {"head_label": ["L0H0", "L0H1", "L0H2"], "label": ["previous", "dead", "unspecialized"],
         "holds": ["previous", "", ""], "needed": [True, False, False],
         "backed_up": [False, False, True], "dead": [False, True, False],
         "finding": [unmeasured, "dead", "looks at no known relation; serves token: 3; backed up"]}
    ).to_csv(analysis / "specialization_heads.csv", index=False)  # fmt: skip
    pd.DataFrame(
        {"head_label": ["L0H0", "L0H0", "L0H2"], "by": ["position", "token", "token"],
         "selectivity": [0.8, 0.1, 0.2], "specialized": [True, False, False],
         "serves": ["9,10,11,12", "1", "7"]}
    ).to_csv(analysis / "division_heads.csv", index=False)  # fmt: skip
    saved = SavedResults.load(tmp_path)
    assert saved.findings == {
        "L0H0": "looks at previous; serves position: 9,10,11,12; needed",
        "L0H1": "dead",
        "L0H2": "looks at no known relation; serves token: 3; backed up",  # measured: kept
    }
    assert saved.has_verdict and not SavedResults().has_verdict


def test_the_page_says_once_that_no_verdict_was_saved_and_the_command_that_saves_one(
    tmp_path, task
):
    run = make_run(tmp_path / "h3_seed0", handbuilt_model(["previous", "uniform", "dead"]), task)
    state = Explorer.from_path(run, n_eval=N_EVAL).state()
    assert state["verdict"] == {
        "saved": False,
        "note": f"No saved verdict, so no finding per head: `mhainterp specialize {run}` "
        "saves one; open the explorer again.",
    }
    assert [h["finding"] for h in state["heads"]] == [None, None, None]  # none invented
    (run / "analysis").mkdir(exist_ok=True)
    pd.DataFrame({"head_label": ["L0H0"], "label": ["previous"], "finding": ["dead"]}).to_csv(
        run / "analysis" / "specialization_heads.csv", index=False
    )
    state = Explorer.from_path(run, n_eval=N_EVAL).state()
    assert state["verdict"] == {"saved": True, "note": ""}
    assert [h["finding"] for h in state["heads"]] == ["dead", None, None]


# ----------------------------------------------------------------------------- runs, explorer


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, task):
    # a folder of its own: the session's temp folder holds other tests' damaged runs
    root = tmp_path_factory.mktemp("sweeps") / "sweep0"
    write_json(root / "sweep.json", {"task": task.name})
    make_run(root / "runs" / "h3_seed1", handbuilt_model(["previous", "uniform", "previous"]), task)
    make_run(root / "runs" / "h2_seed0", handbuilt_model(["previous", "dead"], d_head=24), task)
    return root


def test_explorable_runs_of_a_sweep_sorted_by_heads(sweep_dir):
    runs = explorable_runs(sweep_dir)
    assert [(r.id, r.n_heads) for r in runs] == [("h2_seed0", 2), ("h3_seed1", 3)]
    assert explorable_runs(sweep_dir / "runs" / "h2_seed0")[0].id == "h2_seed0"
    # A folder of sweeps: grouped by sweep, then (h, seed).
    ids = [r.id for r in explorable_runs(sweep_dir.parent)]
    assert [i for i in ids if i.startswith(f"{sweep_dir.name}/")] == [
        f"{sweep_dir.name}/h2_seed0",
        f"{sweep_dir.name}/h3_seed1",
    ]


def test_the_explore_package_is_its_callable_and_its_modules_import_by_dotted_name():
    """``mhainterp.explore(run)`` is the call users make, and ``mhainterp.explore`` is also a
    subpackage: when the name was the function, ``import mhainterp.explore.server as server``
    (the TransformerLens habit, ``import transformer_lens.utils as utils``) failed with
    "cannot import name 'server' from 'explore'"."""
    import inspect
    import sys

    import mhainterp
    import mhainterp.explore.server as server

    assert server.__name__ == "mhainterp.explore.server"
    assert mhainterp.explore is sys.modules["mhainterp.explore"]
    assert list(inspect.signature(mhainterp.explore).parameters) == [
        "run",
        "task",
        "n_eval",
        "method",
        "verdict",
    ]
    with pytest.raises(TypeError, match="run must be a run or sweep folder"):
        mhainterp.explore(object())


def test_not_a_run_or_sweep(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        explorable_runs(tmp_path)


def test_state_grid_thumbnails_and_saved_labels(sweep_dir):
    analysis = sweep_dir / "runs" / "h2_seed0" / "analysis"
    analysis.mkdir(exist_ok=True)
    pd.DataFrame({"head_label": ["L0H0", "L0H1"], "label": ["previous", "dead"]}).to_csv(
        analysis / "specialization_heads.csv", index=False
    )
    pd.DataFrame(
        {"head_label": ["L0H0", "L0H1"], "method": "zero", "delta_accuracy": [-0.25, 0.0]}
    ).to_csv(analysis / "ablation_importance.csv", index=False)
    explorer = Explorer.from_path(sweep_dir, n_eval=N_EVAL)
    state = explorer.handle("state")
    assert state["run"] == "h3_seed1"  # the largest head count opens first
    assert [r["id"] for r in state["runs"]] == ["h2_seed0", "h3_seed1"]
    state = explorer.handle("run", {"run": "h2_seed0"})
    assert [(h["label"], h["role"]) for h in state["heads"]] == [
        ("L0H0", "previous"),
        ("L0H1", "dead"),
    ]
    assert state["thumbnails"]["L0H0"][3][2] > 0.99  # average pattern: previous token
    assert state["view"]["importance"] == {"L0H0": -0.25, "L0H1": 0.0}  # the saved table
    other = explorer.handle("run", {"run": "h3_seed1"})  # opened before: kept
    assert other["n_heads"] == 3 and other["heads"][1]["role"] is None
    assert other["view"]["importance"]["L0H0"] == 0.0  # computed: the other head backs it up


def test_a_damaged_run_is_one_line_and_the_others_stay_usable(tmp_path, task, capsys):
    sweep = tmp_path / "sweep"
    write_json(sweep / "sweep.json", {"task": task.name})
    make_run(sweep / "runs" / "h1_seed0", handbuilt_model(["previous"], d_head=48), task)
    make_run(sweep / "runs" / "h3_seed0", handbuilt_model(["previous", "uniform", "dead"]), task)
    (sweep / "runs" / "h1_seed0" / "model.safetensors").write_bytes(b"not safetensors")
    explorer = Explorer.from_path(sweep, n_eval=N_EVAL)
    with pytest.raises(BadRequestError, match="cannot load the run .*h1_seed0"):
        explorer.handle("run", {"run": "h1_seed0"})
    assert explorer.handle("state")["run"] == "h3_seed0"
    bad = tmp_path / "bad"
    make_run(bad, handbuilt_model(["previous"], d_head=48), task)
    (bad / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "COMMAND_MODULES", ("mhainterp.cli.explore",))
        assert cli.main(["explore", str(bad), "--no-browser", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot load the run" in err[0]


def test_bad_requests_answer_400_messages_and_keep_state(backed_up, task):
    explorer = Explorer.from_model(backed_up, task, n_eval=N_EVAL)
    explorer.handle("toggle", {"head": "L0H1"})
    bad = [
        ("toggle", {"head": "L0H7"}, "valid heads"),
        ("toggle", {"head": 3}, "head=3"),
        ("toggle", None, "head=None"),
        ("method", {"method": "noise"}, "zero, mean, resample"),
        ("example", {"index": -1}, "index=-1"),
        ("run", {"run": "elsewhere"}, "run='elsewhere'"),
        ("delete", {}, "action='delete'"),
    ]
    for action, body, message in bad:
        with pytest.raises(BadRequestError, match=message):
            explorer.handle(action, body)
    view = explorer.view()
    assert view["ablated"] == ["L0H1"] and view["method"] == "zero"


def test_method_switch_reset_and_draw(backed_up, task):
    explorer = Explorer.from_model(backed_up, task, n_eval=N_EVAL, seed=5)
    view = explorer.handle("method", {"method": "mean"})
    assert view["method"] == "mean" and view["metrics"]["method"] == "mean"
    view = explorer.handle("toggle", {"head": "L0H0"})
    assert explorer.handle("reset")["ablated"] == []
    drawn = explorer.handle("example", {"draw": True})["example"]["index"]
    expected = int(torch.randint(N_EVAL, (1,), generator=torch.Generator().manual_seed(5)))
    assert drawn == expected
    assert explorer.handle("example", {"index": 9})["example"]["index"] == 9


def test_widget_messages_answer_like_the_server(backed_up, task):
    explorer = Explorer.from_model(backed_up, task, n_eval=N_EVAL)
    ok = answer_message(explorer, {"id": 4, "action": "toggle", "body": {"head": "L0H2"}})
    assert ok["id"] == 4 and ok["status"] == 200 and ok["body"]["ablated"] == ["L0H2"]
    bad = answer_message(explorer, {"id": 5, "action": "method", "body": {"method": "x"}})
    assert bad["status"] == 400 and "method='x'" in bad["body"]["error"]


def test_notebook_widget_runs_the_page_module(backed_up, task):
    pytest.importorskip("anywidget")
    from mhainterp import explore
    from mhainterp.explore.server import asset_bytes

    widget = explore(backed_up, task, n_eval=N_EVAL)
    assert "export default" in str(widget._esm)
    assert str(widget._esm) == asset_bytes("explorer.js").decode()
    assert widget.explorer.handle("toggle", {"head": "L0H0"})["ablated"] == ["L0H0"]
    with pytest.raises(TypeError, match="task="):
        explore(backed_up)


# ----------------------------------------------------------------------------- server


def _get(port, path, method="GET", body=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    return response.status, response.read()


@pytest.fixture(scope="module")
def server(backed_up, task):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from mhainterp.explore.server import ServerThread, build_app

    explorer = Explorer.from_model(backed_up, task, n_eval=N_EVAL)
    with ServerThread(build_app(explorer)) as running:
        yield running


def test_server_serves_the_page_and_its_assets(server):
    status, page = _get(server.port, "/")
    assert status == 200 and b"assets/explorer.js" in page
    assert _get(server.port, "/assets/explorer.js")[0] == 200
    assert _get(server.port, "/assets/explorer.css")[0] == 200
    status, state = _get(server.port, "/api/state")
    assert status == 200 and json.loads(state)["n_heads"] == 3


@pytest.mark.parametrize(
    "path",
    [
        "/../mhainterp/explore/session.py",
        "/assets/../session.py",
        "/assets/..%2fsession.py",
        "/assets/%2e%2e%2fsession.py",
        "/assets/%2E%2E%2F%2E%2E%2Fapp.py",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/assets/..%5csession.py",
        "/etc/passwd",
        "//etc/passwd",
        "/assets//etc/passwd",
        "/assets/index.html",
        "/assets/session.py",
        "/model.safetensors",
        "/config.json",
    ],
)
def test_server_refuses_every_other_path(server, path):
    assert _get(server.port, path)[0] == 404


def test_server_bad_input_is_400_and_it_keeps_running(server):
    status, body = _get(server.port, "/api/toggle", "POST", json.dumps({"head": "L5H0"}))
    assert status == 400 and "valid heads" in json.loads(body)["error"]
    status, body = _get(server.port, "/api/method", "POST", json.dumps({"method": "noise"}))
    assert status == 400 and "method='noise'" in json.loads(body)["error"]
    status, body = _get(server.port, "/api/toggle", "POST", "{not json")
    assert status == 400 and "not JSON" in json.loads(body)["error"]
    status, body = _get(server.port, "/api/toggle", "POST", json.dumps({"head": "L0H1"}))
    assert status == 200 and json.loads(body)["ablated"] == ["L0H1"]
    assert _get(server.port, "/api/reset", "POST")[0] == 200


# ----------------------------------------------------------------------------- command line


@pytest.fixture
def explore_command(monkeypatch):
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("mhainterp.cli.explore",))


def test_cli_not_a_run_or_sweep_is_one_line_exit_2(explore_command, tmp_path, capsys):
    assert cli.main(["explore", str(tmp_path), "--no-browser"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a run folder" in err[0]


def test_cli_port_in_use_suggests_port(explore_command, sweep_dir, capsys):
    pytest.importorskip("uvicorn")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["explore", str(sweep_dir), "--no-browser", "--port", str(port)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"127.0.0.1:{port}" in err[0] and "--port" in err[0]


def test_cli_any_host_warns(explore_command, sweep_dir, capsys):
    pytest.importorskip("uvicorn")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["explore", str(sweep_dir), "--host", "0.0.0.0", "--port", str(port)])
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert "anyone" in warning and "network" in warning and "--port" in error


def test_cli_bad_method_is_exit_2(explore_command, sweep_dir, capsys):
    assert cli.main(["explore", str(sweep_dir), "--method", "noise", "--no-browser"]) == 2
    assert "method='noise'" in capsys.readouterr().err


def _wait_for_state(port, timeout=120):
    """``GET /api/state`` until it answers with the explorer (503 means: still loading)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, body = _get(port, "/api/state")
        except ConnectionError:
            status, body = None, b""
        if status is not None and status != 503:
            return status, body
        if status == 503:
            assert "loading" in json.loads(body)
        time.sleep(0.1)
    pytest.fail("the server did not answer")


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.signals
def test_cli_explores_a_run_of_a_users_task_with_task_module(user_task_file, tmp_path):
    """The real command in fresh processes: without --task-module one line says to pass it;
    with it, the user's task is served and clicks answer."""
    import signal
    import subprocess
    import sys

    from mhainterp.tasks import load_task_module

    load_task_module(user_task_file)
    task = get_task("two_back", seq_len=8, d_vocab=6)
    run = make_run(tmp_path / "h2_seed0", build_model(task, n_heads=2, seed=0), task)
    base = [sys.executable, "-m", "mhainterp.cli", "explore", str(run), "--no-browser"]
    base += ["--n-eval", "64"]
    refused = subprocess.run(
        [*base, "--port", str(_free_port())], capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--task-module" in refused.stderr
    port = _free_port()
    command = [*base, "--port", str(port), "--task-module", str(user_task_file)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        status, body = _wait_for_state(port)
        assert status == 200 and json.loads(body)["task"] == "two_back"
        status, body = _get(port, "/api/toggle", "POST", json.dumps({"head": "L0H1"}))
        assert status == 200 and json.loads(body)["ablated"] == ["L0H1"]
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)
    assert process.returncode == 130


@pytest.mark.slow
@pytest.mark.signals
def test_cli_serves_a_run_and_stops_on_ctrl_c(sweep_dir):
    """The real command in a subprocess: it serves, answers clicks, and Ctrl-C ends it (130)."""
    import signal
    import subprocess
    import sys

    pytest.importorskip("uvicorn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "mhainterp.cli", "explore", str(sweep_dir)]
    command += ["--no-browser", "--port", str(port), "--n-eval", str(N_EVAL)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert f"at http://127.0.0.1:{port}/" in line and "2 run(s)" in line
        assert "showing h3_seed1" in line  # the largest head count
        status, body = _wait_for_state(port)
        assert status == 200 and [r["id"] for r in json.loads(body)["runs"]] == [
            "h2_seed0",
            "h3_seed1",
        ]
        assert json.loads(body)["run"] == "h3_seed1"
        status, body = _get(port, "/api/run", "POST", json.dumps({"run": "h2_seed0"}))
        assert status == 200
        status, body = _get(port, "/api/toggle", "POST", json.dumps({"head": "L0H1"}))
        assert status == 200 and json.loads(body)["ablated"] == ["L0H1"]
        assert _get(port, "/api/toggle", "POST", json.dumps({"head": "L9H9"}))[0] == 400
        assert _get(port, "/api/state")[0] == 200  # still serving after the bad request
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert err.strip().splitlines() == ["mhainterp explore: stopped"]


# ----------------------------------------------------------------------------- server hardening


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:8765", "127.0.0.1", "127.0.0.1:1", "[::1]", "[::1]:8765"]
)
def test_server_accepts_loopback_host_names_with_any_port(server, host):
    status, body = _get(server.port, "/api/state", headers={"Host": host})
    assert status == 200 and json.loads(body)["n_heads"] == 3


@pytest.mark.parametrize(
    "host",
    ["attacker.example", "attacker.example:8765", "localhost.attacker.example", "127.0.0.2", ""],
)
def test_server_refuses_other_host_names_dns_rebinding(server, host):
    for method, path, body in [("GET", "/api/state", None), ("GET", "/", None),
                               ("POST", "/api/toggle", '{"head": "L0H1"}')]:  # fmt: skip
        status, answer = _get(server.port, path, method, body, headers={"Host": host})
        assert status == 400 and "is not this machine" in json.loads(answer)["error"]
    assert json.loads(_get(server.port, "/api/state")[1])["view"]["ablated"] == []


def test_server_post_from_another_origin_is_403_and_changes_nothing(server):
    own = {"Host": f"127.0.0.1:{server.port}", "Origin": f"http://127.0.0.1:{server.port}"}
    foreign = [
        "http://attacker.example",
        f"http://localhost:{server.port}",  # another origin than the Host the page came from
        f"https://127.0.0.1:{server.port}",
        "null",  # sandboxed frames, file:// pages
    ]
    for origin in foreign:
        status, body = _get(
            server.port, "/api/toggle", "POST", '{"head": "L0H1"}', {**own, "Origin": origin}
        )
        assert status == 403 and "refused" in json.loads(body)["error"]
    assert json.loads(_get(server.port, "/api/state")[1])["view"]["ablated"] == []
    status, body = _get(server.port, "/api/toggle", "POST", '{"head": "L0H1"}', own)
    assert status == 200 and json.loads(body)["ablated"] == ["L0H1"]
    status, _ = _get(server.port, "/api/reset", "POST", "{}")  # no Origin: not a web page
    assert status == 200


def test_server_refuses_a_huge_declared_body_without_reading_it(server):
    """Content-Length of 200 MiB and no byte of it sent: a server that buffered the body
    would wait for it (the socket timeout fails the test); this one answers 413 at once."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/toggle HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 209715200\r\n\r\n"
        )
        status_line = sock.makefile("rb").readline()
    assert status_line.split()[1] == b"413"


def test_server_refuses_a_chunked_body_once_it_passes_the_limit(server):
    """A chunked body is counted while it streams: 128 KiB sent, no final chunk; the server
    answers 413 without waiting for the end (a buffering server would hang here)."""
    from mhainterp.explore.server import MAX_BODY_BYTES

    chunk = b"[" * 8192
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/toggle HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(2 * MAX_BODY_BYTES // len(chunk)):
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:  # the server answered and closed: it stopped reading
                break
        status_line = sock.makefile("rb").readline()
    assert status_line.split()[1] == b"413"
    assert _get(server.port, "/api/state")[0] == 200  # and it keeps serving


@pytest.mark.parametrize(
    "body",
    [
        "[" * 50_000,  # nested too deeply for json.loads (RecursionError)
        '{"head": ' * 5_000 + "1" + "}" * 5_000,
        b"\xff\xfe\x00 not utf-8",
        '{"head": "L0H1"',
        "[1, 2]",
        '"L0H1"',
        "NaN",
        "1" * 5000,  # an int with too many digits
    ],
)
def test_server_any_bad_json_is_400_never_500(server, body):
    status, answer = _get(server.port, "/api/toggle", "POST", body)
    assert status == 400 and "JSON" in json.loads(answer)["error"]


def test_state_with_a_nan_in_a_saved_table_is_valid_json(tmp_path, task):
    from mhainterp.explore.server import ServerThread, build_app

    run = make_run(tmp_path / "h3_seed0", handbuilt_model(["previous", "uniform", "dead"]), task)
    (run / "analysis").mkdir(exist_ok=True)
    pd.DataFrame(
        {"head_label": ["L0H0", "L0H1", "L0H2"], "method": "zero",
         "delta_accuracy": [-0.5, float("nan"), 0.0]}
    ).to_csv(run / "analysis" / "ablation_importance.csv", index=False)  # fmt: skip
    explorer = Explorer.from_path(run, n_eval=N_EVAL)
    with ServerThread(build_app(explorer)) as running:
        status, body = _get(running.port, "/api/state")
    assert status == 200
    state = json.loads(body, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert state["view"]["importance"] == {"L0H0": -0.5, "L0H1": None, "L0H2": 0.0}


def test_server_stops_cleanly_when_its_thread_claims_to_have_ended(backed_up, task, monkeypatch):
    """On Python < 3.13 a Ctrl-C inside ``Thread.join`` can mark a running thread as stopped
    (CPython gh-90882): join and is_alive then answer at once. The shutdown used to trust them
    and close the socket while uvicorn still served it, and uvicorn's own close raised in its
    thread (``Invalid file descriptor: -1``, a traceback after "stopped" in CI). Here the
    thread lies the same way; the server must still stop with no error in any thread."""
    import threading

    from mhainterp.explore.server import ServerThread, build_app

    raised = []
    monkeypatch.setattr(threading, "excepthook", lambda hook_args: raised.append(hook_args))
    running = ServerThread(build_app(Explorer.from_model(backed_up, task, n_eval=N_EVAL)))
    with running:
        assert _get(running.port, "/api/state")[0] == 200
        monkeypatch.setattr(running.thread, "join", lambda timeout=None: None)
        monkeypatch.setattr(running.thread, "is_alive", lambda: False)
    threading.Thread.join(running.thread, timeout=30)  # the real end of the thread
    assert not threading.Thread.is_alive(running.thread)
    assert [repr(hook_args.exc_value) for hook_args in raised] == []
    assert running.sock.fileno() == -1  # closed once the server had stopped


# ----------------------------------------------------------------------------- over the Ablator


def test_the_session_is_the_ablators_one_state_and_reading_changes_nothing(backed_up, task):
    from mhainterp.ablation import Ablator

    session = ExploreSession(backed_up, task, n_eval=N_EVAL, method="mean")
    assert isinstance(session, Ablator)
    session.toggle("L0H0")
    before = session.evaluate()
    session.importance("resample")  # every single head, another method
    session.metrics(), session.example(3), session.patterns(3, "L0H1,L0H2", method="zero")
    session.evaluate("L0H1", method="zero"), session.position_scores([])
    assert (session.method, session.heads) == ("mean", ["L0H0"])
    assert session.evaluate() == before
    assert not {"_ablated", "_method_shadow"} & set(vars(session))  # no second copy of it


def test_one_click_resolves_the_head_label_once(backed_up, task, monkeypatch):
    import mhainterp.ablation.interactive as interactive

    explorer = Explorer.from_model(backed_up, task, n_eval=N_EVAL)
    explorer.handle("state")
    calls = []
    real = interactive.resolve_heads
    monkeypatch.setattr(interactive, "resolve_heads", lambda *a: calls.append(a) or real(*a))
    explorer.handle("toggle", {"head": "L0H0"})
    explorer.handle("toggle", {"head": "L0H2"})
    assert [args[1] for args in calls] == ["L0H0", "L0H2"]


def test_ablator_cache_is_a_bounded_lru(task):
    from mhainterp.ablation import Ablator

    model = build_model(task, n_heads=8, n_layers=2, seed=4)
    ablator = Ablator(model, task, n_eval=64, cache_size=6)
    labels = ablator.valid_heads
    seen = []
    for i in range(30):  # 30 distinct sets (Gray code over 16 heads)
        ablator.toggle(labels[((i + 1) & -(i + 1)).bit_length() - 1])
        seen.append((ablator.heads, ablator.position_scores()))
        assert ablator.cache_info()["entries"] <= 6
    recent_heads, recent = seen[-1]
    assert ablator.position_scores(recent_heads) is recent  # a recent set: a cache hit
    old_heads, old = seen[0]
    again = ablator.position_scores(old_heads)  # dropped long ago: computed again, same numbers
    assert again is not old and torch.equal(again.nll, old.nll)
    assert torch.equal(again.predictions, old.predictions)
    with pytest.raises(ValueError, match="cache_size=0"):
        Ablator(model, task, n_eval=64, cache_size=0)


def test_cached_results_own_their_storage_and_stay_under_the_byte_bound(task):
    """Memory over distinct head sets: an entry of a batched pass (the single heads) used to be
    a view of the whole pass's [16, n, T, k] tensors, so one recent single head kept all 16
    alive; and 128 entries of a large batch had no bound in bytes."""
    from mhainterp.ablation import Ablator

    model = build_model(task, n_heads=16, seed=4)
    entry_bytes = 512 * 16 * (4 + 1 + 8)  # nll float32, correct bool, prediction int64
    ablator = Ablator(model, task, n_eval=512, cache_bytes=10 * entry_bytes)
    ablator.precompute([[label] for label in ablator.valid_heads])  # one pass of 16 copies
    info = ablator.cache_info()
    assert (info["entries"], info["bytes"]) == (10, 10 * entry_bytes)  # the 10 newest
    scores = ablator.position_scores(["L0H15"])
    assert scores.nll.untyped_storage().nbytes() == 512 * 16 * 4  # its own row, not all 16
    labels = ablator.valid_heads
    for i in range(40):  # distinct sets, one pass each
        ablator.set(labels[: 1 + i % 16] if i < 16 else [labels[i % 16], labels[(i + 3) % 16]])
        ablator.evaluate()
        ablator.position_scores()
        assert ablator.cache_info()["bytes"] <= 10 * entry_bytes
    with pytest.raises(ValueError, match="cache_bytes=-1"):
        Ablator(model, task, n_eval=64, cache_bytes=-1)


def test_a_sweep_keeps_the_sessions_of_the_last_runs_shown_and_restores_a_dropped_one(
    sweep_dir, monkeypatch
):
    """Every opened run's session (model, batch, cached results) used to be kept: memory grew
    with every run picked. A dropped run opens again with the heads it had ablated."""
    import mhainterp.explore.app as app

    monkeypatch.setattr(app, "OPEN_RUNS", 1)
    explorer = Explorer.from_path(sweep_dir, n_eval=64)  # opens h3_seed1, the largest h
    explorer.handle("toggle", {"head": "L0H2"})
    first = explorer.session
    explorer.handle("run", {"run": "h2_seed0"})
    assert list(explorer._opened) == ["h2_seed0"]  # h3_seed1's session is dropped
    state = explorer.handle("run", {"run": "h3_seed1"})
    assert explorer.session is not first and state["view"]["ablated"] == ["L0H2"]
    assert state["view"]["metrics"] == first.metrics()  # the same numbers as before


def test_a_nan_or_infinity_anywhere_in_saved_results_is_not_measured_and_serves_200(tmp_path, task):
    """NaN and infinities in every saved table the explorer reads: the page's state and a
    click answer 200 with strict JSON (JSON has no NaN), the values null ("not measured" on
    the page), through the loading server as the command builds it and through the widget's
    messages (which used to carry NaN through, and the page's JSON.parse then failed)."""
    from mhainterp.explore.server import ExplorerLoader, ServerThread, build_app

    run = make_run(tmp_path / "h3_seed0", handbuilt_model(["previous", "uniform", "dead"]), task)
    analysis = run / "analysis"
    analysis.mkdir(exist_ok=True)
    heads, nan, inf = ["L0H0", "L0H1", "L0H2"], float("nan"), float("inf")
    pd.DataFrame(
        [{"head_label": h, "method": m, "delta_accuracy": value}
         for m in ("zero", "mean", "resample") for h, value in zip(heads, [nan, -inf, 0.0])]
    ).to_csv(analysis / "ablation_importance.csv", index=False)  # fmt: skip
    pd.DataFrame({"head_label": heads, "label": ["previous", nan, "dead"],
                  "finding": [nan, "looks at no known relation", nan]}).to_csv(
        analysis / "specialization_heads.csv", index=False)  # fmt: skip
    division = {"head_label": ["L0H0", "L0H1"], "by": "token", "selectivity": [nan, inf],
                "null_mean": nan, "p_adj": [nan, 1.0], "specialized": [nan, False],
                "serves": [nan, "3,4"]}  # fmt: skip
    pd.DataFrame(division).to_csv(analysis / "division_heads.csv", index=False)

    def strict(body):
        return json.loads(body, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))

    loader = ExplorerLoader(lambda: Explorer.from_path(run, n_eval=N_EVAL), what="h3_seed0")
    assert loader.start().wait(60) and loader.error is None
    with ServerThread(build_app(loader)) as running:
        status, body = _get(running.port, "/api/state")
        assert status == 200
        state = strict(body)
        toggled = _get(running.port, "/api/toggle", "POST", json.dumps({"head": "L0H0"}))
    assert state["view"]["importance"] == {"L0H0": None, "L0H1": None, "L0H2": 0.0}
    assert [h["role"] for h in state["heads"]] == ["previous", None, "dead"]
    assert [h["finding"] for h in state["heads"]] == [None, "looks at no known relation", None]
    assert state["heads"][0]["division"] == [{"by": "token", "selectivity": None,
        "null_mean": None, "p_adj": None, "specialized": None, "serves": None}]  # fmt: skip
    assert state["heads"][1]["division"][0]["selectivity"] is None
    assert toggled[0] == 200 and strict(toggled[1])["ablated"] == ["L0H0"]
    reply = answer_message(loader.explorer, {"id": 7, "action": "state"})
    assert reply["status"] == 200
    assert strict(json.dumps(reply))["body"]["view"]["importance"]["L0H0"] is None


def test_one_clean_forward_at_start_serves_every_first_layer(monkeypatch):
    """The start used to score the clean model twice (totals, then per position), and the
    first click on each new first layer ran a clean forward up to it (SmolLM2: a forward per
    layer clicked first). One clean forward now keeps every layer's prefix."""
    import mhainterp.ablation.engine as engine
    import mhainterp.ablation.interactive as interactive

    task = get_task("reverse")
    model = build_model(task, n_heads=4, n_layers=3, seed=5)
    passes, prefixes = [], []
    real_pass, real_prefixes = interactive.run_masks, engine._clean_prefixes

    def counted_pass(*args, **options):
        passes.append(1)
        return real_pass(*args, **options)

    def counted_prefixes(m, part, layers):
        prefixes.append(list(layers))
        return real_prefixes(m, part, layers)

    monkeypatch.setattr(interactive, "run_masks", counted_pass)
    monkeypatch.setattr(engine, "_clean_prefixes", counted_prefixes)
    session = ExploreSession(model, task, n_eval=N_EVAL)
    assert len(passes) == 1 and prefixes == [[0, 1, 2]]
    for head in ("L2H0", "L1H3", "L0H1"):
        session.toggle(head).metrics()
    assert prefixes == [[0, 1, 2]]  # no clean forward of its own for any click


@pytest.mark.parametrize("method", ["zero", "resample"])
def test_kept_clean_prefixes_give_the_engines_numbers(method):
    """Clicks reuse the clean prefix of each first ablated layer; every number still equals a
    fresh engine pass (evaluate_head_sets) of the same sets."""
    from mhainterp.ablation import Ablator, evaluate_head_sets

    task = get_task("reverse")
    model = build_model(task, n_heads=4, n_layers=3, seed=5)
    sets = [["L1H0"], ["L1H0", "L0H2"], ["L2H3"], ["L0H2"], ["L1H0", "L2H3"]]
    ablator = Ablator(model, task, n_eval=N_EVAL, method=method)
    clicked = [ablator.set(heads).evaluate()["accuracy"] for heads in sets]
    assert len(ablator._clean.prefixes) == 3  # one clean prefix per first layer (0, 1, 2), kept
    fresh = evaluate_head_sets(model, ablator.batch_, sets, method, reference=ablator.batch_)
    assert clicked == [m["accuracy"] for m in fresh.metrics()]


def test_the_page_is_served_while_the_model_loads(backed_up, task):
    import threading

    from mhainterp.explore.server import ExplorerLoader, ServerThread, build_app

    gate = threading.Event()

    def build():
        assert gate.wait(60)
        return Explorer.from_model(backed_up, task, n_eval=N_EVAL)

    loader = ExplorerLoader(build, what="h3_seed0").start()
    with ServerThread(build_app(loader)) as running:
        assert _get(running.port, "/")[0] == 200
        assert _get(running.port, "/assets/explorer.js")[0] == 200
        for method, path in [("GET", "/api/state"), ("POST", "/api/reset")]:
            status, body = _get(running.port, path, method)
            assert (status, json.loads(body)) == (503, {"loading": "loading h3_seed0…"})
        gate.set()
        assert loader.wait(60) and loader.error is None
        status, body = _get(running.port, "/api/state")
        assert status == 200 and json.loads(body)["n_heads"] == 3
    failed = ExplorerLoader(lambda: 1 / 0, what="h9_seed0").start()
    assert failed.wait(60) and isinstance(failed.error, ZeroDivisionError)
    with ServerThread(build_app(failed)) as running:
        status, body = _get(running.port, "/api/state")
        assert status == 500 and "cannot load h9_seed0" in json.loads(body)["error"]


def _tgkill(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to one thread of another process (Linux's tgkill; Python has none)."""
    import ctypes
    import platform

    number = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
    if number is None:
        pytest.skip(f"tgkill's syscall number is not known here ({platform.machine()})")
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(number, pid, tid, signum) == 0, ctypes.get_errno()


@pytest.mark.slow
@pytest.mark.signals
def test_ctrl_c_stops_the_explorer_whichever_thread_the_kernel_hands_it_to(sweep_dir):
    """The kernel may deliver a Ctrl-C to any thread. Python runs its handler only in the
    main thread, which used to sit in an untimed join of the server thread and never woke:
    in CI two explore processes hung after Ctrl-C. Sent to a thread other than the main one,
    it still ends the command at once with its one line and exit 130."""
    import os
    import signal
    import subprocess
    import sys

    pytest.importorskip("uvicorn")
    port = _free_port()
    command = [sys.executable, "-m", "mhainterp.cli", "explore", str(sweep_dir)]
    command += ["--no-browser", "--port", str(port), "--n-eval", str(N_EVAL)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for_state(port)[0] == 200
        others = [int(t) for t in os.listdir(f"/proc/{process.pid}/task") if int(t) != process.pid]
        _tgkill(process.pid, others[0], signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130
    assert err.strip().splitlines() == ["mhainterp explore: stopped"]


def test_one_sequence_offers_zero_only_and_a_refused_method_changes_nothing():
    """Mean and resample need two sequences. The explorer offered them on one, and a "mean"
    click set the method before it was refused, so every later click failed (review)."""
    from mhainterp.model.handbuilt import split_heads_model
    from mhainterp.tasks import split_batch

    model = split_heads_model([("position", [2, 3, 4, 5, 6]), ("position", [7, 8, 9, 10, 11])])
    explorer = Explorer.from_model(model, split_batch(1), n_eval=1, method="zero")
    assert explorer.state()["methods"] == ["zero"]
    with pytest.raises(BadRequestError, match="method='mean' is invalid here: at least 2"):
        explorer.handle("method", {"method": "mean"})
    assert explorer.handle("toggle", {"head": "L0H0"})["method"] == "zero"  # not stuck


def test_a_rebuilt_finding_keeps_harmful_and_mixed_heads(tmp_path):
    """A saved finding that did not measure whom the head serves is completed from the
    division table; it lost the harmful flag and the mixed roles the saved one stated."""
    from mhainterp.explore.results import _findings
    from mhainterp.specialization.verdict.labels import findings

    heads = pd.DataFrame(
        {
            "head_label": ["L0H0", "L0H1"], "holds": ["", ""], "needed": [False, False],
            "backed_up": [False, False], "dead": [False, False], "harmful": [True, False],
            "removal_gain": [0.46, 0.0], "mixed_roles": ["", "previous;first"],
            "serves": [None, None],
        }
    )  # fmt: skip
    heads["finding"] = findings(heads)
    heads.to_csv(tmp_path / "specialization_heads.csv", index=False)
    division = {
        h: [{"by": "position", "specialized": False, "serves": ""}] for h in heads.head_label
    }
    assert list(_findings(tmp_path / "specialization_heads.csv", division).values()) == [
        "looks at no known relation; serves no subset shown; harmful: removing it improves a "
        "target by 0.46",
        "mixes previous and first; serves no subset shown; not needed",
    ]
