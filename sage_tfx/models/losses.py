"""Per-example losses for DP-SGD: ``per_example_loss`` turns a loss name, a Keras loss or a callable into
(y, model output) -> one loss per record, which the engines (sage_tfx.models.dpsgd_engine) clip per record.
"""

from collections.abc import Callable
from typing import Any

import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)
from sage_tfx.models.step_function import user_function
from sage_tfx.privacy.dpsgd import DpSgdConfigError

__all__ = ["LOSSES", "per_example_loss"]

LOSSES = ("mse", "binary_crossentropy", "sparse_categorical_crossentropy")
# A per-example loss: (labels, model outputs) -> one loss per example, shape [batch].
LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
_LOSS_ALIASES = {
    "mse": "mse",
    "mean_squared_error": "mse",
    "binary_crossentropy": "binary_crossentropy",
    "sparse_categorical_crossentropy": "sparse_categorical_crossentropy",
}


def _as_rows(t, batch):
    return tf.reshape(t, tf.stack([batch, -1]))


def _mse(y, out):
    batch = tf.shape(out)[0]
    out = _as_rows(out, batch)
    return tf.reduce_mean(tf.square(out - _as_rows(tf.cast(y, out.dtype), batch)), axis=1)


def _keras_loss(cls, match_shape, **config):
    loss = cls(reduction=tf.keras.losses.Reduction.NONE, **config)

    def per_example(y, out):
        if match_shape:
            y = tf.reshape(tf.cast(y, out.dtype), tf.shape(out))
        return tf.reshape(loss(y, out), [-1])

    return per_example


def _wrap_callable(loss):
    loss = user_function(loss)

    def per_example(y, out):
        # labels [B] for an output [B, 1]: Keras would squeeze the output and average over the BATCH
        y, out = tf.convert_to_tensor(y), tf.convert_to_tensor(out)
        if y.shape.rank == 1 and out.shape.rank == 2 and out.shape[1] == 1:
            y = y[:, None]
        values = loss(y, out)
        return tf.reshape(values, [-1])

    return per_example


def per_example_loss(loss: Any, model: tf.keras.Model) -> Callable:
    """A function (y, model output) -> per-example losses [batch], from ``loss`` or the model's compiled loss.

    A Keras ``Loss`` with another reduction is rebuilt with reduction NONE (``from_config``); a callable must
    return one loss per record (``fit`` checks the shape on two records).
    """
    if loss is None:
        loss = getattr(model, "loss", None) if getattr(model, "compiled_loss", None) is not None else None
        if loss is None:
            raise DpSgdConfigError(
                f"loss=None is invalid for an uncompiled model: pass loss= one of {LOSSES}, or a per-example "
                "Keras loss (reduction NONE), or model.compile(loss=...) first"
            )
    if isinstance(loss, str):
        name = _LOSS_ALIASES.get(loss.lower())
        if name is None:
            raise DpSgdConfigError(
                f"loss={loss!r} is invalid: choose one of {LOSSES}, or pass a per-example Keras loss (reduction NONE)"
            )
        if name == "mse":
            return _mse
        if name == "binary_crossentropy":  # Keras' string: outputs are probabilities (from_logits=False)
            return _keras_loss(tf.keras.losses.BinaryCrossentropy, True)
        return _keras_loss(tf.keras.losses.SparseCategoricalCrossentropy, False)
    if isinstance(loss, tf.keras.losses.Loss):
        if loss.reduction != tf.keras.losses.Reduction.NONE:
            config = dict(loss.get_config())
            config["reduction"] = tf.keras.losses.Reduction.NONE
            try:
                loss = type(loss).from_config(config)
            except Exception:
                raise DpSgdConfigError(
                    f"loss={loss!r} reduces over the batch and cannot be rebuilt with reduction NONE: pass a "
                    "per-example loss (reduction=tf.keras.losses.Reduction.NONE)"
                ) from None
        return _wrap_callable(loss)
    if callable(loss):
        return _wrap_callable(loss)
    raise DpSgdConfigError(f"loss={loss!r} is invalid: choose one of {LOSSES}, or pass a per-example Keras loss")
