"""What ``PrivateModel.fit`` accepts: Keras' ``fit`` keywords (accepted when they change nothing, else refused
with the reason) and x / y as numpy arrays. Contract and examples: docs/models.md ("Keras habits in fit").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)
from sage_tfx.privacy.dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    from sage_tfx.models.private import PrivateModel

__all__ = ["keras_fit_arguments"]


def _rows(x):
    lengths = {int(np.shape(v)[0]) for v in tf.nest.flatten(x)}
    if len(lengths) != 1:
        raise ValueError("x: every input needs the same number of rows (they differ): pass one row per record in each")
    return lengths.pop()


def _to_numpy(x):
    """numpy arrays; floating ones as float32 (the Keras default dtype)."""

    def one(v):
        v = np.asarray(v)
        return v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v

    return tf.nest.map_structure(one, x)


def _take(x, rows):
    return tf.nest.map_structure(lambda v: v[rows], x)


# Keras ``Model.fit`` keyword arguments that ``PrivateModel.fit`` does not take, and why (``keras_fit_arguments``).
_STEPS_ARE_SIGNED = (
    "the step count is fixed by make_private's num_examples, batch_size and epochs (the noise is "
    "calibrated to it): leave it out"
)
_KERAS_FIT_REFUSED = {
    "validation_data": "a validation loss on private rows outside the DP-SGD spend is not private: evaluate the "
    "fitted model with DPModelValidator (the pipeline's SLA), or call predict on public rows",
    "validation_split": "it would hold out private rows and report their loss unprotected: evaluate with "
    "DPModelValidator, or call predict on public rows",
    "validation_steps": "there is no validation inside a private fit (see validation_data)",
    "validation_batch_size": "there is no validation inside a private fit (see validation_data)",
    "validation_freq": "there is no validation inside a private fit (see validation_data)",
    "callbacks": "Keras callbacks see each batch's exact loss on private rows (and EarlyStopping or "
    "ModelCheckpoint would choose by it): pass callback=fn(step) for progress or timing",
    "class_weight": "per-record weights are not supported by the clipped sum: resample the rows",
    "sample_weight": "per-record weights are not supported by the clipped sum: resample the rows",
    "initial_epoch": _STEPS_ARE_SIGNED,
    "steps_per_epoch": _STEPS_ARE_SIGNED,
}
# performance settings of Keras' input pipeline: fit takes in-memory arrays, so they change nothing
_KERAS_FIT_IGNORED = ("max_queue_size", "workers", "use_multiprocessing")


def keras_fit_arguments(
    private: PrivateModel, epochs: Any, batch_size: Any, shuffle: Any, others: dict[str, Any]
) -> None:
    """Accept the Keras ``fit`` keywords a Keras user types when they change nothing; refuse the others.

    ``epochs`` / ``batch_size`` equal to make_private's are accepted (None: not given); a different value is
    refused naming make_private, where the noise is calibrated. ``shuffle=True`` (Keras' default) is accepted:
    each batch is a Poisson sample anyway; ``shuffle=False`` is refused. The performance keywords
    ``_KERAS_FIT_IGNORED`` are ignored; ``_KERAS_FIT_REFUSED`` are refused with their reason. Raises
    ``DpSgdConfigError`` before any data is read.
    """
    for name, given, wrapped in (("epochs", epochs, private.epochs), ("batch_size", batch_size, private.batch_size)):
        if given is not None and not (
            isinstance(given, (int, float)) and not isinstance(given, bool) and given == wrapped
        ):
            raise DpSgdConfigError(
                f"fit({name}={given!r}) differs from make_private({name}={wrapped:g}): the noise is calibrated to "
                f"make_private's {name}; pass {name}={given!r} to make_private instead (or leave it out of fit)"
            )
    if shuffle is not True:
        raise DpSgdConfigError(
            f"fit(shuffle={shuffle!r}) is invalid: DP-SGD draws every batch as a Poisson sample "
            "of all rows (the privacy proof needs it): leave shuffle out"
        )
    for name in others:
        if name in _KERAS_FIT_REFUSED:
            raise DpSgdConfigError(f"fit({name}=...) is refused: {_KERAS_FIT_REFUSED[name]}")
        if name not in _KERAS_FIT_IGNORED:
            raise DpSgdConfigError(
                f"fit({name}=...) is not an argument of PrivateModel.fit: it takes x, y, "
                "verbose, callback, and Keras' epochs / batch_size equal to make_private's"
            )
