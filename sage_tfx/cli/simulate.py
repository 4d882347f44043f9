"""`sage simulate`: the load simulation of paper Fig. 8 (model release time under increasing load)."""

import json
import sys
from dataclasses import fields

from sage_tfx import comma_lists
from sage_tfx.privacy.vocabulary import Accounting, Policy

from . import _simulate_semantics as simulate_semantics
from ._exits import EXIT_BAD_INPUT, EXIT_OK


def add_parser(subparsers):
    p = subparsers.add_parser(
        "simulate",
        help="simulate arriving pipelines on one stream: release time per budgeting strategy (Fig. 8)",
        description="Discrete-event simulation (no model training) of pipelines arriving on a stream with "
        "global eps = 1, comparing query composition, streaming composition, Block/Aggressive, "
        "Block/Conserve and Block/Conserve with RDP accounting. Block strategies charge the real "
        "ledger (a temporary SQLite file). See docs/simulation.md.",
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument(
        "--rates",
        type=comma_lists.positive_numbers,
        default="0.1,0.3,0.5,0.7,1.0,1.5",
        help="arrival rates, pipelines per hour",
    )
    p.add_argument("--hours", type=int, default=240, help="hours of arrivals measured (default 240)")
    p.add_argument("--warmup", type=int, default=48, help="first hours excluded from the measured cohort")
    p.add_argument("--drain", type=int, default=96, help="extra hours simulated for the cohort to finish")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="run the sweep for seeds SEED..SEED+N-1 and report each cell's median and min-max over "
        "them (the plot draws the spread; the rate search uses SEED only)",
    )
    p.add_argument(
        "--strategies", type=comma_lists.names, default=None, help="comma-separated subset (default: all five)"
    )
    p.add_argument("--plot", default=None, metavar="FILE.png", help="write the release-time plot")
    p.add_argument(
        "--no-search",
        action="store_true",
        help="skip the search for each strategy's highest rate with mean release under 24 h",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PARAM=VALUE",
        help="override a workload parameter (e.g. --set epsilon_start=0.0625; see docs/simulation.md)",
    )
    p.add_argument(
        "--compare-policies",
        action="store_true",
        help="instead of the sweep: every registered allocation policy (conserve, aggressive, dpf-n, "
        "dpf-t, dpack) on the Fig. 8 workload at --fig8-rate and on a mice/elephants workload after "
        "PrivateKube's microbenchmark (docs/simulation.md)",
    )
    p.add_argument("--fig8-rate", type=float, default=1.5, help="--compare-policies: Fig. 8 arrival rate per hour")
    p.add_argument(
        "--fig8-n",
        type=int,
        default=16,
        help="--compare-policies: arrivals that unlock a block (DPF-N, DPack; DPF-T: n/rate hours)",
    )
    p.add_argument(
        "--micro-rate",
        type=float,
        default=128.0,
        help="--compare-policies: microbenchmark arrivals per hour (one block per hour)",
    )
    p.add_argument("--micro-n", type=int, default=400, help="--compare-policies: microbenchmark unlocking n")
    p.add_argument("--micro-hours", type=int, default=30, help="--compare-policies: microbenchmark hours of arrivals")
    p.add_argument(
        "--micro-accounting",
        choices=tuple(Accounting),
        default=Accounting.BASIC,
        help="--compare-policies: microbenchmark filters (rdp: heterogeneous Renyi curves)",
    )
    simulate_semantics.add_arguments(p)
    p.set_defaults(func=_run)


def _config(overrides):

    from sage_tfx.simulate import SimConfig

    known = {f.name: f.type for f in fields(SimConfig)}
    values = {}
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep or name not in known:
            raise ValueError(f"--set {item!r}: use PARAM=VALUE with PARAM one of {', '.join(sorted(known))}")
        try:
            values[name] = int(value) if known[name] in (int, "int") else float(value)
        except ValueError:
            raise ValueError(f"--set {item!r}: {value!r} is not a number") from None
    return SimConfig(**values)


def _compare(args):

    from sage_tfx.privacy.errors import LedgerError
    from sage_tfx.simulate import compare, microbench

    try:
        config = _config(args.set)
        for name in ("fig8_rate", "micro_rate"):
            value = getattr(args, name)
            if not (value > 0 and value < float("inf")):
                raise ValueError(f"--{name.replace('_', '-')} {value!r} must be a finite number > 0")
        if args.warmup >= args.hours or min(args.warmup, args.drain) < 0:
            raise ValueError(f"--warmup {args.warmup} must be >= 0 and shorter than --hours {args.hours}")
        micro = microbench.MicroConfig(rate=args.micro_rate, hours=args.micro_hours, accounting=args.micro_accounting)
        from sage_tfx.privacy.allocation import get_policy

        for n in (args.fig8_n, args.micro_n):
            get_policy(Policy.DPF_N.value, {"n": n})
    except (ValueError, LedgerError) as exc:
        print(f"sage simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = compare.compare(
        fig8_rate=args.fig8_rate,
        fig8_n=args.fig8_n,
        micro_n=args.micro_n,
        hours=args.hours,
        warmup=args.warmup,
        drain=args.drain,
        seed=args.seed,
        config=config,
        micro_config=micro,
    )
    if args.plot:
        compare.plot(result, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return EXIT_OK
    for workload, count, mean in (
        ("fig8", "released", "mean_release_h"),
        ("microbenchmark", "granted", "mean_delay_h"),
    ):
        print(f"{workload}:")
        for r in result[workload]["results"]:
            print(f"  {r['policy']:12s} {r[count]:6d} / {r['pipelines']:<6d} mean {r[mean]:.2f} h")
    return EXIT_OK


def _run(args):

    if args.compare_policies or args.semantics:
        return _compare(args) if args.compare_policies else simulate_semantics.run(args, _config)

    from sage_tfx.simulate import sweep as sw

    try:
        rates, strategies, config = _sweep_options(args)
    except ValueError as exc:
        print(f"sage simulate: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    common = (args.hours, args.seed, config, args.warmup, args.drain)
    rows = sw.sweep(strategies, rates, *common)
    by_seed = {args.seed: rows}
    for seed in range(args.seed + 1, args.seed + args.seeds):
        print(f"seed {seed}:", file=sys.stderr)
        by_seed[seed] = sw.sweep(strategies, rates, args.hours, seed, config, args.warmup, args.drain)
    search = {}
    if not args.no_search:
        for strategy in strategies:
            print(f"searching the highest rate {strategy} sustains with mean release < 24 h:", file=sys.stderr)
            best, bracket, runs = sw.max_sustainable_rate(strategy, rows, *common)
            search[strategy] = {"max_rate": best, "bracket": list(bracket), "runs": runs}
    cells = sw.spread(by_seed) if args.seeds > 1 else None
    if args.plot:
        title = f"Release time under load (eps_g = {config.epsilon:g}, {config.rows_per_hour} records/h, " + (
            f"seeds {args.seed}-{args.seed + args.seeds - 1})" if cells else f"seed {args.seed})"
        )
        (sw.plot_spread(cells, args.plot, title) if cells else sw.plot(rows, args.plot, title))
        print(f"plot written to {args.plot}", file=sys.stderr)

    result = {
        "config": config.to_dict(),
        "hours": args.hours,
        "warmup": args.warmup,
        "drain": args.drain,
        "seed": args.seed,
        "rates": rates,
        "results": rows,
        "max_rate_mean_under_24h": {s: v["max_rate"] for s, v in search.items()},
        "search": search,
    }
    if cells:
        result.update(seeds=list(by_seed), spread=cells, results_by_seed={str(k): v for k, v in by_seed.items()})
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return EXIT_OK
    _print_table(rows, cells, search)
    return EXIT_OK


def _sweep_options(args):
    """(rates, strategies, config) of a sweep, every option checked (ValueError naming it)."""
    from sage_tfx.simulate import STRATEGIES

    rates = args.rates
    strategies = STRATEGIES if args.strategies is None else tuple(args.strategies)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"--strategies: unknown {', '.join(unknown)} (use {', '.join(STRATEGIES)})")
    config = _config(args.set)
    for name in ("hours", "warmup", "drain"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name} {getattr(args, name)} must be >= 0")
    if args.seeds < 1:
        raise ValueError(f"--seeds {args.seeds} must be >= 1")
    if args.warmup >= args.hours:
        raise ValueError(f"--warmup {args.warmup} must be shorter than --hours {args.hours}")
    return rates, strategies, config


def _print_table(rows, cells, search):
    """The sweep's table: each (strategy, rate)'s release times, the spread over seeds, the highest rates found."""
    from sage_tfx.simulate import LABELS

    print(f"{'strategy':24s} {'rate/h':>6s} {'mean h':>9s} {'median h':>9s} {'p90 h':>8s} {'released':>9s}")
    for r in rows:
        mean = (
            "overload"
            if r.get("overloaded_at_h") is not None
            else (">=" if r["mean_is_lower_bound"] else "") + f"{r['mean_release_h']:.1f}"
        )
        print(
            f"{LABELS[r['strategy']]:24s} {r['rate']:6g} {mean:>9s} {r['median_release_h']:9.1f} "
            f"{r['p90_release_h']:8.1f} {r['released']:9.0%}"
        )
    for c in cells or ():
        print(
            f"{LABELS[c['strategy']]:24s} {c['rate']:6g} median {c['median_h']:.1f} h over {len(c['seeds'])} seeds "
            f"(min {c['min_h']:.1f}, max {c['max_h']:.1f}; {c['overloaded']} overloaded)"
        )
    for strategy, v in search.items():
        best = "none of the rates tried" if v["max_rate"] is None else f"{v['max_rate']:g}/h"
        print(f"highest rate with mean release < 24 h, {LABELS[strategy]}: {best} (bracket {v['bracket']})")
