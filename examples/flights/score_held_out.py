"""Score the model `sage run examples/flights/pipeline.py` pushed on flights the stream never held.

    python examples/flights/score_held_out.py --db ledger.db --data-root data --serving-dir work/serving \
        --held-out-from 2013-12-01

The stream holds the REAL flights scheduled before ``--held-out-from`` (``python -m sage_tfx.data.flights --out
flights.csv --until 2013-12-01``); the flights from that day on were never ingested: they are the hold-out.
This script checks that no held-out flight is a row of the blocks the ACCEPTed grant read (full-row keys, and
by time), then reports on the hold-out the MSE of the arrival delay, with and without each squared error
clipped at the SLA's bound, for:

- the pushed DP model (served from raw tf.Examples through its transform graph, as the validator reads it);
- a NON-PRIVATE least-squares fit of the same model (the same four features, with the EXACT per-carrier mean
  delay in place of the DP one, the same clipped label) on the same rows: the training split of the grant's
  blocks;
- the mean label of those rows.

It prints one JSON object. Everything here reads data without privacy: an evaluation for the docs, never part
of a pipeline.
"""

import argparse
import json
import os
import sys

import numpy as np

import sage_tfx  # noqa: F401  (before TensorFlow)

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE, STREAM, LOSS_BOUND = "flights_delay", "flights", 60.0**2


def features(columns: dict[str, "object"], carrier_means):
    """The example's four features from raw columns (numpy), with ``carrier_means`` for the fourth (17 values)."""

    sys.path.insert(0, HERE)
    from preprocessing import DELAY_RANGE, MAX_DISTANCE

    from sage_tfx.data.flights import CARRIERS

    low, high = DELAY_RANGE
    dep = (np.clip(np.nan_to_num(columns["dep_delay"]), low, high) - low) / (high - low)
    distance = np.clip(np.nan_to_num(columns["distance"]), 0, MAX_DISTANCE) / MAX_DISTANCE
    hour = np.clip(np.nan_to_num(columns["hour"]), 0, 23) / 23.0
    ids = np.array([CARRIERS.index(c) if c in CARRIERS else len(CARRIERS) for c in columns["carrier"]])
    return np.column_stack([dep, distance, hour, np.asarray(carrier_means)[ids]]), ids


def _numpy_columns(batch):
    """{name: numpy array} of a RecordBatch of one-value list columns (a missing value: NaN / None)."""

    out = {}
    for name in batch.schema.names:
        values = [v[0] if v else None for v in batch.column(name).to_pylist()]
        if values and isinstance(next((v for v in values if v is not None), 0), bytes):
            out[name] = [None if v is None else v.decode() for v in values]
        else:
            out[name] = np.array([np.nan if v is None else float(v) for v in values])
    return out


def _clipped_mse(pred, labels):

    errors = (np.asarray(pred, float) - labels) ** 2
    clipped = np.minimum(errors, LOSS_BOUND)
    return {
        "mse": float(errors.mean()),
        "clipped_mse": float(clipped.mean()),
        "clipped_mse_stderr": float(clipped.std(ddof=1) / np.sqrt(clipped.size)),
    }


def score(db, data_root, serving_dir, held_out_from):
    import pyarrow as pa
    import tensorflow as tf

    from sage_tfx.data.flights import TIME_COLUMN, load_flights, split_at
    from sage_tfx.ingest.layout import stream_config
    from sage_tfx.ingest.records import encode
    from sage_tfx.pipelines.scoring import accepted_model, block_rows, example_rows, held_out_overlap

    sys.path.insert(0, HERE)
    from preprocessing import DELAY_RANGE

    try:
        grant, model_dir = accepted_model(db, STREAM, PIPELINE, serving_dir)
    except LookupError as exc:
        raise SystemExit(str(exc)) from None
    serve = tf.saved_model.load(model_dir).signatures["serving_default"]

    schema = stream_config(data_root, STREAM)["schema"]
    _, held = split_at(load_flights(), held_out_from)
    # the stream's schema read the whole-minute columns as int: cast alike so that full-row keys compare
    held = pa.table(
        {
            name: held.column(name).cast(pa.int64()) if kind == "int" else held.column(name)
            for name, kind in schema.items()
        }
    )
    overlap = held_out_overlap(data_root, STREAM, grant.blocks, held, ledger=db)
    train = _numpy_columns(
        block_rows(
            data_root,
            STREAM,
            grant.blocks,
            split="train",
            ledger=db,
            purpose="non-private baseline on the accepted model's training split",
        )
    )
    latest_read = float(np.nanmax(train[TIME_COLUMN]))
    held_cols = _numpy_columns(example_rows(held, schema))
    y_held = held_cols["arr_delay"]

    records = list(encode(held.to_batches(max_chunksize=len(held))[0], schema)) if held.num_rows else []
    dp_pred = np.concatenate(
        [
            np.asarray(serve(examples=tf.constant(records[i : i + 4096]))["predictions"]).reshape(-1)
            for i in range(0, len(records), 4096)
        ]
    )

    # the non-private baseline: least squares with the same features (exact carrier means) on the same rows
    low, high = DELAY_RANGE
    y_train = np.clip(np.nan_to_num(train["arr_delay"]), low, high)
    _, ids = features(train, np.zeros(17))
    exact_means = np.array(
        [((y_train[ids == k] - low) / (high - low)).mean() if (ids == k).any() else 0.5 for k in range(17)]
    )
    x_train, _ = features(train, exact_means)
    x_held, _ = features(held_cols, exact_means)
    design = np.column_stack([x_train, np.ones(len(x_train))])
    coef = np.linalg.lstsq(design, y_train, rcond=None)[0]
    np_pred = np.column_stack([x_held, np.ones(len(x_held))]) @ coef
    return {
        "grant": grant.id,
        "grant_blocks": len(grant.blocks),
        "first_block": grant.blocks[0],
        "last_block": grant.blocks[-1],
        "train_rows_of_baseline": int(len(y_train)),
        "held_out_from": held_out_from,
        "held_out_flights": int(len(y_held)),
        "held_out_rows_in_granted_blocks": int(overlap),
        "latest_scheduled_time_read_before_held_out": bool(latest_read < float(np.nanmin(held_cols[TIME_COLUMN]))),
        "loss_bound": LOSS_BOUND,
        "dp_model": _clipped_mse(dp_pred, y_held),
        "nonprivate_least_squares_same_rows": _clipped_mse(np_pred, y_held),
        "mean_label_same_rows": _clipped_mse(np.full(len(y_held), y_train.mean()), y_held),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--data-root", required=True)
    parser.add_argument(
        "--serving-dir", required=True, help="the run's serving directory (sage run --work-dir W: W/serving)"
    )
    parser.add_argument(
        "--held-out-from",
        default="2013-12-01",
        help="first local day never ingested (the stream's --until); default 2013-12-01",
    )
    args = parser.parse_args(argv)
    print(json.dumps(score(args.db, args.data_root, args.serving_dir, args.held_out_from), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
