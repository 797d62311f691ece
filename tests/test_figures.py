"""Every figure, rendered from a small known DataFrame: its labels, whole-number ticks on integer
axes, tick labels that do not overlap, cell text that is legible or absent, legends outside the
data, count error bars that stop at 0, and the vector PDF beside each PNG (issue 19 item 14).

Geometry is checked with matplotlib's own bounding boxes after a draw, never by eye.
"""

from __future__ import annotations

import itertools

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from mhainterp.figures._common import (
    COUNT_CLIP_NOTE,
    count_error_bars,
    fit_cell_text,
    fit_tick_labels,
    plt,
    save_figure,
    sns,
    wrapped_grid,
)
from mhainterp.figures.ablation import importance_figure, pairwise_figure, prune_curve_figure
from mhainterp.figures.division import division_heatmap, division_vs_heads
from mhainterp.figures.headcount import plot_head_count_accuracy, plot_training_curves
from mhainterp.figures.patterns import plot_average_patterns, plot_example_patterns
from mhainterp.figures.similarity import plot_head_map, plot_similarity_heatmap
from mhainterp.figures.specialization import (
    consistency_figure,
    role_heatmap,
    specialization_vs_heads,
)

HEADS8 = [f"L0H{h}" for h in range(8)]


# ----------------------------------------------------------------------------- checks


def _drawn(fig: plt.Figure) -> plt.Figure:
    fig.canvas.draw()
    return fig


def _data_axes(fig: plt.Figure) -> list[plt.Axes]:
    """Visible axes that hold data (colour bars and blank legend cells excluded)."""
    return [
        ax for ax in fig.axes if ax.get_visible() and ax.axison and ax.get_label() != "<colorbar>"
    ]


def _legends(fig: plt.Figure) -> list:
    found = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return found + list(fig.legends)


def assert_legends_outside_data(fig: plt.Figure) -> None:
    """No legend box overlaps the data area (the axes patch) of any panel with data."""
    _drawn(fig)
    for legend, ax in itertools.product(_legends(fig), _data_axes(fig)):
        box, area = legend.get_window_extent(), ax.get_window_extent()
        assert not box.overlaps(area), (ax.get_title(), legend.get_texts()[0].get_text())


def _labels(ax: plt.Axes, axis: str) -> list:
    """The tick labels a reader sees: visible, non-empty, at a tick inside the view limits."""
    low, high = sorted(getattr(ax, f"get_{axis}lim")())
    along = 0 if axis == "x" else 1
    return [
        label
        for label in getattr(ax, f"get_{axis}ticklabels")()
        if low <= label.get_position()[along] <= high and label.get_visible() and label.get_text()
    ]


def assert_integer_ticks(ax: plt.Axes, axis: str) -> list[int]:
    """Every shown tick label of ``axis`` is a whole number (text like ``2.5`` fails)."""
    _drawn(ax.figure)
    texts = [t.get_text().replace("−", "-") for t in _labels(ax, axis)]
    assert texts, f"no tick labels on {axis}"
    assert all(t.lstrip("-").isdigit() for t in texts), texts
    return [int(t) for t in texts]


def assert_no_overlapping_tick_labels(ax: plt.Axes, axis: str) -> None:
    _drawn(ax.figure)
    boxes = [t.get_window_extent() for t in _labels(ax, axis)]
    for a, b in itertools.pairwise(boxes):
        assert not a.overlaps(b), (axis, a, b)


def assert_cell_text_legible_or_absent(ax: plt.Axes) -> None:
    """Cell texts are at least 6 pt and each fits inside its cell (or there are none)."""
    _drawn(ax.figure)
    texts = [t for t in ax.texts if t.get_text()]
    assert all(t.get_fontsize() >= 6 for t in texts)
    mesh = ax.collections[0]  # the heatmap's QuadMesh
    rows, cols = mesh.get_array().shape
    area = ax.get_window_extent()
    cell_w, cell_h = area.width / cols, area.height / rows
    for text in texts:
        box = text.get_window_extent()
        assert box.width <= cell_w and box.height <= cell_h, (text.get_text(), box, cell_w)


def assert_saved_with_vector_copy(fig: plt.Figure, tmp_path, name: str, data=None) -> None:
    png = save_figure(fig, tmp_path / f"{name}.png", data)
    assert png.read_bytes()[:4] == b"\x89PNG"
    pdf = png.with_suffix(".pdf")
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert pdf.stat().st_size < 1_000_000
    assert png.with_suffix(".csv").is_file() == (data is not None)


# ----------------------------------------------------------------------------- saving


def test_save_figure_writes_png_pdf_and_csv_and_the_pdf_is_reproducible(tmp_path):
    table = pd.DataFrame({"x": [0, 1, 2], "y": [0.0, 1.0, 4.0]})

    def draw() -> plt.Figure:
        fig, ax = plt.subplots()
        ax.plot(table["x"], table["y"])
        return fig

    save_figure(draw(), tmp_path / "a" / "curve.png", table)
    save_figure(draw(), tmp_path / "b" / "curve.png", table)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "curve.csv",
        "curve.pdf",
        "curve.png",
    ]
    # No creation date in the PDF: the same figure gives the same bytes.
    assert (tmp_path / "a/curve.pdf").read_bytes() == (tmp_path / "b/curve.pdf").read_bytes()
    assert pd.read_csv(tmp_path / "a/curve.csv").equals(table)
    save_figure(draw(), tmp_path / "c" / "curve.png", vector=False)
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["curve.png"]


def test_count_error_bars_stop_at_zero():
    arms = count_error_bars([1 / 3, 2.0, 0.0, np.nan], [0.577, 0.5, np.nan, 1.0])
    assert arms[0].round(3).tolist()[:3] == [0.333, 0.5, 0.0]  # lower: min(std, mean)
    assert arms[1].round(3).tolist() == [0.577, 0.5, 0.0, 1.0]  # upper: std (NaN: no bar)


def test_wrapped_grid_wraps_five_panels_into_two_rows_of_three():
    fig, axes, spare = wrapped_grid(2, 5, ncols=3, width=4.0, height=3.4)
    assert axes.shape == (2, 5) and len(spare) == 2 and not spare[0].axison
    assert tuple(fig.get_size_inches()) == (12.0, 13.6)
    assert axes[1, 0] is fig.axes[6]  # the second block starts on the third drawn row
    plt.close(fig)


def test_fit_tick_labels_turns_crowded_labels_and_leaves_room_alone():
    fig, (crowded, roomy) = plt.subplots(1, 2, figsize=(4, 3))
    long = [f"ref:L{i // 8}H{i % 8}" for i in range(24)]
    crowded.set_xticks(range(24), long)
    roomy.set_xticks(range(2), ["a", "b"])
    # what it returns tells a caller whether the figure must be measured again
    assert fit_tick_labels(crowded, "x") is True
    assert fit_tick_labels(roomy, "x") is False
    assert {t.get_rotation() for t in crowded.get_xticklabels()} == {90.0}
    assert_no_overlapping_tick_labels(crowded, "x")
    assert {t.get_rotation() for t in roomy.get_xticklabels()} == {0.0}
    plt.close(fig)


def test_fit_cell_text_drops_text_of_cells_too_small_to_read():
    fig, ax = plt.subplots(figsize=(3, 3))
    sns.heatmap(np.zeros((24, 24)), annot=True, fmt=".2f", ax=ax, cbar=False)
    assert fit_cell_text(ax, 24, 24) is False and len(ax.texts) == 0
    plt.close(fig)


# ----------------------------------------------------------------------------- figures


def _texts(ax: plt.Axes, text: str | None = None, color: str | None = None) -> list:
    """The axes' texts (a tiled figure's titles and labels), those reading ``text`` and of
    ``color`` when given."""
    return [
        t
        for t in ax.texts
        if (text is None or t.get_text() == text)
        and (color is None or matplotlib.colors.same_color(t.get_color(), color))
    ]


def test_average_patterns_tick_positions_at_whole_numbers(tmp_path):
    q, k = np.tril_indices(16)
    rows = [
        pd.DataFrame({"head_label": h, "query": q, "key": k, "weight": 1.0 * (q - k == 1)})
        for h in ("L0H0", "L0H1")
    ]
    patterns = pd.concat(rows, ignore_index=True)
    templates = patterns[patterns.head_label == "L0H0"].drop(columns="head_label")
    templates = templates.assign(relation="previous")
    fig = plot_average_patterns(patterns, templates)
    tiles, colorbar = fig.axes  # the panels are one image
    assert colorbar.get_label() == "<colorbar>"
    assert len(_texts(tiles, "L0H0")) == 1 and len(_texts(tiles, "query position")) == 1
    assert len(_texts(tiles, "template: previous", color="firebrick")) == 1
    assert set(assert_integer_ticks(tiles, "y")) <= set(range(16))
    _drawn(fig)
    # the key positions under each of the three panels (one row): whole numbers, apart
    keys = [t for t in tiles.texts if t.get_text().isdigit()]
    assert {int(t.get_text()) for t in keys} == {0, 4, 8, 12} and len(keys) == 3 * 4
    boxes = sorted((t.get_window_extent() for t in keys), key=lambda box: box.x0)
    assert not any(a.overlaps(b) for a, b in itertools.pairwise(boxes))
    assert_saved_with_vector_copy(fig, tmp_path, "average_patterns")


def _heads_patterns(n_layers: int, n_heads: int) -> pd.DataFrame:
    """Head ``i``'s pattern is ``i / n`` on the diagonal (each panel tells which it is)."""
    q, k = np.tril_indices(16)
    n = n_layers * n_heads
    labels = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
    rows = [
        pd.DataFrame({"head_label": h, "query": q, "key": k, "weight": (q == k) * i / n})
        for i, h in enumerate(labels)
    ]
    return pd.concat(rows, ignore_index=True)


def test_a_tiled_pattern_figure_has_every_panel_where_its_title_says():
    """32 heads and 3 templates: one image of 5 rows x 8 panels, each panel's weights at its
    tile under its title, a query label per row, a key label under each column's lowest panel,
    one colour bar on the 0..1 scale; no two titles or labels overlap."""
    patterns = _heads_patterns(2, 16)
    templates = pd.concat(
        [
            patterns[patterns.head_label == "L1H15"].drop(columns="head_label").assign(relation=r)
            for r in ("previous", "mirror", "same_token_upto")
        ]
    )
    fig = plot_average_patterns(patterns, templates)
    tiles, _ = fig.axes
    (image,) = tiles.images
    assert image.get_clim() == (0.0, 1.0)
    titles = [t.get_text() for t in tiles.texts if t.get_text().startswith(("L", "template"))]
    labels = [f"L{layer}H{head}" for layer in range(2) for head in range(16)]
    template_titles = ["template: previous", "template: mirror", "template: same_token_upto"]
    assert titles == [*labels, *template_titles]
    assert len(_texts(tiles, "query position")) == 5  # one per row
    assert len(_texts(tiles, "key position")) == 8  # one per column, under its lowest panel
    mosaic = np.ma.filled(image.get_array(), np.nan)
    step = 16 + round(0.3 * 16)  # a panel and the gap after it
    for i, label in enumerate(labels):
        top, left = (i // 8) * step, (i % 8) * step
        tile = mosaic[top : top + 16, left : left + 16]
        np.testing.assert_allclose(np.diag(tile), i / 32)  # the panel titled `label`
        title = _texts(tiles, label)[0]
        assert title.xy == (left + 7.5, top - 0.5)  # centred over its tile
    assert np.isnan(mosaic[16:step]).all()  # gaps between rows are blank
    _drawn(fig)
    shown = [t.get_window_extent() for t in tiles.texts]
    overlapping = [(a, b) for a, b in itertools.combinations(range(len(shown)), 2)
                   if shown[a].overlaps(shown[b])]  # fmt: skip
    assert overlapping == [], [(tiles.texts[a].get_text(), tiles.texts[b].get_text())
                               for a, b in overlapping]  # fmt: skip
    plt.close(fig)


def test_a_tiled_example_figure_labels_each_columns_lowest_panel_with_the_tokens(tmp_path):
    """Example patterns of 5 heads in rows of 4: the key tokens under the lowest panel of each
    column (the second row's first, the first row's others), the query tokens on every row."""
    base = _heads_patterns(1, 5)
    tokens = np.arange(16) % 10
    example = base.assign(
        query_token=tokens[base["query"].to_numpy()], key_token=tokens[base["key"].to_numpy()]
    )
    fig = plot_example_patterns(example, max_cols=4)
    tiles = fig.axes[0]
    token_labels = [f"{p}:{p % 10}" for p in range(16)]
    assert [t.get_text() for t in tiles.get_yticklabels()] == token_labels * 2  # two rows
    keys = [t for t in tiles.texts if t.get_text() in token_labels]
    assert len(keys) == 4 * 16 and all(t.get_rotation() == 90 for t in keys)
    lowest = {round(t.xy[1], 1) for t in keys}
    step = 16 + round(0.3 * 16)
    assert lowest == {15.5, step + 15.5}  # under row 0 (columns 1-3) and row 1 (column 0)
    assert len(_texts(tiles, "query (position:token)")) == 2
    assert_saved_with_vector_copy(fig, tmp_path, "example_patterns", example)


def test_a_tiled_figure_of_32_heads_has_no_two_labels_overlapping():
    """The long query label of every row stays within its row, as the titles and the key
    tokens stay apart (32 heads: rows of 8 smaller panels)."""
    base = _heads_patterns(2, 16)
    tokens = np.arange(16) % 10
    example = base.assign(
        query_token=tokens[base["query"].to_numpy()], key_token=tokens[base["key"].to_numpy()]
    )
    fig = plot_example_patterns(example)
    tiles = fig.axes[0]
    _drawn(fig)
    # apart by more than 3 px: closer, two labels read as one ("token)query")
    labels = _texts(tiles, "query (position:token)")
    rows = sorted((t.get_window_extent().padded(1.5) for t in labels), key=lambda box: box.y0)
    assert len(rows) == 4
    assert not any(a.overlaps(b) for a, b in itertools.pairwise(rows))
    titles = [t.get_window_extent() for t in tiles.texts if t.get_text().startswith("L")]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(titles, 2))
    plt.close(fig)


def _sweep_runs() -> pd.DataFrame:
    """3 seeds x h = 1, 4, 8; at h = 8 one seed of three holds a relation (mean 1/3, sd 0.58)."""
    rows = []
    for h, n_relations in ((1, [1, 1, 1]), (4, [1, 0, 1]), (8, [1, 0, 0])):
        for seed, n in enumerate(n_relations):
            rows.append(
                {"task": "count_previous", "n_heads": h, "seed": seed, "n_relations": n,
                 "heads_per_relation": 1.0 if n else np.nan, "frac_backed_up": 0.0,
                 "frac_dead": 0.125 * seed, "val_accuracy": 0.6 + 0.04 * h}
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_specialization_vs_heads_is_a_grid_with_counts_clipped_at_zero(tmp_path):
    fig = specialization_vs_heads(_sweep_runs())
    width, height = fig.get_size_inches()
    assert width / height <= 2.0  # a grid, not a 2,397 x 401 strip
    panels = _data_axes(fig)
    assert [ax.get_ylabel() for ax in panels] == [
        "relations covered (a count)",
        "heads per relation (a count)",
        "backed-up share of heads",
        "dead share of heads",
        "validation accuracy",
    ]
    relations = panels[0]
    assert assert_integer_ticks(relations, "y") == [0, 1]
    assert [t.get_text() for t in relations.get_xticklabels()] == ["h=1", "h=4", "h=8"]
    (bars,) = [c for c in relations.containers if isinstance(c, ErrorbarContainer)]
    lows = [segment[:, 1].min() for segment in bars.lines[2][0].get_segments()]
    # h = 1: no spread; h = 4: 2/3 - 0.577 = 0.089; h = 8: 1/3 - 0.577 < 0, drawn to 0
    assert np.allclose(lows, [1.0, 2 / 3 - np.std([1, 0, 1], ddof=1), 0.0])
    assert COUNT_CLIP_NOTE.replace(": ", ":\n") in [t.get_text() for t in fig.texts]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()][-1] == "mean ± std"
    assert_legends_outside_data(fig)
    assert_saved_with_vector_copy(fig, tmp_path, "specialization_vs_heads", _sweep_runs())


def test_consistency_legend_is_outside_the_data():
    table = pd.DataFrame(
        {"task": "t", "n_heads": [2, 2, 4, 4], "consistency": [0.9, 1.0, 0.95, 1.0],
         "random_matching": 0.5, "null_shuffled": 0.98}
    )  # fmt: skip
    fig = consistency_figure(table)
    (ax,) = _data_axes(fig)
    assert ax.get_ylabel() == "matched role-profile similarity"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "run pairs",
        "observed",
        "random matching",
        "heads shuffled across seeds",
    ]
    assert_legends_outside_data(fig)
    plt.close(fig)


def _roles(n_heads: int, roles: list[str]) -> pd.DataFrame:
    heads = [f"L{i // 8}H{i % 8}" for i in range(n_heads)]
    table = pd.DataFrame(
        [(h, r, 0.9 if i == j else 0.1) for i, h in enumerate(heads)
         for j, r in enumerate(roles)],
        columns=["head_label", "role", "score"],
    )  # fmt: skip
    table["p_adj"] = np.where(table["score"] > 0.5, 0.001, 0.9)
    table["significant"] = table["score"] > 0.5
    table["task_relation"] = table["role"] == roles[0]
    return table


def test_role_scores_cell_text_is_legible_on_a_small_table():
    fig = role_heatmap(_roles(2, ["previous", "uniform"]))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["0.90**", "0.10", "0.10", "0.90**"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["previous †", "uniform"]
    assert_cell_text_legible_or_absent(ax)
    plt.close(fig)


def test_role_scores_cell_text_fits_or_goes_on_a_large_table():
    roles = ["previous", "uniform", "self", "first", "mirror", "next", "bos", "same_token"]
    fig = role_heatmap(_roles(32, roles))
    ax = fig.axes[0]
    assert_cell_text_legible_or_absent(ax)
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["L0H0", "L0H1"]
    plt.close(fig)


def _profiles(damage: float) -> pd.DataFrame:
    """2 heads x (token 0..2, target_class 0..2); target_class 2 has too few scored triples."""
    rows = [
        {"head_label": h, "by": by, "value": v, "damage": damage * (i + 1) * (v + 1) / 10,
         "in_index": not (by == "target_class" and v == 2)}
        for i, h in enumerate(["L0H0", "L0H1"]) for by in ("token", "target_class")
        for v in range(3)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_division_profiles_drop_left_out_values_and_show_no_grid():
    heads = pd.DataFrame({"head_label": ["L0H1", "L0H0"], "by": "token", "serves": ["2", np.nan]})
    fig = division_heatmap(_profiles(1.0), heads)
    token, target = _data_axes(fig)[:2]
    assert [t.get_text() for t in target.get_xticklabels()] == ["0", "1"]  # no blank column 2
    assert target.get_xlabel() == "target class\n(left out, too few scored: 2)"
    assert token.get_xlabel() == "token" and token.get_ylabel() == "head"
    assert not any(line.get_visible() for line in target.get_xgridlines())
    assert not any(line.get_visible() for line in target.get_ygridlines())
    marks = [t.get_text() for t in token.texts if t.get_text()]
    assert marks == ["*"]  # L0H1 serves token 2
    assert not any("no damaging head" in t.get_text() for t in token.texts)


def test_division_profiles_say_so_when_no_head_does_damage(tmp_path):
    fig = division_heatmap(_profiles(0.0))
    for ax in _data_axes(fig)[:2]:
        assert any(t.get_text().startswith("no damaging head") for t in ax.texts)
    assert_saved_with_vector_copy(fig, tmp_path, "division_profiles")


def test_division_vs_heads_ticks_head_counts_and_keeps_the_legend_outside():
    sweep = pd.DataFrame(
        {"task": "t", "n_heads": [1, 1, 4, 4, 8, 8], "seed": [0, 1] * 3, "by": "token",
         "index": [np.nan, np.nan, 0.3, 0.3, 0.5, 0.4], "null_index": 0.1,
         "null_index_std": 0.02}
    )  # fmt: skip
    fig = division_vs_heads(sweep)
    (ax,) = _data_axes(fig)
    assert assert_integer_ticks(ax, "x") == [1, 4, 8]
    assert [(t.get_text(), t.get_position()[0]) for t in ax.texts] == [("no index", 1)]
    assert ax.get_xlabel() == "heads (h)" and ax.get_ylabel() == "division index"
    assert_legends_outside_data(fig)
    plt.close(fig)


def test_separation_heatmap_tick_labels_do_not_overlap():
    rows = [f"L{i // 8}H{i % 8}" for i in range(16)]
    cols = [f"ref:L{i // 8}H{i % 8}" for i in range(16)]
    values = np.linspace(0, 1, 16 * 16).reshape(16, 16)
    fig = plot_similarity_heatmap(
        pd.DataFrame(values, index=rows, columns=cols), method="separation"
    )
    ax = fig.axes[0]
    assert ax.get_xlabel() == "model B head" and ax.get_ylabel() == "model A head"
    assert_no_overlapping_tick_labels(ax, "x")
    assert_no_overlapping_tick_labels(ax, "y")
    assert_cell_text_legible_or_absent(ax)
    plt.close(fig)


def test_similarity_heatmap_values_are_written_when_cells_are_large():
    sim = pd.DataFrame(
        [[1.0, 0.2, 0.9], [0.2, 1.0, 0.3], [0.9, 0.3, 1.0]],
        index=["L0H0", "L0H1", "L0H2"], columns=["L0H0", "L0H1", "L0H2"],
    )  # fmt: skip
    fig = plot_similarity_heatmap(sim, method="js")
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.texts).count("1.00") == 3
    assert_cell_text_legible_or_absent(ax)
    plt.close(fig)


def test_head_map_legend_is_outside():
    mds = pd.DataFrame({"head_label": ["L0H0", "L0H1", "L1H0"], "x": [0, 1, 0.5], "y": [0, 0, 1]})
    fig = plot_head_map(mds)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["layer 0", "layer 1"]
    assert_legends_outside_data(fig)
    plt.close(fig)


def _importance() -> pd.DataFrame:
    return pd.DataFrame(
        {"head_label": HEADS8 * 2, "method": ["zero"] * 8 + ["mean"] * 8,
         "delta_loss": np.linspace(0, 1, 16), "delta_accuracy": -np.linspace(0, 0.5, 16)}
    )  # fmt: skip


def test_ablation_figures_keep_legends_outside_and_integer_heads_left():
    fig = importance_figure(_importance())
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == HEADS8
    assert_legends_outside_data(fig)
    plt.close(fig)
    curve = pd.DataFrame(
        {"n_heads_left": [4, 3, 2, 1, 0], "accuracy": [1.0, 1.0, 0.9, 0.5, 0.1],
         "removed": ["", "L0H3", "L0H1", "L0H2", "L0H0"], "method": "mean"}
    )  # fmt: skip
    fig = prune_curve_figure(curve)
    assert assert_integer_ticks(fig.axes[0], "x") == [4, 3, 2, 1, 0]
    assert_legends_outside_data(fig)
    plt.close(fig)


def test_pairwise_cell_text_is_legible():
    pairs = [
        {"head_a": a, "head_b": b, "metric": "accuracy", "interaction": 0.1 * i,
         "damage_a": 0.0, "damage_b": 0.0, "method": "mean"}
        for i, (a, b) in enumerate(itertools.combinations(HEADS8, 2))
    ]  # fmt: skip
    fig = pairwise_figure(pd.DataFrame(pairs))
    ax = fig.axes[0]
    assert ax.get_xlabel() == "head b"
    assert_cell_text_legible_or_absent(ax)
    assert_no_overlapping_tick_labels(ax, "x")
    plt.close(fig)


def test_head_count_figures_keep_the_legend_outside():
    results = pd.DataFrame(
        {"task": "t", "n_heads": [1, 1, 4, 4], "seed": [0, 1, 0, 1], "d_model": 64,
         "val_accuracy": [0.6, 0.7, 1.0, 0.99]}
    )  # fmt: skip
    fig = plot_head_count_accuracy(results)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["h=1\nd_head=64", "h=4\nd_head=16"]
    assert_legends_outside_data(fig)
    plt.close(fig)
    curves = pd.DataFrame(
        {"task": ["a"] * 4 + ["b"] * 4, "n_heads": [1, 1, 4, 4] * 2, "seed": 0,
         "step": [0, 10] * 4, "loss": [2.0, 1.0, 2.0, 0.5] * 2}
    )  # fmt: skip
    fig = plot_training_curves(curves)
    assert sum(ax.get_legend() is not None for ax in fig.axes) == 1
    assert_legends_outside_data(fig)
    plt.close(fig)


def test_division_profiles_of_few_heads_and_many_values_stack_instead_of_a_strip():
    rows = [
        {"head_label": f"L0H{h}", "by": by, "value": v, "damage": 0.1, "in_index": True}
        for h in range(4) for by, n in (("token", 10), ("position", 16), ("target_class", 11))
        for v in range(n)
    ]  # fmt: skip
    fig = division_heatmap(pd.DataFrame(rows))
    width, height = fig.get_size_inches()
    assert width / height < 2.0
    titles = [ax.get_title() for ax in _data_axes(fig)]
    assert titles == ["by token", "by position", "by target_class"]
    assert [ax.get_ylabel() for ax in _data_axes(fig)] == ["head"] * 3
    plt.close(fig)


# ----------------------------------------------------------------------------- signatures

PATH_PARAMETERS = {"path", "png_path", "out_dir", "folder", "analysis_dir", "sweep_dir"}


def test_every_figure_saver_takes_the_data_first_then_the_path():
    """Issue 17 item 8: every public ``save_*`` / ``plot_*`` (and the ``*_figures`` planners)
    of mhainterp.figures takes what it draws first, then where it goes, then keywords."""
    import importlib
    import inspect
    import pkgutil

    import mhainterp.figures

    seen = {}
    for info in pkgutil.iter_modules(mhainterp.figures.__path__):
        module = importlib.import_module(f"mhainterp.figures.{info.name}")
        for name in getattr(module, "__all__", []):
            function = getattr(module, name)
            if not inspect.isfunction(function) or not (
                name.startswith(("save_", "plot_")) or name.endswith("_figures")
            ):
                continue
            parameters = list(inspect.signature(function).parameters.values())
            positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
            seen[name] = positional
    # A path comes after the data it saves; only a saver of saved results (which reads the
    # folder itself) takes a path alone.
    path_first = {n: ps for n, ps in seen.items() if ps and ps[0] in PATH_PARAMETERS}
    assert path_first == {"save_folder_figures": ["path"]}, f"path before the data: {path_first}"
    assert seen["save_division_figures"] == ["result", "folder"]
    assert seen["save_specialization_figures"] == ["result", "out_dir"]
    assert seen["save_ablation_figures"] == ["tables", "out_dir"]
    assert seen["save_figure"][:3] == ["fig", "png_path", "data"]
    assert seen["plot_roles_vs_null"] == ["roles", "path"]


def test_pretrained_agreement_scatters_are_saved_beside_their_tables(tmp_path):
    from mhainterp.figures.pretrained import plot_attribution_vs_exact, plot_zero_vs_mean

    table = pd.DataFrame(
        {
            "head_label": ["L0H0", "L0H1", "L1H0"],
            "delta_zero": [0.40, 0.01, 0.20],
            "delta_mean": [0.01, 0.01, 0.19],
            "disagree": [True, False, False],
        }
    )
    png = plot_zero_vs_mean(table, tmp_path / "zero_vs_mean.png")
    assert png.is_file() and pd.read_csv(png.with_suffix(".csv")).equals(table)
    verified = pd.DataFrame(
        {"method": ["zero", "zero", "mean"], "head_label": ["L0H0", "L0H1", "L0H0"],
         "attribution": [0.3, 0.0, 0.02], "exact": [0.4, 0.01, 0.01]}
    )  # fmt: skip
    png = plot_attribution_vs_exact(verified, tmp_path / "attribution.png")
    assert pd.read_csv(png.with_suffix(".csv")).equals(verified)
    with pytest.raises(ValueError, match="exact"):
        plot_attribution_vs_exact(verified.drop(columns="exact"), tmp_path / "bad.png")


def test_sweep_figures_show_the_seed_that_holds_the_relations(tmp_path, monkeypatch):
    """Issue 33 item 6: the sweep's attention figure (role scores) showed the first seed of
    each head count; in an induction sweep that was the one seed of three without an
    induction head. The example is now the seed whose heads hold the most relations."""
    from types import SimpleNamespace

    import mhainterp.figures.saved as saved

    runs = pd.DataFrame(
        {"run": [f"induction/h{h}_seed{s}" for h in (1, 4) for s in range(3)],
         "n_heads": [1, 1, 1, 4, 4, 4], "seed": [0, 1, 2] * 2,
         "n_relations": [1, 1, 1, 1, 2, 2]}  # h=4: seed 0 holds previous only
    )  # fmt: skip
    roles = pd.DataFrame(
        {"run": runs["run"], "head_label": "L0H0", "role": "previous", "score": 0.9,
         "p_adj": 0.01, "significant": True}
    )  # fmt: skip
    result = SimpleNamespace(roles=roles, causal=roles.iloc[:0], consistency=pd.DataFrame(),
                             settings=SimpleNamespace(alpha=0.05))  # fmt: skip
    shown = []
    monkeypatch.setattr(
        saved, "role_heatmap", lambda r, **k: shown.append(list(r["run"])) or plt.figure()
    )
    monkeypatch.setattr(saved, "specialization_vs_heads", lambda r: plt.figure())
    spec = SimpleNamespace(runs=runs, result=result)
    saved.sweep_specialization_figures(spec, tmp_path, draw=True)
    assert shown == [["induction/h1_seed0", "induction/h4_seed1"]]
    assert saved.example_runs(runs.drop(columns="n_relations")) == [
        "induction/h1_seed0",
        "induction/h4_seed0",
    ]  # an old table without the column: the first seed


def test_heatmaps_of_heads_of_several_layers_name_the_layers():
    """Issue 33 item 6: heads of different layers are compared by name only ("L0H3 vs
    L1H2"); the heatmaps now draw a line between the layers and name them on the axis."""
    fig = role_heatmap(_roles(16, ["previous", "uniform"]))
    ax = fig.axes[0]
    assert ax.get_ylabel() == "head (layer 0 | layer 1, lines between layers)"
    assert [line.get_ydata()[0] for line in ax.lines] == [8]  # between L0H7 and L1H0
    plt.close(fig)
    assert role_heatmap(_roles(2, ["previous"])).axes[0].get_ylabel() == "head"  # one layer
    plt.close("all")


def test_a_figure_killed_before_its_png_is_drawn_again_pdf_included(tmp_path, monkeypatch):
    """Callers take the PNG as the sign that a figure is done, so it is written last: a process
    killed after the PDF but before the PNG leaves no PNG, and the rerun draws both again (the
    PDF was written second and never redrawn; ``mhainterp report`` killed at random lost it)."""
    import contextlib

    import matplotlib.pyplot as plt

    from mhainterp.figures import _common
    from mhainterp.figures._common import save_figure

    written: list[str] = []
    real = _common.atomic_path

    @contextlib.contextmanager
    def killed_at_the_png(path):
        written.append(path.suffix)
        if path.suffix == ".png":
            raise KeyboardInterrupt  # the kill, before the PNG lands
        with real(path) as tmp:
            yield tmp

    png = tmp_path / "curves.png"
    monkeypatch.setattr(_common, "atomic_path", killed_at_the_png)
    with pytest.raises(KeyboardInterrupt):
        save_figure(plt.figure(), png, pd.DataFrame({"x": [1]}))
    assert written == [".pdf", ".png"]
    assert png.with_suffix(".pdf").exists() and not png.exists()  # so a rerun draws it again
    monkeypatch.setattr(_common, "atomic_path", real)
    save_figure(plt.figure(), png, pd.DataFrame({"x": [1]}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.csv", "curves.pdf", "curves.png"]
