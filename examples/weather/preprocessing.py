"""preprocessing_fn for DPTransform (written by `sage init-pipeline`, then edited).

Each numeric measurement is clipped to a PUBLIC range (what the instrument and New York's climate allow,
never read from the data), scaled to [0, 1] and centred at 0 (x - 0.5): that spends no privacy budget.
A missing value takes a public typical value (the standard atmosphere for pressure), not the range's low end,
which for pressure would read as a storm. The airport is one-hot over its public list.
"""

import sage_tfx  # noqa: F401  (before TensorFlow)  # isort: skip
import tensorflow as tf

from sage_tfx.components.transform_utils import fill_in_missing

PUBLIC_RANGES = {  # column: (low, high, value when missing)
    "temp": (-10.0, 110.0, 55.0),  # degrees F
    "dewp": (-30.0, 90.0, 40.0),  # degrees F
    "humid": (0.0, 100.0, 60.0),  # relative humidity, %
    "pressure": (970.0, 1050.0, 1013.25),  # sea-level pressure, mbar
    "visib": (0.0, 10.0, 10.0),  # miles (reported up to 10)
    "wind_speed": (0.0, 50.0, 10.0),  # mph
}
SPREAD = (0.0, 60.0)  # temp - dewp, degrees F: near 0 when the air is saturated
AIRPORTS = ("EWR", "JFK", "LGA")
FEATURES = list(PUBLIC_RANGES) + ["spread"] + [f"origin_{a}" for a in AIRPORTS]
LABEL = "rain"


def _scaled(value, low, high):
    return (tf.clip_by_value(value, low, high) - low) / (high - low) - 0.5


def preprocessing_fn(inputs, custom_config):
    outputs, raw = {}, {}
    for column, (low, high, missing) in PUBLIC_RANGES.items():
        raw[column] = tf.cast(fill_in_missing(inputs[column], missing), tf.float32)
        outputs[column] = _scaled(raw[column], low, high)
    outputs["spread"] = _scaled(raw["temp"] - raw["dewp"], *SPREAD)
    origin = fill_in_missing(inputs["origin"], "")
    for airport in AIRPORTS:
        outputs[f"origin_{airport}"] = tf.cast(tf.equal(origin, airport), tf.float32) - 0.5
    outputs[LABEL] = tf.cast(fill_in_missing(inputs[LABEL], -1), tf.float32)  # -1: missing, dropped by run_fn
    return outputs
