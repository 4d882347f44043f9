"""Debiased momentum (sage_tfx.models.momentum; Hong et al. Algorithm 2): the update is the paper's formula and
make_private with it spends exactly what plain DP-SGD spends, its weights moved by Algorithm 2 applied to the
SAME noisy gradients (post-processing). Imports TensorFlow. All data here is GENERATED (numpy, fixed seeds)."""

import numpy as np
import pytest

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)

tf = pytest.importorskip("tensorflow")

from sage_tfx.models import make_private  # noqa: E402
from sage_tfx.models.momentum import DebiasedMomentum, debiased_momentum_steps  # noqa: E402
from sage_tfx.privacy.dpsgd import DpSgdConfigError  # noqa: E402


def test_reference_is_algorithm_2_a_weighted_average_of_the_noisy_gradients():
    """v_hat_{t+1} = sum_i (1 - beta) beta^(t-i) g_i / (1 - beta^t): weights summing to 1 (the debiasing);
    the first update is the first gradient itself, not (1 - beta) of it."""
    rng = np.random.default_rng(0)
    g = rng.normal(size=(7, 3))
    beta, lr = 0.8, 0.3
    steps = debiased_momentum_steps(g, beta, lr)
    for t in range(1, 8):
        w = (1 - beta) * beta ** (t - np.arange(1, t + 1)) / (1 - beta**t)
        assert w.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(steps[t - 1], lr * (w @ g[:t]), rtol=1e-12)
    np.testing.assert_allclose(steps[0], lr * g[0], rtol=1e-12)
    np.testing.assert_allclose(debiased_momentum_steps(g, 0.0, lr), lr * g, rtol=1e-12)  # beta 0: plain SGD


def test_keras_optimizer_applies_the_reference_updates():
    rng = np.random.default_rng(1)
    g = rng.normal(size=(6, 2, 3))
    var = tf.Variable(np.ones((2, 3)), dtype=tf.float64)
    opt = DebiasedMomentum(learning_rate=0.2, beta=0.9)
    expected = np.ones((2, 3)) - np.cumsum(debiased_momentum_steps(g, 0.9, 0.2), axis=0)
    for t in range(6):
        opt.apply_gradients([(tf.constant(g[t]), var)])
        np.testing.assert_allclose(var.numpy(), expected[t], rtol=1e-7)  # lr, beta kept in float32


def _kernel_path(optimizer, momentum=0.0):
    """The output kernel after each step and privacy_spent of a fit where every x is 0: no record moves the
    kernel, so its step is exactly the optimizer applied to the engine's noise (same seed: same draws)."""
    n = 200
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, kernel_initializer="zeros")])
    model.build((None, 3))
    path = []
    private = make_private(
        model,
        privacy_budget=(1.0, 1e-5),
        num_examples=n,
        loss="mse",
        batch_size=50,
        epochs=10,
        optimizer=optimizer,
        momentum=momentum,
        learning_rate=1.0,
        seed=7,
    )
    private.fit(
        np.zeros((n, 3), np.float32),
        np.zeros(n, np.float32),
        callback=lambda _: path.append(model.layers[0].kernel.numpy().ravel().copy()),
    )
    return np.array(path, dtype=np.float64), private.privacy_spent


def test_make_private_debiased_momentum_is_post_processing_of_the_same_noisy_gradients():
    sgd_path, sgd_spent = _kernel_path("sgd")
    deb_path, deb_spent = _kernel_path("debiased_momentum", momentum=0.9)
    for key in ("epsilon", "delta", "noise_multiplier", "steps", "dp_event"):
        assert deb_spent[key] == sgd_spent[key], key
    noisy = -np.diff(np.vstack([np.zeros(3), sgd_path]), axis=0)  # lr 1: each sgd step is minus its gradient
    assert np.abs(noisy).min() > 0  # the noise is there
    expected = -np.cumsum(debiased_momentum_steps(noisy, 0.9, 1.0), axis=0)
    np.testing.assert_allclose(deb_path, expected, rtol=1e-4, atol=1e-6)
    # averaging: the late steps move the kernel less than plain SGD's steps (noise variance ~ (1-b)/(1+b))
    deb_steps = np.diff(deb_path, axis=0)[10:]
    assert np.std(deb_steps) < 0.5 * np.std(noisy[10:])


@pytest.mark.parametrize("momentum", [1.0, -0.1, True])
def test_bad_momentum_refused_naming_the_value(momentum):
    with pytest.raises(DpSgdConfigError, match="momentum"):
        make_private(
            tf.keras.Sequential([tf.keras.layers.Dense(1)]),
            privacy_budget=(1.0, 1e-5),
            num_examples=100,
            loss="mse",
            batch_size=10,
            optimizer="debiased_momentum",
            momentum=momentum,
        )
