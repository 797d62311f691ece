"""Do heads specialize? h in {1, 2, 4, 8} x >= 3 seeds on multi_relation and count_previous.

For each task: train the head-count sweep (d_model 64, one attention-only layer; only h
changes), look inside the first seed of every head count (capture, similarity, ablation:
``mhainterp analyze``), the division of labour and the specialization test on every run (role
scores against the permutation and initialisation nulls, causal selectivity, redundancy,
cross-seed consistency), and write one report::

    python analysis/specialization_study.py --out runs/specialization_study
    python analysis/specialization_study.py --quick      # a small smoke run (a minute or two)

Outputs: ``OUT/<task>/`` sweep folders (with ``specialization_*.csv`` and figures),
``OUT/<task>/runs/*/analysis/`` per run, and ``OUT/report.md`` + ``OUT/report.html``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mhainterp.analyze import analyze_run, run_sweep_with_figures
from mhainterp.config import SweepConfig, TrainConfig
from mhainterp.figures.saved import save_folder_figures
from mhainterp.report import write_report
from mhainterp.specialization import DivisionSettings, SpecializationSettings, specialize_folder
from mhainterp.sweep import fastest_executor

QUICK = {"n_heads": "1,2,4", "seeds": "0,1,2", "steps": 200, "n_eval": 128}
"""--quick: 2 tasks x 3 head counts x 3 seeds, 200 steps; analyze only the largest h (seed 0)."""


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/specialization_study"))
    parser.add_argument("--tasks", default="multi_relation,count_previous")
    parser.add_argument("--n-heads", default="1,2,4,8", help="head counts")
    parser.add_argument("--seeds", default="0,1,2", help="seeds (>= 3)")
    parser.add_argument("--steps", type=int, default=2000, help="training steps per run")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument(
        "--executor", default=None, help="sweep executor (default: batched when available)"
    )
    parser.add_argument(
        "--n-eval",
        type=int,
        default=256,
        help="held-out sequences of the labels (the division of labour uses 1,024)",
    )
    parser.add_argument("--no-analyze", action="store_true", help="skip mhainterp analyze")
    parser.add_argument(
        "--analyze-eval", type=int, default=1024, help="sequences for mhainterp analyze"
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run: " + str(QUICK))
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    args.analyze_heads = None  # None: every head count
    if args.quick:
        args.n_heads, args.seeds = QUICK["n_heads"], QUICK["seeds"]
        args.steps, args.n_eval = QUICK["steps"], QUICK["n_eval"]
        args.analyze_eval, args.analyze_heads = 256, [max(_ints(args.n_heads))]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    progress = not args.quiet
    executor = args.executor or fastest_executor()
    seeds = _ints(args.seeds)
    settings = SpecializationSettings(n_eval=args.n_eval)
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        config = SweepConfig(
            task=task,
            task_params={"seq_len": 16, "d_vocab": 10},
            n_heads=_ints(args.n_heads),
            seeds=seeds,
            model={"d_model": args.d_model, "n_layers": 1},
            train=TrainConfig(steps=args.steps, warmup_steps=min(100, args.steps // 10)),
        )
        sweep_dir = args.out / task
        print(run_sweep_with_figures(config, sweep_dir, executor, progress).to_markdown())
        if not args.no_analyze:
            for h in args.analyze_heads or config.n_heads:
                run_dir = sweep_dir / "runs" / f"h{h}_seed{seeds[0]}"
                analyze_run(run_dir, n_eval=args.analyze_eval, progress=progress)
        # The division of labour of every run (on the default evaluation set), then the labels
        # on --n-eval and the sweep's tables, the division attached: what the report reads.
        # Each run is loaded once for both.
        ((_, spec),) = specialize_folder(
            sweep_dir, settings, progress=progress, division_settings=DivisionSettings()
        )
        print(spec.to_markdown())
        print("\n".join(spec.result.verdict.lines))
    save_folder_figures(args.out)  # beside the tables, for the report to embed
    md, html = write_report(args.out, settings=settings)
    print(f"report: {md}\n        {html}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
