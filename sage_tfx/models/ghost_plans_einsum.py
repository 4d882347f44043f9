"""Ghost clipping plan of EinsumDense: per-example kernel and bias gradients as einsums of the input and g.

Hooked into sage_tfx.models.ghost_plans._ghost_plan (and the four projections of
ghost_plans_attention.AttentionPlan); run by sage_tfx.models.dpsgd_engine.LayerGhostEngine (docs/models.md
"Your own Keras model: make_private").
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)


@dataclass(frozen=True)
class EinsumSpec:
    """An EinsumDense equation ``inputs,kernel->output`` with the ellipsis spelt out as letters: ``batch`` is
    the first axis of input and output, ``steps`` the other input axes kept in the output (t), ``summed`` the
    input axes in neither kernel nor output (summed away), ``fresh`` letters unused by the equation (to name a
    second copy of the steps and summed axes)."""

    inputs: str
    kernel: str
    output: str
    batch: str
    steps: str
    summed: str
    fresh: str


def parse_equation(equation: str, rank: int) -> EinsumSpec | None:
    """The spec of ``equation`` applied to an input of ``rank``, or None when it is not a per-record linear map
    this plan covers: the batch axis must be the first axis of input and output and absent from the kernel;
    every other input axis is contracted with the kernel (not in the output), kept in the output (not in the
    kernel) or summed away (in neither); every output axis comes from the input or the kernel, every kernel
    axis from the input or the output; no letter repeats within an operand; an ellipsis only leading both
    input and output (Keras's ``...b,bc->...c``). Refused (None, per-example fallback): an axis in input, kernel
    and output (a per-head kernel), a trailing ellipsis, a batch axis contracted or biased."""
    parts = equation.replace(" ", "").split("->")
    if len(parts) != 2 or parts[0].count(",") != 1:
        return None
    inputs, kernel = parts[0].split(",")
    output = parts[1]
    if "..." in kernel or inputs.count("...") != output.count("..."):
        return None
    if "..." in inputs:
        if not (inputs.startswith("...") and output.startswith("...")) or inputs.count("...") > 1:
            return None
        unused = [c for c in string.ascii_letters if c not in inputs + kernel + output]
        elided = "".join(unused[: rank - (len(inputs) - 3)])
        if not elided:
            return None
        inputs, output = elided + inputs[3:], elided + output[3:]
    letters = inputs + kernel + output
    if not all(c in string.ascii_letters for c in letters) or len(inputs) != rank:
        return None
    if any(len(set(s)) != len(s) for s in (inputs, kernel, output)):
        return None
    batch = inputs[0]
    if output[0] != batch or batch in kernel:
        return None
    if any(c in kernel and c in output for c in inputs[1:]):
        return None  # a per-head kernel: one block per position of that axis
    if any((c in inputs) == (c in output) for c in kernel) or any(c not in inputs + kernel for c in output):
        return None
    steps = "".join(c for c in inputs[1:] if c in output)
    summed = "".join(c for c in inputs[1:] if c not in kernel + output)
    fresh = "".join(c for c in string.ascii_letters if c not in letters)[: len(steps + summed)]
    return EinsumSpec(inputs, kernel, output, batch, steps, summed, fresh)


class EinsumPlan:
    """EinsumDense ``z = einsum(eq, a, W) + b`` (the layer's pre-activation), g = dloss/dz, for an equation
    ``parse_equation`` maps: batch axis b, kept axes t, contracted axes c (input and kernel), free axes e
    (kernel and output).

    Per-example gradient of record i: W: einsum(a_i, g_i) over t (the explicit ``[B, *kernel]`` tensor,
    ``inputs,output->b kernel``); bias: g_i summed over the output axes that are not bias axes. Squared norm of
    W: sum_{t,s} (a_it . a_is)(g_it . g_is) (the Gram trick, contracting c and e, a's summed axes summed in each
    copy; t may be several axes) when
    T^2 <= d_in d_out (T the static product of the t sizes), else the explicit gradient's. Clipped sum:
    einsum(a, c_i g_i) into the kernel's axes (and the bias likewise)."""

    kind = "einsum_dense"

    def __init__(self, layer: Any, spec: EinsumSpec, input_shape: tf.TensorShape) -> None:
        self.layer = layer
        self.spec = spec
        self.variables = [layer.kernel] + ([layer.bias] if layer.bias is not None else [])
        sizes = dict(zip(spec.inputs, input_shape))
        steps: int | None = 1
        for c in spec.steps:
            steps = steps * sizes[c] if (steps is not None and sizes[c] is not None) else None
        self.gram = steps is not None and steps * steps <= layer.kernel.shape.num_elements()
        if layer.bias is not None:
            first = min(spec.output.find(c) for c in layer.bias_axes)
            self.bias_letters = "".join(c for c in spec.output[first:] if c in layer.bias_axes)

    def forward(self, a: tf.Tensor, row_sq: Any = None) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor, None]]:
        """(output, saved): saved = (input, pre-activation, None); the layer's own equation."""
        layer = self.layer
        a = tf.convert_to_tensor(a)
        if a.dtype != layer.kernel.dtype:
            a = tf.cast(a, layer.kernel.dtype)
        z = tf.einsum(layer.equation, a, layer.kernel)
        if layer.bias is not None:
            z = z + layer.bias
        out = layer.activation(z) if layer.activation is not None else z
        return out, (a, z, None)

    def _bias(self, g: tf.Tensor, per_record: bool) -> tf.Tensor:
        spec = self.spec
        lead = spec.batch if per_record else ""
        summed = tf.einsum(f"{spec.output}->{lead}{self.bias_letters}", g)
        shape = self.layer.bias.shape.as_list()
        return tf.reshape(summed, [-1, *shape]) if per_record else tf.reshape(summed, shape)

    def sq_norms(self, a: tf.Tensor, g: tf.Tensor, a_sq: Any = None) -> tf.Tensor:
        spec = self.spec
        if self.gram:
            rename = str.maketrans(spec.steps + spec.summed, spec.fresh)
            pair = f"{spec.batch}{spec.steps}{spec.fresh[: len(spec.steps)]}"
            aa = tf.einsum(f"{spec.inputs},{spec.inputs.translate(rename)}->{pair}", a, a)
            gg = tf.einsum(f"{spec.output},{spec.output.translate(rename)}->{pair}", g, g)
            kernel = tf.einsum(f"{pair},{pair}->{spec.batch}", aa, gg)
        else:
            per_record = tf.einsum(f"{spec.inputs},{spec.output}->{spec.batch}{spec.kernel}", a, g)
            kernel = tf.reduce_sum(tf.reshape(tf.square(per_record), tf.stack([tf.shape(g)[0], -1])), axis=1)
        if self.layer.bias is None:
            return kernel
        bias = self._bias(g, per_record=True)
        return kernel + tf.reduce_sum(tf.reshape(tf.square(bias), tf.stack([tf.shape(g)[0], -1])), axis=1)

    def clipped(self, a: tf.Tensor, g: tf.Tensor, scale: tf.Tensor) -> list[tf.Tensor]:
        """scale: c_i for the rows kept, 0 for the others (a, g already zeroed there)."""
        spec = self.spec
        gs = g * tf.reshape(scale, [-1] + [1] * (len(spec.output) - 1))
        sums = [tf.einsum(f"{spec.inputs},{spec.output}->{spec.kernel}", a, gs)]
        if self.layer.bias is not None:
            sums.append(self._bias(gs, per_record=False))
        return sums


def einsum_dense_plan(layer: Any, input_shape: tf.TensorShape, dtype: tf.DType) -> EinsumPlan | None:
    """The plan of an EinsumDense applied to a dense input of ``input_shape`` / ``dtype``, or None (per-example
    fallback): a built layer of exactly this type, a float input of known rank, an equation ``parse_equation``
    maps, no bias on the batch axis, no mixed precision."""
    if type(layer) is not tf.keras.layers.EinsumDense or not layer.built or not dtype.is_floating:
        return None
    if input_shape.rank is None or getattr(layer, "_compute_dtype", None) != layer.dtype:
        return None
    spec = parse_equation(layer.equation, input_shape.rank)
    if spec is None or (layer.bias is not None and spec.batch in (layer.bias_axes or "")):
        return None
    return EinsumPlan(layer, spec, input_shape)


def einsum_plan(layer: Any, keras_input: Any) -> EinsumPlan | None:
    """The plan of an EinsumDense graph node on one plain dense tensor (einsum_dense_plan), or None."""
    if type(getattr(keras_input, "type_spec", None)) is not tf.TensorSpec:
        return None
    return einsum_dense_plan(layer, keras_input.shape, keras_input.dtype)
