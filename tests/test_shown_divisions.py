"""A sweep's division heatmaps are chosen without reading every run's division (issue 38: the
demo's figures read 36 runs' tables to draw 2): the same runs as the choice from every saved
division, on every mix of analysed, current and saved runs, loading only what it draws."""

from __future__ import annotations

import itertools
from pathlib import Path

import mhainterp.figures.saved as saved


def _choice_from_all(run_dirs: list[Path]) -> list[Path]:
    """What division_figures drew for a sweep from every run's saved division (before)."""
    every = saved.saved_divisions(run_dirs)
    return [d for d, _ in ([(d, r) for d, r in every if saved._analysed(d)] or every[-1:])]


def test_the_shown_runs_are_the_choice_from_every_saved_division(monkeypatch):
    run_dirs = [Path(f"h{h}_seed0") for h in (1, 2, 4)]
    states = itertools.product([False, True], repeat=3 * len(run_dirs))
    for flags in states:
        analysed, current, stored = (
            dict(zip(run_dirs, flags[i::3], strict=True)) for i in range(3)
        )

        def load(run_dir, request=None, stored=stored):
            return f"division of {run_dir}" if stored[run_dir] else None

        monkeypatch.setattr(saved, "saved_division", load)
        monkeypatch.setattr(saved, "_analysed", analysed.__getitem__)
        monkeypatch.setattr(saved, "analysis_is_current", current.__getitem__)
        expected = _choice_from_all(run_dirs)
        shown = saved._shown_divisions(run_dirs)
        assert [d for d, _ in shown] == expected, flags
        assert all(r == f"division of {d}" for d, r in shown)


def test_a_sweep_of_analysed_runs_reads_only_their_divisions(monkeypatch):
    run_dirs = [Path(f"h{h}_seed{s}") for h in (1, 4, 8) for s in range(6)]
    loads: list[Path] = []
    monkeypatch.setattr(saved, "saved_division", lambda d, request=None: loads.append(d) or d)
    monkeypatch.setattr(saved, "_analysed", lambda d: d.name == "h8_seed0")
    monkeypatch.setattr(saved, "analysis_is_current", lambda d: True)
    assert [d for d, _ in saved._shown_divisions(run_dirs)] == [Path("h8_seed0")]
    assert loads == [Path("h8_seed0")]  # was every run's 36 tables' worth
