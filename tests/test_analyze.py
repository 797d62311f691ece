"""`analyze`: every table and figure of a run, checked on a hand-built model with known heads."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest

import mhainterp.figures.ablation as ablation_figures
from mhainterp.cli import main
from mhainterp.config import TrainConfig
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.tasks import get_task
from mhainterp.training import save_run

EXPECTED = {
    "head_statistics.csv",
    "average_patterns.png",
    "average_patterns.csv",
    "example_patterns.png",
    "example_patterns.csv",
    "head_map.png",
    "head_map.csv",
    "gradient_importance.csv",
    "importance_agreement.csv",
    "ablation_importance.png",
    "ablation_importance.csv",
    "ablation_pairwise.png",
    "ablation_pairwise.csv",
    "ablation_prune_curve.png",
    "ablation_prune_curve.csv",
    "gradient_vs_ablation.png",
    "gradient_vs_ablation.csv",
} | {
    f"similarity_{m}.{ext}"
    for m in ("js", "pattern_corr", "cka", "ov", "qk", "separation")
    for ext in ("png", "csv")
}
EXPECTED |= {name.replace(".png", ".pdf") for name in EXPECTED if name.endswith(".png")}
EXPECTED.add("source.json")  # which weights these results are of (stale results are set aside)


@pytest.fixture
def handbuilt_run(tmp_path):
    """A run folder holding the previous / uniform / previous model (no training needed)."""
    task = get_task("previous_token", seq_len=16, d_vocab=10)
    model = handbuilt_model(["previous", "uniform", "previous"])
    run_dir = tmp_path / "sweep" / "runs" / "h3_seed0"
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    save_run(
        model,
        task,
        run_dir,
        TrainConfig(steps=1, warmup_steps=0),
        metrics,
        {"status": "finished", "accuracy": 1.0, "loss": 0.0, "final_train_loss": 0.0},
    )
    return run_dir


@pytest.fixture
def drawings(monkeypatch):
    """Record the figures ``analyze`` asks for instead of drawing them (drawing a dozen PNGs
    takes seconds; the figure functions have their own tests, and the slow test below draws
    them all). Figure name -> the table(s) it was given."""
    import mhainterp.figures.ablation as ablation_figures
    import mhainterp.figures.patterns as pattern_figures
    import mhainterp.figures.similarity as similarity_figures

    calls: dict[str, object] = {}

    def record(name_of):
        def draw(data, *rest, path=None, **options):
            calls[name_of(path, options)] = data
            return path

        return draw

    monkeypatch.setenv("MHAINTERP_FIGURE_WORKER", "0")  # recorded here, not in a worker
    stem = lambda path, options: path.stem  # noqa: E731
    monkeypatch.setattr(pattern_figures, "plot_average_patterns", record(stem))
    monkeypatch.setattr(pattern_figures, "plot_example_patterns", record(stem))
    monkeypatch.setattr(similarity_figures, "plot_similarity_heatmap", record(stem))
    monkeypatch.setattr(similarity_figures, "plot_head_map", record(stem))

    def save_ablation_figure(name, tables, out_dir):
        calls.setdefault("ablation", {}).update(tables)
        calls.setdefault("ablation figures", []).append(name)

    monkeypatch.setattr(ablation_figures, "save_ablation_figure", save_ablation_figure)
    return calls


def test_analyze_computes_every_table_with_known_values(handbuilt_run, drawings):
    assert main(["analyze", str(handbuilt_run), "--n-eval", "64", "--quiet"]) == 0
    stats = pd.read_csv(handbuilt_run / "analysis" / "head_statistics.csv")
    mass = stats[stats["metric"] == "relation_mass:previous"].set_index("head_label")["value"]
    assert mass["L0H0"] == pytest.approx(1.0, abs=1e-6)
    assert mass["L0H2"] == pytest.approx(1.0, abs=1e-6)
    assert mass["L0H1"] < 0.3  # the uniform head
    similarity = {f"similarity_{m}" for m in ("js", "pattern_corr", "cka", "ov", "qk")}
    expected = {"average_patterns", "example_patterns", "head_map", "ablation", "ablation figures"}
    assert set(drawings) == expected | similarity | {"similarity_separation"}
    js = drawings["similarity_js"]
    assert js.loc["L0H0", "L0H2"] == pytest.approx(1.0) and js.loc["L0H0", "L0H1"] < 0.9
    assert drawings["average_patterns"].shape[0] == 3 * 16 * 16  # 3 heads x q x k
    tables = drawings["ablation"]
    assert set(tables) == {
        "importance", "pairwise", "gradient_importance", "importance_agreement", "prune_curve"
    }  # fmt: skip
    assert sorted(drawings["ablation figures"]) == sorted(ablation_figures.ABLATION_FIGURES)
    zero = tables["importance"][tables["importance"]["method"] == "zero"]
    assert zero["delta_accuracy"].tolist() == [0.0, 0.0, 0.0]  # each previous head backs up
    for name in ("gradient_importance", "importance_agreement"):
        assert (handbuilt_run / "analysis" / f"{name}.csv").is_file()


@pytest.mark.slow
def test_analyze_writes_every_table_and_figure_with_known_values(handbuilt_run, capsys):
    assert main(["analyze", str(handbuilt_run), "--n-eval", "128", "--quiet"]) == 0
    out = handbuilt_run / "analysis"
    assert {p.name for p in out.iterdir()} == EXPECTED
    stats = pd.read_csv(out / "head_statistics.csv")
    mass = stats[stats["metric"] == "relation_mass:previous"].set_index("head_label")["value"]
    assert mass["L0H0"] == pytest.approx(1.0, abs=1e-6)
    assert mass["L0H2"] == pytest.approx(1.0, abs=1e-6)
    assert mass["L0H1"] < 0.3  # the uniform head
    js = pd.read_csv(out / "similarity_js.csv").set_index(["head_a", "head_b"])["similarity"]
    assert js["L0H0", "L0H2"] == pytest.approx(1.0)
    assert js["L0H0", "L0H1"] < 0.9
    importance = pd.read_csv(out / "ablation_importance.csv")
    zero = importance[importance["method"] == "zero"].set_index("head_label")
    assert zero["delta_accuracy"].tolist() == [0.0, 0.0, 0.0]  # each previous head backs up


@pytest.mark.slow
def test_figures_drawn_in_the_worker_are_byte_equal_to_figures_drawn_here(
    handbuilt_run, monkeypatch
):
    """The figure worker draws, and measures the similarities, while analyze computes the
    ablations (at the end, this process takes over what the worker has not started): every
    file it writes, the same bytes."""
    import mhainterp.similarity as similarity_module
    from mhainterp.analyze import analyze_run

    here = handbuilt_run.parent / "here"
    shutil.copytree(handbuilt_run, here)
    measured_in = handbuilt_run.parent / "similarity_pids"
    head_similarity = similarity_module.head_similarity

    def recording(*args, **kwargs):  # the worker inherits this patch by the fork
        with measured_in.open("a") as log:
            log.write(f"{os.getpid()}\n")
        return head_similarity(*args, **kwargs)

    monkeypatch.setattr(similarity_module, "head_similarity", recording)
    analyze_run(handbuilt_run, n_eval=64, background=True)
    analyze_run(here, n_eval=64, background=False)
    pids = [int(pid) for pid in measured_in.read_text().split()]
    half = len(pids) // 2  # one per method: in the worker (or taken over here), then here
    assert half == 6 and set(pids[half:]) == {os.getpid()}  # the 6 similarity methods
    names = sorted(p.name for p in (handbuilt_run / "analysis").iterdir())
    assert names == sorted(p.name for p in (here / "analysis").iterdir())
    assert set(names) == EXPECTED
    for name in names:
        if name != "source.json":  # names its run folder
            mine = (here / "analysis" / name).read_bytes()
            assert (handbuilt_run / "analysis" / name).read_bytes() == mine, name


def test_analyze_a_sweep_folder_analyses_every_run(handbuilt_run, drawings, capsys):
    code = main(
        ["analyze", str(handbuilt_run.parent.parent), "--n-eval", "64", "--no-ablation", "--quiet"]
    )
    assert code == 0
    assert f"{handbuilt_run}: " in capsys.readouterr().out
    assert "similarity_cka" in drawings and "ablation" not in drawings
    assert (handbuilt_run / "analysis" / "head_statistics.csv").is_file()


def test_analyze_rejects_empty_evaluation(handbuilt_run, capsys):
    assert main(["analyze", str(handbuilt_run), "--n-eval", "0", "--quiet"]) == 2
    assert "--n-eval=0 is invalid" in capsys.readouterr().err
    assert not (handbuilt_run / "analysis").exists()  # nothing half-written


def test_analyze_missing_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _start_writing_then_hang(*args, path, **kwargs):
    """Stands in for a figure in the worker: its PDF's temp file is written, then it hangs."""
    from mhainterp.io import atomic_path

    with atomic_path(Path(path).with_suffix(".pdf")) as tmp:
        tmp.write_bytes(b"%PDF- half of a figure")
        time.sleep(60)


def test_ctrl_c_leaves_no_temp_file_of_the_worker(handbuilt_run, monkeypatch):
    """Ctrl-C while the figure worker writes a figure: the worker is stopped and its
    half-written temp file removed, so the folder holds only finished files."""
    import mhainterp.analyze.run as analyze_module
    import mhainterp.figures.patterns as pattern_figures
    from mhainterp.analyze import analyze_run

    out = handbuilt_run / "analysis"

    def interrupt_once_the_worker_writes(*args, **kwargs):
        deadline = time.monotonic() + 60
        while not any(p.name.startswith(".example_patterns.pdf.") for p in out.iterdir()):
            assert time.monotonic() < deadline, "the worker never started the figure"
            time.sleep(0.02)
        raise KeyboardInterrupt

    monkeypatch.setattr(pattern_figures, "plot_example_patterns", _start_writing_then_hang)
    monkeypatch.setattr(analyze_module, "_ablation", interrupt_once_the_worker_writes)
    with pytest.raises(KeyboardInterrupt):
        analyze_run(handbuilt_run, n_eval=64, background=True)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert not (out / "example_patterns.pdf").exists()
