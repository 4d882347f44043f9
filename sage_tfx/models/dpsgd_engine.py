"""DP-SGD gradient engines: the clipped, noised gradient SUM of one Poisson-sampled batch.

Every engine computes, for a batch of records (x_i, y_i) and the model's
trainable variables::

    noisy_sum = sum_i clip(grad loss_i, C) + N(0, (sigma*C)^2 I)
    clip(g, C) = g * min(1, C / ||g||_2)        (||g|| over ALL variables together)

so one record changes the sum by at most C in L2 norm (its clipped gradient),
and the noise is Gaussian of std sigma*C on every coordinate: a Gaussian
mechanism of noise multiplier sigma (sage_tfx.privacy.dpsgd accounts for it).
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
import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)

import tensorflow as tf

IMPLEMENTATIONS = ("ghost", "vmap", "tf_privacy")
DEFAULT_IMPLEMENTATION = "ghost"


def dense_layers(model):
    """The model's layers if it is a plain stack of Dense layers, else None."""
    layers = [layer for layer in model.layers if not isinstance(layer, tf.keras.layers.InputLayer)]
    if layers and all(type(layer) is tf.keras.layers.Dense for layer in layers):
        return layers
    return None


class _Engine:
    def __init__(self, model, per_example_loss, clip_norm, noise_multiplier, seed=None):
        if not clip_norm > 0:
            raise ValueError(f"clip_norm={clip_norm!r} is invalid: must be > 0")
        if not noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier={noise_multiplier!r} is invalid: must be >= 0")
        self.model = model
        self.per_example_loss = per_example_loss
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.variables = list(model.trainable_variables)
        self._generator = (tf.random.Generator.from_seed(seed) if seed is not None
                           else tf.random.Generator.from_non_deterministic_state())

    def noise(self):
        std = self.noise_multiplier * self.clip_norm
        return [self._generator.normal(tf.shape(v), stddev=std, dtype=v.dtype) for v in self.variables]

    def noisy_sum(self, x, y):
        """sum of clipped per-example gradients + N(0, (sigma C)^2), aligned with ``self.variables``."""
        clipped, _ = self.clipped_sum(x, y)
        return [g + n for g, n in zip(clipped, self.noise())]

    def _factors(self, sq_norms):
        """(clip factors, norms, finite): factor min(1, C/||g||), 0 where ||g|| is not finite."""
        norms = tf.sqrt(sq_norms)
        finite = tf.math.is_finite(norms)
        factors = tf.minimum(1.0, self.clip_norm / tf.maximum(norms, 1e-12))
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
            raise ValueError("the ghost engine needs a model made only of Dense layers; use 'vmap'")
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
        from sage_tfx.compat.tf_privacy import dp_keras_optimizers

        dp = dp_keras_optimizers()
        self.num_microbatches = num_microbatches
        # noise comes from tf.random.normal (global seed); learning rate unused: we only take gradients
        self.optimizer = dp.DPKerasSGDOptimizer(
            l2_norm_clip=self.clip_norm, noise_multiplier=self.noise_multiplier,
            num_microbatches=num_microbatches, learning_rate=1.0,
        )

    def noisy_sum(self, x, y):
        def loss():
            return self.per_example_loss(y, self.model(x, training=True))

        grads_and_vars = self.optimizer._compute_gradients(loss, self.variables, tape=tf.GradientTape())
        count = tf.shape(x)[0] if self.num_microbatches is None else self.num_microbatches
        count = tf.cast(count, self.variables[0].dtype)
        return [g * count for g, _ in grads_and_vars]  # it returned (sum + noise) / microbatches

    def clipped_sum(self, x, y):
        if self.noise_multiplier != 0:
            raise ValueError("tf_privacy engine: clipped_sum needs noise_multiplier=0 (it always adds noise)")
        return self.noisy_sum(x, y), None


_ENGINES = {e.name: e for e in (GhostClipEngine, VectorizedEngine, TfPrivacyEngine)}


def make_engine(implementation, model, per_example_loss, clip_norm, noise_multiplier, seed=None, **options):
    if implementation not in _ENGINES:
        raise ValueError(f"implementation={implementation!r} is invalid: choose one of {IMPLEMENTATIONS}")
    return _ENGINES[implementation](model, per_example_loss, clip_norm, noise_multiplier, seed, **options)
