"""DP-SGD gradient engines: the clipped, noised gradient SUM of one Poisson-sampled batch.

Every engine computes ``sum_i clip(grad loss_i, C) + N(0, (sigma*C)^2 I)``, the clip over ALL trainable
variables together, so one record moves the sum by at most C: a Gaussian mechanism of noise multiplier sigma
(accounted in sage_tfx.privacy.dpsgd). Engines: the one registry ``ENGINES`` (``ghost``, ``vmap``, ``loop``,
``tf_privacy``), built by ``make_engine``.

Formula, adaptive clipping, the non-finite guard, the engines and the noise source: docs/models.md ("DP-SGD
implementation: `ghost` is the default" and "The gradient engines in detail").
"""

from __future__ import annotations

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
import math
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Never

import tensorflow as tf  # noqa: TID253

from sage_tfx.models.ghost_plans import GHOST_LAYERS, ghost_layers, ghost_types, graph_nodes, row_sq_hint
from sage_tfx.privacy import checks
from sage_tfx.privacy.adaptive_clip import sum_noise_multiplier
from sage_tfx.privacy.dpsgd import DpSgdConfigError

if TYPE_CHECKING:
    from sage_tfx.models.losses import LossFn
    from sage_tfx.privacy.adaptive_clip import AdaptiveClip

__all__ = [
    "ENGINES",
    "make_engine",
    "ghost_applies",
    "gaussian",
    "per_example_gradients",
    "LayerGhostEngine",
    "PerExampleEngine",
    "TfPrivacyEngine",
]

ENGINES = ("ghost", "vmap", "loop", "tf_privacy")

_INVALID = "{what}={value!r} is invalid: must be {rule}"


def _check_noise_multiplier(noise_multiplier):
    """sigma as a finite float >= 0 (0: no noise, e.g. clipped_sum), else a DpSgdConfigError naming it."""
    return checks.number(noise_multiplier, "noise_multiplier", low=0.0, error=DpSgdConfigError, message=_INVALID)


def gaussian(generator: tf.random.Generator, size: int, stddev: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``size`` independent N(0, stddev^2) values of ``dtype`` from ``generator``: the Box-Muller transform of
    its uniforms, in whole-tensor ops.

    One ``generator.uniform([2, ceil(size / 2)])`` draw gives U (first row) and V (second row), uniform on [0, 1)
    in steps of 2^-mantissa; with R = stddev * sqrt(-2 log(1 - U)) and T = 2 pi V, the values are R cos T
    followed by R sin T (the last dropped when ``size`` is odd). For independent uniforms these are independent
    standard normals times stddev (Box and Muller, 1958): the algorithm of TensorFlow's own
    ``Generator.normal`` (Box-Muller on Philox bits, with the same float32 tail cut near 5.6 sd), written as
    vectorised tensor ops, which cost about 40% less CPU than its per-element kernel. Its stream of values
    differs from ``Generator.normal``'s; it is deterministic given the generator's state. A 16-bit ``dtype`` is
    drawn in float32 and cast (as ``Generator.normal`` does): 16-bit uniforms would cut the tails near 3.7 sd.
    """
    half = (size + 1) // 2
    draw_dtype = tf.float64 if dtype == tf.float64 else tf.float32
    uniforms = generator.uniform([2, half], dtype=draw_dtype)
    radius = tf.sqrt(-2.0 * tf.math.log(1.0 - uniforms[0])) * tf.cast(stddev, draw_dtype)  # 1 - U is exact
    angle = uniforms[1] * (2.0 * math.pi)
    values = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=0)[:size]
    return tf.cast(values, dtype)


class _Engine:
    def __init__(self, model, per_example_loss, clip_norm, noise_multiplier, seed=None) -> None:
        self.clip_norm = checks.positive(clip_norm, "clip_norm", error=DpSgdConfigError, message=_INVALID)
        self.noise_multiplier = _check_noise_multiplier(noise_multiplier)
        self.model = model
        self.per_example_loss = per_example_loss
        self.variables = list(model.trainable_variables)
        self._generator = (
            tf.random.Generator.from_seed(seed)
            if seed is not None
            else tf.random.Generator.from_non_deterministic_state()
        )
        # the clip norm C and the sum's noise multiplier live in variables the traced steps read, so a noise
        # schedule (sage_tfx.privacy.noise_schedules) changes sigma_t and adaptive clipping changes C_t per step
        # without retracing; float64, cast to each variable's dtype (the same rounding as the constants they
        # replace). The noise std is their product.
        self._clip = tf.Variable(self.clip_norm, trainable=False, dtype=tf.float64, name="dp_clip_norm")
        self._sum_sigma = tf.Variable(
            self.noise_multiplier, trainable=False, dtype=tf.float64, name="dp_sum_noise_multiplier"
        )
        self.adaptive = None  # a sage_tfx.privacy.adaptive_clip.AdaptiveClip once adapt_clip is called
        self._count_stddev = self._expected_batch = None

    def adapt_clip(self, adaptive, batch_size):
        """Estimate the clip norm privately from now on (sage_tfx.privacy.adaptive_clip): C_0 =
        ``adaptive.initial``, each step also releases the noisy unclipped count (std sigma_b) and moves C
        towards the target quantile; the sum's noise multiplier becomes z_Delta, so that each step stays the
        Gaussian mechanism of the accounted multiplier z. Call before the first step (outside a trace)."""
        self.adaptive = adaptive
        self._count_stddev = adaptive.count_stddev_for(batch_size)
        self._expected_batch = float(batch_size)
        self.clip_norm = float(adaptive.initial)
        self._clip.assign(self.clip_norm)
        self.set_noise_multiplier(self.noise_multiplier)

    def continue_from(self, other):
        """Take over ``other``'s noise generator and clip state (an engine replacing it mid-run): no noise
        draw is ever reused, and an adaptive clip keeps its estimate."""
        self._generator = other._generator
        if other.adaptive is not None:
            self.adaptive, self._count_stddev, self._expected_batch = (
                other.adaptive,
                other._count_stddev,
                other._expected_batch,
            )
        self._clip.assign(other._clip)
        self._sum_sigma.assign(other._sum_sigma)

    @property
    def current_clip_norm(self):
        """C of the next step (the fixed clip norm, or the adaptive estimate: a DP release)."""
        return float(self._clip.numpy())

    @property
    def sum_noise_multiplier(self):
        """The noise multiplier on the gradient sum: z, or z_Delta when the clip adapts."""
        return float(self._sum_sigma.numpy())

    def set_noise_multiplier(self, noise_multiplier):
        """Set the accounted sigma for the following steps (a noise schedule's sigma_t); call outside the
        traced step."""
        self.noise_multiplier = _check_noise_multiplier(noise_multiplier)
        if self.adaptive is not None:
            self._sum_sigma.assign(sum_noise_multiplier(self.noise_multiplier, self._count_stddev))
        else:
            self._sum_sigma.assign(self.noise_multiplier)

    def _std(self, dtype):
        return tf.cast(self._sum_sigma * self._clip, dtype)

    def noise(self) -> list[tf.Tensor]:
        """N(0, (sigma C)^2) on every coordinate of every variable (``gaussian``): one draw of all coordinates
        of each dtype, split and reshaped per variable (one op instead of one per variable)."""
        noise: list[tf.Tensor | None] = [None] * len(self.variables)
        for dtype in sorted({v.dtype for v in self.variables}, key=lambda d: d.name):
            group = [(i, v) for i, v in enumerate(self.variables) if v.dtype == dtype]
            sizes = [v.shape.num_elements() for _, v in group]
            flat = gaussian(self._generator, sum(sizes), self._std(dtype), dtype)
            for (i, v), part in zip(group, tf.split(flat, sizes)):
                noise[i] = tf.reshape(part, v.shape)
        return noise

    def noisy_sum(self, x, y):
        """sum of clipped per-example gradients + N(0, (sigma C)^2), aligned with ``self.variables``; with an
        adaptive clip, then the clip update from the noisy unclipped count."""
        clipped, norms = self.clipped_sum(x, y)
        noisy = [g + n for g, n in zip(clipped, self.noise())]
        return self._then_update_clip(noisy, norms)

    def noise_sum(self):
        """The noisy sum of an empty batch (noise only); with an adaptive clip, then its clip update."""
        return self._then_update_clip(self.noise(), tf.zeros([0], tf.float64))

    def _then_update_clip(self, noisy, norms):
        if self.adaptive is None:
            return noisy
        with tf.control_dependencies(noisy):  # C_t clipped and scaled this step's noise before it moves
            norms = tf.cast(norms, tf.float64)
            clip = tf.identity(self._clip)
            unclipped = tf.logical_and(tf.math.is_finite(norms), norms <= clip)
            half = tf.constant(0.5, tf.float64)
            count = tf.reduce_sum(tf.where(unclipped, half, -half)) + self._generator.normal(
                [], stddev=tf.constant(self._count_stddev, tf.float64), dtype=tf.float64
            )
            fraction = tf.clip_by_value(count / self._expected_batch + 0.5, 0.0, 1.0)
            update = self._clip.assign(
                clip * tf.exp(-self.adaptive.learning_rate * (fraction - self.adaptive.target_quantile))
            )
        with tf.control_dependencies([update]):
            return [tf.identity(g) for g in noisy]

    def _factors(self, sq_norms):
        """(clip factors, norms, finite): factor min(1, C/||g||), 0 where ||g|| is not finite."""
        norms = tf.sqrt(sq_norms)
        finite = tf.math.is_finite(norms)
        factors = tf.minimum(1.0, tf.cast(self._clip, norms.dtype) / tf.maximum(norms, 1e-12))
        return tf.where(finite, factors, tf.zeros_like(factors)), norms, finite


def _zero_rows(t, keep):
    """``t`` (a tensor or a nest of them) with the rows (first axis) where ``keep`` is False set to 0 (so that
    inf * 0 never makes NaN)."""

    def zero(part):
        mask = tf.reshape(keep, tf.concat([[-1], tf.ones([tf.rank(part) - 1], tf.int32)], axis=0))
        return tf.where(mask, part, tf.zeros_like(part))

    return tf.nest.map_structure(zero, t)


# ------------------------------------------------------------------------- per-example gradients


def _first(t):
    return tf.nest.map_structure(lambda v: v[None], t)


def per_example_gradients(
    model: tf.keras.Model,
    per_example_loss: LossFn,
    variables: Sequence[tf.Variable],
    x: tf.Tensor,
    y: tf.Tensor,
    vectorized: bool = True,
) -> list[tf.Tensor]:
    """Each example's own gradient of its own loss w.r.t. ``variables``: one dense tensor [batch, *shape] per
    variable (Embedding's IndexedSlices made dense). ``vectorized``: ``tf.vectorized_map``; otherwise a
    ``tf.map_fn`` loop over the examples (slower, works for any differentiable model)."""

    def one(args):
        xi, yi = args
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(per_example_loss(_first(yi), model(_first(xi), training=True)))
        grads = tape.gradient(loss, variables, unconnected_gradients="zero")
        return [tf.convert_to_tensor(g) for g in grads]

    if vectorized:
        return tf.vectorized_map(one, (x, y))
    signature = [tf.TensorSpec(v.shape, v.dtype) for v in variables]
    return tf.map_fn(one, (x, y), fn_output_signature=signature)


class PerExampleEngine(_Engine):
    """Per-example gradients of any Keras model (nested inputs allowed), clipped and summed.

    ``vectorized=True`` (``vmap``): ``tf.vectorized_map``; False (``loop``): a ``tf.map_fn`` loop.
    """

    def __init__(
        self,
        model: tf.keras.Model,
        per_example_loss: LossFn,
        clip_norm: float,
        noise_multiplier: float,
        seed: int | None = None,
        vectorized: bool = True,
    ) -> None:
        super().__init__(model, per_example_loss, clip_norm, noise_multiplier, seed)
        self.vectorized = vectorized
        self.name = "vmap" if vectorized else "loop"

    def clipped_sum(self, x: tf.Tensor, y: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor | None]:
        """(clipped gradient sum aligned with ``self.variables``, per-example gradient norms)."""
        per_example = per_example_gradients(self.model, self.per_example_loss, self.variables, x, y, self.vectorized)
        sq = tf.add_n([tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1) for g in per_example])
        factors, norms, finite = self._factors(sq)
        return [tf.tensordot(factors, _zero_rows(g, finite), axes=1) for g in per_example], norms


class TfPrivacyEngine(_Engine):
    """tensorflow-privacy's DPKerasSGDOptimizer, one example per microbatch."""

    name = "tf_privacy"

    def __init__(
        self,
        model: tf.keras.Model,
        per_example_loss: LossFn,
        clip_norm: float,
        noise_multiplier: float,
        seed: int | None = None,
        num_microbatches: int | None = None,
    ) -> None:
        """``num_microbatches`` other than None (one example each) is for speed comparisons only:
        clipping per microbatch of k > 1 examples is NOT what sage_tfx.privacy.dpsgd accounts for
        (a record's microbatch changes by up to 2C under add/remove), and the batch size must then
        be a multiple of it (no Poisson sampling)."""
        super().__init__(model, per_example_loss, clip_norm, noise_multiplier, seed)
        from sage_tfx.compat.tf_privacy import dp_keras_optimizers  # noqa: PLC0415

        dp = dp_keras_optimizers()
        self.num_microbatches = num_microbatches
        # noise comes from tf.random.normal (global seed); learning rate unused: we only take gradients
        self.optimizer = dp.DPKerasSGDOptimizer(
            l2_norm_clip=self.clip_norm,
            noise_multiplier=self.noise_multiplier,
            num_microbatches=num_microbatches,
            learning_rate=1.0,
        )

    def adapt_clip(self, adaptive: AdaptiveClip, batch_size: int) -> Never:
        raise DpSgdConfigError(
            "the tf_privacy engine has a fixed clip norm: clip_norm='adaptive' needs the "
            "'ghost' or 'vmap' implementation"
        )

    def set_noise_multiplier(self, noise_multiplier: float) -> None:
        if noise_multiplier != self.noise_multiplier:
            raise DpSgdConfigError(
                "the tf_privacy engine has a fixed noise multiplier: a noise schedule needs the "
                "'ghost' or 'vmap' implementation"
            )

    def noisy_sum(self, x: tf.Tensor, y: tf.Tensor) -> list[tf.Tensor]:
        def loss():
            return self.per_example_loss(y, self.model(x, training=True))

        grads_and_vars = self.optimizer._compute_gradients(loss, self.variables, tape=tf.GradientTape())
        count = tf.shape(x)[0] if self.num_microbatches is None else self.num_microbatches
        count = tf.cast(count, self.variables[0].dtype)
        return [g * count for g, _ in grads_and_vars]  # it returned (sum + noise) / microbatches

    def clipped_sum(self, x: tf.Tensor, y: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor | None]:
        if self.noise_multiplier != 0:
            raise DpSgdConfigError("tf_privacy engine: clipped_sum needs noise_multiplier=0 (it always adds noise)")
        return self.noisy_sum(x, y), None


class LayerGhostEngine(_Engine):
    """Ghost clipping per layer on any Keras graph network (Functional or built Sequential), with an exact
    per-example fallback for the trainable variables of other layers.

    One forward pass walks the model's graph (as Keras' Functional does) but computes each ghost layer's
    output itself, keeping its input and pre-activation; one backward pass gives every ghost layer's
    output gradient, from which its per-example squared gradient norm and clipped sum follow (_DensePlan,
    _EmbeddingPlan, LayerNormPlan, ConvPlan, EinsumPlan, AttentionPlan: MultiHeadAttention's four
    projections, the plan running the layer's forward; ``ghost_types`` restricts the planned layer types,
    default all of ghost_plans.ghost_types()); layers without trainable weights, e.g. Normalization,
    CategoryEncoding, Concatenate, run as they are). The fallback variables (if any) get explicit per-example gradients: tf.vectorized_map
    over a GradientTape (``vectorized=True``) or a tf.map_fn loop. A record's squared norm over ALL
    trainable variables is the sum of the ghost layers' and the fallback's, so the clip factor
    min(1, C/||g_i||) is the one of the full per-example gradient, and one record moves the sum by at most
    C (the sensitivity the accountant assumes). Layers that draw randomness (Dropout) draw it separately in
    the ghost and the fallback pass; each part is still one record's gradient of some mask, and the clip
    uses both parts' norms, so the bound C holds.
    """

    name = "ghost"

    def __init__(
        self,
        model: tf.keras.Model,
        per_example_loss: LossFn,
        clip_norm: float,
        noise_multiplier: float,
        seed: int | None = None,
        vectorized: bool = True,
        *,
        ghost_types: Collection[type] | None = None,
    ) -> None:
        super().__init__(model, per_example_loss, clip_norm, noise_multiplier, seed)
        found = ghost_layers(model, _check_ghost_types(ghost_types))
        if found is None or not found[0]:
            raise DpSgdConfigError(GHOST_REFUSED)
        self.plans, ghost, self.fallback = found
        self.nodes = graph_nodes(model)
        self.vectorized = vectorized
        self.variables = ghost + self.fallback

    def _forward(self, x):
        model = self.model
        usage = model._tensor_usage_count
        tensors = {}
        for ref, value in zip(model.inputs, model._flatten_to_reference_inputs(x)):
            value = model._conform_to_reference_input(value, ref_input=ref)
            tensors[str(id(ref))] = [value] * usage[str(id(ref))]
        saved, hints = [], {}
        for node in self.nodes:
            if any(t not in tensors for t in node.flat_input_ids):
                continue
            args, kwargs = node.map_arguments(tensors)
            plan = self.plans.get(id(node))
            if plan is None:
                if getattr(node.layer, "_expects_training_arg", False) and "training" not in kwargs:
                    kwargs["training"] = True
                outputs = node.layer(*args, **kwargs)
                hint = row_sq_hint(node, args, kwargs, hints)
                if hint is not None and len(node.flat_output_ids) == 1:
                    hints[node.flat_output_ids[0]] = hint
            else:
                if getattr(plan, "takes_call", False):  # MultiHeadAttention: several tensors, masks, flags
                    outputs, keep = plan.forward_call(args, kwargs)
                else:
                    outputs, keep = plan.forward(args[0], hints.get(node.flat_input_ids[0]))
                saved.append((plan, keep))
            for out_id, value in zip(node.flat_output_ids, tf.nest.flatten(outputs)):
                tensors[out_id] = [value] * usage[out_id]
        outputs = [tensors[str(id(ref))].pop() for ref in model.outputs]
        return tf.nest.pack_sequence_as(model._nested_outputs, outputs), saved

    def _fallback_gradients(self, x, y):
        return per_example_gradients(self.model, self.per_example_loss, self.fallback, x, y, self.vectorized)

    def clipped_sum(self, x: tf.Tensor, y: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor | None]:
        """(clipped gradient sum aligned with ``self.variables``, per-example gradient norms)."""
        with tf.GradientTape() as tape:
            out, saved = self._forward(x)
            total = tf.reduce_sum(self.per_example_loss(y, out))
        grads = tape.gradient(total, [keep[1] for _, keep in saved], unconnected_gradients="zero")
        sq = 0.0
        for (plan, keep), g in zip(saved, grads):
            sq = sq + plan.sq_norms(keep[0], g, keep[2])
        per_example = self._fallback_gradients(x, y) if self.fallback else []
        for g in per_example:
            sq = sq + tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1)
        factors, norms, finite = self._factors(sq)
        scale = tf.where(finite, factors, tf.zeros_like(factors))

        def ghost_sums(zero):
            sums = []
            for (plan, keep), g in zip(saved, grads):
                if zero:  # a record with a non-finite norm: its rows of a and g set to 0 (inf * 0 is NaN)
                    sums.extend(plan.clipped(_zero_rows(keep[0], finite), _zero_rows(g, finite), scale))
                else:
                    sums.extend(plan.clipped(keep[0], g, scale))
            return sums

        # the pass that zeroes rows runs only when some record's norm is not finite (one cond for all layers)
        sums = tf.cond(tf.reduce_all(finite), lambda: ghost_sums(False), lambda: ghost_sums(True))
        sums = list(sums) + [tf.tensordot(factors, _zero_rows(g, finite), axes=1) for g in per_example]
        return sums, norms


def ghost_applies(model: tf.keras.Model) -> bool:
    """True if the ghost engine applies: a graph network with at least one layer it plans (Dense, Embedding,
    LayerNormalization, Conv1D/Conv2D, EinsumDense or MultiHeadAttention; ghost_plans.ghost_layers)."""
    found = ghost_layers(model)
    return found is not None and bool(found[0])


def _check_ghost_types(types: Collection[type] | None) -> frozenset[type] | None:
    """``types`` as a set of layer classes the ghost engine plans (None: all), else a DpSgdConfigError."""
    if types is None:
        return None
    known = ghost_types()
    if isinstance(types, (str, type)) or any(t not in known for t in types):
        raise DpSgdConfigError(
            f"ghost_types={types!r} is invalid: must be a collection of layer classes among "
            f"{[t.__name__ for t in known]}"
        )
    return frozenset(types)


GHOST_REFUSED = (
    "the ghost engine is invalid for this model: it needs a Keras graph network (Functional, or "
    f"Sequential with a known input shape) with at least one {GHOST_LAYERS} layer; use 'vmap'"
)


def make_engine(
    name: str,
    model: tf.keras.Model,
    per_example_loss: LossFn,
    clip_norm: float,
    noise_multiplier: float,
    seed: int | None = None,
    *,
    vectorized: bool = True,
    **options: Any,
) -> _Engine:
    """The engine ``name`` (one of ``ENGINES``) for ``model``: ghost, vmap, loop or tf_privacy.

    Args:
      name: the engine; a DpSgdConfigError names it if it is not in ``ENGINES``.
      model: the Keras model whose trainable variables it clips and noises.
      per_example_loss: (y, model output) -> one loss per record.
      clip_norm: C, the L2 bound of each record's gradient (the sensitivity of the sum).
      noise_multiplier: sigma; the noise std on each coordinate is sigma * C.
      seed: the noise generator's seed (None: fresh OS entropy; tf_privacy draws from TensorFlow's global one).
      vectorized: for ghost, how its fallback variables get per-example gradients (vmap or the loop).
      **options: tf_privacy's ``num_microbatches`` (speed comparisons only); ghost's ``ghost_types`` (the layer
        classes it plans, default all; the others' variables go to the per-example fallback).
    """
    if name == "ghost":
        return LayerGhostEngine(
            model, per_example_loss, clip_norm, noise_multiplier, seed, vectorized=vectorized, **options
        )
    if name in ("vmap", "loop"):
        return PerExampleEngine(model, per_example_loss, clip_norm, noise_multiplier, seed, vectorized=name == "vmap")
    if name == "tf_privacy":
        return TfPrivacyEngine(model, per_example_loss, clip_norm, noise_multiplier, seed, **options)
    raise DpSgdConfigError(f"engine {name!r} is invalid: choose one of {ENGINES}")
