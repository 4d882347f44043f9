"""Private partition selection for the per-key count and sum (keys not known in advance): `partitions.select_tables`
and ``dp_count_per_key`` / ``dp_sum_per_key(..., partition_selection=delta)``.

Statistical checks use FIXED seeds (deterministic); each bound is 5 standard errors of a binomial count or of a
Laplace sample variance (a correct implementation fails one for a random seed with probability below 1e-6).
"""

import math

import numpy as np
import pytest

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)
from sage_tfx.transform import DPTransformError, noise, partitions
from sage_tfx.transform.vocabulary import threshold
from tests.helpers.tft_run import analyze

EPS, RANGE = 1.0, 100.0


def _select(kind, keys, counts, sums, delta, seed, m=1):
    return partitions.select_tables(
        keys,
        counts,
        sums,
        kind=kind,
        epsilon=EPS,
        delta=delta,
        value_range=RANGE,
        mean_form=noise.CENTRED_MEAN,
        max_partitions_contributed=m,
        seed=seed,
        stream="test",
    )


@pytest.mark.parametrize("kind", [partitions.COUNT, partitions.SUM])
@pytest.mark.parametrize("m", [1, 3])
def test_a_key_held_by_one_row_is_released_with_probability_at_most_delta_over_m(kind, m):
    """20,000 keys of one row each (the key a neighbour adds), the row at the largest value R (the sum's worst
    case): each passes with probability <= delta / m (a union bound over the <= m keys one row adds gives delta),
    and not far below it (the threshold is not needlessly high)."""
    n, delta = 20_000, 0.03
    kept, values = _select(kind, list(range(n)), np.ones(n), np.full(n, RANGE), delta, seed=1, m=m)
    p = delta / m
    sd = math.sqrt(n * p * (1 - p))
    assert 0.7 * n * p - 5 * sd < len(kept) <= n * p + 5 * sd
    assert len(kept) == values.size


@pytest.mark.parametrize("kind", [partitions.COUNT, partitions.SUM])
def test_at_a_small_delta_no_key_of_one_row_is_released(kind):
    """delta 1e-6 over 20,000 one-row keys: the expected number released is 0.02, so none (P(any) < 0.02)."""
    n = 20_000
    kept, values = _select(kind, list(range(n)), np.ones(n), np.full(n, RANGE), 1e-6, seed=2)
    assert kept == [] and values.size == 0


def test_the_spend_is_epsilon_and_the_count_selects_at_its_share():
    count = partitions.selection_release(partitions.COUNT, EPS, RANGE, noise.CENTRED_MEAN)
    assert count.sensitivities == (1.0,) and sum(count.epsilons) == pytest.approx(EPS, rel=1e-12)
    total = partitions.selection_release(partitions.SUM, EPS, RANGE, noise.CENTRED_MEAN)
    assert total.shift == 0.0 and total.sensitivities == (1.0, RANGE)
    assert sum(total.epsilons) == pytest.approx(EPS, rel=1e-12)
    assert total.epsilons[0] == pytest.approx(partitions.SUM_SELECTION_SHARE * EPS, rel=1e-12)


@pytest.mark.parametrize("kind", [partitions.COUNT, partitions.SUM])
def test_frequent_keys_are_kept_with_the_stated_noise(kind):
    """2,000 keys of 500 rows each (value 40 a row, on the sum's grid): all pass the threshold (~14 rows for the
    count, ~27 for the sum's count at delta 1e-6), come back sorted, and the released table's error has mean 0
    and variance 2 b^2 (5 standard errors: the sample variance's is sqrt(20 / N) b^2)."""
    n = 2_000
    keys = [f"k{i:05d}" for i in range(n)][::-1]
    counts = np.full(n, 500.0)
    gamma = partitions.selection_grid(kind, EPS, RANGE, noise.CENTRED_MEAN, 1)
    sums = np.round(counts * 40.0 / gamma) * gamma
    kept, values = _select(kind, keys, counts, sums, 1e-6, seed=3)
    assert kept == sorted(keys)
    release = partitions.selection_release(kind, EPS, RANGE, noise.CENTRED_MEAN)
    b = release.scales[-1]
    err = values - (counts if kind == partitions.COUNT else sums)
    assert abs(err.mean()) < 5 * math.sqrt(2 * b * b / n)
    assert abs(err.var() - 2 * b * b) < 5 * math.sqrt(20.0 / n) * b * b
    assert threshold(release.epsilons[0], 1e-6) < 500 / 10


def test_an_empty_data_set_releases_no_key_and_does_not_fail():
    for kind in (partitions.COUNT, partitions.SUM):
        kept, values = _select(kind, [], [], [], 1e-6, seed=4)
        assert kept == [] and values.size == 0


def test_bad_sum_options_are_refused_before_any_charge():
    """The sum's own checks (the options it shares with the means: test_partition_selection.py)."""
    import tensorflow as tf

    from sage_tfx.transform import dp_sum_per_key
    from sage_tfx.transform.budget import requested_spends

    with tf.Graph().as_default() as graph:
        key = tf.compat.v1.placeholder(tf.string, [None])
        value = tf.compat.v1.placeholder(tf.float32, [None])
        with pytest.raises(DPTransformError, match="key must be a tf.string or integer tensor, got dtype float32"):
            dp_sum_per_key(value, value, None, EPS, RANGE, partition_selection=1e-6)
        with pytest.raises(DPTransformError, match="value_range must be a finite number > 0"):
            dp_sum_per_key(key, value, None, EPS, -1.0, partition_selection=1e-6)
        assert requested_spends(graph) == []  # nothing was recorded, so nothing can be charged


def test_a_grant_without_delta_refuses_the_selection_while_traced():
    """A preprocessing grant of (0.5, 0) refuses a selected count or sum (it needs delta) when traced, before any
    record is read; with the delta both are accepted and recorded at (epsilon, delta)."""
    import tensorflow as tf

    from sage_tfx.components.dp_transform_executor import trace_spend
    from sage_tfx.transform import BudgetExceeded, PreprocessingBudget, dp_count_per_key, dp_sum_per_key

    spec = {"s": tf.io.FixedLenFeature([], tf.string), "v": tf.io.FixedLenFeature([], tf.float32)}

    def fn(i, custom_config):
        budget = PreprocessingBudget.from_custom_config(custom_config)
        eps_n, eps_s = budget.split(2)
        delta_n, delta_s = budget.split_delta(2) if budget.delta else (1e-6, 1e-6)
        counts = dp_count_per_key(i["s"], None, eps_n, partition_selection=delta_n)
        sums = dp_sum_per_key(i["s"], i["v"], None, eps_s, RANGE, partition_selection=delta_s)
        return {"n": counts.lookup(i["s"], default=0.0), "t": sums.lookup(i["s"], default=0.0)}

    with pytest.raises(BudgetExceeded, match=r"delta=1e-06"):
        trace_spend(fn, spec, {"sage": {"preprocessing_epsilon": 0.5}}, grant_seed=7)
    eps, delta, spends, _ = trace_spend(
        fn, spec, {"sage": {"preprocessing_epsilon": 0.5, "preprocessing_delta": 2e-6}}, grant_seed=7
    )
    assert (eps, delta, len(spends)) == (0.5, 2e-6, 2)


@pytest.mark.tf
def test_string_keys_through_tf_transform_release_only_the_frequent_keys():
    """Through tf.Transform and Beam: keys 'a' (400 rows, value 20) and 'b' (300 rows, value 70) are released with
    counts and sums near the truth; 'rare' (one row of value R) is not (P <= 1e-6), and its row gets the public
    default."""
    import tensorflow as tf

    from sage_tfx.transform import dp_count_per_key, dp_sum_per_key

    rows = [{"s": "a", "v": 20.0}] * 400 + [{"s": "b", "v": 70.0}] * 300 + [{"s": "rare", "v": RANGE}]

    def preprocessing_fn(i):
        counts = dp_count_per_key(i["s"], None, EPS, partition_selection=1e-6, seed=5)
        sums = dp_sum_per_key(i["s"], i["v"], None, EPS, RANGE, partition_selection=1e-6, seed=5)
        return {
            "s": i["s"],
            "kept": tf.fill(
                tf.shape(i["v"]), tf.size(counts.keys, out_type=tf.int64) * 10 + tf.size(sums.keys, out_type=tf.int64)
            ),
            "n": counts.lookup(i["s"], default=-1.0),
            "t": sums.lookup(i["s"], default=-1.0),
        }

    spec = {"s": tf.io.FixedLenFeature([], tf.string), "v": tf.io.FixedLenFeature([], tf.float32)}
    out = analyze(rows, spec, preprocessing_fn, batch_size=128)
    by_key = {}
    for r in out:
        by_key.setdefault(r["s"], set()).add((round(float(r["n"]), 3), round(float(r["t"]), 1)))
    assert {r["kept"] for r in out} == {22}
    assert by_key[b"rare"] == {(-1.0, -1.0)}
    ((n_a, t_a),), ((n_b, t_b),) = by_key[b"a"], by_key[b"b"]
    # noise sd: count sqrt(2)/1 ~ 1.4; sum sqrt(2) * 2R ~ 283: 5 sd bounds
    assert abs(n_a - 400) < 8 and abs(n_b - 300) < 8
    assert abs(t_a - 8000) < 1500 and abs(t_b - 21000) < 1500
