"""`sage stream ...`: make data arrive.

    sage stream replay --db PATH --stream S --data-root DIR --input FILE --time-column C --window 1d [--steps N]
    sage stream replay ... --generated-rows 1000000 --rows-per-day 100000      (GENERATED taxi-like rows)
    sage stream generate --rows N --out FILE.csv|.parquet                       (GENERATED taxi-like rows)

`replay` adds one block per window of data time, on a simulated clock (back to
back) or in real time (--realtime, sleeping window/--speedup seconds per
window). Fresh blocks have zero spend; see `sage ledger status`.

Exit codes: 0 success; 2 bad input.
"""

import argparse
import datetime as dt
import sys

from ._exits import EXIT_BAD_INPUT, EXIT_OK
from ._keys import add_key_file, ledger_location

GENERATED_NOTE = "GENERATED taxi-like data (fitted to the real Chicago taxi rows; not real trips)"


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "stream",
        help="replay a data set as a live stream; generate taxi-like data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="stream_command", metavar="ACTION")
    sub.required = True

    p = sub.add_parser("replay", help="add a historical data set's blocks one window at a time")
    p.add_argument("--db", required=True, type=ledger_location, help="ledger file path (SQLite) or postgresql:// URL")
    add_key_file(p)
    p.add_argument("--stream", required=True)
    p.add_argument("--data-root", required=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="CSV, TFRecord or Parquet file to replay")
    src.add_argument("--taxi", choices=("simple", "big_tipper", "external"), help="a real taxi data set")
    src.add_argument("--generated-rows", type=int, help="replay this many GENERATED taxi-like rows")
    p.add_argument("--rows-per-day", type=int, default=100_000, help="generated stream rate")
    p.add_argument("--seed", type=int, default=0, help="generator seed")
    p.add_argument("--format", choices=("csv", "tfrecord", "parquet"))
    p.add_argument("--time-column", default="trip_start_timestamp")
    p.add_argument("--window", default="1d")
    p.add_argument("--steps", type=int, help="stop after this many blocks (default: all)")
    p.add_argument("--realtime", action="store_true", help="sleep between blocks (data time / --speedup)")
    p.add_argument(
        "--speedup",
        type=float,
        default=86400.0,
        help="real-time replay speed: data seconds per wall second (default: a day per second)",
    )
    p.set_defaults(func=_replay)

    p = sub.add_parser("generate", help="write GENERATED taxi-like rows (fitted to the real taxi data)")
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--out", required=True, help=".csv or .parquet path")
    p.add_argument("--rows-per-day", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", default="2017-01-01", help="first day (YYYY-MM-DD)")
    p.set_defaults(func=_generate)


def _replay(args):
    from sage_tfx.ingest.records import format_columns
    from sage_tfx.ingest.replay import Replay
    from sage_tfx.privacy import Ledger, LedgerError

    try:
        with Ledger.open(args.db) as ledger:
            if args.generated_rows is not None:
                from sage_tfx.data.generator import TaxiGenerator

                print(f"replaying {GENERATED_NOTE}", file=sys.stderr)
                table = TaxiGenerator(seed=args.seed, rows_per_day=args.rows_per_day).table(args.generated_rows)
                replay = Replay(
                    ledger, args.stream, args.data_root, table, args.time_column, args.window, generated=True
                )
            else:
                path = args.input
                if args.taxi:
                    from sage_tfx.data.taxi import taxi_csv_path

                    path = taxi_csv_path(args.taxi)
                replay = Replay.from_file(
                    ledger, args.stream, args.data_root, path, args.time_column, args.window, fmt=args.format
                )
                print(f"stream {args.stream}: columns as stored (the stream keeps these types):")
                print("\n".join(format_columns(replay.columns, args.time_column)), flush=True)
            label = " (GENERATED)" if replay.generated else ""

            def show(step):
                state = "added, zero spend" if step.added else "already present"
                print(f"block {step.block}{label}: {state}; clock {_iso(step.clock)}", flush=True)

            steps = replay.run(steps=args.steps, realtime=args.realtime, speedup=args.speedup, on_step=show)
    except (ValueError, LedgerError, OSError) as exc:
        print(f"sage stream replay: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"replayed {len(steps)} block(s){label}; {replay.remaining} window(s) left", file=sys.stderr)
    return EXIT_OK


def _generate(args):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from sage_tfx.data.generator import TaxiGenerator

    try:
        gen = TaxiGenerator(seed=args.seed, rows_per_day=args.rows_per_day, start=args.start)
        if not args.out.endswith((".csv", ".parquet")):
            raise ValueError(f"output {args.out!r} must end in .csv or .parquet")
        writer = None
        for batch in gen.chunks(args.rows):
            if writer is None:
                writer = (
                    pacsv.CSVWriter(args.out, batch.schema)
                    if args.out.endswith(".csv")
                    else pq.ParquetWriter(args.out, batch.schema)
                )
            writer.write(batch)
        if writer is not None:
            writer.close()
    except (ValueError, OSError) as exc:
        print(f"sage stream generate: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {args.rows} rows of {GENERATED_NOTE} to {args.out} (column generated=1)")
    return EXIT_OK


def _iso(ts):

    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M")
