"""Score the model `sage run examples/tfx_taxi/pipeline.py` pushed on taxi trips the run never read.

    python examples/tfx_taxi/score_held_out.py --db ledger.db --data-root data --serving-dir work/serving

The stream holds the real trips of the tfx wheel's ``simple`` file that start before 2016-01-01, replayed
as daily blocks (``python examples/tfx_taxi/score_held_out.py --make-stream ...`` builds it); the trips
from 2016-01-01 on (833) are never replayed: they are the hold-out. This script checks that no held-out
trip is a row of the blocks the accepted model trained on, then reports on the hold-out:

- the pushed DP model's accuracy on TFX's label (tips > 0.2 * fare, read through the model's own
  ``transform_features`` signature, as the validator reads it);
- a NON-PRIVATE baseline fitted on the same rows: the same wide-and-deep Keras model, trained as TFX's
  original module trains it (``model.fit``, Adam 0.001, batches of 40, 5 epochs) on the training split of the
  accepted grant's blocks, featurised by the same transform graph;
- the majority class of that training split.

It prints one JSON object. Everything here reads data without privacy: it is an evaluation for the docs,
never part of a pipeline.
"""

import argparse
import json
import os
import sys

import numpy as np

import sage_tfx  # noqa: F401  (before TensorFlow)

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = "tfx_taxi"
STREAM = "taxi"


def make_stream(db, data_root, epsilon=4.0, delta=1e-5):
    """Replay the trips before the hold-out as daily blocks into a new ledger; return (blocks, rows, held out)."""
    from sage_tfx.data.taxi import TIME_COLUMN
    from sage_tfx.demos.end_to_end import stream_and_held_out
    from sage_tfx.ingest.replay import Replay
    from sage_tfx.privacy import Ledger

    stream_rows, held_out = stream_and_held_out()
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream(STREAM, epsilon, delta)
        steps = Replay(ledger, STREAM, data_root, stream_rows, TIME_COLUMN, "1d").run(steps=10**6)
    return len(steps), stream_rows.num_rows, held_out.num_rows


def _serialized(table, schema):
    from sage_tfx.ingest.records import encode

    return [r for batch in table.to_batches(max_chunksize=4096) for r in encode(batch, schema)]


def score(db, data_root, serving_dir, seed=0):
    import tensorflow as tf

    from sage_tfx.demos.end_to_end import stream_and_held_out
    from sage_tfx.ingest.layout import stream_config
    from sage_tfx.ingest.records import encode
    from sage_tfx.pipelines.scoring import accepted_model, block_rows, held_out_overlap

    sys.path.insert(0, HERE)
    import taxi_utils_native_keras as module

    try:
        grant, model_dir = accepted_model(db, STREAM, PIPELINE, serving_dir)
    except LookupError as exc:
        raise SystemExit(str(exc)) from None
    loaded = tf.saved_model.load(model_dir)
    serve, transform = loaded.signatures["serving_default"], loaded.signatures["transform_features"]

    _, held_out = stream_and_held_out()
    schema = stream_config(data_root, STREAM)["schema"]
    overlap = held_out_overlap(data_root, STREAM, grant.blocks, held_out, ledger=db)
    held = _serialized(held_out, schema)
    label = module._transformed_name(module._LABEL_KEY)

    def labels_and_features(records):
        out = transform(examples=tf.constant(records))
        return np.asarray(out[label]).reshape(-1).astype(np.float32), out

    y_held, f_held = labels_and_features(held)
    dp_pred = np.asarray(serve(examples=tf.constant(held))["outputs"]).reshape(-1)
    dp_accuracy = float(((dp_pred >= 0.5) == (y_held > 0.5)).mean())

    # the non-private baseline: TFX's own training (model.fit) on the same rows and features
    train = block_rows(
        data_root,
        STREAM,
        grant.blocks,
        split="train",
        ledger=db,
        purpose="non-private baseline: model.fit on the accepted model's training split",
    )
    train_records = list(encode(train, schema))
    y_train, f_train = labels_and_features(train_records)
    tf.keras.utils.set_random_seed(seed)
    model = module._build_keras_model(hidden_units=[100, 70, 50, 25])
    names = [layer.name for layer in model.inputs]

    def inputs(features):
        return {n: tf.cast(tf.reshape(features[n], [-1, 1]), model.get_layer(n).dtype) for n in names}

    model.fit(inputs(f_train), y_train, batch_size=40, epochs=5, verbose=0)
    np_pred = model.predict(inputs(f_held), verbose=0).reshape(-1)
    majority = float(y_train.mean() > 0.5)
    return {
        "grant": grant.id,
        "grant_blocks": len(grant.blocks),
        "held_out_trips": len(held),
        "held_out_rows_in_granted_blocks": int(overlap),
        "train_rows_of_baseline": int(len(y_train)),
        "held_out_big_tipper_rate": float(y_held.mean()),
        "accuracy": {
            "dp_model": dp_accuracy,
            "nonprivate_same_model_fit": float(((np_pred >= 0.5) == (y_held > 0.5)).mean()),
            "majority_class": float(((y_held > 0.5) == majority).mean()),
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--serving-dir", help="the run's serving directory (sage run --work-dir W: W/serving)")
    parser.add_argument(
        "--make-stream",
        action="store_true",
        help="create the ledger and replay the stream (the trips before 2016-01-01) instead",
    )
    args = parser.parse_args(argv)
    if args.make_stream:
        blocks, rows, held = make_stream(args.db, args.data_root)
        print(json.dumps({"blocks": blocks, "stream_trips": rows, "held_out_trips": held}))
        return 0
    if not args.serving_dir:
        parser.error("--serving-dir is required to score")
    print(json.dumps(score(args.db, args.data_root, args.serving_dir), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
