"""`sage simulate --semantics`: pipelines granted under event, user-time and user DP (``simulate.semantics``)."""

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ._exits import EXIT_BAD_INPUT, EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the semantics comparison (with --rates, --hours, --seed, --set, --plot, --json)."""
    p.add_argument(
        "--semantics",
        action="store_true",
        help="instead of the sweep: pipelines granted under event, user-time and user DP at each of "
        "--rates over --hours (PrivateKube's macrobenchmark shape; docs/simulation.md)",
    )
    p.add_argument("--units", type=int, default=200_000, help="--semantics: units making the stream's rows")
    p.add_argument(
        "--max-rows-per-unit",
        type=int,
        default=3,
        help="--semantics: K, a unit's rows kept per block (user-time) or for all time (user DP)",
    )
    p.add_argument("--shards", type=int, default=64, help="--semantics: user DP's blocks of units")
    p.add_argument(
        "--pipeline-epsilon",
        type=float,
        default=0.1,
        help="--semantics: what every pipeline asks of each block it reads",
    )
    p.add_argument(
        "--timeout-h", type=int, default=24, help="--semantics: hours a pipeline waits for its grant before it gives up"
    )


def run(args: argparse.Namespace, parse_config: Callable[[list], Any]) -> int:
    """Run the comparison; print a table (or JSON), write --plot. EXIT_BAD_INPUT, before anything runs, for a bad
    workload or unit parameter (``parse_config``: `sage simulate`'s parser of --set; --rates is parsed by
    argparse)."""
    from sage_tfx.simulate import semantics

    try:
        rates, config = args.rates, parse_config(args.set)
        if args.hours < 1:
            raise ValueError(f"--hours {args.hours} must be >= 1")
        units = semantics.UnitConfig(
            units=args.units,
            max_rows=args.max_rows_per_unit,
            shards=args.shards,
            pipeline_epsilon=args.pipeline_epsilon,
            timeout_h=args.timeout_h,
        )
    except ValueError as exc:
        print(f"sage simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rows = semantics.compare_semantics(rates, args.hours, args.seed, config, units)
    if args.plot:
        semantics.plot_semantics(rows, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps({"config": config.to_dict(), "results": rows}, indent=2))
        return EXIT_OK
    print(f"{'semantics':10s} {'rate/h':>6s} {'granted':>8s} {'of':>6s} {'rows/block':>10s} {'eps/row':>8s}")
    for r in rows:
        print(
            f"{r['semantics']:10s} {r['rate']:6g} {r['granted']:8d} {r['pipelines']:6d} {r['rows_per_block']:10d} "
            f"{r['per_row_epsilon']:8.4g}"
        )
    return EXIT_OK
