"""``mhainterp report`` killed (SIGKILL) at random moments and run again: the rerun succeeds
and writes exactly what an uninterrupted run writes (issue 21 item 1: a half-written
``specialization_consistency.csv`` used to make the rerun fail with EmptyDataError)."""

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

pytestmark = [pytest.mark.slow, pytest.mark.signals]

MHAINTERP = str(Path(sys.executable).with_name("mhainterp"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same arithmetic in every process
REPORT_ARGS = ["--n-eval", "32", "--by", "token,position", "--quiet"]


def _report(sweep: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [MHAINTERP, "report", str(sweep), *REPORT_ARGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def _outputs(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``: tables, notes, figures (PNG and PDF), the report, and any
    temp file a killed write left (there must be none)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}  # fmt: skip


def test_report_killed_at_random_moments_reruns_to_the_same_files(tiny_sweep, tmp_path):
    reference = tmp_path / "reference" / "sweep"
    killed = tmp_path / "killed" / "sweep"
    for folder in (reference, killed):
        shutil.copytree(tiny_sweep, folder)
    start = time.monotonic()
    process = _report(reference)
    _, err = process.communicate(timeout=600)
    seconds = time.monotonic() - start
    assert process.returncode == 0, err
    rng = random.Random(21)
    delays = []
    for _ in range(3):
        delay = rng.uniform(0.5 * seconds / 3, seconds)  # past the imports, up to the end
        delays.append(round(delay, 2))
        process = _report(killed)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.communicate()
    process = _report(killed)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, f"rerun after kills at {delays} s failed: {err}"
    want, got = _outputs(reference), _outputs(killed)
    assert got.keys() == want.keys(), delays
    differ = [name for name, data in want.items() if got[name] != data]
    assert differ == [], f"differ after kills at {delays} s: {differ}"
    assert list(killed.rglob("*.tmp")) == [], delays
