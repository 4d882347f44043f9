"""`dp_vocabulary` / `dp_compute_and_apply_vocabulary`: the tf.Transform side of `vocabulary.select_vocabulary`.

The TensorFlow graph only passes each batch's values to a full-pass analyzer; the Beam
PTransform `_VocabularyOnce` (a `_NoiseOnce`, so DPTransform's analyzer check accepts it)
counts every value over the whole data set and runs `select_vocabulary` ONCE. The
released vocabulary (a 1-D string tensor) is baked into the transform graph.

Budget: each records its (epsilon, delta) with `budget.record_spend`, so a
`PreprocessingBudget` refuses one that would exceed the preprocessing grant in epsilon or
in delta while the function is traced, and DPTransform charges both to the grant's
preprocessing stage (``BudgetSplit.preprocessing_delta``: a grant whose split gives
preprocessing no delta refuses a DP vocabulary before any record is read).
"""
import collections

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)  # isort: skip
import apache_beam as beam  # noqa: TID253
import numpy as np
import tensorflow as tf  # noqa: TID253
import tensorflow_transform as tft  # noqa: TID253

from .analyzers import _dense_vector, _NoiseOnce
from .budget import record_spend, requested_delta  # noqa: F401  (requested_delta: the graph's total delta)
from .errors import DPTransformError
from .lookup import _search_index
from .noise import check_epsilon, check_int, check_seed
from .seeding import resolve_seed
from .vocabulary import check_delta, select_vocabulary


class _CountValuesFn(beam.CombineFn):
    def create_accumulator(self):
        return collections.Counter()

    def add_input(self, acc, batch):
        (values,) = batch
        acc.update(bytes(v) if not isinstance(v, bytes) else v for v in np.asarray(values).reshape(-1))
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        merged = next(accs)
        for other in accs:
            merged.update(other)
        return merged

    def extract_output(self, acc):
        return acc


class _VocabularyOnce(_NoiseOnce):
    """Exact value counts of the whole data set, then ONE `select_vocabulary` draw: one 1-D bytes array."""

    def __init__(self, epsilon, delta, top_k, max_contributions, seed, stream):
        super().__init__(0, [], None, 1, seed, stream, sensitivities=[])
        self._args = dict(epsilon=epsilon, delta=delta, top_k=top_k, max_contributions=max_contributions)

    def expand(self, pcoll):
        args, seed, stream = self._args, self._seed, self._stream

        def select(counts):
            vocab = select_vocabulary(dict(counts), seed=seed, stream=stream, **args)
            return np.array(vocab, dtype=object) if vocab else np.array([], dtype=object)

        return (pcoll | "CountAllValues" >> beam.CombineGlobally(_CountValuesFn())
                | "SelectOnce" >> beam.Map(select),)


def dp_vocabulary(x: tf.Tensor, epsilon: float, delta: float, *, top_k: int | None = None,
                  max_contributions: int = 1, seed: int | None = None, name: str | None = None) -> tf.Tensor:
    """The DP vocabulary of string feature x: a 1-D tf.string tensor, kept values by noisy count (descending).

    Mechanism, sensitivity and the (epsilon, delta)-DP proof: `sage_tfx.transform.vocabulary`
    (Laplace partition selection, scale max_contributions/epsilon, threshold
    tau = m + (m/epsilon) ln(m/(2 delta))). One row holds one value, so max_contributions=1
    is exact; a larger value only adds noise. Records (epsilon, delta) with `record_spend`: under
    DPTransform the grant's split must give preprocessing a delta (``preprocessing_delta``).
    """
    label = "dp_vocabulary"
    epsilon = check_epsilon(epsilon, f"{label}: epsilon")
    delta = check_delta(delta, f"{label}: delta")
    top_k = check_int(top_k, f"{label}: top_k", allow_none=True)
    m = check_int(max_contributions, f"{label}: max_contributions")
    seed = check_seed(seed)
    x = _dense_vector(x, "x", label)
    if x.dtype != tf.string:
        raise DPTransformError(f"{label}: x must be a tf.string tensor, got dtype {x.dtype.name} (tf.strings.as_string it)")
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon, delta)
        seed = resolve_seed(seed, scope)
        (vocab,) = tft.experimental.ptransform_analyzer(
            inputs=[x], ptransform=_VocabularyOnce(epsilon, delta, top_k, m, seed, stream=scope),
            output_dtypes=[tf.string], output_shapes=[[None]], name="vocabulary_once")
        return vocab


def dp_compute_and_apply_vocabulary(x: tf.Tensor, epsilon: float, delta: float, *, top_k: int | None = None,
                                    num_oov_buckets: int = 1, default_value: int = -1, seed: int | None = None,
                                    name: str | None = None) -> tf.Tensor:
    """int64 id of each row's value in `dp_vocabulary(x, ...)`; OOV: len(vocab) + hash bucket, or default_value.

    Same (epsilon, delta)-DP guarantee as dp_vocabulary; the lookup is post-processing of the
    released vocabulary and the row's own value. OOV buckets use tf.strings.to_hash_bucket_fast.
    """
    if isinstance(num_oov_buckets, bool) or not isinstance(num_oov_buckets, (int, np.integer)) or num_oov_buckets < 0:
        raise DPTransformError(
            f"dp_compute_and_apply_vocabulary: num_oov_buckets must be an integer >= 0, got {num_oov_buckets!r}")
    with tf.compat.v1.name_scope(name, "dp_compute_and_apply_vocabulary"):
        vocab = dp_vocabulary(x, epsilon, delta, top_k=top_k, seed=seed)
        x = _dense_vector(x, "x", "dp_compute_and_apply_vocabulary")
        size = tf.size(vocab, out_type=tf.int64)
        # binary search on the vocabulary's sorted fingerprints, then an exact compare (lookup._search_index:
        # linear memory at any size; a table initialised from an analyzer output cannot be saved in tft's TF2 graphs)
        index = _search_index(x, vocab)
        found = tf.greater_equal(index, 0)
        if num_oov_buckets == 0:
            oov = tf.fill(tf.shape(x), tf.constant(default_value, tf.int64))
        else:
            oov = size + tf.strings.to_hash_bucket_fast(x, num_oov_buckets)
        return tf.where(found, index, oov)
