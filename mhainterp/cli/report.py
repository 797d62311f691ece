"""``mhainterp report`` and ``mhainterp specialize``: the verdict and the report of a run or a
sweep.

    mhainterp specialize runs/quickstart/count_previous/runs/h4_seed0
    mhainterp specialize runs/quickstart/count_previous
    mhainterp report runs/quickstart --out reports/

``specialize`` prints the per-head table (label and evidence) and the verdict of a run, or the
per-head-count table and verdicts of a sweep (or of every sweep of a folder), and saves the
tables under the runs' ``analysis/`` folders (reused when the settings match). ``report``
writes ``report.md`` and a self-contained ``report.html``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mhainterp.cli.core import check_run_folders

__all__ = ["register"]

SPECIALIZE_DESCRIPTION = """\
Do the heads specialize? Each head gets a label: a role (the relation it attends to, when its
share of attention on it beats both nulls after correction and the effect is large enough),
"redundant" (similar to another head and backing it up when ablated), "dead" (writes almost
nothing) or "unspecialized". The verdict states the counts, the causal selectivity against its
null (multi-target tasks) and, for several seeds, how consistent the roles are across seeds.

It also measures whom each head serves (the division of labour: the damage of removing each
head per query token, query position, target class and target, against label-permutation and
untrained-model nulls) and saves it as analysis/division_*.csv per run.

examples:
  mhainterp specialize runs/quickstart/count_previous/runs/h4_seed0
  mhainterp specialize runs/quickstart/count_previous --alpha 0.01
  mhainterp specialize runs/quickstart/count_previous --by token,position
"""

REPORT_DESCRIPTION = """\
Write report.md and a self-contained report.html (figures embedded) for a run folder, a sweep
folder, or a folder of sweeps (like the demo's runs/quickstart). The head-count tables, the
specialization test (computed where missing), the figures and the caveats are all generated
from the numbers.

examples:
  mhainterp report runs/quickstart
  mhainterp report runs/quickstart/reverse --out reports/reverse
"""

HEAD_COLUMNS = [
    "head_label",
    "label",
    "holds",
    "needed",
    "backed_up",
    "dead",
    "explained",
    "top_role",
    "top_effect",
    "top_p_adj",
    "output_ratio",
    "total_damage",
    "causal_target",
    "causal_selectivity",
    "redundant_with",
]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``specialize`` and ``report`` commands to the ``mhainterp`` parser."""
    specialize = subparsers.add_parser(
        "specialize",
        help="label every head (role / redundant / dead / unspecialized) and state the verdict",
        description=SPECIALIZE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    specialize.add_argument("path", metavar="RUN_OR_SWEEP", help="a run, sweep or sweeps folder")
    _add_settings(specialize)
    specialize.set_defaults(func=_cmd_specialize)

    report = subparsers.add_parser(
        "report",
        help="write report.md and a self-contained report.html for a run or sweep",
        description=REPORT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("path", metavar="RUN_OR_SWEEP", help="a run, sweep or sweeps folder")
    report.add_argument("--out", default=None, help="folder for the report (default: the path)")
    _add_settings(report)
    report.set_defaults(func=_cmd_report)


def _add_settings(parser: argparse.ArgumentParser) -> None:
    from mhainterp.cli.task_modules import add_task_module_argument
    from mhainterp.specialization import CORRECTIONS, SpecializationSettings

    defaults = SpecializationSettings()
    group = parser.add_argument_group("specialization test")
    group.add_argument(
        "--n-eval",
        type=int,
        default=defaults.n_eval,
        help=f"held-out sequences (default {defaults.n_eval})",
    )
    group.add_argument("--alpha", type=float, default=defaults.alpha, help="level after correction")
    group.add_argument(
        "--correction",
        default=defaults.correction,
        choices=CORRECTIONS,
        help="multiple-comparison correction (default holm)",
    )
    group.add_argument(
        "--min-effect",
        type=float,
        default=defaults.min_effect,
        help=f"smallest effect size that counts as a role (default {defaults.min_effect})",
    )
    group.add_argument(
        "--ablation-method",
        default=defaults.ablation_method,
        help="ablation method for damage and redundancy (default mean)",
    )
    group.add_argument(
        "--by",
        default="token,position,target_class,target",
        help="axes of the division of labour, comma-separated (default: every axis that "
        "applies: token,position,target_class,target); 'none' to skip it",
    )
    group.add_argument("--quiet", action="store_true", help="no progress bars")
    add_task_module_argument(parser)


def _settings(args: argparse.Namespace) -> Any:
    from mhainterp.specialization import SpecializationSettings

    return SpecializationSettings(
        n_eval=args.n_eval,
        alpha=args.alpha,
        correction=args.correction,
        min_effect=args.min_effect,
        ablation_method=args.ablation_method,
    )


def _cmd_specialize(args: argparse.Namespace) -> int:
    from mhainterp.render import markdown_table
    from mhainterp.specialization import SpecializationResult, specialize_folder

    path = Path(args.path)
    check_run_folders(path)
    settings, by = _settings(args), _by(args)
    for folder, result in specialize_folder(path, settings, progress=not args.quiet, by=by):
        if isinstance(result, SpecializationResult):  # a run folder
            print(markdown_table(result.heads[HEAD_COLUMNS]))
            print()
            print(result.verdict.text)
            print()
            for caveat in result.verdict.caveats:
                print(f"- {caveat}")
            print(f"\ntables saved in {folder / 'analysis'}")
            continue
        print(f"## {folder.name}\n")
        print(result.to_markdown())
        print("\n".join(result.result.verdict.lines))
        print(f"\ntables saved in {folder}\n")
    if by:
        from mhainterp.specialization.over_sweep import division_folder

        print("Division of labour (index per axis vs its label-permutation null):")
        for run_dir, division in division_folder(path, settings, by=by, progress=False):
            print(f"  {run_dir.name}: {division.summary_line()}")
    return 0


def _by(args: argparse.Namespace) -> tuple[str, ...]:
    """The ``--by`` axes (empty for ``none``)."""
    if args.by.strip().lower() == "none":
        return ()
    return tuple(part.strip() for part in args.by.split(",") if part.strip())


def _cmd_report(args: argparse.Namespace) -> int:
    from mhainterp.report import write_report
    from mhainterp.specialization import specialize_folder

    check_run_folders(args.path)
    settings = _settings(args)
    # The report only reads: compute (or reuse) the specialization results it shows first.
    specialize_folder(args.path, settings, progress=not args.quiet, by=_by(args))
    md, html = write_report(args.path, args.out, settings=settings)
    print(f"report: {md}\n        {html}")
    return 0
