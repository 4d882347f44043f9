"""Structural checks that a Keras model and its per-example loss treat the records of a batch one by one.

DP-SGD's sensitivity C assumes record i's loss depends on record i alone and that a step changes only the
trainable weights. ``check_rows_independent`` checks both on SYNTHETIC batches built from the input and label
specs (no value of the data) and refuses a model that couples rows or keeps batch statistics with
``RowCouplingError``; it restores the model's variables and TensorFlow's global seed. It does not prove a layer
that couples rows only for some values.

The checks, their tolerance and their limits: docs/models.md ("Records one by one: the structural checks").
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
import numpy as np
import tensorflow as tf  # noqa: TID253

from sage_tfx.privacy.dpsgd import DpSgdConfigError

__all__ = ["RowCouplingError", "RowSpec", "check_rows_independent", "spec_of", "synthetic_batch"]

HALF = 4  # m: the batch has 2m rows
RTOL = 1e-4
_SEED = 20191027  # the synthetic values and TensorFlow's op seeds during the check (public, data-free)


class RowCouplingError(DpSgdConfigError):
    """The model or its loss mixes the records of a batch, or a training pass changes a non-trainable variable."""


@dataclass(frozen=True)
class RowSpec:
    """One input's or label's shape after the batch axis and its dtype (what a synthetic batch copies)."""

    shape: tuple[int, ...]
    dtype: np.dtype


def spec_of(data: Any) -> Any:
    """The nested ``RowSpec`` of arrays (no values: only what follows the batch axis and the dtype)."""
    return tf.nest.map_structure(lambda v: RowSpec(tuple(np.shape(v)[1:]), np.asarray(v).dtype), data)


def synthetic_batch(spec: Any, rows: int, seed: int = _SEED) -> Any:
    """Arrays of ``rows`` rows for ``spec`` (``spec_of``), drawn from fixed public distributions."""
    rng = np.random.default_rng(seed)

    def one(item):
        full = (rows,) + item.shape
        dtype = np.dtype(item.dtype)
        if dtype.kind == "f":
            return rng.normal(size=full).astype(dtype)
        if dtype.kind in "iu":
            return rng.integers(0, 2, size=full).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, size=full).astype(bool)
        if dtype.kind in "SUO":
            return rng.choice(np.array([b"a", b"b"], dtype=object), size=full)
        raise RowCouplingError(f"inputs of dtype {dtype} are not supported by make_private: pass numbers or strings")

    return tf.nest.map_structure(one, spec)


def _rows(x, rows):
    return tf.nest.map_structure(lambda v: v[rows], x)


def _generator_states(model) -> list:
    """The state variables of the random generators inside ``model`` (Dropout's, when Keras uses
    ``tf.random.Generator``: they exist after the first training-mode call)."""
    states = []
    for module in [model] + list(model.submodules):
        generator = getattr(getattr(module, "_random_generator", None), "_generator", None)
        state = getattr(generator, "state", None)
        if isinstance(state, tf.Variable):
            states.append(state)
    return states


def _pass(model, loss_fn, x, y, first):
    """One training-mode forward and backward pass under a fixed op seed: (outputs, losses, gradients) as
    numpy, the gradients of the first ``first`` records' summed loss."""
    tf.random.set_seed(_SEED)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        out = model(x, training=True)
        losses = tf.reshape(loss_fn(tf.convert_to_tensor(y), out), [-1])
        total = tf.reduce_sum(losses[:first])
    grads = tape.gradient(total, variables, unconnected_gradients="zero")
    return (
        [np.asarray(o) for o in tf.nest.flatten(out)],
        np.asarray(losses),
        [np.asarray(tf.convert_to_tensor(g)) for g in grads],
    )


def _differs(a: np.ndarray, b: np.ndarray) -> bool:
    scale = max(float(np.max(np.abs(a))) if a.size else 0.0, float(np.max(np.abs(b))) if b.size else 0.0, 1e-6)
    return a.shape != b.shape or not np.allclose(a, b, rtol=RTOL, atol=RTOL * scale)


def _compare(base, other, rows, what):
    """The name of the first part of ``other`` that differs from ``base`` on its first ``rows`` rows, or None."""
    outs, losses, grads = base
    o_outs, o_losses, o_grads = other
    if any(_differs(a[:rows], b[:rows]) for a, b in zip(outs, o_outs)):
        return f"the model's outputs for the same records change with {what}"
    if _differs(losses[:rows], o_losses[:rows]):
        return f"the per-example losses of the same records change with {what}"
    if any(_differs(a, b) for a, b in zip(grads, o_grads)):
        return f"the gradients of the same records' losses change with {what}"
    return None


def _changed_variables(before, skip) -> list[str]:
    """Names of the variables of ``before`` ((variable, value) pairs) whose value changed, ``skip`` aside."""
    return [v.name for v, value in before if v.ref() not in skip and not np.array_equal(value, v.numpy())]


def _check_losses_shape(losses, rows):
    if losses.shape != (rows,):
        raise RowCouplingError(
            f"the loss returns shape {losses.shape} on a synthetic batch of {rows} records, not "
            f"({rows},): pass a per-example loss (reduction NONE)"
        )


def check_rows_independent(model: tf.keras.Model, loss_fn: Callable, x_spec: Any, y_spec: Any) -> None:
    """Refuse (``RowCouplingError``) a model or per-example loss that couples the rows of a batch or changes a
    non-trainable variable in training; see the module docstring. Reads no data: ``x_spec``/``y_spec`` are
    ``spec_of`` the inputs and labels. Leaves the model's variables and TensorFlow's global seed as they were."""
    from tensorflow.python.eager import context

    rows = 2 * HALF
    x, y = synthetic_batch(x_spec, rows), synthetic_batch(y_spec, rows)
    x_other = tf.nest.map_structure(
        lambda a, b: np.concatenate([a[:HALF], b[HALF:]]), x, synthetic_batch(x_spec, rows, _SEED + 1)
    )
    y_other = np.concatenate([y[:HALF], synthetic_batch(y_spec, rows, _SEED + 1)[HALF:]])
    ctx = context.context()
    saved_seed = (ctx._seed, getattr(ctx, "_rng", None))  # restored below: the module sees its own seed
    before = [(v, v.numpy()) for v in model.variables]  # pairs: a layer may create variables in the pass
    try:
        base = _pass(model, loss_fn, x, y, HALF)
        _check_losses_shape(base[1], rows)
        generators = [(v, v.numpy()) for v in _generator_states(model)]
        changed = _changed_variables(before, {v.ref() for v, _ in generators})
        if changed:
            raise RowCouplingError(
                f"a training-mode pass of the model changes its non-trainable variable(s) {', '.join(changed)} "
                "(batch statistics, e.g. any BatchNormalization): they would hold values of the training records "
                "outside DP-SGD's noisy gradient sum. Remove the layer (LayerNormalization is per-record) or freeze "
                "it (layer.trainable = False)"
            )

        def again(xs, ys):  # each pass from the same generator states: the same Dropout masks
            for v, value in generators:
                v.assign(value)
            return _pass(model, loss_fn, xs, ys, HALF)

        if generators:
            base = again(x, y)
        for other, what in (
            (again(x_other, y_other), "the other records of the batch"),
            (again(_rows(x, slice(0, HALF)), y[:HALF]), "the batch size"),
        ):
            problem = _compare(base, other, HALF, what)
            if problem:
                raise RowCouplingError(
                    f"{problem} (a synthetic batch, training mode): the model or its loss mixes the records of a "
                    "batch (batch statistics such as BatchNormalization or a batch mean, a loss normalised over the "
                    "batch), so clipping each record's gradient does not bound its effect. Use layers and a loss "
                    "that treat each record on its own (Dense, Embedding, Dropout, LayerNormalization, Keras' "
                    "per-example losses)"
                )
    finally:
        for v, value in before:
            v.assign(value)
        ctx._seed, ctx._rng = saved_seed
