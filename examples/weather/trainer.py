"""run_fn for DPTrainer (written by `sage init-pipeline`, then edited).

A logistic regression as a Keras model, trained with DP-SGD through make_private. Two public choices:
the bias starts at the logit of a public prior rate of rain (about 7% of New York's hours have measurable
precipitation), so training starts from the constant predictor instead of p = 0.5; the output probability is
kept in [0.01, 0.99], so each example's log loss is at most ln(100), the SLA's loss bound.
"""

import math

import sage_tfx  # noqa: F401  (before TensorFlow)  # isort: skip
import tensorflow as tf

from sage_tfx.components import trainer_utils
from sage_tfx.models import make_private

FEATURES = [
    "temp",
    "dewp",
    "humid",
    "pressure",
    "visib",
    "wind_speed",
    "spread",
    "origin_EWR",
    "origin_JFK",
    "origin_LGA",
]  # the transformed features, each in [-0.5, 0.5]
LABEL = "rain"
PRIOR_RATE = 0.07  # public: the share of rainy hours, from climatology, not from this stream
FLOOR = 0.01  # probabilities kept in [FLOOR, 1 - FLOOR]: log loss <= ln(1 / FLOOR)


def build_model():
    inputs = [tf.keras.Input(shape=(1,), name=name) for name in FEATURES]  # named as the transformed features
    logit = tf.keras.layers.Dense(
        1,
        kernel_initializer="zeros",
        bias_initializer=tf.keras.initializers.Constant(math.log(PRIOR_RATE / (1 - PRIOR_RATE))),
    )(tf.keras.layers.Concatenate()(inputs))
    p = tf.keras.layers.Activation("sigmoid")(logit)
    return tf.keras.Model(inputs, tf.keras.layers.Rescaling(1 - 2 * FLOOR, offset=FLOOR)(p))


def run_fn(fn_args):
    x, y = trainer_utils.load_examples(fn_args, FEATURES, LABEL)
    keep = y >= 0  # a missing label is dropped, never trained on as "no rain"
    model = make_private(
        build_model(),
        privacy_budget=fn_args.privacy_budget,
        num_examples=fn_args.num_examples,
        loss="binary_crossentropy",
        clip_norm=1.0,
        batch_size=256,
        epochs=10,
        learning_rate=1.0,
        momentum=0.5,
    )
    model.fit({name: x[name][keep].reshape(-1, 1) for name in FEATURES}, y[keep])
    trainer_utils.export_model(fn_args, model, label_key=LABEL)
    return trainer_utils.report_spent(fn_args, model)
