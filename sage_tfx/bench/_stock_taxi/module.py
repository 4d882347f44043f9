"""preprocessing_fn and run_fn of the stock baseline: taxi_regression's features and linear model, without privacy.

The same features as pipelines/modules/taxi_preprocessing.py (the hour's mean speed exact, by tf.Transform's own
analyzers) and the same model as taxi_regression's "linear" (a linear regression of trip seconds on
dist_scaled, hour_of_day_speed and expected_hours, fitted by least squares); exported as TFX's taxi example
does, with the transform graph in a serving signature that takes raw tf.Examples. Imports nothing of sage_tfx.
"""

import numpy as np
import tensorflow as tf  # noqa: TID253
import tensorflow_transform as tft  # noqa: TID253

LABEL = "trip_seconds"
FEATURES = ["dist_scaled", "hour_of_day_speed", "expected_hours"]
MAX_MILES, MAX_MPH, MIN_MPH, MAX_SECONDS, HOURS = 100.0, 100.0, 1.0, 3600.0, 24


def _fill(x, default):
    if isinstance(x, tf.SparseTensor):
        x = tf.sparse.to_dense(tf.SparseTensor(x.indices, x.values, [x.dense_shape[0], 1]), default)
    return tf.reshape(x, [-1])


def preprocessing_fn(inputs):
    miles = tf.clip_by_value(tf.cast(_fill(inputs["trip_miles"], 0), tf.float32), 0.0, MAX_MILES)
    seconds = tf.cast(_fill(inputs["trip_seconds"], 0), tf.float32)
    hour = tf.clip_by_value(tf.cast(_fill(inputs["trip_start_hour"], 0), tf.int64), 0, HOURS - 1)
    mph = tf.clip_by_value(miles / (tf.maximum(seconds, 1.0) / 3600.0), 0.0, MAX_MPH)
    one_hot = tf.one_hot(hour, HOURS)
    sums = tft.sum(one_hot * (mph / MAX_MPH)[:, None], reduce_instance_dims=False)
    counts = tft.sum(one_hot, reduce_instance_dims=False)
    speed_01 = tf.gather(tf.math.divide_no_nan(sums, counts), hour)
    hourly_mph = tf.maximum(speed_01 * MAX_MPH, MIN_MPH)
    return {
        "dist_scaled": miles / MAX_MILES,
        "hour_of_day_speed": speed_01,
        "expected_hours": tf.minimum(miles / hourly_mph, 1.0),
        LABEL: tf.clip_by_value(seconds, 0.0, MAX_SECONDS),
    }


def _read(files, spec):
    dataset = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(8192)
    columns = {k: [] for k in spec}
    for batch in dataset.map(lambda b: tf.io.parse_example(b, spec)).as_numpy_iterator():
        for k in spec:
            columns[k].append(batch[k].reshape(-1))
    return {k: np.concatenate(v) for k, v in columns.items()}


def run_fn(fn_args):
    transform = tft.TFTransformOutput(fn_args.transform_output)
    spec = {k: v for k, v in transform.transformed_feature_spec().items() if k in FEATURES + [LABEL]}
    data = _read([f for pattern in fn_args.train_files for f in tf.io.gfile.glob(pattern)], spec)
    x = np.stack([data[k] for k in FEATURES] + [np.ones_like(data[LABEL])], axis=1).astype(np.float64)
    weights, *_ = np.linalg.lstsq(x, data[LABEL].astype(np.float64), rcond=None)

    inputs = {k: tf.keras.Input(shape=(1,), name=k) for k in FEATURES}
    dense = tf.keras.layers.Dense(1)
    model = tf.keras.Model(inputs, dense(tf.keras.layers.Concatenate()([inputs[k] for k in FEATURES])))
    dense.set_weights([weights[:-1].reshape(-1, 1).astype(np.float32), weights[-1:].astype(np.float32)])
    model.tft_layer = transform.transform_features_layer()
    raw_spec = {k: v for k, v in transform.raw_feature_spec().items() if k != LABEL}

    @tf.function(input_signature=[tf.TensorSpec(shape=[None], dtype=tf.string, name="examples")])
    def serve(serialized):
        features = model.tft_layer(tf.io.parse_example(serialized, raw_spec))
        return {"predictions": model({k: tf.reshape(features[k], [-1, 1]) for k in FEATURES})}

    tf.saved_model.save(model, fn_args.serving_model_dir, signatures={"serving_default": serve})
