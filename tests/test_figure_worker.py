"""The figure worker (``mhainterp.figures.background``): figures drawn in a second process
while the first computes have the same bytes, errors and dead workers lose nothing, and
Ctrl-C does not wait for queued figures."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mhainterp.figures.background import WORKER_ENV, FigureQueue, background_figures
from mhainterp.figures.similarity import plot_similarity_heatmap


def _write_pid(path: Path) -> None:
    """A 'figure' that records which process drew it."""
    path.write_text(str(os.getpid()))


def _fail(path: Path) -> None:
    raise ValueError(f"cannot draw {path.name}")


def _die_unless_in(parent: int, path: Path) -> None:
    """Kills the worker process; in the parent, draws."""
    if os.getpid() != parent:
        os._exit(3)
    _write_pid(path)


def _wait_for(flag: Path, path: Path) -> None:
    """Draws only once ``flag`` exists (never, in the Ctrl-C test)."""
    while not flag.exists():
        time.sleep(0.05)
    _write_pid(path)


def _similarity() -> pd.DataFrame:
    heads = ["L0H0", "L0H1", "L0H2", "L0H3"]
    values = np.array(
        [[1.0, 0.9, 0.1, 0.2], [0.9, 1.0, 0.2, 0.1], [0.1, 0.2, 1.0, 0.8], [0.2, 0.1, 0.8, 1.0]]
    )
    return pd.DataFrame(values, index=heads, columns=heads)


def test_background_follows_the_argument_then_the_environment(monkeypatch):
    assert background_figures(False) is False
    monkeypatch.setenv(WORKER_ENV, "0")
    assert background_figures() is False
    assert background_figures(True) is True  # the argument wins
    monkeypatch.setenv(WORKER_ENV, "1")
    assert background_figures() is True
    monkeypatch.setenv(WORKER_ENV, "yes")  # a typo is refused, not read as "unset"
    with pytest.raises(ValueError, match="MHAINTERP_FIGURE_WORKER is invalid: 0 .* got 'yes'"):
        background_figures()


def test_a_figure_drawn_in_the_worker_has_the_same_bytes(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    with FigureQueue(background=False) as figures:
        figures.draw(plot_similarity_heatmap, _similarity(), method="js", path=here / "s.png")
    with FigureQueue(background=True) as figures:
        figures.draw(plot_similarity_heatmap, _similarity(), method="js", path=there / "s.png")
        figures.draw(_write_pid, there / "pid")
    assert int((there / "pid").read_text()) != os.getpid()  # drawn in another process
    for suffix in (".png", ".pdf", ".csv"):
        assert (here / f"s{suffix}").read_bytes() == (there / f"s{suffix}").read_bytes()


def test_without_the_worker_figures_are_drawn_at_once_in_this_process(tmp_path):
    with FigureQueue(background=False) as figures:
        figures.draw(_write_pid, tmp_path / "pid")
        assert int((tmp_path / "pid").read_text()) == os.getpid()


def test_a_failing_figure_raises_after_the_others_are_drawn(tmp_path):
    figures = FigureQueue(background=True)
    with pytest.raises(ValueError, match="cannot draw bad") as failure, figures:
        figures.draw(_write_pid, tmp_path / "first")
        figures.draw(_fail, tmp_path / "bad")
        figures.draw(_write_pid, tmp_path / "last")
    assert (tmp_path / "first").is_file() and (tmp_path / "last").is_file()
    if sys.version_info >= (3, 11):  # notes on exceptions
        assert f"while drawing the figure _fail ({tmp_path / 'bad'})" in failure.value.__notes__


def test_figures_of_a_dead_worker_are_drawn_here_with_a_warning(tmp_path):
    figures = FigureQueue(background=True)
    with pytest.warns(RuntimeWarning, match="figure worker process died"), figures:
        figures.draw(_die_unless_in, os.getpid(), tmp_path / "a")
        figures.draw(_write_pid, tmp_path / "b")
    assert int((tmp_path / "a").read_text()) == os.getpid()  # redrawn here, nothing lost
    assert (tmp_path / "b").is_file()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_ctrl_c_stops_the_worker_without_waiting_for_its_figures(tmp_path):
    figures = FigureQueue(background=True)
    with pytest.raises(KeyboardInterrupt), figures:
        figures.draw(_wait_for, tmp_path / "never", tmp_path / "drawn")
        processes = list(figures._pool._processes.values())
        raise KeyboardInterrupt
    for process in processes:  # reaped by the pool's thread, or a zombie: not running
        assert _ends(process.pid)
    assert not (tmp_path / "drawn").exists()


def _ends(pid: int, seconds: float = 30.0) -> bool:
    """Whether process ``pid`` ends (is gone or a zombie) within ``seconds`` (Linux ``/proc``;
    ``is_alive()`` cannot tell: the pool's own thread may reap it first)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_killed_process_leaves_no_orphan_worker(tmp_path):
    """SIGKILL gives the process no chance to stop its worker: the kernel does
    (PR_SET_PDEATHSIG), so a killed ``analyze`` leaves nothing drawing behind it."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from mhainterp.figures.background import FigureQueue\n"
        "from test_figure_worker import _wait_for\n"
        "figures = FigureQueue(background=True)\n"
        "figures.draw(_wait_for, Path(sys.argv[1]) / 'never', Path(sys.argv[1]) / 'drawn')\n"
        "print(*figures._pool._processes, flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        worker = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    assert _ends(worker)
