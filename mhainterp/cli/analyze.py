"""``mhainterp analyze``: look inside a run (or every run of a sweep) and write every analysis
table and figure under ``RUN/analysis/``.

    mhainterp analyze runs/quickstart/reverse/runs/h8_seed0
    mhainterp analyze --model smollm2 --text stdlib --n-eval 64 --out runs/smollm2-analysis
"""

from __future__ import annotations

import argparse

from mhainterp.cli.options import add_n_eval, add_runtime_args, check_run_folders
from mhainterp.cli.pretrained_options import (
    add_pretrained_args,
    check_folder_or_model,
    load_and_announce,
    model_plan,
    n_eval_for,
    text_n_eval_default,
)
from mhainterp.cli.static import DEFAULT_N_EVAL
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
        "  mhainterp analyze --model smollm2 --text stdlib --n-eval 64 "
        "--out runs/smollm2-analysis",
    )
    analyze.add_argument("path", nargs="?", help="a run folder or a sweep folder")
    add_pretrained_args(analyze, out="runs/NAME-analysis, beside specialize's runs/NAME")
    add_n_eval(
        analyze,
        "sequences of the task's fixed evaluation set (with --model: sentences, "
        "at most as many as the text has)",
    )
    text_n_eval_default(analyze)
    analyze.add_argument(
        "--no-ablation",
        action="store_true",
        help="skip the ablation tables (with --model: attribution, exact ablation, zero vs "
        "mean, pairwise and pruning; the role scores and categories remain)",
    )
    analyze.add_argument("--quiet", action="store_true", help="no progress bars")
    add_task_module_argument(analyze)
    add_runtime_args(analyze)
    analyze.set_defaults(func=_cmd_analyze)


def _cmd_analyze(args: argparse.Namespace) -> int:
    check_folder_or_model(args, "path")
    if args.model is not None:
        return _cmd_analyze_pretrained(args)
    if args.path is None:
        raise invalid("path", None, "a run or sweep folder, or --model NAME_OR_PATH")
    from mhainterp.analyze import analyze_path

    check_run_folders(args.path)
    n_eval = n_eval_for(args, DEFAULT_N_EVAL)
    results = analyze_path(
        args.path, n_eval=n_eval, ablation=not args.no_ablation, progress=not args.quiet
    )
    for run_dir, written in results.items():
        print(f"{run_dir}: {len(written)} files in {run_dir / 'analysis'}")
    return 0


def _cmd_analyze_pretrained(args: argparse.Namespace) -> int:
    import contextlib
    from pathlib import Path

    name, n_eval, note = model_plan(args)
    from mhainterp.analyze import analyze_pretrained
    from mhainterp.pretrained import quiet_loading
    from mhainterp.runs import check_free_folder

    # beside `specialize --model`'s runs/NAME, never in it: each writes its own provenance.json
    out = Path(args.out or Path("runs") / f"{Path(name).name}-analysis")
    check_free_folder(out, "pretrained analysis", "--out")  # before the model loads
    with quiet_loading() if args.quiet else contextlib.nullcontext():
        model = load_and_announce(args, name, n_eval, note)
        written = analyze_pretrained(
            model,
            args.text,
            out,
            n_eval=n_eval,
            ablation=not args.no_ablation,
            bos=args.chat_prefix,
            progress=not args.quiet,
        )
    print(f"{name}: {len(written)} files in {out}")
    return 0
