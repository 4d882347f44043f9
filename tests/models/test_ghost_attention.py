"""Ghost clipping of EinsumDense and MultiHeadAttention: per-example squared norms and clipped sums equal the
vmap engine's explicit per-example gradients (masks, causal mask, key_dim != value_dim, biases on/off), equations
and layers the plans cannot map stay in the fallback, and make_private fits an attention model without fallback
variables. Imports TensorFlow. All data here is GENERATED (numpy, fixed seeds)."""

import numpy as np
import pytest

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)

tf = pytest.importorskip("tensorflow")

from sage_tfx.models import make_private  # noqa: E402
from sage_tfx.models.dpsgd_engine import LayerGhostEngine, make_engine  # noqa: E402
from sage_tfx.models.ghost_plans import ghost_layers  # noqa: E402
from sage_tfx.models.ghost_plans_einsum import parse_equation  # noqa: E402
from sage_tfx.models.losses import per_example_loss  # noqa: E402
from sage_tfx.privacy.dpsgd import DpSgdConfigError  # noqa: E402
from tests.helpers.ghost import assert_ghost_equals_vmap  # noqa: E402

CLIP = 0.5
layers = tf.keras.layers


def _einsum_model(seed, use_bias):
    """EinsumDense nodes on a [B, 5, 4] input: MultiHeadAttention's query (abc,cde->abde) and output
    (abde,dej->abj) equations, the Dense-like ``...c,cd->...d``, a summed-away axis (abc,cd->ad), a kernel
    over two input axes with 9 kept positions (the explicit path: T^2 > d_in d_out) and a per-head
    kernel (abc,bcd->abd: an axis in input, kernel and output, refused to the fallback)."""
    init = tf.keras.initializers.GlorotUniform(seed=seed)

    def dense(equation, shape, bias, **kw):
        return layers.EinsumDense(
            equation, output_shape=shape, bias_axes=bias if use_bias else None, kernel_initializer=init, **kw
        )

    inp = tf.keras.Input(shape=(5, 4))
    grid = tf.keras.Input(shape=(9, 2, 3))
    heads = dense("abc,cde->abde", (5, 2, 3), "de", activation="tanh")(inp)
    parts = [
        dense("abde,dej->abj", (5, 6), "j")(heads),
        dense("...c,cd->...d", 3, "d")(inp),
        dense("abc,cd->ad", 7, "d")(inp),
        dense("atcd,cde->ate", (9, 2), "e")(grid),
        dense("abc,bcd->abd", (5, 2), "d")(inp),
    ]
    h = layers.Concatenate()([layers.Flatten()(p) for p in parts])
    return tf.keras.Model([inp, grid], layers.Dense(1, kernel_initializer=init)(h))


def _data(shapes, n=10, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(n, *s)).astype(np.float32) for s in shapes], (rng.normal(size=n) * 5).astype(np.float32)


@pytest.mark.parametrize("use_bias", [True, False])
def test_einsum_dense_ghost_equals_the_vmap_per_example_gradients(use_bias):
    model = _einsum_model(0, use_bias)
    plans, _, fallback = ghost_layers(model)
    per_head = next(la for la in model.layers if getattr(la, "equation", "") == "abc,bcd->abd")
    assert {v.ref() for v in fallback} == {v.ref() for v in per_head.trainable_weights}
    assert sum(p.kind == "einsum_dense" for p in plans.values()) == 5
    assert_ghost_equals_vmap(model, *_data([(5, 4), (9, 2, 3)]), CLIP)


@pytest.mark.parametrize(
    "equation,rank",
    [("abc,bcd->abd", 3), ("ab...,bc->ac...", 3), ("abc,cd->bd", 3), ("abc,acd->abd", 3), ("aac,cd->ad", 3)],
)
def test_equations_the_plan_cannot_map_are_refused(equation, rank):
    assert parse_equation(equation, rank) is None


def _attention_model(seed, use_bias, mask):
    """Two MultiHeadAttention layers: cross attention (key_dim 3 != value_dim 5, a separate key, ``mask``: an
    attention_mask input, the Keras mask of an Embedding with mask_zero, or none) and causal self attention
    returning its scores, then a Dense head."""
    init = tf.keras.initializers.GlorotUniform(seed=seed)
    query = tf.keras.Input(shape=(6, 8), name="query")
    ids = tf.keras.Input(shape=(4,), dtype=tf.int32, name="ids")
    key = tf.keras.Input(shape=(4, 8), name="key")
    allowed = tf.keras.Input(shape=(6, 4), dtype=tf.bool, name="allowed")
    value = layers.Embedding(7, 8, mask_zero=mask == "keras", embeddings_initializer=init)(ids)
    cross = layers.MultiHeadAttention(2, 3, value_dim=5, use_bias=use_bias, kernel_initializer=init)
    kwargs = {"attention_mask": allowed} if mask == "input" else {}
    h = cross(query, value, key, **kwargs)
    h, scores = layers.MultiHeadAttention(2, 4, use_bias=not use_bias, kernel_initializer=init)(
        h, h, use_causal_mask=True, return_attention_scores=True
    )
    h = layers.Concatenate()([layers.Flatten()(h), layers.Flatten()(scores)])
    return tf.keras.Model([query, ids, key, allowed], layers.Dense(1, kernel_initializer=init)(h))


def _attention_data(n=10, seed=1):
    rng = np.random.default_rng(seed)
    (query, key), y = _data([(6, 8), (4, 8)], n, seed)
    ids = rng.integers(0, 7, size=(n, 4)).astype(np.int32)
    ids[:, 0] = 1 + ids[:, 0] % 6  # at least one unmasked key per record
    allowed = rng.random((n, 6, 4)) > 0.3
    allowed[:, :, 0] = True
    return [query, ids, key, allowed], y


@pytest.mark.parametrize("use_bias,mask", [(True, "input"), (False, "keras"), (True, None)])
def test_attention_ghost_equals_the_vmap_per_example_gradients(use_bias, mask):
    model = _attention_model(0, use_bias, mask)
    plans, _, fallback = ghost_layers(model)
    assert [p.kind for p in plans.values()].count("multi_head_attention") == 2
    assert not fallback
    assert_ghost_equals_vmap(model, *_attention_data(), CLIP)


def test_attention_passes_the_query_mask_on_like_keras():
    """Self-attention on an Embedding with mask_zero: the query's mask masks the attention and, kept on the
    layer's output, the pooling after it (without it the norms differ)."""
    init = tf.keras.initializers.GlorotUniform(seed=0)
    ids = tf.keras.Input(shape=(6,), dtype=tf.int32)
    tokens = layers.Embedding(7, 8, mask_zero=True, embeddings_initializer=init)(ids)
    h = layers.GlobalAveragePooling1D()(layers.MultiHeadAttention(2, 3, kernel_initializer=init)(tokens, tokens))
    model = tf.keras.Model(ids, layers.Dense(1, kernel_initializer=init)(h))
    x = np.random.default_rng(2).integers(0, 7, size=(10, 6)).astype(np.int32)
    x[:, 0] = 1
    assert not ghost_layers(model)[2]
    assert_ghost_equals_vmap(model, [x], _data([], seed=1)[1], CLIP)


@pytest.mark.parametrize("axes", [None, (1, 2)])
def test_attention_on_a_grid_equals_the_vmap_per_example_gradients(axes):
    """A [B, 3, 4, 8] query (projection equations of rank 4), attention over one or both grid axes,
    value_dim 2 and an output_shape other than the query's."""
    init = tf.keras.initializers.GlorotUniform(seed=0)
    grid = tf.keras.Input(shape=(3, 4, 8))
    h = layers.MultiHeadAttention(2, 3, value_dim=2, attention_axes=axes, output_shape=(5,), kernel_initializer=init)(
        grid, grid
    )
    model = tf.keras.Model(grid, layers.Dense(1, kernel_initializer=init)(layers.Flatten()(h)))
    assert not ghost_layers(model)[2]
    assert_ghost_equals_vmap(model, *_data([(3, 4, 8)]), CLIP)


def test_attention_dropout_is_drawn_once_for_norm_and_sum():
    """With attention dropout, one record's clipped sum has norm min(||g||, C) for the norm the engine reports:
    the norm and the sum come from the same dropout mask (the clip bound C holds exactly)."""
    inp = tf.keras.Input(shape=(6, 8))
    h = layers.MultiHeadAttention(2, 4, dropout=0.5)(inp, inp)
    model = tf.keras.Model(inp, layers.Dense(1)(layers.Flatten()(h)))
    engine = LayerGhostEngine(model, per_example_loss("mse", model), CLIP, 0.0, seed=0)
    assert not engine.fallback
    (x,), y = _data([(6, 8)], n=1)
    for _ in range(5):
        sums, norms = engine.clipped_sum(tf.constant(x), tf.constant(y * 100))
        total = np.sqrt(sum(float(tf.reduce_sum(tf.square(s))) for s in sums))
        np.testing.assert_allclose(total, min(float(norms[0]), CLIP), rtol=1e-4)


def test_attention_gives_a_non_finite_record_zero():
    """A record whose gradient norm is not finite (an inf query) adds exactly 0; the others are unchanged."""
    model = _attention_model(0, True, "input")
    x, y = _attention_data()
    loss_fn = per_example_loss("mse", model)
    bad = [v.copy() for v in x]
    bad[0][3, 0, 0] = np.inf
    engine = LayerGhostEngine(model, loss_fn, CLIP, 0.0, seed=0)
    sums, norms = engine.clipped_sum([tf.constant(v) for v in bad], tf.constant(y))
    assert not np.isfinite(norms.numpy()[3])
    keep = np.arange(len(y)) != 3
    vmap = make_engine("vmap", model, loss_fn, CLIP, 0.0)
    want, _ = vmap.clipped_sum([tf.constant(v[keep]) for v in x], tf.constant(y[keep]))
    order = {v.ref(): i for i, v in enumerate(engine.variables)}
    for ref, variable in zip(want, vmap.variables):
        got = sums[order[variable.ref()]].numpy()
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_a_subclassed_attention_layer_stays_in_the_fallback():
    class Custom(layers.MultiHeadAttention):
        pass

    inp = tf.keras.Input(shape=(6, 8))
    custom = Custom(2, 4)
    model = tf.keras.Model(inp, layers.Dense(1)(layers.Flatten()(custom(inp, inp))))
    _, _, fallback = ghost_layers(model)
    assert {v.ref() for v in fallback} == {v.ref() for v in custom.trainable_weights}


def test_ghost_types_sends_the_other_layers_to_the_fallback():
    model = _attention_model(0, True, "input")
    loss_fn = per_example_loss("mse", model)
    engine = make_engine("ghost", model, loss_fn, CLIP, 0.0, ghost_types={layers.Dense, layers.Embedding})
    attention = [la for la in model.layers if isinstance(la, layers.MultiHeadAttention)]
    assert {v.ref() for v in engine.fallback} == {v.ref() for la in attention for v in la.trainable_weights}
    with pytest.raises(DpSgdConfigError, match=r"ghost_types=.*Conv3D.*is invalid"):
        make_engine("ghost", model, loss_fn, CLIP, 0.0, ghost_types={layers.Conv3D})


def test_make_private_fits_an_attention_model_all_ghost():
    model = _attention_model(0, True, "input")
    x, y = _attention_data(200)
    private = make_private(model, privacy_budget=(2.0, 1e-5), num_examples=200, loss="mse", batch_size=20, seed=0)
    private.fit(x, y)
    assert private.privacy_spent["implementation"] == "make_private/ghost"
    assert private.engine.name == "ghost" and not private.engine.fallback
    assert np.all(np.isfinite(private.predict(x)))
