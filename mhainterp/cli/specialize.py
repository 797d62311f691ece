"""``mhainterp specialize``: label every head of a run or sweep and state the verdict.

    mhainterp specialize runs/quickstart/count_previous/runs/h4_seed0
    mhainterp specialize runs/quickstart/count_previous

Prints the per-head table (label and evidence) and the verdict of a run, or the per-head-count
table and verdicts of a sweep (or of every sweep of a folder), then the division of labour, and
saves the tables under the runs' ``analysis/`` folders (reused when the settings match).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mhainterp.cli.options import (
    add_settings_args,
    by_axes,
    check_run_folders,
    settings_from_args,
)

__all__ = ["register"]

SPECIALIZE_DESCRIPTION = """\
Do the heads specialize? Every head is labelled from its evidence: it can hold a relation (its
attention on it beats both nulls after correction, with a large enough effect; counting roles
count:<set> included), be needed (removing it alone costs accuracy), be backed up (redundant:
other heads carry its work) or be dead (writes almost nothing). The verdict states the counts,
the causal selectivity against its null (multi-target tasks) and, for several seeds, how
consistent the roles are across seeds.

The division of labour says whom the heads serve: the damage of removing each head per query
token, query position, target class and target, against label-permutation and untrained-model
nulls (saved as analysis/division_*.csv per run). "Specialized" in the verdict means the heads
divide the work along an axis whose division index beats its null.

examples:
  mhainterp specialize runs/quickstart/count_previous/runs/h4_seed0
  mhainterp specialize runs/quickstart/count_previous --alpha 0.01
  mhainterp specialize runs/quickstart/count_previous --by token,position
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
    """Add the ``specialize`` command to the ``mhainterp`` parser."""
    specialize = subparsers.add_parser(
        "specialize",
        help="label every head (role / redundant / dead / unspecialized) and state the verdict",
        description=SPECIALIZE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    specialize.add_argument("path", metavar="RUN_OR_SWEEP", help="a run, sweep or sweeps folder")
    add_settings_args(specialize)
    specialize.set_defaults(func=_cmd_specialize)


def _cmd_specialize(args: argparse.Namespace) -> int:
    from mhainterp.render import markdown_table
    from mhainterp.specialization import SpecializationResult, specialize_folder

    path = Path(args.path)
    check_run_folders(path)
    settings, by = settings_from_args(args), by_axes(args)
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
        from mhainterp.specialization.seeds.over_sweep import division_folder

        print("Division of labour (index per axis vs its label-permutation null):")
        for run_dir, division in division_folder(path, settings, by=by, progress=False):
            print(f"  {run_dir.name}: {division.summary_line()}")
    return 0
