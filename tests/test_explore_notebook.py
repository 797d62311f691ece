"""The tutorial notebook (analysis/tour.ipynb) runs from top to bottom, and what it prints and
shows is what the library computes for the run it wrote."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mhainterp.ablation import Ablator
from mhainterp.io import read_json
from mhainterp.training import load_run

NOTEBOOK = Path(__file__).resolve().parents[1] / "analysis" / "tour.ipynb"
WIDGET = "application/vnd.jupyter.widget-view+json"


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


@pytest.mark.slow
def test_tour_notebook_runs_and_its_numbers_are_the_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("anywidget")
    monkeypatch.setenv("MHAINTERP_TOUR_DIR", str(tmp_path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    code = [c for c in notebook.cells if c.cell_type == "code"]

    run_dir = tmp_path / "previous_token_h4_seed0"
    saved = read_json(run_dir / "eval.json")
    assert f"accuracy on the fixed evaluation set: {saved['accuracy']:.4f}" in _text(code[1])
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # average patterns and the similarity heatmap
    assert (run_dir / "analysis" / "specialization_heads.csv").is_file()

    widgets = [c for c in code if any(WIDGET in o.get("data", {}) for o in c.outputs)]
    assert len(widgets) == 1 and "mhainterp.explore(RUN)" in widgets[0].source

    # The printed accuracies equal the batched engine's (Ablator) on the saved run.
    run = load_run(run_dir)
    ablator = Ablator(run.model, run.task)
    rows = re.findall(r"ablate (\S+)\s+accuracy (\d\.\d{4})", _text(code[-1]))
    assert len(rows) == 4
    for heads, shown in rows:
        assert float(shown) == pytest.approx(ablator.set(heads).evaluate()["accuracy"], abs=1e-4)
