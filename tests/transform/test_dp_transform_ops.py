"""DP preprocessing analyzers (sage_tfx.transform) run through tf.Transform on the Beam DirectRunner.

Statistical tests use FIXED seeds, so they are deterministic; the false-failure rate
stated at each is the chance that a correct implementation fails for a random seed.
"""

import argparse
import asyncio
import contextlib
import math
import os
import tempfile
import threading

import numpy as np
import pytest
from scipy import stats

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)
from sage_tfx.transform import (
    BUDGET_KEY,
    EPSILON_FIELD,
    BudgetExceeded,
    DPTransformError,
    MissingBudget,
    PreprocessingBudget,
    budget_custom_config,
    noise,
)
from tests.helpers.tft_run import analyze

KS_ALPHA = 1e-3  # per KS test: a correct implementation fails it with probability 0.001


# ---------------------------------------------------------------- helpers


def _tf():
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    return tf, tft, tft_beam


def _spec():
    tf, _, _ = _tf()
    return {"key": tf.io.FixedLenFeature([], tf.int64), "value": tf.io.FixedLenFeature([], tf.float32)}


def _analyze(rows, preprocessing_fn, batch_size=None):
    """Run AnalyzeAndTransformDataset on in-memory rows; return the transformed rows."""
    return analyze(rows, _spec(), preprocessing_fn, batch_size)


def _per_key(rows, column):
    """{key: the set of values `column` takes on that key's rows}."""
    out = {}
    for row in rows:
        out.setdefault(int(row["key"]), set()).add(float(row[column]))
    return out


# ---------------------------------------------------------------- noise and budget (no TensorFlow)


def test_rng_is_fresh_by_default_and_reproducible_only_with_a_test_seed():
    a = noise.add_laplace([np.zeros(8)], [1.0])[0]
    b = noise.add_laplace([np.zeros(8)], [1.0])[0]
    assert not np.array_equal(a, b)
    c = noise.add_laplace([np.zeros(8)], [1.0], seed=7, stream="x")[0]
    d = noise.add_laplace([np.zeros(8)], [1.0], seed=7, stream="x")[0]
    e = noise.add_laplace([np.zeros(8)], [1.0], seed=7, stream="y")[0]
    assert np.array_equal(c, d) and not np.array_equal(c, e)


def test_guarded_mean_stays_in_range_even_with_bad_noisy_counts():
    means = noise.guarded_mean(np.array([5.0, -3.0, 1e9, -1e9]), np.array([0.0, -2.0, 0.5, 3.0]), 10.0)
    assert np.all((means >= 0) & (means <= 10.0))


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "x", None, True])
def test_bad_epsilon_is_named(bad):
    with pytest.raises(DPTransformError, match=repr(bad) if not isinstance(bad, float) else "epsilon"):
        PreprocessingBudget(bad)


def test_budget_from_custom_config_and_split():
    config = budget_custom_config(0.9, {"other": 1})
    assert config == {"other": 1, BUDGET_KEY: {EPSILON_FIELD: 0.9}}
    budget = PreprocessingBudget.from_custom_config(config)
    even = budget.split(3)
    assert len(even) == 3 and math.fsum(even) <= 0.9 and math.isclose(math.fsum(even), 0.9)
    weighted = budget.split(weights=[3, 1])
    assert math.isclose(weighted[0], 0.675) and math.fsum(weighted) <= 0.9
    for n in range(1, 50):  # rounding never lets the shares exceed the grant
        assert math.fsum(PreprocessingBudget(0.1).split(n)) <= 0.1
    with pytest.raises(ValueError, match="-1"):
        budget.split(weights=[1, -1])
    with pytest.raises(MissingBudget, match=EPSILON_FIELD):
        PreprocessingBudget.from_custom_config({"sage": {}})
    with pytest.raises(MissingBudget, match=BUDGET_KEY):
        PreprocessingBudget.from_custom_config(None)


# ---------------------------------------------------------------- analyzers through tf.Transform


@pytest.mark.tf
def test_same_key_same_value_in_range_and_fresh_noise_per_analysis():
    """Noise once: every row (across many batches) of a key gets one value, in [0, R] despite wild
    values; a second analysis draws new noise."""
    from sage_tfx.transform import dp_group_by_mean, dp_mean, dp_variance

    nkeys, value_range = 6, 50.0
    wild = [1e9, -1e9, float("inf"), float("-inf"), float("nan")]
    rows = [{"key": i % nkeys, "value": (wild[i % 5] if i % 7 == 0 else float(5 * (i % nkeys)))} for i in range(600)]

    def preprocessing_fn(inputs):
        tf, _, _ = _tf()
        ones = tf.ones_like(inputs["value"])
        return {
            "key": inputs["key"],
            # epsilon 0.01 on ~100 rows a key: noise (scale 200/10,000) swamps the data, so
            # means land on the clip bounds often; they must never leave [0, R].
            "mean": dp_group_by_mean(inputs["key"], inputs["value"], nkeys, 0.01, value_range),
            "global_mean": ones * dp_mean(inputs["value"], 0.01, value_range),
            "variance": ones * dp_variance(inputs["value"], 0.01, value_range),
        }

    first = _analyze(rows, preprocessing_fn, batch_size=100)  # 6 batches
    second = _analyze(rows, preprocessing_fn, batch_size=100)
    for result in (first, second):
        per_key = _per_key(result, "mean")
        assert sorted(per_key) == list(range(nkeys))
        assert all(len(values) == 1 for values in per_key.values()), per_key
        assert all(0.0 <= v <= value_range for values in per_key.values() for v in values)
        assert len({r["global_mean"] for r in result}) == 1 and 0 <= result[0]["global_mean"] <= value_range
        assert len({r["variance"] for r in result}) == 1 and 0 <= result[0]["variance"] <= value_range**2 / 4
    assert _per_key(first, "mean") != _per_key(second, "mean")


@pytest.mark.tf
def test_noise_distributions_match_the_stated_laplace_scales():
    """KS tests of the observed errors (noisy - exact) of one analysis with 1,500 keys.

    Seven KS tests at KS_ALPHA each (false-failure rate <= 0.007 for a random seed), and
    four power checks that the errors REJECT half the stated scale (a correct
    implementation fails them with probability far below 1e-6 at 1,500 draws).
    """
    from sage_tfx.transform import (
        dp_count_per_key,
        dp_histogram,
        dp_mean,
        dp_mean_per_key,
        dp_sum_per_key,
        dp_variance,
    )

    nkeys, eps, value_range, seed = 1500, 0.5, 10.0, 20240611
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, nkeys, size=6000)
    values = rng.uniform(-5.0, 15.0, size=6000)  # a quarter outside [0, R]: clipping counts
    rows = [{"key": int(k), "value": float(v)} for k, v in zip(keys, values)]

    def preprocessing_fn(inputs):
        tf, _, _ = _tf()
        k, v = inputs["key"], inputs["value"]
        tables = dp_mean_per_key(k, v, nkeys, eps, value_range, mean_form="sage", seed=seed)
        centred = dp_mean_per_key(k, v, nkeys, eps, value_range, seed=seed)  # the default form
        return {
            "key": k,
            "mean_count": tf.gather(tables.counts, k),
            "mean_sum": tf.gather(tables.sums, k),
            "mean": tf.gather(tables.means, k),
            "cmean_count": tf.gather(centred.counts, k),
            "cmean_sum": tf.gather(centred.sums, k),
            "cmean": tf.gather(centred.means, k),
            "count": tf.gather(dp_count_per_key(k, nkeys, eps, seed=seed), k),
            "sum": tf.gather(dp_sum_per_key(k, v, nkeys, eps, value_range, seed=seed), k),
            "hist": tf.gather(dp_histogram(k, eps, num_buckets=nkeys, seed=seed), k),
            # epsilon 50 on 6,000 rows: noise below 1e-3 (tail bounds exp(-40)), so these
            # check the estimators themselves.
            "global_mean": tf.ones_like(v) * dp_mean(v, 50.0, value_range, seed=seed),
            "variance": tf.ones_like(v) * dp_variance(v, 50.0, value_range, seed=seed),
        }

    result = _analyze(rows, preprocessing_fn, batch_size=1000)
    exact_counts = np.bincount(keys, minlength=nkeys).astype(float)
    exact_sums = np.bincount(keys, weights=np.clip(values, 0, value_range), minlength=nkeys)
    present = np.flatnonzero(exact_counts > 0)  # keys seen in the output rows
    assert len(present) > 1400

    def errors(column, exact):
        per_key = _per_key(result, column)
        assert all(len(per_key[k]) == 1 for k in present)
        return np.array([per_key[k].pop() for k in present]) - exact[present]

    clipped = np.clip(values, 0, value_range)
    assert result[0]["global_mean"] == pytest.approx(clipped.mean(), abs=0.01)
    assert result[0]["variance"] == pytest.approx(clipped.var(), abs=0.01)

    # The means are post-processed from the very same noisy counts and sums (one draw for all outputs).
    tables = {c: _per_key(result, c) for c in ("mean_count", "mean_sum", "mean")}
    for k in present:
        (count,), (total,), (mean,) = (tables[c][k] for c in ("mean_count", "mean_sum", "mean"))
        assert mean == pytest.approx(noise.guarded_mean(total, count, value_range), rel=1e-5, abs=1e-5)
    # The centred form: sums are S~ + (R/2) n~ with S~ the released centred sum; the mean reads the same draw.
    release = noise.mean_release(eps, value_range)
    tables = {c: _per_key(result, c) for c in ("cmean_count", "cmean_sum", "cmean")}
    centred_sums = {}
    for k in present:
        (count,), (total,), (mean,) = (tables[c][k] for c in ("cmean_count", "cmean_sum", "cmean"))
        centred_sums[k] = total - release.shift * count
        assert mean == pytest.approx(
            noise.guarded_mean(centred_sums[k], count, value_range, shift=release.shift), rel=1e-5, abs=1e-4
        )
    result = [dict(r, cmean_centred=centred_sums.get(r["key"], 0.0)) for r in result]

    checks = {  # column -> (exact table, stated Laplace scale)
        "cmean_count": (exact_counts, release.scales[0]),
        "cmean_centred": (exact_sums - release.shift * exact_counts, release.scales[1]),
        "mean_count": (exact_counts, 2.0 / eps),
        "mean_sum": (exact_sums, 2.0 * value_range / eps),
        "count": (exact_counts, 1.0 / eps),
        "sum": (exact_sums, value_range / eps),
        "hist": (exact_counts, 1.0 / eps),
    }
    for column, (exact, scale) in checks.items():
        err = errors(column, exact)
        p = stats.kstest(err, stats.laplace(scale=scale).cdf).pvalue
        assert p > KS_ALPHA, f"{column}: errors do not look Laplace({scale}) (KS p={p:.2g})"
        if column.startswith(("mean_", "cmean_")):
            p_half = stats.kstest(err, stats.laplace(scale=scale / 2).cdf).pvalue
            assert p_half < 1e-6, f"{column}: KS cannot tell scale {scale} from {scale / 2} (p={p_half:.2g})"


@pytest.mark.tf
def test_over_asking_raises_before_any_data_is_read():
    import apache_beam as beam

    from sage_tfx.transform import dp_group_by_mean, dp_sum_per_key, trace_requested_epsilon

    tf, tft, tft_beam = _tf()
    config = budget_custom_config(1.0)

    def greedy_fn(inputs, custom_config):
        budget = PreprocessingBudget.from_custom_config(custom_config)
        eps_a, eps_b = budget.split(2)
        out = {"a": dp_group_by_mean(inputs["key"], inputs["value"], 4, eps_a, 10.0)}
        out["b"] = tf.gather(dp_sum_per_key(inputs["key"], inputs["value"], 4, eps_b, 10.0), inputs["key"])
        assert budget.remaining == 0.0
        out["c"] = dp_group_by_mean(inputs["key"], inputs["value"], 4, 0.01, 10.0)  # one too many
        return out

    with pytest.raises(BudgetExceeded, match=r"0\.01.*1\.0"):
        trace_requested_epsilon(greedy_fn, _spec(), config)

    reads = []
    metadata = tft.DatasetMetadata.from_feature_spec(_spec())
    with pytest.raises(BudgetExceeded):
        with tempfile.TemporaryDirectory() as tmp, tft_beam.Context(temp_dir=tmp):
            with beam.Pipeline() as pipeline:
                raw = pipeline | beam.Create([{"key": 1, "value": 2.0}]) | beam.Map(lambda r: reads.append(r) or r)
                _ = (raw, metadata) | tft_beam.AnalyzeAndTransformDataset(lambda x: greedy_fn(x, config))
    assert reads == []

    def honest_fn(inputs, custom_config):  # no helper: the trace still counts every analyzer
        return {
            "a": dp_group_by_mean(inputs["key"], inputs["value"], 4, 0.25, 10.0),
            "b": dp_group_by_mean(inputs["key"], inputs["value"], 4, 0.5, 10.0),
        }

    total, spends = trace_requested_epsilon(honest_fn, _spec(), config)
    assert total == 0.75 and [s.epsilon for s in spends] == [0.25, 0.5]


@pytest.mark.tf
def test_bad_arguments_are_named_at_trace_time():
    from sage_tfx.transform import dp_group_by_mean, dp_histogram

    tf, _, _ = _tf()
    with tf.Graph().as_default():
        key = tf.compat.v1.placeholder(tf.int64, [None])
        value = tf.compat.v1.placeholder(tf.float32, [None])
        for kwargs, named in [
            ({"epsilon": -0.5}, "-0.5"),
            ({"epsilon": float("nan")}, "nan"),
            ({"value_range": 0.0}, "0.0"),
            ({"value_range": float("inf")}, "inf"),
            ({"nkeys": 0}, "nkeys.*0"),
            ({"nkeys": 2.5}, "2.5"),
        ]:
            args = {"nkeys": 3, "epsilon": 1.0, "value_range": 1.0, **kwargs}
            with pytest.raises(DPTransformError, match=named):
                dp_group_by_mean(key, value, **args)
        with pytest.raises(DPTransformError, match="float32"):
            dp_group_by_mean(value, value, 3, 1.0, 1.0)
        with pytest.raises(DPTransformError, match="exactly one"):
            dp_histogram(key, 1.0)


@pytest.mark.tf
def test_out_of_range_key_gets_the_public_default_instead_of_failing():
    """It used to fail the analysis naming the key (37): after the charge, that revealed the row."""
    from sage_tfx.transform import dp_group_by_mean

    rows = [{"key": k, "value": 1.0} for k in (0, 1, 2, 37)]
    out = _analyze(rows, lambda x: {"m": dp_group_by_mean(x["key"], x["value"], 3, 1.0, 5.0)})
    assert out[-1]["m"] == 2.5 and all(0.0 <= r["m"] <= 5.0 for r in out)


@pytest.mark.tf
def test_histogram_over_a_public_vocabulary_counts_unknown_values_in_the_last_bucket():
    from sage_tfx.transform import dp_histogram

    tf, tft, tft_beam = _tf()
    rows = [{"c": c} for c in ["a"] * 300 + ["b"] * 100 + ["zz"] * 200]
    metadata = tft.DatasetMetadata.from_feature_spec({"c": tf.io.FixedLenFeature([], tf.string)})

    def preprocessing_fn(inputs):
        counts = dp_histogram(inputs["c"], 5.0, vocabulary=["a", "b"], seed=3)  # Laplace(0.2)
        return {
            "c": inputs["c"],
            "count": tf.gather(counts, tf.constant([0, 1, 2]))[None, :] + tf.zeros([tf.shape(inputs["c"])[0], 1]),
        }

    with tempfile.TemporaryDirectory() as tmp, tft_beam.Context(temp_dir=tmp):
        (result, _), _ = (rows, metadata) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn)
    counts = np.array(result[0]["count"])
    # |Laplace(0.2)| > 3 has probability exp(-15) ~ 3e-7 per bucket.
    np.testing.assert_allclose(counts, [300, 100, 200], atol=3.0)


@pytest.mark.tf
@pytest.mark.slow
def test_group_by_mean_benchmark_runs_end_to_end_on_a_small_input():
    """Smoke test of `sage bench group-by-mean` (figures are measured, never asserted)."""

    from sage_tfx.bench import group_by_mean

    parser = argparse.ArgumentParser()
    group_by_mean.add_arguments(parser)
    args = parser.parse_args(
        ["--rows", "3000", "--batch-rows", "1000", "--repeats", "1", "--noise-trials", "10", "--no-pipelinedp"]
    )
    figures = group_by_mean.run(args)
    assert figures["data"].startswith("generated")
    for name in ("dp_seconds", "baseline_seconds", "ratio", "segment_baseline_seconds", "dp_mae", "dp_mae_expected"):
        assert math.isfinite(figures[name]) and figures[name] > 0, name
    assert figures["baseline_mae"] < 1e-3  # the plain analyzers are exact up to float32 rounding


# ---------------------------------------------------------------- noise_seed: the grant's seed hook


GRANT_SEED = 0x5EED_CAFE_F00D_BEEF_0123_4567_89AB_CDEF  # 128 bits, like Ledger.private_seed


def test_analyzer_seed_keeps_its_derivation():
    """sha256("grant_seed|scope")[:16], as DPTransform has always derived it: seeded tables stay bit-identical."""
    from sage_tfx.transform import analyzer_seed

    # Known answer, computed with the executor's former analyzer_seed (before noise_seed existed).
    assert analyzer_seed(12345, "dp_group_by_mean/") == 145712894521507659537501047019983064460
    seeds = {analyzer_seed(g, s) for g in (1, 2) for s in ("a/", "b/", "a/a/")}
    assert len(seeds) == 6 and all(0 <= s < 2**128 for s in seeds)


def test_noise_seed_nests_and_restores():
    from sage_tfx.transform import analyzer_seed, noise_seed
    from sage_tfx.transform.seeding import resolve_seed

    assert resolve_seed(None, "m/") is None and resolve_seed(5, "m/") == 5  # outside: as given (None = fresh)
    with noise_seed(1):
        assert resolve_seed(None, "m/") == analyzer_seed(1, "m/")
        with noise_seed(2):
            assert resolve_seed(None, "m/") == analyzer_seed(2, "m/")
        assert resolve_seed(None, "m/") == analyzer_seed(1, "m/")
        with pytest.raises(RuntimeError, match="boom"), noise_seed(3):
            raise RuntimeError("boom")
        assert resolve_seed(None, "m/") == analyzer_seed(1, "m/")
    assert resolve_seed(None, "m/") is None


def test_noise_seed_refuses_an_explicit_seed_naming_the_analyzer():
    from sage_tfx.transform import NonPrivateAnalyzer, noise_seed
    from sage_tfx.transform.seeding import resolve_seed

    with noise_seed(1), pytest.raises(NonPrivateAnalyzer, match=r"^outer/dp_mean: seed=7 was given"):
        resolve_seed(7, "outer/dp_mean/")
    for bad in (-1, True, 1.5, "3", None):
        with pytest.raises(DPTransformError, match=f"grant_seed.*{bad!r}"), noise_seed(bad):
            pass


def test_noise_seed_is_per_thread_and_per_task():

    from sage_tfx.transform import analyzer_seed, noise_seed
    from sage_tfx.transform.seeding import resolve_seed

    barrier, seen = threading.Barrier(3), {}

    def worker(i):
        with noise_seed(i):
            barrier.wait(timeout=10)  # all three threads inside their own context at once
            seen[i] = resolve_seed(None, "w/")
            barrier.wait(timeout=10)

    with noise_seed(99):  # a thread started here does not inherit the seed
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        child = threading.Thread(target=lambda: seen.setdefault("child", resolve_seed(None, "w/")))
        for t in threads + [child]:
            t.start()
        for t in threads + [child]:
            t.join()
        assert resolve_seed(None, "w/") == analyzer_seed(99, "w/")
    assert seen == {0: analyzer_seed(0, "w/"), 1: analyzer_seed(1, "w/"), 2: analyzer_seed(2, "w/"), "child": None}

    async def task(i):
        with noise_seed(i):
            await asyncio.sleep(0)  # let the other task enter its context
            return resolve_seed(None, "t/")

    async def both():
        return await asyncio.gather(task(10), task(11))

    assert asyncio.run(both()) == [analyzer_seed(10, "t/"), analyzer_seed(11, "t/")]


def _count_and_histogram(seeds=None):
    """A preprocessing_fn with two analyzers on the same keys; `seeds` gives them explicit seeds."""
    from sage_tfx.transform import dp_count_per_key, dp_histogram

    seeds = seeds or {}

    def preprocessing_fn(inputs):
        tf, _, _ = _tf()
        k = inputs["key"]
        return {
            "count": tf.gather(dp_count_per_key(k, 8, 1.0, seed=seeds.get("count"), name="count"), k),
            "hist": tf.gather(dp_histogram(k, 1.0, num_buckets=8, seed=seeds.get("hist"), name="hist"), k),
        }

    return preprocessing_fn


def _analyze_to(folder, preprocessing_fn, rows, seed=None, workers=1):
    """Build AnalyzeDataset + WriteTransformFn (inside noise_seed(seed) when given), THEN run the pipeline."""

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from sage_tfx.transform import noise_seed

    _, tft, tft_beam = _tf()
    metadata = tft.DatasetMetadata.from_feature_spec(_spec())
    options = PipelineOptions(direct_num_workers=workers, direct_running_mode="multi_threading")
    with beam.Pipeline(options=options) as pipeline:  # runs on exit, after noise_seed has exited
        with (
            tft_beam.Context(temp_dir=str(folder / "tmp")),
            noise_seed(seed) if seed is not None else contextlib.nullcontext(),
        ):
            raw = pipeline | beam.Create(rows)
            transform_fn = (raw, metadata) | tft_beam.AnalyzeDataset(preprocessing_fn)
            _ = transform_fn | tft_beam.WriteTransformFn(str(folder / "out"))
    out = tft.TFTransformOutput(str(folder / "out"))
    tf, _, _ = _tf()
    tables = out.transform_raw_features({"key": tf.range(8, dtype=tf.int64), "value": tf.zeros([8])})
    return {k: v.numpy() for k, v in tables.items()}


@pytest.mark.tf
def test_noise_seed_fixes_each_analyzer_seed_at_trace_time(tmp_path):
    """Built under noise_seed, run after it exited on 2 Beam worker threads: the tables are bit-identical to
    explicit seeds analyzer_seed(grant seed, scope); the two analyzers draw independent noise; and neither
    the grant's seed nor a derived one is written into the transform graph."""
    from sage_tfx.transform import NonPrivateAnalyzer, analyzer_seed

    rows = [{"key": i % 8, "value": 1.0} for i in range(400)]  # 50 rows a key
    seeded = _analyze_to(tmp_path / "seeded", _count_and_histogram(), rows, seed=GRANT_SEED, workers=2)
    derived = {name: analyzer_seed(GRANT_SEED, f"{name}/") for name in ("count", "hist")}
    explicit = _analyze_to(tmp_path / "explicit", _count_and_histogram(derived), rows)
    for name in ("count", "hist"):
        np.testing.assert_array_equal(seeded[name], explicit[name])
        # Laplace(1) noise: |noise| > 20 has probability e^-20 per key.
        assert np.all(np.abs(seeded[name] - 50.0) < 20.0) and np.any(seeded[name] != 50.0)
    assert not np.array_equal(seeded["count"], seeded["hist"])  # same exact counts, other noise

    secrets_ = [GRANT_SEED, *derived.values()]
    forms = [str(s).encode() for s in secrets_] + [format(s, "x").encode() for s in secrets_]
    forms += [s.to_bytes(16, order) for s in secrets_ for order in ("big", "little")]
    for folder, _, files in os.walk(tmp_path / "seeded" / "out"):
        for f in files:
            with open(os.path.join(folder, f), "rb") as file:
                data = file.read()
            assert not any(form in data for form in forms), os.path.join(folder, f)

    with pytest.raises(NonPrivateAnalyzer, match="hist: seed=3 was given"):
        _analyze_to(tmp_path / "refused", _count_and_histogram({"hist": 3}), rows, seed=GRANT_SEED)


@pytest.mark.tf
def test_an_out_of_range_key_or_a_nan_value_changes_nothing_but_the_noisy_output():
    """A row whose key is outside [0, nkeys) used to fail the analysis with the key
    in the message (after the grant was charged: the failure revealed the row). Now such a row counts in no
    table and gets the public default value_range / 2; a NaN value counts as 0. With the same seed, adding
    those rows to the data changes no other row's output beyond what one row may change (one count, one sum),
    and nothing fails."""
    from sage_tfx.transform import dp_count_per_key, dp_group_by_mean

    nkeys, value_range, seed = 4, 20.0, 77
    rows = [{"key": i % nkeys, "value": float(i % 13)} for i in range(400)]
    bad = [{"key": 99, "value": 5.0}, {"key": -3, "value": 5.0}]

    def preprocessing_fn(inputs):
        tf, _, _ = _tf()
        return {
            "key": inputs["key"],
            "mean": dp_group_by_mean(inputs["key"], inputs["value"], nkeys, 1.0, value_range, seed=seed),
            "counts": tf.ones_like(inputs["value"])[:, None]
            * dp_count_per_key(inputs["key"], nkeys, 1.0, seed=seed)[None, :],
        }

    clean = _analyze(rows, preprocessing_fn)
    dirty = _analyze(rows + bad, preprocessing_fn)
    assert [r["mean"] for r in dirty[-2:]] == [value_range / 2] * 2  # the public default
    # out-of-range rows count nowhere: the same seed gives exactly the same tables as without them
    assert _per_key(dirty[:-2], "mean") == _per_key(clean, "mean")
    np.testing.assert_array_equal(np.asarray(dirty[0]["counts"]), np.asarray(clean[0]["counts"]))
    nan_row = _analyze(rows + [{"key": 1, "value": float("nan")}], preprocessing_fn)
    counts = np.asarray(nan_row[0]["counts"]) - np.asarray(clean[0]["counts"])
    np.testing.assert_allclose(counts, [0, 1, 0, 0], atol=1e-4)  # the NaN row is one row of key 1, value 0
