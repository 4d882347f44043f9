"""preprocessing_fn of the ready taxi pipelines (paper List. 1, plus one post-processed feature).

Features (every scale is a PUBLIC constant, never read from the data):
- ``dist_scaled``: trip_miles clipped to [0, 100] and scaled to [0, 1];
- ``hour_of_day``: trip_start_hour, clipped into [0, 23];
- ``hour_of_day_speed``: ``dp_group_by_mean(hour, mph / 100, 24, epsilon, 1.0)``, the DP mean speed of
  the trip's hour (the paper's DP feature; it spends the whole preprocessing epsilon);
- ``expected_hours``: miles / (the hour's DP mean speed), capped at one hour: the duration a trip of
  this length would take at its hour's typical speed. It is computed from the DP table, so it is
  post-processing and costs nothing more; it lets a linear model fit duration well;
- ``fare_scaled``: fare clipped to [0, 100] dollars, scaled to [0, 1];
- ``credit_card``: 1 if the trip was paid by credit card (tips on cash trips are rarely recorded);
- the labels, passed through: ``trip_seconds`` clipped to [0, 1 h] (regression), ``big_tipper`` (0/1,
  classification), when the stream has them.

Missing values are filled with public constants (fill_in_missing).
"""

import sage_tfx  # noqa: F401  (before TensorFlow)  # isort: skip
import tensorflow as tf

from sage_tfx.components.transform_utils import fill_in_missing
from sage_tfx.transform import PreprocessingBudget, dp_group_by_mean

MAX_MILES = 100.0
MAX_MPH = 100.0
MIN_MPH = 1.0  # public floor of the hourly speed, so expected_hours is defined
MAX_SECONDS = 3600.0
MAX_FARE = 100.0
HOURS = 24


def preprocessing_fn(inputs, custom_config):
    (epsilon,) = PreprocessingBudget.from_custom_config(custom_config).split(1)
    miles = tf.clip_by_value(tf.cast(fill_in_missing(inputs["trip_miles"], 0.0), tf.float32), 0.0, MAX_MILES)
    seconds = tf.cast(fill_in_missing(inputs["trip_seconds"], 0), tf.float32)
    hour = tf.clip_by_value(tf.cast(fill_in_missing(inputs["trip_start_hour"], 0), tf.int64), 0, HOURS - 1)
    mph = tf.clip_by_value(miles / (tf.maximum(seconds, 1.0) / 3600.0), 0.0, MAX_MPH)
    speed_01 = dp_group_by_mean(hour, mph / MAX_MPH, HOURS, epsilon, 1.0)
    hourly_mph = tf.maximum(speed_01 * MAX_MPH, MIN_MPH)
    fare = tf.cast(fill_in_missing(inputs["fare"], 0.0), tf.float32)
    payment = fill_in_missing(inputs["payment_type"], "")
    outputs = {
        "dist_scaled": miles / MAX_MILES,
        "hour_of_day": hour,
        "hour_of_day_speed": speed_01,
        "expected_hours": tf.minimum(miles / hourly_mph, 1.0),
        "fare_scaled": tf.clip_by_value(fare, 0.0, MAX_FARE) / MAX_FARE,
        "credit_card": tf.cast(tf.equal(payment, "Credit Card"), tf.float32),
        "trip_seconds": tf.clip_by_value(seconds, 0.0, MAX_SECONDS),
    }
    if "big_tipper" in inputs:
        outputs["big_tipper"] = tf.cast(fill_in_missing(inputs["big_tipper"], 0), tf.int64)
    return outputs
