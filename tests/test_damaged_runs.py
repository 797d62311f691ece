"""Damaged run folders: every command either works or exits 2 with one line naming the file.

Each case damages one file of a real (tiny) run folder: missing, empty, truncated, not what
it should be, or disagreeing with another file. The commands run through ``cli.main``, as the
console script does; an exception escaping ``main`` would be the traceback a user sees.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mhainterp.cli import main
from mhainterp.config import TrainConfig
from mhainterp.errors import RunFolderError
from mhainterp.tasks import get_task
from mhainterp.training import build_model, train

TINY_TRAIN = TrainConfig(steps=10, batch_size=8, warmup_steps=2, log_every=5, n_eval=32)


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    task = get_task("reverse", seq_len=6, d_vocab=4)
    run_dir = tmp_path_factory.mktemp("good") / "run"
    train(build_model(task, d_model=8, n_heads=2, seed=0), task, TINY_TRAIN, run_dir=run_dir,
          progress=False)  # fmt: skip
    return run_dir


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _edit_config(**model_fields) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        config = json.loads((run / "config.json").read_text())
        config["model"].update(model_fields)
        (run / "config.json").write_text(json.dumps(config))

    return edit


def _strip_metadata(change: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """An old run (weights without metadata), optionally with a disagreeing config."""

    def edit(run: Path) -> None:
        path = run / "model.safetensors"
        save_file(load_file(path), path)
        # an old run's eval.json has no record of its weights and task either
        saved = json.loads((run / "eval.json").read_text())
        for key in ("weights_sha256", "trained_on"):
            saved.pop(key, None)
        (run / "eval.json").write_text(json.dumps(saved))
        if change:
            change(run)

    return edit


def _write(name: str, content: bytes) -> Callable[[Path], None]:
    return lambda run: (run / name).write_bytes(content)


def _drop_task(run: Path) -> None:
    config = json.loads((run / "config.json").read_text())
    del config["task"]
    (run / "config.json").write_text(json.dumps(config))


def _narrow_weights(run: Path) -> None:
    """Weights of another width (their metadata kept): only the tensor shapes disagree."""
    path = run / "model.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    state = {k: v[..., :-1].contiguous() for k, v in load_file(path).items()}
    save_file(state, path, metadata=metadata)


def _weights(change: Callable[[dict], dict], metadata: dict | None = None):
    """Rewrite model.safetensors with its tensors changed (metadata kept unless given)."""

    def edit(run: Path) -> None:
        from safetensors import safe_open

        path = run / "model.safetensors"
        with safe_open(str(path), "pt") as f:
            kept = f.metadata()
        save_file(change(load_file(path)), path, metadata=kept if metadata is None else metadata)

    return edit


def _cast(dtype):
    return _weights(lambda state: {k: v.to(dtype) for k, v in state.items()})


def _fill(value: float):
    return _weights(lambda state: {k: torch.full_like(v, value) for k, v in state.items()})


def _edit_eval(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        saved = json.loads((run / "eval.json").read_text())
        (run / "eval.json").write_text(json.dumps(change(saved)))

    return edit


def _step_abc(run: Path) -> None:
    lines = (run / "metrics.csv").read_text().splitlines()
    lines[1] = "abc" + lines[1][lines[1].index(",") :]
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")


def _no_metadata_other_shapes(run: Path) -> None:
    """Metadata ``{}`` (nothing to compare) and a config that claims a wider model."""
    _weights(lambda state: state, metadata={})(run)
    _edit_config(d_model=16, d_head=8, d_mlp=64)(run)


# case id -> (damage, file the message must name)
CASES: dict[str, tuple[Callable[[Path], None], str]] = {}
for _name in ("config.json", "model.safetensors", "metrics.csv", "eval.json"):
    CASES[f"{_name}-missing"] = (lambda run, n=_name: (run / n).unlink(), _name)
    CASES[f"{_name}-empty"] = (_write(_name, b""), _name)
    CASES[f"{_name}-truncated"] = (lambda run, n=_name: _truncate(run / n), _name)
CASES.update(
    {
        "config.json-garbage": (_write("config.json", b"\x89PNG\x00\xff"), "config.json"),
        "config.json-list": (_write("config.json", b"[1, 2]"), "config.json"),
        "config.json-no-task": (_drop_task, "config.json"),
        "config.json-bad-field": (_edit_config(n_heads=3), "config.json"),
        "config.json-unknown-task": (
            lambda run: (run / "config.json").write_text(
                (run / "config.json").read_text().replace('"reverse"', '"no_such_task"')
            ),
            "config.json",
        ),
        "model.safetensors-garbage": (_write("model.safetensors", b"x" * 64), "model.safetensors"),
        "metrics.csv-garbage": (_write("metrics.csv", b"\xff\xfe\x00bad"), "metrics.csv"),
        "eval.json-garbage": (_write("eval.json", b"{not json"), "eval.json"),
        # disagreeing files: the weights were trained with n_heads=2, causal=False, d_model=8
        "n_heads-disagrees": (_edit_config(n_heads=4, d_head=2), "config.json"),
        "n_heads-disagrees-1": (_edit_config(n_heads=1, d_head=8), "config.json"),
        "causal-disagrees": (_edit_config(causal=True), "config.json"),
        "d_model-disagrees": (_edit_config(d_model=16, d_head=8, d_mlp=64), "model.safetensors"),
        "old-run-n_heads-disagrees": (
            _strip_metadata(_edit_config(n_heads=4, d_head=2)),
            "config.json",
        ),
        "weights-of-another-shape": (_narrow_weights, "model.safetensors"),
        # issue 19 items 5-6: silent wrong results and tracebacks before
        "weights-int64": (_cast(torch.int64), "model.safetensors"),
        "weights-float16": (_cast(torch.float16), "model.safetensors"),
        "weights-all-nan": (_fill(float("nan")), "model.safetensors"),
        "weights-all-inf": (_fill(float("inf")), "model.safetensors"),
        "metadata-5": (_weights(lambda s: s, {"mhainterp.model": "5"}), "model.safetensors"),
        "metadata-empty-config-wider": (_no_metadata_other_shapes, "model.safetensors"),
        "eval.json-list": (_write("eval.json", b"[]"), "eval.json"),
        "eval.json-loss-abc": (_edit_eval(lambda e: {**e, "loss": "abc"}), "eval.json"),
        "metrics.csv-step-abc": (_step_abc, "metrics.csv"),
        "config.json-dtype-bogus": (_edit_config(dtype="bogus"), "config.json"),
        # an empty column reads as text: the non-number check indexed a value it had not
        "metrics.csv-header-only": (
            _write("metrics.csv", b"step,loss,lr,grad_norm\n"),
            "metrics.csv",
        ),
    }
)
# the cases of issue 19 items 5-6, also tried on resume and in the explorer
RESUME_CASES = [
    "weights-int64",
    "weights-float16",
    "weights-all-nan",
    "metadata-5",
    "metadata-empty-config-wider",
    "eval.json-list",
    "eval.json-loss-abc",
    "eval.json-no-final_train_loss",
    "metrics.csv-step-abc",
    "config.json-dtype-bogus",
]
CONFIG_EDITS = {"metadata-empty-config-wider", "config.json-dtype-bogus"}
RESUME_ONLY = {
    "eval.json-no-final_train_loss": (
        _edit_eval(lambda e: {k: v for k, v in e.items() if k != "final_train_loss"}),
        "eval.json",
    )
}

COMMANDS = {
    "analyze": ["analyze", "{run}", "--n-eval", "16", "--no-ablation", "--quiet"],
    "ablate": ["ablate", "{run}", "--heads", "L0H1", "--n-eval", "16"],
    "specialize": ["specialize", "{run}", "--n-eval", "16", "--quiet"],
    "report": ["report", "{run}", "--n-eval", "16", "--quiet"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_run_folder_gives_one_line_naming_the_file(case, good_run, tmp_path, capsys):
    damage, named = CASES[case]
    for command, argv in COMMANDS.items():
        run = tmp_path / command / "run"
        shutil.copytree(good_run, run)
        damage(run)
        before = sorted(p.relative_to(run) for p in run.rglob("*"))
        code = main([a.format(run=run) for a in argv])
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert code == 2, (case, command, captured.err)
        assert len(lines) == 1, (case, command, captured.err)
        assert lines[0].startswith(f"mhainterp {command}: error: "), lines[0]
        assert named in lines[0], (case, command, lines[0])
        # nothing was computed for a damaged or wrong model
        assert captured.out == "", (case, command, captured.out)
        assert sorted(p.relative_to(run) for p in run.rglob("*")) == before, (case, command)


def test_old_run_without_metadata_still_loads_and_is_checked_by_its_loss(good_run, tmp_path):
    from mhainterp.training import load_run

    run = tmp_path / "old"
    shutil.copytree(good_run, run)
    _strip_metadata()(run)
    loaded = load_run(run)
    assert loaded.model.cfg.n_heads == 2
    # the check that stands in for the metadata: the weights reproduce eval.json's loss
    saved = json.loads((run / "eval.json").read_text())
    from mhainterp.training import evaluate

    assert evaluate(loaded.model, loaded.task, n_eval=32)["loss"] == pytest.approx(
        saved["loss"], rel=1e-6
    )


MODEL_ARGS = ["--task", "reverse", "--task-param", "seq_len=6", "--task-param", "d_vocab=4",
              "--d-model", "8", "--n-heads", "2", "--steps", "10", "--batch-size", "8",
              "--warmup-steps", "2", "--n-eval", "32", "--quiet"]  # fmt: skip


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def made_by_commands(tmp_path_factory) -> tuple[Path, Path]:
    """A run made by ``mhainterp train`` and a sweep by ``mhainterp sweep``, same settings."""
    base = tmp_path_factory.mktemp("commands")
    assert main(["train", *MODEL_ARGS, "--seed", "0", "--out", str(base / "run")]) == 0
    sweep = ["sweep", *MODEL_ARGS, "--seeds", "0", "--executor", "local", "--out"]
    assert main([*sweep, str(base / "sweep")]) == 0
    return base / "run", base / "sweep"


@pytest.mark.parametrize("case", RESUME_CASES)
def test_damaged_run_is_refused_on_train_resume_sweep_resume_and_in_the_explorer(
    case, made_by_commands, tmp_path, capsys
):
    from mhainterp.explore.app import Explorer

    damage, named = {**CASES, **RESUME_ONLY}[case]
    made_run, made_sweep = made_by_commands
    capsys.readouterr()
    # train resume: the same command into the damaged run
    run = tmp_path / "run"
    shutil.copytree(made_run, run)
    damage(run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    code = main(["train", *MODEL_ARGS, "--seed", "0", "--out", str(run)])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("mhainterp train: error: "), line
    # a damage that edits config.json makes it another run, refused as such
    assert named in line or (case in CONFIG_EDITS and "already holds another run" in line), line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # not trained over
    # sweep resume: the damaged run inside the sweep
    sweep = tmp_path / "sweep"
    shutil.copytree(made_sweep, sweep)
    damage(sweep / "runs" / "h2_seed0")
    code = main(["sweep", *MODEL_ARGS, "--seeds", "0", "--executor", "local", "--out", str(sweep)])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("mhainterp sweep: error: "), line
    assert named in line or (case in CONFIG_EDITS and "holds another run" in line), line
    if case in RESUME_ONLY:
        return  # analyses need no final_train_loss: only the resumes refuse it
    # the explorer's loading
    with pytest.raises(ValueError) as error:
        Explorer.from_path(run)
    assert named in str(error.value) and "\n" not in str(error.value)


# ----- checking folders from their files (issue 41) ---------------------------------------------
VALUE_CASES = {"weights-all-nan", "weights-all-inf"}
"""Damage in the tensors' values alone: loading refuses the values, the check from the files
(which reads no value) refuses the file by the digest eval.json recorded."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_checking_a_folder_from_its_files_refuses_it_as_loading_does(case, good_run, tmp_path):
    from mhainterp.training import check_run_folder, load_run

    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    CASES[case][0](run)
    with pytest.raises((FileNotFoundError, ValueError)) as loading:  # RunFolderError, read_json
        load_run(run, device="cpu")
    if case in VALUE_CASES:  # the header shows nothing wrong; the recorded digest does
        with pytest.raises(RunFolderError, match="is not the file this run saved"):
            check_run_folder(run)
        return
    with pytest.raises(type(loading.value)) as checking:
        check_run_folder(run)
    assert str(checking.value) == str(loading.value)


def test_checking_run_folders_loads_no_weights(good_run, tmp_path, monkeypatch):
    """``analyze``, ``specialize`` and ``report`` check every run folder before computing
    (check_run_folders): from the files, with no run's weights loaded, and still refusing a
    folder whose config disagrees with its weights."""
    import mhainterp.training.run_folder as run_folder
    from mhainterp.cli.options import check_run_folders

    runs = tmp_path / "sweep" / "runs"
    for name in ("h2_seed0", "h2_seed1"):
        shutil.copytree(good_run, runs / name)

    def no_loading(*args, **kwargs):
        raise AssertionError("a run's weights were loaded")

    monkeypatch.setattr(run_folder, "_read_weights", no_loading)
    monkeypatch.setattr(run_folder, "load_run", no_loading)
    monkeypatch.setattr(run_folder.HookedMHATransformer, "load_state_dict", no_loading)
    check_run_folders(tmp_path / "sweep")
    _edit_config(n_heads=4, d_head=2)(runs / "h2_seed1")
    with pytest.raises(RunFolderError, match="n_heads=4 in config.json but 2 in the weights"):
        check_run_folders(tmp_path / "sweep")


# ----- what the messages tell the user to do ----------------------------------------------------
def test_a_header_only_metrics_csv_says_it_holds_no_rows(good_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    _write("metrics.csv", b"step,loss,lr,grad_norm\n")(run)
    expected = (
        f"{run / 'metrics.csv'} is cut short: it holds no rows, but the run trained 10 steps; "
        f"retrain it: rerun its train command with --overwrite (or move {run} away first)"
    )
    with pytest.raises(RunFolderError) as error:
        from mhainterp import load_run

        load_run(run)
    assert str(error.value) == expected
    assert main(["ablate", str(run), "--heads", "L0H1", "--n-eval", "16"]) == 2
    assert _one_line(capsys.readouterr().err) == f"mhainterp ablate: error: {expected}"


def test_a_damaged_run_of_a_sweep_names_a_fix_that_works(tiny_sweep, tmp_path, capsys):
    """Rerunning the sweep (or train --overwrite) checks the damaged files first and refuses
    them again: the advice is to move the folder out, then rerun, and that does retrain it."""
    from conftest import TINY_SWEEP

    from mhainterp.sweep import run_sweep
    from mhainterp.training import load_run

    sweep = tmp_path / "rev"
    shutil.copytree(tiny_sweep, sweep)
    run = sweep / "runs" / "h1_seed0"
    _truncate(run / "model.safetensors")
    advice = f"retrain it: move {run} out of {sweep} (or delete it), then rerun the sweep"
    assert main(["specialize", str(sweep), "--n-eval", "16", "--quiet"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(run / "model.safetensors") in line and line.endswith(advice), line
    with pytest.raises(RunFolderError, match="rerun the sweep$"):  # the resume refuses it too
        run_sweep(TINY_SWEEP, sweep, executor="local", progress=False)
    shutil.rmtree(run)  # what the message says: the sweep then retrains the run
    run_sweep(TINY_SWEEP, sweep, executor="local", progress=False)
    assert load_run(run).eval["status"] == "finished"


def test_a_damaged_run_of_its_own_is_retrained_by_the_advice_it_gets(
    made_by_commands, tmp_path, capsys
):
    """A run of its own with damaged weights: the message says to rerun its train command with
    --overwrite, and that works (it used to check the damaged files first and refuse them
    again, a loop); without --overwrite the damaged run is refused, never trained over."""
    run = tmp_path / "run"
    shutil.copytree(made_by_commands[0], run)
    capsys.readouterr()
    _truncate(run / "model.safetensors")
    command = ["train", *MODEL_ARGS, "--seed", "0", "--out", str(run)]
    assert main(command) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.endswith(
        f"retrain it: rerun its train command with --overwrite (or move {run} away first)"
    ), line
    assert main([*command, "--overwrite"]) == 0, capsys.readouterr().err
    from mhainterp.training import load_run

    assert load_run(run).eval["status"] == "finished"


@pytest.fixture(scope="module")
def diverged_run(tmp_path_factory) -> tuple[Path, str]:
    """A run that ``mhainterp train`` saved as diverged, and the step its eval.json names."""
    run = tmp_path_factory.mktemp("diverged") / "run"
    assert main(["train", *MODEL_ARGS, "--seed", "0", "--lr", "1e30", "--out", str(run)]) == 2
    saved = json.loads((run / "eval.json").read_text())
    assert saved["status"] == "diverged"
    step = saved["message"].split(" at step ")[1].split(".")[0]
    return run, step


def test_a_diverged_run_is_refused_as_diverged_by_every_reader(diverged_run, capsys):
    from mhainterp.runs import find_runs, folder_kind
    from mhainterp.training import check_run_folder, load_run

    run, step = diverged_run
    expected = (
        f"{run} diverged at step {step} (its eval.json says so): it holds no trained model; "
        "retrain it with a lower --lr"
    )
    capsys.readouterr()
    for command, argv in COMMANDS.items():
        assert main([a.format(run=run) for a in argv]) == 2, command
        assert _one_line(capsys.readouterr().err) == f"mhainterp {command}: error: {expected}"
    for read in (
        load_run,
        check_run_folder,
        folder_kind,
        find_runs,
        lambda _: find_runs(run.parent),
    ):
        with pytest.raises(RunFolderError) as error:
            read(run)
        assert str(error.value) == expected


def test_weights_or_a_task_other_than_eval_json_recorded_are_refused(good_run, tmp_path):
    """A newcomer audit loaded, without a word: 1,000 bytes flipped inside the tensor data
    (accuracy 0.04 against the 0.994 eval.json says), another run's weights copied in, and a
    config.json edited to another task of the same shapes. eval.json records the weights'
    SHA-256 and the task: each is refused, by loading and by the check from the files."""
    from mhainterp.training import check_run_folder, load_run

    flipped = tmp_path / "flipped"
    shutil.copytree(good_run, flipped)
    data = bytearray((flipped / "model.safetensors").read_bytes())
    data[-64:] = bytes(b ^ 0xFF for b in data[-64:])  # the last tensor's values, header intact
    (flipped / "model.safetensors").write_bytes(bytes(data))
    for check in (load_run, check_run_folder):
        with pytest.raises(RunFolderError, match="is not the file this run saved.*SHA-256"):
            check(flipped)

    other_task = tmp_path / "other_task"
    shutil.copytree(good_run, other_task)
    config = json.loads((other_task / "config.json").read_text())
    assert config["task"]["name"] == "reverse"
    config["task"]["name"] = "sort"  # same vocabulary and length: every shape still fits
    (other_task / "config.json").write_text(json.dumps(config))
    for check in (load_run, check_run_folder):
        with pytest.raises(RunFolderError, match="disagrees with eval.json: it names task"):
            check(other_task)
