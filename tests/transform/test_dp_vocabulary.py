"""DP partition selection behind the DP vocabulary (sage_tfx.transform.vocabulary; numpy only, fast)."""

import math
import tempfile
import threading

import numpy as np
import pytest

from sage_tfx.transform.errors import DPTransformError
from sage_tfx.transform.vocabulary import apply_vocabulary, select_vocabulary, threshold


def test_threshold_matches_the_formula():
    assert threshold(1.0, 1e-6) == pytest.approx(1 + math.log(1 / 2e-6))
    assert threshold(0.5, 1e-5, 2) == pytest.approx(2 + 4 * math.log(2 / 2e-5))


def test_frequent_values_kept_rare_ones_dropped():
    counts = {"a": 1000, "b": 500, "c": 200}
    counts.update({f"rare{i}": 1 for i in range(200)})
    for seed in range(5):
        vocab = select_vocabulary(counts, epsilon=1.0, delta=1e-6, seed=seed)
        assert vocab == ["a", "b", "c"]  # ordered by noisy count; gaps >> Laplace(1) noise
    assert select_vocabulary(counts, epsilon=1.0, delta=1e-6, top_k=2, seed=0) == ["a", "b"]


def test_single_row_values_released_with_probability_at_most_delta():
    # 20000 draws of a count-1 value at delta = 0.01: P(release) = delta exactly for Laplace.
    # Expected releases 200, sd ~14.1; failing bound 200 + 5 sd = 270.5 (false failure < 1e-6).
    delta, n = 0.01, 20000
    counts = {f"v{i}": 1 for i in range(n)}
    released = len(select_vocabulary(counts, epsilon=1.0, delta=delta, seed=123))
    assert released <= n * delta + 5 * math.sqrt(n * delta * (1 - delta))
    assert released >= n * delta - 5 * math.sqrt(n * delta * (1 - delta))  # the calibration is not far too strict


def test_order_uses_noisy_counts_and_seed_reproduces():
    counts = {"x": 10, "y": 10, "z": 10}
    a = select_vocabulary(counts, epsilon=0.1, delta=0.4, seed=7)
    assert a == select_vocabulary(counts, epsilon=0.1, delta=0.4, seed=7)
    orders = {tuple(select_vocabulary(counts, epsilon=0.1, delta=0.4, seed=s)) for s in range(30)}
    assert len(orders) > 1  # equal exact counts, different noisy orders


@pytest.mark.parametrize(
    "kwargs", [dict(delta=0.0), dict(delta=1.0), dict(epsilon=-1), dict(top_k=0), dict(max_contributions=0)]
)
def test_bad_arguments_are_named(kwargs):
    args = dict(epsilon=1.0, delta=1e-6)
    args.update(kwargs)
    with pytest.raises(DPTransformError, match=next(iter(kwargs))):
        select_vocabulary({"a": 5}, **args)


def test_apply_vocabulary_ids_and_oov():
    vocab = ["a", "b"]
    ids = apply_vocabulary(["b", "a", "zz"], vocab, num_oov_buckets=3)
    assert list(ids[:2]) == [1, 0] and 2 <= ids[2] < 5
    assert list(apply_vocabulary(["zz", "a"], vocab, num_oov_buckets=0, default_value=-1)) == [-1, 0]
    with pytest.raises(DPTransformError, match="num_oov_buckets"):
        apply_vocabulary(["a"], vocab, num_oov_buckets=-1)


# ---------------------------------------------------------------- the tf.Transform analyzers (Beam runs, ~3 s each)


def _run(fn, rows, batch_size=50):
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    spec = {"s": tf.io.FixedLenFeature([], tf.string)}
    with tft_beam.Context(temp_dir=tempfile.mkdtemp(), desired_batch_size=batch_size):
        (data, _), _ = (rows, tft.DatasetMetadata.from_feature_spec(spec)) | tft_beam.AnalyzeAndTransformDataset(fn)
    return data


_ROWS = [{"s": "a"}] * 300 + [{"s": "b"}] * 200 + [{"s": "c"}] * 100


@pytest.mark.tf
def test_ids_match_tft_compute_and_apply_vocabulary_when_every_value_is_frequent():
    import tensorflow_transform as tft

    from sage_tfx.transform import dp_compute_and_apply_vocabulary

    def fn(i):
        return {
            "dp": dp_compute_and_apply_vocabulary(i["s"], 1.0, 1e-6, num_oov_buckets=0, seed=3),
            "tft": tft.compute_and_apply_vocabulary(i["s"]),
        }

    rows = _ROWS + [{"s": f"rare{k}"} for k in range(10)]
    data = _run(fn, rows)
    frequent = [r for r, raw in zip(data, rows) if not raw["s"].startswith("rare")]
    assert all(r["dp"] == r["tft"] for r in frequent)
    # rare values (count 1) are dropped at delta = 1e-6 and take default_value
    assert all(r["dp"] == -1 for r in data[len(_ROWS) :])


@pytest.mark.tf
def test_the_vocabulary_is_drawn_once_for_all_batches_and_oov_hashes_after_it():
    from sage_tfx.transform import dp_compute_and_apply_vocabulary, dp_vocabulary

    # equal counts: the order is decided by noise only, so per-batch draws would disagree
    rows = [{"s": v} for _ in range(100) for v in ("x", "y", "z")] + [{"s": "once"}]

    def fn(i):
        vocab = dp_vocabulary(i["s"], 1.0, 1e-6, seed=11, name="v")
        return {
            "id": dp_compute_and_apply_vocabulary(i["s"], 1.0, 1e-6, num_oov_buckets=2, seed=11, name="v2"),
            "n": tf_size(vocab, i["s"]),
        }

    data = _run(fn, rows, batch_size=7)
    by_value = {}
    for raw, out in zip(rows, data):
        by_value.setdefault(raw["s"], set()).add(int(out["id"]))
    assert all(len(ids) == 1 for ids in by_value.values())  # one id per value across ~43 batches
    assert sorted(next(iter(by_value[v])) for v in "xyz") == [0, 1, 2]
    assert next(iter(by_value["once"])) in (3, 4)
    assert {int(r["n"]) for r in data} == {3}


def tf_size(vocab, x):
    import tensorflow as tf

    return tf.fill(tf.shape(x), tf.size(vocab, out_type=tf.int64))


@pytest.mark.tf
def test_budget_records_epsilon_and_delta_and_the_check_accepts_it():
    import tensorflow as tf
    import tensorflow_transform as tft
    from tensorflow_transform import impl_helper

    from sage_tfx.components.dp_transform_executor import NonPrivateAnalyzer, check_traced_analyzers, trace_spend
    from sage_tfx.transform import BudgetExceeded, PreprocessingBudget, dp_compute_and_apply_vocabulary, dp_vocabulary
    from sage_tfx.transform.budget import requested_delta, requested_spends

    spec = {"s": tf.io.FixedLenFeature([], tf.string)}

    def fn(i):
        v = dp_vocabulary(i["s"], 0.25, 1e-6, seed=1)
        return {
            "id": dp_compute_and_apply_vocabulary(i["s"], 0.5, 2e-6, seed=2),
            "n": tf.fill(tf.shape(i["s"]), tf.size(v)),
        }

    graph, _, _ = impl_helper.trace_preprocessing_function(fn, spec, use_tf_compat_v1=True)
    check_traced_analyzers(graph)  # our PTransform is accepted (and seeded)
    assert sorted(s.epsilon for s in requested_spends(graph)) == [0.25, 0.5]
    assert requested_delta(graph) == pytest.approx(3e-6)
    assert [s.delta for s in requested_spends(graph)] == [1e-6, 2e-6]
    with pytest.raises(NonPrivateAnalyzer, match="not differentially private"):
        trace_spend(lambda i: {"o": tft.compute_and_apply_vocabulary(i["s"])}, spec, {}, grant_seed=7)
    # DPTransform's trace sums both: (epsilon, delta, spends, digest)
    eps, delta, spends, _ = trace_spend(
        lambda i: {"o": dp_compute_and_apply_vocabulary(i["s"], 0.5, 1e-6)}, spec, {}, grant_seed=7
    )
    assert (eps, delta, len(spends)) == (0.5, 1e-6, 1)

    # a PreprocessingBudget refuses a delta beyond its own, while traced
    def over(i, custom_config):
        budget = PreprocessingBudget.from_custom_config(custom_config)
        return {"o": dp_compute_and_apply_vocabulary(i["s"], budget.epsilon, 2 * budget.delta)}

    config = {"sage": {"preprocessing_epsilon": 0.5, "preprocessing_delta": 1e-6}}
    with pytest.raises(BudgetExceeded, match=r"asks delta=2e-06.*more than its grant of 1e-06"):
        trace_spend(over, spec, config, grant_seed=7)


@pytest.mark.tf
def test_an_empty_dp_vocabulary_maps_every_row_to_oov_without_failing():
    from sage_tfx.transform import dp_compute_and_apply_vocabulary

    rows = [{"s": f"rare{k}"} for k in range(20)]
    data = _run(
        lambda i: {
            "a": dp_compute_and_apply_vocabulary(i["s"], 1.0, 1e-6, num_oov_buckets=0, seed=3),
            "b": dp_compute_and_apply_vocabulary(i["s"], 1.0, 1e-6, num_oov_buckets=2, seed=3, name="b"),
        },
        rows,
    )
    assert all(r["a"] == -1 and r["b"] in (0, 1) for r in data)


@pytest.mark.tf
def test_bad_analyzer_arguments_are_named():
    import tensorflow as tf

    from sage_tfx.transform import dp_compute_and_apply_vocabulary, dp_vocabulary

    with tf.Graph().as_default():
        s = tf.compat.v1.placeholder(tf.string, [None])
        with pytest.raises(DPTransformError, match="delta"):
            dp_vocabulary(s, 1.0, 0.0)
        with pytest.raises(DPTransformError, match="num_oov_buckets"):
            dp_compute_and_apply_vocabulary(s, 1.0, 1e-6, num_oov_buckets=-1)
        with pytest.raises(DPTransformError, match="tf.string"):
            dp_vocabulary(tf.compat.v1.placeholder(tf.int64, [None]), 1.0, 1e-6)


@pytest.mark.tf
def test_vocabulary_index_is_an_exact_lookup_at_any_size():
    """The lookup behind dp_compute_and_apply_vocabulary: index in the released vocabulary or -1, exact for a
    100,000-value vocabulary (binary search on fingerprints, then the strings compared) and for an empty one."""
    import tensorflow as tf

    from sage_tfx.transform.lookup import _search_index as vocabulary_index

    rng = np.random.default_rng(5)
    vocab = [f"v{k}".encode() for k in rng.permutation(100_000)]
    rows = [f"v{k}".encode() for k in rng.integers(0, 150_000, size=20_000)] + [b"", b"v-1"]
    expected = {v: i for i, v in enumerate(vocab)}
    got = vocabulary_index(tf.constant(rows), tf.constant(vocab)).numpy()
    assert got.tolist() == [expected.get(r, -1) for r in rows]
    assert 0 < (got >= 0).mean() < 1
    empty = vocabulary_index(tf.constant(rows[:5]), tf.constant([], dtype=tf.string)).numpy()
    assert empty.tolist() == [-1] * 5


# ---------------------------------------------------------------- the Beam path: every count once, one draw
# A review run saw "b" (39,999 of 100,000 rows) take the out-of-vocabulary id, as if its count had been lost.
# These runs take the paths where a count could be lost or split, or the vocabulary drawn twice: bundles split
# while they run, the DirectRunner's parallel workers, many small batches, a re-run of the draw.

_A, _B = 12_000, 7_999  # the review's 60,000 / 39,999 / 1 scaled down 5x; the rows ordered by value


def _ordered_values():
    return np.array([b"a"] * _A + [b"b"] * _B + [b"rare"], dtype=object)


class _ElementCounter:
    """Counts elements in a running bundle, so a test split manager can split it mid-bundle (Beam's own
    fn_runner_test.ElementCounter, which needs hamcrest); pickles to the same object in this process."""

    _live = {}

    def __init__(self):

        self._cv = threading.Condition()
        self.count, self.stop_at, self.resume = 0, None, None

    def increment(self):
        with self._cv:
            self.count += 1
            self._cv.notify_all()
            resume = self.resume if self.count == self.stop_at else None
        if resume is not None:
            resume.wait(30)

    def pause_at(self, n):

        with self._cv:
            self.stop_at, self.resume = n, threading.Event()
        return self.resume

    def wait_for(self, n):
        with self._cv:
            assert self._cv.wait_for(lambda: self.count >= n, 30), f"the bundle never reached element {n}"

    def __reduce__(self):
        key = id(self)
        _ElementCounter._live[key] = self
        return _counter_by_key, (key,)


def _counter_by_key(key):
    return _ElementCounter._live[key]


def _tap(batch, counter):
    counter.increment()
    return batch


@pytest.mark.tf
def test_value_counts_are_exact_when_bundles_are_split_while_running():
    """The counting stage's bundle is split three times while it runs (Beam's runner-initiated splits, as a
    runner under load or a streaming one makes them): the residuals run as further bundles, and every value's
    count is combined exactly once; the one draw then keeps "a" and "b" in that order."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.testing.util import assert_that, equal_to
    from apache_beam.transforms import environments

    from sage_tfx.transform.vocabulary_analyzer import _CountValuesFn, _VocabularyOnce

    values = _ordered_values()
    batches = [[values[i : i + 97]] for i in range(0, len(values), 97)]
    counter, splits = _ElementCounter(), []

    def split_manager(num_elements):
        if num_elements != len(batches):
            return
        resume = counter.pause_at(5)
        yield
        counter.wait_for(5)
        for fraction in (0.5, 0.5, 0.3):
            splits.append((yield fraction))
        resume.set()

    runner = fn_runner.FnApiRunner(default_environment=environments.EmbeddedPythonGrpcEnvironment.default())
    with fn_runner.split_manager("Tap", split_manager), beam.Pipeline(runner=runner) as p:
        tapped = p | beam.Create(batches) | beam.Reshuffle() | "Tap" >> beam.Map(_tap, counter)
        counts = tapped | "Count" >> beam.CombineGlobally(_CountValuesFn())
        (vocabulary,) = tapped | "Vocabulary" >> _VocabularyOnce(1.0, 1e-6, None, 1, seed=5, stream="v")
        assert_that(counts | beam.Map(dict), equal_to([{b"a": _A, b"b": _B, b"rare": 1}]), label="Counts")
        assert_that(vocabulary | beam.Map(list), equal_to([[b"a", b"b"]]), label="Drawn")
    assert len([s for s in splits if s is not None and s.channel_splits]) == 3, splits


@pytest.mark.tf
@pytest.mark.parametrize("mode", ["multi_threading", pytest.param("multi_processing", marks=pytest.mark.slow)])
def test_ids_are_exact_on_the_multi_worker_direct_runner(mode, tmp_path):
    """The review's case (a DP vocabulary beside dp_scale_to_z_score in one preprocessing_fn) on the DirectRunner
    with 3 parallel workers and 200 batches: one id per value, "a" 0, "b" 1, "rare" out of vocabulary (2)."""
    import apache_beam as beam
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from sage_tfx.transform import dp_compute_and_apply_vocabulary, dp_scale_to_z_score, noise_seed

    def fn(inputs):
        return {
            "id": dp_compute_and_apply_vocabulary(inputs["s"], 1.0, 1e-6),
            "z": dp_scale_to_z_score(inputs["x"], 1.0, 10.0),
            "s": inputs["s"],
        }

    spec = {"s": tf.io.FixedLenFeature([], tf.string), "x": tf.io.FixedLenFeature([], tf.float32)}
    rows = [{"s": v, "x": float(i % 10)} for i, v in enumerate(_ordered_values())]
    options = PipelineOptions([f"--direct_running_mode={mode}", "--direct_num_workers=3"])
    with beam.Pipeline(options=options) as p, noise_seed(11):  # seeded as under DPTransform
        with tft_beam.Context(temp_dir=str(tmp_path), desired_batch_size=100):
            (data, _), _ = (
                p | beam.Create(rows),
                tft.DatasetMetadata.from_feature_spec(spec),
            ) | tft_beam.AnalyzeAndTransformDataset(fn)
            pairs = data | beam.Map(lambda r: (r["s"], int(r["id"]))) | beam.Distinct()
            assert_that(pairs, equal_to([(b"a", 0), (b"b", 1), (b"rare", 2)]))


def test_a_redrawn_vocabulary_is_the_same_draw():
    """A bundle that runs the draw again (a runner's retry) draws the same vocabulary: the draw is seeded (under
    DPTransform from the grant and the analyzer's scope) and reads the counts in sorted order, whatever order
    the combiner produced them in."""
    counts = {b"a": 60_000, b"b": 39_999, b"rare": 1, **{f"v{k}".encode(): 14 + k % 5 for k in range(200)}}
    shuffled = dict(sorted(counts.items(), key=lambda kv: hash(kv[0]) % 97))
    draws = {tuple(select_vocabulary(c, epsilon=1.0, delta=1e-6, seed=9, stream="s")) for c in (counts, shuffled)}
    assert len(draws) == 1 and next(iter(draws))[:2] == (b"a", b"b")
