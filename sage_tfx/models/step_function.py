"""The traced DP-SGD step of ``make_private``'s fit: traced once per fit, converted only where user code runs.

Contract: ``step_function(fn, signature)`` is ``tf.function(fn)`` with ``input_signature=signature``, whose
batch axes are None (``row_signature``), so the Poisson batches of every size run one trace (a second batch
size would otherwise retrace). AutoGraph does not rewrite sage_tfx's own step code (plain Python over lists
of tensors, branching with explicit ``tf.cond``: converting it cost about 2 s of CPU per fit), but it stays
on for the user's code inside the step: Keras converts each layer's ``call`` and each loss' ``call`` under the
enabled status set here, and ``losses`` converts a plain loss function (``user_function``), as a
``tf.function`` with AutoGraph would. The computation is the same graph either way.
"""

from __future__ import annotations

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf  # noqa: TID253
from tensorflow.python.autograph.core import ag_ctx  # noqa: TID253 (the status Keras' layers read)

__all__ = ["row_signature", "step_function", "user_function"]


def row_signature(data: Any) -> Any:
    """The nested ``tf.TensorSpec`` of a batch of ``data``'s rows: its dtypes and row shapes, batch axis None."""

    def one(v):
        v = np.asarray(v)
        return tf.TensorSpec((None,) + v.shape[1:], tf.convert_to_tensor(v[:0]).dtype)

    return tf.nest.map_structure(one, data)


def step_function(fn: Callable[..., Any], signature: list[Any]) -> Callable[..., Any]:
    """``fn`` as a ``tf.function`` of ``signature``, traced once, AutoGraph on for user layers and losses only."""

    def run(*args):
        with ag_ctx.ControlStatusCtx(status=ag_ctx.Status.ENABLED):
            return fn(*args)

    return tf.function(run, input_signature=signature, autograph=False)


def user_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` converted by AutoGraph when called inside a step (Python ``if`` / ``for`` on tensors work)."""

    def call(*args):
        return tf.__internal__.autograph.tf_convert(fn, tf.__internal__.autograph.control_status_ctx())(*args)

    return call
