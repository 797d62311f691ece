"""A user's own task through the whole CLI: ``--task-module`` on every command that builds or
loads a task, a run folder that records the task's module, and no import without the user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mhainterp.cli import main
from mhainterp.tasks import list_tasks, plugins, unregister_task
from mhainterp.training import evaluate, load_run

TRAIN = ["--task", "two_back", "--task-param", "seq_len=8", "--n-heads", "2", "--d-model", "16"]
TINY = ["--steps", "20", "--batch-size", "16", "--warmup-steps", "2", "--n-eval", "64"]


def _forget_user_tasks() -> None:
    """What a fresh process knows: the built-ins only."""
    if "two_back" in list_tasks():
        unregister_task("two_back")
    plugins._loaded.clear()


def _before_loss(ablate_output: str) -> float:
    line = next(line for line in ablate_output.splitlines() if line.startswith("loss"))
    return float(line.split()[1])


def test_tasks_lists_a_users_task_with_the_file_that_defines_it(user_task_file, capsys):
    assert main(["tasks", "--task-module", str(user_task_file)]) == 0
    out = capsys.readouterr().out
    assert "\ntwo_back\n  Copy the token two back" in out
    assert "relations: two_back; targets: two_back; causal" in out
    assert f"defined in: {user_task_file.resolve()}" in out
    assert "defined in: mhainterp" not in out  # built-ins are not annotated


def test_a_run_of_a_users_task_needs_the_module_named_on_the_command_line(
    user_task_file, tmp_path, capsys
):
    run = tmp_path / "run"
    args = ["train", "--task-module", str(user_task_file), *TRAIN, *TINY, "--quiet"]
    assert main([*args, "--out", str(run)]) == 0
    record = json.loads((run / "config.json").read_text())["task"]
    assert record == {
        "name": "two_back",
        "params": {"seq_len": 8, "d_vocab": 10, "min_len": 8},
        "module": str(user_task_file.resolve()),
    }
    _forget_user_tasks()
    capsys.readouterr()
    assert main(["ablate", str(run), "--heads", "L0H1", "--n-eval", "64"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert f"task 'two_back' is not registered; it was defined in {user_task_file.resolve()}" in (
        error
    )
    assert f"--task-module {user_task_file.resolve()}" in error
    assert "two_back" not in list_tasks()  # the run folder's module was not imported
    ablate = ["ablate", str(run), "--heads", "L0H1", "--n-eval", "64"]
    assert main([*ablate, "--task-module", str(user_task_file)]) == 0
    loaded = load_run(run)
    expected = evaluate(loaded.model, loaded.task, n_eval=64)["loss"]
    assert _before_loss(capsys.readouterr().out) == pytest.approx(expected, abs=5e-5)


def test_every_command_that_builds_or_loads_a_task_takes_task_module(capsys):
    for command in ("tasks", "train", "sweep", "analyze", "demo", "ablate", "specialize", "report"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--task-module PATH_OR_MODULE" in capsys.readouterr().out, command


def test_a_task_module_that_cannot_load_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["tasks", "--task-module", str(tmp_path / "nope.py")]) == 2
    assert capsys.readouterr().err == (
        f"mhainterp tasks: error: task module '{tmp_path / 'nope.py'}': no such file "
        f"({tmp_path / 'nope.py'})\n"
    )


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [sys.executable, "-m", "mhainterp.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow
def test_a_users_task_file_trains_then_is_analysed_ablated_and_specialized_in_fresh_processes(
    user_task_file, tmp_path
):
    run, task_file = tmp_path / "run", str(user_task_file)
    done = _cli("train", "--task-module", task_file, *TRAIN, *TINY, "--quiet", "--out", str(run),
                cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    refused = _cli("analyze", str(run), "--quiet", cwd=tmp_path)
    assert refused.returncode == 2 and "--task-module" in refused.stderr
    assert refused.stderr.count("\n") == 1
    analysed = _cli("analyze", str(run), "--quiet", "--n-eval", "64", "--no-ablation",
                    "--task-module", task_file, cwd=tmp_path)  # fmt: skip
    assert analysed.returncode == 0, analysed.stderr
    stats = pd.read_csv(run / "analysis" / "head_statistics.csv").set_index(
        ["head_label", "metric"]
    )
    for head in ("L0H0", "L0H1"):
        # The user's relation (key two back) is measured over the 64 x 6 queries that have one,
        # and its total mass equals the generic offset -2 statistic's (over the 64 x 7 queries
        # that have any earlier key).
        own, offset = (
            stats.loc[(head, "relation_mass:two_back")],
            stats.loc[(head, "offset_mass:-2")],
        )
        assert own["n_queries"] == 64 * 6
        assert own["value"] * own["n_queries"] == pytest.approx(
            offset["value"] * offset["n_queries"]
        )
    ablated = _cli("ablate", str(run), "--heads", "L0H0", "--n-eval", "64",
                   "--task-module", task_file, cwd=tmp_path)  # fmt: skip
    assert ablated.returncode == 0, ablated.stderr
    _forget_user_tasks()
    plugins.load_task_module(task_file)
    loaded = load_run(run)
    expected = evaluate(loaded.model, loaded.task, n_eval=64)["loss"]
    assert _before_loss(ablated.stdout) == pytest.approx(expected, abs=5e-5)
    specialized = _cli("specialize", str(run), "--quiet", "--n-eval", "64",
                       "--task-module", task_file, cwd=tmp_path)  # fmt: skip
    assert specialized.returncode == 0, specialized.stderr
    heads = pd.read_csv(run / "analysis" / "specialization_heads.csv")
    assert heads["head_label"].tolist() == ["L0H0", "L0H1"]
    for label, row in zip(heads["head_label"], heads["label"]):
        assert f"| {label} | {row} |" in specialized.stdout
