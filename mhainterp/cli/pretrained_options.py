"""The options a command shares when it takes a pretrained model: ``--model``, ``--text``,
``--out``, ``--n-eval`` on text (default :data:`TEXT_N_EVAL` sentences), and loading the model
with a one-line error. Nothing here imports torch (the parser stays fast)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from mhainterp.cli.options import Checked, check_folder
from mhainterp.validation import invalid

__all__ = [
    "DEFAULT_BY",
    "DefaultCount",
    "SHIPPED",
    "TEXT_MAX_LEN",
    "TEXT_N_EVAL",
    "add_pretrained_args",
    "check_folder_or_model",
    "check_model_name",
    "load_model",
    "n_eval_for",
    "n_eval_given",
    "sentences_line",
    "text_n_eval_default",
]

TEXT_N_EVAL = 64
"""``mhainterp.tasks.text.TEXT_N_EVAL``: sentences of a text's evaluation set by default."""
TEXT_MAX_LEN = 48
"""``mhainterp.tasks.text.TEXT_MAX_LEN``: tokens a sentence is cut to."""
DEFAULT_BY = "token,position,target_class,target"
"""``--by``'s default (every axis of a trained run; a text task's own axes replace it)."""
SHIPPED = ("smollm2", "minilm")
"""``mhainterp.pretrained.PRETRAINED``'s names."""


def add_pretrained_args(parser: argparse.ArgumentParser, out: str = "runs/NAME") -> None:
    """``--model``, ``--text`` and ``--out`` (a pretrained model on real text; ``out``: its
    default as the help shows it)."""
    group = parser.add_argument_group("pretrained model")
    group.add_argument(
        "--model", help=f"a pretrained model: {', '.join(SHIPPED)} or a Hugging Face folder"
    )
    group.add_argument(
        "--text",
        default="stdlib",
        help="with --model: 'stdlib' (sentences of Python's help texts) or a text file, one "
        f"sentence a line, each cut to {TEXT_MAX_LEN} tokens (default stdlib)",
    )
    group.add_argument(
        "--out",
        action=Checked,
        check=check_folder,
        help=f"with --model: the folder to write (default {out})",
    )
    group.add_argument(
        "--no-chat-prefix",
        dest="chat_prefix",
        action="store_false",
        help="with --model: drop the BOS token TransformerLens puts before every sentence "
        "(SmolLM2's '<|im_start|>', its chat-turn marker), so text starts at its first word",
    )


def check_folder_or_model(args: argparse.Namespace, folder_name: str) -> None:
    """Refuse a folder given with ``--model`` or ``--out``, before any model loads: one of the
    two was silently ignored (``folder_name``: the positional as the usage line shows it)."""
    if args.path is None:
        return
    if args.model is not None:
        raise invalid(
            "--model",
            args.model,
            f"given with {folder_name} ({args.path}); give either {folder_name} or --model, "
            "not both",
        )
    if args.out is not None:
        raise invalid(
            "--out",
            args.out,
            f"only for --model (a run's analysis goes to RUN/analysis, inside {args.path}); "
            "drop --out",
        )


class DefaultCount(int):
    """An option's default left as given (``1024``, equal to it in every way), marked so that
    a command can tell it from the same number typed by the user (:func:`n_eval_for`)."""


def text_n_eval_default(parser: argparse.ArgumentParser) -> None:
    """``--n-eval``'s default marked as a default, so that text gets :data:`TEXT_N_EVAL`
    sentences and a run its task's evaluation size (:func:`n_eval_for`); its help says both."""
    for action in parser._actions:
        if action.dest == "n_eval":
            action.default = DefaultCount(action.default)
            action.help = (action.help or "").replace(
                f", default {int(action.default)})",
                f", default {int(action.default)}; with --model: {TEXT_N_EVAL} sentences)",
            )


def n_eval_given(args: argparse.Namespace) -> bool:
    """Whether ``--n-eval`` was given (not its default)."""
    return not isinstance(args.n_eval, DefaultCount)


def n_eval_for(args: argparse.Namespace, default: int) -> int:
    """``--n-eval`` as given, else ``default`` (a run's: the option's own default; text's:
    :data:`TEXT_N_EVAL`)."""
    return int(args.n_eval) if n_eval_given(args) else default


def check_model_name(name: str, text: str) -> str:
    """``name`` if it can be a model here and ``text`` is ``stdlib`` or a file, else a one-line
    error (before any model is loaded)."""
    if name not in SHIPPED and not Path(name).is_dir():
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        if offline or name.startswith((".", "/", "~")) or "/" not in name:
            raise invalid(
                "--model",
                name,
                f"one of {', '.join(SHIPPED)} or a Hugging Face folder (no such folder)",
            )
    if text != "stdlib" and not Path(text).is_file():
        raise invalid("--text", text, "'stdlib' or a text file (no such file)")
    return name


def load_model(name: str, **kwargs: Any) -> Any:
    """:func:`mhainterp.pretrained.load_pretrained`; a missing wheel is a one-line error."""
    from mhainterp.pretrained import load_pretrained

    try:
        return load_pretrained(name, **kwargs)
    except ModuleNotFoundError as error:  # a shipped model's wheel: the message says how
        raise invalid("--model", name, str(error)) from None


def model_plan(args: argparse.Namespace) -> tuple[str, int, str]:
    """``(model name, sentences to evaluate, note)`` of a ``--model`` command: the name checked,
    ``--n-eval`` or the text default, and the note that says the default was taken."""
    name = check_model_name(args.model, args.text)
    n_eval = n_eval_for(args, TEXT_N_EVAL)
    note = "" if n_eval_given(args) else " (the default on text; --n-eval to change)"
    return name, n_eval, note


def load_and_announce(args: argparse.Namespace, name: str, n_eval: int, note: str) -> Any:
    """Load the model, then say what the command evaluates (on stderr, unless ``--quiet``):
    said once the model is there, so a loading error stays one line."""
    import sys

    model = load_model(name)
    if not args.quiet:
        print(sentences_line(name, args.text, n_eval, note, model=model), file=sys.stderr)
    return model


def sentences_line(name: str, text: str, n_eval: int, note: str = "", model: Any = None) -> str:
    """``"minilm: 64 of 335 sentences of stdlib (...)"``: what the command evaluates; with
    ``model``, also how many of them its tokenizer cuts (``"; 1 of 3 cut to 48 tokens
    (longest 5,000)"``): the cut was silent, and a 5,000-word line became 48 tokens."""
    from mhainterp.tasks.text import cut_sentences, text_sentences

    sentences = text_sentences(text)
    used = min(n_eval, len(sentences))
    line = f"{name}: {used} of {len(sentences)} sentences of {text}{note}"
    n_cut, longest = (
        (0, 0) if model is None else cut_sentences(model, sentences[:used], TEXT_MAX_LEN)
    )
    if n_cut:
        line += f"; {n_cut} of {used} cut to {TEXT_MAX_LEN} tokens (longest {longest:,})"
    return line
