"""Compare the layer ghost engine with the vmap engine's explicit per-example gradients (imports TensorFlow)."""

import numpy as np

import sage_tfx  # noqa: F401  (before TensorFlow)

import tensorflow as tf  # isort: skip

from sage_tfx.models.dpsgd_engine import LayerGhostEngine, make_engine
from sage_tfx.models.losses import per_example_loss


def _aligned(engine, sums, model):
    order = {v.ref(): i for i, v in enumerate(engine.variables)}
    return [sums[order[v.ref()]].numpy() for v in model.trainable_variables]


def assert_ghost_equals_vmap(model, x, y, clip):
    """LayerGhostEngine's per-example norms and clipped sums (MSE loss, no noise) equal the vmap engine's on
    (x, y), with at least half the records clipped (so the test exercises clipping)."""
    loss_fn = per_example_loss("mse", model)
    xs = [tf.constant(v) for v in x]
    ghost = LayerGhostEngine(model, loss_fn, clip, 0.0, seed=0)
    vmap = make_engine("vmap", model, loss_fn, clip, 0.0, seed=0)
    sums, norms = ghost.clipped_sum(xs, tf.constant(y))
    want, want_norms = vmap.clipped_sum(xs, tf.constant(y))
    assert (want_norms.numpy() > clip).sum() >= len(y) // 2
    np.testing.assert_allclose(norms.numpy(), want_norms.numpy(), rtol=1e-4)
    for got, ref in zip(_aligned(ghost, sums, model), _aligned(vmap, want, model)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
