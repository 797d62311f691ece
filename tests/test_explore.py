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
from mhainterp.handbuilt import handbuilt_model
from mhainterp.io import write_json
from mhainterp.tasks import get_task
from mhainterp.training import build_model, evaluate, save_run

N_EVAL = 256


def make_run(path, model, task):
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    eval_metrics = {**evaluate(model, task, n_eval=N_EVAL), "status": "finished"}
    return save_run(path, model, task, TrainConfig(seed=model.cfg.seed), metrics, eval_metrics)


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
    assert [row["key"] for row in session.metrics()["per_target"]] == ["previous_token"]


def test_backup_head_then_both_heads_then_back_to_clean(session, task):
    # One previous head alone still decides every answer: accuracy stays 1.
    assert session.toggle("L0H0").metrics()["overall"]["accuracy"]["ablated"] == 1.0
    # Both zeroed = a model whose two previous heads are dead (zero z writes nothing).
    both = session.toggle("L0H2").metrics()
    dead = evaluate(handbuilt_model(["dead", "uniform", "dead"]), task, n_eval=N_EVAL)
    assert session.ablated == ["L0H0", "L0H2"]
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
    got = session.set_heads(heads).metrics()["overall"]
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
    got = session.set_heads("L0H0,L0H3").metrics()["overall"]
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
    rows = session.toggle("L0H2").metrics()["per_target"]
    with ablate(model, ["L0H2"]) as ablated:
        expected = evaluate(ablated, session.batch)
    names = list(task.target_names)
    assert [row["key"] for row in rows] == names
    assert len(names) > 1
    for i, row in enumerate(rows):  # evaluate() names a Batch's targets target0, target1...
        assert row["accuracy"]["ablated"] == pytest.approx(expected[f"accuracy/target{i}"])


def test_groups_by_class_and_by_query_token(session, task):
    metrics = session.set_heads("L0H0,L0H2").metrics()
    batch = session.batch
    by_class = {row["key"]: row for row in metrics["by_target_class"]}
    # Class V (= 10, "no previous token" at position 0) is read from the position embedding,
    # so it stays right with both copying heads gone; every sequence has one such position.
    assert by_class[10]["n"] == N_EVAL
    assert by_class[10]["accuracy"] == {"clean": 1.0, "ablated": 1.0}
    counts = torch.bincount(batch.targets[batch.mask])
    assert {k: r["n"] for k, r in by_class.items()} == {
        k: int(c) for k, c in enumerate(counts) if c > 0
    }
    tokens = torch.bincount(batch.tokens[batch.mask])
    assert [r["n"] for r in metrics["by_query_token"]] == [int(c) for c in tokens if c > 0]
    assert sum(r["n"] for r in metrics["by_query_token"]) == metrics["overall"]["n_scored"]


def test_example_tokens_predictions_and_attention(session):
    batch = session.batch
    example = session.set_heads("L0H0,L0H2").example(3)
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
        session.set_method("noise")
    with pytest.raises(ValueError, match="index"):
        session.example(N_EVAL)
    assert session.ablated == ["L0H1"]
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
    pd.DataFrame({"head_label": ["L0H0", "L0H1"], "label": ["previous", None]}).to_csv(
        analysis / "specialization_heads.csv", index=False
    )
    pd.DataFrame(
        {"head_label": ["L0H0", "L0H0"], "method": ["zero", "mean"], "delta_accuracy": [-0.5, -0.2]}
    ).to_csv(analysis / "ablation_importance.csv", index=False)
    pd.DataFrame(
        {"head_label": ["L0H0"], "by": ["token"], "selectivity": [0.7], "p_adj": [0.01]}
    ).to_csv(analysis / "division_heads.csv", index=False)
    saved = SavedResults.load(tmp_path)
    assert saved.labels == {"L0H0": "previous"}
    assert saved.importance == {"mean": {"L0H0": -0.2}, "zero": {"L0H0": -0.5}}
    assert saved.division == {"L0H0": [{"by": "token", "selectivity": 0.7, "p_adj": 0.01}]}
    (analysis / "specialization_heads.csv").write_text("head_label\nL0H0\n")  # no label column
    (analysis / "division_heads.csv").write_bytes(b"\x00\xff not a csv")
    assert SavedResults.load(tmp_path).labels == {}
    assert SavedResults.load(tmp_path).division == {}


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
    assert state["run"] == "h2_seed0" and [r["id"] for r in state["runs"]] == [
        "h2_seed0",
        "h3_seed1",
    ]
    assert [(h["label"], h["role"]) for h in state["heads"]] == [
        ("L0H0", "previous"),
        ("L0H1", "dead"),
    ]
    assert state["thumbnails"]["L0H0"][3][2] > 0.99  # average pattern: previous token
    assert state["view"]["importance"] == {"L0H0": -0.25, "L0H1": 0.0}  # the saved table
    other = explorer.handle("run", {"run": "h3_seed1"})
    assert other["n_heads"] == 3 and other["heads"][1]["role"] is None
    assert other["view"]["importance"]["L0H0"] == 0.0  # computed: the other head backs it up


def test_a_damaged_run_is_one_line_and_the_others_stay_usable(tmp_path, task, capsys):
    sweep = tmp_path / "sweep"
    write_json(sweep / "sweep.json", {"task": task.name})
    make_run(sweep / "runs" / "h1_seed0", handbuilt_model(["previous"], d_head=48), task)
    make_run(sweep / "runs" / "h3_seed0", handbuilt_model(["previous", "uniform", "dead"]), task)
    (sweep / "runs" / "h3_seed0" / "model.safetensors").write_bytes(b"not safetensors")
    explorer = Explorer.from_path(sweep, n_eval=N_EVAL)
    with pytest.raises(BadRequestError, match="cannot load the run .*h3_seed0"):
        explorer.handle("run", {"run": "h3_seed0"})
    assert explorer.handle("state")["run"] == "h1_seed0"
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


def _get(port, path, method="GET", body=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, body=body)
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


@pytest.mark.slow
def test_cli_serves_a_run_and_stops_on_ctrl_c(sweep_dir):
    """The real command in a subprocess: it serves, answers clicks, and Ctrl-C ends it (130)."""
    import signal
    import subprocess
    import sys
    import time

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
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = _get(port, "/api/state")
                break
            except ConnectionError:
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.1)
        assert status == 200 and [r["id"] for r in json.loads(body)["runs"]] == [
            "h2_seed0",
            "h3_seed1",
        ]
        status, body = _get(port, "/api/run", "POST", json.dumps({"run": "h3_seed1"}))
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
