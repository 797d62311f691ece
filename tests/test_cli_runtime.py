"""--device, --threads and seed ranges: where a command runs, and how many seeds it runs."""

from __future__ import annotations

import argparse

import pytest
import torch

from mhainterp import build_model, get_task, head_importance
from mhainterp.cli import main
from mhainterp.cli.options import MAX_LIST, int_list
from mhainterp.runtime import device_context, model_device, resolve_device, threads_context


def test_seed_ranges_expand():
    assert int_list("0-3,7") == [0, 1, 2, 3, 7]
    assert int_list("1,4,8") == [1, 4, 8]
    assert int_list("0-99") == list(range(100))
    for bad in ("5-3", "a-b", "0-", f"0-{MAX_LIST}", "1,,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected comma-separated"):
            int_list(bad)


def test_a_device_that_is_not_a_device_is_one_line(capsys):
    assert main(["train", "--device", "tpu", "--out", "never"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "mhainterp train: error: --device='tpu' is invalid: one of auto|cpu|cuda|cuda:N|mps"
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_device_this_machine_lacks_is_one_line_before_any_work(capsys, tmp_path):
    out = tmp_path / "never"
    assert main(["train", "--device", "cuda:0", "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0] and "--device cpu or auto" in err[0]
    assert not out.exists()  # refused before any work


def test_seed_range_on_sweep_plans_every_seed(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "--task", "reverse", "--n-heads", "1", "--seeds", "0-2,5", "--steps", "2",
            "--n-eval", "8", "--quiet", "--out", str(out), "--executor", "local"]  # fmt: skip
    assert main(argv) == 0
    assert sorted(p.name for p in (out / "runs").iterdir() if "." not in p.name) == [
        "h1_seed0", "h1_seed1", "h1_seed2", "h1_seed5"
    ]  # fmt: skip


def test_threads_reach_the_analyses():
    """--threads sets what threads=None means; an explicit threads= wins; the default is 1."""
    task = get_task("reverse", seq_len=6, d_vocab=4)
    model = build_model(task, d_model=8, n_heads=2, seed=0, device="cpu")
    seen = []
    model.blocks[0].attn.hook_z.add_hook(lambda z, hook: seen.append(torch.get_num_threads()))
    try:
        before = torch.get_num_threads()
        head_importance(model, task, n_eval=8)
        with threads_context(2):
            head_importance(model, task, n_eval=8)
            head_importance(model, task, n_eval=8, threads=3)
        assert torch.get_num_threads() == before  # restored
    finally:
        model.reset_hooks()
    assert set(seen[: len(seen) // 3]) == {1}
    assert {2, 3} <= set(seen)


def test_a_wide_model_runs_on_torchs_own_threads_unless_told(monkeypatch):
    """A model at least WIDE_MODEL wide (a pretrained one) keeps torch's threads when nothing
    is set; a small one gets DEFAULT_THREADS; $MHAINTERP_THREADS and threads= still win."""
    from mhainterp.runtime import DEFAULT_THREADS, THREADS_ENV, WIDE_MODEL

    monkeypatch.delenv(THREADS_ENV, raising=False)
    task = get_task("reverse", seq_len=6, d_vocab=4)
    seen: dict[int, list[int]] = {}
    before = torch.get_num_threads()
    torch.set_num_threads(DEFAULT_THREADS + 2)  # torch's own, as the process has it
    try:
        for width in (8, WIDE_MODEL):
            model = build_model(task, d_model=width, n_heads=2, seed=0, device="cpu")
            hook = model.blocks[0].attn.hook_z
            hook.add_hook(lambda z, hook, w=width: seen.setdefault(w, []).append(
                torch.get_num_threads()))  # fmt: skip
            head_importance(model, task, n_eval=8)
            monkeypatch.setenv(THREADS_ENV, "1")
            head_importance(model, task, n_eval=8)
            monkeypatch.delenv(THREADS_ENV)
            head_importance(model, task, n_eval=8, threads=1)
            model.reset_hooks()
    finally:
        torch.set_num_threads(before)
    third = len(seen[8]) // 3
    assert set(seen[8]) == {DEFAULT_THREADS}
    assert set(seen[WIDE_MODEL][:third]) == {DEFAULT_THREADS + 2}
    assert set(seen[WIDE_MODEL][third:]) == {1}


def test_device_setting_reaches_auto(tmp_path):
    with device_context("cpu"):
        assert resolve_device(None) == torch.device("cpu")
        model = build_model(get_task("reverse"), n_heads=2)
    assert model_device(model).type == "cpu"
