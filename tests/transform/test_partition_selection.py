"""Private partition selection for the per-key mean (keys not known in advance): `transform.partitions` and
``dp_mean_per_key`` / ``dp_group_by_mean(..., partition_selection=delta)``.

Statistical checks use FIXED seeds (deterministic); each bound is 5 standard errors of a binomial count (a
correct implementation fails one for a random seed with probability below 1e-6).
"""

import numpy as np
import pytest

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)
from sage_tfx.transform import DPTransformError, noise, partitions
from sage_tfx.transform.vocabulary import threshold
from tests.helpers.tft_run import analyze

EPS, RANGE = 1.0, 100.0


def _release(keys, counts, sums, delta, seed, **kw):
    return partitions.select_and_release(
        keys,
        counts,
        sums,
        epsilon=EPS,
        delta=delta,
        value_range=RANGE,
        mean_form=noise.CENTRED_MEAN,
        seed=seed,
        stream="test",
        **kw,
    )


@pytest.mark.parametrize("m", [1, 3])
def test_a_key_held_by_one_row_is_released_with_probability_at_most_delta_over_m(m):
    """20,000 keys of one row each (the key a neighbour adds): each passes the threshold with probability
    <= delta / m (the union bound over the <= m keys one unit adds gives delta), and not far below it (the
    threshold is not needlessly high)."""
    n, delta = 20_000, 0.03
    keys = list(range(n))
    kept, counts, sums, means = _release(keys, np.ones(n), np.zeros(n), delta, seed=1, max_partitions_contributed=m)
    p = delta / m
    sd = np.sqrt(n * p * (1 - p))
    assert 0.7 * n * p - 5 * sd < len(kept) <= n * p + 5 * sd
    assert len(kept) == counts.size == sums.size == means.size
    assert np.all(counts >= threshold(noise.CENTRED_COUNT_SHARE * EPS, delta, m) * (1 - 1e-9))


def test_frequent_keys_are_kept_with_their_noisy_means():
    """Keys with 2,000 rows each pass (the threshold at delta 1e-6 is ~35 rows) and get a mean within the noise of
    the truth; a key kept is released with S~ + (R/2) n~ as its sum; keys come back sorted."""
    keys = ["b", "a", "c"]
    counts = np.array([2000.0, 2000.0, 2000.0])
    truth = np.array([20.0, 50.0, 80.0])
    release = noise.mean_release(EPS, RANGE)
    gamma = partitions.sum_grid(EPS, RANGE, noise.CENTRED_MEAN, 1)
    sums = np.round(counts * (truth - release.shift) / gamma) * gamma
    kept, noisy_c, noisy_sums, means = _release(keys, counts, sums, 1e-6, seed=2)
    assert kept == ["a", "b", "c"]
    assert np.all(np.abs(means - truth[[1, 0, 2]]) < 1.0)  # noise sd ~ 0.06 here
    np.testing.assert_allclose(noisy_sums / noisy_c, means, rtol=1e-9)


def test_an_empty_data_set_releases_no_key_and_does_not_fail():
    """Nothing may fail after the charge: no key present, nothing drawn, four empty tables."""
    kept, counts, sums, means = _release([], [], [], 1e-6, seed=3)
    assert kept == [] and counts.size == sums.size == means.size == 0


def test_bad_selection_options_are_refused_before_any_charge():
    import tensorflow as tf

    from sage_tfx.transform import dp_count_per_key, dp_group_by_mean, dp_mean_per_key, dp_sum_per_key
    from sage_tfx.transform.budget import requested_spends

    with tf.Graph().as_default() as graph:
        key = tf.compat.v1.placeholder(tf.string, [None])
        value = tf.compat.v1.placeholder(tf.float32, [None])
        cases = [
            (dict(nkeys=3, partition_selection=1e-6), "give nkeys=None.*got 3"),
            (dict(nkeys=None, partition_selection=0.0), "partition_selection delta must be"),
            (dict(nkeys=None, partition_selection=1.5), "partition_selection delta must be"),
            (dict(nkeys=None, partition_selection=1e-6, min_count=3), "give min_count=None"),
            (dict(nkeys=None, partition_selection=1e-6, mask=tf.ones_like(value)), "give mask=None"),
            (
                dict(nkeys=None, partition_selection=1e-6, max_partitions_contributed=0),
                "max_partitions_contributed must be an integer >= 1",
            ),
            (dict(nkeys=None, partition_selection=1e-6, mean_form="raw"), "mean_form must be one of"),
        ]
        for kwargs, named in cases:
            nkeys = kwargs.pop("nkeys")
            for fn in (dp_mean_per_key, dp_group_by_mean):
                with pytest.raises(DPTransformError, match=named):
                    fn(key, value, nkeys, EPS, RANGE, **kwargs)
            if {"min_count", "mask", "mean_form"} & kwargs.keys():
                continue  # options of the means only
            with pytest.raises(DPTransformError, match=named):  # the selected count and sum check the same way
                dp_count_per_key(key, nkeys, EPS, **kwargs)
            with pytest.raises(DPTransformError, match=named):
                dp_sum_per_key(key, value, nkeys, EPS, RANGE, **kwargs)
        with pytest.raises(DPTransformError, match="key must be a tf.string or integer tensor, got dtype float32"):
            dp_mean_per_key(value, value, None, EPS, RANGE, partition_selection=1e-6)
        assert requested_spends(graph) == []  # nothing was recorded, so nothing can be charged


def test_a_grant_without_delta_refuses_the_selection_while_traced():
    """A preprocessing grant of (0.5, 0) refuses partition selection (it needs delta) when the function is traced,
    before DPTransform reads any record; with a delta it is accepted, and DPTransform's analyzer check (seeded from
    the grant) takes the analyzer."""
    import tensorflow as tf

    from sage_tfx.components.dp_transform_executor import trace_spend
    from sage_tfx.transform import BudgetExceeded, PreprocessingBudget, dp_group_by_mean

    spec = {"s": tf.io.FixedLenFeature([], tf.string), "v": tf.io.FixedLenFeature([], tf.float32)}

    def fn(i, custom_config):
        budget = PreprocessingBudget.from_custom_config(custom_config)
        return {"m": dp_group_by_mean(i["s"], i["v"], None, budget.epsilon, RANGE, partition_selection=1e-6)}

    with pytest.raises(BudgetExceeded, match=r"delta=1e-06"):
        trace_spend(fn, spec, {"sage": {"preprocessing_epsilon": 0.5}}, grant_seed=7)
    eps, delta, spends, _ = trace_spend(
        fn, spec, {"sage": {"preprocessing_epsilon": 0.5, "preprocessing_delta": 1e-6}}, grant_seed=7
    )
    assert (eps, delta, len(spends)) == (0.5, 1e-6, 1)  # trace_spend ran DPTransform's analyzer check too


@pytest.mark.tf
def test_string_keys_through_tf_transform_release_only_the_frequent_keys():
    """Through tf.Transform and Beam: keys 'a' (400 rows, value 20) and 'b' (300 rows, value 70) are released with
    means near their values; 'rare' (one row) is not (P <= 1e-6), and its row gets the public fallback. The
    tables come out aligned with the sorted kept keys."""
    import tensorflow as tf

    from sage_tfx.transform import dp_group_by_mean, dp_mean_per_key

    rows = [{"s": "a", "v": 20.0}] * 400 + [{"s": "b", "v": 70.0}] * 300 + [{"s": "rare", "v": 99.0}]

    def preprocessing_fn(i):
        tables = dp_mean_per_key(i["s"], i["v"], None, EPS, RANGE, partition_selection=1e-6, seed=4)
        ones = tf.ones_like(i["v"])[:, None]
        return {
            "s": i["s"],
            "n_kept": tf.fill(tf.shape(i["v"]), tf.size(tables.keys, out_type=tf.int64)),
            "means": ones * tf.reshape(tf.pad(tables.means, [[0, 3 - tf.size(tables.means)]]), [1, 3]),
            "m": dp_group_by_mean(
                i["s"], i["v"], None, EPS, RANGE, partition_selection=1e-6, fallback=-1.0, seed=4, name="again"
            ),
        }

    spec = {"s": tf.io.FixedLenFeature([], tf.string), "v": tf.io.FixedLenFeature([], tf.float32)}
    out = analyze(rows, spec, preprocessing_fn, batch_size=128)
    by_key = {}
    for r in out:
        by_key.setdefault(r["s"], set()).add(round(float(r["m"]), 4))
    assert {r["n_kept"] for r in out} == {2}
    assert by_key[b"rare"] == {-1.0}
    (mean_a,), (mean_b,) = by_key[b"a"], by_key[b"b"]
    assert abs(mean_a - 20.0) < 3.0 and abs(mean_b - 70.0) < 3.0  # noise sd ~ 0.6 at 300 rows
    released = np.asarray(out[0]["means"])
    assert abs(released[0] - 20.0) < 3.0 and abs(released[1] - 70.0) < 3.0 and released[2] == 0.0
