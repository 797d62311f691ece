"""The explorer page in a real browser (Debian's chromium + chromedriver, driven by Selenium).

A hand-built model whose answers are known: two identical previous-token heads (L0H0, L0H2),
each enough alone, and a uniform head. Clicking one copying head changes nothing (the other backs
it up); clicking both gives the accuracy of a model whose copying heads are dead; clicking them
again restores the clean accuracy. The screenshot it takes goes to pytest's tmp folder only
(``MHAINTERP_SCREENSHOT=path`` saves a copy there, e.g. to refresh the README's figure).

Skipped where chromium or chromedriver is not installed; .ci/run installs both.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from mhainterp.ablation import Ablator
from mhainterp.config import TrainConfig
from mhainterp.explore import Explorer
from mhainterp.model.handbuilt import handbuilt_model
from mhainterp.specialization import SpecializationSettings, cached_specialization
from mhainterp.tasks import get_task
from mhainterp.training import evaluate, save_run

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
N_EVAL = 1024

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
        "chromium-driver)",
    ),
]

# Root in a container: no sandbox; no GPU; nothing that phones home; a fresh profile. Every
# host name but 127.0.0.1 resolves to nothing, so a CDN asset could not load.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,860",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


@pytest.fixture(scope="module")
def task():
    return get_task("previous_token", seq_len=16, d_vocab=10)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, task):
    """A run folder of the hand-built model, with its saved specialization labels."""
    model = handbuilt_model(["previous", "uniform", "previous"])
    path = tmp_path_factory.mktemp("explore") / "h3_seed0"
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    eval_metrics = {**evaluate(model, task), "status": "finished"}
    save_run(model, task, path, TrainConfig(), metrics, eval_metrics)
    cached_specialization(path, SpecializationSettings())  # what `mhainterp specialize` saves
    # A division-of-labour table in the shape DESIGN.md gives (the explorer only reads it).
    division = pd.DataFrame(
        {
            "head_label": ["L0H0", "L0H0"],
            "by": ["token", "position"],
            "selectivity": [0.12, 0.34],
            "null_mean": [0.1, 0.1],
            "p_adj": [0.5, 0.01],
            "helped_share": [0.25, 0.0],
            "specialized": [False, True],
            "serves": [None, "position 3"],
        }
    )
    division.to_csv(path / "analysis" / "division_heads.csv", index=False)
    return path


@contextlib.contextmanager
def browser_on(explorer: Explorer) -> Iterator[tuple[Any, Any]]:
    """Serve ``explorer`` on a free local port and open its page in headless chromium:
    ``(driver, server)`` (tests/test_explore_browser_real.py uses it too)."""
    pytest.importorskip("selenium")
    pytest.importorskip("uvicorn")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from mhainterp.explore.server import ServerThread, build_app

    profile = tempfile.mkdtemp(prefix="mhx-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    with ServerThread(build_app(explorer)) as server:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            driver.get(server.url)
            yield driver, server
        finally:
            driver.quit()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def page(run_dir):
    pytest.importorskip("selenium")
    pytest.importorskip("uvicorn")
    with browser_on(Explorer.from_path(run_dir, n_eval=N_EVAL)) as (driver, server):
        yield driver, server


def wait(driver, condition, timeout=30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: condition(d))


def _text(driver, selector: str) -> str | None:
    """The element's text, read in one step (the page re-renders parts after each answer)."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null", selector
    )


def _accuracy(driver) -> tuple[float, str]:
    value = driver.execute_script(
        "return document.querySelector('[data-metric=\"accuracy\"]').dataset.value"
    )
    return float(value), _text(driver, '[data-metric="accuracy"]')


def _click_head(driver, label: str, ablated: bool) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f'[data-head="{label}"]').click()
    # The head's class changes in the same render as the metrics and the example.
    wait(
        driver,
        lambda d: (
            (
                "ablated"
                in d.find_element(By.CSS_SELECTOR, f'[data-head="{label}"]').get_attribute("class")
            )
            == ablated
            and d.execute_script("return !document.querySelector('.mhx[data-busy]')")
        ),
    )


def test_clicking_heads_changes_accuracy_predictions_and_returns(page, task, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver, _ = page
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-metric="accuracy"]'))
    heads = [
        e.get_attribute("data-head") for e in driver.find_elements(By.CSS_SELECTOR, ".mhx-head")
    ]
    assert heads == ["L0H0", "L0H1", "L0H2"]
    roles = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".mhx-head-label")]
    assert roles == ["backed up", "unspecialized", "backed up"]  # the saved specialization
    findings = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".mhx-head-finding")]
    assert findings[0].startswith("looks at previous;") and findings[0].endswith("backed up")
    assert findings[1].startswith("looks at no known relation;")  # every axis, not the role
    assert _accuracy(driver) == (1.0, "1.0000")

    _click_head(driver, "L0H0", ablated=True)
    assert _accuracy(driver) == (1.0, "1.0000")  # L0H2 backs it up
    # Hovering a head shows the saved division-of-labour rows for it.
    ActionChains(driver).move_to_element(
        driver.find_element(By.CSS_SELECTOR, '[data-head="L0H0"]')
    ).perform()
    wait(driver, lambda d: _text(d, ".mhx-detail table"))
    rows = driver.execute_script(
        "return [...document.querySelectorAll('.mhx-detail tr')]"
        ".map(tr => [...tr.cells].map(c => c.textContent))"
    )
    assert rows == [
        ["by", "selectivity", "null", "p adj", "helped", "serves"],
        ["token", "0.120", "0.100", "0.500", "0.250", ""],
        ["position", "0.340", "0.100", "0.010", "0.000", "position 3"],
    ]

    _click_head(driver, "L0H2", ablated=True)
    dead = evaluate(handbuilt_model(["dead", "uniform", "dead"]), task, n_eval=N_EVAL)
    value, text = _accuracy(driver)
    assert value == pytest.approx(dead["accuracy"], abs=1e-12)
    assert text == f"{dead['accuracy']:.4f}"

    # The example (sequence 0) marks each prediction as the dead-head model makes it.
    batch = task.eval_batch(N_EVAL)[0]
    wrong = handbuilt_model(["dead", "uniform", "dead"]).logits(batch.tokens).argmax(-1)
    wrong = int((wrong != batch.targets).sum())
    shown = driver.find_elements(By.CSS_SELECTOR, '.mhx-pred[data-correct="0"]')
    assert len(shown) == wrong > 0

    # Hover position 5: the previous-token head attends to position 4 from it.
    token = driver.find_element(By.CSS_SELECTOR, '.mhx-token[data-pos="5"]')
    ActionChains(driver).move_to_element(token).perform()
    cells = wait(
        driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-attn="L0H0"] .mhx-attn-cell')
    )
    assert len(cells) == 16
    assert cells[4].get_attribute("title") == "L0H0: 1.000 on position 4"
    token.click()  # lock it, so the screenshot shows the attention
    ActionChains(driver).move_to_element(  # and L0H0's saved division-of-labour rows
        driver.find_element(By.CSS_SELECTOR, '[data-head="L0H0"]')
    ).perform()
    wait(driver, lambda d: "position 3" in (_text(d, ".mhx-detail") or ""))
    screenshot = Path(os.environ.get("MHAINTERP_SCREENSHOT") or tmp_path / "explorer.png")
    assert driver.save_screenshot(str(screenshot))

    # Mean ablation of the same two heads: the batched engine's number.
    driver.find_element(By.CSS_SELECTOR, '[data-method="mean"]').click()
    wait(driver, lambda d: "on" in d.find_element(By.CSS_SELECTOR, '[data-method="mean"]')
          .get_attribute("class"))  # fmt: skip
    ablator = Ablator(handbuilt_model(["previous", "uniform", "previous"]), task, method="mean")
    expected = ablator.set(["L0H0", "L0H2"]).evaluate()["accuracy"]
    assert _accuracy(driver)[0] == pytest.approx(expected, abs=1e-9)
    assert expected != pytest.approx(dead["accuracy"])

    _click_head(driver, "L0H0", ablated=False)
    _click_head(driver, "L0H2", ablated=False)
    assert _accuracy(driver) == (1.0, "1.0000")
    assert not driver.find_elements(By.CSS_SELECTOR, ".mhx-head.ablated")


def test_draw_another_sequence_and_reset(page):
    from selenium.webdriver.common.by import By

    driver, _ = page
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-action="draw"]'))
    driver.find_element(By.CSS_SELECTOR, '[data-action="draw"]').click()
    expected = int(torch.randint(N_EVAL, (1,), generator=torch.Generator().manual_seed(0)))
    wait(driver, lambda d: f"#{expected} " in (_text(d, ".mhx-example h3") or ""))
    _click_head(driver, "L0H1", ablated=True)
    driver.find_element(By.CSS_SELECTOR, '[data-action="reset"]').click()
    wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, ".mhx-head.ablated"))


def test_everything_loads_from_the_local_server(page):
    driver, server = page
    origin = server.url.rstrip("/")
    urls = driver.execute_script("return performance.getEntriesByType('resource').map(r => r.name)")
    assert urls and all(url.startswith(origin) for url in urls)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


# A stand-in for anywidget's model: messages go to the same endpoints the widget's Python side
# answers (Explorer.handle), replies come back as "msg:custom" events {id, status, body}.
MOUNT_AS_WIDGET = """
const done = arguments[arguments.length - 1];
const module = await import("./assets/explorer.js");
const handlers = [];
const model = {
  on(event, handler) { if (event === "msg:custom") handlers.push(handler); },
  off(event, handler) { handlers.splice(handlers.indexOf(handler), 1); },
  send(msg) {
    fetch(`api/${msg.action}`, { method: "POST", body: JSON.stringify(msg.body) })
      .then(async (r) => {
        const body = await r.json();
        handlers.forEach((h) => h({ id: msg.id, status: r.status, body }));
      });
  },
};
document.body.replaceChildren();
const el = document.createElement("div");
el.id = "widget";
document.body.append(el);
module.default.render({ model, el });
done(true);
"""


def test_the_notebook_module_renders_and_clicks_through_widget_messages(page):
    from selenium.webdriver.common.by import By

    driver, server = page
    driver.get(server.url)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-metric="accuracy"]'))
    assert driver.execute_async_script(MOUNT_AS_WIDGET)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '#widget [data-head="L0H2"]'))
    assert driver.find_elements(By.CSS_SELECTOR, "#app") == []  # only the widget is on show
    _click_head(driver, "L0H0", ablated=True)
    _click_head(driver, "L0H2", ablated=True)
    value, _ = _accuracy(driver)
    assert value < 0.5
    driver.find_element(By.CSS_SELECTOR, '#widget [data-action="reset"]').click()
    wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, ".mhx-head.ablated"))
    assert _accuracy(driver) == (1.0, "1.0000")


def test_sweep_picker_switches_runs(tmp_path, task, page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from mhainterp.explore.server import ServerThread, build_app
    from mhainterp.io import write_json

    driver, _ = page
    sweep = tmp_path / "sweep"
    write_json(sweep / "sweep.json", {"task": task.name})
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    for name, kinds in [("h1_seed0", ["previous"]), ("h3_seed0", ["previous", "uniform", "dead"])]:
        model = handbuilt_model(kinds, d_head=48 if len(kinds) == 1 else 16)
        eval_metrics = {**evaluate(model, task, n_eval=256), "status": "finished"}
        save_run(model, task, sweep / "runs" / name, TrainConfig(), metrics, eval_metrics)
    with ServerThread(build_app(Explorer.from_path(sweep, n_eval=256))) as server:
        driver.get(server.url)
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-control="run"]'))
        picker = Select(driver.find_element(By.CSS_SELECTOR, '[data-control="run"]'))
        assert [o.text for o in picker.options] == ["h1_seed0", "h3_seed0"]
        assert picker.first_selected_option.text == "h3_seed0"  # the largest head count
        assert "pick another run" in _text(driver, '[data-hint="run"]')
        assert len(driver.find_elements(By.CSS_SELECTOR, "[data-head]")) == 3
        _click_head(driver, "L0H0", ablated=True)  # the only copying head of this run
        assert _accuracy(driver)[0] < 0.5
        Select(driver.find_element(By.CSS_SELECTOR, '[data-control="run"]')).select_by_visible_text(
            "h1_seed0"
        )
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "[data-head]")) == 1)


def _signed(x: float, digits: int) -> str:
    """The page's signed(): a "+" before positive numbers only."""
    return ("+" if x > 0 else "") + f"{x:.{digits}f}"


def _js(driver, script, *args):
    return driver.execute_script(script, *args)


def test_thumbnails_have_axes_a_colour_scale_and_a_hatched_causal_mask(page):
    from selenium.webdriver.common.by import By

    driver, _ = page
    driver.get(page[1].url)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-metric="accuracy"]'))
    for label in ["L0H0", "L0H1", "L0H2"]:
        cell = f'[data-head="{label}"]'
        assert _text(driver, f"{cell} .mhx-axis-q") == "query ↓"
        assert _text(driver, f"{cell} .mhx-axis-k") == "key →"
    weights = _js(driver, "return [...document.querySelectorAll('.mhx-scale-cell')]"
                          ".map(e => e.dataset.weight)")  # fmt: skip
    assert weights == ["0", "0.25", "0.5", "0.75", "1", "masked"]
    # L0H0 (previous token), 64 px for 16 positions: 4 px a cell. (q=5, k=0) has weight 0,
    # (q=0, k=5) is after the query (masked): white against hatched grey.
    pixels = _js(
        driver,
        "const c = document.querySelector('[data-head=\"L0H0\"] canvas').getContext('2d');"
        "return [[2 + 4 * 0, 2 + 4 * 5], [2 + 4 * 5, 2 + 4 * 0], [2 + 4 * 4, 2 + 4 * 5]]"
        ".map(([x, y]) => [...c.getImageData(x, y, 1, 1).data])",
    )
    zero, masked, previous = pixels
    assert zero == [255, 255, 255, 255]
    assert masked != zero and masked[0] == masked[1] == masked[2]  # grey: hatched, not blue
    assert previous[2] > previous[0]  # weight 1 on the previous token: blue


def test_importance_says_alone_follows_the_method_and_the_detail_refreshes(page, task):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from mhainterp.explore import ExploreSession

    driver, server = page
    driver.get(server.url)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-metric="accuracy"]'))
    driver.execute_script("document.querySelector('[data-method=\"zero\"]').click()")
    wait(driver, lambda d: "(zero)" in (_text(d, '[data-importance="L0H1"]') or ""))
    session = ExploreSession(handbuilt_model(["previous", "uniform", "previous"]), task)
    expected = {m: session.importance(m)["L0H1"] for m in ("zero", "mean")}
    assert (
        _text(driver, '[data-importance="L0H1"]')
        == f"Δacc alone (zero) {_signed(expected['zero'], 2)}"
    )
    ActionChains(driver).move_to_element(
        driver.find_element(By.CSS_SELECTOR, '[data-head="L0H1"]')
    ).perform()
    wait(driver, lambda d: "(zero)" in (_text(d, '[data-detail="L0H1"]') or ""))
    assert "alone is ablated (zero)" in _text(driver, '[data-detail="L0H1"]')
    driver.execute_script("document.querySelector('[data-method=\"mean\"]').click()")
    wait(driver, lambda d: "(mean)" in (_text(d, '[data-detail="L0H1"]') or ""))
    detail = _text(driver, '[data-detail="L0H1"]')
    assert f"alone is ablated (mean): {_signed(expected['mean'], 3)}" in detail
    assert (
        _text(driver, '[data-importance="L0H1"]')
        == f"Δacc alone (mean) {_signed(expected['mean'], 2)}"
    )
    driver.execute_script("document.querySelector('[data-method=\"zero\"]').click()")
    wait(driver, lambda d: "(zero)" in (_text(d, '[data-detail="L0H1"]') or ""))


def test_attention_view_numbers_positions_greys_ablated_rows_and_hatches_the_mask(page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver, server = page
    driver.get(server.url)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-metric="accuracy"]'))
    numbers = _js(driver, "return [...document.querySelectorAll('.mhx-token .mhx-posnum')]"
                          ".map(e => e.textContent)")  # fmt: skip
    assert numbers == [str(t) for t in range(16)]
    _click_head(driver, "L0H0", ablated=True)
    token = driver.find_element(By.CSS_SELECTOR, '.mhx-token[data-pos="5"]')
    ActionChains(driver).move_to_element(token).perform()
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-attn="L0H0"]'))
    rows = _js(driver, "return Object.fromEntries([...document.querySelectorAll('[data-attn]')]"
                       ".map(r => [r.dataset.attn, r.classList.contains('ablated')]))")  # fmt: skip
    assert rows == {"L0H0": True, "L0H1": False, "L0H2": False}
    opacity = _js(driver, "return getComputedStyle(document.querySelector("
                          "'[data-attn=\"L0H0\"]')).opacity")  # fmt: skip
    assert float(opacity) < 1
    masked = _js(driver, "return [...document.querySelectorAll('[data-attn=\"L0H1\"] "
                         ".mhx-attn-cell')].map(c => c.classList.contains('masked'))")  # fmt: skip
    assert masked == [k > 5 for k in range(16)]  # keys after the query: masked, not 0 weight
    header = _js(driver, "return [...document.querySelectorAll('[data-key-pos]')]"
                         ".map(e => e.textContent)")  # fmt: skip
    assert header == [str(k) for k in range(16)]
    _click_head(driver, "L0H0", ablated=False)


def test_long_findings_stay_in_their_cards_and_a_nan_says_not_measured(task, tmp_path):
    """A finding with long comma lists ("serves token: 0,1,2,5,6,7,8,9; ...") has no space to
    break at: on a 16-head grid it ran out of its head's card. A NaN in the saved importance
    is "not measured", never a number or a broken page."""
    from selenium.webdriver.common.by import By

    from mhainterp.training import build_model

    model = build_model(task, n_heads=16, d_model=64, seed=0)
    path = tmp_path / "h16_seed0"
    metrics = pd.DataFrame({"step": [1], "loss": [0.0], "lr": [0.0], "grad_norm": [0.0]})
    save_run(
        model, task, path, TrainConfig(), metrics, {**evaluate(model, task), "status": "finished"}
    )
    (path / "analysis").mkdir(exist_ok=True)
    long = ("looks at no known relation; serves token: 0,1,2,5,6,7,8,9; "
            "target_class: 1,2,3,4,5,6,7,8,9,10,11; needed")  # fmt: skip
    heads = model.head_labels
    pd.DataFrame({"head_label": heads, "label": "unspecialized", "finding": long}).to_csv(
        path / "analysis" / "specialization_heads.csv", index=False
    )
    pd.DataFrame({"head_label": heads, "method": "zero",
                  "delta_accuracy": [-0.25, float("nan"), *[0.0] * 14]}).to_csv(
        path / "analysis" / "ablation_importance.csv", index=False)  # fmt: skip
    with browser_on(Explorer.from_path(path, n_eval=256)) as (driver, _):
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-metric="accuracy"]'))
        outside = _js(driver, """
            return [...document.querySelectorAll('.mhx-head')].map(card => {
              const box = card.getBoundingClientRect();
              const finding = card.querySelector('.mhx-head-finding');
              const text = finding.getBoundingClientRect();
              const out = text.left < box.left || text.right > box.right;
              return out || finding.scrollWidth > finding.clientWidth;
            })""")  # fmt: skip
        assert outside == [False] * 16
        assert _text(driver, '[data-finding="L0H0"]') == long
        assert _text(driver, '[data-importance="L0H1"]') == "Δacc alone (zero) not measured"
        assert _text(driver, '[data-importance="L0H0"]') == "Δacc alone (zero) -0.25"


def test_the_page_says_loading_then_shows_the_explorer(page, task):
    import threading

    from selenium.webdriver.common.by import By

    from mhainterp.explore.server import ExplorerLoader, ServerThread, build_app

    driver, _ = page
    gate = threading.Event()

    def build():
        assert gate.wait(60)
        return Explorer.from_model(
            handbuilt_model(["previous", "dead"], d_head=24), task, n_eval=256
        )

    loader = ExplorerLoader(build, what="h2_seed0").start()
    with ServerThread(build_app(loader)) as server:
        driver.get(server.url)
        wait(driver, lambda d: "loading h2_seed0" in (_text(d, ".mhx-loading") or ""))
        assert _js(driver, "return document.querySelector('#app').dataset.loading") == "1"
        gate.set()
        wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-metric="accuracy"]'))
        assert len(driver.find_elements(By.CSS_SELECTOR, "[data-head]")) == 2
        hint = _text(driver, '[data-hint="run"]')
        assert hint == "another run: mhainterp explore RUN_OR_SWEEP_FOLDER"
