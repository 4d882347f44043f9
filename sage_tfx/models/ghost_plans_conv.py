"""Ghost clipping plan of Conv1D / Conv2D: the unfold trick (input patches times the output gradient).

Hooked into sage_tfx.models.ghost_plans._ghost_plan; run by sage_tfx.models.dpsgd_engine.LayerGhostEngine
(docs/models.md "Your own Keras model: make_private").
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)


def unfold_patches(x: tf.Tensor, kernel: Sequence[int], strides: Sequence[int], padding: str) -> tf.Tensor:
    """``tf.image.extract_patches(x, [1, *kernel, 1], [1, *strides, 1], [1, 1, 1, 1], padding)`` of a
    [B, H, W, C] ``x`` with known H, W: the same values in the same (rows, cols, channels) order, built from
    one strided slice per kernel offset (extract_patches' CPU kernel cost about 20 ms on a 256 x 16 x 16 x 3
    batch, the slices about 1 ms)."""
    if padding == "SAME":  # the zeros a SAME convolution pads with, before / after as TensorFlow splits them
        pads = [[0, 0]]
        for size, k, s in zip(x.shape[1:3], kernel, strides):
            total = max((-(-size // s) - 1) * s + k - size, 0)
            pads.append([total // 2, total - total // 2])
        x = tf.pad(x, pads + [[0, 0]])
    (rows, cols), channels = x.shape[1:3], x.shape[3]
    (m, n), (s, t) = [(size - k) // step + 1 for size, k, step in zip((rows, cols), kernel, strides)], strides
    # a stride as a reshape (TensorFlow's strided slice is slow on CPU): zeros at the end so that each
    # offset's window [o, o + m s) fits; they are never selected
    x = tf.pad(
        x, [[0, 0], [0, max(0, (kernel[0] - 1) + m * s - rows)], [0, max(0, (kernel[1] - 1) + n * t - cols)], [0, 0]]
    )
    pieces = []
    for i, j in itertools.product(range(kernel[0]), range(kernel[1])):
        window = tf.reshape(x[:, i : i + m * s, j : j + n * t, :], [-1, m, s, n, t, channels])
        pieces.append(window[:, :, 0, :, 0, :])
    return tf.concat(pieces, axis=-1)


class ConvPlan:
    """Conv1D / Conv2D, channels_last, groups 1, dilation 1, padding valid or same. z = conv(x, W) + b,
    g = dloss/dz of shape [B, positions..., c_out].

    With U_i = unfold(x_i) [T, k] (one row per output position, the receptive field flattened in the
    kernel's (rows, cols, c_in) order, k = prod(kernel_size) c_in), record i's gradient is W: U_i^T G_i
    ([k, c_out], G_i = g_i as [T, c_out]) and b: sum_t g_it. Squared norm: sum_{t,s} (u_it . u_is)(g_it . g_is)
    (the Gram trick) or ||U_i^T G_i||^2 from the explicit [B, k, c_out] gradient when T^2 > k c_out, plus
    ||sum_t g_it||^2. Clipped sum: sum_i c_i U_i^T G_i (and sum_i c_i sum_t g_it), the filter gradient of the
    convolution at the scaled g."""

    kind = "conv"

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.variables = [layer.kernel] + ([layer.bias] if layer.use_bias else [])

    def forward(self, x: tf.Tensor, row_sq: Any = None) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor, None]]:
        """(output, saved): saved = (input, pre-activation, None)."""
        layer = self.layer
        x = tf.convert_to_tensor(x)
        if x.dtype != layer.kernel.dtype:
            x = tf.cast(x, layer.kernel.dtype)
        padding = layer.padding.upper()
        if layer.rank == 1:
            z = tf.nn.conv1d(x, layer.kernel, layer.strides[0], padding)
        else:
            z = tf.nn.conv2d(x, layer.kernel, [1, *layer.strides, 1], padding)
        if layer.use_bias:
            z = tf.nn.bias_add(z, layer.bias)
        out = layer.activation(z) if layer.activation is not None else z
        return out, (x, z, None)

    def _unfold(self, x: tf.Tensor, g: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(U [B, T, k], G [B, T, c_out])."""
        layer = self.layer
        if layer.rank == 1:
            x = x[:, :, None, :]
            sizes, strides = [1, layer.kernel_size[0], 1, 1], [1, layer.strides[0], 1, 1]
        else:
            sizes, strides = [1, *layer.kernel_size, 1], [1, *layer.strides, 1]
        patches = unfold_patches(x, sizes[1:3], strides[1:3], layer.padding.upper())
        batch = tf.shape(g)[0]
        u = tf.reshape(patches, tf.stack([batch, -1, tf.shape(patches)[-1]]))
        return u, tf.reshape(g, tf.stack([batch, -1, tf.shape(g)[-1]]))

    def sq_norms(self, x: tf.Tensor, g: tf.Tensor, a_sq: Any = None) -> tf.Tensor:
        u, g3 = self._unfold(x, g)
        k = self.layer.kernel.shape.num_elements() // self.layer.filters
        steps = g.shape[1:-1].num_elements()
        if steps is not None and steps * steps <= k * self.layer.filters:
            kernel = tf.reduce_sum(tf.matmul(u, u, transpose_b=True) * tf.matmul(g3, g3, transpose_b=True), axis=[1, 2])
        else:
            kernel = tf.reduce_sum(tf.square(tf.einsum("btk,bto->bko", u, g3)), axis=[1, 2])
        if not self.layer.use_bias:
            return kernel
        return kernel + tf.reduce_sum(tf.square(tf.reduce_sum(g3, axis=1)), axis=1)

    def clipped(self, x: tf.Tensor, g: tf.Tensor, scale: tf.Tensor) -> list[tf.Tensor]:
        """scale: c_i for the rows kept, 0 for the others (x, g already zeroed there). The kernel's sum
        sum_i c_i U_i^T G_i is the convolution's own filter gradient of the scaled g (one op, no unfold)."""
        layer = self.layer
        gs = g * tf.reshape(scale, [-1] + [1] * (g.shape.rank - 1))
        padding = layer.padding.upper()
        if layer.rank == 1:  # as tf.nn.conv1d: a Conv2D of height 1
            shape = [1, *layer.kernel.shape]
            strides = [1, 1, layer.strides[0], 1]
            kernel = tf.compat.v1.nn.conv2d_backprop_filter(x[:, None], shape, gs[:, None], strides, padding)[0]
        else:
            strides = [1, *layer.strides, 1]
            kernel = tf.compat.v1.nn.conv2d_backprop_filter(x, layer.kernel.shape, gs, strides, padding)
        sums = [kernel]
        if layer.use_bias:
            sums.append(tf.reduce_sum(gs, axis=list(range(g.shape.rank - 1))))
        return sums


def conv_plan(layer: Any, keras_input: Any) -> ConvPlan | None:
    """The plan of a Conv1D / Conv2D node, or None (per-example fallback): channels_last, groups 1, dilation 1,
    padding valid or same, a plain dense float input of the layer's rank + 2 with known spatial and channel
    sizes, no mixed precision."""
    if type(layer) not in (tf.keras.layers.Conv1D, tf.keras.layers.Conv2D):
        return None
    spec = getattr(keras_input, "type_spec", None)
    shape = keras_input.shape
    if type(spec) is not tf.TensorSpec or shape.rank != layer.rank + 2 or not keras_input.dtype.is_floating:
        return None
    if any(dim is None for dim in shape[1:]) or layer.data_format != "channels_last" or layer.groups != 1:
        return None
    if any(d != 1 for d in layer.dilation_rate) or layer.padding not in ("valid", "same"):
        return None
    if getattr(layer, "_compute_dtype", None) != layer.dtype:
        return None
    return ConvPlan(layer)
