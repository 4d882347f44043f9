"""Ingest rows/s on GENERATED taxi-like data vs a plain Beam read-encode-write of the same records."""

import os
import shutil
import sys
import tempfile
import time


def add_arguments(parser):
    parser.add_argument("--rows", type=int, default=1_000_000, help="GENERATED rows to ingest (default 1M)")
    parser.add_argument("--rows-per-day", type=int, default=100_000, help="generated rate; 1d blocks")
    parser.add_argument("--seed", type=int, default=0)


def _say(line):
    print(f"bench ingest: {line}", file=sys.stderr, flush=True)


def _baseline(path, out_dir, schema):
    """A plain Beam pipeline: the same reader and tf.Example encoder, Beam's own gzip TFRecord sink."""
    import apache_beam as beam

    from sage_tfx.ingest.pipeline import _dofns, beam_options
    from sage_tfx.ingest.records import encode

    ReadBatches, _ = _dofns()
    with beam.Pipeline(options=beam_options([])) as p:
        _ = (
            p
            | beam.Create([path])
            | beam.ParDo(ReadBatches({path: "csv"}, schema, 65536))
            | beam.FlatMap(lambda batch: encode(batch, schema))
            | beam.io.WriteToTFRecord(os.path.join(out_dir, "part"), file_name_suffix=".tfrecord.gz")
        )


def run(args):
    from sage_tfx.ingest.pipeline import ingest
    from sage_tfx.ingest.records import infer_schema
    from sage_tfx.privacy import Ledger

    work = tempfile.mkdtemp(prefix="sage-bench-ingest-")
    try:
        _say(f"generating {args.rows} GENERATED taxi-like rows (fitted to the real Chicago taxi data)")
        path = _make_csv(os.path.join(work, "generated.csv"), args.rows, args)
        warm = _make_csv(os.path.join(work, "warm.csv"), 20_000, args)
        schema = infer_schema(path, "csv")
        db = os.path.join(work, "ledger.db")
        with Ledger.open(db, create=True) as ledger:
            ledger.create_stream("warm", 1.0, 1e-6)
            ledger.create_stream("bench", 1.0, 1e-6)

        # Warm-up pays one-time costs (imports, encoder set-up) for both paths.
        _baseline(warm, os.path.join(work, "warm-out"), schema)
        ingest(
            db,
            "warm",
            warm,
            os.path.join(work, "data"),
            time_column="trip_start_timestamp",
            window="1d",
            progress=False,
        )
        base_s = _timed(
            "baseline (read + encode + Beam WriteToTFRecord)",
            lambda: _baseline(path, os.path.join(work, "baseline-out"), schema),
        )
        result = {}
        ingest_s = _timed(
            "sage ingest (blocks + commit + ledger)",
            lambda: result.update(
                ingest(
                    db,
                    "bench",
                    path,
                    os.path.join(work, "data"),
                    time_column="trip_start_timestamp",
                    window="1d",
                    progress=False,
                    allow_duplicate_of=("warm",),
                )
            ),
        )  # the warm-up's rows may repeat the first days
        with Ledger.open(db) as ledger:
            registered = sum(ledger.private_row_count("bench", b.id) for b in ledger.blocks("bench"))
        if registered != args.rows:
            raise RuntimeError(f"ingest registered {registered} rows, expected {args.rows}")
        return {
            "data": "GENERATED taxi-like rows (fitted to the real Chicago taxi data)",
            "rows": args.rows,
            "blocks": len(result["added"]),
            "runner": "DirectRunner",
            "seconds": round(ingest_s, 2),
            "baseline_seconds": round(base_s, 2),
            "rows_per_second": round(args.rows / ingest_s, 1),
            "baseline_rows_per_second": round(args.rows / base_s, 1),
            "ratio": round(base_s / ingest_s, 3),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _make_csv(path, rows, args):
    """``rows`` GENERATED taxi-like rows (``args.seed``, ``args.rows_per_day``) written to the CSV file ``path``."""
    import pyarrow.csv as pacsv

    from sage_tfx.data.generator import TaxiGenerator

    gen = TaxiGenerator(seed=args.seed, rows_per_day=args.rows_per_day)
    writer = None
    for batch in gen.chunks(rows):
        writer = writer or pacsv.CSVWriter(path, batch.schema)
        writer.write(batch)
    writer.close()
    return path


def _timed(label, fn):
    """Seconds ``fn()`` takes, said before and after."""
    _say(f"running {label}")
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    _say(f"{label}: {seconds:.1f} s")
    return seconds
