"""The `mhainterp` command: tasks, train, sweep (run in-process through cli.main)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mhainterp.cli import main
from mhainterp.tasks import list_tasks

TINY_TRAIN = [
    "--steps",
    "10",
    "--batch-size",
    "8",
    "--warmup-steps",
    "2",
    "--n-eval",
    "32",
    "--quiet",
]


def test_a_reader_that_closes_the_pipe_early_gets_no_error_line():
    # `mhainterp tasks | head` printed "mhainterp tasks: error: Broken pipe" and exit 2
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    command = [str(Path(sys.executable).with_name("mhainterp")), "tasks"]
    result = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True,
                            timeout=120)  # fmt: skip
    os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


def test_tasks_lists_every_task_with_its_relations(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for name in list_tasks():
        assert f"\n{name}\n" in f"\n{out}"
    assert "relations: mirror" in out
    assert "layers >= 2" in out  # induction


def test_help_explains_the_sweep(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--n-heads" in out and "seed" in out and "example:" in out


def test_train_writes_a_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--task",
            "reverse",
            "--task-param",
            "seq_len=6",
            "--task-param",
            "d_vocab=4",
            "--n-heads",
            "2",
            "--d-model",
            "8",
            "--seed",
            "3",
            "--out",
            str(out),
            *TINY_TRAIN,
        ]
    )
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["n_heads"] == 2 and config["model"]["seed"] == 3
    assert config["task"]["params"]["seq_len"] == 6
    assert config["train"]["steps"] == 10
    assert "accuracy:" in capsys.readouterr().out


def test_sweep_prints_table_and_writes_figures(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = [
        "sweep",
        "--task",
        "reverse",
        "--task-param",
        "seq_len=6",
        "--task-param",
        "d_vocab=4",
        "--n-heads",
        "1,2",
        "--seeds",
        "0,1",
        "--d-model",
        "8",
        "--out",
        str(out),
        *TINY_TRAIN,
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| n_heads | d_head |" in printed and "| accuracy | h=1 → 2 |" in printed
    for name in (
        "results.csv",
        "summary.md",
        "summary_table.csv",
        "summary_comparisons.csv",
        "head_count_accuracy.png",
        "head_count_accuracy.csv",
        "training_curves.png",
        "training_curves.csv",
    ):
        assert (out / name).is_file(), name
    curves = pd.read_csv(out / "training_curves.csv")
    assert sorted(curves.groupby(["n_heads", "seed"]).size().index) == [
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    assert (out / "head_count_accuracy.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--task", "nope", "--out", "x"], "count_previous"),
        (
            ["sweep", "--n-heads", "1,3", "--out", "x"],
            "head counts that divide d_model; [3] do not divide d_model=64",
        ),
        (["train", "--task", "reverse", "--task-param", "colour=3", "--out", "x"], "seq_len"),
    ],
)
def test_user_errors_are_one_line_with_what_is_allowed(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
