"""preprocessing_fn of the ready taxi pipelines (paper List. 1, plus one post-processed feature).

Every scale is a PUBLIC constant and missing values are filled with public constants; the one DP feature,
the hour's mean speed, spends the whole preprocessing epsilon, and ``expected_hours`` is post-processing of it.

The features: docs/dp_preprocessing.md, "The DPTransform component" ("The ready taxi pipelines' module").
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
