"""dp_mean_per_key / dp_group_by_mean options: a row mask, a public fallback for keys whose
noisy count is low, and a lookup key separate from the aggregation key. Run through tf.Transform on the Beam
DirectRunner. Statistical tests use FIXED seeds (deterministic); each states the chance that a correct
implementation fails it for a random seed.
"""

import numpy as np
import pytest
from scipy import stats

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)
from sage_tfx.transform import DPTransformError, noise
from tests.helpers.tft_run import analyze

pytestmark = pytest.mark.tf

KS_ALPHA = 1e-3


def _analyze(rows, spec, preprocessing_fn, batch_size=1000):
    return analyze(rows, spec, preprocessing_fn, batch_size)


def _spec(*names):
    import tensorflow as tf

    kinds = {"key": tf.int64, "value": tf.float32, "m": tf.float32, "slot": tf.int64, "other": tf.int64}
    return {n: tf.io.FixedLenFeature([], kinds[n]) for n in names}


def _tables_by_slot(rows, columns):
    """{column: np.array [nkeys]} from rows that carry `slot` (each table cell on some row)."""
    nkeys = max(int(r["slot"]) for r in rows) + 1
    out = {c: np.full(nkeys, np.nan) for c in columns}
    for r in rows:
        for c in columns:
            out[c][int(r["slot"])] = float(r[c])
    assert not any(np.isnan(t).any() for t in out.values())
    return out


# ---------------------------------------------------------------- masked rows change nothing


def test_masked_rows_change_nothing():
    """Same seed, same scope: the data with masked rows (wild values, out-of-range keys, mask values 0, 2 and
    NaN, which a numeric mask drops: only exactly 1 keeps a row) gives the very same noisy tables as the data
    without them, for a numeric mask and for a bool one. Deterministic (same noise, same exact tables)."""
    import tensorflow as tf

    nkeys, eps, value_range, seed = 10, 1.0, 20.0, 77
    rng = np.random.default_rng(3)
    kept = [
        {"key": int(k), "value": float(v), "m": 1.0}
        for k, v in zip(rng.integers(0, nkeys, 300), rng.uniform(0, 20, 300))
    ]
    wild = [1e9, -1e9, float("nan"), float("inf"), 5.0]
    dropped = [
        {"key": int(k), "value": wild[i % 5], "m": [0.0, 2.0, float("nan")][i % 3]}
        for i, k in enumerate(rng.integers(-3, nkeys + 3, 300))
    ]
    mixed = [r for pair in zip(kept, dropped) for r in pair]

    def fn(mask_of):
        def preprocessing_fn(inputs):
            k, v, m = inputs["key"], inputs["value"], inputs["m"]
            t = dp_mean_per_key(k, v, nkeys, eps, value_range, mask=mask_of(m), seed=seed)
            ones = tf.ones([tf.shape(k)[0], 1])
            return {
                "counts": ones * t.counts[None, :],
                "sums": ones * t.sums[None, :],
                "means": ones * t.means[None, :],
            }

        return preprocessing_fn

    from sage_tfx.transform import dp_mean_per_key

    spec = _spec("key", "value", "m")
    alone = _analyze(kept, spec, fn(lambda m: None), batch_size=128)[0]
    numeric = _analyze(mixed, spec, fn(lambda m: m), batch_size=128)[0]
    boolean = _analyze(mixed, spec, fn(lambda m: tf.equal(m, 1.0)), batch_size=128)[0]
    exact = np.bincount([r["key"] for r in kept], minlength=nkeys)
    assert np.abs(np.asarray(alone["counts"]) - exact).max() < 15  # the tables are noisy counts of `kept`
    for masked in (numeric, boolean):
        for column in ("counts", "sums", "means"):
            np.testing.assert_allclose(masked[column], alone[column], rtol=1e-6, atol=1e-6, err_msg=column)


# ---------------------------------------------------------------- noise, fallback, lookup key


NKEYS, EPS, RANGE, SEED = 1500, 1.0, 10.0, 20261124
MIN_COUNT, FALLBACK = 4.0, 3.25


@pytest.fixture(scope="module")
def data():
    """12,000 rows. Unmasked rows have keys 0..749 (about 8 each); masked rows (as many, wild values) have keys
    0..1499, so keys 750..1499 have no unmasked row at all. `slot` puts every table cell on some row; `other`
    is a second key column (a destination), with some values outside [0, NKEYS)."""
    rng = np.random.default_rng(SEED)
    n = 12_000
    m = (np.arange(n) % 2).astype(float)
    key = np.where(m == 1, rng.integers(0, NKEYS // 2, n), rng.integers(0, NKEYS, n))
    value = np.where(m == 1, rng.uniform(-2.0, 12.0, n), rng.choice([1e6, -1e6, np.nan, 5.0], n))
    other = rng.integers(0, NKEYS, n)
    other[::97] = -3
    other[::89] = NKEYS + 5
    rows = [
        {"key": int(k), "value": float(v), "m": float(mm), "slot": i % NKEYS, "other": int(o)}
        for i, (k, v, mm, o) in enumerate(zip(key, value, m, other))
    ]
    kept = m == 1
    exact_counts = np.bincount(key[kept], minlength=NKEYS).astype(float)
    exact_sums = np.bincount(key[kept], weights=np.clip(value[kept], 0, RANGE), minlength=NKEYS)
    return dict(rows=rows, exact_counts=exact_counts, exact_sums=exact_sums)


@pytest.fixture(scope="module")
def tables_run(data):
    """dp_mean_per_key with a bool mask and a fallback; the tables by slot and tables.lookup(other)."""
    from sage_tfx.transform import dp_mean_per_key

    def preprocessing_fn(inputs):
        import tensorflow as tf

        t = dp_mean_per_key(
            inputs["key"],
            inputs["value"],
            NKEYS,
            EPS,
            RANGE,
            mask=inputs["m"] > 0.5,
            min_count=MIN_COUNT,
            fallback=FALLBACK,
            seed=SEED,
            name="agg",
        )
        slot = inputs["slot"]
        return {
            "slot": slot,
            "counts": tf.gather(t.counts, slot),
            "sums": tf.gather(t.sums, slot),
            "means": tf.gather(t.means, slot),
            "looked": t.lookup(inputs["other"], default=FALLBACK),
            "other": inputs["other"],
        }

    return _analyze(data["rows"], _spec("key", "value", "m", "slot", "other"), preprocessing_fn)


def test_masked_noise_matches_the_calibrated_laplace_scales(data, tables_run):
    """Errors of the noisy counts and centred sums (the default form: sums - (R/2) counts) against the exact tables
    of the UNMASKED rows, over all 1,500 keys: KS tests against the release's Laplace scales 1/eps_n and
    (R/2)/eps_s (`noise.mean_release`; KS_ALPHA each: false failure <= 0.002 for a random
    seed; plus 2e-4 for the empty keys' check below), and power checks that reject half those scales (p < 1e-6; a correct implementation fails them with
    probability far below 1e-6 at 1,500 draws). Masked rows counted would shift keys 750..1499 by ~8."""
    t = _tables_by_slot(tables_run, ["counts", "sums"])
    release = noise.mean_release(EPS, RANGE)
    t["centred"] = t["sums"].astype(np.float64) - release.shift * t["counts"]
    exact_centred = data["exact_sums"] - release.shift * data["exact_counts"]
    for column, exact, scale in (
        ("counts", data["exact_counts"], release.scales[0]),
        ("centred", exact_centred, release.scales[1]),
    ):
        err = t[column] - exact
        p = stats.kstest(err, stats.laplace(scale=scale).cdf).pvalue
        assert p > KS_ALPHA, f"{column}: errors do not look Laplace({scale}) (KS p={p:.2g})"
        p_half = stats.kstest(err, stats.laplace(scale=scale / 2).cdf).pvalue
        assert p_half < 1e-6, f"{column}: cannot tell scale {scale} from {scale / 2} (p={p_half:.2g})"
        # the keys with no unmasked row: their errors are pure noise too (mean |Lap(b)| = b)
        empty = data["exact_counts"] == 0
        assert empty.sum() >= NKEYS // 2
        # |Lap(b)| has mean b and sd b, so over 750 keys the sd of the mean is 0.037 b: 0.15 b is 4 sd
        # (false failure < 1e-4 per column)
        assert np.mean(np.abs(err[empty])) == pytest.approx(scale, rel=0.15)


def test_fallback_reads_only_the_noisy_count(data, tables_run):
    """means = FALLBACK exactly where the released noisy count is below MIN_COUNT, the guarded ratio of the
    released count and centred sum elsewhere. Both branches occur among the empty keys (P(Lap(2.44) >= 4) =
    e^-1.64 / 2: about 73 of 750 keep a noisy mean) and among the ~8-row keys; all four counts are zero with probability
    below 1e-20."""
    t = _tables_by_slot(tables_run, ["counts", "sums", "means"])
    low = t["counts"] < MIN_COUNT
    assert np.all(t["means"][low] == np.float32(FALLBACK))
    shift = noise.mean_release(EPS, RANGE).shift
    centred = t["sums"].astype(np.float64) - shift * t["counts"]
    np.testing.assert_allclose(
        t["means"][~low], noise.guarded_mean(centred[~low], t["counts"][~low], RANGE, shift=shift), rtol=1e-5, atol=1e-4
    )
    empty = data["exact_counts"] == 0
    assert 0 < np.sum(low & empty) < empty.sum() and 0 < np.sum(low & ~empty) < np.sum(~empty)


def test_lookup_key_reads_the_table_at_another_column(data, tables_run):
    """dp_group_by_mean(..., lookup_key=other) gives each row means[other] (the same tables: same seed and
    scope as the dp_mean_per_key run), and FALLBACK where `other` is outside [0, NKEYS); PerKeyMean.lookup
    agrees. Masked rows get their lookup key's mean too (the mask selects what is aggregated only)."""
    from sage_tfx.transform import dp_group_by_mean

    def preprocessing_fn(inputs):
        return {
            "other": inputs["other"],
            "m": inputs["m"],
            "per_row": dp_group_by_mean(
                inputs["key"],
                inputs["value"],
                NKEYS,
                EPS,
                RANGE,
                mask=inputs["m"] > 0.5,
                min_count=MIN_COUNT,
                fallback=FALLBACK,
                lookup_key=inputs["other"],
                seed=SEED,
                name="agg",
            ),
        }

    out = _analyze(data["rows"], _spec("key", "value", "m", "other"), preprocessing_fn)
    means = _tables_by_slot(tables_run, ["means"])["means"]
    other = np.array([r["other"] for r in out])
    per_row = np.array([r["per_row"] for r in out])
    inside = (other >= 0) & (other < NKEYS)
    assert 0 < np.sum(~inside) < 300
    np.testing.assert_allclose(per_row[inside], means[other[inside]], rtol=1e-6, atol=1e-6)
    assert np.all(per_row[~inside] == np.float32(FALLBACK))
    looked = np.array([r["looked"] for r in tables_run])
    np.testing.assert_array_equal(looked, per_row)  # same rows, same order
    assert {r["m"] for r in out} == {0.0, 1.0}


# ---------------------------------------------------------------- errors at trace time


def test_bad_options_are_named():
    import tensorflow as tf

    from sage_tfx.transform import dp_group_by_mean, dp_mean_per_key

    with tf.Graph().as_default():
        key = tf.compat.v1.placeholder(tf.int64, [None])
        value = tf.compat.v1.placeholder(tf.float32, [None])
        args = (key, value, 3, 1.0, 10.0)
        cases = [
            (dict(mask=tf.compat.v1.placeholder(tf.string, [None])), "mask must be a bool.*dtype string"),
            (dict(mask=tf.compat.v1.placeholder(tf.bool, [None, 2])), r"mask must have one value per row.*\(None, 2\)"),
            (dict(min_count=5), "give both min_count and fallback, got min_count=5, fallback=None"),
            (dict(fallback=1.0), "give both min_count and fallback, got min_count=None, fallback=1.0"),
            (dict(min_count=-1, fallback=1.0), "min_count must be >= 0, got -1"),
            (dict(min_count=5, fallback=float("nan")), "fallback must be a finite number.*nan"),
            (dict(min_count="x", fallback=1.0), "min_count must be a finite number.*'x'"),
            (dict(mean_form="raw"), "mean_form must be one of 'centred', 'sage', got 'raw'"),
            (dict(mean_form=None), "mean_form must be one of 'centred', 'sage', got None"),
        ]
        for kwargs, named in cases:
            for fn in (dp_mean_per_key, dp_group_by_mean):
                with pytest.raises(DPTransformError, match=named):
                    fn(*args, **kwargs)
        with pytest.raises(DPTransformError, match="lookup_key must be an integer tensor, got dtype float32"):
            dp_group_by_mean(*args, lookup_key=value)
        with pytest.raises(DPTransformError, match="lookup_key must be a dense tensor"):
            dp_group_by_mean(*args, lookup_key=tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1]))
        with pytest.raises(DPTransformError, match="default must be a finite number"):
            dp_mean_per_key(*args).lookup(key, default=None)
        with pytest.raises(DPTransformError, match="mask has 5 rows but key has 4"):
            dp_mean_per_key(
                tf.constant([0, 1, 2, 0], tf.int64), tf.constant([1.0] * 4), 3, 1.0, 10.0, mask=tf.constant([True] * 5)
            )


# ---------------------------------------------------------------- the tables are summed exactly on the grid


def test_the_combiner_sums_each_row_on_the_grid_exactly():
    """2^20 rows of 1.0 then 2^14 of 1.5 * 2^-33 (tests/validation/test_grid_sums.py): a float64 running sum is 4 grid units
    (2^-20) above 2^20, the exact sum 3. The analyzers' combiner puts each row on the grid alone (the small rows are
    0 there) and adds the integers, so the table is exactly 2^20 whatever the batching."""
    from sage_tfx.transform.analyzers import _GridSumsFn

    gamma = 2.0**-20
    records = np.concatenate([np.ones(2**20), np.full(2**14, 1.5 * 2.0**-33)])
    assert round(float(np.cumsum(records)[-1]) / gamma) - 2**40 == 4  # the float64 running sum
    fn = _GridSumsFn(1, [gamma])
    accumulators = []
    for part in np.array_split(records, 3):  # three bundles, merged
        acc = fn.create_accumulator()
        for batch in np.array_split(part, 7):
            acc = fn.add_input(acc, (np.zeros(batch.size, dtype=np.int64), batch))
        accumulators.append(acc)
    (table,) = fn.extract_output(fn.merge_accumulators(accumulators))
    assert table.tolist() == [2.0**20]


@pytest.mark.parametrize("mean_form", noise.MEAN_FORMS)
def test_dp_mean_per_key_releases_the_exact_grid_sums_through_tf_transform(mean_form):
    """Through tf.Transform and Beam: four rows of 0.75 grid units on key 0 are one unit each on the grid (4 units,
    where their float sum, 3 units, rounded once gave 3), two rows of 0.5 on key 1 sum to 1.0. With the same seed
    (the same noise), the released sums minus those of all-zero data are exactly those grid sums, and the tables
    do not depend on the batch size. The centred form sums v - R/2 (R/2 = 0.5 is on the grid, so 0.75 grid units
    minus it is again one unit above a grid point) and adds (R/2) n~ back, the same n~ for both data sets."""
    import tensorflow as tf

    from sage_tfx.transform import dp_mean_per_key

    nkeys, eps, value_range, seed = 2, 1.0, 1.0, 5
    release = noise.mean_release(eps, value_range, mean_form)
    gamma = noise.table_grid(release.scales[1], release.sensitivities[1])  # the sums' grid
    rows = [{"key": 0, "value": 0.75 * gamma}] * 4 + [{"key": 1, "value": 0.5}] * 2

    def preprocessing_fn(inputs):
        tables = dp_mean_per_key(
            inputs["key"], inputs["value"], nkeys, eps, value_range, seed=seed, mean_form=mean_form
        )
        return {"sums": tf.ones_like(inputs["value"])[:, None] * tables.sums[None, :]}

    def sums(data, batch_size=1000):
        out = _analyze(data, _spec("key", "value"), preprocessing_fn, batch_size)
        return np.asarray(out[0]["sums"], dtype=np.float64)

    released = sums(rows)
    noise_only = sums([dict(r, value=0.0) for r in rows])
    assert (released - noise_only).tolist() == [4 * gamma, 1.0]
    np.testing.assert_array_equal(sums(rows, batch_size=1), released)
