"""``mhainterp explore``: the browser explorer of a run or sweep (click heads to ablate them).

    mhainterp explore runs/quickstart/reverse/runs/h4_seed0
    mhainterp explore runs/quickstart/reverse --port 8800 --no-browser

Serves a local page (127.0.0.1 unless --host says otherwise) and opens it in the browser.
"""

from __future__ import annotations

import argparse
import sys
import threading
import webbrowser

__all__ = ["register", "run_explore"]

DEFAULT_PORT = 8765
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")

EXPLORE_DESCRIPTION = """\
Open the explorer of a run (or of every run of a sweep, with a picker over h x seed) in the
browser: the head grid with each head's average pattern, its saved specialization label and its
importance; click a head to ablate it, again to restore it; switch the method (zero, mean,
resample); loss and accuracy against the clean model overall, per target, by target class and
by query token; one example sequence with its predictions, hover a token to see where each
head attends from it. Everything is served from this machine: no internet needed.

examples:
  mhainterp explore runs/quickstart/reverse/runs/h4_seed0
  mhainterp explore runs/quickstart/reverse --port 8800 --no-browser
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``explore`` command to the ``mhainterp`` parser."""
    parser = subparsers.add_parser(
        "explore",
        help="click heads to ablate them in a browser page (a run, or a sweep's runs)",
        description=EXPLORE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="RUN_OR_SWEEP", help="a run folder or a sweep folder")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    parser.add_argument(
        "--n-eval", type=int, default=1024, help="evaluation sequences (default 1024)"
    )
    parser.add_argument(
        "--method", default="zero", help="initial method: zero, mean or resample (default zero)"
    )
    parser.set_defaults(func=run_explore)


def run_explore(args: argparse.Namespace) -> int:
    """Handler of ``mhainterp explore``; returns the exit code."""
    try:
        import uvicorn

        from mhainterp.explore.app import Explorer
        from mhainterp.explore.runs import explorable_runs
        from mhainterp.explore.server import PortInUseError, bind, build_app
    except ImportError as error:
        return _fail(f'{error}; install the explorer with: pip install "mhainterp[explore]"')
    from mhainterp.ablation import check_method

    check_method(args.method)
    if args.n_eval < 1:
        raise ValueError(f"--n-eval={args.n_eval} is invalid: a positive integer")
    runs = explorable_runs(args.path)  # a folder that is neither: one line, exit 2
    if args.host not in LOCAL_HOSTS:
        print(
            f"mhainterp explore: warning: --host {args.host} lets anyone who can reach this "
            "machine on the network see and change this session",
            file=sys.stderr,
        )
    try:
        sock = bind(args.host, args.port)
    except PortInUseError as error:
        return _fail(str(error))
    try:
        explorer = Explorer(runs, n_eval=args.n_eval, method=args.method)
        explorer.open(runs[0].id)
        explorer.state()  # the clean forward, patterns and importance, before serving
        host = f"[{args.host}]" if ":" in args.host else args.host
        url = f"http://{host}:{sock.getsockname()[1]}/"
        server = uvicorn.Server(uvicorn.Config(build_app(explorer), log_level="warning"))
        print(f"mhainterp explore: {len(runs)} run(s) from {args.path} at {url}  (Ctrl-C stops)")
        sys.stdout.flush()
        if not args.no_browser:
            threading.Timer(0.5, webbrowser.open, args=(url,)).start()
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        print("mhainterp explore: stopped", file=sys.stderr)
        return 130
    finally:
        sock.close()
    return 0


def _fail(message: str) -> int:
    print(f"mhainterp explore: error: {message}", file=sys.stderr)
    return 2
