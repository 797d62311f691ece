"""Training models together equals training each alone (same data, schedule, clipping, AdamW)."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import torch

from mhainterp.config import TrainConfig
from mhainterp.errors import BatchDivergedError, TrainingDivergedError
from mhainterp.fast.stacked import (
    _adamw_step,
    _draw,
    _label,
    sample_many,
    train_many,
)
from mhainterp.fast.stacked_forward import batched_logits, batched_loss
from mhainterp.fast.stacked_params import StackedModels, check_batchable
from mhainterp.runtime import model_device
from mhainterp.tasks import get_task, list_tasks
from mhainterp.training import build_model, load_run, train

# b_K gets a gradient of exactly zero in exact arithmetic (softmax ignores a constant added to
# every score of a row), so what it receives is rounding noise, which Adam scales to steps of
# size ~lr. It differs between any two float orders of the same sums (and does not change the
# function); every other weight must agree to float tolerance.
ZERO_GRADIENT_PARAMS = ("attn.k_proj.bias",)


def _config(seed: int, **overrides) -> TrainConfig:
    fields = dict(steps=30, batch_size=16, warmup_steps=5, log_every=10, n_eval=64)
    return TrainConfig(seed=seed, **{**fields, **overrides})


def _assert_same_model(a, b, batch) -> None:
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        if not name.endswith(ZERO_GRADIENT_PARAMS):
            torch.testing.assert_close(pa, pb, atol=1e-5, rtol=1e-4, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(
            a.logits(batch.tokens, batch.padding_mask),
            b.logits(batch.tokens, batch.padding_mask),
            atol=1e-5,
            rtol=1e-4,
        )


def _assert_same_result(alone, together, batch) -> None:
    _assert_same_model(alone.model, together.model, batch)
    pd.testing.assert_frame_equal(alone.metrics, together.metrics, atol=1e-5, rtol=1e-4)
    assert alone.eval.keys() == together.eval.keys()
    for key, value in alone.eval.items():
        expected = value if isinstance(value, str) else pytest.approx(value, rel=1e-4, abs=1e-6)
        assert together.eval[key] == expected, key


@pytest.mark.parametrize(
    ("task_name", "task_params", "model_kwargs"),
    [
        # causal, fixed length, attention only: the standard config, shrunk
        ("count_previous", {"seq_len": 8, "d_vocab": 5}, {"d_model": 16}),
        # bidirectional, padded, 2 layers with MLP and LayerNorm
        (
            "reverse",
            {"seq_len": 6, "d_vocab": 4, "min_len": 3},
            {"d_model": 8, "n_layers": 2, "attn_only": False, "normalization_type": "LN"},
        ),
    ],
)
def test_train_many_equals_train_alone(task_name, task_params, model_kwargs, tmp_path):
    task = get_task(task_name, **task_params)
    runs = [(1, 0), (4, 1), (2, 2), (4, 3)]  # mixed head counts share one step
    # grad_clip small enough to clip every step: a global (not per-model) norm would show
    configs = [_config(seed, grad_clip=0.05, eval_every=20) for _, seed in runs]
    alone = [
        train(build_model(task, n_heads=h, seed=s, **model_kwargs), task, c, progress=False)
        for (h, s), c in zip(runs, configs, strict=True)
    ]
    models = [build_model(task, n_heads=h, seed=s, **model_kwargs) for h, s in runs]
    dirs = [tmp_path / f"h{h}_seed{s}" for h, s in runs]
    together = train_many(models, task, configs, run_dirs=dirs, progress=False)

    assert [r.model for r in together] == models  # trained in place, input order
    assert (alone[0].metrics["grad_norm"] > 0.05).all()  # clipping was active
    assert list(together[0].metrics.columns) == [
        "step", "loss", "lr", "grad_norm", "eval_loss", "eval_accuracy",
    ]  # fmt: skip
    assert together[0].metrics["step"].tolist() == [10, 20, 30]
    assert together[0].metrics["eval_loss"].isna().tolist() == [True, False, False]
    batch = task.eval_batch(64)
    for one, many, run_dir, config in zip(alone, together, dirs, configs, strict=True):
        _assert_same_result(one, many, batch)
        saved = load_run(run_dir)
        _assert_same_model(one.model, saved.model, batch)
        assert saved.eval["status"] == "finished"
        assert saved.train_config == config
        pd.testing.assert_frame_equal(saved.metrics, many.metrics, check_dtype=False)


def test_run_folder_matches_train(tmp_path):
    task = get_task("reverse", seq_len=6, d_vocab=4)
    config = _config(3)
    train(build_model(task, n_heads=2, seed=3, d_model=8), task, config, run_dir=tmp_path / "a",
          progress=False)  # fmt: skip
    train_many([build_model(task, n_heads=2, seed=3, d_model=8)], task, [config],
               run_dirs=[tmp_path / "b"], progress=False)  # fmt: skip
    for name in ("config.json",):
        assert json.loads((tmp_path / "a" / name).read_text()) == json.loads(
            (tmp_path / "b" / name).read_text()
        )
    a, b = load_run(tmp_path / "a"), load_run(tmp_path / "b")
    assert a.eval.keys() == b.eval.keys()
    assert b.eval["accuracy"] == pytest.approx(a.eval["accuracy"], abs=1e-6)


@pytest.mark.parametrize("use_table", [False, True])
def test_batched_logits_equal_each_models_logits(use_table):
    task = get_task("reverse", seq_len=6, d_vocab=4, min_len=2)
    kwargs = {"d_model": 8, "n_layers": 2, "attn_only": False, "normalization_type": "LN"}
    for causal in (False, True):
        models = [
            build_model(task, n_heads=h, seed=s, causal=causal, **kwargs)
            for h, s in [(1, 0), (2, 1), (2, 2), (8, 3)]
        ]
        stack = StackedModels.from_models(models)
        gens = [torch.Generator().manual_seed(s) for s in range(len(models))]
        batch = sample_many(task, 5, gens)
        for mask in (None, batch.padding_mask):
            logits = batched_logits(stack, batch.tokens, mask, use_table=use_table)
            for i, model in enumerate(models):
                expected = model.logits(batch.tokens[i], None if mask is None else mask[i])
                torch.testing.assert_close(logits[i], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_first_layer_table_gives_the_same_gradients(padded):
    """Layer 0's LayerNorm and Q/K/V computed on the (token, position) table and gathered
    is the same function, so the same gradient, as computing them on every token."""
    task = get_task("count_previous", seq_len=8, d_vocab=5, **({"min_len": 4} if padded else {}))
    kwargs = {"d_model": 16, "n_layers": 2, "attn_only": False, "normalization_type": "LN"}
    models = [build_model(task, n_heads=h, seed=s, **kwargs) for h, s in [(1, 0), (4, 1), (4, 2)]]
    gens = [torch.Generator().manual_seed(s) for s in range(len(models))]
    batch = sample_many(task, 32, gens)  # 32 sequences > 5 tokens: the table is the default
    mask = batch.padding_mask if padded else None
    grads = []
    for use_table in (False, None):
        stack = StackedModels.from_models(models)
        logits = batched_logits(stack, batch.tokens, mask, use_table=use_table)
        weights = torch.linspace(-1, 1, logits.numel()).view_as(logits)
        (logits * weights).sum().backward()
        grads.append(stack.grad.clone())
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_batched_loss_equals_model_loss():
    task = get_task("multi_relation", seq_len=6, d_vocab=4)
    models = [build_model(task, n_heads=h, seed=h, d_model=8) for h in (1, 2)]
    gens = [torch.Generator().manual_seed(s) for s in (5, 6)]
    batch = sample_many(task, 7, gens)
    stack = StackedModels.from_models(models)
    losses = batched_loss(batched_logits(stack, batch.tokens), batch.targets, batch.mask,
                          task.d_vocab_out)  # fmt: skip
    for i, model in enumerate(models):
        expected = model.loss(model.logits(batch.tokens[i]), batch.targets[i], batch.mask[i])
        torch.testing.assert_close(losses[i], expected)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("reverse", {"seq_len": 6, "d_vocab": 4, "min_len": 2}),  # lengths drawn, padding
        ("multi_relation", {"seq_len": 5, "d_vocab": 3}),  # three targets per position
        ("induction", {"seq_len": 8, "d_vocab": 6}),  # its own sample_tokens
    ],
)
def test_sample_many_is_each_generators_own_stream(name, params):
    task = get_task(name, **params)
    seeds = [0, 7, 7, 123]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    own = [torch.Generator().manual_seed(s) for s in seeds]
    for _ in range(3):  # the streams continue step after step
        many = sample_many(task, 4, gens)
        for i, g in enumerate(own):
            one = task.sample(4, g)
            for field in ("tokens", "targets", "mask", "padding_mask"):
                assert torch.equal(getattr(many, field)[i], getattr(one, field)), field


def test_adamw_step_equals_torch_adamw():
    torch.manual_seed(0)
    param = torch.randn(3, 10)
    reference = param.clone().requires_grad_(True)
    optimizer = torch.optim.AdamW([reference], lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)
    exp_avg, exp_avg_sq = torch.zeros_like(param), torch.zeros_like(param)
    for step in range(1, 6):
        grad = torch.randn(3, 10)
        reference.grad = grad.clone()
        optimizer.step()
        _adamw_step(param, grad, exp_avg, exp_avg_sq, step, 0.01, (0.8, 0.99), 0.1)
        assert torch.equal(param, reference.detach())


def test_a_diverging_model_does_not_touch_the_others(tmp_path):
    task = get_task("count_previous", seq_len=8, d_vocab=5)
    runs = [(2, 0), (4, 1), (2, 2)]
    configs = [_config(s) for _, s in runs]

    def models():
        out = [build_model(task, n_heads=h, seed=s, d_model=16) for h, s in runs]
        with torch.no_grad():  # model 1's logits overflow: its loss is inf at the first step
            out[1].unembed.weight.mul_(1e38)
        return out

    expected = []
    for i, model in enumerate(models()):
        if i == 1:
            with pytest.raises(TrainingDivergedError) as alone_error:
                train(model, task, configs[i], run_dir=tmp_path / "alone", progress=False)
            expected.append(None)
        else:
            expected.append(train(model, task, configs[i], progress=False))
    dirs = [tmp_path / f"run{i}" for i in range(3)]
    with pytest.raises(BatchDivergedError) as error:
        train_many(models(), task, configs, run_dirs=dirs, progress=False)
    assert list(error.value.messages) == [1]
    assert error.value.results[1] is None
    message = error.value.messages[1]
    assert message.replace(str(dirs[1]), "DIR") == str(alone_error.value).replace(
        str(tmp_path / "alone"), "DIR"
    )
    saved = json.loads((dirs[1] / "eval.json").read_text())
    assert saved["status"] == "diverged" and saved["last_good_step"] == 0
    batch = task.eval_batch(64)
    for i in (0, 2):
        _assert_same_result(expected[i], error.value.results[i], batch)
        assert json.loads((dirs[i] / "eval.json").read_text())["status"] == "finished"


def test_check_batchable_names_what_differs():
    task = get_task("reverse", seq_len=6, d_vocab=4)
    a = build_model(task, n_heads=2, d_model=8)
    with pytest.raises(
        ValueError,
        match=r"models\[1\] is invalid: .* differs from models\[0\] in \['d_mlp', 'd_model'\]",
    ):
        check_batchable([a, build_model(task, n_heads=2, d_model=16)])
    hooked = copy.deepcopy(a)
    hooked.blocks[0].attn.hook_pattern.add_hook(lambda x, hook: x)
    with pytest.raises(
        ValueError, match=r"models\[1\] is invalid: a model without hooks .* hooks attached"
    ):
        check_batchable([a, hooked])
    with pytest.raises(ValueError, match=r"models=\[\] is invalid: a non-empty list"):
        check_batchable([])
    with pytest.raises(TypeError, match="HookedMHATransformer"):
        check_batchable([torch.nn.Linear(2, 2)])
    with pytest.raises(
        ValueError, match=r"configs\[1\] is invalid: .* differs from configs\[0\] in \['lr'\]"
    ):
        train_many([a, copy.deepcopy(a)], task, [_config(0), _config(1, lr=1e-2)], progress=False)
    with pytest.raises(ValueError, match=r"configs is invalid: one entry per model \(2\), got 1"):
        train_many([a, copy.deepcopy(a)], task, [_config(0)], progress=False)


# ----- devices, labels without host reads, determinism --------------------------------------------
@pytest.mark.parametrize("name", list_tasks())
@pytest.mark.parametrize("padded", [False, True])
def test_labels_without_checks_equal_targets_for(name, padded):
    """A training step labels its later batches without targets_for's data checks (they read
    values back to the host); the labels are the same."""
    task = get_task(name)
    if padded:
        if name == "induction":
            pytest.skip("induction's blocks fill the sequence: it has no variable length")
        task = get_task(name, min_len=task.seq_len // 2 + 1)
    batch = task.sample(64, torch.Generator().manual_seed(0))
    assert bool(batch.padding_mask.all()) is not padded
    got = _label(task, batch.tokens, batch.padding_mask, checked=False)
    expected = task.targets_for(batch.tokens, batch.padding_mask)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_train_many_trains_where_the_models_are(tmp_path):
    task = get_task("reverse", seq_len=6, d_vocab=4)
    models = [
        build_model(task, n_heads=h, seed=s, d_model=8, device="cpu") for h, s in [(1, 0), (2, 1)]
    ]
    configs = [_config(s, steps=4, warmup_steps=1) for s in (0, 1)]
    runs = train_many(models, task, configs, progress=False, device=None)
    assert [model_device(run.model).type for run in runs] == ["cpu", "cpu"]
    models[1].to("meta")  # a model elsewhere: one line naming the devices
    expected = (r"^models is invalid: models on one device .* got models on \['cpu', 'meta'\]; "
                r"move them with model.to\(device\) first$")  # fmt: skip
    with pytest.raises(ValueError, match=expected):
        train_many(models, task, configs, progress=False)


def test_same_seeds_give_identical_results_on_one_device(tmp_path):
    """Determinism (issue 30): the same seeds on the same device give identical tables and
    weights, bit for bit (here the CPU; tests/test_gpu.py does CUDA)."""
    task = get_task("reverse", seq_len=6, d_vocab=4, min_len=3)
    runs = [(1, 0), (4, 1), (2, 2)]

    def train_once():
        models = [build_model(task, n_heads=h, seed=s, d_model=8, device="cpu") for h, s in runs]
        configs = [_config(s, eval_every=10) for _, s in runs]
        return train_many(models, task, configs, progress=False)

    for a, b in zip(train_once(), train_once(), strict=True):
        pd.testing.assert_frame_equal(a.metrics, b.metrics, check_exact=True)
        assert a.eval == b.eval
        for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(pa, pb)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("count_previous", {"seq_len": 8, "d_vocab": 5}),  # Task's own draws, fixed length
        ("reverse", {"seq_len": 6, "d_vocab": 4, "min_len": 2}),  # Task's own draws, lengths too
        ("induction", {"seq_len": 8, "d_vocab": 6}),  # its own sample_tokens
    ],
)
def test_draws_do_not_depend_on_the_draw_threads(name, params):
    """On CUDA the host draws a step's batches in threads (each generator in one thread): the
    numbers are those of one thread, and of task.sample."""
    task = get_task(name, **params)
    seeds = range(200)  # three spans of at least 64 generators
    drawn = []
    for threads in (1, 3):
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        drawn.append([_draw(task, 4, gens, False, threads) for _ in range(2)])  # two steps
    for (tokens_1, lengths_1), (tokens_3, lengths_3) in zip(*drawn, strict=True):
        assert torch.equal(tokens_1, tokens_3) and torch.equal(lengths_1, lengths_3)
    alone = torch.Generator().manual_seed(seeds[-1])
    for tokens, lengths in drawn[1]:
        batch = task.sample(4, alone)
        assert torch.equal(lengths[-4:], batch.padding_mask.sum(-1))
        real = batch.padding_mask
        assert torch.equal(tokens[-4:][real], batch.tokens[real])
