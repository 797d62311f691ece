"""mhainterp.runs: folder kinds, discovery, path resolution, old folders, damaged saved files.

Each test builds real (tiny) run and sweep folders and checks the exact folders, tables or
one-line messages that come back.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY_SWEEP

from mhainterp.cli import main
from mhainterp.config import TrainConfig
from mhainterp.errors import RunFolderError
from mhainterp.io import remove_stale_temps
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.provenance import analysis_is_current
from mhainterp.runs import (
    find_runs,
    folder_kind,
    migrate_config,
    migrate_folder,
    migrate_results,
    migrate_settings,
    read_results,
    read_table,
    resolve_run_dir,
)
from mhainterp.specialization import SpecializationSettings, specialization_test
from mhainterp.specialization.verdict.result import SpecializationResult
from mhainterp.sweep import run_sweep
from mhainterp.tasks import get_task
from mhainterp.training import load_run

NAMES = ["h1_seed0", "h1_seed1", "h2_seed0", "h2_seed1"]


def test_folder_kinds(tiny_sweep, tmp_path):
    assert folder_kind(tiny_sweep) == "sweep"
    assert folder_kind(tiny_sweep / "runs" / "h2_seed0") == "run"
    assert folder_kind(tiny_sweep.parent) == "study"
    with pytest.raises(FileNotFoundError, match="is not a run folder"):
        folder_kind(tmp_path)


def test_a_runs_folder_in_the_current_directory_is_never_read_for_another_sweep(
    tiny_sweep, tmp_path, monkeypatch
):
    """The bug of issue 17: with ./runs/h1_seed0 present, `report other/` read ./runs."""
    here, other = tmp_path / "here", tmp_path / "other"
    shutil.copytree(tiny_sweep, other)
    decoy = here / "runs" / "h1_seed0"
    shutil.copytree(tiny_sweep / "runs" / "h2_seed1", decoy)  # another run under the same name
    monkeypatch.chdir(here)
    table = pd.read_csv(other / "results.csv")
    table["run_dir"] = [f"runs/{n}" for n in NAMES]  # as stored: relative to other/
    assert read_results(other)["run_dir"].tolist() == [str(other / "runs" / n) for n in NAMES]
    # old tables (recorded relative to where the sweep started) resolve into other/ too
    table.to_csv(other / "results.csv", index=False)
    assert resolve_run_dir("runs/h1_seed0", "other") == Path("other/runs/h1_seed0")
    # and the report reads other/'s runs: its h1 row says n_heads 1, the decoy has 2
    assert main(["specialize", str(other), "--n-eval", "16", "--quiet", "--by", ""]) == 0
    from mhainterp.specialization import SweepSpecialization

    runs = SweepSpecialization.load(other).runs
    # run_dir is stored relative to the table's folder (other/), never to the current one
    assert sorted((other / r).resolve() for r in runs["run_dir"]) == sorted(
        (other / "runs" / n).resolve() for n in NAMES
    )
    assert not (decoy / "analysis").exists()  # the decoy was never analysed


def test_discovery_follows_a_linked_run_folder_once(tiny_sweep, tmp_path):
    study = tmp_path / "study"
    (study / "runs").mkdir(parents=True)
    for name in NAMES[:3]:
        shutil.copytree(tiny_sweep / "runs" / name, study / "runs" / name)
    os.symlink(tiny_sweep / "runs" / "h2_seed1", study / "runs" / "h2_seed1")  # a linked run
    os.symlink(study, study / "runs" / "loop")  # and a link back up the tree
    found = find_runs(study)
    assert [p.relative_to(study).as_posix() for p in found] == [f"runs/{n}" for n in NAMES]


def test_duplicated_results_rows_are_counted_once_with_a_warning(tiny_sweep, tmp_path):
    copy = tmp_path / "dup"
    shutil.copytree(tiny_sweep, copy)
    table = pd.read_csv(copy / "results.csv")
    pd.concat([table, table.iloc[[0]]]).to_csv(copy / "results.csv", index=False)
    with pytest.warns(UserWarning, match="repeats 1 row"):
        read = read_results(copy)
    assert read["seed"].tolist() == [0, 1, 0, 1]  # 2 seeds per head count, not 3
    clash = pd.concat([table, table.iloc[[0]].assign(val_accuracy=0.123)])
    clash.to_csv(copy / "results.csv", index=False)
    with pytest.raises(RunFolderError, match="different rows for one run"):
        read_results(copy)


@pytest.mark.parametrize(
    ("content", "what"),
    [(b"", "is empty (0 bytes)"), (b"task,n_heads,seed\nreverse,1,0\n", "lacks the run_dir")],
)
def test_a_broken_results_csv_is_one_line_naming_it(tiny_sweep, tmp_path, capsys, content, what):
    copy = tmp_path / "broken"
    shutil.copytree(tiny_sweep, copy)
    (copy / "results.csv").write_bytes(content)
    with pytest.raises(RunFolderError) as error:
        read_results(copy)
    assert what in str(error.value)
    assert main(["report", str(copy), "--n-eval", "16", "--quiet", "--by", ""]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(copy / "results.csv") in lines[0] and what in lines[0]


def test_migrate_config_and_folder(tiny_sweep, tmp_path):
    assert migrate_config({"train": {"eval_size": 64, "steps": 3}}) == {
        "train": {"n_eval": 64, "steps": 3}
    }
    old = tmp_path / "old"
    shutil.copytree(tiny_sweep, old)
    config_path = old / "runs" / "h1_seed0" / "config.json"
    config = json.loads(config_path.read_text())
    config["train"]["eval_size"] = config["train"].pop("n_eval")
    config_path.write_text(json.dumps(config))
    table = pd.read_csv(old / "results.csv")
    table.assign(run_dir=[str(old / r) for r in table["run_dir"]]).to_csv(
        old / "results.csv", index=False
    )
    heads = old / "runs" / "h2_seed0" / "analysis" / "redundancy.csv"
    heads.parent.mkdir()
    pd.DataFrame({"members": ["L0H0;L0H1"], "value": [1.0]}).to_csv(heads, index=False)
    # the old folder reads as it is ...
    assert load_run(config_path.parent).train_config.n_eval == 32
    # ... and is rewritten in the current format on request
    changed = migrate_folder(old)
    assert sorted(p.relative_to(old).as_posix() for p in changed) == [
        "results.csv",
        "runs/h1_seed0/config.json",
        "runs/h2_seed0/analysis/redundancy.csv",
    ]
    assert pd.read_csv(old / "results.csv")["run_dir"].tolist() == [f"runs/{n}" for n in NAMES]
    assert json.loads(config_path.read_text())["train"]["n_eval"] == 32
    assert pd.read_csv(heads)["members"].tolist() == ["L0H0,L0H1"]
    assert migrate_folder(old) == []  # nothing left to change


def test_readers_read_only_the_current_format_after_the_one_migration():
    """The old names are read by runs.migrate_* alone; the config readers refuse them."""
    with pytest.raises(ValueError, match=r"TrainConfig keys=\['eval_size'\] is invalid"):
        TrainConfig.from_dict({"eval_size": 64})
    assert TrainConfig.from_dict(migrate_config({"train": {"eval_size": 64}})["train"]).n_eval == 64
    with pytest.raises(ValueError, match=r"keys=\['n_sequences'\] is invalid"):
        SpecializationSettings.from_dict({"n_sequences": 32})
    assert SpecializationSettings.from_dict(migrate_settings({"n_sequences": 32})).n_eval == 32
    old = pd.DataFrame({"heads": ["L0H0;L0H2", "L0H1", ""], "size": [2, 1, 0]})
    assert migrate_results(old)["heads"].tolist() == ["L0H0,L0H2", "L0H1", ""]
    assert old["heads"][0] == "L0H0;L0H2"  # a copy: the input is not changed


@pytest.fixture(scope="module")
def saved_result(tmp_path_factory) -> Path:
    """A specialization result with a redundant group of three heads, saved."""
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "previous", "previous", "dead"])
    result = specialization_test(model, task, n_eval=32)
    assert result.redundancy_groups["heads"].tolist() == ["L0H0,L0H1,L0H2"]
    out = tmp_path_factory.mktemp("saved_result")
    result.save(out)
    return out


def _old_spellings(sweep: Path, saved_result: Path, old: Path) -> Path:
    """A copy of ``sweep`` in every old spelling: ``train.eval_size`` in its sweep.json and in
    one run's config.json, ``n_sequences`` in saved settings, a head set written with ``;``.
    Returns the saved result's folder."""
    shutil.copytree(sweep, old)
    for path in (old / "sweep.json", old / "runs" / "h1_seed0" / "config.json"):
        saved = json.loads(path.read_text())
        saved["train"]["eval_size"] = saved["train"].pop("n_eval")
        path.write_text(json.dumps(saved))
    analysis = old / "runs" / "h1_seed1" / "analysis"
    shutil.copytree(saved_result, analysis)
    meta = json.loads((analysis / "specialization.json").read_text())
    meta["settings"]["n_sequences"] = meta["settings"].pop("n_eval")
    (analysis / "specialization.json").write_text(json.dumps(meta))
    groups = analysis / "specialization_redundancy_groups.csv"
    groups.write_text(groups.read_text().replace("L0H0,L0H1,L0H2", "L0H0;L0H1;L0H2"))
    return analysis


def test_an_old_folder_loads_through_the_migration_and_is_rewritten(
    tiny_sweep, saved_result, tmp_path
):
    old = tmp_path / "old"
    analysis = _old_spellings(tiny_sweep, saved_result, old)
    # the old folder reads as it is (every reader goes through runs.migrate_*) ...
    loaded = SpecializationResult.load(analysis)
    assert loaded.settings.n_eval == 32
    assert loaded.redundancy_groups["heads"].tolist() == ["L0H0,L0H1,L0H2"]
    assert load_run(old / "runs" / "h1_seed0").train_config.n_eval == 32
    # ... and is rewritten in the current format on request, once
    changed = migrate_folder(old)
    assert sorted(p.relative_to(old).as_posix() for p in changed) == [
        "runs/h1_seed0/config.json",
        "runs/h1_seed1/analysis/specialization.json",
        "runs/h1_seed1/analysis/specialization_redundancy_groups.csv",
        "sweep.json",
    ]
    assert json.loads((old / "sweep.json").read_text())["train"]["n_eval"] == 32
    assert json.loads((analysis / "specialization.json").read_text())["settings"]["n_eval"] == 32
    assert pd.read_csv(analysis / "specialization_redundancy_groups.csv")["heads"].tolist() == [
        "L0H0,L0H1,L0H2"
    ]
    assert migrate_folder(old) == []


def test_an_old_sweep_resumes_without_retraining(tiny_sweep, saved_result, tmp_path):
    """sweep.json and config.json with ``train.eval_size`` are the same sweep and runs."""
    old = tmp_path / "old"
    _old_spellings(tiny_sweep, saved_result, old)
    weights = sorted((old / "runs").rglob("model.safetensors"))
    before = [path.stat().st_mtime_ns for path in weights]
    table = run_sweep(TINY_SWEEP, old, executor="local", progress=False)
    assert [path.stat().st_mtime_ns for path in weights] == before
    assert len(table) == len(NAMES)


def test_read_table_refuses_a_zero_byte_file_and_reads_a_saved_empty_table(tmp_path):
    (tmp_path / "empty.csv").write_bytes(b"")
    with pytest.raises(RunFolderError, match=r"empty.csv is empty \(0 bytes\)"):
        read_table(tmp_path / "empty.csv")
    (tmp_path / "none.csv").write_text("\n")  # what write_csv makes of an empty DataFrame
    assert read_table(tmp_path / "none.csv").empty


def test_stale_temp_files_of_dead_writers_are_removed_live_ones_kept(tmp_path):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # a pid that no longer runs
    dead = tmp_path / f".fig.png.{pid}.0a1b2c3d.tmp"
    old_style = tmp_path / ".fig.png.0a1b2c3d.tmp"
    live = tmp_path / f".fig.png.{os.getpid()}.0a1b2c3d.tmp"
    other = tmp_path / ".notes.tmp"
    for path in (dead, old_style, live, other):
        path.write_text("x")
    assert sorted(p.name for p in remove_stale_temps(tmp_path)) == sorted(
        [dead.name, old_style.name]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_the_first_atomic_write_into_a_folder_removes_its_stale_temps(tmp_path):
    # A killed report left .role_scores.png.<pid>.<hex>.tmp in the sweep root: report never
    # called remove_stale_temps there. atomic_path now does it for every writer.
    from mhainterp.io import write_text

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    dead = tmp_path / f".role_scores.png.{pid}.0fe07c20.tmp"
    dead.write_text("half a png")
    write_text(tmp_path / "notes.txt", "hello")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_overwritten_weights_make_saved_analyses_stale(tiny_sweep, tmp_path):
    from mhainterp.specialization import specialize_folder
    from mhainterp.specialization.folders import saved_specialization

    run = tmp_path / "run"
    shutil.copytree(tiny_sweep / "runs" / "h2_seed0", run)
    specialize_folder(run, n_eval=16, progress=False, by=())
    assert saved_specialization(run) is not None and analysis_is_current(run)
    # the run replaced by another of the same settings (its weights and their evaluation):
    # weights copied in alone are refused (test_damaged_runs), not analysed as this run's
    for name in ("model.safetensors", "eval.json", "metrics.csv"):
        shutil.copy(tiny_sweep / "runs" / "h2_seed1" / name, run / name)
    assert not analysis_is_current(run)
    assert saved_specialization(run) is None  # the report shows it as missing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        specialize_folder(run, n_eval=16, progress=False, by=())
    assert any("other weights" in str(w.message) for w in caught)
    assert analysis_is_current(run) and saved_specialization(run) is not None
    stale = [p for p in (run / "analysis").iterdir() if p.name.startswith("stale-")]
    assert len(stale) == 1 and (stale[0] / "specialization.json").is_file()  # kept aside


def test_a_sweep_whose_run_was_retrained_is_refused_not_summarised_with_old_numbers(
    tiny_sweep, tmp_path, capsys
):
    """Issue 21 item 3 for a sweep: ``train --overwrite`` on one of its runs (accuracy 0.29 ->
    0.95 on the issue's machine) left results.csv with the old numbers, and the report put
    them beside analyses of the new weights."""
    sweep = tmp_path / "sweep"
    shutil.copytree(tiny_sweep, sweep)
    run = sweep / "runs" / "h2_seed0"
    retrain = ["train", "--task", "reverse", "--task-param", "seq_len=6", "--task-param",
               "d_vocab=4", "--d-model", "8", "--n-heads", "2", "--steps", "40", "--batch-size",
               "8", "--warmup-steps", "2", "--n-eval", "32", "--quiet", "--overwrite"]  # fmt: skip
    assert main([*retrain, "--out", str(run)]) == 0
    capsys.readouterr()
    recorded = pd.read_csv(sweep / "results.csv").set_index("run_dir")
    old = recorded.loc["runs/h2_seed0", "val_accuracy"]
    now = json.loads((run / "eval.json").read_text())["accuracy"]
    assert old != now
    for command in ("report", "specialize"):
        assert main([command, str(sweep), "--n-eval", "16", "--quiet", "--by", ""]) == 2
        line = capsys.readouterr().err.strip()
        assert "\n" not in line and line.startswith(f"mhainterp {command}: error: "), line
        assert f"{sweep / 'results.csv'} says val_accuracy={old:.4g} for h2_seed0" in line, line
        assert f"{run / 'eval.json'} says accuracy={now:.4g}" in line, line
    assert not (sweep / "report.md").exists()
    for name in ("model.safetensors", "eval.json", "metrics.csv", "config.json"):
        shutil.copy(tiny_sweep / "runs" / "h2_seed0" / name, run / name)  # the sweep's run again
    assert read_results(sweep)["run_dir"].tolist() == [str(sweep / "runs" / n) for n in NAMES]


def _count_run_loads(monkeypatch) -> dict[str, int]:
    """Run folder name -> how many times ``load_run`` loaded it, counted in every loaded
    module of ours that holds ``load_run`` (import the callers first)."""
    import mhainterp.training.run_folder as run_folder

    real = run_folder.load_run
    loads: dict[str, int] = {}

    def counted(path, *args, **kwargs):
        loads[Path(path).name] = loads.get(Path(path).name, 0) + 1
        return real(path, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("mhainterp") and vars(module).get("load_run") is real:
            monkeypatch.setattr(module, "load_run", counted)
    return loads


def test_specialize_loads_each_run_once_and_a_rerun_none(tiny_sweep, tmp_path, monkeypatch):
    """``mhainterp specialize`` of a sweep checks the run folders from their files, then loads
    each run once for both its division of labour and its labels (it loaded each three times:
    the check, the division, the labels; issue 41); a rerun reuses what was saved."""
    for name in ("mhainterp.cli.specialize", "mhainterp.specialization.folders"):
        importlib.import_module(name)  # now, so that their load_run is replaced below

    sweep = tmp_path / "rev"
    shutil.copytree(tiny_sweep, sweep)
    loads = _count_run_loads(monkeypatch)
    argv = ["specialize", str(sweep), "--n-eval", "16", "--quiet"]
    assert main(argv) == 0
    assert loads == dict.fromkeys(NAMES, 1)
    assert main(argv) == 0
    assert loads == dict.fromkeys(NAMES, 1)


def test_a_division_on_other_settings_than_the_labels_loads_each_run_once(
    tiny_sweep, tmp_path, monkeypatch
):
    """The study divides on more sequences than it labels on (``division_settings``): still one
    load per run, and the division saved is the one made with the division's settings."""
    from mhainterp.specialization import DivisionSettings, SpecializationSettings
    from mhainterp.specialization.folders import specialize_folder
    from mhainterp.specialization.whom.division import division_request
    from mhainterp.specialization.whom.division_result import saved_division

    sweep = tmp_path / "rev"
    shutil.copytree(tiny_sweep, sweep)
    loads = _count_run_loads(monkeypatch)
    dividing = DivisionSettings(n_eval=32)
    labels = SpecializationSettings(n_eval=16)
    specialize_folder(sweep, labels, progress=False, division_settings=dividing)
    assert loads == dict.fromkeys(NAMES, 1)
    for name in NAMES:  # saved with the division's own settings, not the labels'
        assert saved_division(sweep / "runs" / name, division_request(dividing)) is not None
        assert saved_division(sweep / "runs" / name, division_request(labels)) is None


# ----- a sweep's missing or cut pieces, named as what they are ----------------------------------
def test_a_results_csv_cut_mid_row_is_refused_as_cut_not_as_a_run_of_a_cut_name(
    tiny_sweep, tmp_path, capsys
):
    sweep = tmp_path / "rev"
    shutil.copytree(tiny_sweep, sweep)
    table = sweep / "results.csv"
    whole = table.read_bytes()
    table.write_bytes(whole[: whole.index(b"h1_seed0") + 5])  # "...,runs/h1_se"
    expected = (
        f"{table} is cut short: its last row is incomplete (no line end); rerun the same "
        "mhainterp sweep to rewrite it"
    )
    with pytest.raises(RunFolderError) as error:
        read_results(sweep)
    assert str(error.value) == expected
    assert main(["specialize", str(sweep), "--n-eval", "16", "--quiet"]) == 2
    line = capsys.readouterr().err.strip()
    assert line == f"mhainterp specialize: error: {expected}"
    run_sweep(TINY_SWEEP, sweep, executor="local", progress=False)  # the fix it names
    assert table.read_bytes() == whole


def test_a_run_missing_from_a_sweep_is_named_as_missing(tiny_sweep, tmp_path, capsys):
    sweep = tmp_path / "rev"
    shutil.copytree(tiny_sweep, sweep)
    run = sweep / "runs" / "h2_seed1"
    shutil.rmtree(run)
    expected = (
        f"run h2_seed1, listed in {sweep / 'results.csv'}, is missing ({run}); rerun the "
        "sweep to retrain it"
    )
    with pytest.raises(FileNotFoundError) as error:
        read_results(sweep)
    assert str(error.value) == expected
    for command in ("specialize", "report"):
        assert main([command, str(sweep), "--n-eval", "16", "--quiet"]) == 2
        assert capsys.readouterr().err.strip() == f"mhainterp {command}: error: {expected}"
    with pytest.raises(FileNotFoundError) as error:
        load_run(run)
    assert (
        str(error.value) == f"run h2_seed1 of the sweep {sweep} is missing ({run}); rerun the sweep"
    )


def test_loading_a_folder_that_does_not_exist_says_so(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load_run(tmp_path / "nope")
    assert str(error.value) == f"{tmp_path / 'nope'} does not exist"
