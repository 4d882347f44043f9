"""DP-SGD gradient engines: the clipped, noised gradient SUM of one Poisson-sampled batch.

Every engine computes, for a batch of records (x_i, y_i) and the model's
trainable variables::

    noisy_sum = sum_i clip(grad loss_i, C) + N(0, (sigma*C)^2 I)
    clip(g, C) = g * min(1, C / ||g||_2)        (||g|| over ALL variables together)

so one record changes the sum by at most C in L2 norm (its clipped gradient),
and the noise is Gaussian of std sigma*C on every coordinate: a Gaussian
mechanism of noise multiplier sigma (sage_tfx.privacy.dpsgd accounts for it).
sigma may change between steps (``set_noise_multiplier``: a noise schedule's
sigma_t, sage_tfx.privacy.noise_schedules, accounted step by step there); it is
held in a variable the traced step reads, and so is C.

Adaptive clipping (``adapt_clip``; sage_tfx.privacy.adaptive_clip, Andrew et al.
2021): C_t moves each step towards a target quantile of the per-example norms,
driven only by a noisy count of the unclipped records (std sigma_b, drawn from the
same generator), and the sum's noise multiplier is z_Delta =
(z^-2 - (2 sigma_b)^-2)^-1/2, so the step (sum and count) is the Gaussian
mechanism of the accounted z. Every own engine supports it (their clipped_sum
returns the norms); tf_privacy refuses it.
The training loop divides by the EXPECTED batch size, a public number, never by
the sampled size.

A record whose gradient norm is not finite (NaN, or an overflow to inf) would
turn the whole sum into NaN and so reveal itself; the own engines give it the
clipped gradient 0 instead (``clip(g, C) := 0`` when ||g|| is not finite: a
fixed function of the record and the current model, of norm 0 <= C, so the
sensitivity stays C). The models map non-finite inputs to public defaults
before (sage_tfx.models.data); this guards what remains. The tf_privacy engine
has no such guard.

Engines:
  * ``ghost`` (the project's own, default): models made only of Dense layers.
    One backward pass to the pre-activations z_l = a_l W_l + b_l of each layer
    gives g_l,i = d loss_i / d z_l,i. A Dense layer's per-example gradient is the
    outer product a_l,i g_l,i' (plus g_l,i for the bias), so its squared norm is
    (||a_l,i||^2 + 1) ||g_l,i||^2 ("ghost norm", Goodfellow 2015; Li et al. 2021)
    and the clipped sum is a_l' diag(c) g_l with c_i = min(1, C/||grad_i||):
    no per-example gradient is ever materialised.
  * ``vmap``: any Keras model; per-example gradients by ``tf.vectorized_map``
    over a GradientTape, then clip and sum (memory: batch x parameters).
  * ``tf_privacy``: tensorflow-privacy's ``DPKerasSGDOptimizer`` (through
    sage_tfx.compat.tf_privacy) with one example per microbatch; its averaged
    result is multiplied back by the batch size to give the same sum.

Noise comes from TensorFlow's Philox generator (as in tensorflow-privacy), not a
cryptographic source; floating-point noise has the usual caveats (Mironov 2012).
"""
import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
import tensorflow as tf  # noqa: TID253

from sage_tfx.privacy import checks
from sage_tfx.privacy.adaptive_clip import sum_noise_multiplier
from sage_tfx.privacy.dpsgd import DpSgdConfigError

IMPLEMENTATIONS = ("ghost", "vmap", "tf_privacy")
DEFAULT_IMPLEMENTATION = "ghost"


def dense_layers(model):
    """The model's layers if it is a plain stack of Dense layers, else None."""
    layers = [layer for layer in model.layers if not isinstance(layer, tf.keras.layers.InputLayer)]
    if layers and all(type(layer) is tf.keras.layers.Dense for layer in layers):
        return layers
    return None


_INVALID = "{what}={value!r} is invalid: must be {rule}"


def _check_noise_multiplier(noise_multiplier):
    """sigma as a finite float >= 0 (0: no noise, e.g. clipped_sum), else a DpSgdConfigError naming it."""
    return checks.number(noise_multiplier, "noise_multiplier", low=0.0, error=DpSgdConfigError, message=_INVALID)


class _Engine:
    def __init__(self, model, per_example_loss, clip_norm, noise_multiplier, seed=None):
        self.clip_norm = checks.positive(clip_norm, "clip_norm", error=DpSgdConfigError, message=_INVALID)
        self.noise_multiplier = _check_noise_multiplier(noise_multiplier)
        self.model = model
        self.per_example_loss = per_example_loss
        self.variables = list(model.trainable_variables)
        self._generator = (tf.random.Generator.from_seed(seed) if seed is not None
                           else tf.random.Generator.from_non_deterministic_state())
        # the clip norm C and the sum's noise multiplier live in variables the traced steps read, so a noise
        # schedule (sage_tfx.privacy.noise_schedules) changes sigma_t and adaptive clipping changes C_t per step
        # without retracing; float64, cast to each variable's dtype (the same rounding as the constants they
        # replace). The noise std is their product.
        self._clip = tf.Variable(self.clip_norm, trainable=False, dtype=tf.float64, name="dp_clip_norm")
        self._sum_sigma = tf.Variable(self.noise_multiplier, trainable=False, dtype=tf.float64,
                                      name="dp_sum_noise_multiplier")
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
            self.adaptive, self._count_stddev, self._expected_batch = \
                other.adaptive, other._count_stddev, other._expected_batch
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

    def noise(self):
        return [self._generator.normal(tf.shape(v), stddev=self._std(v.dtype), dtype=v.dtype)
                for v in self.variables]

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
                [], stddev=tf.constant(self._count_stddev, tf.float64), dtype=tf.float64)
            fraction = tf.clip_by_value(count / self._expected_batch + 0.5, 0.0, 1.0)
            update = self._clip.assign(clip * tf.exp(-self.adaptive.learning_rate
                                                     * (fraction - self.adaptive.target_quantile)))
        with tf.control_dependencies([update]):
            return [tf.identity(g) for g in noisy]

    def _factors(self, sq_norms):
        """(clip factors, norms, finite): factor min(1, C/||g||), 0 where ||g|| is not finite."""
        norms = tf.sqrt(sq_norms)
        finite = tf.math.is_finite(norms)
        factors = tf.minimum(1.0, tf.cast(self._clip, norms.dtype) / tf.maximum(norms, 1e-12))
        return tf.where(finite, factors, tf.zeros_like(factors)), norms, finite


def _zero_rows(t, keep):
    """``t`` with the rows (first axis) where ``keep`` is False set to 0 (so that inf * 0 never makes NaN)."""
    mask = tf.reshape(keep, tf.concat([[-1], tf.ones([tf.rank(t) - 1], tf.int32)], axis=0))
    return tf.where(mask, t, tf.zeros_like(t))


class GhostClipEngine(_Engine):
    """Own engine for Dense-only models: ghost norms, one backward pass, no per-example gradients."""

    name = "ghost"

    def __init__(self, model, per_example_loss, clip_norm, noise_multiplier, seed=None):
        super().__init__(model, per_example_loss, clip_norm, noise_multiplier, seed)
        self.layers = dense_layers(model)
        if self.layers is None:
            raise DpSgdConfigError("the ghost engine needs a model made only of Dense layers; use 'vmap'")
        self.variables = []
        for layer in self.layers:
            self.variables.append(layer.kernel)
            if layer.use_bias:
                self.variables.append(layer.bias)

    def clipped_sum(self, x, y):
        """(clipped gradient sum, per-example gradient norms before clipping)."""
        inputs, pre = [], []
        with tf.GradientTape() as tape:
            a = tf.convert_to_tensor(x)
            for layer in self.layers:
                inputs.append(a)
                z = tf.matmul(a, layer.kernel)
                if layer.use_bias:
                    z = z + layer.bias
                pre.append(z)
                a = layer.activation(z)
            total = tf.reduce_sum(self.per_example_loss(y, a))
        grads_z = tape.gradient(total, pre)
        sq = 0.0
        for layer, a, g in zip(self.layers, inputs, grads_z):
            g_sq = tf.reduce_sum(tf.square(g), axis=1)
            a_sq = tf.reduce_sum(tf.square(a), axis=1) + (1.0 if layer.use_bias else 0.0)
            sq = sq + a_sq * g_sq
        factors, norms, finite = self._factors(sq)
        sums = []
        for layer, a, g in zip(self.layers, inputs, grads_z):
            scaled = _zero_rows(g, finite) * factors[:, None]
            sums.append(tf.matmul(_zero_rows(a, finite), scaled, transpose_a=True))
            if layer.use_bias:
                sums.append(tf.reduce_sum(scaled, axis=0))
        return sums, norms


class VectorizedEngine(_Engine):
    """Own engine for any Keras model: per-example gradients with tf.vectorized_map."""

    name = "vmap"

    def clipped_sum(self, x, y):
        def one(args):
            xi, yi = args
            with tf.GradientTape() as tape:
                loss = self.per_example_loss(yi[None], self.model(xi[None], training=True))[0]
            return tape.gradient(loss, self.variables, unconnected_gradients="zero")

        per_example = tf.vectorized_map(one, (x, y))
        sq = tf.add_n([tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1)
                       for g in per_example])
        factors, norms, finite = self._factors(sq)
        return [tf.tensordot(factors, _zero_rows(g, finite), axes=1) for g in per_example], norms


class TfPrivacyEngine(_Engine):
    """tensorflow-privacy's DPKerasSGDOptimizer, one example per microbatch."""

    name = "tf_privacy"

    def __init__(self, model, per_example_loss, clip_norm, noise_multiplier, seed=None, num_microbatches=None):
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
            l2_norm_clip=self.clip_norm, noise_multiplier=self.noise_multiplier,
            num_microbatches=num_microbatches, learning_rate=1.0,
        )

    def adapt_clip(self, adaptive, batch_size):
        raise DpSgdConfigError("the tf_privacy engine has a fixed clip norm: clip_norm='adaptive' needs the "
                               "'ghost' or 'vmap' implementation")

    def set_noise_multiplier(self, noise_multiplier):
        if noise_multiplier != self.noise_multiplier:
            raise DpSgdConfigError("the tf_privacy engine has a fixed noise multiplier: a noise schedule needs the "
                                   "'ghost' or 'vmap' implementation")

    def noisy_sum(self, x, y):
        def loss():
            return self.per_example_loss(y, self.model(x, training=True))

        grads_and_vars = self.optimizer._compute_gradients(loss, self.variables, tape=tf.GradientTape())
        count = tf.shape(x)[0] if self.num_microbatches is None else self.num_microbatches
        count = tf.cast(count, self.variables[0].dtype)
        return [g * count for g, _ in grads_and_vars]  # it returned (sum + noise) / microbatches

    def clipped_sum(self, x, y):
        if self.noise_multiplier != 0:
            raise DpSgdConfigError("tf_privacy engine: clipped_sum needs noise_multiplier=0 (it always adds noise)")
        return self.noisy_sum(x, y), None


_ENGINES = {e.name: e for e in (GhostClipEngine, VectorizedEngine, TfPrivacyEngine)}


def make_engine(implementation, model, per_example_loss, clip_norm, noise_multiplier, seed=None, **options):
    if implementation not in _ENGINES:
        raise DpSgdConfigError(f"implementation={implementation!r} is invalid: choose one of {IMPLEMENTATIONS}")
    return _ENGINES[implementation](model, per_example_loss, clip_norm, noise_multiplier, seed, **options)


# ------------------------------------------------------------------------- ghost clipping, any graph model

def _first(t):
    return tf.nest.map_structure(lambda v: v[None], t)


def per_example_gradients(model, per_example_loss, variables, x, y, vectorized=True):
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


def _row_sq_hint(node, args, kwargs, hints):
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
        if kwargs or not all(isinstance(t, tf.Tensor) and t.shape.rank == 2 for _, t in parts) \
                or layer.axis not in (-1, 1):
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


def graph_nodes(model):
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

    def __init__(self, layer, keras_input):
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
        return (tf.reshape(a, tf.stack([batch, -1, tf.shape(a)[-1]])),
                tf.reshape(g, tf.stack([batch, -1, tf.shape(g)[-1]])))

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

    def __init__(self, layer, keras_input):
        self.layer = layer
        shape = keras_input.shape
        self.steps = 1
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
    if not getattr(node, "_single_positional_tensor_passed", False) or len(node.keras_inputs) != 1:
        return None
    if getattr(layer, "_compute_dtype", None) != getattr(layer, "dtype", None):  # mixed precision: not here
        return None
    keras_input = node.keras_inputs[0]
    if type(layer) is tf.keras.layers.Dense and _plain_tensor(keras_input, 2) \
            and keras_input.dtype.is_floating and keras_input.shape[-1] is not None:
        return _DensePlan(layer, keras_input)
    if type(layer) is tf.keras.layers.Embedding and _plain_tensor(keras_input, 1) \
            and not getattr(layer, "sparse", False):
        return _EmbeddingPlan(layer, keras_input)
    return None


def ghost_layers(model):
    """(plans by node id, ghost variables, fallback variables) for a graph network, or None if it has no
    graph. Ghost: Dense (a dense float input of any rank >= 2) and Embedding (dense integer ids), each used
    by exactly one node, with no variable shared with another layer. Every other trainable variable
    (including those of a shared layer, a nested model, any other layer type) is a fallback variable."""
    nodes = graph_nodes(model)
    if nodes is None:
        return None
    trainable = {v.ref() for v in model.trainable_variables}
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
        plan = _ghost_plan(node.layer, node, shared)
        if plan is not None and all(v.ref() in trainable for v in plan.variables) \
                and len(plan.variables) == len(node.layer.trainable_weights):
            plans[id(node)] = plan
    ghost = [v for plan in plans.values() for v in plan.variables]
    ghost_refs = {v.ref() for v in ghost}
    fallback = [v for v in model.trainable_variables if v.ref() not in ghost_refs]
    return plans, ghost, fallback


class LayerGhostEngine(_Engine):
    """Ghost clipping per layer on any Keras graph network (Functional or built Sequential), with an exact
    per-example fallback for the trainable variables of other layers.

    One forward pass walks the model's graph (as Keras' Functional does) but computes each ghost layer's
    output itself, keeping its input and pre-activation; one backward pass gives every ghost layer's
    output gradient, from which its per-example squared gradient norm and clipped sum follow (_DensePlan,
    _EmbeddingPlan; layers without trainable weights, e.g. Normalization, CategoryEncoding, Concatenate,
    run as they are). The fallback variables (if any) get explicit per-example gradients: tf.vectorized_map
    over a GradientTape (``vectorized=True``) or a tf.map_fn loop. A record's squared norm over ALL
    trainable variables is the sum of the ghost layers' and the fallback's, so the clip factor
    min(1, C/||g_i||) is the one of the full per-example gradient, and one record moves the sum by at most
    C (the sensitivity the accountant assumes). Layers that draw randomness (Dropout) draw it separately in
    the ghost and the fallback pass; each part is still one record's gradient of some mask, and the clip
    uses both parts' norms, so the bound C holds.
    """

    name = "ghost"

    def __init__(self, model, per_example_loss, clip_norm, noise_multiplier, seed=None, vectorized=True):
        super().__init__(model, per_example_loss, clip_norm, noise_multiplier, seed)
        found = ghost_layers(model)
        if found is None or not found[0]:
            raise DpSgdConfigError("the layer ghost engine needs a Keras graph network (Functional or built "
                                   "Sequential) with at least one Dense or Embedding layer; use 'vmap'")
        self.plans, ghost, self.fallback = found
        self.nodes = graph_nodes(model)
        self.vectorized = vectorized
        self.variables = ghost + self.fallback

    def noise(self):
        """N(0, (sigma C)^2) on every coordinate of every variable: one draw of all coordinates, split (the
        same distribution as one draw per variable, in one op)."""
        if len({v.dtype for v in self.variables}) > 1:
            return super().noise()
        sizes = [v.shape.num_elements() for v in self.variables]
        dtype = self.variables[0].dtype
        flat = self._generator.normal([sum(sizes)], stddev=self._std(dtype), dtype=dtype)
        return [tf.reshape(part, v.shape) for part, v in zip(tf.split(flat, sizes), self.variables)]

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
                hint = _row_sq_hint(node, args, kwargs, hints)
                if hint is not None and len(node.flat_output_ids) == 1:
                    hints[node.flat_output_ids[0]] = hint
            else:
                outputs, keep = plan.forward(args[0], hints.get(node.flat_input_ids[0]))
                saved.append((plan, keep))
            for out_id, value in zip(node.flat_output_ids, tf.nest.flatten(outputs)):
                tensors[out_id] = [value] * usage[out_id]
        outputs = [tensors[str(id(ref))].pop() for ref in model.outputs]
        return tf.nest.pack_sequence_as(model._nested_outputs, outputs), saved

    def _fallback_gradients(self, x, y):
        return per_example_gradients(self.model, self.per_example_loss, self.fallback, x, y, self.vectorized)

    def clipped_sum(self, x, y):
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
