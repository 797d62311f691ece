"""``mhainterp specialize``: label every head of a run or sweep and state the verdict.

    mhainterp specialize runs/quickstart/count_previous/runs/h4_seed0
    mhainterp specialize runs/quickstart/count_previous
    mhainterp specialize --model minilm --text stdlib --n-eval 64 --out runs/minilm

Prints the per-head table (label and evidence) and the verdict of a run, or the per-head-count
table and verdicts of a sweep (or of every sweep of a folder), then the division of labour, and
saves the tables under the runs' ``analysis/`` folders (reused when the settings match) with
the figures the report embeds.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from mhainterp.cli.options import (
    add_runtime_args,
    add_settings_args,
    by_axes,
    check_run_folders,
    settings_from_args,
)
from mhainterp.cli.pretrained_options import (
    DEFAULT_BY,
    add_pretrained_args,
    check_folder_or_model,
    load_and_announce,
    model_plan,
    n_eval_for,
    text_n_eval_default,
)
from mhainterp.cli.static import DEFAULT_N_EVAL
from mhainterp.validation import invalid

if TYPE_CHECKING:  # annotations only: --help imports no torch
    from mhainterp.specialization.settings import SpecializationSettings

__all__ = ["register"]

SCREEN_SAMPLE = 0.05
"""``DivisionSettings.screen_sample``, the share of screened-out heads computed exactly anyway
(mirrored: the parser imports no torch; tests/test_gradient_objective.py checks it)."""

SPECIALIZE_DESCRIPTION = f"""\
Do the heads specialize? Three questions, each against a null:
- where a head looks: its attention on each relation template of the task beats a key
  permutation and the untrained model (Holm-corrected, with an effect gate);
- whom it serves: the division of labour over query token, position, target class and target,
  called "divided", "not divided", "cannot tell" or "method-dependent" against heads that do
  the same job (noisy copies), with a 95% CI, under mean, zero and resample ablation, and
  resting on single-head removal, kept-head profiles or backed-up groups (it says which);
- whether it is needed: needed (removing it alone costs accuracy), backed up (others carry
  its work), or dead (writes almost nothing AND removing it costs nothing).
Each head's "finding" says all three; the verdict leads with one sentence per run.

A pretrained model (--model smollm2, minilm or a Hugging Face folder) goes through the same
test on real text (--text stdlib or a file, one sentence a line; --n-eval sentences, default
64): the relation templates are previous, next, self, first, last, punctuation and same token,
the division's axes the query token class, position bucket and target frequency, and damage
the loss increase per position (next-token cross-entropy; for MiniLM, 1 - cos of each
position's output to the clean one). The division first screens every head by attribution
patching and computes exactly only the heads whose estimate reaches half the damage gate, the
heads of layers the estimate misses, and a {SCREEN_SAMPLE:.0%} sample (the `evidence` column says
which).
The verdict leads with one sentence per question and is saved in --out (default runs/NAME);
`mhainterp report` on that folder renders it. Each stage is saved when it finishes
(--out/cache/): interrupted and started again, the command continues.

examples:
  mhainterp specialize --model minilm --text stdlib
  mhainterp specialize runs/quickstart/count_previous/runs/h4_seed0
  mhainterp specialize runs/quickstart/count_previous --alpha 0.01
  mhainterp specialize runs/quickstart/count_previous --by token,position
"""

HEADLINE_ANALYSES = 41
"""Analyses per run of ``--headline-stability`` (mirrors
:func:`mhainterp.specialization.headline.n_analyses`; the parser imports no torch)."""

HEAD_COLUMNS = [
    "head_label",
    "label",
    "holds",
    "needed",
    "backed_up",
    "dead",
    "harmful",
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
        help="where each head looks, whom it serves, whether it is needed; the verdict",
        description=SPECIALIZE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    specialize.add_argument(
        "path", nargs="?", metavar="RUN_OR_SWEEP", help="a run, sweep or sweeps folder"
    )
    add_pretrained_args(specialize)
    add_settings_args(specialize)
    text_n_eval_default(specialize)
    specialize.add_argument(
        "--headline-stability",
        action="store_true",
        help="also re-run each run's analysis with every gate moved x0.8 and x1.25, n_eval "
        f"halved and doubled and each other ablation method ({HEADLINE_ANALYSES} runs of the "
        "analysis per run: minutes per run, announced with an estimate) and save the share of "
        "verdict sentences that change (analysis/headline_stability.csv); with --model the "
        "verdict is re-decided instead, from its own evidence and passes, under every moved "
        "gate (the moves of n_eval, the method and the noise would each be a new verdict: "
        "listed as not run)",
    )
    add_runtime_args(specialize)
    specialize.set_defaults(func=_cmd_specialize)


def _cmd_specialize(args: argparse.Namespace) -> int:
    check_folder_or_model(args, "RUN_OR_SWEEP")
    if args.model is not None:
        return _cmd_specialize_pretrained(args)
    if args.path is None:
        raise invalid("path", None, "a run or sweep folder, or --model NAME_OR_PATH")
    from mhainterp.figures.saved import save_folder_figures
    from mhainterp.render import markdown_table
    from mhainterp.specialization import SpecializationResult, specialize_folder

    args.n_eval = n_eval_for(args, DEFAULT_N_EVAL)
    path = Path(args.path)
    check_run_folders(path)
    settings, by = settings_from_args(args), by_axes(args)
    specialized = specialize_folder(path, settings, progress=not args.quiet, by=by)
    save_folder_figures(path)  # beside the tables, for the report to embed
    for folder, result in specialized:
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
        from mhainterp.specialization.folders import division_folder
        from mhainterp.specialization.nulls import SAME_FUNCTION_NULL

        print(
            "Division of labour (index per axis vs the upper 95% quantile of its null, "
            f"{SAME_FUNCTION_NULL}):"
        )
        for run_dir, division in division_folder(path, settings, by=by, progress=False):
            print(f"  {run_dir.name}: {division.summary_line()}")
    if args.headline_stability:
        _print_headline_stability(path, settings, by, quiet=args.quiet)
    return 0


def _cmd_specialize_pretrained(args: argparse.Namespace) -> int:
    from mhainterp.analyze.pretrained_verdict import specialize_pretrained
    from mhainterp.pretrained import quiet_loading
    from mhainterp.runs import check_free_folder

    name, n_eval, note = model_plan(args)
    args.n_eval = n_eval
    settings = settings_from_args(args)
    by = None if args.by == DEFAULT_BY else by_axes(args)
    out = Path(args.out or Path("runs") / Path(name).name)
    check_free_folder(out, "pretrained verdict", "--out")  # before the model loads
    with quiet_loading() if args.quiet else contextlib.nullcontext():
        model = load_and_announce(args, name, n_eval, note)
        verdict = specialize_pretrained(
            model,
            args.text,
            out,
            settings,
            by=by,
            n_eval=n_eval,
            bos=args.chat_prefix,
            progress=not args.quiet,
            headline_stability=args.headline_stability,
        )
    for sentence in verdict.sentences:
        print(sentence)
    print()
    print(verdict.result.to_markdown())
    if args.headline_stability:
        _print_pretrained_headline_stability(out / "analysis")
    print(f"tables saved in {out / 'analysis'}; `mhainterp report {out}` renders them")
    return 0


def _print_pretrained_headline_stability(analysis: Path) -> None:
    """The saved headline stability of a pretrained verdict, in two lines."""
    from mhainterp.io import read_json
    from mhainterp.specialization.headline import HEADLINE_FILE

    s = read_json(analysis / HEADLINE_FILE.replace(".csv", ".json"))
    print(
        f"Headline stability: the verdict sentence changes under "
        f"{s['share_sentences_changed']:.0%} of {s['n_perturbations']} moved gates "
        f"(re-decided from this verdict's evidence); {s['share_labels_changed']:.0%} of "
        "labels change"
    )
    if s.get("not_run"):
        print(f"  not run (each a new verdict): {', '.join(s['not_run'])}")


def _print_headline_stability(
    path: Path, settings: SpecializationSettings | None, by: tuple[str, ...], quiet: bool
) -> None:
    from mhainterp.specialization.headline import (
        headline_stability_folder,
        headline_summary,
    )

    print("Headline stability (verdict sentences that change when a gate or the method moves):")
    # the estimate lines go beside the bar (tqdm.write, on stdout); --quiet: neither
    for run_dir, table in headline_stability_folder(path, settings, by=by, progress=not quiet):
        s = headline_summary(table)
        print(
            f"  {run_dir.name}: {int(table['changed'].sum())} of {s['n_perturbations']} "
            f"perturbations change the sentence ({s['share_sentences_changed']:.0%}); "
            f"{s['share_labels_changed']:.0%} of labels change"
        )
