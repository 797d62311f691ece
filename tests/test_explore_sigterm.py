"""``mhainterp explore`` on SIGTERM: one line and exit 130, as Ctrl-C (README: "Ctrl-C and
SIGTERM end with one line and exit 130"). It exited 143 in silence: the CLI leaves explore's
signals to the command, and the server loop installed no SIGTERM handler (audit item 6)."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest

from mhainterp.config import TrainConfig
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.tasks import get_task
from mhainterp.training import evaluate, save_run

N_EVAL = 64


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A saved run of a hand-built previous-token model (no training)."""
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "uniform"], d_head=24)
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    eval_metrics = {**evaluate(model, task, n_eval=N_EVAL), "status": "finished"}
    path = tmp_path_factory.mktemp("runs") / "h2_seed0"
    return save_run(model, task, path, TrainConfig(seed=0), metrics, eval_metrics)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_state(port: int, timeout: float = 120) -> int:
    """``GET /api/state`` until the explorer answers (503: still loading)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("GET", "/api/state")
            response = connection.getresponse()
            status, body = response.status, response.read()
        except ConnectionError:
            status = None
        if status is not None and status != 503:
            assert status == 200 and json.loads(body)["run"] == "h2_seed0"
            return status
        time.sleep(0.1)
    pytest.fail("the server did not answer")


@pytest.mark.slow
@pytest.mark.signals
def test_sigterm_stops_explore_with_one_line_and_exit_130(run_dir):
    pytest.importorskip("uvicorn")
    port = _free_port()
    command = [sys.executable, "-m", "mhainterp.cli", "explore", str(run_dir), "--no-browser"]
    command += ["--port", str(port), "--n-eval", str(N_EVAL)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert f"at http://127.0.0.1:{port}/" in process.stdout.readline()
        _wait_for_state(port)  # serving: the signal lands in the server loop
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert err.strip().splitlines() == ["mhainterp explore: stopped"]
