"""The ``mhainterp`` command: one sub-command per job, each defined in its own module.

Each module in ``COMMAND_MODULES`` (one per command, in ``--help`` order) exposes
``register(subparsers)``, which adds its parser and sets ``func=handler``; a handler takes the
parsed args and returns an exit code. ``options`` holds the argument groups they share.

Errors (DESIGN.md, "Errors"): the user's input (an option out of its documented range included),
a damaged file, a full disk, a folder that cannot be written or an allocation that fails end
with one line on stderr and exit code 2; Ctrl-C, and SIGTERM, with one line and 130.
``MHAINTERP_DEBUG=1`` shows the traceback instead.

Start-up: ``--help`` of every command and ``mhainterp tasks`` import no torch (the command
modules import the library inside their handlers; :mod:`mhainterp.cli.static` holds what help
and the task list show).

May import (what it does import, none above it in DESIGN.md's order; ``tests/test_architecture.py``
checks this list): ``ablation``, ``analyze``, ``config``, ``errors``, ``explore``, ``figures``,
``heads``, ``io``, ``pretrained``, ``render``, ``report``, ``runs``, ``runtime``,
``specialization``, ``sweep``, ``tasks``, ``training``, ``validation``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import NoReturn

from mhainterp.cli.task_modules import load_task_modules
from mhainterp.errors import RunLockedError, TrainingDivergedError
from mhainterp.runtime import device_context, terminate_as_interrupt, threads_context

__all__ = ["OneLineParser", "build_parser", "main"]

COMMAND_MODULES = (
    "mhainterp.cli.tasks",
    "mhainterp.cli.train",
    "mhainterp.cli.sweep",
    "mhainterp.cli.analyze",
    "mhainterp.cli.demo",
    "mhainterp.cli.ablate",
    "mhainterp.cli.specialize",
    "mhainterp.cli.report",
    "mhainterp.cli.explore",
)

DESCRIPTION = """\
mhainterp: do attention heads really specialize?

Train small multi-head attention models on synthetic tasks with known answers, compare head
counts across seeds, and look inside the heads (patterns, similarity, ablation).

Start here:
  mhainterp tasks                          list the tasks and what they ask
  mhainterp demo --out runs/quickstart     the head-count experiment + analysis, with figures
  mhainterp <command> --help               every command explains its options
"""


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose errors (a missing argument, a word that is not a number) are one
    line on stderr with exit code 2, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``mhainterp`` parser with every sub-command (imports no torch)."""
    parser = OneLineParser(
        prog="mhainterp",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mhainterp`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in argv if not word.startswith("-")), None)
    # SIGTERM (kill, timeout, docker stop, Slurm) ends the command as Ctrl-C does from its
    # first moment, imports included; not for explore, whose server has its own way of stopping.
    sigterm = contextlib.nullcontext() if command == "explore" else terminate_as_interrupt()
    with sigterm, _warnings_as_lines(command):
        return _main(argv, command)


@contextlib.contextmanager
def _warnings_as_lines(command: str | None) -> Iterator[None]:
    """A warning is one line, ``mhainterp report: warning: ...``, printed once per message.
    Python's default printed the file, the line number and the source line, once per place
    that warned (a duplicated results.csv row was reported twice, four lines each)."""
    if os.environ.get("MHAINTERP_DEBUG"):
        yield
        return
    prefix = f"mhainterp {command}" if command else "mhainterp"
    said: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = _one_line(str(message))
        if text not in said:
            said.add(text)
            print(f"{prefix}: warning: {text}", file=file or sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _import_numerics() -> None:
    """Import numpy and torch with Ctrl-C and SIGTERM held until both are in, then act on them.

    torch's C start-up imports numpy and clears any error that import raises, so a Ctrl-C
    landing there was swallowed and left numpy half-imported: the command went on and failed
    later with "too many values to unpack" (matplotlib's colormaps over a numpy without
    ``subtract``) instead of stopping. Holding the signal costs at most the import time."""
    if "torch" in sys.modules or threading.current_thread() is not threading.main_thread():
        return
    held: list[int] = []
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in signals}
    try:
        import numpy  # noqa: F401  (first, whole, before torch's C code imports it)
        import torch  # noqa: F401
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if held:
        raise KeyboardInterrupt(f"signal {held[0]}")


def _main(argv: list[str], command: str | None) -> int:
    prefix = f"mhainterp {command}" if command else "mhainterp"
    started = False  # whether the command itself began (its Ctrl-C message says how to resume)
    flags: dict[str, str] = {}  # a library parameter's name -> the command's flag for it
    try:
        parser = build_parser()
        flags = _flags(parser, command)
        args = parser.parse_args(argv)  # an option out of its range raises ParameterError
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        prefix, started = f"mhainterp {args.command}", True
        if args.command not in ("tasks", "explore"):  # explore serves its page before torch
            _import_numerics()
        load_task_modules(args)  # --task-module: the user's own tasks, before anything else
        # --device and --threads reach every model the command loads and every analysis it
        # runs (context variables; the environment is written only in a sweep's workers)
        device, threads = getattr(args, "device", None), getattr(args, "threads", None)
        with device_context(device), threads_context(threads):
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if os.environ.get("MHAINTERP_DEBUG"):
            raise
        resume = "; run the same command again to resume" if started else ""
        _clear_progress_bars()
        print(f"{prefix}: interrupted{resume}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mhainterp tasks | head`: the reader has all it wanted
        # Python's docs recipe: point stdout at /dev/null so the exit-time flush stays quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a C tool killed by the closed pipe would return
    except OSError as error:  # a full disk, a read-only folder, a file where a folder belongs
        if os.environ.get("MHAINTERP_DEBUG"):
            raise
        from mhainterp.io import describe_os_error

        print(f"{prefix}: error: {_one_line(describe_os_error(error))}", file=sys.stderr)
        return 2
    except Exception as error:
        if os.environ.get("MHAINTERP_DEBUG"):
            raise
        memory = _allocation_failure(error, prefix)
        if memory is not None:  # an allocation no estimate foresaw: still one line
            print(f"{prefix}: error: {_one_line(memory)}", file=sys.stderr)
            return 2
        if not isinstance(error, _USER_ERRORS):
            raise
        # The user's input or a damaged run folder: one clear line, no traceback.
        print(f"{prefix}: error: {_one_line(_as_flag(str(error), flags))}", file=sys.stderr)
        return 2


def _flags(parser: argparse.ArgumentParser, command: str | None) -> dict[str, str]:
    """``{"n_heads": "--n-heads", "path": "RUN_OR_SWEEP", ...}`` for ``command``: the names a
    library check gives a value (``n_heads=[3] is invalid``) and how the user typed it."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub = subparsers[0].choices.get(command) if subparsers and command else None
    if sub is None:
        return {}
    out = {}
    for action in sub._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        name = long[0] if long else (action.metavar or action.dest.upper())
        out.setdefault(action.dest, str(name))
    return out


def _as_flag(message: str, flags: dict[str, str]) -> str:
    """A library error that names a parameter (``warmup_steps=5 is invalid: ...``), with the
    command's flag instead (``--warmup-steps=5 is invalid: ...``): what the user typed."""
    name, equals, rest = message.partition("=")
    if equals and name in flags and name.isidentifier():
        return f"{flags[name]}={rest}"
    return message


def _clear_progress_bars() -> None:
    """Blank the progress bars an interrupt left on screen, so its message has the line alone.

    tqdm clears a bar (``leave=False``) when the loop over it ends, but not one whose
    constructor the signal interrupted just after its first display: its ``close()`` then
    finds no ``last_print_t`` and takes it for never shown. Seen in CI: SIGTERM sent as the
    bar appeared gave "train reverse h=4:   0%|  | 0/100000 [...]mhainterp train: interrupted".
    """
    std = sys.modules.get("tqdm.std")
    if std is None:  # no bar was ever made
        return
    for bar in list(std.tqdm._instances):  # live bars (a weak set), half-built ones included
        with contextlib.suppress(AttributeError, ValueError, OSError):  # a closed stream
            if getattr(bar, "sp", None) is not None and not hasattr(bar, "last_print_t"):
                bar.sp("")  # '\r' and blanks over the text it showed
                bar.fp.write("\r")
            bar.close()


_USER_ERRORS = (ValueError, TypeError, RunLockedError, TrainingDivergedError)
"""The errors that are the user's input or a damaged file: ValueError (ParameterError and the
toolkit's damaged-file, memory and task errors included), TypeError, and the locked-run and
diverged-run errors."""


def _allocation_failure(error: BaseException, prefix: str) -> str | None:
    """The one line for a failed allocation (:func:`mhainterp.io.allocation_failure`), else
    None. Only an error raised while the command ran gets here, so importing io costs
    ``--help`` nothing."""
    if not isinstance(error, (MemoryError, RuntimeError)):
        return None
    from mhainterp.io import allocation_failure

    return allocation_failure(error, prefix.removeprefix("mhainterp "))


def _one_line(message: str) -> str:
    """Several lines (a list of diverged runs) joined into one."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " ".join(line if line.endswith(":") else line + ";" for line in lines).rstrip(";")


if __name__ == "__main__":
    raise SystemExit(main())
