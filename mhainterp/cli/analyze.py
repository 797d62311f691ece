"""``mhainterp analyze``: look inside a run (or every run of a sweep) and write every analysis
table and figure under ``RUN/analysis/``.

    mhainterp analyze runs/quickstart/reverse/runs/h8_seed0
    mhainterp analyze --model smollm2 --text stdlib --n-eval 64 --out runs/smollm2
"""

from __future__ import annotations

import argparse

from mhainterp.cli.options import add_n_eval, add_runtime_args, check_run_folders
from mhainterp.cli.task_modules import add_task_module_argument
from mhainterp.validation import invalid

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``analyze`` command to the ``mhainterp`` parser."""
    analyze = subparsers.add_parser(
        "analyze",
        help="look inside a run (or every run of a sweep): patterns, similarity, ablation",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write every analysis table (CSV) and figure (PNG beside its CSV) under "
        "RUN/analysis/: per-head statistics, average and example patterns next to the task's "
        "relation templates, head similarity (js, pattern_corr, cka, ov, qk, separation) with "
        "clustering and an MDS map, and ablation importance (single, pairwise, gradient, "
        "pruning). Given a sweep folder, analyses every run in it. With --model, a pretrained "
        "model on real text instead: role scores against a random-weight null, Clark et al. "
        "(2019) categories per head, attribution patching vs exact ablation, zero vs mean.",
        epilog="examples:\n  mhainterp analyze runs/quickstart/reverse/runs/h8_seed0\n"
        "  mhainterp analyze --model smollm2 --text stdlib --n-eval 64 --out runs/smollm2",
    )
    analyze.add_argument("path", nargs="?", help="a run folder or a sweep folder")
    analyze.add_argument(
        "--model", help="a pretrained model: smollm2, minilm or a Hugging Face folder"
    )
    analyze.add_argument(
        "--text",
        default="stdlib",
        help="with --model: 'stdlib' or a text file (one sentence a line)",
    )
    analyze.add_argument("--out", help="with --model: the folder to write (default runs/NAME)")
    add_n_eval(
        analyze,
        "sequences of the task's fixed evaluation set (with --model: sentences, "
        "at most as many as the text has)",
    )
    analyze.add_argument("--no-ablation", action="store_true", help="skip the ablation tables")
    analyze.add_argument("--quiet", action="store_true", help="no progress bars")
    add_task_module_argument(analyze)
    add_runtime_args(analyze)
    analyze.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    if args.model is not None:
        return _cmd_analyze_pretrained(args)
    if args.path is None:
        raise invalid("path", None, "a run or sweep folder, or --model NAME_OR_PATH")
    from mhainterp.analyze import analyze_path

    check_run_folders(args.path)
    results = analyze_path(
        args.path, n_eval=args.n_eval, ablation=not args.no_ablation, progress=not args.quiet
    )
    for run_dir, written in results.items():
        print(f"{run_dir}: {len(written)} files in {run_dir / 'analysis'}")
    return 0


def _cmd_analyze_pretrained(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    name = args.model
    shipped = ("smollm2", "minilm")
    if name not in shipped and not Path(name).is_dir():
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        if offline or name.startswith((".", "/", "~")) or "/" not in name:
            raise invalid(
                "--model",
                name,
                f"one of {', '.join(shipped)} or a Hugging Face folder (no such folder)",
            )
    if args.text != "stdlib" and not Path(args.text).is_file():
        raise invalid("--text", args.text, "'stdlib' or a text file (no such file)")
    from mhainterp.analyze import analyze_pretrained
    from mhainterp.pretrained import load_pretrained

    try:
        model = load_pretrained(name)
    except ModuleNotFoundError as error:  # a shipped model's wheel: the message says how
        raise ValueError(str(error)) from None
    out = Path(args.out or Path("runs") / Path(name).name)
    written = analyze_pretrained(model, args.text, out, n_eval=args.n_eval, progress=not args.quiet)
    print(f"{name}: {len(written)} files in {out}")
    return 0
