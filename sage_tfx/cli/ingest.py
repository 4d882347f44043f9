"""`sage ingest`: read CSV, TFRecord (tf.Example) or Parquet with Beam, write blocks, register them.

    sage ingest --db PATH --stream S --input FILE --data-root DIR --block-by time --time-column C --window 1d
    sage ingest ... --block-by user --user-column C --shards N

Blocks land in DATA_ROOT/STREAM/BLOCK_ID/part-*.sealed (encrypted, docs/security.md) and are registered
in the ledger with their exact row count (kept private there) and content digest
(an HMAC under a key derived from the ledger's key).
Re-ingesting the same input adds nothing. Unknown options (e.g.
--direct_num_workers) go to Beam; the default runner is the DirectRunner.
Distributed: --runner dask --dask-address HOST:PORT, or --direct_running_mode=multi_processing
--direct_num_workers=N (docs/scale_out.md). Inputs may be URLs of any Beam filesystem
(--input 'gs://bucket/trips-*.csv'). --staging-location URL_OR_DIR (gs://B/P, s3://B/P,
hdfs://H/P or a folder outside the data root) is where the workers write the run's sealed
part files: then only this process touches the data root (it copies the parts in, checks
their digests, and deletes the staged run); default DATA_ROOT/STREAM/_staging.

Refused, naming the file, column and row: a header naming a column twice, a quote
that never closes on its line, inf or nan in an int or float column, an int of 2^53
or more in magnitude (CSV parsing already rounds beyond it), a time outside [1000-01-01, 9000-01-01) UTC
(e.g. milliseconds), and blocks whose records another stream already registered (they
would get a fresh budget; --allow-duplicate-of-stream). Refused before anything is read:
a --window that is not a whole number of seconds > 0, or longer than 364877d (about
999 years: every block of a record time in the range above then is a date range).
Rounded, not refused: a float column is stored as tf.Example's 32-bit floats (as TFX's
CsvExampleGen stores it), about 7 significant digits, so 33554433 is stored as 33554432
and 17031832200.0 as 17031832576.0; keep exact whole numbers (ids, unix times) in an
int column (written without a decimal point), exact below 2^53 in magnitude.
Typed, and printed per column: every path that reads a file (ingest, `sage stream
replay`, `sage serve --input`) types it alike; a stream keeps the types of its first
ingest. ISO 8601 date-times become int unix seconds (no offset: read as UTC; a
fraction of a second is refused), ISO dates stay text, true/false become 1/0.
A refused ingest leaves nothing: no ledger change, no block, no _staging folder.
Staging folders of killed ingests are removed at the next ingest of the stream
(each live ingest holds a lock on its own folder; see sage_tfx/ingest/staging.py).

Exit codes: 0 success; 2 bad input (nothing registered).
"""

import argparse
import sys

from ._exits import EXIT_BAD_INPUT, EXIT_OK
from ._keys import add_key_file, ledger_location


def add_parser(subparsers):
    p = subparsers.add_parser(
        "ingest",
        help="ingest a data set into ledger-registered blocks (Beam)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", required=True, type=ledger_location, help="ledger file path (SQLite) or postgresql:// URL")
    add_key_file(p)
    p.add_argument("--stream", required=True, help="stream name (create it with `sage ledger init`)")
    p.add_argument(
        "--input",
        required=True,
        action="append",
        help="input file or glob (repeatable); each file is read by one Beam worker",
    )
    p.add_argument("--data-root", required=True, help="directory holding the blocks")
    p.add_argument("--format", choices=("csv", "tfrecord", "parquet"), help="default: from the file name")
    p.add_argument("--block-by", choices=("time", "user"), default="time")
    p.add_argument("--time-column", help="unix seconds or ISO 8601 time of each record")
    p.add_argument("--window", help="time block length: e.g. 1h, 1d, 30m, 1w (whole seconds, at most 364877d)")
    p.add_argument("--user-column", help="the user of each record (for --block-by user)")
    p.add_argument("--shards", type=int, help="number of user shards (blocks)")
    p.add_argument("--hash-key", help="key of the user-shard hash (default: the stream name)")
    p.add_argument(
        "--allow-duplicate-of-stream",
        action="append",
        default=[],
        metavar="STREAM",
        help="register blocks whose records stream STREAM already holds (refused by default: the copy "
        "gets a fresh budget here, so a person's loss adds up across both streams); repeatable",
    )
    p.add_argument(
        "--staging-location",
        metavar="URL_OR_DIR",
        help="where Beam workers write the run's sealed part files and part list: a Beam FileSystems URL "
        "(gs://, s3://, hdfs://) or a folder outside the data root; the workers then need no access "
        "to the data root (default: DATA_ROOT/STREAM/_staging; docs/scale_out.md)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--runner",
        help="Beam runner (default DirectRunner; `dask` = Beam's DaskRunner, see "
        "docs/scale_out.md); other Beam options pass through",
    )
    p.add_argument(
        "--dask-address",
        help="with --runner dask: the Dask scheduler (host:port or tcp://...); "
        "default: Dask starts a LocalCluster of its own",
    )
    p.set_defaults(func=run)
    pass_unknown_to_beam(p)


def pass_unknown_to_beam(parser):
    """Let `parser` collect options it does not know into ``args.beam_args`` (standard Beam options)."""
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        ns, extra = original(args, namespace)
        ns.beam_args = list(getattr(ns, "beam_args", None) or []) + list(extra)
        return ns, []

    parser.parse_known_args = parse_known_args


def run(args, beam_args=None):
    from sage_tfx.ingest.pipeline import ingest
    from sage_tfx.ingest.records import format_columns
    from sage_tfx.privacy import LedgerError

    beam_args = list(beam_args if beam_args is not None else getattr(args, "beam_args", []))
    stray = [a for a in beam_args if not a.startswith("--")]
    if stray:
        print(f"sage ingest: error: unexpected argument(s) {' '.join(stray)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.runner:  # shorthands (dask, direct) are resolved by sage_tfx.ingest.pipeline.beam_options
        beam_args.append(f"--runner={args.runner}")
    if args.dask_address:
        beam_args.append(f"--dask-address={args.dask_address}")
    try:
        result = ingest(
            args.db,
            args.stream,
            args.input,
            args.data_root,
            block_by=args.block_by,
            time_column=args.time_column,
            window=args.window,
            user_column=args.user_column,
            shards=args.shards,
            hash_key=args.hash_key,
            fmt=args.format,
            beam_args=beam_args,
            progress=not args.quiet,
            allow_duplicate_of=args.allow_duplicate_of_stream,
            staging_location=args.staging_location,
        )
    except (ValueError, LedgerError, OSError) as exc:
        print(f"sage ingest: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"stream {args.stream}: columns as stored (the stream keeps these types):")
    print("\n".join(format_columns(result["columns"], args.time_column)))
    print(
        f"stream {args.stream}: {len(result['added'])} block(s) added, {len(result['unchanged'])} already "
        f"present (unchanged){_encrypted(result)}; data under {args.data_root}"
    )
    return EXIT_OK


def _encrypted(result):
    n = len(result.get("encrypted", ()))
    return f", {n} of them re-written encrypted (they were stored unencrypted)" if n else ""
