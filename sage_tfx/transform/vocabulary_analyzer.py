"""`dp_vocabulary` / `dp_compute_and_apply_vocabulary`: the tf.Transform side of `vocabulary.select_vocabulary`.

The graph passes each batch's values to a full-pass Beam analyzer that counts them over the whole data set and
runs `select_vocabulary` ONCE; each records its (epsilon, delta) against the preprocessing grant. Mechanism and
proof: docs/dp_preprocessing.md, "Vocabularies: DP partition selection".
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

        return (pcoll | "CountAllValues" >> beam.CombineGlobally(_CountValuesFn()) | "SelectOnce" >> beam.Map(select),)


def dp_vocabulary(
    x: tf.Tensor,
    epsilon: float,
    delta: float,
    *,
    top_k: int | None = None,
    max_contributions: int = 1,
    seed: int | None = None,
    name: str | None = None,
) -> tf.Tensor:
    """The DP vocabulary of string feature x: the values kept by Laplace partition selection.

    (epsilon, delta)-DP (Laplace noise of scale max_contributions/epsilon, threshold tau = m + (m/epsilon)
    ln(m/(2 delta))); proof: docs/dp_preprocessing.md, "Vocabularies: DP partition selection". Under DPTransform
    the grant's split must give preprocessing a delta (``preprocessing_delta``).

    Args:
        x: a dense tf.string tensor, one value per row.
        epsilon: the epsilon this analyzer spends, > 0.
        delta: the delta this analyzer spends, in (0, 1).
        top_k: keep at most this many values (the largest noisy counts), or None for all kept.
        max_contributions: the most values one row adds; 1 is exact for a row of one value.
        seed: for tests only; None draws fresh OS entropy (refused under DPTransform).
        name: the name scope, or None.

    Returns:
        A 1-D tf.string tensor of the kept values, by noisy count (descending).

    Raises:
        DPTransformError: a bad argument, or x not a tf.string tensor (the message names the fix).
        BudgetExceeded: (epsilon, delta) would take the preprocessing_fn past its `PreprocessingBudget`.
    """
    label = "dp_vocabulary"
    epsilon = check_epsilon(epsilon, f"{label}: epsilon")
    delta = check_delta(delta, f"{label}: delta")
    top_k = check_int(top_k, f"{label}: top_k", allow_none=True)
    m = check_int(max_contributions, f"{label}: max_contributions")
    seed = check_seed(seed)
    x = _dense_vector(x, "x", label)
    if x.dtype != tf.string:
        raise DPTransformError(
            f"{label}: x must be a tf.string tensor, got dtype {x.dtype.name} (tf.strings.as_string it)"
        )
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon, delta)
        seed = resolve_seed(seed, scope)
        (vocab,) = tft.experimental.ptransform_analyzer(
            inputs=[x],
            ptransform=_VocabularyOnce(epsilon, delta, top_k, m, seed, stream=scope),
            output_dtypes=[tf.string],
            output_shapes=[[None]],
            name="vocabulary_once",
        )
        return vocab


def dp_compute_and_apply_vocabulary(
    x: tf.Tensor,
    epsilon: float,
    delta: float,
    *,
    top_k: int | None = None,
    num_oov_buckets: int = 1,
    default_value: int = -1,
    seed: int | None = None,
    name: str | None = None,
) -> tf.Tensor:
    """int64 id of each row's value in `dp_vocabulary(x, ...)`.

    Same (epsilon, delta)-DP guarantee as `dp_vocabulary`; the lookup is post-processing of the released
    vocabulary and the row's own value. A value outside it gets ``len(vocab) + tf.strings.to_hash_bucket_fast(x,
    num_oov_buckets)``, or default_value when num_oov_buckets is 0.

    Args:
        x: a dense tf.string tensor, one value per row.
        epsilon: the epsilon this analyzer spends, > 0.
        delta: the delta this analyzer spends, in (0, 1).
        top_k: keep at most this many values, or None for all kept.
        num_oov_buckets: the number of hash buckets for values outside the vocabulary, >= 0.
        default_value: the id of a value outside the vocabulary when num_oov_buckets is 0.
        seed: for tests only; None draws fresh OS entropy (refused under DPTransform).
        name: the name scope, or None.

    Returns:
        int64 ids, one per row.

    Raises:
        DPTransformError: a bad argument, or x not a tf.string tensor.
        BudgetExceeded: (epsilon, delta) would take the preprocessing_fn past its `PreprocessingBudget`.
    """
    if isinstance(num_oov_buckets, bool) or not isinstance(num_oov_buckets, (int, np.integer)) or num_oov_buckets < 0:
        raise DPTransformError(
            f"dp_compute_and_apply_vocabulary: num_oov_buckets must be an integer >= 0, got {num_oov_buckets!r}"
        )
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
