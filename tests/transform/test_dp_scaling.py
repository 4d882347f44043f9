"""DP counterparts of tft's scalers and bucketizers (sage_tfx.transform.scaling): dp_scale_to_z_score,
dp_scale_to_0_1, dp_quantiles, dp_bucketize, run through tf.Transform on the Beam DirectRunner.

Statistical tests use FIXED seeds, so they are deterministic; the false-failure rate stated at each is
the chance that a correct implementation fails for a random seed. All data here is GENERATED.
"""

import math
import tempfile
import time

import numpy as np
import pytest
from scipy import stats

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)
from sage_tfx.transform import DPTransformError, noise

KS_ALPHA = 1e-3  # per KS test: a correct implementation fails it with probability 0.001


# ---------------------------------------------------------------- helpers


def _tf():
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    return tf, tft, tft_beam


def _spec():
    tf, _, _ = _tf()
    return {"x": tf.io.FixedLenFeature([], tf.float32)}


def _analyze(xs, preprocessing_fn, batch_size=None):
    """AnalyzeAndTransformDataset on rows {"x": value}; returns the transformed rows."""
    _, tft, tft_beam = _tf()
    rows = [{"x": float(v)} for v in xs]
    metadata = tft.DatasetMetadata.from_feature_spec(_spec())
    with tempfile.TemporaryDirectory() as tmp, tft_beam.Context(temp_dir=tmp, desired_batch_size=batch_size):
        (transformed, _), _ = (rows, metadata) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn)
    return transformed


def _column(rows, name):
    return np.array([r[name] for r in rows])


def _grid_counts(xs, low, high, grid_size):
    """The exact histogram the DP analyzers noise: the same float64 formula as scaling._grid_cells."""
    x = np.asarray(xs, dtype=np.float32).astype(np.float64)
    x = x[~np.isnan(x)]
    cells = np.floor(np.clip((x - low) * (grid_size / (high - low)), 0.0, grid_size - 0.5)).astype(np.int64)
    return np.bincount(cells, minlength=grid_size).astype(np.float64)


# ---------------------------------------------------------------- post-processing (numpy, Beam side)


@pytest.mark.tf  # sage_tfx.transform.scaling imports TensorFlow
def test_monotone_cdf_and_its_quantiles():
    from sage_tfx.transform.scaling import cdf_quantiles, monotone_cdf

    # Noiseless counts: the exact CDF, and quantiles by linear interpolation inside a cell.
    cdf = monotone_cdf([10.0, 0.0, 30.0, 0.0])
    np.testing.assert_allclose(cdf, [0.0, 0.25, 0.25, 1.0, 1.0])
    np.testing.assert_allclose(cdf_quantiles(cdf, [0.125, 0.25, 0.5, 0.75], 0.0, 4.0), [0.5, 1.0, 2 + 1 / 3, 2 + 2 / 3])
    # Nothing usable (noisy total <= 0): uniform over the public range.
    np.testing.assert_allclose(monotone_cdf([-3.0, 1.0, -2.0]), [0.0, 1 / 3, 2 / 3, 1.0])
    np.testing.assert_allclose(cdf_quantiles(monotone_cdf([-1.0, -1.0]), [0.25, 0.5], 10.0, 20.0), [12.5, 15.0])
    # Wild noise: always a CDF (nondecreasing, 0 to 1), and boundaries nondecreasing inside the range.
    rng = np.random.default_rng(11)
    for _ in range(200):
        noisy = rng.laplace(0.0, 5.0, size=50) + rng.integers(0, 4, size=50)
        cdf = monotone_cdf(noisy)
        assert cdf[0] == 0.0 and cdf[-1] == 1.0 and np.all(np.diff(cdf) >= 0)
        bounds = cdf_quantiles(cdf, np.arange(1, 20) / 20, -1.0, 3.0)
        assert np.all(np.diff(bounds) > 0) and bounds[0] >= -1.0 and bounds[-1] <= 3.0


def test_the_monotone_repair_adds_no_error_beyond_the_noise():
    """If every noisy prefix sum is within delta of the exact (monotone) one, so is the repaired one
    (before normalization): checked on random data, a deterministic property (no false failures)."""
    rng = np.random.default_rng(12)
    for _ in range(300):
        exact = rng.integers(0, 20, size=40).astype(float)
        noisy = exact + rng.laplace(0.0, 3.0, size=40)
        exact_prefix, noisy_prefix = np.concatenate([[0], np.cumsum(exact)]), np.concatenate([[0], np.cumsum(noisy)])
        delta = np.max(np.abs(noisy_prefix - exact_prefix))
        repaired = (np.maximum.accumulate(noisy_prefix) + np.minimum.accumulate(noisy_prefix[::-1])[::-1]) / 2
        assert np.all(np.diff(repaired) >= 0)
        assert np.max(np.abs(repaired - exact_prefix)) <= delta + 1e-9


# ---------------------------------------------------------------- arguments, shapes, budget (traced only)


@pytest.mark.tf
def test_bad_arguments_are_named_at_trace_time():
    from sage_tfx.transform import dp_bucketize, dp_quantiles, dp_scale_to_0_1, dp_scale_to_z_score

    tf, _, _ = _tf()
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        for call, named in [
            (lambda: dp_scale_to_z_score(x, 0.0, 1.0), "epsilon.*0.0"),
            (lambda: dp_scale_to_z_score(x, 1.0, (5.0, 5.0)), r"\(5.0, 5.0\) needs low < high"),
            (lambda: dp_scale_to_z_score(x, 1.0, (0.0, float("inf"))), "inf.*finite"),
            (lambda: dp_scale_to_z_score(x, 1.0, (1.0, 2.0, 3.0)), "not a pair"),
            (lambda: dp_scale_to_z_score(x, 1.0, -2.0), "-2.0"),
            (lambda: dp_scale_to_z_score(x, 1.0, 1.0, min_std=0.0), "min_std.*0.0"),
            (lambda: dp_scale_to_0_1(x, 1.0, 1.0, tail=0.5), "tail.*0.5"),
            (lambda: dp_scale_to_0_1(x, 1.0, 1.0, grid_size=1), "grid_size.*1"),
            (lambda: dp_quantiles(x, 1, 1.0, 1.0), "num_buckets.*>= 2.*got 1"),
            (lambda: dp_bucketize(x, 2.5, 1.0, 1.0), "num_buckets.*2.5"),
            (lambda: dp_quantiles(x, 4, 1.0, 1.0, seed=-1), "seed.*-1"),
            (lambda: dp_scale_to_z_score(tf.sparse.from_dense(x[:, None]), 1.0, 1.0), "dense.*SparseTensor"),
            (lambda: dp_bucketize(tf.strings.as_string(x), 4, 1.0, 1.0), "numeric.*string"),
        ]:
            with pytest.raises(DPTransformError, match=named):
                call()


@pytest.mark.tf
def test_shapes_and_dtypes_are_tfts_and_the_budget_recorded_is_epsilon():
    import sage_tfx.transform
    from sage_tfx.transform import (
        BudgetExceeded,
        PreprocessingBudget,
        budget_custom_config,
        dp_bucketize,
        dp_quantiles,
        dp_scale_to_0_1,
        dp_scale_to_z_score,
        trace_requested_epsilon,
    )

    for name in ("dp_scale_to_z_score", "dp_scale_to_0_1", "dp_quantiles", "dp_bucketize"):  # exported at top level
        assert getattr(sage_tfx, name) is getattr(sage_tfx.transform, name) and name in sage_tfx.transform.__all__
    tf, tft, _ = _tf()
    with tf.Graph().as_default():
        for shape in ([None], [None, 1]):
            x = tf.compat.v1.placeholder(tf.float32, shape)
            pairs = [
                (dp_scale_to_z_score(x, 1.0, 10.0), tft.scale_to_z_score(x)),
                (dp_scale_to_0_1(x, 1.0, 10.0), tft.scale_to_0_1(x)),
                (dp_quantiles(x, 5, 1.0, 10.0), tft.quantiles(x, 5, 0.01)),
                (dp_bucketize(x, 5, 1.0, 10.0), tft.bucketize(x, 5)),
            ]
            for ours, theirs in pairs:
                assert ours.dtype == theirs.dtype and ours.shape.as_list() == theirs.shape.as_list(), (ours, theirs)
        # integer input works as in tft
        xi = tf.compat.v1.placeholder(tf.int64, [None])
        assert dp_scale_to_z_score(xi, 1.0, 10.0).dtype == tf.float32 and dp_bucketize(xi, 3, 1.0, 10).dtype == tf.int64

    def preprocessing_fn(inputs):
        x = inputs["x"]
        return {
            "z": dp_scale_to_z_score(x, 0.25, 10.0),
            "s": dp_scale_to_0_1(x, 0.125, (-1.0, 1.0)),
            "q": tf.ones_like(x)[:, None] * dp_quantiles(x, 4, 0.5, 10.0),
            "b": dp_bucketize(x, 3, 0.0625, 10.0),
        }

    total, spends = trace_requested_epsilon(preprocessing_fn, _spec())
    assert [(s.analyzer, s.epsilon) for s in spends] == [
        ("dp_scale_to_z_score", 0.25),
        ("dp_scale_to_0_1", 0.125),
        ("dp_quantiles", 0.5),
        ("dp_bucketize", 0.0625),
    ]
    assert total == 0.9375

    def greedy_fn(inputs, custom_config):
        budget = PreprocessingBudget.from_custom_config(custom_config)
        out = {"z": dp_scale_to_z_score(inputs["x"], budget.epsilon, 10.0)}
        out["b"] = dp_bucketize(inputs["x"], 4, 0.01, 10.0)  # one too many
        return out

    with pytest.raises(BudgetExceeded, match=r"dp_bucketize asks epsilon=0\.01"):
        trace_requested_epsilon(greedy_fn, _spec(), budget_custom_config(1.0))


@pytest.mark.tf
def test_dptransform_refuses_tfts_analyzers_naming_the_dp_counterpart_and_accepts_the_dp_ones():
    """The executor's own trace (under the grant's noise_seed) and check_traced_analyzers."""
    from sage_tfx.components.dp_transform_executor import NonPrivateAnalyzer, trace_spend
    from sage_tfx.transform import dp_bucketize, dp_quantiles, dp_scale_to_0_1, dp_scale_to_z_score

    tf, tft, _ = _tf()
    spec = {"x": tf.io.FixedLenFeature([], tf.float32), "s": tf.io.FixedLenFeature([], tf.string)}
    cases = {
        "dp_scale_to_z_score": lambda i: {"o": tft.scale_to_z_score(i["x"])},
        "dp_mean": lambda i: {"o": i["x"] - tft.mean(i["x"])},
        "dp_variance": lambda i: {"o": i["x"] / tft.var(i["x"])},
        "dp_scale_to_0_1": lambda i: {"o": tft.scale_to_0_1(i["x"])},
        "dp_scale_to_0_1 or dp_quantiles": lambda i: {"o": i["x"] - tft.min(i["x"])},
        "dp_quantiles": lambda i: {"o": tft.apply_buckets(i["x"], tft.quantiles(i["x"], 4, 0.01))},
        "dp_bucketize": lambda i: {"o": tft.bucketize(i["x"], 4)},
        r"dp_compute_and_apply_vocabulary\(x, epsilon, delta.*dp_histogram\(x, epsilon, vocabulary=": lambda i: {
            "o": tft.compute_and_apply_vocabulary(i["s"])
        },
        # a scope of the user's own name: the inner analyzer still names the counterpart
        r"dp_scale_to_z_score \(or dp_mean / dp_variance\)": lambda i: {"o": tft.scale_to_z_score(i["x"], name="z")},
    }
    for counterpart, fn in cases.items():
        with pytest.raises(NonPrivateAnalyzer, match=f"not differentially private.*{counterpart}"):
            trace_spend(fn, spec, {}, grant_seed=7)

    def dp_fn(inputs):
        x = inputs["x"]
        return {
            "z": dp_scale_to_z_score(x, 0.1, 10.0),
            "s": dp_scale_to_0_1(x, 0.1, 10.0),
            "q": tf.ones_like(x)[:, None] * dp_quantiles(x, 4, 0.1, 10.0),
            "b": dp_bucketize(x, 4, 0.1, 10.0),
        }

    total, delta, spends, _ = trace_spend(dp_fn, spec, {}, grant_seed=7)
    assert math.isclose(total, 0.4) and delta == 0.0 and len(spends) == 4
    with pytest.raises(NonPrivateAnalyzer, match="dp_quantiles: seed=3 was given"):
        trace_spend(lambda i: {"q": dp_quantiles(i["x"], 4, 0.1, 10.0, seed=3)}, spec, {}, grant_seed=7)


# ---------------------------------------------------------------- through tf.Transform


@pytest.mark.tf
def test_each_release_is_exactly_the_stated_mechanism():
    """With a test seed, the pipeline's outputs equal the documented mechanism recomputed in numpy: the stated
    Laplace scales (noise.add_laplace with the analyzer's stream), then the documented post-processing. So the
    pipeline adds exactly the stated noise, once, to exactly the stated tables (deterministic: no false failures).
    Noise is large here (epsilon 0.5 on 3,000 rows, many batches) so a wrong scale cannot hide in rounding."""
    from sage_tfx.transform import dp_bucketize, dp_quantiles, dp_scale_to_0_1, dp_scale_to_z_score
    from sage_tfx.transform.scaling import cdf_quantiles, monotone_cdf

    tf, _, _ = _tf()
    eps, seed, low, high, grid = 0.5, 424242, 2.0, 12.0, 64
    rng = np.random.default_rng(5)
    xs = np.concatenate([rng.normal(6.0, 2.0, size=3000), [float("nan"), 1e6, -1e6]]).astype(np.float32)

    def preprocessing_fn(inputs):
        x = inputs["x"]
        ones = tf.ones_like(x)[:, None]
        return {
            "x": x,
            "z": dp_scale_to_z_score(x, eps, (low, high), seed=seed, name="z"),
            "s": dp_scale_to_0_1(x, eps, (low, high), tail=0.05, grid_size=grid, seed=seed, name="s"),
            "q": ones * dp_quantiles(x, 5, eps, (low, high), grid_size=grid, seed=seed, name="q"),
            "b": dp_bucketize(x, 5, eps, (low, high), grid_size=grid, seed=seed, name="b"),
        }

    out = _analyze(xs, preprocessing_fn, batch_size=256)
    x = _column(out, "x").astype(np.float64)
    width, finite = high - low, ~np.isnan(xs)

    # z-score: three sums over the non-NaN rows, centred at W/2, scales 3/eps, 3(W/2)/eps, 3(W^2/4)/eps
    centred = np.clip(xs[finite].astype(np.float64), low, high) - low - width / 2
    exact = [np.array([finite.sum()], float), np.array([centred.sum()]), np.array([(centred**2).sum()])]
    n, s, q = noise.add_laplace(
        exact,
        [3 / eps, 3 * (width / 2) / eps, 3 * (width**2 / 4) / eps],
        seed=seed,
        stream="z/",
        sensitivities=[1.0, width / 2, width**2 / 4],
        cells=[1, 1, 1],
    )
    m = np.clip(s / max(n[0], 1.0), -width / 2, width / 2)
    mean = low + width / 2 + m[0]
    b = 3 * (width**2 / 4) / eps
    variance = max(noise.guarded_variance(n, s, q, width)[0], min(2 * math.sqrt(2) * b / max(n[0], 1.0), width**2 / 4))
    std = max(math.sqrt(variance), width / 1000)
    want_z = np.where(np.isnan(x), 0.0, (np.clip(x, low, high) - mean) / std)
    np.testing.assert_allclose(_column(out, "z"), want_z, rtol=1e-5, atol=1e-5)

    # the three quantile releases: the grid histogram plus Laplace(1/eps) per cell, each its own stream
    counts = _grid_counts(xs, low, high, grid)
    for name, levels in (("s", [0.05, 0.95]), ("q", [0.2, 0.4, 0.6, 0.8]), ("b", [0.2, 0.4, 0.6, 0.8])):
        (noisy,) = noise.add_laplace([counts], [1 / eps], seed=seed, stream=f"{name}/", sensitivities=[1.0], cells=[1])
        want = cdf_quantiles(monotone_cdf(noisy), levels, low, high)
        if name == "s":
            lo, hi = want
            want_s = np.where(np.isnan(x), 0.5, np.clip((x - lo) / (hi - lo), 0.0, 1.0))
            np.testing.assert_allclose(_column(out, "s"), want_s, rtol=1e-5, atol=1e-5)
        elif name == "q":
            assert all(np.array_equal(r["q"], np.float32(want)) for r in out)
        else:
            want_b = np.searchsorted(np.float32(want), x.astype(np.float32), side="right")
            want_b[np.isnan(x)] = 4  # tft.apply_buckets: NaN in the last bucket
            np.testing.assert_array_equal(_column(out, "b"), want_b)
    # the streams are independent: the two quantile analyzers on the same data drew different noise
    assert not np.array_equal(
        out[0]["q"],
        np.float32(
            cdf_quantiles(
                monotone_cdf(
                    noise.add_laplace([counts], [1 / eps], seed=seed, stream="b/", sensitivities=[1.0], cells=[1])[0]
                ),
                [0.2, 0.4, 0.6, 0.8],
                low,
                high,
            )
        ),
    )


@pytest.mark.tf
def test_semantics_like_tft_on_small_data_when_the_noise_is_negligible():
    """epsilon 1e4 on 20,000 GENERATED rows inside the public range: the DP outputs match tft's own analyzers
    up to the noise (scales 3e-4 rows on counts) and the grid (1,000 cells of 0.1)."""
    from sage_tfx.transform import dp_bucketize, dp_quantiles, dp_scale_to_0_1, dp_scale_to_z_score

    tf, tft, _ = _tf()
    rng = np.random.default_rng(8)
    xs = rng.gamma(4.0, 5.0, size=20_000).clip(0, 99.0).astype(np.float32)  # skewed, in [0, 100]
    eps = 1e4

    def preprocessing_fn(inputs):
        x = inputs["x"]
        ones = tf.ones_like(x)[:, None]
        return {
            "x": x,
            "z": dp_scale_to_z_score(x, eps, 100.0, seed=1),
            "z_tft": tft.scale_to_z_score(x),
            "s": dp_scale_to_0_1(x, eps, 100.0, seed=1),
            "q": ones * dp_quantiles(x, 8, eps, 100.0, seed=1),
            "q_tft": ones * tft.quantiles(x, 8, 1e-4),
            "b": dp_bucketize(x, 8, eps, 100.0, seed=1),
            "b_tft": tft.bucketize(x, 8, epsilon=1e-4),
        }

    out = _analyze(xs, preprocessing_fn, batch_size=2000)
    np.testing.assert_allclose(_column(out, "z"), _column(out, "z_tft"), atol=2e-3)
    q, q_tft = out[0]["q"], out[0]["q_tft"]
    assert q.shape == (7,) and np.all(np.diff(q) > 0)
    np.testing.assert_allclose(q, q_tft, atol=0.15)  # one grid cell (0.1) plus tft's own 1e-4 rank error
    assert np.mean(_column(out, "b") != _column(out, "b_tft")) < 0.01  # rows near a boundary may differ
    assert set(_column(out, "b")) == set(range(8))
    lo, hi = np.quantile(xs.astype(np.float64), [0.01, 0.99])  # the documented semantics: 1% -> 0, 99% -> 1
    np.testing.assert_allclose(_column(out, "s"), np.clip((xs - lo) / (hi - lo), 0, 1), atol=0.01)
    s = _column(out, "s")
    assert s.min() == 0.0 and s.max() == 1.0 and 0.005 < np.mean(s == 0.0) < 0.02


@pytest.mark.tf
def test_nan_and_out_of_range_rows_get_public_defaults_and_change_no_table():
    """A NaN row counts in no table and gets the public default (z 0.0, 0_1 0.5, bucket num_buckets - 1 as
    tft.apply_buckets); a row outside the range counts as the bound it clips to. With the same seed, data plus
    NaN rows and +-1e9 / +-inf rows give exactly the tables (and the other rows' outputs) of the same data plus
    rows at the bounds alone. Nothing fails (the analysis runs after the grant is charged)."""
    from sage_tfx.transform import dp_bucketize, dp_quantiles, dp_scale_to_0_1, dp_scale_to_z_score

    tf, _, _ = _tf()
    xs = list(np.linspace(1.0, 9.0, 400))

    def preprocessing_fn(inputs):
        x = inputs["x"]
        return {
            "z": dp_scale_to_z_score(x, 1.0, 10.0, seed=9),
            "s": dp_scale_to_0_1(x, 1.0, 10.0, seed=9),
            "q": tf.ones_like(x)[:, None] * dp_quantiles(x, 4, 1.0, 10.0, seed=9),
            "b": dp_bucketize(x, 4, 1.0, 10.0, seed=9),
        }

    def same_tables(rows, other):
        """The counts are integers: boundaries, 0_1 and buckets bit-identical. The z-score's sums are float64 sums
        whose order may follow the batching: equal up to rounding."""
        assert rows[0]["q"].tolist() == other[0]["q"].tolist()
        assert [(r["s"], r["b"]) for r in rows[:400]] == [(r["s"], r["b"]) for r in other[:400]]
        np.testing.assert_allclose(_column(rows[:400], "z"), _column(other[:400], "z"), rtol=1e-6, atol=1e-6)

    # NaN rows count nowhere and out-of-range rows as their bounds: the same tables as rows at the bounds alone
    wild = _analyze(xs + [1e9, float("inf"), -1e9, float("-inf")] + [float("nan")] * 3, preprocessing_fn)
    at_bounds = _analyze(xs + [10.0, 10.0, 0.0, 0.0], preprocessing_fn)
    same_tables(wild, at_bounds)
    assert [(r["z"], r["s"], r["b"]) for r in wild[404:]] == [(0.0, 0.5, 3)] * 3
    for w, b in zip(wild[400:404], at_bounds[400:]):  # out-of-range rows map as their bound does
        assert (w["s"], w["b"]) == (b["s"], b["b"]) and w["z"] == pytest.approx(b["z"], rel=1e-6, abs=1e-6)
        assert math.isfinite(w["z"])
    empty = _analyze([float("nan")] * 5, preprocessing_fn)  # no usable row: public defaults, no failure
    assert all(r["z"] == 0.0 and r["s"] == 0.5 and r["b"] == 3 for r in empty)
    assert np.all(np.diff(empty[0]["q"]) >= 0) and 0.0 <= empty[0]["q"][0] and empty[0]["q"][-1] <= 10.0


@pytest.mark.tf
def test_z_score_variance_floor_keeps_a_small_epsilon_from_blowing_up_a_feature():
    """The real taxi trips (tfx wheel), each dense feature at the epsilon the tfx_taxi example gives it (0.2 of
    epsilon 1 over 9 analyzers): 20,000 draws of the three noisy sums. Without the noise floor the variance is
    clipped to 0 in a few % of the draws (std = W/1000: the feature scaled up about 1,000x; this is what sank
    a CI run of the example). With it, the std is never under half the true std: for that the floor
    2 sqrt(2) b / n' itself would have to be under a quarter of the true variance, i.e. n' > 2.4x the true
    count, a count noise of over 170 scales (probability below e^-170): no false failures in practice."""
    from sage_tfx.data.taxi import load_all_taxi
    from sage_tfx.transform.scaling import _mean_and_variance_table

    table = load_all_taxi()
    eps, draws = 0.2 / 9, 20000
    rng = np.random.default_rng(20261123)
    for key, (low, high) in (("trip_miles", (0.0, 50.0)), ("fare", (0.0, 100.0)), ("trip_seconds", (0.0, 7200.0))):
        x = np.array(table[key].to_pylist(), dtype=float)
        x = np.clip(x[~np.isnan(x)], low, high)
        width, third = high - low, eps / 3
        centred = x - low - width / 2
        b = (width**2 / 4) / third
        n = len(x) + rng.laplace(0, 1 / third, draws)
        s = centred.sum() + rng.laplace(0, (width / 2) / third, draws)
        q = (centred**2).sum() + rng.laplace(0, b, draws)
        _, variance = _mean_and_variance_table(n, s, q, width, b)
        floored = np.sqrt(variance) / x.std()
        unfloored = np.sqrt(noise.guarded_variance(n, s, q, width)) / x.std()
        assert (unfloored == 0).mean() > 0.01, (key, (unfloored == 0).mean())  # the failure the floor prevents
        assert floored.min() >= 0.5, (key, floored.min())
        assert np.all(variance <= width**2 / 4)


@pytest.mark.tf
@pytest.mark.slow
def test_z_score_noise_matches_the_stated_laplace_scales():
    """60 independent dp_scale_to_z_score releases in one pipeline (same data, same test seed, their own
    streams): the errors of the mean and of the variance (recovered from two rows' z-scores) against the exact
    clipped statistics. Data symmetric about W/2, so to first order the mean's error is Laplace(3(W/2)/eps)/n
    and the variance's Laplace(3(W^2/4)/eps)/n; the count's noise (Laplace(3/eps) on n = 2,000) changes them
    by under 0.5% of a scale, which the KS test cannot see at 60 draws.
    Two KS tests at KS_ALPHA each, and two exact Gamma tests of sum |error| / scale ~ Gamma(60) (two-sided
    at 1e-3 each): false-failure rate <= 0.004. The Gamma tests reject half or double the stated scale
    with probability about 0.98 (sum/scale would sit near 30 or 120; the acceptance region is about [38, 89])."""
    from sage_tfx.transform import dp_scale_to_z_score

    draws, eps, n, width = 60, 1.0, 2000, 1.0
    xs = np.linspace(0.0, width, n).astype(np.float32)

    def preprocessing_fn(inputs):
        return {f"z{k}": dp_scale_to_z_score(inputs["x"], eps, width, seed=31337, name=f"z{k}") for k in range(draws)}

    start = time.perf_counter()
    out = _analyze(xs, preprocessing_fn, batch_size=500)
    print(f"{draws} releases in {time.perf_counter() - start:.1f} s")
    v = xs.astype(np.float64)
    mean_exact, var_exact = v.mean(), v.var()
    mean_err, var_err = [], []
    for k in range(draws):
        z_low, z_high = out[0][f"z{k}"], out[-1][f"z{k}"]  # the rows x = 0 and x = W
        std = width / (z_high - z_low)
        mean_err.append(0.0 - z_low * std - mean_exact)
        var_err.append(std**2 - var_exact)
    for what, err, scale in (
        ("mean", mean_err, 3 * (width / 2) / eps / n),
        ("variance", var_err, 3 * (width**2 / 4) / eps / n),
    ):
        p = stats.kstest(err, stats.laplace(scale=scale).cdf).pvalue
        assert p > KS_ALPHA, f"{what}: errors do not look Laplace({scale:.3g}) (KS p={p:.2g})"
        total = float(np.sum(np.abs(err)) / scale)
        lo, hi = stats.gamma(draws).ppf([5e-4, 1 - 5e-4])
        assert lo < total < hi, f"{what}: sum |error| / scale = {total:.1f}, outside [{lo:.1f}, {hi:.1f}]"


@pytest.mark.tf
def test_quantile_ranks_are_within_the_kolmogorov_bound():
    """One dp_quantiles release on 50,000 GENERATED rows: the rank of each boundary (rows below it) is within
    2 * t + (rows of its cell) of level * n, where P(max prefix noise >= t) <= 2 G / (eps t)^2 = 1e-3 by
    Kolmogorov's inequality (G = 100 cells, eps = 1, t = 447): false-failure rate <= 0.001. The bound is
    loose; the observed ranks are printed."""
    from sage_tfx.transform import dp_quantiles

    tf, _, _ = _tf()
    grid, eps, buckets = 100, 1.0, 10
    rng = np.random.default_rng(21)
    xs = np.concatenate([rng.lognormal(2.5, 0.6, size=45_000), rng.uniform(0, 100, size=5_000)]).astype(np.float32)
    out = _analyze(
        xs,
        lambda i: {
            "q": tf.ones_like(i["x"])[:, None] * dp_quantiles(i["x"], buckets, eps, 100.0, grid_size=grid, seed=2718)
        },
        batch_size=5000,
    )
    bounds = out[0]["q"].astype(np.float64)
    clipped = np.clip(xs.astype(np.float64), 0, 100)
    t = math.sqrt(2 * grid / 1e-3) / eps
    counts = _grid_counts(xs, 0.0, 100.0, grid)
    ranks = [(np.sum(clipped < b), i / buckets * len(xs)) for i, b in enumerate(bounds, start=1)]
    print("rank errors (rows):", [int(r - want) for r, want in ranks])
    for (rank, want), b in zip(ranks, bounds):
        cell = counts[min(int(b / (100.0 / grid)), grid - 1)]
        assert abs(rank - want) <= 2 * t + cell, (b, rank, want)


# ---------------------------------------------------------------- error against tft on 1M GENERATED rows

_SINK = {}


def _taxi_batch(index, rows, batch_rows):
    """GENERATED taxi-like speeds (mph) of batch `index`, as an Arrow record batch (sage_tfx.transform._testdata)."""
    import pyarrow as pa

    from sage_tfx.transform._testdata import generate_taxi_speeds

    size = min(batch_rows, rows - index * batch_rows)
    _, speeds = generate_taxi_speeds(size, seed=[2026, index])
    offsets = pa.array(np.arange(size + 1, dtype=np.int64))
    return pa.RecordBatch.from_arrays(
        [pa.LargeListArray.from_arrays(offsets, pa.array(speeds.astype(np.float32)))], ["x"]
    )


def _columns(batch):
    return {
        name: np.asarray(batch.column(name).flatten()).reshape(batch.num_rows, -1).squeeze(1)
        if name not in ("q", "q_tft", "tails_tft")
        else np.asarray(batch.column(name).flatten()).reshape(batch.num_rows, -1)[:1]
        for name in batch.schema.names
    }


def _collect(batch_and_metadata, run_id):
    _SINK[run_id].append(_columns(batch_and_metadata[0]))


def _prefix_noise_bound(cells, epsilon, alpha):
    """t with P(max_k |S_k| >= t) <= alpha, S_k the sum of k i.i.d. Laplace(1/epsilon), k <= cells.

    exp(lambda S_k) is a submartingale, so by Doob's inequality P(max_k S_k >= t) <= E[exp(lambda S_cells)]
    exp(-lambda t) = (1 - lambda^2 b^2)^-cells exp(-lambda t) for 0 < lambda < 1/b; twice that for |S_k|.
    """
    b = 1.0 / epsilon
    lambdas = np.linspace(1e-4, 1 - 1e-4, 20_000) / b

    def tail(t):
        return 2 * math.exp(np.min(-cells * np.log1p(-((lambdas * b) ** 2)) - lambdas * t))

    lo, hi = 0.0, 1e3 * b * math.sqrt(cells)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if tail(mid) <= alpha else (mid, hi)
    return hi


def _z_error_bound(values, epsilon, width, alpha):
    """Largest |dp z-score - exact z-score| over x in [0, W] when none of the three Laplace noises of
    dp_scale_to_z_score exceeds L scales, L = ln(3/alpha) (so this holds with probability >= 1 - alpha):
    the noisy mean and variance are evaluated on a 9x9x9 grid of that noise box, and the z-score error is
    linear in x, so largest at x = 0 or W."""
    from sage_tfx.transform.scaling import _mean_and_variance_table

    centred = np.clip(values, 0, width) - width / 2
    n, s, q = len(values), centred.sum(), (centred**2).sum()
    mean, std = values.clip(0, width).mean(), values.clip(0, width).std()
    big = math.log(3 / alpha)
    third = epsilon / 3
    axes = [np.linspace(-big, big, 9) * scale for scale in (1 / third, width / 2 / third, width**2 / 4 / third)]
    noisy = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3) + [n, s, q]
    means, variances = _mean_and_variance_table(noisy[:, 0], noisy[:, 1], noisy[:, 2], width, width**2 / 4 / third)
    stds = np.sqrt(variances)
    return max(
        abs((x - m) / d - (x - mean) / std)
        for x in (0.0, width)
        for m in (means.min(), means.max())
        for d in (stds.min(), stds.max())
    )


def _rank_errors(sorted_values, bounds, levels):
    """(rows below each boundary) - level * rows."""
    return np.searchsorted(sorted_values, bounds, side="left") - np.asarray(levels) * len(sorted_values)


@pytest.mark.tf
@pytest.mark.slow
def test_error_against_tfts_own_analyzers_on_1m_generated_rows():
    """GENERATED data: 1,000,000 taxi-like speeds (log-normal per hour plus 100-1000 mph glitches, fitted to the
    real taxi trips in the tfx wheel; sage_tfx/transform/_testdata.py), public range [0, 100] mph, epsilon 1
    for each DP analyzer, in one pipeline with tft's own analyzers on the same rows clipped to the same range
    (so the differences are the DP noise and the grid of 1,000 cells of 0.1 mph). Asserted, each failing a
    correct implementation with probability <= 1e-6 (false-failure rate <= 4e-6 in all):
    - z-scores: |dp - tft| <= the bound when no Laplace noise exceeds ln(3e6) scales (`_z_error_bound`),
      plus 1e-5 for float32 arithmetic;
    - dp_quantiles (10 buckets) and dp_scale_to_0_1's 1% / 99% points: every boundary's rank is within
      2 t + (rows of its cell) + 2 of level * n, t from `_prefix_noise_bound` at 1e-6 (docs/dp_preprocessing.md);
    - dp_bucketize: the rows bucketed differently from tft.bucketize are at most those between the two
      analyzers' boundaries, sum over boundaries of that rank bound plus tft's own rank error.
    The measured figures (including the mph differences to tft.quantiles) and the time are printed (pytest -s)."""
    import apache_beam as beam
    from tfx_bsl.tfxio import tensor_adapter, tensor_representation_util

    from sage_tfx.transform import dp_bucketize, dp_quantiles, dp_scale_to_0_1, dp_scale_to_z_score

    tf, tft, tft_beam = _tf()
    rows, batch_rows, eps, high, grid, alpha = 1_000_000, 20_000, 1.0, 100.0, 1000, 1e-6

    def preprocessing_fn(inputs):
        x = tf.reshape(inputs["x"], [-1])
        clipped = tf.clip_by_value(x, 0.0, high)
        ones = tf.ones_like(x)[:, None]
        return {
            "x": x,
            "z": dp_scale_to_z_score(x, eps, high),
            "z_tft": tft.scale_to_z_score(clipped),
            "s": dp_scale_to_0_1(x, eps, high, grid_size=grid),
            "tails_tft": ones * tft.quantiles(clipped, 100, 1e-4),  # [0] is the 1%, [-1] the 99% quantile
            "q": ones * dp_quantiles(x, 10, eps, high, grid_size=grid),
            "q_tft": ones * tft.quantiles(clipped, 10, 1e-4),
            "b": dp_bucketize(x, 10, eps, high, grid_size=grid),
            "b_tft": tft.bucketize(clipped, 10, epsilon=1e-4),
        }

    schema = tft.DatasetMetadata.from_feature_spec(_spec()).schema
    representations = tensor_representation_util.InferTensorRepresentationsFromSchema(schema)
    config = tensor_adapter.TensorAdapterConfig(_taxi_batch(0, rows, batch_rows).schema, representations)
    _SINK["1m"] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        with beam.Pipeline(argv=[]) as pipeline, tft_beam.Context(temp_dir=tmp):
            raw = (
                pipeline
                | beam.Create(range(-(-rows // batch_rows)), reshuffle=False)
                | beam.Map(_taxi_batch, rows, batch_rows)
            )
            (transformed, _), _ = (raw, config) | tft_beam.AnalyzeAndTransformDataset(
                preprocessing_fn, output_record_batches=True
            )
            _ = transformed | beam.Map(_collect, "1m")
    seconds = time.perf_counter() - start
    parts = _SINK.pop("1m")
    col = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k not in ("q", "q_tft", "tails_tft")}
    q = parts[0]["q"][0].astype(np.float64)
    q_tft, tails = parts[0]["q_tft"][0].astype(np.float64), parts[0]["tails_tft"][0].astype(np.float64)
    assert len(col["x"]) == rows

    values = col["x"].astype(np.float64)
    clipped = np.clip(values, 0, high)
    ordered = np.sort(clipped)
    counts = _grid_counts(values, 0.0, high, grid)
    t = _prefix_noise_bound(grid, eps, alpha)

    def allowed(bounds):  # the rank bound of each boundary: 2 t + the rows of its cell (either cell at an edge) + 2
        cells = np.clip(np.floor(np.asarray(bounds) * (grid / high)).astype(int), 0, grid - 1)
        return 2 * t + np.maximum(counts[cells], counts[np.maximum(cells - 1, 0)]) + 2

    levels = np.arange(1, 10) / 10
    # dp_scale_to_0_1's lo and hi, recovered from two rows strictly inside (0, 1)
    inside = np.flatnonzero((col["s"] > 0.1) & (col["s"] < 0.9))
    i, j = inside[np.argmin(values[inside])], inside[np.argmax(values[inside])]
    span = (values[j] - values[i]) / (float(col["s"][j]) - float(col["s"][i]))
    lo, hi = values[i] - float(col["s"][i]) * span, values[i] - float(col["s"][i]) * span + span
    s_tft = np.clip((clipped - tails[0]) / (tails[-1] - tails[0]), 0, 1)
    q_rank, tft_rank = _rank_errors(ordered, q, levels), _rank_errors(ordered, q_tft, levels)
    tails_rank = _rank_errors(ordered, [lo, hi], [0.01, 0.99])
    figures = {
        "seconds (analysis + transform, 1M rows, 4 DP + 4 tft analyzers)": round(seconds, 1),
        "max |z - z_tft|": float(np.max(np.abs(col["z"] - col["z_tft"]))),
        "z bound (1e-6)": _z_error_bound(values, eps, high, alpha) + 1e-5,
        "max |q - q_tft| (mph)": float(np.max(np.abs(q - q_tft))),
        "rank errors of q (rows)": q_rank.astype(int).tolist(),
        "rank errors of tft.quantiles (rows)": tft_rank.astype(int).tolist(),
        "rank bound of q (rows)": allowed(q).astype(int).tolist(),
        "rows with b != b_tft": int(np.sum(col["b"] != col["b_tft"])),
        "rank errors of dp_scale_to_0_1's 1%/99% points (rows)": tails_rank.astype(int).tolist(),
        "max |s - s(tft 1%/99%)|": float(np.max(np.abs(col["s"] - s_tft))),
        "mean |s - tft.scale_to_0_1 of clipped| (min/max: other semantics)": float(
            np.mean(np.abs(col["s"] - (clipped - clipped.min()) / (clipped.max() - clipped.min())))
        ),
    }
    print("\nGENERATED 1M rows, epsilon 1:", figures)
    assert figures["max |z - z_tft|"] <= figures["z bound (1e-6)"]
    assert np.all(np.abs(q_rank) <= allowed(q)) and np.all(np.diff(q) > 0)
    assert np.all(np.abs(tails_rank) <= allowed([lo, hi]))
    assert figures["rows with b != b_tft"] <= np.sum(allowed(q) + np.abs(tft_rank) + 2)
