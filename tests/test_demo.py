"""The README's main job, end to end, at a tiny size (the real one trains 1,500 steps)."""

from __future__ import annotations

import pandas as pd

from mhainterp.cli import main


def test_demo_runs_both_sweeps_analyses_heads_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "quick"
    args = ["demo", "--out", str(out), "--steps", "8", "--seeds", "0,1", "--n-heads", "1,2"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "### count_previous" in printed and "### reverse" in printed
    for task in ("count_previous", "reverse"):
        results = pd.read_csv(out / task / "results.csv")
        assert results[["n_heads", "seed"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
        assert results["n_params"].nunique() == 1
        assert (out / task / "head_count_accuracy.png").is_file()
        analysis = out / task / "runs" / "h2_seed0" / "analysis"
        assert (analysis / "similarity_separation.png").is_file()
        assert (analysis / "ablation_importance.csv").is_file()
    report = (out / "report.md").read_text()
    accuracy = pd.read_csv(out / "reverse" / "summary_table.csv")["val_accuracy_mean"].iloc[0]
    assert f"{accuracy:.3f}" in report  # the report states the measured numbers
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and 'src="http' not in html

    # Rerunning resumes: nothing is retrained and the tables are identical.
    before = pd.read_csv(out / "reverse" / "results.csv")
    assert main(args) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out / "reverse" / "results.csv"), before)
