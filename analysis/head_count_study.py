"""The seed's head-count experiment (seed 000) over several tasks, with honest statistics.

Same d_model, data, steps, learning rate and initialisation seed for every head count; only the
number of heads changes (so the parameter count is identical), >= 3 seeds per head count. For
each task this writes a sweep folder (results.csv, the seed table with Welch tests, bootstrap
intervals and the seed-spread rule, the figures), then one report over all tasks::

    python analysis/head_count_study.py --out runs/head_count_study
    python analysis/head_count_study.py --quick          # a small smoke run (a minute or two)

Outputs: ``OUT/<task>/`` sweep folders and ``OUT/report.md`` + ``OUT/report.html``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.demo import run_sweep_with_figures
from mhainterp.figures.saved import save_folder_figures
from mhainterp.report import write_report
from mhainterp.specialization import SpecializationSettings, specialize_folder
from mhainterp.sweep import fastest_executor

DEFAULT_TASKS = "count_previous,reverse,histogram,sort"
QUICK = {"tasks": "count_previous,reverse", "n_heads": "1,4", "seeds": "0,1,2", "steps": 150}


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/head_count_study"))
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated task names")
    parser.add_argument("--n-heads", default="1,2,4,8,16", help="head counts, e.g. 1,4,8")
    parser.add_argument("--seeds", default="0,1,2", help="seeds (>= 3 for the seed's protocol)")
    parser.add_argument("--steps", type=int, default=1500, help="training steps per run")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--d-vocab", type=int, default=10)
    parser.add_argument(
        "--executor", default=None, help="sweep executor (default: batched when available)"
    )
    parser.add_argument("--n-eval", type=int, default=256, help="sequences for the report")
    parser.add_argument("--quick", action="store_true", help="small smoke run: " + str(QUICK))
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks, args.n_heads, args.seeds = QUICK["tasks"], QUICK["n_heads"], QUICK["seeds"]
        args.steps, args.n_eval = QUICK["steps"], 128
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    progress = not args.quiet
    executor = args.executor or fastest_executor()
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        config = SweepConfig(
            task=task,
            task_params={"seq_len": args.seq_len, "d_vocab": args.d_vocab},
            n_heads=_ints(args.n_heads),
            seeds=_ints(args.seeds),
            model={"d_model": args.d_model, "n_layers": 1},
            train=TrainConfig(steps=args.steps, warmup_steps=min(100, args.steps // 10)),
        )
        summary = run_sweep_with_figures(config, args.out / task, executor, progress)
        print(summary.to_markdown())
    settings = SpecializationSettings(n_eval=args.n_eval)
    specialize_folder(args.out, settings, progress=progress)  # the report reads these results
    save_folder_figures(args.out)  # and embeds these figures
    md, html = write_report(args.out, settings=settings)
    print(f"report: {md}\n        {html}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
