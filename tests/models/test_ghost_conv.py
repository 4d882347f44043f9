"""Ghost clipping of Conv1D / Conv2D (the unfold trick): per-example squared norms and clipped sums equal the
vmap engine's explicit per-example gradients, and make_private fits a conv model without fallback variables.
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


def _model(seed, padding, strides, use_bias):
    """Random Functional model: Conv2D on [B, 7, 6, 2] (two stacked, the explicit [B, k, c_out] path: T^2 >
    k c_out), a wide strided Conv2D on the same input (4 positions: the Gram path), Conv1D on [B, 9, 3]."""
    init = tf.keras.initializers.GlorotUniform(seed=seed)
    img = tf.keras.Input(shape=(7, 6, 2), name="img")
    seq = tf.keras.Input(shape=(9, 3), name="seq")
    c2 = tf.keras.layers.Conv2D(
        4,
        (3, 2),
        strides=strides,
        padding=padding,
        use_bias=use_bias,
        activation="tanh",
        kernel_initializer=init,
        bias_initializer=init,
    )(img)
    c2 = tf.keras.layers.Conv2D(2, 1, kernel_initializer=init, use_bias=use_bias)(c2)
    c1 = tf.keras.layers.Conv1D(
        3, 3, strides=strides[0], padding=padding, use_bias=use_bias, kernel_initializer=init, bias_initializer=init
    )(seq)
    wide = tf.keras.layers.Conv2D(16, 3, strides=3, use_bias=use_bias, kernel_initializer=init)(img)
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(t) for t in (c2, c1, wide)])
    return tf.keras.Model([img, seq], tf.keras.layers.Dense(1, kernel_initializer=init)(h))


def _data(n=10, seed=1):
    rng = np.random.default_rng(seed)
    x = [rng.normal(size=(n, 7, 6, 2)).astype(np.float32), rng.normal(size=(n, 9, 3)).astype(np.float32)]
    return x, (rng.normal(size=n) * 5).astype(np.float32)


@pytest.mark.parametrize(
    "padding,strides,use_bias", [("valid", (1, 1), True), ("same", (2, 2), True), ("same", (1, 2), False)]
)
def test_conv_ghost_equals_the_vmap_per_example_gradients(padding, strides, use_bias):
    model = _model(0, padding, strides, use_bias)
    x, y = _data()
    model(x, training=False)
    plans, _, fallback = ghost_layers(model)
    assert not fallback
    assert sum(type(p.layer).__name__.startswith("Conv") for p in plans.values()) == 4
    assert_ghost_equals_vmap(model, x, y, CLIP)


def test_dilated_grouped_and_causal_convs_stay_in_the_fallback():
    inp = tf.keras.Input(shape=(8, 4))
    convs = [
        tf.keras.layers.Conv1D(2, 2, dilation_rate=2),
        tf.keras.layers.Conv1D(2, 2, groups=2),
        tf.keras.layers.Conv1D(2, 2, padding="causal"),
    ]
    h = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(c(inp)) for c in convs])
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1)(h))
    _, _, fallback = ghost_layers(model)
    assert {v.ref() for v in fallback} == {v.ref() for c in convs for v in c.trainable_weights}


def test_make_private_fits_a_conv_model_all_ghost():
    model = _model(0, "same", (2, 2), True)
    x, y = _data(200)
    private = make_private(model, privacy_budget=(2.0, 1e-5), num_examples=200, loss="mse", batch_size=20, seed=0)
    private.fit(x, y)
    assert private.privacy_spent["implementation"] == "make_private/ghost"
    assert private.engine.name == "ghost" and not private.engine.fallback
    conv_vars = {v.ref() for layer in model.layers if "conv" in layer.name for v in layer.trainable_weights}
    assert len(conv_vars) == 8 and conv_vars <= {v.ref() for v in private.engine.variables}
    assert np.all(np.isfinite(private.predict(x)))


@pytest.mark.parametrize("padding", ["VALID", "SAME"])
def test_unfold_patches_is_extract_patches(padding):
    """The slice-and-reshape unfold gives extract_patches' values in its order, for every kernel, stride and
    odd / even size (SAME's zeros split as TensorFlow splits them)."""
    from sage_tfx.models.ghost_plans_conv import unfold_patches

    rng = np.random.default_rng(0)
    for rows, cols in [(5, 1), (8, 6), (9, 7)]:
        for kernel in [(1, 1), (3, 3), (2, 3), (3, 1)]:
            for strides in [(1, 1), (2, 2), (1, 3)]:
                if kernel[0] > rows or kernel[1] > cols:
                    continue
                x = tf.constant(rng.normal(size=(2, rows, cols, 3)).astype(np.float32))
                want = tf.image.extract_patches(x, [1, *kernel, 1], [1, *strides, 1], [1, 1, 1, 1], padding)
                np.testing.assert_array_equal(unfold_patches(x, kernel, strides, padding).numpy(), want.numpy())
