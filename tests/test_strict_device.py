"""Every public entry point and command on the strict simulated device (``strict_device.py``),
and the host-sync budgets (DESIGN.md, "Devices").

CI has no GPU. On the strict device a CPU tensor meeting a device tensor, a ``.numpy()`` of a
device tensor or a CPU generator for a device factory fails as on CUDA, and every host sync is
counted. The device computes with the CPU's kernels, so each call's tables must equal the CPU's
exactly: a difference would be a path taken only on a device. One such path is by design: the
CPU scores an attention-only last layer's ablated copies through the linear readout, a device
by full forwards (``fast.linear_readout.applies``). The CPU's references here take the full
forward too (the readout is tested equal to it in ``test_ablation.py``), so equality stays exact.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from strict_device import DEVICE, DeviceMixError, DeviceTensor, strict_device

from mhainterp import (
    Ablator,
    ablate,
    average_patterns,
    build_model,
    division_of_labour,
    evaluate_head_sets,
    example_patterns,
    get_task,
    gradient_importance,
    head_importance,
    head_similarity,
    head_statistics,
    pairwise_ablation,
    prune_curve,
    specialization_test,
)
from mhainterp.attribution import attribution_patching
from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.explore.session import ExploreSession
from mhainterp.fast import linear_readout
from mhainterp.fast.stacked import sample_many, train_many
from mhainterp.scoring import Totals
from mhainterp.similarity import SIMILARITY_METHODS, cross_model_similarity
from mhainterp.training import evaluate, train

N_EVAL = 48
LINEAR_READOUT_APPLIES = linear_readout.applies  # before the fixture below replaces it


@pytest.fixture(autouse=True)
def cpu_runs_full_forwards(monkeypatch):
    """The CPU's references score ablated copies as the device does: by full forwards."""
    monkeypatch.setattr(linear_readout, "applies", lambda model, layer: False)


@pytest.fixture(scope="module")
def task():
    return get_task("count_previous", seq_len=8, d_vocab=5)


@pytest.fixture(scope="module")
def model(task):
    return build_model(task, d_model=16, n_heads=4, seed=0, device="cpu")


@pytest.fixture(scope="module")
def trained(task):
    """A model whose heads matter (the division reaches its kept profiles and nulls)."""
    cpu = build_model(task, d_model=16, n_heads=4, seed=0, device="cpu")
    return train(cpu, task, TrainConfig(steps=150, n_eval=64), progress=False).model


@pytest.fixture
def device():
    with strict_device() as state:
        yield state


def on_device(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` on the strict device (inside :func:`strict_device`)."""
    return copy.deepcopy(model).to(DEVICE)


def _frames(result) -> list[pd.DataFrame]:
    """The tables a call returned (a table, rows, a tensor, or an object holding tables)."""
    if isinstance(result, pd.DataFrame):
        return [result]
    if isinstance(result, torch.Tensor):
        return [pd.DataFrame(result.detach().cpu().reshape(len(result), -1).numpy())]
    if isinstance(result, (list, tuple)) and all(isinstance(r, dict) for r in result):
        return [pd.DataFrame(result)]
    if isinstance(result, (list, tuple)):
        return [f for item in result for f in _frames(item)]
    return [v for v in vars(result).values() if isinstance(v, pd.DataFrame)]


def assert_same_tables(got, expected) -> None:
    got, expected = _frames(got), _frames(expected)
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        pd.testing.assert_frame_equal(a, b)


# ----------------------------------------------------------------------------- the device itself


def test_a_cpu_tensor_meeting_a_device_tensor_is_refused(device):
    x = torch.ones(3, device=DEVICE)
    assert isinstance(x, DeviceTensor) and x.device == DEVICE
    with pytest.raises(DeviceMixError, match="same device"):
        x + torch.ones(3)
    with pytest.raises(DeviceMixError, match="same device"):
        torch.ones(2, 3) @ x
    total = torch.zeros(3, dtype=torch.float64, device=DEVICE)
    with pytest.raises(DeviceMixError, match="same device"):  # the ablation engine's crash
        total[[0, 1]] += torch.ones(2, dtype=torch.float64)
    # what CUDA accepts: a 0-dim CPU tensor (a scalar), CPU indices, copies both ways
    assert (x + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]
    assert x[torch.tensor([0, 2])].cpu().tolist() == [1.0, 1.0]
    assert torch.arange(3).to(DEVICE).cpu().tolist() == [0, 1, 2]
    with pytest.raises(DeviceMixError, match="indices"):
        torch.arange(3)[torch.tensor([0, 1], device=DEVICE)]


def test_numpy_of_a_device_tensor_is_refused(device):
    x = torch.ones(2, 2, device=DEVICE)
    with pytest.raises(DeviceMixError, match="numpy"):  # role_frame's crash
        (x.clamp(min=0).sqrt() / 2).numpy()
    with pytest.raises(DeviceMixError, match="numpy"):
        np.asarray(x)
    assert x.cpu().numpy().tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_a_cpu_generator_for_a_device_factory_is_refused(device):
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(DeviceMixError, match="Generator"):
        torch.randint(0, 5, (4,), generator=generator, device=DEVICE)
    with pytest.raises(DeviceMixError, match="Generator"):
        torch.randn(4, generator=generator, device=DEVICE)
    drawn = torch.randint(0, 5, (4,), generator=torch.Generator().manual_seed(0))
    assert drawn.to(DEVICE).cpu().tolist() == drawn.tolist()  # drawn on the host, then moved


def test_host_syncs_are_counted_by_kind_and_call_site(device):
    x = torch.tensor([0.0, 2.0, 0.0, 3.0], device=DEVICE)
    assert device.syncs.total() == 0
    x.sum().item()
    float(x.max())
    x.tolist()
    x.cpu()
    x.nonzero()
    x[x > 1]
    torch.equal(x, x)
    kinds = {kind for kind, _ in device.syncs.counts}
    assert {"item()", ".tolist()", ".cpu()", "nonzero", "boolean index", "torch.equal"} <= kinds
    assert device.syncs.total() >= 7
    assert all(site == "<outside the project>" for _, site in device.syncs.counts)
    device.syncs.reset()
    ones = torch.ones(2, device=DEVICE, dtype=torch.float64)
    Totals(ones, ones[:, None], ones[:1]).metrics()  # the project's code makes the sync
    ((_, site),) = device.syncs.counts
    assert site.startswith("mhainterp/scoring.py:") and site.endswith("(metrics)")
    assert device.syncs.total("scoring.py") == 1
    # a computation alone, and moving data to the device, are no syncs
    device.syncs.reset()
    (x * 2 + torch.arange(4).to(DEVICE)).softmax(0)
    assert device.syncs.total() == 0


def test_a_model_trains_on_it_exactly_as_on_the_cpu(device, task, model):
    """The stand-in computes with the CPU's kernels: training on it gives the CPU's numbers,
    so every other test here can ask for equal tables."""
    config = TrainConfig(steps=12, n_eval=32, log_every=4, batch_size=16)
    on_cpu = train(copy.deepcopy(model), task, config, progress=False)
    on_dev = train(on_device(model), task, config, progress=False)
    assert on_dev.model.embed.weight.device == DEVICE
    pd.testing.assert_frame_equal(on_dev.metrics, on_cpu.metrics)
    assert on_dev.eval == on_cpu.eval
    for (name, a), (_, b) in zip(
        on_dev.model.state_dict().items(), on_cpu.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a.cpu(), b), name


# ----------------------------------------------------------------------------- library calls

CALLS = {
    "evaluate": lambda m, t: pd.DataFrame([evaluate(m, t, n_eval=N_EVAL)]),
    **{
        f"head_importance {method}": (
            lambda m, t, method=method: head_importance(m, t, method=method, n_eval=N_EVAL)
        )
        for method in ("zero", "mean", "resample")
    },
    "pairwise_ablation": lambda m, t: pairwise_ablation(m, t, n_eval=N_EVAL),
    "evaluate_head_sets": lambda m, t: evaluate_head_sets(
        m, t, [[], ["L0H1"], ["L0H0", "L0H2"]], "mean", n_eval=N_EVAL, per_position=True
    ).metrics(),
    "prune_curve": lambda m, t: prune_curve(m, t, n_eval=N_EVAL),
    "Ablator": lambda m, t: Ablator(m, t, n_eval=N_EVAL).toggle("L0H1").table(),
    "attribution_patching": lambda m, t: attribution_patching(m, t, n_eval=N_EVAL),
    "gradient_importance": lambda m, t: gradient_importance(m, t, n_eval=N_EVAL),
    "average_patterns": lambda m, t: average_patterns(m, t, n_eval=N_EVAL),
    "example_patterns": lambda m, t: example_patterns(m, t),
    "head_statistics": lambda m, t: head_statistics(m, t, n_eval=N_EVAL),
    **{
        f"head_similarity {method}": (
            lambda m, t, method=method: head_similarity(m, t, method=method, n_eval=N_EVAL)
        )
        for method in SIMILARITY_METHODS
    },
    "cross_model_similarity": lambda m, t: cross_model_similarity(m, m, t, n_eval=N_EVAL),
    "division_of_labour": lambda m, t: division_of_labour(m, t, n_eval=N_EVAL),
    "specialization_test": lambda m, t: specialization_test(m, t),
}


def test_the_division_s_attribution_screen_runs_on_the_device(model, task):
    """The screen (pretrained verdicts turn it on) estimates every head by attribution
    patching, then computes some exactly: on the device, the CPU's tables."""
    from mhainterp.specialization import DivisionSettings

    settings = DivisionSettings(screen="attribution", n_eval=N_EVAL, n_bootstrap=20)
    expected = division_of_labour(model, task, settings=settings, progress=False)
    with strict_device() as device:
        got = division_of_labour(on_device(model), task, settings=settings, progress=False)
        assert device.syncs.total() > 0  # it did run there
    assert "evidence" in got.heads.columns
    assert_same_tables(got, expected)


@pytest.mark.parametrize("name", sorted(set(CALLS) - {"specialization_test"}))  # trained, below
def test_every_call_runs_on_the_device_and_gives_the_cpus_tables(name, model, task):
    expected = CALLS[name](model, task)
    with strict_device():
        got = CALLS[name](on_device(model), task)
    assert_same_tables(got, expected)


@pytest.mark.parametrize("name", ["division_of_labour", "specialization_test", "prune_curve"])
def test_a_trained_model_on_the_device_gives_the_cpus_tables(name, trained, task):
    """Trained heads do damage: the division's kept profiles and nulls run too."""
    expected = CALLS[name](trained, task)
    with strict_device():
        got = CALLS[name](on_device(trained), task)
    assert_same_tables(got, expected)


def test_the_ablate_context_on_the_device(model, task):
    batch = task.eval_batch(8)
    with ablate(model, ["L0H1", "L0H3"], "mean", reference=task, n_eval=N_EVAL) as ablated:
        expected = ablated(batch.tokens)
    with strict_device() as device:
        moved = on_device(model)
        with ablate(moved, ["L0H1", "L0H3"], "mean", reference=task, n_eval=N_EVAL) as ablated:
            device.syncs.reset()
            got = ablated(batch.tokens.to(DEVICE))
        assert device.syncs.total() == 0, device.syncs.report()  # an ablated forward
        assert torch.equal(got.cpu(), expected)


def test_the_explorer_session_and_one_http_request(model, task):
    from mhainterp.explore.app import Explorer
    from mhainterp.explore.server import build_app

    def views(session: ExploreSession) -> list:
        session.set(["L0H1"])
        return [session.metrics(), session.example(0), session.attention(0, 3)]

    expected = views(ExploreSession(model, task, n_eval=N_EVAL, method="mean"))
    with strict_device():
        moved = on_device(model)
        got = views(ExploreSession(moved, task, n_eval=N_EVAL, method="mean"))
        explorer = Explorer.from_model(moved, task, n_eval=N_EVAL)
        status, body = asyncio.run(_post(build_app(explorer), "/api/toggle", {"head": "L0H2"}))
    assert json.dumps(got, default=str) == json.dumps(expected, default=str)
    assert status == 200 and body["ablated"] == ["L0H2"]


async def _post(app, path: str, body: dict) -> tuple[int, dict]:
    """One POST to an ASGI app, in this thread (where the strict device is active)."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"content-length", str(len(raw)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(payload)


# ----------------------------------------------------------------------------- training


def test_build_model_and_sample_many_on_the_device(task, model):
    from strict_device import cuda_is_strict

    generators = lambda: [torch.Generator().manual_seed(s) for s in (0, 1)]  # noqa: E731
    expected = sample_many(task, 6, generators())
    with strict_device(), pytest.MonkeyPatch.context() as patch, cuda_is_strict(patch):
        built = build_model(task, d_model=16, n_heads=4, seed=0, device="cuda")
        batch = sample_many(task, 6, generators(), DEVICE)
        assert built.embed.weight.device == DEVICE
        assert all(torch.equal(a.cpu(), b) for a, b in zip(built.parameters(), model.parameters()))
        assert batch.tokens.device == DEVICE
        assert torch.equal(batch.tokens.cpu(), expected.tokens)
        assert torch.equal(batch.targets.cpu(), expected.targets)


def test_train_many_on_the_device_equals_it_on_the_cpu(task):
    def models():
        return [
            build_model(task, d_model=16, n_heads=h, seed=s, device="cpu")
            for h, s in ((1, 0), (4, 1), (2, 2))
        ]

    configs = [TrainConfig(steps=8, n_eval=32, log_every=4, seed=s) for s in range(3)]
    expected = train_many(models(), task, configs, progress=False)
    with strict_device():
        runs = train_many([m.to(DEVICE) for m in models()], task, configs, progress=False)
    for got, want in zip(runs, expected, strict=True):
        assert got.model.embed.weight.device == DEVICE
        pd.testing.assert_frame_equal(got.metrics, want.metrics)
        assert got.eval == want.eval


@pytest.mark.parametrize("executor", ["local", "batched"])
def test_run_sweep_on_the_device_with_every_in_process_executor(executor, tmp_path):
    from strict_device import cuda_is_strict

    from mhainterp.sweep import run_sweep

    config = SweepConfig(
        task="reverse",
        task_params={"seq_len": 6, "d_vocab": 4},
        n_heads=[1, 2],
        seeds=[0, 1],
        model={"d_model": 8},
        train=TrainConfig(steps=8, batch_size=8, warmup_steps=2, log_every=4, n_eval=32),
    )
    expected = run_sweep(config, tmp_path / "cpu", executor="local", progress=False, device="cpu")
    with strict_device(), pytest.MonkeyPatch.context() as patch, cuda_is_strict(patch):
        got = run_sweep(config, tmp_path / "dev", executor=executor, progress=False, device="cuda")
    assert len(got) == 4
    columns = ["n_heads", "seed", "val_accuracy", "final_train_loss"]
    pd.testing.assert_frame_equal(got[columns], expected[columns], check_exact=False, rtol=1e-5)


# ----------------------------------------------------------------------------- commands


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, task):
    from mhainterp.cli import main

    out = tmp_path_factory.mktemp("strict") / "run"
    argv = ["train", "--task", "count_previous", "--task-param", "seq_len=8"]
    argv += ["--task-param", "d_vocab=5", "--d-model", "16", "--n-heads", "4", "--steps", "20"]
    assert main([*argv, "--n-eval", "64", "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    return out


COMMANDS = {
    "analyze": ["analyze", "{run}", "--n-eval", "48", "--quiet"],
    "ablate": ["ablate", "{run}", "--heads", "L0H1", "--method", "mean", "--n-eval", "48"],
    "specialize": ["specialize", "{run}", "--n-eval", "48", "--quiet"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_with_device_cuda_runs_on_the_device(command, run_dir, tmp_path, capsys):
    from strict_device import cuda_is_strict

    from mhainterp.cli import main

    argv = [a.format(run=run_dir) for a in COMMANDS[command]]
    with strict_device() as device, pytest.MonkeyPatch.context() as patch, cuda_is_strict(patch):
        assert main([*argv, "--device", "cuda"]) == 0, capsys.readouterr().err
        assert device.syncs.total() > 0  # it did run there


@pytest.mark.slow  # 30 s: its division and specialization test, op by op through the stand-in
def test_the_demo_with_device_cuda_runs_on_the_device(tmp_path, capsys):
    from strict_device import cuda_is_strict

    from mhainterp.cli import main

    argv = ["demo", "--out", str(tmp_path / "demo"), "--steps", "6", "--seeds", "0"]
    argv += ["--n-heads", "1,2", "--no-analysis", "--device", "cuda"]
    with strict_device(), pytest.MonkeyPatch.context() as patch, cuda_is_strict(patch):
        assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "demo" / "report.md").is_file()


@pytest.mark.slow  # 70 s
def test_the_demo_with_its_analysis_on_the_device(tmp_path, capsys):
    from strict_device import cuda_is_strict

    from mhainterp.cli import main

    argv = ["demo", "--out", str(tmp_path / "demo"), "--steps", "10", "--seeds", "0"]
    argv += ["--n-heads", "1,4", "--device", "cuda"]
    with strict_device(), pytest.MonkeyPatch.context() as patch, cuda_is_strict(patch):
        assert main(argv) == 0, capsys.readouterr().err


ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"


@pytest.mark.slow
def test_head_count_study_quick_on_the_device(tmp_path, monkeypatch):
    from strict_device import cuda_is_strict

    monkeypatch.syspath_prepend(str(ANALYSIS))
    import head_count_study

    argv = ["--quick", "--device", "cuda", "--out", str(tmp_path / "study"), "--steps", "20"]
    argv += ["--seeds", "0-1", "--quiet"]
    with strict_device(), cuda_is_strict(monkeypatch):
        assert head_count_study.main(argv) == 0
    assert (tmp_path / "study" / "study_comparisons.csv").is_file()


def test_the_benchmarks_gpu_rows_of_ours_run_on_the_device(monkeypatch):
    """The ``gpu`` section's timing of ``train_many`` (the references draw from a generator
    on the device, which the stand-in cannot make: a real GPU runs those)."""
    from strict_device import cuda_is_strict

    monkeypatch.syspath_prepend(str(ANALYSIS))
    benchmark = pytest.importorskip("benchmark")
    monkeypatch.setattr(benchmark, "GPU_WARMUP_STEPS", 2)
    with strict_device(), cuda_is_strict(monkeypatch):
        rate = benchmark._time_stacked(1, 2, 2, DEVICE, tf32=False)
    assert rate > 0 and math.isfinite(rate)
    sys.modules.pop("benchmark", None)


# ----------------------------------------------------------------------------- sync budgets


def test_a_train_many_step_makes_no_host_sync(task):
    """The host looks once per ``log_every`` steps (the loss curve, diverged rows), never in
    between: the GPU runs ahead of it."""
    models = [build_model(task, d_model=16, n_heads=h, seed=h, device="cpu") for h in (1, 4)]
    configs = [TrainConfig(steps=12, n_eval=32, log_every=6, seed=s) for s in range(2)]
    with strict_device() as device:
        moved = [m.to(DEVICE) for m in models]
        seen: list[int] = []  # the syncs so far, after each step
        train_many(
            moved,
            task,
            configs,
            progress=False,
            on_step=lambda _: seen.append(device.syncs.total()),
        )
    assert len(seen) == 12
    steps_without_log = [seen[i] - seen[i - 1] for i in range(1, 12) if (i + 1) % 6 != 0]
    assert steps_without_log == [0] * len(steps_without_log), device.syncs.report()


def test_train_syncs_once_per_logging_interval(task, model):
    """``train()`` reads its losses once per interval: 20 more steps at ``log_every=10`` cost
    2 more syncs (the final evaluation costs the same in both). It read them twice per step."""

    def syncs(steps: int) -> int:
        config = TrainConfig(steps=steps, n_eval=16, log_every=10, batch_size=8)
        with strict_device() as device:
            moved = on_device(model)
            device.syncs.reset()
            train(moved, task, config, progress=False)
            return device.syncs.total()

    assert syncs(30) - syncs(10) == 2


def test_train_still_stops_at_the_first_bad_loss(task, model):
    from mhainterp.errors import TrainingDivergedError

    config = TrainConfig(steps=20, n_eval=32, log_every=10, lr=1e6, batch_size=16)
    with pytest.raises(TrainingDivergedError) as on_cpu:
        train(copy.deepcopy(model), task, config, progress=False)
    with strict_device(), pytest.raises(TrainingDivergedError) as on_dev:
        train(on_device(model), task, config, progress=False)
    assert str(on_dev.value) == str(on_cpu.value)


@pytest.mark.parametrize("kind", [{"normalization_type": "LN"}, {"attn_only": True}])
@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_an_ablation_makes_the_same_syncs_whatever_the_number_of_head_sets(
    method, task, kind, monkeypatch
):
    """A handful per call (the plan, the replacement, the table), none per forward: the 28
    pairs of heads in 14 forwards cost what 2 head sets do in one (it was 112 against 10).
    Both kinds of model: with LayerNorm every forward is a full one; attention-only, the CPU
    scores the last layer's copies through the linear readout, whose tie guard reads from the
    host once per chunk, so on a device the engine runs full forwards instead."""
    cpu = build_model(task, d_model=16, n_heads=4, n_layers=2, seed=0, device="cpu", **kind)
    heads = [f"L{layer}H{head}" for layer in range(2) for head in range(4)]
    many = [[a, b] for a in heads for b in heads if a < b]  # 28

    monkeypatch.setattr(linear_readout, "applies", LINEAR_READOUT_APPLIES)  # the real rule

    def syncs(head_sets: list) -> tuple[int, list]:
        with strict_device() as device:
            moved = on_device(cpu)
            device.syncs.reset()
            result = evaluate_head_sets(moved, task, head_sets, method, n_eval=32, max_rows=64)
            return device.syncs.total(), result.metrics(), device.syncs.report()

    few, _, report = syncs([[], ["L1H0"]])
    more, metrics, _ = syncs(many)
    assert few == more <= 8, report
    with monkeypatch.context() as full_forwards:  # the device's path, on the CPU
        full_forwards.setattr(linear_readout, "applies", lambda model, layer: False)
        expected = evaluate_head_sets(cpu, task, many, method, n_eval=32, max_rows=64).metrics()
    assert metrics == expected


def test_the_linear_readout_is_a_cpu_path(task):
    """Its tie guard reads from the host once per chunk: on a device the engine runs full
    forwards, so that an ablation's syncs stay constant (the test above)."""
    cpu = build_model(task, d_model=16, n_heads=4, n_layers=1, seed=0, device="cpu", attn_only=True)
    assert LINEAR_READOUT_APPLIES(cpu, 0)
    with strict_device():
        assert not LINEAR_READOUT_APPLIES(on_device(cpu), 0)


def test_validate_inputs_makes_no_sync_on_device_tokens(model):
    tokens = torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1]])
    with strict_device() as device:
        moved = on_device(model)
        on_dev = tokens.to(DEVICE)
        device.syncs.reset()
        moved.validate_inputs(on_dev, torch.ones(2, 4, dtype=torch.bool, device=DEVICE))
        moved(on_dev)
        assert device.syncs.total() == 0, device.syncs.report()
        with pytest.raises(RuntimeError, match="tokens is invalid"):  # checked on the device
            moved.validate_inputs((tokens + 3).to(DEVICE))
    with pytest.raises(ValueError, match=r"got values in \[3, 7\]"):  # on the host: the values
        model.validate_inputs(tokens + 3)


def test_a_pretrained_model_runs_on_the_device_with_the_cpus_tables(tmp_path_factory):
    """The pretrained path, offline: a tiny Llama (grouped key/value heads) saved locally and
    loaded through ``load_pretrained``, moved to the device; head importance and the division
    of labour on a text task give exactly the CPU's tables."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    import test_pretrained_verdict as tiny

    from mhainterp.tasks.text import TextTask

    model = tiny._tiny(tmp_path_factory, "llama")
    task = TextTask(model, sentences=tiny._sentences(), n_eval=6)
    importance = head_importance(model, task, method="mean")
    division = division_of_labour(model, task).index
    with strict_device():
        model.to(DEVICE)
        assert {p.device for p in model.parameters()} == {DEVICE}
        pd.testing.assert_frame_equal(head_importance(model, task, method="mean"), importance)
        pd.testing.assert_frame_equal(division_of_labour(model, task).index, division)
