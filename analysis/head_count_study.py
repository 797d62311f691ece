"""Does h matter? The head-count study at population scale: the demo's protocol on a bigger grid.

One code path: :func:`mhainterp.analyze.study.run_study`, the same as ``mhainterp demo`` (whose
grid is ``demo``); only the grid differs::

    python analysis/head_count_study.py --out runs/head_count_study            # grid by device
    python analysis/head_count_study.py --grid full --device cuda              # the full grid
    python analysis/head_count_study.py --quick                                # a smoke run
    python analysis/head_count_study.py --grid demo --replicate-seeds 6-11     # claims rerun

Grids (:data:`mhainterp.analyze.study.GRIDS`): ``cpu`` is every built-in task one layer can
learn (all but ``induction``) x h in {1, 2, 4, 8} x 6 seeds, 1,500 steps; ``full`` is all 7
built-in tasks x h in {1, 2, 4, 8, 16, 32, 64} (d_model 64, so d_head 64 .. 1) x 30 seeds
(minutes on one H100/H200-class GPU); ``demo`` is the demo's. ``auto`` (default) picks
``full`` on a GPU and ``cpu`` otherwise, and says so.

Outputs in ``OUT/``: ``report.md``/``.html`` (the one-line answer per task, then the
evidence), ``does_h_matter.png``/``.pdf`` drawn from ``does_h_matter.csv`` (per task and h:
accuracy and the division index per axis, seed mean, std and 95% interval, seeds called
divided), ``study_comparisons.csv`` (adjacent head counts on every measure: difference,
interval, test, Holm within each question's family) and one sweep folder per task. With
``--replicate-seeds``, the same grid on those seeds in ``OUT/held_out/`` and
``replication.csv``: each comparison beyond the seed spread, re-read on the held-out seeds
(:func:`mhainterp.specialization.seeds.replication.replication`). Every step is resumable:
run the same command again after an interruption.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mhainterp.analyze.study import GRIDS, Grid, run_study
from mhainterp.cli.options import int_list
from mhainterp.io import write_csv
from mhainterp.runtime import device_context, resolve_device
from mhainterp.specialization.seeds.replication import replication
from mhainterp.sweep import fastest_executor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/head_count_study"))
    parser.add_argument(
        "--grid",
        choices=("auto", *GRIDS),
        default="auto",
        help="auto: full on a GPU, cpu otherwise (default auto)",
    )
    parser.add_argument("--quick", action="store_true", help="the quick grid (a smoke run)")
    parser.add_argument("--tasks", help="comma-separated task names (default: the grid's)")
    parser.add_argument("--n-heads", type=int_list, help="head counts, e.g. 1,2,4,8")
    parser.add_argument("--seeds", type=int_list, help="seeds, e.g. 0-29")
    parser.add_argument("--steps", type=int, help="training steps per run")
    parser.add_argument(
        "--verdict-seeds", type=int, help=argparse.SUPPRESS
    )  # kept for old command lines: every run is divided now, as in the demo
    parser.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N|mps")
    parser.add_argument("--executor", default=None, help="sweep executor (default: fastest)")
    parser.add_argument("--no-analysis", action="store_true", help="skip the head analysis")
    parser.add_argument(
        "--replicate-seeds",
        type=int_list,
        help="also run the grid on these held-out seeds and say which findings replicate",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def choose_grid(args: argparse.Namespace, on_gpu: bool) -> Grid:
    """The grid the options ask for (``auto``: full on a GPU, cpu otherwise), overridden."""
    name = "quick" if args.quick else args.grid
    if name == "auto":
        name = "full" if on_gpu else "cpu"
    tasks = tuple(t.strip() for t in args.tasks.split(",")) if args.tasks else None
    return GRIDS[name].with_options(
        tasks=tasks,
        n_heads=tuple(args.n_heads) if args.n_heads else None,
        seeds=tuple(args.seeds) if args.seeds else None,
        steps=args.steps,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.verdict_seeds is not None:
        print("--verdict-seeds is no longer used: every run is divided, as in the demo")
    with device_context(args.device):
        device = resolve_device(None)
        grid = choose_grid(args, on_gpu=device.type == "cuda")
        print(f"on {device}")
        executor = args.executor or fastest_executor()
        run_study(
            grid,
            args.out,
            executor=executor,
            analysis=not args.no_analysis,
            echo=print,
            progress=not args.quiet,
        )
        if args.replicate_seeds:
            held_out = grid.with_options(seeds=tuple(args.replicate_seeds))
            run_study(
                held_out,
                args.out / "held_out",
                executor=executor,
                analysis=False,
                echo=print,
                progress=not args.quiet,
            )
            write_replication(args.out, args.out / "held_out")
    return 0


def write_replication(out: Path, held_out: Path) -> Path:
    """``OUT/replication.csv``: each comparison beyond the spread in ``OUT``, re-read in
    ``held_out``; prints how many replicate and names those that do not."""
    table = replication(read_comparisons(out), read_comparisons(held_out))
    path = write_csv(out / "replication.csv", table)
    print(
        f"replication: {int(table['replicates'].sum())} of {len(table)} comparisons beyond the "
        f"seed spread replicate on the held-out seeds ({path})"
    )
    for row in table[~table["replicates"]].itertuples(index=False):
        print(
            f"  does not replicate: {row.task} {row.quantity} h = {row.n_heads_a} → "
            f"{row.n_heads_b} ({row.diff:+.3g}, then {row.diff_held_out:+.3g}, Holm p "
            f"{row.p_holm_held_out:.2g})"
        )
    return path


def read_comparisons(folder: Path) -> pd.DataFrame:
    """A study's ``study_comparisons.csv`` with ``beyond`` read back as True / False / None."""
    table = pd.read_csv(folder / "study_comparisons.csv")
    table["beyond"] = table["beyond"].map(lambda v: None if pd.isna(v) else str(v) == "True")
    return table


if __name__ == "__main__":
    raise SystemExit(main())
