"""Fault injection through the installed ``mhainterp`` command (issue 12), the slow half.

Each test runs ``mhainterp`` as a subprocess, as a user would, and does to it what happens to
real sweeps: SIGKILL at random points, two sweeps started at once on one folder, Ctrl-C, a
disk that fills up. The fast in-process versions are in ``test_reliability.py``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MHAINTERP = str(Path(sys.executable).with_name("mhainterp"))
SWEEP_ARGS = ["--task", "reverse", "--task-param", "seq_len=6", "--task-param", "d_vocab=4",
              "--d-model", "8", "--n-heads", "1,2,4", "--seeds", "0,1", "--steps", "150",
              "--batch-size", "8", "--warmup-steps", "10", "--n-eval", "32",
              "--quiet"]  # fmt: skip
RUN_FILES = ("config.json", "model.safetensors", "metrics.csv", "eval.json")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same arithmetic in every process


def _sweep(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [MHAINTERP, "sweep", *SWEEP_ARGS, *extra, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def _finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def _run_files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name in (*RUN_FILES, "results.csv")
    }


def _trained(log: Path) -> list[str]:
    """Every run a ``train`` line of sweep.log hands to an executor, in order."""
    names = []
    for line in log.read_text().splitlines():
        _stamp, _pid, event, runs, *_ = line.split(" ")
        if event == "train":
            names += runs.split(",")
    return names


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, float]:
    """An uninterrupted sweep through the command, and how long it took."""
    out = tmp_path_factory.mktemp("reference") / "sweep"
    start = time.monotonic()
    code, _, err = _finish(_sweep(out))
    assert code == 0, err
    return out, time.monotonic() - start


@pytest.fixture(scope="module")
def reference_local(tmp_path_factory) -> Path:
    """The same uninterrupted sweep with the local executor."""
    out = tmp_path_factory.mktemp("reference_local") / "sweep"
    code, _, err = _finish(_sweep(out, "--executor", "local"))
    assert code == 0, err
    return out


def test_sweep_killed_three_times_at_random_points_resumes_byte_identical(reference, tmp_path):
    ref, seconds = reference
    out = tmp_path / "killed"
    rng = random.Random(2024)
    delays = []
    for _ in range(3):
        delay = rng.uniform(0.5, seconds)  # from start-up to the last run's files
        delays.append(round(delay, 2))
        process = _sweep(out)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.communicate()
    code, _, err = _finish(_sweep(out))
    assert code == 0, err
    finished = _run_files(out)
    assert finished.keys() == _run_files(ref).keys(), delays
    for name, data in _run_files(ref).items():
        assert finished[name] == data, f"{name} differs after kills at {delays} s"
    assert list((out / "runs").rglob("*.tmp")) == [], delays


def test_two_sweeps_at_once_train_each_run_once_and_equal_the_serial_table(reference, tmp_path):
    ref, _ = reference
    out = tmp_path / "shared"
    first, second = _sweep(out), _sweep(out)
    results = [_finish(first), _finish(second)]
    for code, _, err in results:
        assert code == 0, err
    trained = _trained(out / "sweep.log")
    assert sorted(trained) == sorted(f"h{h}_seed{s}" for h in (1, 2, 4) for s in (0, 1)), (
        out / "sweep.log"
    ).read_text()
    assert _run_files(out) == _run_files(ref)


@pytest.mark.parametrize("executor", ["local", "batched"])
def test_ctrl_c_in_sweep_is_one_line_exit_130_and_resumable(reference, tmp_path, executor, request):
    ref, _ = reference
    out = tmp_path / executor
    process = _sweep(out, "--executor", executor)
    # Interrupt once training runs (Ctrl-C during the imports: the next test).
    while not (out / "sweep.log").is_file():
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    code, _, err = _finish(process, timeout=60)
    assert code == 130, err
    assert err.strip().splitlines() == [
        "mhainterp sweep: interrupted; run the same command again to resume"
    ]
    code, _, err = _finish(_sweep(out, "--executor", executor))
    assert code == 0, err
    # Byte-identical to an uninterrupted sweep with the same executor: the reference ran with
    # the default ("auto", batched on this machine); local's numbers agree with batched's to
    # float tolerance only, so it is compared with a local reference.
    expected = ref if executor == "batched" else request.getfixturevalue("reference_local")
    assert _run_files(out) == _run_files(expected)


@pytest.mark.parametrize("delay", [0.4, 1.0, 2.0])
def test_ctrl_c_while_the_command_still_imports_is_one_line_exit_130(tmp_path, delay):
    # Building the parser imports torch and TransformerLens (seconds on this machine): a
    # Ctrl-C then used to show Python's traceback. At any of these moments it is one line.
    process = _sweep(tmp_path / "sweep")
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    code, _, err = _finish(process, timeout=60)
    lines = err.strip().splitlines()
    assert code == 130, err
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err, err


def test_ctrl_c_in_the_interactive_ablate_session(reference, tmp_path):
    ref, _ = reference
    process = subprocess.Popen(
        [MHAINTERP, "ablate", str(ref / "runs" / "h2_seed0"), "--interactive"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    while "interactive ablation" not in process.stdout.readline():
        assert process.poll() is None, process.stderr.read()
    process.send_signal(signal.SIGINT)
    code, _, err = _finish(process, timeout=60)
    assert code == 130
    assert err.strip().splitlines() == [
        "mhainterp ablate: interrupted; run the same command again to resume"
    ]


def test_a_full_disk_is_one_line_and_the_sweep_resumes_when_space_is_freed(reference, tmp_path):
    """A real full disk: a tmpfs too small for the sweep (needs root and mount)."""
    ref, _ = reference
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}); "
                    "test_reliability.py simulates ENOSPC instead")  # fmt: skip
    try:
        out = disk / "sweep"
        code, _, err = _finish(_sweep(out))
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("mhainterp sweep: error: disk full: cannot write "), err
        assert "run the same command again to resume" in lines[0]
        assert list(out.rglob("*.tmp")) == []
        assert sum(1 for _ in out.rglob("eval.json")) < 6  # the disk filled before the end
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        code, _, err = _finish(_sweep(out))
        assert code == 0, err
        assert _run_files(out) == _run_files(ref)
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    shutil.rmtree(disk, ignore_errors=True)
