"""`mhainterp ablate` on run folders of hand-built models: printed numbers with known answers."""

from __future__ import annotations

import io
import re
import sys

import pandas as pd
import pytest

from mhainterp import cli
from mhainterp.ablation import Ablator
from mhainterp.config import TrainConfig
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.tasks import get_task
from mhainterp.training import build_model, evaluate, save_run

EVAL = ["--n-eval", "128"]
ROW = re.compile(r"^(loss|accuracy\S*)\s+(-?\d+\.\d{4})\s+(-?\d+\.\d{4})\s+([+-]\d+\.\d{4})$")


@pytest.fixture(autouse=True)
def ablate_command(monkeypatch):
    # The lead lists mhainterp.cli.ablate in COMMAND_MODULES; test it on its own here.
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("mhainterp.cli.ablate",))


def make_run(path, model, task):
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    eval_metrics = {**evaluate(model, task, n_eval=128), "status": "finished"}
    return str(save_run(model, task, path, TrainConfig(), metrics, eval_metrics))


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=16, d_vocab=10)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, task):
    model = handbuilt_model(["previous", "uniform", "previous"])
    return make_run(tmp_path_factory.mktemp("runs") / "handbuilt", model, task)


@pytest.fixture(scope="module")
def uniform_only(task):
    """Known answer: accuracy with both previous-token heads removed (zero ablation)."""
    return evaluate(handbuilt_model(["uniform"], d_head=48), task, n_eval=128)


def tables(text: str) -> list[dict[str, tuple[float, float, float]]]:
    """Every printed metrics table, in order: metric -> (before, after, change)."""
    found: list[dict[str, tuple[float, float, float]]] = []
    for line in text.splitlines():
        if line.startswith("metric"):
            found.append({})
        elif (match := ROW.match(line)) and found:
            found[-1][match[1]] = tuple(float(match[i]) for i in (2, 3, 4))
    return found


def test_one_shot_before_after_table(run_dir, uniform_only, capsys):
    code = cli.main(["ablate", run_dir, "--heads", "L0H0,L0H2", "--method", "zero", *EVAL])
    out = capsys.readouterr().out
    assert code == 0
    assert "method: zero  ablated: L0H0, L0H2  (128 evaluation sequences)" in out
    (table,) = tables(out)
    before, after, change = table["accuracy"]
    assert before == 1.0
    assert after == pytest.approx(uniform_only["accuracy"], abs=5e-5)
    assert change == pytest.approx(after - 1.0, abs=1e-4)
    assert table["loss"][1] == pytest.approx(uniform_only["loss"], abs=5e-5)


def test_one_shot_uniform_head_changes_nothing(run_dir, capsys):
    assert cli.main(["ablate", run_dir, "--heads", "L0H1", "--method", "mean", *EVAL]) == 0
    (table,) = tables(capsys.readouterr().out)
    assert table["accuracy"] == (1.0, 1.0, 0.0)
    assert table["loss"] == (0.0, 0.0, 0.0)


def test_per_target_rows(tmp_path, capsys):
    multi = get_task("multi_relation", seq_len=8, d_vocab=5)
    model = build_model(multi, d_model=32, n_heads=4, seed=1)
    path = make_run(tmp_path / "multi", model, multi)
    assert cli.main(["ablate", path, "--heads", "L0H3", "--method", "resample", *EVAL]) == 0
    (table,) = tables(capsys.readouterr().out)
    assert list(table) == [
        "loss",
        "accuracy",
        "accuracy/previous",
        "accuracy/mirror",
        "accuracy/count_previous",
    ]
    expected = Ablator(model, multi, method="resample", n_eval=128).set("L0H3").evaluate()
    for metric, (before, after, _) in table.items():
        assert after == pytest.approx(expected[metric], abs=5e-5)
        assert before == pytest.approx(expected[metric] - expected[f"delta_{metric}"], abs=5e-5)


def test_interactive_session(run_dir, uniform_only, monkeypatch, capsys):
    script = "\n".join(
        [
            "list",
            "toggle L0H0",  # one previous head: backed up by the other
            "toggle L0H2",  # both: destroyed
            "list",
            "method mean",
            "set L0H1",  # only the uniform head
            "toggle L0H9",  # error, state unchanged
            "method median",  # error
            "frobnicate",
            "reset",
            "eval",
            "help",
            "quit",
            "toggle L0H0",  # never read
        ]
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO(script + "\n"))
    assert cli.main(["ablate", run_dir, "--interactive", *EVAL]) == 0
    out = capsys.readouterr().out
    found = tables(out)
    accuracy = [t["accuracy"][1] for t in found]
    # start, toggle, toggle, method, set, reset, eval
    assert len(found) == 7
    assert accuracy[:2] == [1.0, 1.0]
    assert accuracy[2] == pytest.approx(uniform_only["accuracy"], abs=5e-5)
    assert accuracy[3] < 0.5  # mean-ablating both previous heads also destroys it
    assert accuracy[4:] == [1.0, 1.0, 1.0]
    assert all(t["accuracy"][0] == 1.0 for t in found)
    assert "layer 0:  [ ] L0H0  [ ] L0H1  [ ] L0H2" in out
    assert "layer 0:  [x] L0H0  [ ] L0H1  [x] L0H2" in out
    assert "method: mean  ablated: L0H1" in out
    assert "error: head='L0H9' is invalid: valid heads for this model: L0H0, L0H1, L0H2" in out
    assert "error: method='median' is invalid: one of 'zero', 'mean', 'resample'" in out
    assert "unknown command 'frobnicate'" in out
    assert "toggle HEAD[,HEAD]" in out


def test_interactive_end_of_input_quits_cleanly(run_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("toggle L0H0 L0H2\n"))
    assert cli.main(["ablate", run_dir, "--interactive", "--method", "zero", *EVAL]) == 0
    found = tables(capsys.readouterr().out)
    assert len(found) == 2 and found[1]["accuracy"][1] < 0.5


def test_interactive_head_alone_toggles_like_toggle(run_dir, monkeypatch, capsys):
    """Issue 19 item 16: ``L0H0`` alone is ``toggle L0H0``; ``L0H0,L0H2`` toggles both."""
    script = "L0H0\nL0H2\nlist\nL0H0,L0H2\nlist\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    assert cli.main(["ablate", run_dir, "--interactive", "--method", "zero", *EVAL]) == 0
    out = capsys.readouterr().out
    accuracy = [t["accuracy"][1] for t in tables(out)]
    assert len(accuracy) == 4  # start, L0H0, L0H2, L0H0,L0H2: one table per change
    assert accuracy[0] == accuracy[1] == 1.0  # one previous head is backed up by the other
    assert accuracy[2] < 0.5  # both previous heads gone
    assert accuracy[3] == 1.0  # both restored
    assert "layer 0:  [x] L0H0  [ ] L0H1  [x] L0H2" in out
    assert "layer 0:  [ ] L0H0  [ ] L0H1  [ ] L0H2" in out
    assert "unknown command" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--heads", "L0H9"],
            "head='L0H9' is invalid: valid heads for this model: L0H0, L0H1, L0H2",
        ),
        (["--heads", "L3H0"], "head='L3H0' is invalid: valid heads"),
        (["--heads", "head2"], "head='head2' is invalid: valid heads"),
        (["--heads", "L0H1", "--method", "avg"], "one of 'zero', 'mean', 'resample'"),
        ([], "--heads is invalid: the heads to ablate (--heads L0H1,L0H3) or --interactive"),
    ],
)
def test_errors_are_one_line(run_dir, argv, message, capsys):
    assert cli.main(["ablate", run_dir, *argv, *EVAL]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("mhainterp ablate: error: ")
    assert message in captured.err


def test_missing_run_folder(tmp_path, capsys):
    assert cli.main(["ablate", str(tmp_path / "nope"), "--heads", "L0H0"]) == 2
    assert (
        capsys.readouterr().err == f"mhainterp ablate: error: {tmp_path / 'nope'} does not exist\n"
    )
