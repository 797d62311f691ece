"""The device rule (DESIGN.md, "Devices"): a model's device is where its parameters are, and every
function follows it.

CI has no GPU, so the CPU half of the rule is tested with torch's *default device* moved away
from the model: inside ``with torch.device("meta")`` every tensor created without a device
lands on ``meta``, where it has no data. A function that builds a tensor on the default device
instead of the model's (the bug that made every call but one crash on CUDA, issue 30) then
fails here as it would on a GPU, and one that follows the model gives the same table as
outside. The tests marked ``cuda`` run the same calls on a real GPU (``make test-gpu``).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

import mhainterp
from mhainterp import (
    Ablator,
    average_patterns,
    build_model,
    division_of_labour,
    evaluate_head_sets,
    example_patterns,
    get_task,
    gradient_importance,
    handbuilt_model,
    head_importance,
    head_similarity,
    head_statistics,
    pairwise_ablation,
    prune_curve,
    specialization_test,
)
from mhainterp.attribution import attribution_patching
from mhainterp.config import TrainConfig
from mhainterp.runtime import model_device, resolve_device
from mhainterp.similarity import cross_model_similarity
from mhainterp.similarity.separation import head_separation
from mhainterp.training import evaluate, train

PACKAGE = Path(mhainterp.__file__).parent
N_EVAL = 48


@pytest.fixture(scope="module")
def task():
    return get_task("count_previous", seq_len=8, d_vocab=5)


@pytest.fixture(scope="module")
def model(task):
    return build_model(task, d_model=16, n_heads=4, seed=0, device="cpu")


def _frames(result) -> list[pd.DataFrame]:
    """The DataFrames a call returned (a table, a list of them, or an object holding them)."""
    if isinstance(result, pd.DataFrame):
        return [result]
    if isinstance(result, torch.Tensor):  # a tensor comes back on the model's device
        return [pd.DataFrame(result.detach().cpu().reshape(len(result), -1).numpy())]
    if isinstance(result, (list, tuple)) and all(isinstance(r, dict) for r in result):
        return [pd.DataFrame(result)]  # rows of metrics
    if isinstance(result, (list, tuple)):
        return [f for item in result for f in _frames(item)]
    return [v for v in vars(result).values() if isinstance(v, pd.DataFrame)]


CALLS = {
    "evaluate": lambda m, t: pd.DataFrame([evaluate(m, t, n_eval=N_EVAL)]),
    "head_importance zero": lambda m, t: head_importance(m, t, method="zero", n_eval=N_EVAL),
    "head_importance mean": lambda m, t: head_importance(m, t, method="mean", n_eval=N_EVAL),
    "head_importance resample": lambda m, t: head_importance(
        m, t, method="resample", n_eval=N_EVAL
    ),
    "pairwise_ablation": lambda m, t: pairwise_ablation(m, t, n_eval=N_EVAL),
    "evaluate_head_sets": lambda m, t: evaluate_head_sets(
        m, t, [[], ["L0H1"], ["L0H0", "L0H2"]], "mean", n_eval=N_EVAL
    ).metrics(),
    "Ablator": lambda m, t: Ablator(m, t, n_eval=N_EVAL).toggle("L0H1").table(),
    "average_patterns": lambda m, t: average_patterns(m, t, n_eval=N_EVAL),
    "example_patterns": lambda m, t: example_patterns(m, t),
    "head_statistics": lambda m, t: head_statistics(m, t, n_eval=N_EVAL),
    "head_separation": lambda m, t: head_separation(m, t, n_eval=N_EVAL),
    "gradient_importance": lambda m, t: gradient_importance(m, t, n_eval=N_EVAL),
    "attribution_patching": lambda m, t: attribution_patching(m, t, n_eval=N_EVAL),
    "prune_curve": lambda m, t: prune_curve(m, t, n_eval=N_EVAL),
    **{
        f"head_similarity {measure}": (
            lambda m, t, measure=measure: head_similarity(m, t, method=measure, n_eval=N_EVAL)
        )
        for measure in ("js", "pattern_corr", "cka", "ov", "qk")
    },
    "cross_model_similarity": lambda m, t: cross_model_similarity(m, m, t, n_eval=N_EVAL),
    "division_of_labour": lambda m, t: division_of_labour(m, t, n_eval=N_EVAL),
    "specialization_test": lambda m, t: specialization_test(m, t),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_call_follows_the_model_not_the_default_device(name, model, task):
    expected = _frames(CALLS[name](model, task))
    with torch.device("meta"):
        got = _frames(CALLS[name](model, task))
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("name", ["division_of_labour", "specialization_test"])
def test_the_verdict_of_a_trained_model_follows_it(name, trained, task):
    """A trained model's heads do damage, so the division reaches what an untrained one
    skips: kept profiles, backed-up groups, the noisy copies of the same-function null."""
    expected = _frames(CALLS[name](trained, task))
    assert set(division_of_labour(trained, task, n_eval=N_EVAL).index["basis"]) == {"single"}
    with torch.device("meta"):
        got = _frames(CALLS[name](trained, task))
    for a, b in zip(got, expected, strict=True):
        pd.testing.assert_frame_equal(a, b)


def test_forward_and_cache_follow_the_model(model, task):
    batch = task.eval_batch(4)
    expected, _ = model.run_with_cache(batch.tokens)
    with torch.device("meta"):
        logits, meta_cache = model.run_with_cache(batch.tokens)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    assert meta_cache["pattern", 0].device == model_device(model)


def test_the_same_seed_draws_the_same_batch_whatever_the_default_device(task):
    expected = task.sample(8, torch.Generator().manual_seed(3))
    with torch.device("meta"):
        got = task.sample(8, torch.Generator().manual_seed(3))
    assert got.tokens.device.type == "cpu"  # drawn on the CPU, moved once by the caller
    assert torch.equal(got.tokens, expected.tokens) and torch.equal(got.targets, expected.targets)


def test_model_config_follows_to(task):
    model = build_model(task, d_model=16, n_heads=4, seed=0, device="cpu")
    assert model.cfg.device == "cpu"
    model.to(torch.float64)
    assert model.cfg.dtype == torch.float64 and model.cfg.device == "cpu"


def test_build_model_and_load_run_take_a_device(task, tmp_path):
    from mhainterp import TrainConfig, load_run, train

    model = build_model(task, d_model=16, n_heads=2, seed=0, device="auto")
    assert model_device(model) == resolve_device("auto")
    train(model, task, TrainConfig(steps=2), run_dir=tmp_path / "run", progress=False)
    run = load_run(tmp_path / "run", device="cpu")
    assert model_device(run.model).type == "cpu"
    with pytest.raises(mhainterp.ParameterError, match="device='tpu' is invalid"):
        build_model(task, device="tpu")
    with pytest.raises(mhainterp.ParameterError, match="device='tpu' is invalid"):
        load_run(tmp_path / "run", device="tpu")


def test_a_run_trained_elsewhere_is_the_same_run(task, tmp_path):
    """The config records the training device; resuming or comparing ignores it."""
    import json

    from mhainterp import TrainConfig, train
    from mhainterp.training import run_config_differences, saved_config_matches

    model = build_model(task, d_model=16, n_heads=2, seed=0, device="cpu")
    config = TrainConfig(steps=2)
    train(model, task, config, run_dir=tmp_path / "run", progress=False)
    path = tmp_path / "run" / "config.json"
    saved = json.loads(path.read_text())
    assert saved["model"]["device"] == "cpu"
    saved["model"]["device"] = "cuda:0"  # as if trained on a GPU
    path.write_text(json.dumps(saved))
    assert saved_config_matches(tmp_path / "run", model, task, config)
    assert run_config_differences(tmp_path / "run", model, task, config) == (
        "the same settings, unfinished"
    )


# ----- inputs move to the model ----------------------------------------------------------------
DEVICE_MIX = re.compile(r"same device|expected device|at least two devices", re.IGNORECASE)


def _on_meta(model):
    """A copy of ``model`` on ``meta``: a CPU tensor that meets it raises torch's device-mix
    error, as a CPU batch meets a CUDA model (the other half of issue 30's crashes)."""
    return copy.deepcopy(model).to("meta")


MOVES = {
    "forward": lambda m, t: m(t.eval_batch(4).tokens),
    "run_with_cache": lambda m, t: m.run_with_cache(t.eval_batch(4).tokens),
    "train": lambda m, t: train(m, t, TrainConfig(steps=2, n_eval=8), progress=False),
    **CALLS,
}


@pytest.mark.parametrize("name", sorted(MOVES))
def test_every_call_moves_its_data_to_the_model(name, model, task):
    """Run on a model on ``meta``: a call may stop where it first needs a value (meta tensors
    have none), but never with a device-mix error before that."""
    try:
        MOVES[name](_on_meta(model), task)
    except (RuntimeError, NotImplementedError) as error:
        assert not DEVICE_MIX.search(str(error)), f"{name}: {error}"


def test_the_move_check_can_fail(model, task):
    batch = task.eval_batch(4)
    with pytest.raises(RuntimeError, match=DEVICE_MIX):
        _on_meta(model).logits(batch.tokens, batch.padding_mask)  # logits() does not move


# ----- nothing pins the CPU ---------------------------------------------------------------------
def _cpu_literals(path: Path) -> list[tuple[int, str]]:
    """Lines of ``path`` holding the string literal ``"cpu"`` (docstrings and comments hold
    longer strings or no string token, so they do not count)."""
    import io
    import tokenize

    lines = path.read_text().splitlines()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.STRING and token.string.strip("'\"") == "cpu":
            found.append((token.start[0], lines[token.start[0] - 1]))
    return found


def test_no_library_code_pins_the_cpu_without_saying_why():
    """DESIGN.md: no library code names "cpu" except where data is drawn or a result is handed
    back, and says so in a comment on that line. Everything else follows the model's device."""
    unexplained = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in _cpu_literals(path)
        if "#" not in line
    ]
    assert not unexplained, "\n".join(unexplained)


def test_the_cpu_literal_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('x = torch.zeros(3, device="cpu")\ny = "cpu"  # drawn here\n"""the cpu"""\n')
    assert [number for number, _ in _cpu_literals(bad)] == [1, 2]


# ----- on a real GPU (make test-gpu) -------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_call_runs_on_cuda_and_agrees_with_the_cpu(name, task):
    cpu = build_model(task, d_model=16, n_heads=4, seed=0, device="cpu")
    gpu = build_model(task, d_model=16, n_heads=4, seed=0, device="cuda")
    for a, b in zip(_frames(CALLS[name](gpu, task)), _frames(CALLS[name](cpu, task)), strict=True):
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_model_to_cuda_then_forward_with_cpu_tokens(task):
    model = handbuilt_model(["previous", "uniform"]).to("cuda")
    assert model.cfg.device.startswith("cuda")
    logits = model(torch.tensor([[1, 2, 3, 4]]))
    assert logits.device.type == "cuda"


def test_the_explorer_session_follows_the_model(model, task):
    from mhainterp.explore.session import ExploreSession

    def answers(session: ExploreSession) -> list:
        session.set(["L0H1"])
        return [session.metrics(), session.example(0), session.attention(0, 3),
                session.average_patterns(), session.importance()]  # fmt: skip

    expected = answers(ExploreSession(model, task, n_eval=N_EVAL, method="mean"))
    with torch.device("meta"):
        got = answers(ExploreSession(model, task, n_eval=N_EVAL, method="mean"))
    assert got == expected


def test_analyze_run_follows_the_model(task, tmp_path):
    """The whole `mhainterp analyze` of a run: every CSV equal off the default device."""
    from mhainterp import TrainConfig, analyze_run, train

    model = build_model(task, d_model=16, n_heads=2, seed=0, device="cpu")
    train(model, task, TrainConfig(steps=3, n_eval=N_EVAL), run_dir=tmp_path / "a", progress=False)
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    analyze_run(tmp_path / "a", n_eval=N_EVAL, progress=False)
    with torch.device("meta"):
        analyze_run(tmp_path / "b", n_eval=N_EVAL, progress=False)
    tables = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.csv"))
    assert len(tables) > 5
    for table in tables:
        pd.testing.assert_frame_equal(
            pd.read_csv(tmp_path / "b" / table), pd.read_csv(tmp_path / "a" / table)
        )


# ----- determinism (issue 30 item 5) -------------------------------------------------------------
ACCURACY_TOLERANCE = 0.02
"""CPU and CUDA training of the same seeds may differ in float rounding (different kernels and
summation orders), which compounds over training: validation accuracy must agree within this
(absolute), and every division call of the demo models must be the same."""


@pytest.fixture(scope="module")
def trained(task):
    from mhainterp import TrainConfig, train

    model = build_model(task, d_model=32, n_heads=4, seed=0, device="cpu")
    return train(model, task, TrainConfig(steps=300, n_eval=64), progress=False).model


def test_same_seeds_on_the_same_device_give_identical_tables(trained, task):
    first = division_of_labour(trained, task, n_eval=N_EVAL)
    again = division_of_labour(trained, task, n_eval=N_EVAL)
    for a, b in zip(_frames(first), _frames(again), strict=True):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    a, b = specialization_test(trained, task).heads, specialization_test(trained, task).heads
    pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.cuda
@pytest.mark.slow
def test_cpu_and_cuda_agree_on_the_demo_models(tmp_path):
    """The demo's protocol (1,500 steps, d_model 64, h = 4 and 8, seeds 0-2) trained on each
    device: accuracy within ACCURACY_TOLERANCE, and the same division call on every axis."""
    from mhainterp import TrainConfig, train
    from mhainterp.analyze.demo import DEMO_STEPS, DEMO_TASKS
    from mhainterp.analyze.study import TASK_PARAMS as DEMO_TASK_PARAMS

    for name in DEMO_TASKS:
        task = get_task(name, **DEMO_TASK_PARAMS)
        for h in (4, 8):
            for seed in (0, 1, 2):
                calls, accuracy = {}, {}
                for device in ("cpu", "cuda"):
                    model = build_model(task, d_model=64, n_heads=h, seed=seed, device=device)
                    run = train(model, task, TrainConfig(steps=DEMO_STEPS, seed=seed),
                                progress=False)  # fmt: skip
                    accuracy[device] = run.eval["accuracy"]
                    calls[device] = division_of_labour(run.model, task).index["call"].tolist()
                where = f"{name} h={h} seed={seed}"
                assert abs(accuracy["cpu"] - accuracy["cuda"]) <= ACCURACY_TOLERANCE, where
                assert calls["cpu"] == calls["cuda"], where


def test_a_size_is_counted_on_meta_without_allocating_or_drawing():
    """build_model counts a model's parameters on torch's meta device before allocating it:
    a config on meta builds shapes only, so a 160-billion-parameter count costs nothing."""
    from mhainterp.config import ModelConfig
    from mhainterp.training import count_parameters

    huge = ModelConfig(d_vocab=10, n_ctx=8, d_model=200_000, n_heads=4, n_layers=1)
    assert count_parameters(huge) > 160_000_000_000
