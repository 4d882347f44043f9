"""preprocessing_fn of the taxi_fare example pipeline (DPTransform module file).

Features, each from PUBLIC bounds fixed before seeing data:
- ``miles_01``: trip_miles clipped to [0, 30] miles, scaled to [0, 1];
- ``minutes_01``: trip_seconds clipped to [0, 2 h], scaled to [0, 1];
- ``hour_rate``: ``dp_group_by_mean`` of the fare per mile (clipped to [0, $10/mile], scaled to [0, 1]) over
  the hour of day: the one DP statistic, it takes the whole preprocessing budget;
- ``fare``: the label, passed through (clipped to [0, $100]).
"""

import sage_tfx  # noqa: F401  (before TensorFlow)  # isort: skip
import tensorflow as tf

from sage_tfx.components.transform_utils import fill_in_missing
from sage_tfx.transform import PreprocessingBudget, dp_group_by_mean

MAX_MILES, MAX_SECONDS, MAX_RATE, MAX_FARE = 30.0, 7200.0, 10.0, 100.0


def preprocessing_fn(inputs, custom_config):
    (epsilon,) = PreprocessingBudget.from_custom_config(custom_config).split(1)
    miles = tf.cast(fill_in_missing(inputs["trip_miles"], 0.0), tf.float32)
    seconds = tf.cast(fill_in_missing(inputs["trip_seconds"], 0), tf.float32)
    fare = tf.clip_by_value(tf.cast(fill_in_missing(inputs["fare"], 0.0), tf.float32), 0.0, MAX_FARE)
    hour = tf.clip_by_value(tf.cast(fill_in_missing(inputs["trip_start_hour"], 0), tf.int64), 0, 23)
    rate = tf.clip_by_value(fare / tf.maximum(miles, 0.1), 0.0, MAX_RATE) / MAX_RATE
    return {
        "miles_01": tf.clip_by_value(miles, 0.0, MAX_MILES) / MAX_MILES,
        "minutes_01": tf.clip_by_value(seconds, 0.0, MAX_SECONDS) / MAX_SECONDS,
        "hour_rate": dp_group_by_mean(hour, rate, 24, epsilon, 1.0),
        "fare": fare,
    }
