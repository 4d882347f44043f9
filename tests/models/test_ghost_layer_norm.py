"""Ghost clipping of LayerNormalization: its per-example squared norms and clipped sums equal the vmap
engine's explicit per-example gradients, and make_private fits a model with it without fallback variables.
Imports TensorFlow. All data here is GENERATED (numpy, fixed seeds)."""

import numpy as np
import pytest

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)

tf = pytest.importorskip("tensorflow")

from sage_tfx.models import make_private  # noqa: E402
from sage_tfx.models.ghost_plans import ghost_layers  # noqa: E402
from tests.helpers.ghost import assert_ghost_equals_vmap  # noqa: E402

CLIP = 0.5


def _model(seed, center, scale):
    """Random Functional model with three LayerNormalizations: on a [B, 5] vector, on a masked [B, 6, 4]
    sequence (Embedding with mask_zero, the mask reaches the pooling), on the Dense-projected sequence."""
    rng = np.random.default_rng(seed)
    init = tf.keras.initializers.GlorotUniform(seed=seed)
    num = tf.keras.Input(shape=(5,), name="num")
    seq = tf.keras.Input(shape=(6,), dtype=tf.int32, name="seq")
    emb = tf.keras.layers.Embedding(9, 4, mask_zero=True, embeddings_initializer=init)(seq)
    ln_seq = tf.keras.layers.LayerNormalization(center=center, scale=scale, epsilon=1e-2)(emb)
    proj = tf.keras.layers.Dense(3, activation="tanh", kernel_initializer=init)(ln_seq)
    pooled = tf.keras.layers.GlobalAveragePooling1D()(tf.keras.layers.LayerNormalization(axis=-1)(proj))
    ln_num = tf.keras.layers.LayerNormalization(center=center, scale=scale)(num)
    h = tf.keras.layers.Concatenate()([pooled, ln_num])
    model = tf.keras.Model([num, seq], tf.keras.layers.Dense(1, kernel_initializer=init)(h))
    for layer in model.layers:  # random gamma / beta, not the initial ones / zeros
        if isinstance(layer, tf.keras.layers.LayerNormalization):
            layer.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in layer.get_weights()])
    return model


def _data(n=10, seed=1):
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, 9, size=(n, 6)).astype(np.int32)
    seq[:, 4:] = 0  # padding: masked positions
    return [rng.normal(size=(n, 5)).astype(np.float32) * 3, seq], (rng.normal(size=n) * 5).astype(np.float32)


@pytest.mark.parametrize("center,scale", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("seed", [0, 1])
def test_layer_norm_ghost_equals_the_vmap_per_example_gradients(seed, center, scale):
    model = _model(seed, center, scale)
    x, y = _data(seed=seed + 1)
    model(x, training=False)
    plans, _, fallback = ghost_layers(model)
    assert not fallback
    assert sum(type(p.layer).__name__ == "LayerNormalization" for p in plans.values()) == 3
    assert_ghost_equals_vmap(model, x, y, CLIP)


def test_layer_norm_on_another_axis_stays_in_the_fallback():
    inp = tf.keras.Input(shape=(3, 4))
    ln = tf.keras.layers.LayerNormalization(axis=1)
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(ln(inp))))
    _, _, fallback = ghost_layers(model)
    assert {v.ref() for v in fallback} == {v.ref() for v in ln.trainable_weights}


def test_make_private_fits_a_layer_norm_model_all_ghost():
    model = _model(0, True, True)
    x, y = _data(200)
    private = make_private(model, privacy_budget=(2.0, 1e-5), num_examples=200, loss="mse", batch_size=20, seed=0)
    private.fit(x, y)
    assert private.privacy_spent["implementation"] == "make_private/ghost"
    assert private.engine.name == "ghost" and not private.engine.fallback
    ln_vars = {
        v.ref()
        for layer in model.layers
        if isinstance(layer, tf.keras.layers.LayerNormalization)
        for v in layer.trainable_weights
    }
    assert len(ln_vars) == 6 and ln_vars <= {v.ref() for v in private.engine.variables}
    assert np.all(np.isfinite(private.predict(x)))
