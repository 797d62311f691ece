"""The explorer page on a pretrained model in a real browser: a tiny random Llama folder (built
from a ``transformers`` config, no download) on eight sentences. The sentence row shows the
tokenizer's strings coloured by Δ log-prob, the head numbers say they are attribution
estimates, a click changes each token's Δ exactly as the session computes, and a large
model's attention arrives one query at a time. Skipped without chromium (as
tests/test_explore_browser.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_explore_browser import browser_on, pytestmark, wait  # noqa: F401
from test_real_heads import SENTENCES, tiny_llama_folder

from mhainterp.explore import Explorer
from mhainterp.explore import session as session_module
from mhainterp.pretrained import load_pretrained
from mhainterp.tasks.text import text_batch


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    pytest.importorskip("selenium")
    pytest.importorskip("uvicorn")
    model = load_pretrained(tiny_llama_folder(tmp_path_factory.mktemp("llama")))
    explorer = Explorer.from_model(model, text_batch(model, SENTENCES), name="tiny-llama")
    with browser_on(explorer) as (driver, _):
        yield driver, explorer


def _deltas(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('.mhx-text-token')].map(e => e.dataset.delta)"
    )


def test_a_click_recolours_the_sentence_by_the_sessions_delta_log_prob(page):
    driver, explorer = page
    wait(driver, lambda d: d.execute_script("return !!document.querySelector('[data-text-row]')"))
    words = driver.execute_script(
        "return [...document.querySelectorAll('.mhx-text-token')].map(e => e.textContent)"
    )
    ids = explorer.session.batch.tokens[0][explorer.session.batch.padding_mask[0]].tolist()
    assert words == [f"w{i}" for i in ids]
    assert set(_deltas(driver)[1:]) == {"0"}  # clean: every token's change is 0
    label = driver.execute_script(
        "return document.querySelector('[data-importance=\"L1H2\"]').textContent"
    )
    estimate = explorer.session.importance("zero")["L1H2"]
    # the estimate until the page's check has ablated L1H2 exactly, then the exact value
    exact = explorer.session.evaluate(["L1H2"], method="zero")["delta_loss"]
    assert label in {f"Δloss≈ (zero) {_signed(estimate)}", f"Δloss {_signed(exact)} exact"}
    assert "next-token cross-entropy" in driver.execute_script(
        "return document.querySelector('.mhx-metrics').textContent"
    )
    driver.execute_script("document.querySelector('[data-head=\"L1H2\"]').click()")
    wait(driver, lambda d: set(_deltas(d)[1:]) != {"0"})
    wait(driver, lambda d: d.execute_script("return !document.querySelector('.mhx[data-busy]')"))
    expected = explorer.session.example(0)["text"]["delta_logprob"]
    shown = _deltas(driver)
    n_real = len(ids)
    assert [float(x) for x in shown[1:]] == [float(d) for d in expected[: n_real - 1]]
    driver.execute_script("document.querySelector('[data-head=\"L1H2\"]').click()")
    wait(driver, lambda d: set(_deltas(d)[1:]) == {"0"})


def _signed(x: float, digits: int = 3) -> str:
    return f"{'+' if x > 0 else ''}{x:.{digits}f}"


def test_the_page_checks_the_estimates_and_says_how_far_they_agree_with_exact(page):
    """While idle the page asks for exact ablations of the verification plan, two heads at a
    time, until all 8 heads are checked; each head then shows its exact value, and the line
    under the grid the agreement (the session's numbers)."""
    driver, explorer = page
    driver.get(driver.current_url)
    wait(driver, lambda d: d.execute_script(
        "const e = document.querySelector('[data-estimate]'); return e && e.dataset.checked === '8'"
    ), timeout=60)  # fmt: skip
    check = explorer.session.estimate_check("zero")
    assert check["done"] and check["n_checked"] == 8
    line = driver.execute_script("return document.querySelector('[data-estimate]').textContent")
    assert line == (
        "Δloss≈ is a first-order attribution estimate (one backward at load), not an ablation. "
        f"Agreement with exact ablation (zero) on 8 heads: Spearman {check['spearman']:.2f}, "
        f"largest error {check['max_abs_error']:.3f}"
    )
    label = driver.execute_script(
        "return document.querySelector('[data-importance=\"L0H3\"]').textContent"
    )
    assert label == f"Δloss {_signed(check['exact']['L0H3'])} exact"


def test_attention_of_a_large_model_arrives_for_the_hovered_token(page, monkeypatch):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver, explorer = page
    monkeypatch.setattr(session_module, "INLINE_ATTENTION_HEADS", 4)  # 8 heads: "large"
    driver.get(driver.current_url)  # reload: the state now carries no patterns
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '.mhx-text-token[data-pos="2"]'))
    token = driver.find_element(By.CSS_SELECTOR, '.mhx-text-token[data-pos="2"]')
    ActionChains(driver).move_to_element(token).click().perform()  # hover and lock
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "[data-attn]")) == 8)
    title = driver.execute_script(
        "return document.querySelector('[data-attn=\"L0H1\"] .mhx-attn-cell').title"
    )
    weight = explorer.session.attention(0, 2)["L0H1"][0]
    assert title == f"L0H1: {weight:.3f} on position 0"


def _loss(driver) -> dict:
    return driver.execute_script(
        "const e = document.querySelector('[data-metric=\"loss\"]');"
        "return e && {kind: e.dataset.kind, value: e.dataset.value, text: e.textContent,"
        " pending: document.querySelector('.mhx').dataset.pending || null}"
    )


def test_a_click_shows_its_estimate_at_once_then_the_exact_value(page, monkeypatch):
    """The exact work is held at its start (a deliberately slow exact path): the page shows
    the click's attribution estimate meanwhile, marked as one, and the exact value once the
    forward is let through."""
    import threading

    from mhainterp.ablation import interactive

    driver, explorer = page
    driver.get(driver.current_url)
    checked = "const e = document.querySelector('[data-estimate]'); return e && e.dataset.checked"
    wait(driver, lambda d: d.execute_script(checked) == "8", timeout=60)  # no verify left to run
    driver.execute_script("document.querySelector('[data-head=\"L0H0\"]').click()")
    wait(driver, lambda d: (_loss(d) or {}).get("kind") == "exact" and not _loss(d)["pending"])
    original, gate, held = interactive.run_masks, threading.Event(), threading.Event()

    def slow(*args, **kwargs):
        held.set()
        assert gate.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(interactive, "run_masks", slow)
    driver.execute_script("document.querySelector('[data-head=\"L1H1\"]').click()")
    wait(driver, lambda d: (_loss(d) or {}).get("kind") == "estimate")
    assert held.wait(30)  # the exact work has begun, and waits: the estimate came first
    estimate = explorer.session.importance("zero")
    shown = _loss(driver)
    expected = float(shown["value"])
    assert shown["text"] == f"≈ {expected:.4f}" and shown["pending"] is not None
    note = driver.execute_script(
        "return document.querySelector('[data-estimate-note]').textContent"
    )
    assert note.startswith("≈ attribution estimate of this click")
    gate.set()
    wait(driver, lambda d: (_loss(d) or {}).get("kind") == "exact" and not _loss(d)["pending"])
    exact = explorer.session.metrics()["overall"]["loss"]
    assert float(_loss(driver)["value"]) == pytest.approx(exact["ablated"], abs=1e-9)
    assert expected == pytest.approx(exact["clean"] + estimate["L0H0"] + estimate["L1H1"])
    for label in ("L1H1", "L0H0"):  # restore, for the other tests
        driver.execute_script(f"document.querySelector('[data-head=\"{label}\"]').click()")
        restored = (
            f"return !document.querySelector('[data-head=\"{label}\"]').classList"
            ".contains('ablated') && !document.querySelector('.mhx').dataset.pending"
        )
        wait(driver, lambda d, restored=restored: d.execute_script(restored))
