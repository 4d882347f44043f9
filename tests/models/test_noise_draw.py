"""The DP-SGD noise draw (``dpsgd_engine.gaussian``): independent N(0, stddev^2) values, reproducible from the
generator's seed. Imports TensorFlow.

Statistical checks use fixed seeds; each bound fails for a correct sampler with probability below 1e-6
(stated per test).
"""

import math

import numpy as np
import pytest
from scipy import stats

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)

tf = pytest.importorskip("tensorflow")

from sage_tfx.models.dpsgd_engine import gaussian, make_engine  # noqa: E402
from sage_tfx.models.dpsgd_models import _mse, build_mlp  # noqa: E402

SIZE = 400_001  # odd: the last sine value is dropped


def _draw(seed, dtype, stddev=1.7, size=SIZE):
    generator = tf.random.Generator.from_seed(seed)
    return generator, gaussian(generator, size, tf.constant(stddev, dtype), dtype).numpy()


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=["float32", "float64"])
def test_the_draw_is_normal_with_the_given_std(dtype):
    """400,001 values: KS against N(0, 1.7^2) p > 1e-6 (false failure 1e-6); the variance ratio inside the chi2
    two-sided 1e-6 band; the mean within 5.3 standard errors (1.2e-7)."""
    _, values = _draw(5, dtype)
    assert values.shape == (SIZE,) and values.dtype == dtype.as_numpy_dtype
    assert stats.kstest(values / 1.7, "norm").pvalue > 1e-6
    ratio = np.mean(values.astype(np.float64) ** 2) / 1.7**2
    assert stats.chi2.ppf(5e-7, SIZE) / SIZE < ratio < stats.chi2.ppf(1 - 5e-7, SIZE) / SIZE, ratio
    assert abs(values.mean()) < 5.3 * 1.7 / math.sqrt(SIZE)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=["float16", "bfloat16"])
def test_a_16_bit_draw_keeps_the_float32_tails(dtype):
    """16-bit uniforms (steps of 2^-10 or 2^-7) would cap |value| at 3.7 or 3.1 sd; the draw is made in float32
    and cast. 400,001 values from N(0, 1): P(none beyond 4 sd) = (1 - 6.3e-5)^400001 < 1e-10 (false failure)."""
    _, values = _draw(11, dtype, stddev=1.0)
    assert values.dtype == dtype.as_numpy_dtype
    assert np.max(np.abs(values.astype(np.float64))) > 4.0


def test_the_cosine_and_sine_halves_are_independent():
    """The two halves share their radii: for independent normals the squares are uncorrelated, and so are the
    values themselves and two successive draws. Each |correlation| < 5.3 / sqrt(n) (false failure < 1e-7 each,
    the correlations being about normal with s.d. 1 / sqrt(n)); a shared radius with the wrong law moves the
    squares' correlation far from 0 (a constant radius makes it -1)."""
    generator, values = _draw(6, tf.float32)
    half = SIZE // 2
    cosines, sines = values[:half].astype(np.float64), values[half + 1 : 2 * half + 1].astype(np.float64)
    bound = 5.3 / math.sqrt(half)
    assert abs(np.corrcoef(cosines**2, sines**2)[0, 1]) < bound
    assert abs(np.corrcoef(cosines, sines)[0, 1]) < bound
    again = gaussian(generator, SIZE, tf.constant(1.7), tf.float32).numpy()
    assert abs(np.corrcoef(values, again)[0, 1]) < 5.3 / math.sqrt(SIZE)


def test_the_draw_is_reproducible_from_the_seed_and_differs_across_seeds():
    first, second, other = _draw(7, tf.float32)[1], _draw(7, tf.float32)[1], _draw(8, tf.float32)[1]
    np.testing.assert_array_equal(first, second)
    assert not np.allclose(first, other)


def test_an_engine_draws_every_variable_once_per_step_from_its_seed():
    """The engine's noise: one value per coordinate of every variable, the same under the same seed, fresh on the
    next step (no draw reused)."""
    model = build_mlp(8, (16,), 1, seed=0)
    a, b = (make_engine("ghost", model, _mse, 1.0, 2.0, seed=3) for _ in range(2))
    first_a, first_b = [n.numpy() for n in a.noise()], [n.numpy() for n in b.noise()]
    assert [n.shape for n in first_a] == [tuple(v.shape) for v in a.variables]
    for x, y in zip(first_a, first_b):
        np.testing.assert_array_equal(x, y)
    second_a = np.concatenate([n.numpy().ravel() for n in a.noise()])
    assert not np.allclose(second_a, np.concatenate([x.ravel() for x in first_a]))
