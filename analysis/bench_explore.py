"""Speed of the explorer: click latency, time until the page is usable, page weight.

    python analysis/bench_explore.py                     # an 8-head model, 1,024 sequences
    python analysis/bench_explore.py --run RUN --clicks 60 --out bench_explore.csv

Measures, on one 8-head model (a saved run, or by default a freshly built 8-head ``reverse``
model saved to a temporary run folder; the speed does not depend on the weights):

``session``  one click in the library: ``Explorer.handle("toggle")`` (forward, metrics, the
             example and its attention, the JSON), for each method, new head sets each time
``http``     the same click as an HTTP request to the server (``POST /api/toggle``)
``browser``  the click in a real browser (Debian's chromium, if installed): from the click to
             the new metrics being drawn, measured inside the page
``startup``  ``mhainterp explore RUN --no-browser`` until the server answers ``/api/state``,
             and until the page has drawn its head grid in chromium (page usable); next to
             it ``mhainterp --help``, the floor every command pays (Python, torch and
             TransformerLens imports), measured just before
``weight``   bytes the browser loads for the page (HTML, JS, CSS and the state JSON)

Each click toggles a head so that the set of ablated heads is new (no cache hit): it walks
through the heads in a fixed order that visits each subset once before any repeats. Timings
are medians and 90th percentiles; the machine's load moves them (see the README).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CLICK_IN_PAGE = """
const [label, done] = [arguments[0], arguments[arguments.length - 1]];
const old = document.querySelector('[data-metric="accuracy"]'); old.__old = true;
const t0 = performance.now();
document.querySelector(`[data-head="${label}"]`).click();
const poll = () => {
  const el = document.querySelector('[data-metric="accuracy"]');
  if (el && !el.__old && !document.querySelector('.mhx[data-busy]')) done(performance.now() - t0);
  else requestAnimationFrame(poll);
};
requestAnimationFrame(poll);
"""


def gray_code_heads(labels: list[str], n: int) -> list[str]:
    """Heads to toggle so that each click gives a head set not seen before (Gray code order)."""
    return [labels[((i + 1) & -(i + 1)).bit_length() - 1] for i in range(n)]


def summary(name: str, seconds: list[float]) -> dict[str, object]:
    ms = sorted(1000 * s for s in seconds)
    return {
        "measure": name,
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 1),
        "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 1),
    }


def make_run(folder: Path) -> Path:
    from mhainterp.config import TrainConfig
    from mhainterp.tasks import get_task
    from mhainterp.training import build_model, evaluate, save_run

    task = get_task("reverse")
    model = build_model(task, n_heads=8, seed=0)
    metrics = pd.DataFrame({"step": [0], "loss": [float("nan")]})
    run = folder / "h8_seed0"
    save_run(
        run, model, task, TrainConfig(), metrics, {**evaluate(model, task), "status": "finished"}
    )
    return run


def bench_session(run: Path, clicks: int) -> list[dict[str, object]]:
    from mhainterp.explore import Explorer

    rows = []
    for method in ("zero", "mean", "resample"):
        explorer = Explorer.from_path(run, method=method)
        json.dumps(explorer.state())
        explorer.handle("toggle", {"head": explorer.session.head_labels[0]})  # the replacement
        explorer.handle("reset")
        times = []
        for head in gray_code_heads(explorer.session.head_labels, clicks):
            start = time.perf_counter()
            json.dumps(explorer.handle("toggle", {"head": head}))
            times.append(time.perf_counter() - start)
        rows.append(summary(f"session click ({method})", times))
    return rows


def bench_http(run: Path, clicks: int) -> list[dict[str, object]]:
    from mhainterp.explore import Explorer
    from mhainterp.explore.server import ServerThread, build_app

    explorer = Explorer.from_path(run)
    explorer.state()
    with ServerThread(build_app(explorer)) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        times = []
        for head in gray_code_heads(explorer.session.head_labels, clicks):
            start = time.perf_counter()
            connection.request("POST", "/api/toggle", body=json.dumps({"head": head}))
            connection.getresponse().read()
            times.append(time.perf_counter() - start)
    return [summary("http click (zero)", times)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tempfile.mkdtemp(prefix='mhx-bench-')}",
             "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]  # fmt: skip
    for flag in flags:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def bench_cli_and_browser(run: Path, clicks: int, browser: bool) -> tuple[list, dict]:
    """Start the real command; time until it answers, then (browser) until the page is drawn,
    the page weight, and clicks in the page."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "mhainterp.cli", "--help"], capture_output=True, check=True
    )
    floor = time.perf_counter() - start
    rows = [
        {"measure": "startup floor: mhainterp --help", "n": 1, "median_ms": round(1000 * floor)}
    ]
    port = free_port()
    command = [sys.executable, "-m", "mhainterp.cli", "explore", str(run), "--no-browser"]
    command += ["--port", str(port)]
    driver = chromium() if browser else None  # started first: its own start-up is not ours
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    weight: dict[str, float] = {}
    try:
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                connection.request("GET", "/api/state")
                state = connection.getresponse().read()
                break
            except ConnectionError:
                if process.poll() is not None:
                    raise RuntimeError(process.stderr.read().decode()) from None
                time.sleep(0.02)
        answered = time.perf_counter() - start
        rows.append(
            {"measure": "startup: server answers", "n": 1, "median_ms": round(1000 * answered)}
        )
        weight["state_json_kb"] = round(len(state) / 1024, 1)
        if driver is None:
            return rows, weight
        driver.set_script_timeout(60)
        driver.get(f"http://127.0.0.1:{port}/")
        while not driver.execute_script("return !!document.querySelector('[data-metric]')"):
            time.sleep(0.01)
        usable = time.perf_counter() - start
        rows.append({"measure": "startup: page usable", "n": 1, "median_ms": round(1000 * usable)})
        entries = driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return [n.decodedBodySize, ...performance.getEntriesByType('resource')"
            ".map(r => r.decodedBodySize)]"
        )
        weight["page_kb"] = round(sum(entries) / 1024, 1)
        weight["requests"] = len(entries)
        labels = driver.execute_script(
            "return [...document.querySelectorAll('[data-head]')].map(e => e.dataset.head)"
        )
        times = [
            driver.execute_async_script(CLICK_IN_PAGE, head) / 1000
            for head in gray_code_heads(labels, clicks)
        ]
        rows.append(summary("browser click (zero)", times))
        return rows, weight
    finally:
        if driver is not None:
            driver.quit()
        process.terminate()
        process.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=None, help="a run folder (default: built)")
    parser.add_argument("--clicks", type=int, default=40, help="clicks per measure (default 40)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table as CSV")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    args = parser.parse_args(argv)
    browser = Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()
    with tempfile.TemporaryDirectory() as folder:
        run = args.run or make_run(Path(folder))
        rows = bench_session(run, args.clicks) + bench_http(run, args.clicks)
        more, weight = bench_cli_and_browser(run, args.clicks, browser)
    table = pd.DataFrame(rows + more)
    print(f"run: {args.run or 'built: reverse, 8 heads, 1 layer, d_model 64'}; 1,024 sequences")
    print(table.to_string(index=False))
    print("page weight:", json.dumps(weight))
    if not browser:
        print("(no chromium: browser click and page-usable times not measured)")
    if args.out:
        table.assign(**weight).to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
