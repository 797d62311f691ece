"""Reports of a tiny trained sweep: report.md and a self-contained report.html carry the numbers
of the tables they were generated from; the sweep-level specialization is cached per run; the
``specialize`` and ``report`` commands print and write the same verdicts."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from mhainterp.cli import report as report_cli
from mhainterp.cli import specialize as specialize_cli
from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.errors import OutdatedResultError
from mhainterp.figures.saved import save_folder_figures
from mhainterp.io import read_json
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.render import format_value
from mhainterp.report import write_report
from mhainterp.runs import folder_kind, sweep_folders
from mhainterp.specialization import (
    SpecializationResult,
    SpecializationSettings,
    SweepSpecialization,
    cached_specialization,
    specialize_folder,
    sweep_specialization,
)
from mhainterp.specialization.nulls import HEADS_SHUFFLED_NULL, SAME_FUNCTION_NULL
from mhainterp.specialization.seeds.answer import MAX_CHARS
from mhainterp.sweep import run_sweep, summarize
from mhainterp.sweep.compare import seed_power_note
from mhainterp.tasks import get_task
from mhainterp.training import evaluate, save_run

N_SEQUENCES = 32
TASKS = ("count_previous", "multi_relation")
BY = ("position",)
"""The division of labour's axes here: one keeps its heatmaps (the slowest figures) small."""


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Two tiny trained sweeps (h = 1, 2; seeds 0, 1; 10 steps) in one folder: a report needs
    their tables, not well-trained models."""
    root = tmp_path_factory.mktemp("sweeps")
    for task in TASKS:
        config = SweepConfig(
            task=task,
            task_params={"seq_len": 6, "d_vocab": 4},
            n_heads=[1, 2],
            seeds=[0, 1],
            model={"d_model": 16, "n_layers": 1},
            train=TrainConfig(steps=10, batch_size=16, warmup_steps=2, n_eval=64, log_every=5),
        )
        run_sweep(config, root / task, executor="local", progress=False)  # no process pool
    return root


@pytest.fixture(scope="module")
def report(sweeps):
    specialize_folder(sweeps, n_eval=N_SEQUENCES, progress=False, by=BY)  # the report reads
    save_folder_figures(sweeps)  # and embeds
    md, html = write_report(sweeps, n_eval=N_SEQUENCES)
    return md.read_text(encoding="utf-8"), html.read_text(encoding="utf-8")


def _text_of_html(html: str) -> str:
    """The visible text of the report (tags removed, entities decoded)."""
    import html as html_lib

    return html_lib.unescape(re.sub(r"<[^>]+>", " ", html))


def test_report_kinds(sweeps, tmp_path):
    assert folder_kind(sweeps) == "study"
    assert folder_kind(sweeps / "count_previous") == "sweep"
    assert folder_kind(sweeps / "count_previous" / "runs" / "h2_seed1") == "run"
    assert [p.name for p in sweep_folders(sweeps)] == list(TASKS)
    with pytest.raises(FileNotFoundError, match="is not a run folder"):
        folder_kind(tmp_path)


def test_report_contains_the_head_count_table(sweeps, report):
    md, html = report
    text = _text_of_html(html)
    for task in TASKS:
        results = pd.read_csv(sweeps / task / "results.csv")
        table = summarize(results).table
        for value in table["val_accuracy_mean"]:
            assert f"| {format_value(value)} |" in md
            assert format_value(value) in text
        comparisons = summarize(results).comparisons
        assert comparisons["verdict"].iloc[0] in md and comparisons["verdict"].iloc[0] in text


def test_report_contains_the_specialization_numbers(sweeps, report):
    md, html = report
    text = _text_of_html(html)
    for task in TASKS:
        summary = pd.read_csv(sweeps / task / "specialization_summary.csv")
        runs = pd.read_csv(sweeps / task / "specialization_runs.csv")
        assert len(runs) == 4 and set(runs["n_heads"]) == {1, 2}
        for value in summary["consistency"]:
            assert f"| {format_value(value)} |" in md
        for line in runs["verdict"]:
            # Each run's verdict is saved; the group lines in the report are built from them.
            assert line.startswith(f"{task}, h=")
    # The verdict lines of the report are exactly those of the saved per-run results.
    spec = sweep_specialization(sweeps / "multi_relation", n_eval=N_SEQUENCES, progress=False)
    for line in spec.result.verdict.lines:
        assert f"- {line}" in md
        assert line in text
    assert "Attention is a clue, not an explanation" in md
    # The stability table: per head count, the share of labels each threshold moves, as
    # the saved stability rows give it.
    from mhainterp.specialization import stability_summary

    stability = spec.result.stability
    runs_of_h2 = list(spec.runs.query("n_heads == 2")["run"])
    h2 = stability[stability["run"].isin(runs_of_h2)]
    assert runs_of_h2 and "Labels re-decided from the saved evidence" in md
    any_share = stability_summary(h2).set_index("threshold").loc["any", "share_any"]
    assert any(
        line.startswith("| 2 |") and line.endswith(f"| {any_share:.3f} |")
        for line in md.splitlines()
    )


def test_saved_sweep_specialization_reads_back_equal(sweeps, report):
    sweep = sweeps / "multi_relation"
    spec = sweep_specialization(sweep, n_eval=N_SEQUENCES, progress=False)
    loaded = SweepSpecialization.load(sweep)
    assert loaded.notes == spec.notes
    assert loaded.result.verdict.lines == spec.result.verdict.lines
    assert loaded.result.settings == spec.result.settings
    pd.testing.assert_frame_equal(loaded.summary, spec.summary, check_dtype=False)
    pd.testing.assert_frame_equal(
        loaded.result.heads, spec.result.heads, check_dtype=False, check_exact=False
    )


def test_an_outdated_sweep_specialization_is_refused_naming_the_file(sweeps, report, tmp_path):
    # A sweep table that lacks a column this version writes is refused in one line, with the
    # file, the column and the command; never read with the column missing.
    for path in (sweeps / "multi_relation").glob("specialization*"):
        shutil.copy(path, tmp_path / path.name)
    assert len(SweepSpecialization.load(tmp_path).summary)
    summary = tmp_path / "specialization_summary.csv"
    pd.read_csv(summary).drop(columns="division_token_basis").to_csv(summary, index=False)
    refusal = "specialization_summary.csv lacks the column division_token_basis: an older"
    with pytest.raises(OutdatedResultError, match=refusal):
        SweepSpecialization.load(tmp_path)


def test_report_computes_nothing_and_says_what_is_missing(sweeps, tmp_path):
    # A sweep whose specialization results were never saved: the report still has the seed
    # table, says plainly that the specialization results are missing, and writes none.
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for name in ("sweep.json", "results.csv"):
        (sweep / name).write_bytes((sweeps / "count_previous" / name).read_bytes())
    results = pd.read_csv(sweep / "results.csv")
    results["run_dir"] = [str(sweeps / "count_previous" / "runs" / Path(r).name)
                          for r in results["run_dir"]]  # fmt: skip
    results.to_csv(sweep / "results.csv", index=False)
    md_path, _ = write_report(sweep)
    md = md_path.read_text(encoding="utf-8")
    assert f"Not in this report: {sweep} has no saved sweep-level specialization results" in md
    assert f"`mhainterp specialize {sweep}`" in md
    # Nor does it draw: the figures that are not there are named, with the command.
    assert (
        "Figures not drawn yet: head_count_accuracy.png, training_curves.png. Draw them with "
        f"`mhainterp specialize {sweep}`"
    ) in md
    assert sorted(p.name for p in sweep.iterdir()) == ["report.html", "report.md", "results.csv",
                                                       "sweep.json"]  # fmt: skip
    # The seed table and its tests are computed and saved by the sweep summary, not here.
    assert f"Not in this report: {sweep} has no saved seed table" in md
    assert not (sweep / "specialization_notes.json").exists()
    assert not (sweep / "summary_table.csv").exists()  # the report writes no table
    summarize(pd.read_csv(sweep / "results.csv")).save(sweep)
    md = write_report(sweep)[0].read_text(encoding="utf-8")
    assert "| val acc (seed mean) |" in md and "Holm-corrected" in md
    # Results saved with other settings count as missing when settings are asked for.
    run_dir = sweeps / "count_previous" / "runs" / "h2_seed0"
    cached_specialization(run_dir, SpecializationSettings(n_eval=N_SEQUENCES))
    md_path, _ = write_report(run_dir, tmp_path / "other", n_eval=N_SEQUENCES + 1)
    other = md_path.read_text(encoding="utf-8")
    assert "has no saved specialization results made with the settings asked for" in other
    md_path, _ = write_report(run_dir, tmp_path / "same", n_eval=N_SEQUENCES)
    assert "Not in this report" not in md_path.read_text(encoding="utf-8")


def test_html_is_self_contained(report):
    md, html = report
    sources = re.findall(r'src="([^"]*)"', html)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "href=" not in html and "<link" not in html and "<script" not in html
    # One embedded image per figure the Markdown links to.
    assert len(sources) == len(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md))


def test_markdown_figures_exist_with_their_csv(sweeps, report):
    md, _ = report
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert "count_previous/head_count_accuracy.png" in links
    assert "multi_relation/specialization_vs_heads.png" in links
    assert "multi_relation/causal_matrix.png" in links
    for link in links:
        assert (sweeps / link).is_file()
        assert (sweeps / link).with_suffix(".csv").is_file()


def test_run_specialization_is_cached(sweeps):
    run_dir = sweeps / "count_previous" / "runs" / "h2_seed0"
    settings = SpecializationSettings(n_eval=N_SEQUENCES)
    meta = run_dir / "analysis" / "specialization.json"
    assert meta.is_file()  # written by specialize_folder before the report
    stamp = meta.stat().st_mtime_ns
    again = cached_specialization(run_dir, settings)
    assert meta.stat().st_mtime_ns == stamp  # reused, not recomputed
    assert again.verdict.text == read_json(meta)["verdict"]["text"]
    other = cached_specialization(run_dir, SpecializationSettings(n_eval=32), save=False)
    assert other.settings.n_eval == 32 and meta.stat().st_mtime_ns == stamp


def test_a_result_missing_a_table_is_recomputed_not_misread(sweeps, tmp_path):
    # A result written before a table existed (here: redundancy_groups) must not load as if
    # complete: load() says what is missing, the cache recomputes and rewrites it.
    run_dir = sweeps / "count_previous" / "runs" / "h2_seed0"
    settings = SpecializationSettings(n_eval=N_SEQUENCES)
    cached_specialization(run_dir, settings)
    groups = run_dir / "analysis" / "specialization_redundancy_groups.csv"
    groups.unlink()
    with pytest.raises(FileNotFoundError, match="specialization_redundancy_groups.csv is missing"):
        SpecializationResult.load(run_dir / "analysis")
    cached_specialization(run_dir, settings)
    assert groups.is_file()


def test_a_result_missing_a_column_is_recomputed_not_misread(sweeps):
    # A table saved before a column existed (here: heads' finding) is refused by load() in one
    # line naming the file and the column, and recomputed by the cache, never read with a gap.
    run_dir = sweeps / "count_previous" / "runs" / "h2_seed0"
    settings = SpecializationSettings(n_eval=N_SEQUENCES)
    fresh = cached_specialization(run_dir, settings)
    heads = run_dir / "analysis" / "specialization_heads.csv"
    pd.read_csv(heads).drop(columns="finding").to_csv(heads, index=False)
    refusal = "specialization_heads.csv lacks the column finding: an older mhainterp saved it"
    with pytest.raises(OutdatedResultError, match=refusal):
        SpecializationResult.load(run_dir / "analysis")
    again = cached_specialization(run_dir, settings)
    assert again.heads["finding"].tolist() == fresh.heads["finding"].tolist()
    assert "finding" in pd.read_csv(heads).columns


def test_run_report(sweeps, tmp_path):
    run_dir = sweeps / "multi_relation" / "runs" / "h2_seed1"
    specialize_folder(run_dir, n_eval=N_SEQUENCES, progress=False, by=BY)
    save_folder_figures(run_dir)
    md_path, html_path = write_report(run_dir, tmp_path, n_eval=N_SEQUENCES)
    md = md_path.read_text(encoding="utf-8")
    result = cached_specialization(run_dir, SpecializationSettings(n_eval=N_SEQUENCES))
    assert f"- {result.verdict.text}" in md
    eval_loss = read_json(run_dir / "eval.json")["loss"]
    assert f"loss {eval_loss:.4f}" in md
    for label in result.heads["label"]:
        assert f"| {label} |" in md
    # Role scores, head x target damage, and the division of labour's head x value heatmap.
    assert html_path.read_text(encoding="utf-8").count("data:image/png;base64,") == 3
    assert "division_profiles.png" in md


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="command")
    specialize_cli.register(subparsers)
    report_cli.register(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


def test_specialize_command_prints_the_verdict(sweeps, capsys):
    run_dir = sweeps / "count_previous" / "runs" / "h1_seed1"
    code = _cli(
        ["specialize", str(run_dir), "--n-eval", str(N_SEQUENCES), "--quiet", "--by", ",".join(BY)]
    )
    out = capsys.readouterr().out
    assert code == 0
    saved = read_json(run_dir / "analysis" / "specialization.json")
    assert saved["verdict"]["text"] in out
    assert "| L0H0 |" in out


def test_report_command_writes_both_files(sweeps, tmp_path, capsys):
    code = _cli(
        [
            "report",
            str(sweeps / "count_previous" / "runs" / "h2_seed1"),
            "--out",
            str(tmp_path),
            "--n-eval",
            str(N_SEQUENCES),
            "--quiet",
            "--by",
            ",".join(BY),
        ]
    )
    assert code == 0
    assert (tmp_path / "report.md").is_file() and (tmp_path / "report.html").is_file()
    assert str(tmp_path / "report.md") in capsys.readouterr().out


def test_run_report_shows_groups_tested_as_a_whole(tmp_path):
    """Three hand-built copies of a previous-token head: the report lists their group test."""
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous"] * 3, d_head=18)
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    saved = {**evaluate(model, task, n_eval=64), "status": "finished"}
    save_run(model, task, tmp_path / "run", TrainConfig(steps=1), metrics, saved)
    specialize_folder(tmp_path / "run", n_eval=64, progress=False, by=())  # groups only
    md_path, html_path = write_report(tmp_path / "run", tmp_path / "report", n_eval=64)
    md = md_path.read_text(encoding="utf-8")
    assert "Groups of three or more heads" in md
    row = next(line for line in md.splitlines() if "L0H0,L0H1,L0H2" in line)
    assert "similarity+role:previous" in row and "True" in row
    assert "similarity+role:previous" in html_path.read_text(encoding="utf-8")


def test_report_reads_as_a_document(report):
    md, _ = report
    levels = [len(m.group(1)) for m in re.finditer(r"^(#+) ", md, flags=re.M)]
    assert levels[0] == 1 and all(b - a <= 1 for a, b in itertools.pairwise(levels)), levels
    widths = [line.count("|") - 1 for line in md.splitlines() if line.startswith("|")]
    assert max(widths) <= 8  # no table scrolls at 1,280 px
    assert re.search(r"\b1 heads\b", md) is None and "nan vs null nan" not in md
    assert "redundant (" not in md  # one vocabulary: backed up
    # The Findings lead each task with its one-line answer (does h matter?); the evidence
    # (per head count verdicts, what n seeds can show) follows in the task's section.
    findings = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    bullets = [line for line in findings.splitlines() if line.startswith("- ")]
    assert [b.split(":")[0] for b in bullets] == [f"- {task}" for task in TASKS]
    assert all(len(b) - 2 <= MAX_CHARS for b in bullets)
    assert all("accuracy" in b for b in bullets)
    assert "per head count: h=1 (1 head, 2 seeds): " not in findings
    # What 2 seeds can show is said once per task, after its answer
    power = [line for line in md.splitlines() if seed_power_note(2)[:60] in line]
    assert len(power) == len(TASKS)
    assert not any(line in findings for line in power)


def _tables_after(text: str, caption_pattern: str) -> list[tuple[re.Match, list[list[str]]]]:
    """Every Markdown table right after a caption matching ``caption_pattern``, as rows of
    cells (header first)."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = re.search(caption_pattern, line)
        if match is None:
            continue
        rows = []
        for row in lines[i + 2 :]:
            if not row.startswith("|"):
                break
            rows.append([cell.strip() for cell in row.strip("|").split("|")])
        out.append((match, [r for r in rows if not set("".join(r)) <= set("-")]))
    return out


def test_findings_state_the_holm_family_of_every_comparison_they_print(report):
    md, _ = report
    findings = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    tables = _tables_after(findings, r"Holm within each question's family at 0.05 \(([^)]*)\)")
    assert len(tables) == len(TASKS)
    for match, (header, *rows) in tables:
        sizes = {f: int(n) for f, n in re.findall(r"(\w+) over (\d+)", match.group(1))}
        assert "accuracy" in sizes and set(sizes) <= {"accuracy", "where", "needed", "whom"}
        assert header[5] == "Holm p (of the family's n)"
        tested = [row for row in rows if row[5]]  # a row with a Holm p was in a family
        assert len(tested) == sum(sizes.values()) > 0
        cells = [int(re.search(r"\(of (\d+)\)", row[5]).group(1)) for row in tested]
        assert sorted(set(cells)) == sorted(set(sizes.values()))
        # h = 1 has no division index: no division row starts at h = 1
        assert not [r for r in rows if r[0].startswith("division index") and "h=1 →" in r[1]]
    # Each comparison has one Holm p in the report: accuracy is compared in the Findings
    # only, not again in the seed-table section with a family of its own.
    assert md.count("| accuracy | h=1 → 2 |") == len(TASKS)
    # One description of each null, the one the code uses.
    assert "shuffled among the scored positions" not in md and "label-permutation" not in md
    assert SAME_FUNCTION_NULL in md and HEADS_SHUFFLED_NULL in md


def test_run_report_shows_the_saved_headline_stability_and_refuses_a_damaged_one(sweeps, tmp_path):
    """The headline stability (opt-in, ``specialize --headline-stability``) is read from its
    saved files: the counts of the table, the perturbations that changed the sentence."""
    divided = "divided by position"
    run_dir = tmp_path / "h2_seed1"
    shutil.copytree(sweeps / "multi_relation" / "runs" / "h2_seed1", run_dir)
    specialize_folder(run_dir, n_eval=N_SEQUENCES, progress=False, by=BY)
    table = pd.DataFrame(
        {
            "perturbation": ["min_effect x 0.8", "min_effect x 1.25", "method zero", "n_eval x 2"],
            "headline": [divided, "nothing divided", divided, divided],
            "changed": [False, True, False, False],
            "n_labels": [2, 2, 2, 2],
            "n_labels_changed": [0, 1, 0, 0],
            "share_labels_changed": [0.0, 0.5, 0.0, 0.0],
        }
    )  # fmt: skip
    analysis = run_dir / "analysis"
    table.to_csv(analysis / "headline_stability.csv", index=False)
    summary = {"headline": divided, "n_perturbations": 4,
               "share_sentences_changed": 0.25, "share_labels_changed": 0.125}  # fmt: skip
    (analysis / "headline_stability.json").write_text(json.dumps(summary))
    md = write_report(run_dir, tmp_path / "report", n_eval=N_SEQUENCES)[0].read_text()
    assert "the verdict sentence changes in 1 of 4 (25%); 12% of head labels change." in md
    assert "| min_effect x 1.25 | nothing divided |" in md
    assert "| method zero |" not in md  # unchanged perturbations are counted, not listed
    table.drop(columns="changed").to_csv(analysis / "headline_stability.csv", index=False)
    with pytest.raises(ValueError, match=r"headline_stability\.csv lacks the column\(s\) changed"):
        write_report(run_dir, tmp_path / "report2", n_eval=N_SEQUENCES)


def test_report_without_settings_reads_the_saved_results_and_changes_no_table(
    sweeps, report, tmp_path, monkeypatch
):
    """A demo labels on fewer sequences than the defaults: `mhainterp report` without settings
    options reads the saved results with their own settings. Before, it relabelled every run
    with the defaults and overwrote the demo's tables (255 CSVs changed on the demo)."""
    from mhainterp.specialization import folders
    from mhainterp.specialization.folders import saved_folder_settings

    sweep = tmp_path / "count_previous"
    shutil.copytree(sweeps / "count_previous", sweep)
    settings, dividing = saved_folder_settings(sweep)
    assert settings.n_eval == N_SEQUENCES and dividing is not None
    tables = {p: p.read_bytes() for p in sweep.rglob("*.csv")}

    def refuse(*args, **kwargs):
        raise AssertionError("a saved result was computed again")

    monkeypatch.setattr(folders, "specialization_test", refuse)
    monkeypatch.setattr(folders, "division_of_labour", refuse)
    assert _cli(["report", str(sweep), "--quiet", "--by", ",".join(BY)]) == 0
    assert {p: p.read_bytes() for p in sweep.rglob("*.csv")} == tables
    assert (sweep / "report.md").is_file()


def test_saved_folder_settings_are_none_when_runs_disagree_or_are_unlabelled(
    sweeps, report, tmp_path
):
    from mhainterp.specialization.folders import saved_folder_settings

    sweep = tmp_path / "count_previous"
    shutil.copytree(sweeps / "count_previous", sweep)
    run = next(sweep.glob("runs/*/analysis/specialization.json"))
    meta = json.loads(run.read_text())
    meta["settings"]["alpha"] = 0.01
    run.write_text(json.dumps(meta))
    assert saved_folder_settings(sweep) is None
    run.unlink()
    assert saved_folder_settings(sweep) is None


def test_two_sweeps_of_one_task_each_get_their_line_named(tiny_sweep, tmp_path):
    """A study holding two sweeps of reverse: the Findings said one "- reverse: ..." line for
    both (or two that could not be told apart); each line now names its sweep, as the
    comparison tables' captions do."""
    study = tmp_path / "study"
    for name in ("rev_a", "rev_b"):
        shutil.copytree(tiny_sweep, study / name)
    assert _cli(["report", str(study), "--n-eval", "16"]) == 0
    findings = (study / "report.md").read_text().split("## Findings", 1)[1].split("\n## ")[0]
    lines = [line for line in findings.splitlines() if line.startswith("- reverse")]
    assert [line.split(":")[0] for line in lines] == ["- reverse (rev_a)", "- reverse (rev_b)"]
