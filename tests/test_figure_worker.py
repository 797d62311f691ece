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
    """Kills the worker process (leaving ``path.died``); in the parent, draws."""
    if os.getpid() != parent:
        path.with_suffix(".died").touch()
        os._exit(3)
    _write_pid(path)


def _wait_for(flag: Path, path: Path) -> None:
    """Draws only once ``flag`` exists (never, in the Ctrl-C test)."""
    while not flag.exists():
        time.sleep(0.05)
    _write_pid(path)


def _wait_up_to_30_s_for(flag: Path, path: Path) -> None:
    """Draws once ``flag`` exists, or after 30 s (a test that fails must not hang); leaves
    ``path.started`` first."""
    path.with_suffix(".started").touch()
    deadline = time.monotonic() + 30
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    _write_pid(path)


def _write_pid_then(path: Path, flag: Path) -> None:
    """Draws, then lets the figures waiting for ``flag`` go on."""
    _write_pid(path)
    flag.touch()


def _call(function, path: Path) -> None:
    function(path)


def _measure_js(model, tokens, path: Path) -> None:
    """A torch job: the JS similarity of ``model``'s heads, saved as CSV."""
    from mhainterp.similarity import head_similarity

    head_similarity(model, tokens, method="js").to_csv(path)
    _write_pid(path.with_suffix(".pid"))


def _wait_until_exists(path: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was not written in {seconds} s"
        time.sleep(0.02)


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
        figures.draw(_write_pid, there / "pid")
        figures.draw(plot_similarity_heatmap, _similarity(), method="js", path=there / "s.png")
        for suffix in (".png", ".pdf", ".csv"):  # else this process may draw it, at wait()
            _wait_until_exists(there / f"s{suffix}")
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
        _wait_until_exists(tmp_path / "a.died")  # else this process may take "a" first
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


def test_the_tail_the_worker_has_not_started_is_drawn_here(tmp_path):
    """At the end this process draws what the worker has not started, last first, instead of
    waiting: the worker is stuck on its first figure until the last figure is drawn."""
    flag = tmp_path / "flag"
    with FigureQueue(background=True) as figures:
        figures.draw(_wait_up_to_30_s_for, flag, tmp_path / "0")
        for i in (1, 2, 3):  # at most two of them are handed to the worker ahead of time
            figures.draw(_write_pid, tmp_path / str(i))
        figures.draw(_write_pid_then, tmp_path / "4", flag)
        _wait_until_exists(tmp_path / "0.started")
    drawn_by = {i: int((tmp_path / str(i)).read_text()) for i in range(5)}
    assert drawn_by[4] == os.getpid()  # the last: drawn here, so the first one could end
    assert drawn_by[0] != os.getpid()


def test_kept_objects_reach_the_worker_without_pickling(tmp_path):
    figures = FigureQueue(background=True)
    with figures:
        unpicklable = lambda path: _write_pid(path)  # noqa: E731 (a lambda cannot be pickled)
        kept = figures.keep(unpicklable)
        figures.draw(_call, kept, tmp_path / "pid")
        _wait_until_exists(tmp_path / "pid")  # drawn by the worker, not stolen at wait()
        with pytest.raises(RuntimeError, match="keep.. must come before the first draw"):
            figures.keep(unpicklable)  # the worker is forked: it would not see it
    assert int((tmp_path / "pid").read_text()) != os.getpid()
    assert not figures._kept  # forgotten when the queue closes
    with FigureQueue(background=False) as here:
        assert here.keep(unpicklable) is unpicklable


def test_torch_jobs_go_to_the_worker_only_on_the_cpu_from_one_thread():
    import torch

    from mhainterp.runtime import torch_threads

    with torch_threads(1):
        assert FigureQueue(background=True).runs_torch("cpu")
        assert not FigureQueue(background=True).runs_torch("cuda")  # no CUDA after a fork
        assert not FigureQueue(background=False).runs_torch("cpu")
    with torch_threads(2):  # a forked child could hang in an OpenMP region: never there
        assert torch.get_num_threads() == 2
        assert not FigureQueue(background=True).runs_torch("cpu")


def test_a_figure_is_claimed_once_and_late_figures_are_the_workers():
    from mhainterp.figures.background import _Claims

    claims = _Claims()
    assert claims.claim(3, here=True) and not claims.claim(3, here=False)
    assert claims.claim(4, here=False) and not claims.claim(4, here=True)
    beyond = _Claims.SIZE  # past the shared table: never taken over here
    assert not claims.claim(beyond, here=True) and claims.claim(beyond, here=False)


def test_a_torch_job_in_the_worker_gives_the_same_bits(tmp_path):
    import torch

    from mhainterp.model.handbuilt import handbuilt_model
    from mhainterp.runtime import torch_threads

    model = handbuilt_model(["previous", "uniform", "previous", "first"])
    tokens = torch.randint(0, 10, (64, 16), generator=torch.Generator().manual_seed(0))
    with torch_threads(1):
        _measure_js(model, tokens, tmp_path / "here.csv")
        with FigureQueue(background=True) as figures:
            assert figures.runs_torch("cpu")
            kept = figures.keep(model)
            figures.draw(_measure_js, kept, tokens, tmp_path / "there.csv")
            _wait_until_exists(tmp_path / "there.pid")  # measured there, not taken over here
    assert int((tmp_path / "there.pid").read_text()) != os.getpid()
    assert (tmp_path / "here.csv").read_bytes() == (tmp_path / "there.csv").read_bytes()


def _interrupt(path: Path) -> None:
    raise KeyboardInterrupt


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_ctrl_c_while_waiting_stops_the_worker_at_once(tmp_path):
    figures = FigureQueue(background=True)
    with pytest.raises(KeyboardInterrupt), figures:
        figures.draw(_wait_up_to_30_s_for, tmp_path / "never", tmp_path / "0")
        figures.draw(_interrupt, tmp_path / "1")  # taken over here at the end: Ctrl-C there
        _wait_until_exists(tmp_path / "0.started")
        processes = list(figures._pool._processes.values())
    for process in processes:
        assert _ends(process.pid, seconds=10)
    assert not (tmp_path / "0").exists()  # stopped, not waited for
