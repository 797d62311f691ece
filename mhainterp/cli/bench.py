"""``mhainterp bench``: how fast is training, caching and ablation here, against the references.

Same options as ``python -m mhainterp.bench`` (see :mod:`mhainterp.bench`).
"""

from __future__ import annotations

import argparse

__all__ = ["register"]

EPILOG = """\
examples:
  mhainterp bench --out runs/bench                  the full benchmark (several minutes)
  mhainterp bench --quick --out runs/bench_quick    a smoke test (numbers not meaningful)
  mhainterp bench --sections train --steps 300      only training throughput, longer runs
  mhainterp bench --job-demo --out runs/bench       also time `mhainterp demo` (minutes)
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` command."""
    from mhainterp.bench import add_arguments

    parser = subparsers.add_parser(
        "bench",
        help="benchmark training, caching and ablation against the references",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure, in one run with interleaved repeats and medians: training "
        "throughput (model-steps/s) of the seed-000 reference loop, mhainterp's train(), "
        "mhainterp's batched whole-sweep training and TransformerLens's boot_native model; "
        "achieved GFLOP/s against the measured fp32 matmul peak; run_with_cache (patterns) "
        "against a plain forward; batched against naive single-head ablation. Writes "
        "bench.csv and bench.md to --out.",
        epilog=EPILOG,
    )
    add_arguments(parser)
    parser.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from mhainterp.bench import run_from_args

    return run_from_args(args, echo=print)
