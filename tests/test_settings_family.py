"""Issue 32 item 1: one settings family. The division of labour's settings derive from the
specialization settings (``n_eval, alpha, correction, min_damage, seed, method``), so
``mhainterp specialize --n-eval 64`` evaluates 64 sequences in the division too (it used to
evaluate 1,024 whatever was asked)."""

from __future__ import annotations

import json
import shutil

import pytest

from mhainterp.runs import migrate_settings
from mhainterp.specialization import DivisionSettings, SpecializationSettings
from mhainterp.specialization.settings import SHARED_FIELDS, resolve_settings


def test_the_division_settings_carry_n_eval_alpha_and_method():
    settings = SpecializationSettings(n_eval=64, alpha=0.01, method="zero")
    division = settings.division
    assert (division.n_eval, division.alpha, division.method) == (64, 0.01, "zero")
    assert division.methods[0] == "zero"  # the primary method leads
    assert resolve_settings(settings) == division  # what division_of_labour(settings=) uses
    # every shared field, and nothing else, comes from the labels' settings
    moved = SpecializationSettings(n_eval=64, alpha=0.01, correction="bh", min_damage=0.02,
                                   seed=3, method="resample")  # fmt: skip
    assert {f: getattr(moved.division, f) for f in SHARED_FIELDS} == {
        "n_eval": 64, "alpha": 0.01, "correction": "bh", "min_damage": 0.02, "seed": 3,
        "method": "resample",
    }  # fmt: skip
    assert moved.division.replace(**{f: getattr(DivisionSettings(), f) for f in SHARED_FIELDS}) == (
        DivisionSettings()
    )


def test_the_ablation_method_has_one_name_and_old_files_still_load():
    assert "method" in SpecializationSettings().to_dict()
    assert "ablation_method" not in SpecializationSettings().to_dict()
    with pytest.raises(TypeError):
        SpecializationSettings(ablation_method="zero")  # no second spelling
    old = {**SpecializationSettings().to_dict(), "ablation_method": "zero"}
    del old["method"]
    assert SpecializationSettings.from_dict(migrate_settings(old)).method == "zero"


def test_specialize_n_eval_reaches_the_division(tiny_sweep, tmp_path, capsys):
    from mhainterp.cli import main

    run = tmp_path / "h2_seed0"
    shutil.copytree(tiny_sweep / "runs" / "h2_seed0", run)
    assert main(["specialize", str(run), "--n-eval", "64", "--by", "position", "--quiet"]) == 0
    capsys.readouterr()
    labels = json.loads((run / "analysis" / "specialization.json").read_text())["settings"]
    division = json.loads((run / "analysis" / "division.json").read_text())["settings"]
    assert labels["n_eval"] == 64
    assert division["n_eval"] == 64  # was 1024: the --n-eval never reached the division
    assert division["method"] == labels["method"] == "mean"
