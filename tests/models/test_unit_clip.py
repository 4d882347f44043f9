"""Per-unit DP-SGD in make_private: a privacy unit's rows share one clip, so one unit moves a step by at most C.

The attack as row-level clipping allows it: a unit with K rows of huge gradients moves the clipped sum by K * C
(each row clipped on its own), so a step calibrated to C leaks K times its epsilon about that unit. Per-unit
clipping sums the unit's rows first and clips the sum. All data here is GENERATED (numpy, fixed seeds).
"""

import math

import numpy as np
import pytest

pytestmark = pytest.mark.tf

import sage_tfx  # noqa: E402,F401  (before TensorFlow)

tf = pytest.importorskip("tensorflow")

from dp_accounting import GaussianDpEvent  # noqa: E402

from sage_tfx.models import make_private  # noqa: E402
from sage_tfx.models.dpsgd_engine import make_engine  # noqa: E402
from sage_tfx.models.losses import per_example_loss  # noqa: E402
from sage_tfx.models.private import poisson_batches  # noqa: E402
from sage_tfx.models.unit_clip import unit_batches, unit_clipped_sum, unit_index, unit_noisy_sum  # noqa: E402
from sage_tfx.privacy import dpsgd  # noqa: E402
from sage_tfx.privacy.dpsgd import DpSgdConfigError  # noqa: E402

C, K = 1.0, 8


def _model():
    init = tf.keras.initializers.GlorotUniform(seed=0)
    return tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1, kernel_initializer=init)])


def _neighbours():
    """(D, D'): 12 ordinary units of 3 rows; D also holds one unit of K rows whose gradients are huge."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(36, 3)).astype(np.float32)
    y = x[:, 0].astype(np.float32)
    units = np.repeat(np.arange(12), 3)
    heavy_x = np.full((K, 3), 50.0, np.float32)
    heavy_y = np.full(K, -500.0, np.float32)
    d = (np.concatenate([x, heavy_x]), np.concatenate([y, heavy_y]), np.concatenate([units, np.full(K, 99)]))
    return d, (x, y, units)


def _segments(units):
    inverse, count = unit_index(units, len(units))
    return tf.constant(inverse.astype(np.int32)), tf.constant(count, tf.int32)


def _flat(parts):
    return np.concatenate([np.ravel(p.numpy()) for p in parts])


@pytest.mark.parametrize("engine_name", ["vmap", "loop"])
def test_a_unit_of_k_huge_rows_moves_the_clipped_sum_by_at_most_c(engine_name):
    model = _model()
    engine = make_engine(engine_name, model, per_example_loss("mse", model), C, 0.0, seed=0)
    d, d_prime = _neighbours()
    with_unit = _flat(unit_clipped_sum(engine, d[0], d[1], *_segments(d[2]))[0])
    without = _flat(unit_clipped_sum(engine, d_prime[0], d_prime[1], *_segments(d_prime[2]))[0])
    assert np.linalg.norm(with_unit - without) <= C * (1 + 1e-5)
    assert np.linalg.norm(with_unit - without) > 0.99 * C  # the unit's summed gradient is far beyond C: clipped
    # the attack as row-level clipping allowed it: each of the unit's K rows moves the sum by C
    rows_with = _flat(engine.clipped_sum(d[0], d[1])[0])
    rows_without = _flat(engine.clipped_sum(d_prime[0], d_prime[1])[0])
    assert np.linalg.norm(rows_with - rows_without) > 0.99 * K * C


def test_the_unit_sum_is_each_units_row_gradients_summed_then_clipped():
    model = _model()
    loss = per_example_loss("mse", model)
    engine = make_engine("vmap", model, loss, C, 0.0, seed=0)
    d, _ = _neighbours()
    got = _flat(unit_clipped_sum(engine, d[0], d[1], *_segments(d[2]))[0])
    expected = 0.0
    for u in np.unique(d[2]):
        rows = d[2] == u
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(loss(d[1][rows], model(d[0][rows], training=True)))
        g = _flat(tape.gradient(total, engine.variables))
        expected = expected + g * min(1.0, C / np.linalg.norm(g))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_every_batch_holds_whole_units_sampled_independently():
    units = np.repeat(np.arange(50), np.arange(50) % 4 + 1)
    np.random.default_rng(0).shuffle(units)
    inverse, count = unit_index(units, len(units))
    sizes = []
    for rows, segments, k in unit_batches(poisson_batches(np.random.default_rng(1), count, 0.2, 400), inverse, count):
        sampled = np.unique(inverse[rows])
        assert len(sampled) == k and len(rows) == np.isin(inverse, sampled).sum()  # every row of each unit
        assert all(len(np.unique(inverse[rows[segments == s]])) == 1 for s in range(k))  # one unit per segment
        sizes.append(k)
    assert abs(np.mean(sizes) - 0.2 * count) < 4 * math.sqrt(0.2 * 0.8 * count / 400)


def _projected_draws(d, draws, seed, sigma, direction, per_unit):
    """``draws`` outputs of one DP-SGD step's noisy sum on data set ``d`` (every unit in the batch: q = 1),
    projected on ``direction`` (post-processing)."""
    model = _model()
    engine = make_engine("vmap", model, per_example_loss("mse", model), C, sigma, seed=seed)
    x, y = tf.constant(d[0]), tf.constant(d[1])
    if per_unit:
        segments = _segments(d[2])
        step = tf.function(lambda: unit_noisy_sum(engine, x, y, *segments))
    else:
        step = tf.function(lambda: engine.noisy_sum(x, y))
    return np.array([float(_flat(step()) @ direction) for _ in range(draws)])


@pytest.mark.slow
def test_neighbours_differing_by_a_whole_unit_give_steps_within_e_to_the_epsilon():
    """D holds one unit of K rows more than D'. One DP-SGD step at noise multiplier sigma (q = 1: the Gaussian
    mechanism of sensitivity C, (eps, delta) by the accountant) must satisfy P[M(D) in S] <= e^eps P[M(D') in S]
    + delta for every event S; checked on S = {<out, v> >= c} and {<out, v> <= c} for the direction v of the
    unit's shift and four cuts, from 10,000 draws each (fixed seeds). Each comparison allows 4.5 standard errors
    (binomial variance of both rates): a correct mechanism fails one with probability below 3.4e-6, the 8 below
    3e-5 (union bound). The row-clipped step moves by K * C = 8 standard deviations... of C: far past e^eps."""
    sigma, delta, draws = 4.0, 1e-5, 10000
    eps = dpsgd.event_epsilon(GaussianDpEvent(sigma), delta)
    assert 0.5 < eps < 2.0
    bound = math.exp(eps)
    d, d_prime = _neighbours()

    def violations(per_unit):
        model = _model()
        engine = make_engine("vmap", model, per_example_loss("mse", model), C, 0.0, seed=0)
        clipped = unit_clipped_sum if per_unit else (lambda e, x, y, *_: e.clipped_sum(x, y))
        shift = _flat(clipped(engine, d[0], d[1], *_segments(d[2]))[0]) - _flat(
            clipped(engine, d_prime[0], d_prime[1], *_segments(d_prime[2]))[0]
        )
        direction = shift / np.linalg.norm(shift)
        out, out_prime = (
            _projected_draws(data, draws, seed, sigma, direction, per_unit) for data, seed in ((d, 11), (d_prime, 12))
        )
        base = float(_flat(clipped(engine, d_prime[0], d_prime[1], *_segments(d_prime[2]))[0]) @ direction)
        bad = []
        for cut in (0.5 * C, C, 2 * C, 4 * C):
            for p, q in (
                ((out >= base + cut).mean(), (out_prime >= base + cut).mean()),
                ((out_prime <= base + C - cut).mean(), (out <= base + C - cut).mean()),
            ):
                se = math.sqrt(p * (1 - p) / draws + bound**2 * q * (1 - q) / draws)
                if p > bound * q + delta + 4.5 * max(se, 1.0 / draws):
                    bad.append((cut, p, q))
        return bad

    assert violations(per_unit=True) == []
    assert violations(per_unit=False)  # row-level clipping: the unit's K rows move the step K times as far


def _data(units=40, rows=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(units * rows, 3)).astype(np.float32)
    return x, (x @ np.array([1.0, -2.0, 0.5], np.float32)), np.repeat(np.arange(units) * 7 + 1000, rows)


def test_a_per_unit_fit_counts_units_and_learns():
    x, y, units = _data(units=200)
    private = make_private(
        _model(),
        privacy_budget=(8.0, 1e-5),
        num_examples=200,
        loss="mse",
        batch_size=50,
        epochs=20,
        clip_norm=5.0,
        seed=0,
        per_unit=True,
    )
    assert private.fit(x, y, units=units.astype(str)) is private  # any hashable ids: strings here
    spent = private.privacy_spent
    assert spent["privacy_unit"] == "unit" and spent["num_examples"] == 200
    assert spent["sampling_rate"] == pytest.approx(50 / 200)
    assert spent["implementation"] == "make_private/vmap"
    assert dpsgd.event_epsilon(spent["dp_event"], 1e-5) <= 8.0 * (1 + 1e-6)
    before = float(np.mean((x @ np.zeros(3) - y) ** 2))
    assert float(np.mean((private.predict(x).ravel() - y) ** 2)) < 0.5 * before


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"per_example": "ghost"}, r"per_example='ghost' is invalid with per-unit clipping.*use per_example='auto'"),
        ({"per_example": "tf_privacy"}, "per_example='tf_privacy' is invalid with per-unit clipping"),
        ({"per_unit": "yes"}, "per_unit='yes' is invalid: pass True"),
    ],
)
def test_an_engine_that_cannot_sum_a_units_rows_is_refused_by_make_private(kwargs, match):
    model = _model()
    with pytest.raises(DpSgdConfigError, match=match):
        make_private(
            model,
            privacy_budget=(1.0, 1e-5),
            num_examples=40,
            loss="mse",
            batch_size=10,
            **{"per_unit": True, **kwargs},
        )


@pytest.mark.parametrize(
    "per_unit, units, match",
    [
        (True, None, r"make_private\(per_unit=True\) needs fit\(units=...\)"),
        (False, "ids", r"fit\(units=...\) needs make_private\(per_unit=True\)"),
        (True, "short", "pass one unit id per row of x"),
    ],
)
def test_a_fit_without_its_units_is_refused_before_any_read(per_unit, units, match):
    x, y, ids = _data()
    given = {"ids": ids, "short": ids[:-1], None: None}[units]
    model = _model()
    private = make_private(
        model, privacy_budget=(1.0, 1e-5), num_examples=40, loss="mse", batch_size=10, seed=0, per_unit=per_unit
    )
    weights = [w.numpy().copy() for w in model.weights]
    with pytest.raises((DpSgdConfigError, ValueError), match=match):
        private.fit(x, y, units=given)
    assert private.engine is None and private.privacy_spent is None  # no engine, no noise drawn, nothing trained
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(weights, model.weights))


@pytest.mark.slow
def test_a_per_unit_fit_takes_an_adaptive_clip_and_a_noise_schedule():
    x, y, units = _data(units=200)
    private = make_private(
        _model(),
        privacy_budget=(2.0, 1e-5),
        num_examples=200,
        loss="mse",
        batch_size=100,
        epochs=2,
        clip_norm="adaptive",
        noise_schedule="exponential",
        seed=0,
        per_unit=True,
    )
    private.fit(x, y, units=units)
    spent = private.privacy_spent
    assert spent["privacy_unit"] == "unit" and "adaptive_clip" in spent and "noise_schedule" in spent
    assert spent["adaptive_clip"]["final_clip_norm"] != 1.0  # moved by the noisy count of unclipped units
    assert dpsgd.event_epsilon(spent["dp_event"], 1e-5) <= 2.0 * (1 + 1e-6)
