"""``mhainterp explore``: the browser explorer of a run or sweep (click heads to ablate them).

    mhainterp explore runs/quickstart/reverse/runs/h4_seed0
    mhainterp explore runs/quickstart/reverse --port 8800 --no-browser
    mhainterp explore --model smollm2 --text stdlib --n-eval 16
    mhainterp explore --model smollm2 --verdict runs/smollm2

Serves a local page (127.0.0.1 unless --host says otherwise) and opens it in the browser. The
page is up at once and shows "loading" until the model has loaded; it opens on the largest head
count of the first task, and its picker (or a run folder as RUN_OR_SWEEP) shows the others.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import webbrowser
from pathlib import Path
from typing import Any

from mhainterp.cli.options import MAX_COUNT, Checked, add_choice, add_runtime_args
from mhainterp.cli.pretrained_options import TEXT_MAX_LEN
from mhainterp.cli.static import DEFAULT_N_EVAL, ablation_methods
from mhainterp.cli.task_modules import add_task_module_argument
from mhainterp.errors import PortInUseError
from mhainterp.explore import TEXT_N_EVAL
from mhainterp.explore.server import LOCAL_HOSTS
from mhainterp.runtime import terminate_as_interrupt
from mhainterp.validation import check_int, check_port, invalid

__all__ = ["register", "run_explore"]

DEFAULT_PORT = 8765
SHIPPED_MODELS = ("smollm2", "minilm")

EXPLORE_DESCRIPTION = """\
Open the explorer of a run (or of every run of a sweep, with a picker over h x seed) in the
browser: the head grid with each head's average pattern, its saved specialization label and its
importance; click a head to ablate it, again to restore it; switch the method (zero, mean,
resample); loss and accuracy against the clean model overall, per target, by target class and
by query token; one example sequence with its predictions, hover a token to see where each
head attends from it. Everything is served from this machine: no internet needed.

A sweep opens on its largest head count (of the first task); pick another run in the page,
or give its run folder. A run of your own task needs the module that registers it.

With --model, a pretrained model on real text instead (smollm2, minilm or a Hugging Face
folder; --text stdlib or a text file, one sentence per line): the metric is the next-token
cross-entropy (an encoder's: the damage to the sentence embedding, 1 - cos), the example
sentence shows each token coloured by the change in log-probability of it as the next token,
and each head's number is its attribution estimate (one forward + backward at load); a click
shows the estimate for the set at once, then its exact value. Each head's finding (where it
looks, whom it serves, whether it is needed) shows beside its card when a verdict was saved:
--verdict FOLDER, the folder `mhainterp specialize --model NAME --out FOLDER` wrote (default:
runs/NAME when it holds one).

examples:
  mhainterp explore runs/quickstart/reverse/runs/h4_seed0
  mhainterp explore runs/quickstart/reverse --port 8800 --no-browser
  mhainterp explore runs/my_sweep --task-module my_tasks.py
  mhainterp explore --model smollm2 --text stdlib --n-eval 16
  mhainterp explore --model smollm2 --verdict runs/smollm2
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``explore`` command to the ``mhainterp`` parser."""
    parser = subparsers.add_parser(
        "explore",
        help="click heads to ablate them in a browser page (a run, or a sweep's runs)",
        description=EXPLORE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "path", metavar="RUN_OR_SWEEP", nargs="?", help="a run folder or a sweep folder"
    )
    parser.add_argument(
        "--model", help="instead of a run: a pretrained model (smollm2, minilm or a folder)"
    )
    parser.add_argument(
        "--text",
        default="stdlib",
        help=f"with --model: 'stdlib' or a text file (one sentence per line, each cut to "
        f"{TEXT_MAX_LEN} tokens; default stdlib)",
    )
    parser.add_argument(
        "--verdict",
        metavar="FOLDER",
        help="with --model: the verdict `mhainterp specialize --model NAME --out FOLDER` saved, "
        "for each head's finding beside its card (default: runs/NAME when it holds one)",
    )
    parser.add_argument(
        "--port",
        type=int,
        action=Checked,
        check=check_port,
        default=DEFAULT_PORT,
        help=f"port, 0..65535 (0: any free one; default {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    parser.add_argument(
        "--n-eval",
        type=int,
        action=_GivenCount,
        check=_check_count,
        default=DEFAULT_N_EVAL,
        metavar="N",
        help=f"evaluation sequences (an integer >= 1, default {DEFAULT_N_EVAL}; with --model: "
        f"sentences, default {TEXT_N_EVAL})",
    )
    add_choice(parser, "--method", "initial ablation method", ablation_methods(), default="zero")
    add_task_module_argument(parser)
    add_runtime_args(parser)
    parser.set_defaults(func=run_explore)


class _GivenCount(Checked):
    """:class:`Checked` that also records that the option was typed (``n_eval_given``): with
    ``--model`` an untyped ``--n-eval`` means :data:`TEXT_N_EVAL` sentences, not the toolkit's
    one default (a click re-runs the model on all of them)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        super().__call__(parser, namespace, values, option_string)
        namespace.n_eval_given = True


def _check_count(name: str, value: int) -> int:
    return check_int(name, value, minimum=1, maximum=MAX_COUNT)


def run_explore(args: argparse.Namespace) -> int:
    """Handler of ``mhainterp explore``; returns the exit code.

    The server starts before the model loads (:class:`ExplorerLoader`): the page shows at once
    and says "loading" until the explorer is ready. A run that cannot be loaded ends the
    command with one line (exit 2), like any other bad input.
    """
    try:
        import uvicorn  # noqa: F401  (the explore extra: checked before anything starts)

        from mhainterp.explore.runs import default_run, explorable_runs
        from mhainterp.explore.server import ExplorerLoader, ServerThread, bind, build_app
    except ImportError as error:
        return _fail(f'{error}; install the explorer with: pip install "mhainterp[explore]"')
    if args.model is not None:
        build, what = _pretrained_builder(args)
        shown = f"{args.model} on {args.text}"
    elif args.path is None:
        raise invalid("RUN_OR_SWEEP", None, "a run or sweep folder, or --model NAME_OR_PATH")
    elif args.verdict is not None:  # a run's verdict is read from the run folder itself
        raise invalid("--verdict", args.verdict, "given with --model only (a run keeps its own)")
    else:
        runs = explorable_runs(args.path)  # a folder that is neither: one line, exit 2
        first = default_run(runs)
        build, what = (lambda: _build(runs, first.id, args)), first.id
        shown = f"{len(runs)} run(s) from {args.path}"
    _check_host(args.host)
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
    loader = ExplorerLoader(build, what=what)
    # SIGTERM (kill, timeout, docker stop) stops the server as Ctrl-C does: one line, 130
    # (the CLI leaves explore's signals to it; without this, a silent exit 143)
    try:
        with (
            terminate_as_interrupt(),
            ServerThread(build_app(loader, host=args.host), host=args.host, sock=sock) as server,
        ):
            loader.start()
            print(f"mhainterp explore: {shown} at {server.url}  (showing {what}; Ctrl-C stops)")
            sys.stdout.flush()
            if not args.no_browser:
                threading.Timer(0.5, webbrowser.open, args=(server.url,)).start()
            # Timed waits: the kernel may hand SIGINT to the server's thread, and an untimed
            # wait then never returns to the interpreter, which runs the Ctrl-C handler only in
            # the main thread (seen in CI: two explore processes hung after Ctrl-C).
            while not loader.wait(_POLL_S):
                pass
            if loader.error is not None:
                raise loader.error
            while not server.wait(_POLL_S):
                pass
    except KeyboardInterrupt:
        print("mhainterp explore: stopped", file=sys.stderr)
        return 130
    return 0


def _check_host(host: str) -> None:
    """Refuse, naming --host, an address this machine cannot listen on (a name that does not
    resolve, another machine's address): the server's bind reports those as a port problem."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as the server's bind
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))  # any free port: only the address is tried
        except OSError as error:
            reason = error.strerror or str(error)
            raise invalid(
                "--host",
                host,
                f"an address this machine can listen on ({reason}); choose another --host "
                "(127.0.0.1: this machine only)",
            ) from None


_POLL_S = 0.25
"""How often the waiting main thread looks for a Ctrl-C (seconds)."""


def _pretrained_builder(args: argparse.Namespace) -> tuple[object, str]:
    """Check ``--model`` and ``--text`` (one line each when wrong) and return the builder of
    the pretrained model's explorer and what the page says is loading."""
    if args.path is not None:
        raise invalid(
            "--model", args.model, f"a pretrained model or a run folder ({args.path}), not both"
        )
    name = args.model
    if name not in SHIPPED_MODELS and not Path(name).is_dir():
        raise invalid(
            "--model",
            name,
            f"one of {', '.join(SHIPPED_MODELS)} or a Hugging Face folder (no such folder)",
        )
    if args.text != "stdlib" and not Path(args.text).is_file():
        raise invalid("--text", args.text, "'stdlib' or a text file (no such file)")
    from mhainterp.analyze.pretrained_verdict import is_pretrained_folder  # heavy: when asked

    if args.verdict is not None and not is_pretrained_folder(args.verdict):
        raise invalid(
            "--verdict", args.verdict, "a folder `mhainterp specialize --model NAME --out` wrote"
        )
    return (lambda: _build_pretrained(args)), name


def _build_pretrained(args: argparse.Namespace) -> object:
    """The explorer of ``--model`` on ``--text``, its first answer computed (clean forward,
    average patterns, every head's attribution)."""
    from mhainterp.explore.app import Explorer
    from mhainterp.pretrained import load_pretrained

    try:
        model = load_pretrained(args.model)
    except ModuleNotFoundError as error:  # a shipped model's wheel: the message says how
        raise invalid("--model", args.model, f"an installed model ({error})") from None
    _say_cut_sentences(model, args.text, sentences_wanted(args))
    return Explorer.from_text(
        model,
        args.text,
        n_eval=sentences_wanted(args),
        name=Path(args.model).name,
        method=args.method,
        verdict=args.verdict or default_verdict(model, args.model),
    )


def _say_cut_sentences(model: object, text: str, n_eval: int) -> None:
    """One line on stderr when sentences are cut to :data:`TEXT_MAX_LEN` tokens (silent before:
    a 5,000-word line became 48 tokens)."""
    from mhainterp.tasks.text import cut_sentences, text_sentences

    sentences = text_sentences(text, n_eval)
    n_cut, longest = cut_sentences(model, sentences, TEXT_MAX_LEN)
    if n_cut:
        print(
            f"mhainterp explore: {n_cut} of {len(sentences)} sentences of {text} cut to "
            f"{TEXT_MAX_LEN} tokens (longest {longest:,})",
            file=sys.stderr,
        )


def default_verdict(model: object, name: str) -> Path | None:
    """``runs/NAME`` (where ``mhainterp specialize --model NAME`` saves) when it holds this
    model's verdict, else None: the page then says how to get one."""
    from mhainterp.analyze.pretrained_verdict import is_pretrained_folder
    from mhainterp.explore.app import pretrained_verdict

    folder = Path("runs") / Path(name).name
    if not is_pretrained_folder(folder):
        return None
    try:
        pretrained_verdict(model, folder)
    except ValueError:  # another model's verdict: not this one's
        return None
    return folder


def sentences_wanted(args: argparse.Namespace) -> int:
    """Sentences ``--model`` explores: ``--n-eval`` when typed, else :data:`TEXT_N_EVAL`."""
    return args.n_eval if getattr(args, "n_eval_given", False) else TEXT_N_EVAL


def _build(runs: list, run_id: str, args: argparse.Namespace) -> object:
    """The explorer with ``run_id`` open and its first answer computed (clean forward,
    patterns, single-head importance), so the page's first request is fast."""
    from mhainterp.explore.app import Explorer

    explorer = Explorer(runs, n_eval=args.n_eval, method=args.method)
    explorer.open(run_id)
    explorer.state()
    return explorer


def _fail(message: str) -> int:
    print(f"mhainterp explore: error: {message}", file=sys.stderr)
    return 2
