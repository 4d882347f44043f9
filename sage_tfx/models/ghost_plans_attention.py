"""Ghost clipping plan of MultiHeadAttention: its four EinsumDense projections, run by the plan itself.

The projections are sublayers of ONE graph node, so the plan runs the layer's forward: each projection
through its ghost_plans_einsum.EinsumPlan (input and pre-activation saved), the attention between them
through the layer's own mask and attention code (``_compute_attention_mask``, ``_compute_attention``: its
softmax and its dropout, in training mode). Hooked into sage_tfx.models.ghost_plans._ghost_plan; run by
sage_tfx.models.dpsgd_engine.LayerGhostEngine (docs/models.md "Your own Keras model: make_private").
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf  # noqa: TID253

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)
from sage_tfx.models.ghost_plans_einsum import EinsumPlan, einsum_dense_plan

_CALL = ("query", "value", "key", "attention_mask", "return_attention_scores", "training", "use_causal_mask")
_FLAGS = ("return_attention_scores", "use_causal_mask")


def _bind(args: Any, kwargs: Any) -> dict[str, Any] | None:
    """MultiHeadAttention.call's arguments by name, or None for an argument it does not take."""
    bound = dict(zip(_CALL, args))
    if len(args) > len(_CALL) or any(name not in _CALL or name in bound for name in kwargs):
        return None
    bound.update(kwargs)
    return bound


class AttentionPlan:
    """MultiHeadAttention ``out = O(attention(Q(query), K(key), V(value)))``: the per-example squared norm of its
    variables is the sum of its four projections' (EinsumPlan, each from its own saved input and output
    gradient: the attention between them only shapes those gradients), and the clipped sums are theirs.

    ``forward_call`` takes the node's call arguments (query, value, key, attention_mask, use_causal_mask,
    training, return_attention_scores) and returns the layer's outputs; saved = (the four inputs, the four
    pre-activations, None). Attention dropout is drawn once in this pass and the norms and sums both use it."""

    kind = "multi_head_attention"
    takes_call = True

    def __init__(self, layer: Any, projections: list[EinsumPlan]) -> None:
        self.layer = layer
        self.projections = projections
        self.variables = [v for plan in projections for v in plan.variables]

    def forward_call(self, args: Any, kwargs: Any) -> tuple[Any, tuple[tuple, tuple, None]]:
        layer, (query_plan, key_plan, value_plan, output_plan) = self.layer, self.projections
        call = _bind(args, kwargs) or {}
        query, value = call["query"], call["value"]
        key = value if call.get("key") is None else call["key"]
        mask = layer._compute_attention_mask(
            query,
            value,
            key=key,
            attention_mask=call.get("attention_mask"),
            use_causal_mask=call.get("use_causal_mask", False),
        )
        training = True if call.get("training") is None else call["training"]
        q, q_saved = query_plan.forward(query)
        k, k_saved = key_plan.forward(key)
        v, v_saved = value_plan.forward(value)
        attended, scores = layer._compute_attention(q, k, v, mask, training)
        out, o_saved = output_plan.forward(attended)
        query_mask = getattr(query, "_keras_mask", None)
        if query_mask is not None:  # the layer's output keeps the query's Keras mask (supports_masking)
            out._keras_mask = query_mask
        saved = (q_saved, k_saved, v_saved, o_saved)
        outputs = (out, scores) if call.get("return_attention_scores", False) else out
        return outputs, (tuple(s[0] for s in saved), tuple(s[1] for s in saved), None)

    def sq_norms(self, inputs: tuple, grads: tuple, a_sq: Any = None) -> tf.Tensor:
        return tf.add_n([plan.sq_norms(a, g) for plan, a, g in zip(self.projections, inputs, grads)])

    def clipped(self, inputs: tuple, grads: tuple, scale: tf.Tensor) -> list[tf.Tensor]:
        """scale: c_i for the rows kept, 0 for the others (inputs, grads already zeroed there)."""
        return [s for plan, a, g in zip(self.projections, inputs, grads) for s in plan.clipped(a, g, scale)]


def _plain(value: Any) -> bool:
    return type(getattr(value, "type_spec", None)) is tf.TensorSpec and value.dtype.is_floating


def attention_plan(layer: Any, node: Any) -> AttentionPlan | None:
    """The plan of a MultiHeadAttention node, or None (per-example fallback): exactly this type (a subclass may
    change the attention), built, no mixed precision; query, value and key plain dense float tensors;
    return_attention_scores and use_causal_mask Python bools; each projection an EinsumDense that
    ghost_plans_einsum.einsum_dense_plan maps. Ragged inputs are refused."""
    if type(layer) is not tf.keras.layers.MultiHeadAttention or not getattr(layer, "_built_from_signature", False):
        return None
    if getattr(layer, "_compute_dtype", None) != layer.dtype:
        return None
    call = _bind(node.call_args, node.call_kwargs)
    if call is None or "query" not in call or "value" not in call:
        return None
    query, value = call["query"], call["value"]
    key = value if call.get("key") is None else call["key"]
    if not all(_plain(t) for t in (query, value, key)):
        return None
    if any(not isinstance(call.get(flag, False), bool) for flag in _FLAGS):
        return None
    attended = tf.TensorShape(query.shape[:-1]).concatenate([layer._num_heads, layer._value_dim])
    inputs = ((layer._query_dense, query), (layer._key_dense, key), (layer._value_dense, value))
    found = [einsum_dense_plan(dense, t.shape, t.dtype) for dense, t in inputs]
    found.append(einsum_dense_plan(layer._output_dense, attended, query.dtype))
    projections = [plan for plan in found if plan is not None]
    return AttentionPlan(layer, projections) if len(projections) == 4 else None
