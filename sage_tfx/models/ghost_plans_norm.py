"""Ghost clipping plan of LayerNormalization: per-example gradients of gamma and beta from the output gradient.

Hooked into sage_tfx.models.ghost_plans._ghost_plan; run by sage_tfx.models.dpsgd_engine.LayerGhostEngine
(docs/models.md "Your own Keras model: make_private").
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)


class LayerNormPlan:
    """LayerNormalization on the last axis of a dense float input [B, ..., d]: y = gamma * x_hat + beta,
    x_hat = (x - mean) / sqrt(var + epsilon) over the last axis (the layer's own epsilon), g = dloss/dy.

    Per-example gradient of record i: gamma: sum_t g_it * x_hat_it; beta: sum_t g_it (t over the middle
    axes; one term for a [B, d] input), each a [B, d] tensor: its squared norm and the clipped sum
    sum_i c_i (...)_i are computed from it directly (d values per record, no Gram matrix needed)."""

    kind = "layer_normalization"

    def __init__(self, layer: Any, keras_input: Any) -> None:
        self.layer = layer
        self.rank = keras_input.shape.rank
        self.variables = ([layer.gamma] if layer.scale else []) + ([layer.beta] if layer.center else [])

    def forward(self, x: tf.Tensor, row_sq: Any = None) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor, None]]:
        """(output, saved): saved = (x_hat, output, None)."""
        layer = self.layer
        x = tf.convert_to_tensor(x)
        if x.dtype != layer.dtype:
            x = tf.cast(x, layer.dtype)
        mean, variance = tf.nn.moments(x, [self.rank - 1], keepdims=True)
        x_hat = tf.nn.batch_normalization(x, mean, variance, None, None, layer.epsilon)
        out = x_hat
        if layer.scale:
            out = out * layer.gamma
        if layer.center:
            out = out + layer.beta
        if out is x_hat:  # neither scale nor center: no variables, never planned; keep the tape target distinct
            out = tf.identity(x_hat)
        mask = getattr(x, "_keras_mask", None)
        if mask is not None:
            out._keras_mask = mask
        return out, (x_hat, out, None)

    def _per_example(self, x_hat: tf.Tensor, g: tf.Tensor) -> list[tf.Tensor]:
        """The per-example gradients [B, d] of the plan's variables, in their order."""
        axes = list(range(1, self.rank - 1))
        grads = []
        if self.layer.scale:
            grads.append(tf.reduce_sum(g * x_hat, axis=axes) if axes else g * x_hat)
        if self.layer.center:
            grads.append(tf.reduce_sum(g, axis=axes) if axes else g)
        return grads

    def sq_norms(self, x_hat: tf.Tensor, g: tf.Tensor, a_sq: Any = None) -> tf.Tensor:
        return tf.add_n([tf.reduce_sum(tf.square(p), axis=1) for p in self._per_example(x_hat, g)])

    def clipped(self, x_hat: tf.Tensor, g: tf.Tensor, scale: tf.Tensor) -> list[tf.Tensor]:
        """scale: c_i for the rows kept, 0 for the others (x_hat, g already zeroed there)."""
        return [tf.linalg.matvec(p, scale, transpose_a=True) for p in self._per_example(x_hat, g)]


def layer_norm_plan(layer: Any, keras_input: Any) -> LayerNormPlan | None:
    """The plan of a LayerNormalization node, or None (per-example fallback): only the last axis, a plain
    dense float input of rank >= 2 with a known last dimension, at least one of scale / center, the layer's
    compute dtype equal to its variable dtype (no mixed precision)."""
    spec = getattr(keras_input, "type_spec", None)
    rank = keras_input.shape.rank
    if type(layer) is not tf.keras.layers.LayerNormalization or type(spec) is not tf.TensorSpec:
        return None
    if rank is None or rank < 2 or not keras_input.dtype.is_floating or keras_input.shape[-1] is None:
        return None
    if list(layer.axis) != [rank - 1] or not (layer.scale or layer.center):
        return None
    if getattr(layer, "_compute_dtype", None) != layer.dtype:
        return None
    return LayerNormPlan(layer, keras_input)
