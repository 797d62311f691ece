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
from safetensors.torch import load_file, save_file

from mhainterp.cli import main
from mhainterp.config import TrainConfig
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
    }
)

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
