"""Training, evaluation and run folders: reproducibility, known accuracies, divergence."""

from __future__ import annotations

import json
import math
import warnings

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from mhainterp.config import TrainConfig
from mhainterp.errors import RunFolderError, TrainingDivergedError
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.runs import is_finished_run, weights_digest
from mhainterp.tasks import get_task, task_record
from mhainterp.training import (
    build_model,
    evaluate,
    load_run,
    lr_at,
    save_run,
    train,
)

SMALL = {"d_model": 16}
FAST = TrainConfig(steps=24, batch_size=16, warmup_steps=4, log_every=8, n_eval=64)


def _train(task_name="reverse", seed=0, config=FAST, run_dir=None, **model):
    task = get_task(task_name, seq_len=8, d_vocab=5)
    model = build_model(task, **{**SMALL, "n_heads": 2, "seed": seed, **model})
    cfg = TrainConfig.from_dict({**config.to_dict(), "seed": seed})
    return train(model, task, cfg, run_dir=run_dir, progress=False)


def test_same_seed_gives_identical_curves_and_weights():
    a, b = _train(seed=3), _train(seed=3)
    pd.testing.assert_frame_equal(a.metrics, b.metrics)
    for (name, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(p, q), name
    assert a.eval == b.eval


def test_different_seed_gives_different_weights():
    a, b = _train(seed=0), _train(seed=1)
    assert not torch.equal(a.model.unembed.weight, b.model.unembed.weight)
    assert a.metrics["loss"].tolist() != b.metrics["loss"].tolist()


def test_metrics_rows_and_columns():
    result = _train()
    assert result.metrics["step"].tolist() == [8, 16, 24]
    assert list(result.metrics.columns) == ["step", "loss", "lr", "grad_norm"]
    assert result.eval["final_train_loss"] == result.metrics["loss"].iloc[-1]
    assert result.eval["n_sequences"] == 64


def test_lr_schedule_values():
    cfg = TrainConfig(steps=10, lr=1.0, warmup_steps=2, lr_schedule="cosine")
    assert lr_at(0, cfg) == 0.5
    assert lr_at(1, cfg) == 1.0
    assert lr_at(2, cfg) == pytest.approx(1.0)  # start of the cosine
    assert lr_at(6, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway
    assert lr_at(10, cfg) == pytest.approx(0.1)  # floor at 10%
    constant = TrainConfig(steps=10, lr=0.3, warmup_steps=0, lr_schedule="constant")
    assert [lr_at(s, constant) for s in (0, 9)] == [0.3, 0.3]


def test_evaluate_handbuilt_previous_token_is_exact():
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "uniform", "previous"])
    metrics = evaluate(model, task, n_eval=256)
    assert metrics["accuracy"] == 1.0
    assert metrics["n_scored"] == 256 * 16
    assert metrics["loss"] < 1e-3


def test_evaluate_counts_only_scored_positions():
    # A model that always predicts class 0: accuracy = share of scored targets equal to 0.
    task = get_task("reverse", seq_len=8, d_vocab=5, min_len=3)
    model = build_model(task, **SMALL, n_heads=2)
    with torch.no_grad():
        model.unembed.weight.zero_()
        model.unembed.bias.zero_()
        model.unembed.bias[0] = 10.0
    batch = task.eval_batch(200)
    scored = batch.mask & (batch.targets != -100)
    expected = float((batch.targets[scored] == 0).float().mean())
    assert evaluate(model, batch)["accuracy"] == pytest.approx(expected)
    assert evaluate(model, batch)["n_scored"] == int(scored.sum())
    assert int(scored.sum()) < batch.tokens.numel()  # padding really is excluded


def test_multi_target_reports_per_target_accuracy():
    result = _train("multi_relation")
    keys = {k for k in result.eval if k.startswith("accuracy/")}
    assert keys == {"accuracy/previous", "accuracy/mirror", "accuracy/count_previous"}
    mean_of_targets = sum(result.eval[k] for k in keys) / 3
    # Every target is scored at the same positions, so overall = mean of per-target.
    assert result.eval["accuracy"] == pytest.approx(mean_of_targets)


def test_training_learns_previous_token():
    task = get_task("previous_token", seq_len=8, d_vocab=5)
    model = build_model(task, d_model=32, n_heads=2, seed=0)
    before = evaluate(model, task, n_eval=256)["accuracy"]
    cfg = TrainConfig(steps=300, batch_size=64, lr=1e-2, warmup_steps=10, n_eval=256)
    after = train(model, task, cfg, progress=False).eval["accuracy"]
    assert before < 0.4
    assert after > 0.95


def test_save_and_load_run_rebuilds_the_exact_model(tmp_path):
    result = _train(run_dir=tmp_path / "run")
    assert is_finished_run(tmp_path / "run")
    run = load_run(tmp_path / "run")
    tokens = run.task.eval_batch(32).tokens
    assert torch.equal(run.model(tokens), result.model(tokens))
    assert run.model.cfg.to_dict() == result.model.cfg.to_dict()
    assert run.train_config.seed == 0 and run.train_config.steps == 24
    pd.testing.assert_frame_equal(run.metrics, result.metrics, check_dtype=False)
    assert run.eval["accuracy"] == result.eval["accuracy"]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["task"] == {
        "name": "reverse", "params": run.task.params, "module": "mhainterp.tasks.builtin"
    }  # fmt: skip


def test_save_run_takes_model_and_task_first(tmp_path):
    """``save_run(model, task, run_dir, ...)``: DESIGN.md's ``(model, data, ...)`` order."""
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "dead"], d_head=18)
    saved = save_run(model, task, tmp_path / "run", TrainConfig(), pd.DataFrame(), {"x": 1})
    assert saved == tmp_path / "run"
    run = load_run(saved)
    tokens = task.eval_batch(8).tokens
    assert torch.equal(run.model(tokens), model(tokens))
    # eval.json also records what it is an evaluation of: the weights file and the task
    assert run.eval == {
        "x": 1,
        "weights_sha256": weights_digest(saved),
        "trained_on": {"name": "previous_token", "params": task_record(task)["params"]},
    }
    with pytest.raises(ValueError, match=r"model=.* is invalid: a HookedMHATransformer: save_run"):
        save_run(tmp_path / "old", model, task, TrainConfig(), pd.DataFrame(), {})


def test_load_run_errors_name_the_missing_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_run(tmp_path)


def test_nan_loss_stops_with_message_and_keeps_last_good_weights(tmp_path):
    task = get_task("reverse", seq_len=8, d_vocab=5)
    model = build_model(task, **SMALL, n_heads=2)
    calls = {"n": 0}

    def poison_after_20_steps(value, hook):
        calls["n"] += 1
        return value * math.nan if calls["n"] > 20 else value

    model.add_hook("blocks.0.hook_attn_out", poison_after_20_steps)
    cfg = TrainConfig(steps=40, batch_size=8, log_every=8, warmup_steps=0)
    with pytest.raises(TrainingDivergedError, match=r"step 21.*after step 16"):
        train(model, task, cfg, run_dir=tmp_path / "run", progress=False)
    model.reset_hooks()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    saved = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert saved["status"] == "diverged" and saved["last_good_step"] == 16
    assert not is_finished_run(tmp_path / "run")  # a sweep would redo it
    on_disk = load_file(tmp_path / "run" / "model.safetensors")  # kept to look at, not loaded
    assert all(torch.equal(on_disk[name], value) for name, value in model.state_dict().items())
    with pytest.raises(RunFolderError, match="diverged at step 21 .* lower --lr"):
        load_run(tmp_path / "run")


def test_model_must_fit_task():
    task = get_task("reverse", seq_len=8, d_vocab=5)
    small = build_model(get_task("reverse", seq_len=4, d_vocab=5), **SMALL, n_heads=2)
    with pytest.raises(ValueError, match="n_ctx=4 < task seq_len=8"):
        train(small, task, FAST, progress=False)
    with pytest.raises(
        ValueError, match="n_layers=1 is invalid: an integer >= 2 for task 'induction'"
    ):
        build_model(get_task("induction", seq_len=8, d_vocab=8), n_layers=1)


def test_a_causal_model_on_a_task_that_needs_later_positions_is_warned_about():
    """reverse's target at t is the token at L-1-t: a causal model cannot see it for the
    first half. Allowed (an experiment may want it), but said; the task's own masking is
    not."""
    from mhainterp.training import build_model, train

    task = get_task("reverse", seq_len=6, d_vocab=4)
    config = TrainConfig(steps=2, batch_size=4, n_eval=8, warmup_steps=1)
    with pytest.warns(UserWarning, match="a causal model on task 'reverse'"):
        train(build_model(task, d_model=8, n_heads=2, causal=True), task, config, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train(build_model(task, d_model=8, n_heads=2), task, config, progress=False)
