"""Issue 33 items 1 and 3: the division heatmap shows the profiles each axis's call rests on
(single, kept or group), and a ``*`` sits only on a cell that shows the effect it marks.

Known answers by setting weights: two pairs of copies that split the positions (no head
damages alone, so single-head profiles are blank and the call rests on kept-head or group
profiles).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from mhainterp import division_of_labour
from mhainterp.figures.division import division_heatmap, save_division_figures
from mhainterp.model.handbuilt import split_heads_model
from mhainterp.tasks import split_batch

POSITIONS = list(range(2, 12))  # the scored positions of split_batch(seq_len=12)
FIRST, SECOND = ("position", POSITIONS[:5]), ("position", POSITIONS[5:])
FAST = dict(method="zero", methods=("zero",), n_bootstrap=50)


@pytest.fixture(scope="module")
def backed_up_pairs():
    """Copies L0H0 = L0H1 serve positions 2-6, L0H2 = L0H3 positions 7-11; with the group
    L0H0,L0H1 given, the call rests on kept-head profiles."""
    model = split_heads_model([FIRST, FIRST, SECOND, SECOND])
    batch = split_batch(256)
    kept = division_of_labour(model, batch, "position", groups=["L0H0,L0H1"], **FAST)
    group = division_of_labour(model, batch, "position", **FAST)
    return kept, group


def _draw(result) -> plt.Figure:
    return division_heatmap(
        result.profiles, result.heads, basis_profiles=result.basis_profiles, index=result.index
    )


def _panel(fig: plt.Figure) -> plt.Axes:
    return next(ax for ax in fig.axes if ax.get_label() != "<colorbar>")


def _cells(ax: plt.Axes) -> np.ndarray:
    """The panel's drawn values, rows x columns (seaborn's QuadMesh)."""
    mesh = ax.collections[0]
    rows = len(ax.get_yticklabels())
    return np.asarray(mesh.get_array()).reshape(rows, -1)


def _stars(ax: plt.Axes) -> list[tuple[str, str]]:
    """``(row label, column label)`` of every ``*``."""
    rows = [t.get_text() for t in ax.get_yticklabels()]
    columns = [t.get_text() for t in ax.get_xticklabels()]
    return [
        (rows[int(t.get_position()[1])], columns[int(t.get_position()[0])])
        for t in ax.texts
        if t.get_text() == "*"
    ]


def test_a_call_on_kept_head_profiles_draws_them_not_the_blank_single_ones(backed_up_pairs):
    kept, _ = backed_up_pairs
    row = kept.index.set_index("by").loc["position"]
    assert (row.call, row.basis, row.n_damaging) == ("divided", "kept", 0)
    assert (kept.profiles["damage"] == 0).all()  # the single-head heatmap would be blank
    fig = _draw(kept)
    ax = _panel(fig)
    assert ax.get_title() == "by position: divided\n(kept-head profiles)"
    assert ax.get_ylabel() == "head kept alone"
    cells = _cells(ax)
    # Kept alone in its layer, each head adds its half of the positions (zero ablation: 1.0).
    expected = np.array([[1.0] * 5 + [0.0] * 5] * 2 + [[0.0] * 5 + [1.0] * 5] * 2)
    assert cells == pytest.approx(expected, abs=1e-6)
    assert not any("no damaging head" in t.get_text() for t in ax.texts)
    plt.close(fig)


def test_every_star_sits_on_a_cell_that_shows_the_effect(backed_up_pairs):
    kept, _ = backed_up_pairs
    fig = _draw(kept)
    ax = _panel(fig)
    stars = _stars(ax)
    first = [(h, str(p)) for h in ("L0H0", "L0H1") for p in POSITIONS[:5]]
    second = [(h, str(p)) for h in ("L0H2", "L0H3") for p in POSITIONS[5:]]
    assert sorted(stars) == sorted(first + second)  # every served value, on its kept cell
    cells = _cells(ax)
    rows = [t.get_text() for t in ax.get_yticklabels()]
    columns = [t.get_text() for t in ax.get_xticklabels()]
    assert all(cells[rows.index(h), columns.index(v)] >= 0.01 for h, v in stars)
    plt.close(fig)


def test_the_old_single_head_figure_put_stars_on_blank_cells(backed_up_pairs):
    # Without the index the figure is the single-head one: blank, and it says so; a served
    # value's star is not drawn on a cell that shows nothing.
    kept, _ = backed_up_pairs
    fig = division_heatmap(kept.profiles, kept.heads)
    ax = _panel(fig)
    assert ax.get_title() == "by position"
    assert _stars(ax) == []
    assert any(t.get_text().startswith("no damaging head") for t in ax.texts)
    plt.close(fig)


def test_a_call_on_group_profiles_draws_the_groups(backed_up_pairs):
    _, group = backed_up_pairs
    assert group.index.set_index("by").loc["position", "basis"] == "group"
    fig = _draw(group)
    ax = _panel(fig)
    assert ax.get_title() == "by position: divided\n(group profiles)"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["L0H0,L0H1", "L0H2,L0H3"]
    expected = np.array([[1.0] * 5 + [0.0] * 5, [0.0] * 5 + [1.0] * 5])
    assert _cells(ax) == pytest.approx(expected, abs=1e-6)
    # The heads' own flags rest on kept profiles, not on these rows: no star here.
    assert _stars(ax) == []
    plt.close(fig)


def test_the_saved_figure_is_drawn_on_the_calls_basis(backed_up_pairs, tmp_path):
    kept, _ = backed_up_pairs
    kept.save(tmp_path)
    (path,) = save_division_figures(kept, tmp_path)
    assert path.name == "division_profiles.png" and path.with_suffix(".pdf").is_file()
    assert pd.read_csv(tmp_path / "division_basis_profiles.csv")["basis"].eq("kept").any()
    plt.close("all")
