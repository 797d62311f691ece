"""``mhainterp report``: write ``report.md`` and a self-contained ``report.html`` for a run, a
sweep or a folder of sweeps.

    mhainterp report runs/quickstart --out reports/

The specialization results it shows are computed first where missing (as ``specialize`` would),
then the report only reads the saved files.
"""

from __future__ import annotations

import argparse

from mhainterp.cli.options import (
    Checked,
    add_runtime_args,
    add_settings_args,
    by_axes,
    check_folder,
    check_run_folders,
    settings_from_args,
)
from mhainterp.cli.pretrained_options import n_eval_for, n_eval_given, text_n_eval_default
from mhainterp.cli.static import DEFAULT_N_EVAL, SPECIALIZATION_DEFAULTS
from mhainterp.validation import ParameterError

__all__ = ["register"]

PRETRAINED_MARKER = "pretrained_verdict.json"
"""``mhainterp.analyze.pretrained_verdict.MARKER`` (the parser imports no torch)."""

REPORT_DESCRIPTION = """\
Write report.md and a self-contained report.html (figures embedded) for a run folder, a sweep
folder, or a folder of sweeps (like the demo's runs/quickstart). The head-count tables, the
specialization test (computed where missing), the figures and the caveats are all generated
from the numbers. Without settings options it reads the saved results with the settings they
were made with (the demo's labels rest on 256 sequences); an option such as --n-eval
recomputes them with the new settings.

A folder written by `mhainterp specialize --model NAME` (a pretrained model's verdict) gets
its report from the saved files: one sentence per question, then the evidence.

examples:
  mhainterp report runs/quickstart
  mhainterp report runs/minilm
  mhainterp report runs/quickstart/reverse --out reports/reverse
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` command to the ``mhainterp`` parser."""
    report = subparsers.add_parser(
        "report",
        help="write report.md and a self-contained report.html for a run or sweep",
        description=REPORT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument(
        "path",
        metavar="RUN_OR_SWEEP",
        help="a run, sweep or sweeps folder, or what `specialize --model` wrote",
    )
    report.add_argument(
        "--out",
        default=None,
        action=Checked,
        check=check_folder,
        help="folder for the report (default: the path)",
    )
    add_settings_args(report)
    text_n_eval_default(report)
    add_runtime_args(report)
    report.set_defaults(func=_cmd_report, by_default=report.get_default("by"))


def _cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    if (Path(args.path) / PRETRAINED_MARKER).is_file():  # `specialize --model`'s folder
        from mhainterp.analyze.pretrained_verdict import write_pretrained_report

        given = _options_given(args)
        if given:  # each was silently ignored: the report rendered the saved verdict as it was
            raise ParameterError(
                f"{args.path} is what `specialize --model` wrote: report renders that verdict "
                f"as saved and takes no {', '.join(given)}; rerun `mhainterp specialize "
                f"--model NAME` with {'it' if len(given) == 1 else 'them'} instead"
            )

        md, html = write_pretrained_report(args.path, args.out)
        print(f"report: {md}\n        {html}")
        return 0
    given = _settings_given(args)  # before --n-eval's default is filled in
    args.n_eval = n_eval_for(args, DEFAULT_N_EVAL)
    from mhainterp.figures.saved import save_folder_figures
    from mhainterp.report import write_report
    from mhainterp.specialization import specialize_folder
    from mhainterp.specialization.folders import saved_folder_settings

    check_run_folders(args.path)
    settings, dividing = settings_from_args(args), None
    saved = None if given else saved_folder_settings(args.path)
    if saved is not None:  # read what was saved (the demo's 256 sequences), never redo it
        settings, dividing = saved
    # The report only reads: compute (or reuse) the results it shows and draw their figures.
    specialize_folder(
        args.path,
        settings,
        progress=not args.quiet,
        by=by_axes(args),
        division_settings=dividing,
    )
    save_folder_figures(args.path)
    md, html = write_report(args.path, args.out, settings=settings)
    print(f"report: {md}\n        {html}")
    return 0


def _options_given(args: argparse.Namespace) -> list[str]:
    """The settings flags, and ``--by``, typed with a value other than their default."""
    flags = {"alpha": "--alpha", "correction": "--correction", "min_effect": "--min-effect"}
    given = [f for d, f in flags.items() if getattr(args, d) != SPECIALIZATION_DEFAULTS[d]]
    if args.ablation_method != SPECIALIZATION_DEFAULTS["method"]:
        given.append("--ablation-method")
    if n_eval_given(args):
        given.append("--n-eval")
    if args.by != args.by_default:
        given.append("--by")
    return given


def _settings_given(args: argparse.Namespace) -> bool:
    """Whether any settings option differs from its default (else the saved settings are
    read: :func:`~mhainterp.specialization.folders.saved_folder_settings`)."""
    return any(flag != "--by" for flag in _options_given(args))
