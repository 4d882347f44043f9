"""`sage init-pipeline DIR`: write a pipeline file, a preprocessing module and a trainer module to start from.

The schema comes from a stream (--data-root and --stream: its public _stream.json) or from a data file
(--input). The files run as written (`sage run DIR/pipeline.py --check ...` passes on the stream) but
hold placeholder PUBLIC bounds to edit. Existing files are never overwritten without --force.

Features: the numeric columns, never the label, the time column (the stream's, --time-column, or a column
--input types as a timestamp or date), a --label-source column, nor a column whose name overlaps the label's.
Category codes (--categorical, or an int column of --input with 3 to 20 distinct values in its first rows)
are one-hot encoded over a public list of codes. Rows with a missing label are dropped, never filled.

Exit codes: 0 written, 2 bad input (nothing written).
"""

import argparse
import os
import sys

from sage_tfx.privacy.vocabulary import BlockState, Metric

from ._exits import EXIT_BAD_INPUT, EXIT_OK

PLACEHOLDER_CODES = [0, 1, 2]  # --categorical COL without a file to read its codes from: EDIT in the file


def add_parser(subparsers):
    p = subparsers.add_parser(
        "init-pipeline",
        help="write a pipeline of your own to start from (3 files)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("directory", help="where to write pipeline.py, preprocessing.py and trainer.py")
    p.add_argument("--label", required=True, help="the label column (numeric)")
    p.add_argument("--metric", required=True, choices=[m.value for m in Metric if m is not Metric.CUSTOM])
    p.add_argument(
        "--loss-bound",
        type=float,
        default=None,
        help="public bound B each example's loss is clipped to (mse, mae; log_loss defaults to ln 1e7)",
    )
    p.add_argument("--data-root", help="with --stream: take the schema of an ingested stream")
    p.add_argument("--stream")
    p.add_argument(
        "--db",
        help="with --stream: the ledger, READ only, to fit the first window and state the epsilon "
        "plan its budget allows (default: the window fits the data root's blocks)",
    )
    p.add_argument("--input", help="or: take the schema of a data file (CSV, TFRecord or Parquet)")
    p.add_argument("--time-column", help="with --input: the time column, left out of the features")
    p.add_argument(
        "--label-source",
        action="append",
        default=[],
        metavar="COL",
        help="a column the label is computed from, or computed from it: never a feature (repeatable)",
    )
    p.add_argument(
        "--categorical",
        action="append",
        default=[],
        metavar="COL",
        help="an int column of category codes: one-hot encoded, not a number (repeatable)",
    )
    p.add_argument("--name", help="the pipeline's name (default: the directory's name)")
    p.add_argument("--force", action="store_true", help="overwrite existing files")
    p.set_defaults(func=_run)


def _schema(args):
    if args.input and (args.data_root or args.stream):
        raise ValueError("give the schema's source once: --data-root with --stream, or --input")
    if args.input:
        from sage_tfx.ingest.records import infer_schema, input_format

        return infer_schema(args.input, input_format(args.input, None)), args.time_column
    if not (args.data_root and args.stream):
        raise ValueError("give --data-root and --stream (an ingested stream's schema) or --input FILE")
    from sage_tfx.components.transform_utils import stream_schema
    from sage_tfx.ingest.layout import stream_config

    config = stream_config(args.data_root, args.stream) or {}
    blocks = config.get("blocks") or {}
    return stream_schema(args.data_root, args.stream), blocks.get("column") if blocks.get("by") == "time" else None


def _stream_blocks(args):
    """(active blocks, AttemptPlan or None) of the stream, for the template's window and epsilon plan: from the
    ledger (--db, read only) when given, else the block folders of the data root; (None, None) for --input."""

    from sage_tfx.ingest.layout import read_manifest, stream_dir
    from sage_tfx.pipelines.template import window_defaults

    if not args.stream:
        if args.db:
            raise ValueError("--db needs --stream (and --data-root): the plan is of a stream's budget")
        return None, None
    if not args.db:
        root = stream_dir(args.data_root, args.stream)
        return sum(1 for d in os.listdir(root) if read_manifest(os.path.join(root, d)) is not None), None
    from sage_tfx.pipelines.check import stream_plan
    from sage_tfx.privacy import Ledger

    with Ledger.open(args.db, check_head=False) as ledger:
        blocks = len(ledger.blocks(args.stream, BlockState.ACTIVE))
        defaults, _ = window_defaults(blocks)
        name = args.name or os.path.basename(os.path.abspath(args.directory)).replace("-", "_")
        return blocks, stream_plan(ledger, args.stream, name, defaults)


def _run(args):
    from sage_tfx.pipelines.template import inspect_input, plan_features, write_template

    try:
        schema, time_column = _schema(args)
        blocks, plan = _stream_blocks(args)
        times, seen = inspect_input(args.input, schema, args.label, args.categorical) if args.input else ([], {})
        times = [t for t in [time_column, *times] if t]
        categories = {c: seen[c] for c in seen if c not in args.label_source}
        categories.update({c: seen.get(c, PLACEHOLDER_CODES) for c in args.categorical})
        _, categories, left_out = plan_features(
            schema, args.label, time_columns=times, label_sources=args.label_source, categories=categories
        )
        paths = write_template(
            args.directory,
            schema,
            args.label,
            args.metric,
            name=args.name,
            loss_bound=args.loss_bound,
            time_columns=times,
            label_sources=args.label_source,
            categories=categories,
            force=args.force,
            blocks=blocks,
            plan=plan,
        )
    except (ValueError, OSError) as exc:
        print(f"sage init-pipeline: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for path in paths:
        print(f"wrote {path}")
    print(f"rows whose label {args.label!r} is missing are dropped (never filled), as the validator skips them")
    for column, why in left_out.items():
        print(f"not a feature: {column} ({why})")
    for column, codes in categories.items():
        print(f"one-hot: {column}, codes {codes} (EDIT them in preprocessing.py to the public list)")
    print(
        "next: edit the PUBLIC bounds they hold, then `sage run "
        f"{paths[0]} --check --db LEDGER --stream STREAM --data-root DATA` (spends nothing)"
    )
    return EXIT_OK
