"""The paper's List. 1 preprocessing_fn on the Chicago taxi stream, for DPTransform (module_file).

Features:
- ``dist_scaled``: trip_miles clipped to the PUBLIC bounds [0, 100] and scaled to [0, 1] (the paper writes
  ``tft.scale_to_0_1(distance, 0, 100)``; tft.scale_to_0_1 would use the data's exact min and max, an
  exact statistic, so the bounds are constants here and no analyzer runs);
- ``hour_of_day``: trip_start_hour (int64), clipped into [0, 23] so every key is in range;
- ``hour_of_day_speed``: ``dp_group_by_mean(hour, speed_01, 24, epsilon, 1.0)``: the noisy mean speed of
  the hour, speed = miles / hours clipped to [0, 100] mph and scaled to [0, 1];
- ``trip_seconds``: the label, in seconds, clipped to [0, 3 h].

Missing values (records lacking a feature) are filled with public constants: 0 miles, 0 seconds, hour 0.
A trip of 0 seconds has speed 0 (its duration floors at one second, so the division is defined), as has a
trip of 0 miles: such records pull their hour's mean speed down a little, but each one moves it by at most
1/count (the clip bounds the sensitivity whatever the fill).

The epsilon is Sage's, given at run time through ``custom_config`` (never written here); the whole
preprocessing budget goes to the one DP feature.
"""

import sage_tfx  # noqa: F401  (before TensorFlow)  # isort: skip
import tensorflow as tf

from sage_tfx.components.transform_utils import fill_in_missing
from sage_tfx.transform import PreprocessingBudget, dp_group_by_mean

MAX_MILES = 100.0  # public bound of dist_scaled
MAX_MPH = 100.0  # public bound of speeds (faster trips are meter or GPS glitches)
MAX_TRIP_SECONDS = 3 * 3600.0  # public bound of the label (99.9% of real trips are under 1.6 h)
HOURS = 24
LABEL_KEY = "trip_seconds"


def preprocessing_fn(inputs, custom_config):
    (epsilon,) = PreprocessingBudget.from_custom_config(custom_config).split(1)
    miles = tf.cast(fill_in_missing(inputs["trip_miles"], 0.0), tf.float32)
    seconds = tf.cast(fill_in_missing(inputs["trip_seconds"], 0), tf.float32)
    hour = tf.clip_by_value(fill_in_missing(inputs["trip_start_hour"], 0), 0, HOURS - 1)

    mph = tf.clip_by_value(miles / (tf.maximum(seconds, 1.0) / 3600.0), 0.0, MAX_MPH)
    return {
        "dist_scaled": tf.clip_by_value(miles, 0.0, MAX_MILES) / MAX_MILES,
        "hour_of_day": hour,
        "hour_of_day_speed": dp_group_by_mean(hour, mph / MAX_MPH, HOURS, epsilon, 1.0),
        LABEL_KEY: tf.clip_by_value(seconds, 0.0, MAX_TRIP_SECONDS),
    }
