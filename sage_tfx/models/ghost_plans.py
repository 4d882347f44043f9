"""Ghost clipping plans: per-layer squared gradient norms and clipped sums without per-example gradients.

A plan covers one Dense, Embedding (here), LayerNormalization (ghost_plans_norm), Conv1D / Conv2D
(ghost_plans_conv), EinsumDense (ghost_plans_einsum) or MultiHeadAttention (ghost_plans_attention) node of a
Keras graph network; ``ghost_layers`` finds them and
``graph_nodes`` gives the graph's execution order. The engine that runs them is
sage_tfx.models.dpsgd_engine.LayerGhostEngine (docs/models.md "Your own Keras model: make_private").
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)
from sage_tfx.models.ghost_plans_attention import attention_plan
from sage_tfx.models.ghost_plans_conv import conv_plan
from sage_tfx.models.ghost_plans_einsum import einsum_plan
from sage_tfx.models.ghost_plans_norm import layer_norm_plan


def _row_sq(t):
    """Squared L2 norm of each row of a [B, d] tensor."""
    return tf.reduce_sum(tf.square(t), axis=1)


def _category_row_sq(layer, ids):
    """||CategoryEncoding(ids)_i||^2 from the ids alone, no pass over the [B, num_tokens] output.

    The layer asserts 0 <= id < num_tokens (the step fails otherwise), so row i of its output has a 1 (one_hot,
    multi_hot) or the count (count) at each DISTINCT id of row i: its squared norm is the number of distinct
    ids (binary modes) or sum_v count_v^2 = sum_{t,s} [id_t = id_s] (count); with one id per row, 1."""
    batch = tf.shape(ids)[0]
    ids = tf.reshape(ids, tf.stack([batch, -1]))
    same = tf.cast(tf.equal(ids[:, :, None], ids[:, None, :]), layer.compute_dtype)
    if layer.output_mode == "count":
        return tf.reduce_sum(same, axis=[1, 2])
    return tf.reduce_sum(1.0 / tf.reduce_sum(same, axis=2), axis=1)


def row_sq_hint(
    node: Any, args: Sequence[Any], kwargs: Mapping[str, Any], hints: Mapping[int, Any]
) -> Callable[[], tuple[float, Any]] | None:
    """A function giving ||output_i||^2 of a node cheaply as (a number, a [B] tensor or None), their sum; or
    None: CategoryEncoding (one_hot / multi_hot /
    count, dense output, dense integer ids of rank <= 2, no count_weights) and Concatenate of rank-2 tensors
    on the last axis (the sum of its inputs' squared row norms, each from its own hint or computed)."""
    layer = node.layer
    flat = tf.nest.flatten((args, kwargs))
    if len(flat) != len(node.flat_input_ids):
        return None
    if type(layer) is tf.keras.layers.CategoryEncoding:
        if layer.output_mode not in ("one_hot", "multi_hot", "count") or layer.sparse or kwargs or len(args) != 1:
            return None
        ids = args[0]
        if not isinstance(ids, tf.Tensor) or not ids.dtype.is_integer or ids.shape.rank not in (1, 2):
            return None
        if layer.output_mode == "one_hot" and ids.shape.rank == 2 and ids.shape[1] != 1:
            return None  # one_hot of [B, k > 1] adds an axis: rank 3, not a row vector
        if ids.shape.rank == 1 or ids.shape[1] == 1:
            return lambda: (1.0, None)  # one id per row: a single 1 (a number: no op at all)
        return lambda: (0.0, _category_row_sq(layer, ids))
    if type(layer) is tf.keras.layers.Concatenate:
        parts = list(zip(node.flat_input_ids, flat))
        if (
            kwargs
            or not all(isinstance(t, tf.Tensor) and t.shape.rank == 2 for _, t in parts)
            or layer.axis not in (-1, 1)
        ):
            return None

        def concatenated():
            number, tensors = 0.0, []
            for i, t in parts:
                part = hints[i]() if i in hints else (0.0, _row_sq(tf.cast(t, layer.compute_dtype)))
                number += part[0]
                tensors += [part[1]] if part[1] is not None else []
            return number, (tf.add_n(tensors) if tensors else None)

        return concatenated
    return None


def graph_nodes(model: tf.keras.Model) -> list[Any] | None:
    """The non-input nodes of a Keras graph network (Functional, or a built Sequential) in execution order,
    or None for a subclassed model (no graph to walk)."""
    by_depth = getattr(model, "_nodes_by_depth", None)
    if not getattr(model, "_is_graph_network", False) or not by_depth:
        return None
    return [node for depth in sorted(by_depth, reverse=True) for node in by_depth[depth] if not node.is_input]


def _plain_tensor(keras_tensor, min_rank):
    spec = getattr(keras_tensor, "type_spec", None)
    rank = keras_tensor.shape.rank
    return type(spec) is tf.TensorSpec and rank is not None and rank >= min_rank


class _DensePlan:
    """Dense on a dense float input [B, ..., d_in]. z = a W + b (the layer's pre-activation), g = dloss/dz.

    Per-example gradient of record i: W: sum_t a_it g_it^T; b: sum_t g_it (t over the middle axes; one term
    for a [B, d_in] input). Squared norm: for one term ||a_i||^2 ||g_i||^2 + ||g_i||^2 (outer product); for
    T terms sum_{t,s} (a_it . a_is)(g_it . g_is) + ||sum_t g_it||^2, or the explicit gradient when
    T^2 > d_in d_out (cheaper). Clipped sum: sum_i c_i a_i^T g_i (and sum_i c_i sum_t g_it)."""

    kind = "dense"

    def __init__(self, layer, keras_input) -> None:
        self.layer = layer
        self.rank = keras_input.shape.rank
        self.variables = [layer.kernel] + ([layer.bias] if layer.use_bias else [])

    def forward(self, a, row_sq=None):
        """(output, saved): saved = (input, pre-activation, ||input_i||^2 or None)."""
        layer = self.layer
        a = tf.convert_to_tensor(a)
        if a.dtype != layer.kernel.dtype:
            a = tf.cast(a, layer.kernel.dtype)
        if self.rank == 2:
            z = tf.matmul(a, layer.kernel)
        else:
            z = tf.tensordot(a, layer.kernel, [[self.rank - 1], [0]])
        if layer.use_bias:
            z = tf.nn.bias_add(z, layer.bias)
        out = layer.activation(z) if layer.activation is not None else z
        mask = getattr(a, "_keras_mask", None)
        if mask is not None:
            out._keras_mask = mask
        if row_sq is not None and self.rank == 2:
            number, tensor = row_sq()
            a_sq = number if tensor is None else tensor + number
        else:
            a_sq = None
        return out, (a, z, a_sq)

    def _seq(self, a, g):
        batch = tf.shape(a)[0]
        return (
            tf.reshape(a, tf.stack([batch, -1, tf.shape(a)[-1]])),
            tf.reshape(g, tf.stack([batch, -1, tf.shape(g)[-1]])),
        )

    def sq_norms(self, a, g, a_sq=None):
        bias = 1.0 if self.layer.use_bias else 0.0
        if self.rank == 2:
            return ((_row_sq(a) if a_sq is None else a_sq) + bias) * _row_sq(g)
        a3, g3 = self._seq(a, g)
        d_in, d_out = self.layer.kernel.shape
        steps = 1
        for dim in a.shape[1:-1]:
            steps = steps * dim if (dim is not None and steps is not None) else None
        if steps is not None and steps * steps <= d_in * d_out:
            aa = tf.matmul(a3, a3, transpose_b=True)
            gg = tf.matmul(g3, g3, transpose_b=True)
            kernel = tf.reduce_sum(aa * gg, axis=[1, 2])
        else:
            kernel = tf.reduce_sum(tf.square(tf.einsum("btd,bte->bde", a3, g3)), axis=[1, 2])
        bias_sq = tf.reduce_sum(tf.square(tf.reduce_sum(g3, axis=1)), axis=1) if self.layer.use_bias else 0.0
        return kernel + bias_sq

    def clipped(self, a, g, scale):
        """scale: c_i for the rows kept, 0 for the others (a, g already zeroed there)."""
        if self.rank == 2:
            gs = g * scale[:, None]
            sums = [tf.matmul(a, gs, transpose_a=True)]
            if self.layer.use_bias:
                sums.append(tf.reduce_sum(gs, axis=0))
            return sums
        a3, g3 = self._seq(a, g)
        gs = g3 * scale[:, None, None]
        sums = [tf.einsum("btd,bte->de", a3, gs)]
        if self.layer.use_bias:
            sums.append(tf.reduce_sum(gs, axis=[0, 1]))
        return sums


class _EmbeddingPlan:
    """Embedding of integer ids [B, ...] into a table E [V, D]. e = E[ids], g = dloss/de.

    Per-example gradient of record i: row v of E gets sum_{t: id_it = v} g_it, so its squared norm is
    sum_v ||sum_{t: id_it = v} g_it||^2 = sum_{t,s} [id_it = id_is] (g_it . g_is) (repeated ids merged);
    one id per record: ||g_i||^2. Clipped sum: the scatter-add of c_i g_it into rows id_it."""

    kind = "embedding"

    def __init__(self, layer, keras_input) -> None:
        self.layer = layer
        shape = keras_input.shape
        self.steps: int | None = 1
        for dim in shape[1:]:
            self.steps = self.steps * dim if (dim is not None and self.steps is not None) else None
        self.variables = [layer.embeddings]

    def forward(self, ids, row_sq=None):
        layer = self.layer
        ids = tf.convert_to_tensor(ids)
        if ids.dtype not in (tf.int32, tf.int64):
            ids = tf.cast(ids, tf.int32)
        out = tf.gather(layer.embeddings, ids)
        if layer.mask_zero:
            out._keras_mask = tf.not_equal(ids, 0)
        return out, (ids, out, None)

    def _flat(self, ids, g):
        batch = tf.shape(g)[0]
        return tf.reshape(ids, tf.stack([batch, -1])), tf.reshape(g, tf.stack([batch, -1, tf.shape(g)[-1]]))

    def sq_norms(self, ids, g, a_sq=None):
        ids2, g3 = self._flat(ids, g)
        if self.steps == 1:
            return tf.reduce_sum(tf.square(g3), axis=[1, 2])
        same = tf.cast(tf.equal(ids2[:, :, None], ids2[:, None, :]), g.dtype)
        return tf.reduce_sum(same * tf.matmul(g3, g3, transpose_b=True), axis=[1, 2])

    def clipped(self, ids, g, scale):
        ids2, g3 = self._flat(ids, g)
        rows = tf.reshape(g3 * scale[:, None, None], [-1, tf.shape(g3)[-1]])
        return [tf.math.unsorted_segment_sum(rows, tf.reshape(ids2, [-1]), self.layer.input_dim)]


def _ghost_plan(layer, node, shared):
    """The ghost plan of one node's layer, or None (its trainable variables go to the per-example fallback)."""
    if not layer.trainable_weights or id(layer) in shared:
        return None
    if type(layer) is tf.keras.layers.MultiHeadAttention:
        return attention_plan(layer, node)
    if not getattr(node, "_single_positional_tensor_passed", False) or len(node.keras_inputs) != 1:
        return None
    if getattr(layer, "_compute_dtype", None) != getattr(layer, "dtype", None):  # mixed precision: not here
        return None
    keras_input = node.keras_inputs[0]
    if (
        type(layer) is tf.keras.layers.Dense
        and _plain_tensor(keras_input, 2)
        and keras_input.dtype.is_floating
        and keras_input.shape[-1] is not None
    ):
        return _DensePlan(layer, keras_input)
    if (
        type(layer) is tf.keras.layers.Embedding
        and _plain_tensor(keras_input, 1)
        and not getattr(layer, "sparse", False)
    ):
        return _EmbeddingPlan(layer, keras_input)
    return layer_norm_plan(layer, keras_input) or conv_plan(layer, keras_input) or einsum_plan(layer, keras_input)


GHOST_LAYERS = "Dense, Embedding, LayerNormalization, Conv1D/Conv2D, EinsumDense or MultiHeadAttention"


def ghost_types() -> tuple[type, ...]:
    """The layer types a ghost plan covers (GHOST_LAYERS): the default of ``ghost_layers``'s ``types``."""
    layers = tf.keras.layers
    return (
        layers.Dense,
        layers.Embedding,
        layers.LayerNormalization,
        layers.Conv1D,
        layers.Conv2D,
        layers.EinsumDense,
        layers.MultiHeadAttention,
    )


def ghost_layers(
    model: tf.keras.Model, types: Collection[type] | None = None
) -> tuple[dict[int, Any], list[tf.Variable], list[tf.Variable]] | None:
    """(plans by node id, ghost variables, fallback variables) for a graph network, or None if it has no
    graph. Ghost: Dense (a dense float input of any rank >= 2), Embedding (dense integer ids),
    LayerNormalization (last axis, ghost_plans_norm.layer_norm_plan), Conv1D / Conv2D
    (ghost_plans_conv.conv_plan), EinsumDense (ghost_plans_einsum.einsum_plan) and MultiHeadAttention
    (ghost_plans_attention.attention_plan), each used by exactly one node, with no variable shared with another
    layer, and (``types`` given) of one of ``types`` exactly. Every other trainable variable (including those of
    a shared layer, a nested model, any other layer type) is a fallback variable."""
    nodes = graph_nodes(model)
    if nodes is None:
        return None
    trainable = {v.ref() for v in model.trainable_variables}
    uses: dict[int, int]
    owners: dict[Any, set[int]]
    uses, owners = {}, {}
    for node in nodes:
        uses[id(node.layer)] = uses.get(id(node.layer), 0) + 1
        for v in node.layer.trainable_weights:
            owners.setdefault(v.ref(), set()).add(id(node.layer))
    shared = {layer for layer, n in uses.items() if n > 1}
    for layers in owners.values():
        if len(layers) > 1:
            shared |= layers
    plans = {}
    for node in nodes:
        if types is not None and type(node.layer) not in types:
            continue
        plan = _ghost_plan(node.layer, node, shared)
        if (
            plan is not None
            and all(v.ref() in trainable for v in plan.variables)
            and len(plan.variables) == len(node.layer.trainable_weights)
        ):
            plans[id(node)] = plan
    ghost = [v for plan in plans.values() for v in plan.variables]
    ghost_refs = {v.ref() for v in ghost}
    fallback = [v for v in model.trainable_variables if v.ref() not in ghost_refs]
    return plans, ghost, fallback
