"""Nothing lost, nothing silently wrong (issue 12), the fast half.

Real faults where a test can make them in-process: a forked child killed by SIGKILL, a lock
held by another process, a SIGINT delivered to this process, a folder this user cannot write,
a write that fails with ENOSPC. The end-to-end versions through the installed command are in
``test_faults.py`` (slow).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import stat
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_SWEEP
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

import mhainterp.io as mio
import mhainterp.training.run_folder as run_folder
from mhainterp.cli import main
from mhainterp.config import TrainConfig
from mhainterp.errors import RunFolderError, RunLockedError
from mhainterp.io import RunLock, atomic_path, write_csv, write_text
from mhainterp.runs import RUN_FILES, is_finished_run, read_results, resolve_run_dir
from mhainterp.sweep import execute_run, plan_sweep, run_sweep, summarize
from mhainterp.tasks import get_task
from mhainterp.training import ARCHITECTURE_FIELDS, build_model, load_run, save_run

TINY_ARGS = ["--task", "reverse", "--task-param", "seq_len=6", "--task-param", "d_vocab=4",
             "--d-model", "8", "--steps", "10", "--batch-size", "8", "--warmup-steps", "2",
             "--n-eval", "32", "--quiet"]  # fmt: skip


def _files(folder: Path) -> dict[str, bytes]:
    """Every run file under ``folder`` by relative path (the lock and log files aside)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name in RUN_FILES
    }


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ----- 5. files: umask, fsync, relative paths -----------------------------------------------------
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_text(tmp_path / "a.txt", "x")
        write_csv(tmp_path / "b.csv", pd.DataFrame({"a": [1]}))
        task = get_task("reverse", seq_len=6, d_vocab=4)
        model = build_model(task, d_model=8, n_heads=2)
        save_run(model, task, tmp_path / "run", TrainConfig(), pd.DataFrame(), {})
    finally:
        os.umask(old)
    for path in (tmp_path / "a.txt", tmp_path / "b.csv", tmp_path / "run" / "model.safetensors"):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def test_atomic_write_flushes_file_then_renames_then_flushes_folder(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", stat.S_ISDIR(os.fstat(fd).st_mode)))
        real_fsync(fd)

    def replace(src, dst):
        calls.append(("replace", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_text(tmp_path / "a.txt", "hello")
    assert calls == [("fsync", False), ("replace", "a.txt"), ("fsync", True)]
    assert (tmp_path / "a.txt").read_text() == "hello"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "eval.json"
    target.write_text("old")
    with pytest.raises(OSError, match="No space"), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]


def test_results_csv_paths_are_relative_and_identical_across_folders(tiny_sweep, tmp_path):
    other = tmp_path / "elsewhere" / "sweep"
    table = run_sweep(TINY_SWEEP, other, executor="local", progress=False)
    assert (other / "results.csv").read_bytes() == (tiny_sweep / "results.csv").read_bytes()
    stored = pd.read_csv(other / "results.csv")
    assert stored["run_dir"].tolist() == ["runs/h1_seed0", "runs/h1_seed1", "runs/h2_seed0",
                                          "runs/h2_seed1"]  # fmt: skip
    # the returned table and read_results point at the folders from here
    names = ("h1_seed0", "h1_seed1", "h2_seed0", "h2_seed1")
    assert table["run_dir"].tolist() == [str(other / "runs" / n) for n in names]
    assert read_results(other)["run_dir"].tolist() == table["run_dir"].tolist()
    # a moved sweep folder still finds its runs
    moved = tmp_path / "moved"
    shutil.move(other, moved)
    assert read_results(moved)["run_dir"].tolist() == [
        str(moved / "runs" / n) for n in ("h1_seed0", "h1_seed1", "h2_seed0", "h2_seed1")
    ]


def test_old_tables_with_absolute_or_start_relative_paths_still_resolve(tiny_sweep, tmp_path):
    sweep = tmp_path / "old"
    shutil.copytree(tiny_sweep, sweep)
    table = pd.read_csv(sweep / "results.csv")
    table["run_dir"] = [str(sweep / r) for r in table["run_dir"]]  # absolute, as before
    table.to_csv(sweep / "results.csv", index=False)
    assert read_results(sweep)["run_dir"].tolist() == table["run_dir"].tolist()
    names = ["h1_seed0", "h1_seed1", "h2_seed0", "h2_seed1"]
    table["run_dir"] = [f"runs/quickstart/old/runs/{n}" for n in names]  # old cwd-based
    table.to_csv(sweep / "results.csv", index=False)
    assert read_results(sweep)["run_dir"].tolist() == [str(sweep / "runs" / n) for n in names]
    assert resolve_run_dir("/gone/runs/h2_seed1", sweep) == sweep / "runs" / "h2_seed1"


# ----- 2. weights carry their architecture --------------------------------------------------------
def test_weights_metadata_repeats_the_architecture_and_load_refuses_a_mismatch(
    tiny_sweep, tmp_path
):
    run = tmp_path / "run"
    shutil.copytree(tiny_sweep / "runs" / "h2_seed0", run)
    with safe_open(str(run / "model.safetensors"), "pt") as weights:
        saved = json.loads(weights.metadata()["mhainterp.model"])
    assert sorted(saved) == sorted(ARCHITECTURE_FIELDS)
    assert saved["n_heads"] == 2 and saved["d_model"] == 8 and saved["d_head"] == 4
    assert saved["n_ctx"] == 6 and saved["d_vocab"] == 4 and saved["n_targets"] == 1
    assert saved["causal"] is False and saved["attn_only"] is True
    config = json.loads((run / "config.json").read_text())
    config["model"].update(n_heads=4, d_head=2)
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(RunFolderError) as error:
        load_run(run)
    assert "n_heads=4 in config.json but 2 in the weights" in str(error.value)
    assert str(run / "config.json") in str(error.value)


def test_old_weights_without_metadata_load_and_warn_when_nothing_can_be_checked(
    tiny_sweep, tmp_path
):
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(tiny_sweep / "runs" / "h2_seed0", run)
    save_file(load_file(run / "model.safetensors"), run / "model.safetensors")  # no metadata
    saved = json.loads((run / "eval.json").read_text())  # nor, in an old run, its record
    (run / "eval.json").write_text(
        json.dumps({k: v for k, v in saved.items() if k not in ("weights_sha256", "trained_on")})
    )
    assert load_run(run).model.cfg.n_heads == 2  # checked by eval.json's loss: no warning
    # a run saved by hand (save_run with metrics of one's own): no status, no loss
    (run / "eval.json").write_text(json.dumps({"note": "saved by hand"}))
    with pytest.warns(UserWarning, match="cannot be checked"):
        load_run(run)


# ----- 3. one head count --------------------------------------------------------------------------
def test_single_head_count_sweep_writes_summary_and_figures(tmp_path, capsys):
    out = tmp_path / "one"
    code = main(["sweep", *TINY_ARGS, "--n-heads", "2", "--seeds", "0,1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    for name in ("results.csv", "summary.md", "summary_table.csv", "summary_comparisons.csv",
                 "head_count_accuracy.png", "training_curves.png"):  # fmt: skip
        assert (out / name).is_file(), name
    results = pd.read_csv(out / "results.csv")
    summary = summarize(results)
    acc = results["val_accuracy"]
    assert summary.table["val_accuracy_std"].item() == pytest.approx(acc.std(ddof=1))
    assert summary.comparisons.empty and "verdict" in summary.comparisons.columns
    assert f"(std {acc.std(ddof=1):.4f})" in (out / "summary.md").read_text()
    assert "one head count (h=2)" in capsys.readouterr().out


# ----- 4. one-line errors -------------------------------------------------------------------------
def test_lr_inf_is_rejected_like_nan(capsys):
    for value in ("inf", "nan", "-inf"):
        with pytest.raises(ValueError, match="lr="):
            TrainConfig(lr=float(value))
        assert main(["train", *TINY_ARGS, f"--lr={value}", "--out", "never"]) == 2
        assert "lr=" in _one_line(capsys.readouterr().err)
    assert not Path("never").exists()


def test_out_that_is_a_file_or_inside_one_is_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for out in (afile, afile / "run"):
        for command in ("train", "sweep"):
            assert main([command, *TINY_ARGS, "--out", str(out)]) == 2
            line = _one_line(capsys.readouterr().err)
            assert str(out) in line and ("is a file" in line or "inside a file" in line), line
    assert afile.read_text() == "keep me"


def test_out_in_a_read_only_folder_is_one_line(capsys):
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="mhainterp-ro-"))  # in /tmp: every user can reach it
    base.chmod(0o755)
    locked = base / "readonly"
    locked.mkdir()
    locked.chmod(0o555)
    as_root = os.geteuid() == 0
    try:
        if as_root:  # root ignores modes: check as an ordinary user (the kernel decides)
            os.seteuid(65534)
        try:
            code = main(["train", *TINY_ARGS, "--out", str(locked / "run")])
        finally:
            if as_root:
                os.seteuid(0)
    finally:
        locked.chmod(0o755)
    left = list(locked.iterdir())
    shutil.rmtree(base)
    assert code == 2
    line = _one_line(capsys.readouterr().err)
    assert "Permission denied" in line and str(locked / "run") in line, line
    assert left == []


def test_divergence_is_one_line_and_keeps_the_last_good_weights(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", *TINY_ARGS, "--lr", "1e30", "--out", str(out)])
    assert code == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("mhainterp train: error: training diverged: loss=") and str(out) in line
    status = json.loads((out / "eval.json").read_text())
    assert status["status"] == "diverged"
    # the last good weights, whole and finite, kept to look at; not loaded as a trained run
    weights = load_file(out / "model.safetensors")
    assert weights and all(t.isfinite().all() for t in weights.values())
    with pytest.raises(RunFolderError) as refused:
        load_run(out)
    assert str(refused.value) == (
        f"{out} diverged at step {line.split(' at step ')[1].split('.')[0]} (its eval.json says "
        "so): it holds no trained model; retrain it with a lower --lr"
    )


def _ctrl_c_state() -> dict:
    """What decides how this process answers SIGINT: its Python handler (SIG_IGN when the suite
    was started in the background with SIGINT ignored), the main thread's blocked signals,
    whether this is the main thread."""
    return {
        "python_handler": signal.getsignal(signal.SIGINT),
        "blocked": signal.pthread_sigmask(signal.SIG_BLOCK, []),
        "main_thread": threading.current_thread() is threading.main_thread(),
    }


def test_ctrl_c_in_train_is_one_line_and_exit_130(tmp_path, capsys):
    out = tmp_path / "run"
    args = [a if a != "10" else "100000" for a in TINY_ARGS]  # long enough to interrupt
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        code = main(["train", *args, "--out", str(out)])
    finally:
        timer.cancel()
    assert code == 130, (capsys.readouterr(), _ctrl_c_state())
    line = _one_line(capsys.readouterr().err)
    assert line == "mhainterp train: interrupted; run the same command again to resume"
    assert not (out / "eval.json").exists()


def test_an_interrupt_as_the_training_bar_appears_leaves_the_message_alone_on_its_line(
    tmp_path, capsys, monkeypatch
):
    """SIGTERM sent as the bar appeared (CI) landed inside tqdm's constructor, just after its
    first display: tqdm's close() then takes the bar for never shown and clears nothing, and
    the message followed the bar on its line. Here the constructor's first clock read, which
    comes right after that display, is where the interrupt lands."""
    import tqdm.std

    reads = []

    def clock() -> float:
        reads.append(1)
        if len(reads) == 1:
            raise KeyboardInterrupt
        return time.time()

    monkeypatch.setattr(tqdm.std, "time", clock)
    args = [a for a in TINY_ARGS if a != "--quiet"]  # the bar on
    assert main(["train", *args, "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert "train reverse h=" in err  # the bar was shown...
    # ...and what a terminal shows after the last carriage return is the message alone
    message = "mhainterp train: interrupted; run the same command again to resume"
    assert err.rsplit("\r", 1)[-1].strip() == message, repr(err)


# ----- 1. train refuses to overwrite --------------------------------------------------------------
def test_train_refuses_to_overwrite_a_finished_run_unless_asked(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY_ARGS, "--n-heads", "2", "--out", str(out)]) == 0
    first = _files(out)
    capsys.readouterr()
    # another run into the same folder: refused, nothing touched
    assert main(["train", *TINY_ARGS, "--n-heads", "4", "--out", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "model.n_heads: 2 there, 4 here" in line and "--overwrite" in line, line
    assert "resume" in line
    assert _files(out) == first
    # the same command again: nothing to do, nothing touched
    assert main(["train", *TINY_ARGS, "--n-heads", "2", "--out", str(out)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert _files(out) == first
    # asked explicitly: replaced
    assert main(["train", *TINY_ARGS, "--n-heads", "4", "--overwrite", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model"]["n_heads"] == 4


# ----- kill at random points (forked child; the CLI version is in test_faults.py) -----------------
def _fork(body) -> int:
    pid = os.fork()
    if pid == 0:  # the child: run, then leave without pytest's cleanup
        try:
            body()
        finally:
            os._exit(0)
    return pid


def test_sigkilled_sweep_resumes_to_byte_identical_files(tiny_sweep, tiny_sweep_seconds, tmp_path):
    rng = random.Random(12)
    out = tmp_path / "killed"
    delays = []
    for _ in range(3):
        delay = rng.uniform(0.0, min(1.0, tiny_sweep_seconds))  # from start to about the end
        delays.append(round(delay, 3))
        pid = _fork(lambda: run_sweep(TINY_SWEEP, out, executor="local", progress=False))
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    run_sweep(TINY_SWEEP, out, executor="local", progress=False)
    assert _files(out) == _files(tiny_sweep), f"kill delays {delays}"
    assert (out / "results.csv").read_bytes() == (tiny_sweep / "results.csv").read_bytes()
    # a kill mid-write leaves a temp file; the resumed sweep removes those of its runs
    leftovers = [p.name for p in (out / "runs").rglob("*.tmp")]
    assert leftovers == [], leftovers


def test_a_child_killed_holding_the_progress_lock_does_not_hang_the_parent():
    # The hang this guards against was seen in the test above: tqdm's lock is shared with a
    # forked child, and a child SIGKILLed while holding it blocked the parent's next bar.
    import threading

    from tqdm.auto import tqdm

    import mhainterp.sweep  # noqa: F401  (registers the at-fork hook)

    tqdm.get_lock()  # the parent's lock exists before the fork, as with a sweep's bar
    pid = os.fork()
    if pid == 0:  # the child: take the lock, then die holding it
        tqdm.get_lock().acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    done = threading.Event()

    def make_a_bar() -> None:
        with tqdm(total=1, disable=True):
            pass
        done.set()

    threading.Thread(target=make_a_bar, daemon=True).start()
    assert done.wait(10), "the parent's progress bar is stuck on a lock its dead child held"


# ----- 6. locks -----------------------------------------------------------------------------------
def _hold_lock(run_dir: Path, ready_w: int, go_r: int, then=None) -> None:
    lock = RunLock(run_dir)
    assert lock.acquire()
    os.write(ready_w, b"1")
    os.read(go_r, 1)
    if then is not None:
        then()
    lock.release()


def test_a_lock_held_by_another_process_is_refused_and_freed_when_it_is_killed(tmp_path):
    run_dir = tmp_path / "runs" / "h1_seed0"
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = _fork(lambda: _hold_lock(run_dir, ready_w, go_r))
    os.read(ready_r, 1)
    lock = RunLock(run_dir)
    assert not lock.acquire()
    assert lock.holder() == f"process {pid}"
    with pytest.raises(RunLockedError, match=f"in use by process {pid}"), RunLock(run_dir):
        pass
    os.kill(pid, signal.SIGKILL)  # a stale lock: its holder died without releasing it
    os.waitpid(pid, 0)
    assert lock.acquire()  # the kernel released it
    assert not RunLock(run_dir).acquire()  # held by this process now
    lock.release()
    for fd in (ready_r, ready_w, go_r, go_w):
        os.close(fd)


@pytest.mark.parametrize("holder", ["finishes", "is killed"])
def test_sweep_skips_a_run_another_process_holds_then_waits(tiny_sweep, tmp_path, holder):
    out = tmp_path / "shared"
    spec = next(s for s in plan_sweep(TINY_SWEEP, out) if s.run_dir.name == "h1_seed0")
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    then = (lambda: execute_run(spec)) if holder == "finishes" else None
    pid = _fork(lambda: _hold_lock(spec.run_dir, ready_w, go_r, then))
    os.read(ready_r, 1)
    results: list[pd.DataFrame] = []
    sweep = threading.Thread(
        target=lambda: results.append(run_sweep(TINY_SWEEP, out, executor="local", progress=False))
    )
    sweep.start()
    log = out / "sweep.log"
    deadline = time.monotonic() + 120
    while " wait h1_seed0" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and sweep.is_alive(), "the sweep never waited"
        time.sleep(0.05)
    assert not is_finished_run(spec.run_dir)  # skipped, not trained over the lock
    if holder == "finishes":
        os.write(go_w, b"1")  # the holder trains the run and exits
    else:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sweep.join(timeout=120)
    assert not sweep.is_alive()
    me = f"pid={os.getpid()}"
    trained_here = [
        name
        for line in log.read_text().splitlines()
        if me in line and " train " in line
        for name in line.split(" train ")[1].split()[0].split(",")
    ]
    expected = ["h1_seed1", "h2_seed0", "h2_seed1"]
    if holder == "is killed":  # its run was left unfinished: this sweep trained it
        expected = ["h1_seed0", *expected]
    assert sorted(trained_here) == expected
    assert _files(out) == _files(tiny_sweep)
    assert (out / "results.csv").read_bytes() == (tiny_sweep / "results.csv").read_bytes()
    for fd in (ready_r, ready_w, go_r, go_w):
        os.close(fd)


# ----- a full disk --------------------------------------------------------------------------------
def test_enospc_at_a_write_is_one_line_and_the_sweep_stays_resumable(tmp_path, monkeypatch, capsys):
    out = tmp_path / "full"
    real = run_folder.save_file
    calls = {"n": 0}

    def fills_up(state, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] == 3:  # the third run's weights: half written, then the disk is full
            Path(filename).write_bytes(b"\0" * 100)
            # what safetensors raises on a full disk: its own type, not an OSError
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        return real(state, filename, metadata=metadata)

    args = ["sweep", *TINY_ARGS, "--n-heads", "1,2", "--seeds", "0,1", "--executor", "local"]
    assert main([*args, "--out", str(tmp_path / "reference")]) == 0
    monkeypatch.setattr(run_folder, "save_file", fills_up)
    args += ["--out", str(out)]
    assert main(args) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("mhainterp sweep: error: disk full: cannot write ")
    assert (
        "h2_seed0/model.safetensors (No space left on device)" in line
        and "run the same command again" in line
    )
    assert list(out.rglob("*.tmp")) == []
    assert sorted(p.parent.name for p in out.rglob("eval.json")) == ["h1_seed0", "h1_seed1"]
    monkeypatch.setattr(run_folder, "save_file", real)
    assert main(args) == 0  # space freed: the same command resumes
    assert _files(out) == _files(tmp_path / "reference")


def test_describe_os_error_says_what_happened():
    assert mio.describe_os_error(OSError(errno.ENOSPC, "No space left on device", "/d/x")) == (
        "disk full: cannot write /d/x (No space left on device); free some space and run the "
        "same command again to resume"
    )
    assert mio.describe_os_error(PermissionError(errno.EACCES, "Permission denied", "/d")) == (
        "permission denied: /d (Permission denied); choose a folder you can write"
    )


def test_a_resumed_sweep_removes_the_temp_files_a_killed_write_left(tiny_sweep, tmp_path):
    stale = tmp_path / "runs" / "h2_seed1" / ".model.safetensors.dead0000.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"\0" * 10)  # what SIGKILL mid-write leaves: no finally ran
    run_sweep(TINY_SWEEP, tmp_path, executor="local", progress=False)
    assert not stale.exists()
    assert _files(tmp_path) == _files(tiny_sweep)


def test_train_into_a_run_another_process_is_writing_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = _fork(lambda: _hold_lock(out, ready_w, go_r))
    os.read(ready_r, 1)
    try:
        assert main(["train", *TINY_ARGS, "--out", str(out)]) == 2
    finally:
        os.write(go_w, b"1")
        os.waitpid(pid, 0)
    line = _one_line(capsys.readouterr().err)
    assert line == f"mhainterp train: error: {out} is in use by process {pid}"
    assert not (out / "eval.json").exists()
    for fd in (ready_r, ready_w, go_r, go_w):
        os.close(fd)


# ----- issue 21: foreign runs, read-only sweeps --------------------------------------------------
def test_a_copied_run_of_another_seed_is_refused_not_adopted(tiny_sweep, tmp_path, capsys):
    out = tmp_path / "sweep"
    shutil.copytree(tiny_sweep, out)
    shutil.rmtree(out / "runs" / "h2_seed1")
    shutil.copytree(tiny_sweep / "runs" / "h2_seed0", out / "runs" / "h2_seed1")  # says seed 0
    before = _files(out)
    with pytest.raises(RunFolderError) as error:
        run_sweep(TINY_SWEEP, out, executor="local", progress=False)
    message = str(error.value)
    assert str(out / "runs" / "h2_seed1") in message and "holds another run" in message
    assert "model.seed: 0 there, 1 here" in message, message
    assert _files(out) == before  # nothing trained over it, results.csv not rewritten


@pytest.mark.slow  # two full reports as another user (8 s); CI runs it
def test_a_read_only_sweep_with_every_result_saved_reports_elsewhere_untouched(
    tiny_sweep, tmp_path, capsys
):
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="mhainterp-ro-"))  # in /tmp: every user can reach it
    base.chmod(0o755)
    sweep, out = base / "sweep", base / "report"
    shutil.copytree(tiny_sweep, sweep)
    args = ["--n-eval", "16", "--quiet"]
    assert main(["report", str(sweep), *args, "--out", str(out)]) == 0  # every result saved
    shutil.rmtree(out)
    out.mkdir()
    out.chmod(0o777)
    for path in [sweep, *sweep.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    as_root = os.geteuid() == 0
    try:
        if as_root:  # root ignores modes: report as an ordinary user (the kernel decides)
            os.seteuid(65534)
        try:
            code = main(["report", str(sweep), *args, "--out", str(out)])
        finally:
            if as_root:
                os.seteuid(0)
        err = capsys.readouterr().err
        assert code == 0, err
        assert (out / "report.md").is_file() and (out / "report.html").is_file()
        assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before
    finally:
        for path in [sweep, *sweep.rglob("*")]:
            path.chmod(0o755)
        shutil.rmtree(base)
