"""Every figure kind the package draws, at its saved size, on small but realistic inputs (16
heads in two layers; 100 seeds at 5 head counts where a figure shows seeds; a 270-head model
for the pretrained figures): no two tick labels of an axis overlap, every panel with data is
wide enough to read, no legend covers a label written in the data, and a sweep figure names
its task (issue 33 item 9).

Geometry comes from matplotlib's own text extents after a draw at the PNG's resolution
(:func:`~mhainterp.figures._common.save_figure`'s dpi); each figure is then saved as PNG and
PDF. Look at them: ``MHAINTERP_FIGURE_DIR=/tmp/figs pytest tests/test_figure_layout.py``.
"""

from __future__ import annotations

import inspect
import itertools
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mhainterp.figures import _common, pretrained
from mhainterp.figures._common import plt, save_figure
from mhainterp.figures.ablation import (
    gradient_vs_ablation_figure,
    importance_figure,
    pairwise_figure,
    prune_curve_figure,
)
from mhainterp.figures.division import division_heatmap, division_vs_heads
from mhainterp.figures.headcount import (
    plot_does_h_matter,
    plot_head_count_accuracy,
    plot_training_curves,
)
from mhainterp.figures.patterns import plot_average_patterns, plot_example_patterns
from mhainterp.figures.similarity import plot_head_map, plot_similarity_heatmap
from mhainterp.figures.specialization import (
    causal_matrix_figure,
    consistency_figure,
    role_heatmap,
    specialization_vs_heads,
)

DPI = inspect.signature(save_figure).parameters["dpi"].default  # the PNG's pixels
MIN_PANEL_PX = 240
"""Narrowest plot panel, in PNG pixels (2 inches): one squeezed by its legend was ~160."""
MIN_IMAGE_PX = 160
"""Narrowest heatmap or pattern panel (one of many small multiples): 10 px a position of 16."""
GAP_PX = 3.0
"""Tick labels closer than this run together: "10", "12", "14" read as "101214"."""
HEADS = [f"L{layer}H{head}" for layer in range(2) for head in range(8)]
HEAD_COUNTS = [1, 2, 4, 8, 16]
SEEDS = range(100)
TASK = "count_previous"
AXES = ("token", "position", "target_class")
RNG = np.random.default_rng(0)


# ----------------------------------------------------------------------------- inputs


def importance(heads: list[str] = HEADS) -> pd.DataFrame:
    rows = [{"head_label": h, "method": m, "delta_loss": RNG.uniform(0, 3),
             "delta_accuracy": -RNG.uniform(0, 0.5)}
            for m in ("zero", "mean", "resample") for h in heads]  # fmt: skip
    return pd.DataFrame(rows)


def pairwise() -> pd.DataFrame:
    rows = [{"head_a": a, "head_b": b, "metric": "accuracy", "interaction": RNG.normal(0, 0.1),
             "damage_a": 0.1, "damage_b": 0.1, "method": "mean"}
            for a, b in itertools.combinations(HEADS, 2)]  # fmt: skip
    return pd.DataFrame(rows)


def prune_curve() -> pd.DataFrame:
    order = ["", *HEADS]
    return pd.DataFrame({"n_heads_left": range(16, -1, -1), "removed": order, "method": "mean",
                         "accuracy": np.linspace(1.0, 0.1, 17)})  # fmt: skip


def gradient_vs_ablation() -> pd.DataFrame:
    """Two heads far out (the legend's corner) and clusters of near-equal heads."""
    rows = []
    for method in ("zero", "mean", "resample"):
        for i, h in enumerate(HEADS):
            far = i in (6, 14)
            rows.append({"head_label": h, "layer": int(h[1]), "head": int(h[3:]),
                         "method": method, "ablation_importance": 7.5 if far else i % 5 * 0.8,
                         "gradient_importance": 0.7 if far else 0.1 + i % 7 * 0.05})  # fmt: skip
    return pd.DataFrame(rows)


def division_profiles() -> tuple[pd.DataFrame, pd.DataFrame]:
    values = {"token": 10, "position": 16, "target_class": 11}
    rows = [{"head_label": h, "by": by, "value": v, "damage": RNG.uniform(0, 0.6),
             "in_index": v < n - 1}
            for h in HEADS for by, n in values.items() for v in range(n)]  # fmt: skip
    heads = pd.DataFrame([{"head_label": h, "by": "token", "serves": "3,4,5,8"} for h in HEADS])
    return pd.DataFrame(rows), heads


def division_sweep() -> pd.DataFrame:
    rows = [{"task": TASK, "n_heads": h, "seed": s, "by": by,
             "index": np.nan if h == 1 else RNG.uniform(0, 0.3), "null_index": 0.02,
             "null_index_std": 0.01, "null_high": 0.04}
            for h in HEAD_COUNTS for s in SEEDS for by in AXES]  # fmt: skip
    return pd.DataFrame(rows)


def results() -> pd.DataFrame:
    rows = [{"task": TASK, "n_heads": h, "seed": s, "d_model": 64,
             "val_accuracy": min(1.0, 0.6 + 0.05 * h + RNG.normal(0, 0.05))}
            for h in HEAD_COUNTS for s in SEEDS]  # fmt: skip
    return pd.DataFrame(rows)


def curves() -> pd.DataFrame:
    steps = np.arange(0, 1500, 100)
    rows = [{"task": TASK, "n_heads": h, "seed": s, "step": int(t),
             "loss": 2.0 * np.exp(-t / (300 * h)) + 0.01}
            for h in HEAD_COUNTS for s in SEEDS for t in steps]  # fmt: skip
    return pd.DataFrame(rows)


def patterns() -> tuple[pd.DataFrame, pd.DataFrame]:
    q, k = np.tril_indices(16)
    frames = [
        pd.DataFrame({"head_label": h, "query": q, "key": k, "weight": 1.0 * (q - k == i % 3)})
        for i, h in enumerate(HEADS)
    ]
    templates = pd.concat(
        [
            pd.DataFrame({"relation": r, "query": q, "key": k, "weight": 1.0 * (q - k == d)})
            for d, r in enumerate(["self", "previous", "same_token_upto"])
        ]
    )
    return pd.concat(frames, ignore_index=True), templates


def example_patterns() -> pd.DataFrame:
    tokens = RNG.integers(0, 10, 16)
    q, k = np.tril_indices(16)
    frames = [pd.DataFrame({"head_label": h, "query": q, "key": k, "query_token": tokens[q],
                            "key_token": tokens[k], "weight": 1.0 * (q == k)})
              for h in HEADS]  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def similarity(reference: bool = False) -> pd.DataFrame:
    values = RNG.uniform(0, 1, (16, 16))
    columns = [f"ref:{h}" for h in HEADS] if reference else HEADS
    if not reference:
        values = (values + values.T) / 2
        np.fill_diagonal(values, 1.0)
    return pd.DataFrame(values, index=HEADS, columns=columns)


def head_map() -> pd.DataFrame:
    return pd.DataFrame(
        {"head_label": HEADS, "x": RNG.normal(0, 0.2, 16), "y": RNG.normal(0, 0.2, 16)}
    )


ROLES = ["same_token_upto", "previous", "self", "first_position", "same_token", "mirror",
         "uniform", "same_token_upto+sink", "same_token+sink", "explained"]  # fmt: skip


def roles() -> pd.DataFrame:
    rows = [{"run": f"{TASK}/h{h}_seed0", "head_label": label, "role": role,
             "score": RNG.uniform(0, 1), "p_adj": RNG.uniform(0, 0.2),
             "significant": bool(RNG.uniform() < 0.2), "task_relation": role == ROLES[0]}
            for h in (4, 8, 16) for label in HEADS[:h] for role in ROLES]  # fmt: skip
    return pd.DataFrame(rows)


def causal() -> pd.DataFrame:
    rows = [{"run": f"multi_relation/h{h}_seed0", "head_label": label, "target": target,
             "damage": RNG.uniform(-0.05, 0.4)}
            for h in (4, 16) for label in HEADS[:h]
            for target in ("previous", "mirror", "count")]  # fmt: skip
    return pd.DataFrame(rows)


def sweep_runs() -> pd.DataFrame:
    rows = [{"task": TASK, "n_heads": h, "seed": s, "n_relations": int(RNG.integers(0, 3)),
             "heads_per_relation": 1.0 + RNG.integers(0, 3), "frac_backed_up": RNG.uniform(0, 1),
             "frac_dead": RNG.uniform(0, 0.3), "val_accuracy": RNG.uniform(0.6, 1.0)}
            for h in HEAD_COUNTS for s in SEEDS]  # fmt: skip
    return pd.DataFrame(rows)


def consistency() -> pd.DataFrame:
    rows = [{"task": TASK, "n_heads": h, "consistency": RNG.uniform(0.2, 1.0),
             "random_matching": 0.5, "null_shuffled": 0.7}
            for h in HEAD_COUNTS[1:] for _ in SEEDS]  # fmt: skip
    return pd.DataFrame(rows)


PRETRAINED_HEADS = [(layer, head) for layer in range(30) for head in range(9)]


def pretrained_roles() -> pd.DataFrame:
    rows = [{"head_label": f"L{layer}H{head}", "layer": layer, "head": head, "role": role,
             "score": RNG.uniform(0, 1), "init_mean": 0.13}
            for layer, head in PRETRAINED_HEADS
            for role in ("previous", "self", "first", "next")]  # fmt: skip
    return pd.DataFrame(rows)


def verified() -> pd.DataFrame:
    labels = [f"L{layer}H{head}" for layer, head in PRETRAINED_HEADS[::12]]
    rows = [{"method": m, "head_label": label, "attribution": RNG.uniform(0, 0.3),
             "exact": RNG.uniform(0, 0.4)}
            for m in ("zero", "mean") for label in labels]  # fmt: skip
    return pd.DataFrame(rows)


def zero_vs_mean() -> pd.DataFrame:
    labels = [f"L{layer}H{head}" for layer, head in PRETRAINED_HEADS[::12]]
    zero, mean = RNG.uniform(0, 0.4, len(labels)), RNG.uniform(0, 0.4, len(labels))
    return pd.DataFrame({"head_label": labels, "delta_zero": zero, "delta_mean": mean,
                         "disagree": np.abs(zero - mean) > 0.1})  # fmt: skip


def _pretrained(draw, data):
    """A pretrained figure (its function saves it): the figure, caught before it is saved."""
    caught = []

    def catch(fig, path, table=None, **options):
        caught.append(fig)
        return Path(path)

    original = pretrained.save_figure
    pretrained.save_figure = catch
    try:
        draw(data, "unused.png")
    finally:
        pretrained.save_figure = original
    return caught[0]


def does_h_matter() -> pd.DataFrame:
    """Per task and h, as ``analyze.study.does_h_matter_table`` writes it: accuracy and the
    division index by two axes, seed mean with a 95% interval (none at h = 1)."""
    rows = []
    for task, level in (("count_previous", 0.6), ("reverse", 1.0)):
        for i, h in enumerate((1, 2, 4, 8)):
            accuracy = min(1.0, level + 0.1 * i)
            high = min(1.0, accuracy + 0.05)
            row = {"task": task, "n_heads": h, "accuracy_mean": accuracy,
                   "accuracy_ci_low": accuracy - 0.05, "accuracy_ci_high": high}  # fmt: skip
            for axis, step in (("token", 0.08), ("position", 0.05)):
                index = float("nan") if h == 1 else step * i
                row |= {f"{axis}_index_mean": index, f"{axis}_index_ci_low": index - 0.02,
                        f"{axis}_index_ci_high": index + 0.02}  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows)


FIGURES = {
    "does_h_matter": lambda: plot_does_h_matter(does_h_matter()),
    "ablation_importance": lambda: importance_figure(importance()),
    # 2 x 16 heads, as analyze's benchmark model: the turned tick labels need a second layout
    "ablation_importance_32_heads": lambda: importance_figure(
        importance([f"L{layer}H{head}" for layer in range(2) for head in range(16)])
    ),
    "ablation_pairwise": lambda: pairwise_figure(pairwise()),
    "ablation_prune_curve": lambda: prune_curve_figure(prune_curve()),
    "gradient_vs_ablation": lambda: gradient_vs_ablation_figure(gradient_vs_ablation()),
    "division_profiles": lambda: division_heatmap(*division_profiles()),
    "division_sweep": lambda: division_vs_heads(division_sweep()),
    "head_count_accuracy": lambda: plot_head_count_accuracy(results()),
    "training_curves": lambda: plot_training_curves(curves()),
    "average_patterns": lambda: plot_average_patterns(*patterns()),
    "example_patterns": lambda: plot_example_patterns(example_patterns()),
    "similarity_js": lambda: plot_similarity_heatmap(similarity(), method="js"),
    # 4 heads: a narrow panel, whose title the colour bar covered
    "similarity_js_4_heads": lambda: plot_similarity_heatmap(
        similarity().iloc[:4, :4], method="js"
    ),
    "similarity_separation": lambda: plot_similarity_heatmap(
        similarity(reference=True), method="separation"
    ),
    "head_map": lambda: plot_head_map(head_map(), method="js"),
    "role_scores": lambda: role_heatmap(roles()),
    "causal_matrix": lambda: causal_matrix_figure(causal()),
    "specialization_vs_heads": lambda: specialization_vs_heads(sweep_runs()),
    "consistency": lambda: consistency_figure(consistency()),
    "pretrained_roles": lambda: _pretrained(pretrained.plot_roles_vs_null, pretrained_roles()),
    "attribution_vs_exact": lambda: _pretrained(pretrained.plot_attribution_vs_exact, verified()),
    "zero_vs_mean": lambda: _pretrained(pretrained.plot_zero_vs_mean, zero_vs_mean()),
}
"""Every figure kind of mhainterp.figures (test_every_figure_kind_is_listed keeps it whole)."""

SWEEP_FIGURES = {"division_sweep", "head_count_accuracy", "training_curves", "does_h_matter",
                 "specialization_vs_heads", "consistency", "role_scores"}  # fmt: skip
"""Figures of a sweep: a reader must see which task they show."""


# ----------------------------------------------------------------------------- checks


def _drawn(fig: plt.Figure) -> plt.Figure:
    """``fig`` drawn at the PNG's resolution: once for all the checks, again only after a
    change (matplotlib marks a changed figure stale; a draw is most of a check's time)."""
    if fig.dpi != DPI or fig.stale:
        fig.set_dpi(DPI)
        fig.canvas.draw()
    return fig


def _shown(labels) -> list:
    return [t for t in labels if t.get_visible() and t.get_text().strip()]


def _tick_labels(ax: plt.Axes, axis: str) -> list:
    """The tick labels a reader sees: visible, non-empty, at a tick inside the view."""
    low, high = sorted(getattr(ax, f"get_{axis}lim")())
    along = 0 if axis == "x" else 1
    inside = [t for t in getattr(ax, f"get_{axis}ticklabels")()
              if low - 1e-9 <= t.get_position()[along] <= high + 1e-9]  # fmt: skip
    return _shown(inside)


def overlapping_tick_labels(fig: plt.Figure) -> list[str]:
    """Every pair of tick labels of one axis whose drawn boxes overlap (any two, not only
    neighbours), as ``"panel x: 'a' / 'b'"``."""
    renderer = _drawn(fig).canvas.get_renderer()
    found = []
    for ax, axis in itertools.product(fig.axes, "xy"):
        if not ax.get_visible():
            continue
        boxes = [(t.get_text(), t.get_window_extent(renderer).padded(GAP_PX / 2))
                 for t in _tick_labels(ax, axis)]  # fmt: skip
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
            if box_a.overlaps(box_b):
                found.append(f"{ax.get_title() or ax.get_label()} {axis}: {a!r} / {b!r}")
    return found


def overlapping_titles(fig: plt.Figure) -> list[str]:
    """Panel titles (and the figure's title) that run into each other."""
    renderer = _drawn(fig).canvas.get_renderer()
    texts = [ax.title for ax in fig.axes if ax.get_visible()]
    texts += [fig._suptitle] if fig._suptitle is not None else []
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _shown(texts)]
    return [f"{a!r} / {b!r}" for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
            if box_a.overlaps(box_b)]  # fmt: skip


def labels_into_titles(fig: plt.Figure) -> list[str]:
    """A panel's axis label or tick labels that run into another panel's title."""
    renderer = _drawn(fig).canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    found = []
    for ax in panels:
        texts = [ax.xaxis.label, *ax.get_xticklabels()]
        boxes = [t.get_window_extent(renderer) for t in _shown(texts)]
        for other in panels:
            if other is ax or not other.title.get_text():
                continue
            title = other.title.get_window_extent(renderer)
            if any(box.overlaps(title) for box in boxes):
                found.append(f"{ax.get_xlabel()!r} over {other.get_title()!r}")
    return found


def colour_bars_over_titles(fig: plt.Figure) -> list[str]:
    """A colour bar that runs into a title (a panel's or the figure's): the similarity
    heatmap's bar covered the end of "... (boxes = clusters)"."""
    renderer = _drawn(fig).canvas.get_renderer()
    bars = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() == "<colorbar>"]
    texts = [ax.title for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    texts += [fig._suptitle] if fig._suptitle is not None else []
    return [
        f"colour bar over {t.get_text()!r}"
        for bar, t in itertools.product(bars, _shown(texts))
        if bar.get_tightbbox(renderer).overlaps(t.get_window_extent(renderer))
    ]


def data_panels(fig: plt.Figure) -> list[plt.Axes]:
    """Visible panels with data: not colour bars, legend cells or blank grid cells."""
    return [ax for ax in fig.axes if ax.get_visible() and ax.axison
            and ax.get_label() != "<colorbar>" and (ax.has_data() or ax.images)]  # fmt: skip


def _is_heatmap(ax: plt.Axes) -> bool:
    """Whether the panel's first collection is a seaborn heatmap's mesh (a 2-D array)."""
    array = ax.collections[0].get_array() if ax.collections else None
    return array is not None and array.ndim == 2


def narrow_panels(fig: plt.Figure) -> list[str]:
    _drawn(fig)
    found = []
    for ax in data_panels(fig):
        image = bool(ax.images) or _is_heatmap(ax)
        width = ax.get_window_extent().width
        if width < (MIN_IMAGE_PX if image else MIN_PANEL_PX):
            found.append(f"{ax.get_title()!r}: {width:.0f} px")
    return found


def legends_over_labels(fig: plt.Figure) -> list[str]:
    """Panels' data areas and texts written in a panel (point labels, notes) that a legend
    box covers."""
    renderer = _drawn(fig).canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    legends += list(fig.legends)
    found = []
    for legend, ax in itertools.product(legends, fig.axes):
        box = legend.get_window_extent(renderer)
        if ax in data_panels(fig) and box.overlaps(ax.get_window_extent(renderer)):
            found.append(f"legend over the panel {ax.get_title()!r}")
        for text in _shown(ax.texts):
            if box.overlaps(text.get_window_extent(renderer)):
                found.append(f"legend over {text.get_text()!r}")
    return found


def titles(fig: plt.Figure) -> str:
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return " ".join([suptitle, *(ax.get_title() for ax in fig.axes)])


# ----------------------------------------------------------------------------- tests


def test_every_figure_kind_is_listed():
    """A figure function added to mhainterp.figures must be added to FIGURES too."""
    import importlib
    import pkgutil

    import mhainterp.figures

    kinds = set()
    for info in pkgutil.iter_modules(mhainterp.figures.__path__):
        module = importlib.import_module(f"mhainterp.figures.{info.name}")
        for name in getattr(module, "__all__", []):
            function = getattr(module, name)
            draws = name.endswith("_figure") or name.startswith("plot_") or name in {
                "division_heatmap", "division_vs_heads", "role_heatmap",
                "specialization_vs_heads"}  # fmt: skip
            helper = name in {"new_figure", "save_figure", "save_ablation_figure"}
            if inspect.isfunction(function) and draws and not helper:
                kinds.add(name)
    listed = {"importance_figure", "pairwise_figure", "prune_curve_figure",
              "gradient_vs_ablation_figure", "division_heatmap", "division_vs_heads",
              "plot_head_count_accuracy", "plot_training_curves", "plot_average_patterns",
              "plot_example_patterns", "plot_similarity_heatmap", "plot_head_map",
              "role_heatmap", "causal_matrix_figure", "specialization_vs_heads",
              "consistency_figure", "plot_roles_vs_null", "plot_attribution_vs_exact",
              "plot_zero_vs_mean", "plot_does_h_matter"}  # fmt: skip
    assert kinds == listed


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_reads_at_its_saved_size(name, tmp_path):
    fig = FIGURES[name]()
    problems = {
        "overlapping tick labels": overlapping_tick_labels(fig),
        "overlapping titles": overlapping_titles(fig),
        "labels into titles": labels_into_titles(fig),
        f"panels under {MIN_PANEL_PX} px": narrow_panels(fig),
        "legends over labels": legends_over_labels(fig),
        "colour bars over titles": colour_bars_over_titles(fig),
    }
    if name in SWEEP_FIGURES and TASK not in titles(fig) and "multi_relation" not in titles(fig):
        problems["task not named"] = [titles(fig)]
    folder = Path(os.environ.get("MHAINTERP_FIGURE_DIR") or tmp_path)
    png = save_figure(fig, folder / f"{name}.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and png.with_suffix(".pdf").is_file()
    assert {k: v for k, v in problems.items() if v} == {}


def test_the_checks_catch_what_they_look_for():
    """The checks find a squeezed panel, two colliding tick labels and a legend over a label."""
    fig, ax = _common.new_figure(1.5, 3.0)
    ax.plot([0, 1], [0, 1], label="line")
    ax.set_xticks([0, 0.01], ["a long tick label", "another long one"])
    ax.annotate("L0H6", (0.0, 0.95), xycoords="axes fraction")
    ax.legend(loc="upper left")
    (overlap,) = overlapping_tick_labels(fig)
    assert overlap.endswith("x: 'a long tick label' / 'another long one'")
    assert len(narrow_panels(fig)) == 1
    assert legends_over_labels(fig) == ["legend over the panel ''", "legend over 'L0H6'"]
    plt.close(fig)


def _same_picture(png: Path, reference: Path) -> None:
    """Two PNGs of one figure: sizes within a pixel, pixels alike (a sub-pixel shift)."""
    from PIL import Image

    a, b = (np.asarray(Image.open(p).convert("L"), dtype=float) for p in (png, reference))
    assert all(abs(x - y) <= 1 for x, y in zip(a.shape, b.shape, strict=True)), (a.shape, b.shape)
    rows, columns = min(a.shape[0], b.shape[0]), min(a.shape[1], b.shape[1])
    assert np.abs(a[:rows, :columns] - b[:rows, :columns]).mean() < 3.0


def test_a_heatmap_saved_as_png_and_pdf_is_drawn_twice(tmp_path, monkeypatch):
    """Drawing a figure is most of the demo's report time: ``heatmap`` renders nothing (seaborn
    renders the whole figure per call), and ``save_figure`` lays the figure out and renders
    the PNG in one draw, the PDF in a second (``bbox_inches="tight"`` drew each format twice,
    with the layout each time). The PNG is matplotlib's own tight PNG, to a pixel."""
    draws = []
    real_draw = plt.Figure.draw
    monkeypatch.setattr(plt.Figure, "draw", lambda fig, r: draws.append(fig) or real_draw(fig, r))
    fig, ax = _common.new_figure(4.0, 3.0, layout="constrained")
    _common.heatmap(
        pd.DataFrame(np.eye(3), index=list("abc")), ax, annot=True, cbar_kws={"label": "x"}
    )
    assert draws == []
    reference = tmp_path / "reference.png"
    fig.savefig(reference, dpi=120, bbox_inches="tight")
    draws.clear()
    png = save_figure(fig, tmp_path / "heatmap.png")
    assert len(draws) == 2
    assert fig.get_layout_engine() is None  # laid out once, then frozen
    _same_picture(png, reference)


def test_a_legend_drawn_past_the_figure_edge_is_in_the_png(tmp_path):
    """The one render is clipped at the figure's edge; a tight PNG reaches past it, so there
    ``save_figure`` draws the PNG as savefig does."""
    fig, ax = _common.new_figure(3.0, 2.0)
    ax.plot([0, 1], [0, 1], label="a line with a long name")
    ax.legend(loc="upper left", bbox_to_anchor=(1.4, 1.0))
    reference = tmp_path / "reference.png"
    fig.savefig(reference, dpi=120, bbox_inches="tight")
    png = save_figure(fig, tmp_path / "legend.png")
    _same_picture(png, reference)
    from PIL import Image

    def legend_ink(path: Path) -> int:  # dark pixels in the right part, where the legend is
        grey = np.asarray(Image.open(path).convert("L"))
        return int((grey[:, int(0.6 * grey.shape[1]) :] < 128).sum())

    assert legend_ink(png) > 0.9 * legend_ink(reference) > 0


def test_heatmap_restores_seaborns_render_hook_even_when_it_fails():
    """heatmap() swaps seaborn's private figure render for the length of one call: after a
    call, and after one that raises, seaborn's own is back."""
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn.matrix as seaborn_matrix

    from mhainterp.figures._common import heatmap, new_figure

    hook = seaborn_matrix._draw_figure
    fig, ax = new_figure()
    heatmap(pd.DataFrame([[0.0, 1.0]]), ax, annot=True)
    assert seaborn_matrix._draw_figure is hook
    assert [t.get_text() for t in ax.texts] == ["0", "1"]
    with pytest.raises(ValueError):
        heatmap(pd.DataFrame([["a", "b"]]), ax)
    assert seaborn_matrix._draw_figure is hook
    plt.close(fig)


def test_head_map_point_labels_stay_inside_clear_of_the_legend_and_of_each_other():
    """Written up-right always, labels near the right edge ran past the axes into the legend
    beside it (3 of these 12 random maps) and labels ran into each other (61 pairs in 40 maps).
    Each now takes the first of four spots around its point that is inside the axes and clear
    of the labels before it: only a crowded map (seed 3: three labels in one corner) keeps an
    overlap."""
    from mhainterp.figures import plot_head_map

    covered, outside, overlapping = {}, {}, 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        mds = pd.DataFrame(
            {"head_label": HEADS, "x": rng.normal(0, 0.2, 16), "y": rng.normal(0, 0.2, 16)}
        )
        fig = plot_head_map(mds, method="js")
        covered[seed] = legends_over_labels(fig)
        renderer = _drawn(fig).canvas.get_renderer()
        (ax,) = fig.axes
        area, boxes = (
            ax.get_window_extent(renderer),
            [t.get_window_extent(renderer) for t in ax.texts],
        )
        outside[seed] = [
            text.get_text()
            for text, b in zip(ax.texts, boxes, strict=True)
            if b.x0 < area.x0 or b.x1 > area.x1 or b.y0 < area.y0 or b.y1 > area.y1
        ]
        overlapping += sum(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[:i])
        plt.close(fig)
    assert {seed: found for seed, found in covered.items() if found} == {}
    assert {seed: found for seed, found in outside.items() if found} == {}
    assert overlapping <= 3
