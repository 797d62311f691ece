"""Output folders and options that were silently mixed or ignored (CLI audit): a run written
into a sweep's folder and the reverse, an empty --out, train() over another finished run, a
folder given with --model or --out, the ablate table's columns, demo's help, explore's --host."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from mhainterp.cli import main
from mhainterp.config import TrainConfig
from mhainterp.sweep import run_sweep
from mhainterp.tasks import get_task
from mhainterp.training import build_model, train
from mhainterp.validation import ParameterError

TASK_ARGS = ["--task", "reverse", "--task-param", "seq_len=6", "--task-param", "d_vocab=4"]
TINY = ["--d-model", "8", "--steps", "10", "--batch-size", "8", "--warmup-steps", "2",
        "--n-eval", "32", "--quiet"]  # fmt: skip
TRAIN = ["train", *TASK_ARGS, "--n-heads", "2", *TINY]
SWEEP = ["sweep", *TASK_ARGS, "--n-heads", "2", "--seeds", "0", "--executor", "local", *TINY]
CONFIG = TrainConfig(steps=10, batch_size=8, warmup_steps=2, n_eval=32)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _model(seed: int = 0):
    task = get_task("reverse", seq_len=6, d_vocab=4)
    return build_model(task, d_model=8, n_heads=2, seed=seed, device="cpu"), task


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path]:
    """A run made by ``mhainterp train`` and a sweep by ``mhainterp sweep``."""
    base = tmp_path_factory.mktemp("made")
    assert main([*TRAIN, "--out", str(base / "run")]) == 0
    assert main([*SWEEP, "--out", str(base / "sweep")]) == 0
    return base / "run", base / "sweep"


# ----- 1. --out of the other kind, or empty ------------------------------------------------------
def test_sweep_into_a_run_folder_is_refused_and_leaves_it_as_it_was(made, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(made[0], run)
    before = _files(run)
    capsys.readouterr()
    assert main([*SWEEP, "--out", str(run)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"mhainterp sweep: error: --out={str(run)!r} is invalid: a folder free for this sweep, "
        f"but it holds a run ({run / 'eval.json'}); choose another --out"
    )
    assert _files(run) == before


def test_train_into_a_sweep_folder_is_refused_and_leaves_it_as_it_was(made, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    shutil.copytree(made[1], sweep)
    before = _files(sweep)
    capsys.readouterr()
    assert main([*TRAIN, "--out", str(sweep)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"mhainterp train: error: --out={str(sweep)!r} is invalid: a folder free for this run, "
        f"but it holds a sweep ({sweep / 'sweep.json'}); choose another --out"
    )
    assert _files(sweep) == before


def test_train_into_a_folder_of_sweeps_is_refused(made, tmp_path, capsys):
    shutil.copytree(made[1], tmp_path / "study" / "reverse")
    capsys.readouterr()
    assert main([*TRAIN, "--out", str(tmp_path / "study")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"holds sweep folders ({tmp_path / 'study' / 'reverse' / 'sweep.json'})" in line


@pytest.mark.parametrize("command", [TRAIN, SWEEP], ids=["train", "sweep"])
def test_an_empty_out_is_refused_not_taken_for_the_current_folder(
    command, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--out", ""]) == 2
    assert _one_line(capsys.readouterr().err).endswith(
        "--out='' is invalid: a folder path, not empty (give . for the current folder)"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["run", "sweep"])
def test_demo_into_a_run_or_sweep_folder_is_refused(kind, made, monkeypatch, capsys):
    import mhainterp.analyze

    def refuse(*args, **kwargs):
        raise AssertionError("the refusal must come before the demo runs")

    monkeypatch.setattr(mhainterp.analyze, "run_demo", refuse)
    folder = made[0] if kind == "run" else made[1]
    marker = "eval.json" if kind == "run" else "sweep.json"
    capsys.readouterr()
    assert main(["demo", "--out", str(folder), "--steps", "10", "--seeds", "0"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"mhainterp demo: error: --out={str(folder)!r} is invalid: a folder free for the demo's "
        f"sweeps, but it holds a {kind} ({folder / marker}); choose another --out"
    )


def test_run_sweep_refuses_a_run_folder_and_train_a_sweep_folder(made, tmp_path):
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    shutil.copytree(made[0], run)
    shutil.copytree(made[1], sweep)
    with pytest.raises(ParameterError, match=r"out_dir=.* holds a run .*choose another out_dir"):
        run_sweep("reverse", run, n_heads=[2], seeds=[0], progress=False)
    model, task = _model()
    with pytest.raises(ParameterError, match=r"run_dir=.* holds a sweep .*choose another run_dir"):
        train(model, task, CONFIG, run_dir=sweep, progress=False)
    assert not (sweep / "eval.json").exists()


# ----- 2. train() over another finished run ------------------------------------------------------
def test_train_api_keeps_another_finished_run_unless_overwrite(tmp_path):
    run_dir = tmp_path / "run"
    model, task = _model(seed=0)
    train(model, task, CONFIG, run_dir=run_dir, progress=False)
    before = _files(run_dir)
    other, task = _model(seed=1)
    with pytest.raises(ParameterError) as error:
        train(other, task, CONFIG, run_dir=run_dir, progress=False)
    assert str(error.value) == (
        f"run_dir={str(run_dir)!r} is invalid: a folder free for this run, but it already holds "
        "another run, finished (model.seed: 0 there, 1 here); to keep that one, choose another "
        "run_dir; to replace it, pass overwrite=True"
    )
    assert _files(run_dir) == before
    train(other, task, CONFIG, run_dir=run_dir, progress=False, overwrite=True)
    assert '"seed": 1' in (run_dir / "config.json").read_text()
    same, task = _model(seed=1)  # the same run again: trained again, no refusal
    assert train(same, task, CONFIG, run_dir=run_dir, progress=False).eval["status"] == "finished"


# ----- 3. a folder given with --model or --out ---------------------------------------------------
@pytest.fixture
def no_model_loading(monkeypatch):
    import mhainterp.analyze
    import mhainterp.cli.pretrained_options as pretrained_options

    def refuse(*args, **kwargs):
        raise AssertionError("the refusal must come before any loading or analysis")

    monkeypatch.setattr(pretrained_options, "load_model", refuse)
    monkeypatch.setattr(mhainterp.analyze, "analyze_path", refuse)


@pytest.mark.parametrize(
    ("command", "folder_name"), [("specialize", "RUN_OR_SWEEP"), ("analyze", "path")]
)
def test_a_folder_with_model_is_refused_before_loading(
    command, folder_name, made, no_model_loading, capsys
):
    run = made[0]
    capsys.readouterr()
    assert main([command, str(run), "--model", "minilm"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"mhainterp {command}: error: --model='minilm' is invalid: given with {folder_name} "
        f"({run}); give either {folder_name} or --model, not both"
    )


@pytest.mark.parametrize("command", ["analyze", "specialize"])
def test_out_with_a_folder_is_refused(command, made, tmp_path, no_model_loading, capsys):
    run, elsewhere = made[0], tmp_path / "elsewhere"
    capsys.readouterr()
    assert main([command, str(run), "--out", str(elsewhere)]) == 2
    line = _one_line(capsys.readouterr().err)
    # the value is shortened past 80 characters (validation._show): a long tmp path is
    assert line.startswith(f"mhainterp {command}: error: --out=")
    assert line.endswith(
        " is invalid: only for --model "
        f"(a run's analysis goes to RUN/analysis, inside {run}); drop --out"
    ), line
    assert not elsewhere.exists()


def _verdict_folder(base: Path) -> Path:
    """What marks `specialize --model`'s folder, with the provenance analyze overwrote."""
    from mhainterp.runs import PRETRAINED_VERDICT_FILE

    folder = base / "verdict"
    folder.mkdir()
    (folder / PRETRAINED_VERDICT_FILE).write_text('{"sentences": [], "name": "m"}')
    (folder / "provenance.json").write_text('{"n_sentences": 64}')
    return folder


def test_analyze_model_into_a_verdict_or_run_folder_is_refused_before_loading(
    made, tmp_path, no_model_loading, capsys
):
    """`analyze --model` into `specialize --model`'s folder replaced its provenance.json (64
    sentences became 8, its damage unit was lost) and `report` then misstated the verdict; into
    a trained run it wrote 5 files beside the model. Both refused, nothing written."""
    verdict = _verdict_folder(tmp_path)
    before = _files(verdict)
    for folder, held in ((verdict, "a pretrained verdict"), (made[0], "a run")):
        capsys.readouterr()
        assert main(["analyze", "--model", "minilm", "--out", str(folder)]) == 2
        line = _one_line(capsys.readouterr().err)
        assert "is invalid: a folder free for this pretrained analysis, but it holds " in line
        assert f"{held} (" in line and line.endswith("; choose another --out"), line
    assert _files(verdict) == before


def test_the_two_pretrained_commands_refuse_each_others_folders_in_the_library(tmp_path):
    from mhainterp.analyze import analyze_pretrained
    from mhainterp.analyze.pretrained_verdict import specialize_pretrained
    from mhainterp.runs import PRETRAINED_ANALYSIS_FILE

    analysis = tmp_path / "analysis"
    analysis.mkdir()
    (analysis / PRETRAINED_ANALYSIS_FILE).write_text("head_label,category\n")
    with pytest.raises(ParameterError, match="holds a pretrained analysis"):
        specialize_pretrained("no-such-model", "stdlib", analysis)  # refused before loading
    with pytest.raises(ParameterError, match="holds a pretrained verdict"):
        analyze_pretrained("no-such-model", "stdlib", _verdict_folder(tmp_path))


def test_analyze_model_writes_beside_the_verdict_by_default(no_model_loading, monkeypatch):
    """`specialize --model minilm` writes runs/minilm; `analyze --model minilm` runs/minilm-
    analysis, so that the two defaults never meet (the load is refused here: no model runs)."""
    seen = []
    monkeypatch.setattr("mhainterp.runs.check_free_folder", lambda *a: seen.append(a[:2]))
    with pytest.raises(AssertionError, match="before any loading"):
        main(["analyze", "--model", "minilm"])
    assert seen == [(Path("runs") / "minilm-analysis", "pretrained analysis")]


def test_report_on_a_pretrained_verdict_refuses_the_settings_it_would_ignore(
    tmp_path, monkeypatch, capsys
):
    """`report` renders `specialize --model`'s saved verdict as it is: --alpha, --n-eval, --by
    ... gave a byte-identical report, while the help says they recompute. Refused, by name."""
    from mhainterp.analyze import pretrained_verdict

    verdict = _verdict_folder(tmp_path)
    rendered = []
    monkeypatch.setattr(
        pretrained_verdict, "write_pretrained_report", lambda *a: rendered.append(a) or ("m", "h")
    )
    capsys.readouterr()
    assert main(["report", str(verdict), "--alpha", "0.001", "--by", "position"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"mhainterp report: error: {verdict} is what `specialize --model` wrote: report renders "
        "that verdict as saved and takes no --alpha, --by; rerun `mhainterp specialize --model "
        "NAME` with them instead"
    )
    assert rendered == []
    assert main(["report", str(verdict), "--quiet"]) == 0 and len(rendered) == 1


# ----- 4. the ablate table -----------------------------------------------------------------------
def test_ablate_table_keeps_a_space_between_large_numbers():
    from mhainterp.cli.ablate import format_metrics_table

    large = pd.DataFrame(
        {"metric": ["loss"], "baseline": [13263.400711], "ablated": [11096.8913],
         "delta": [-2166.5094]}
    )  # fmt: skip
    assert format_metrics_table(large).splitlines()[1].split() == [
        "loss", "13263.4007", "11096.8913", "-2166.5094"
    ]  # fmt: skip
    normal = pd.DataFrame(
        {"metric": ["loss", "accuracy"], "baseline": [0.0, 1.0], "ablated": [0.0, 1.0],
         "delta": [0.0, 0.0]}
    )  # fmt: skip
    assert format_metrics_table(normal) == (
        "metric        before     after    change\n"
        "loss          0.0000    0.0000   +0.0000\n"
        "accuracy      1.0000    1.0000   +0.0000"
    )


# ----- 5. demo's help ----------------------------------------------------------------------------
def test_demo_help_says_what_no_analysis_skips_and_the_seeds_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--no-analysis skip the head analysis of one run per task" in help_text
    assert "the specialization test of every run, the figures and the report still run" in (
        help_text
    )
    start = help_text.index("--seeds A,B,C-D seeds,")  # its help, not the usage line
    seeds = help_text[start : help_text.index("--n-heads A,B,C-D head counts")]
    assert seeds.count("(default") == 1, seeds


# ----- 6. explore's --host -----------------------------------------------------------------------
def test_explore_names_host_when_the_host_cannot_be_listened_on(made, capsys):
    pytest.importorskip("uvicorn")
    capsys.readouterr()
    assert main(["explore", str(made[0]), "--host", "999.1.1.1", "--no-browser"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(
        "mhainterp explore: error: --host='999.1.1.1' is invalid: an address this machine can "
        "listen on ("
    ), line
    assert line.endswith("choose another --host (127.0.0.1: this machine only)"), line
    assert "--port" not in line


# ----- smaller messages from the same audit ------------------------------------------------------
def test_a_repeated_seed_is_named(capsys):
    assert main(["sweep", "--task", "reverse", "--seeds", "0,0-2", "--steps", "5"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.endswith("comma-separated (0 given twice)"), line


def test_a_run_file_given_for_its_folder_is_named_as_a_file(made, capsys):
    run = made[0]
    assert main(["analyze", str(run / "config.json")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.endswith(f"config.json is a file, not a folder: give its folder ({run})"), line


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["sweep", "--task", "reverse", "--n-heads", "3", "--steps", "5"], "--n-heads=[3] is"),
        (["train", "--task", "reverse", "--warmup-steps", "50", "--steps", "5"],
         "--warmup-steps=50 is"),
        (["specialize"], "RUN_OR_SWEEP=None is"),
    ],
    ids=["sweep", "train", "specialize"],
)  # fmt: skip
def test_a_library_check_names_the_flag_the_user_typed(argv, start, tmp_path, capsys):
    """The check that refuses these lives in the library and names its parameter
    (``n_heads=[3] is invalid``); the command says it with the flag the user typed."""
    out = ["--out", str(tmp_path / "out")] if argv[0] != "specialize" else []
    assert main([*argv, *out]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"mhainterp {argv[0]}: error: {start} invalid"), line
    assert not (tmp_path / "out").exists()


def test_specialize_model_into_an_analysis_folder_is_refused_before_loading(
    tmp_path, no_model_loading, capsys
):
    from mhainterp.runs import PRETRAINED_ANALYSIS_FILE

    (tmp_path / PRETRAINED_ANALYSIS_FILE).write_text("head_label,category\n")
    capsys.readouterr()
    assert main(["specialize", "--model", "minilm", "--out", str(tmp_path)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "a folder free for this pretrained verdict, but it holds a pretrained analysis" in line
