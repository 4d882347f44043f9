"""Public vocabularies: `apply_public_vocabulary` (ids) and `one_hot` (indicator columns). No privacy cost.

A vocabulary known without the data is a public constant, so a lookup in it is a function of the row alone: no
analyzer, no spend. Both lookups are exact. The rule and the two lookup methods: docs/dp_preprocessing.md,
"Public vocabularies".
"""

from collections.abc import Sequence
from typing import Union

import numpy as np
import tensorflow as tf  # noqa: TID253

from .errors import DPTransformError
from .noise import check_int

VocabularyLike = Union[Sequence[str], Sequence[bytes], Sequence[int], np.ndarray, tf.Tensor]  # noqa: UP007

_HASH_BUCKETS = 2**62  # fingerprint range of the sorted search (tf.strings.to_hash_bucket_fast)


def _vocabulary_kind(dtype: tf.DType, label: str) -> str:
    if dtype == tf.string:
        return "string"
    if dtype.is_integer:
        return "int"
    raise DPTransformError(f"{label}: the vocabulary must hold strings or integers, got dtype {dtype.name}")


def _static_vocabulary(vocabulary: VocabularyLike, label: str) -> np.ndarray | None:
    """The vocabulary as a 1-D numpy array if it is known now, else None (a tensor known only at run time)."""
    if isinstance(vocabulary, (tf.SparseTensor, tf.RaggedTensor)):
        raise DPTransformError(
            f"{label}: vocabulary must be a list or a dense 1-D tensor, got {type(vocabulary).__name__}"
        )
    if isinstance(vocabulary, tf.Tensor):
        if vocabulary.shape.rank is not None and vocabulary.shape.rank != 1:
            raise DPTransformError(f"{label}: vocabulary must be 1-D, got shape {vocabulary.shape}")
        _vocabulary_kind(vocabulary.dtype, label)
        value = tf.get_static_value(vocabulary)
        return None if value is None else np.asarray(value)
    if isinstance(vocabulary, (str, bytes)):
        raise DPTransformError(f"{label}: vocabulary must be a list of values, got the single value {vocabulary!r}")
    values = list(vocabulary)
    if any(isinstance(v, bool) for v in values):
        raise DPTransformError(f"{label}: vocabulary values must be strings or integers, got a bool in {values[:10]!r}")
    if all(isinstance(v, (str, bytes)) for v in values):
        return np.array([v.encode() if isinstance(v, str) else v for v in values], dtype=object)
    if all(isinstance(v, (int, np.integer)) for v in values):
        return np.array(values, dtype=np.int64)
    kinds = sorted({type(v).__name__ for v in values})
    raise DPTransformError(
        f"{label}: vocabulary values must be all strings or all integers, got {kinds} in {values[:10]!r}"
    )


def _check_static(values: np.ndarray, label: str) -> np.ndarray:
    if values.ndim != 1:
        raise DPTransformError(f"{label}: vocabulary must be 1-D, got shape {values.shape}")
    if values.size == 0:
        raise DPTransformError(f"{label}: vocabulary must not be empty (every value would be out of vocabulary)")
    if values.dtype.kind in "OSU":
        values = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in values], dtype=object)
    elif values.dtype.kind in "iu":
        values = values.astype(np.int64)
    else:
        raise DPTransformError(f"{label}: the vocabulary must hold strings or integers, got dtype {values.dtype}")
    seen, duplicates = set(), []
    for v in values.tolist():
        if v in seen:
            duplicates.append(v)
        seen.add(v)
    if duplicates:
        raise DPTransformError(f"{label}: the vocabulary has duplicates {duplicates[:10]!r}; each value needs one id")
    return values


def _matching(x: tf.Tensor, vocab_kind: str, label: str) -> tf.Tensor:
    if x.dtype == tf.string and vocab_kind == "string":
        return x
    if x.dtype.is_integer and vocab_kind == "int":
        return tf.cast(x, tf.int64)
    fix = (
        "convert x with tf.strings.as_string(x)"
        if x.dtype.is_integer
        else "convert x with tf.strings.to_number(x, tf.int64), or give the vocabulary as strings"
    )
    raise DPTransformError(
        f"{label}: x of dtype {x.dtype.name} cannot be looked up in a vocabulary of {vocab_kind}s ({fix})"
    )


def _table_index(x: tf.Tensor, values: np.ndarray) -> tf.Tensor:
    """Index of each value of x in the static vocabulary, or -1: a StaticHashTable made once (init scope)."""
    with tf.init_scope():
        keys = tf.constant(values.tolist(), dtype=tf.string if values.dtype == object else tf.int64)
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, tf.range(len(values), dtype=tf.int64)), default_value=-1
        )
    return table.lookup(x)


def _search_index(x: tf.Tensor, vocab: tf.Tensor) -> tf.Tensor:
    """Index of each value of x in the run-time 1-D vocabulary tensor, or -1, without a table.

    Keys (the integers themselves, or 62-bit fingerprints of strings) sorted once; each row's key found
    by binary search, then the values compared, so a fingerprint collision can only make a value out of
    vocabulary, never give it another value's id. Duplicates resolve to the first occurrence (stable
    sort). An empty vocabulary finds nothing and nothing fails (inside a DP analysis nothing may fail
    after the charge). O((len(x) + V) log V) time, linear memory.
    """
    if vocab.dtype == tf.string:
        vocab_keys = tf.strings.to_hash_bucket_fast(vocab, _HASH_BUCKETS)
        row_keys = tf.strings.to_hash_bucket_fast(x, _HASH_BUCKETS)
        pad_key, pad_value = tf.constant([_HASH_BUCKETS], tf.int64), tf.constant([""])
    else:
        vocab = tf.cast(vocab, tf.int64)
        vocab_keys, row_keys = vocab, x
        pad_key, pad_value = tf.constant([np.iinfo(np.int64).max], tf.int64), tf.constant([0], tf.int64)
    size = tf.size(vocab, out_type=tf.int64)
    order = tf.argsort(vocab_keys, stable=True)
    sorted_keys = tf.concat([tf.gather(vocab_keys, order), pad_key], axis=0)
    padded_order = tf.concat([tf.cast(order, tf.int64), tf.zeros([1], tf.int64)], axis=0)
    padded_vocab = tf.concat([vocab, pad_value], axis=0)
    position = tf.searchsorted(sorted_keys, row_keys, side="left", out_type=tf.int64)
    candidate = tf.gather(padded_order, position)
    found = (
        tf.less(position, size)
        & tf.equal(tf.gather(sorted_keys, position), row_keys)
        & tf.equal(tf.gather(padded_vocab, candidate), x)
    )
    return tf.where(found, candidate, tf.constant(-1, tf.int64))


def apply_public_vocabulary(
    x: tf.Tensor | tf.SparseTensor | tf.RaggedTensor,
    vocabulary: VocabularyLike,
    *,
    num_oov_buckets: int = 1,
    default_value: int = -1,
    name: str | None = None,
) -> tf.Tensor | tf.SparseTensor | tf.RaggedTensor:
    """int64 id of each value of x in a PUBLIC vocabulary (``tft.apply_vocabulary`` for a known list).

    A value gets its index in the vocabulary; any other value gets ``len(vocabulary) +
    tf.strings.to_hash_bucket_fast(x, num_oov_buckets)`` (integers hashed as their decimal strings), or
    ``default_value`` if ``num_oov_buckets`` is 0, so the ids lie in ``[0, V + B)``. No privacy is spent: the
    vocabulary must be public (chosen without the data, or released by a DP analyzer such as ``dp_vocabulary``),
    and the id is then post-processing of the row. Lookup methods: docs/dp_preprocessing.md, "Public
    vocabularies".

    Args:
        x: a string or integer tensor: dense, ``tf.SparseTensor`` or ``tf.RaggedTensor``.
        vocabulary: the public values: a list of str, bytes or int, a numpy array, or a 1-D ``tf.string`` /
            integer tensor (its kind must match x's). A static one must be non-empty and free of duplicates; a
            run-time tensor may be empty, and its duplicates take the first index.
        num_oov_buckets: the number B >= 0 of hash buckets for values outside the vocabulary.
        default_value: the id of a value outside the vocabulary when B is 0.
        name: the name scope, or None.

    Returns:
        The int64 ids, with x's structure (dense, sparse or ragged).

    Raises:
        DPTransformError: a bad num_oov_buckets or default_value, a string x with an integer vocabulary (or the
            reverse), or an empty or duplicated static vocabulary; the message names the fix.
    """
    label = "apply_public_vocabulary"
    num_oov_buckets = check_int(num_oov_buckets, f"{label}: num_oov_buckets", least=0)
    if isinstance(default_value, bool) or not isinstance(default_value, (int, np.integer)):
        raise DPTransformError(f"{label}: default_value must be an integer, got {default_value!r}")
    static = _static_vocabulary(vocabulary, label)
    if static is not None:
        static = _check_static(static, label)
        kind = "string" if static.dtype == object else "int"
    else:
        kind = _vocabulary_kind(vocabulary.dtype, label)
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(
            x.indices,
            apply_public_vocabulary(
                x.values, vocabulary, num_oov_buckets=num_oov_buckets, default_value=default_value, name=name
            ),
            x.dense_shape,
        )
    if isinstance(x, tf.RaggedTensor):
        return x.with_flat_values(
            apply_public_vocabulary(
                x.flat_values, vocabulary, num_oov_buckets=num_oov_buckets, default_value=default_value, name=name
            )
        )
    with tf.name_scope(name or label):
        x = _matching(tf.convert_to_tensor(x), kind, label)
        if static is not None:
            index, size = _table_index(x, static), tf.constant(len(static), tf.int64)
        else:
            index, size = _search_index(x, vocabulary), tf.size(vocabulary, out_type=tf.int64)
        if num_oov_buckets == 0:
            oov = tf.fill(tf.shape(x), tf.constant(int(default_value), tf.int64))
        else:
            text = x if x.dtype == tf.string else tf.strings.as_string(x)
            oov = size + tf.strings.to_hash_bucket_fast(text, num_oov_buckets)
        return tf.where(index >= 0, index, oov)


def one_hot(ids: tf.Tensor, depth: int) -> tf.Tensor:
    """float32 [batch, depth] indicator rows of integer ``ids``: ``tf.one_hot``. No privacy cost.

    Row i has 1.0 at column ids[i] and 0.0 elsewhere; an id outside ``[0, depth)`` (e.g. the -1
    ``default_value`` of `apply_public_vocabulary` with no OOV bucket) gives a row of zeros.

    Args:
        ids: a dense integer tensor of shape [batch] or [batch, 1].
        depth: a public Python integer >= 1; ``len(vocab) + B`` for ids from ``apply_public_vocabulary(x, vocab,
            num_oov_buckets=B)``.

    Returns:
        A float32 tensor of shape [batch, depth].

    Raises:
        DPTransformError: depth not an integer >= 1, or ids sparse, ragged, not integer or not one per row.
    """
    label = "one_hot"
    depth = check_int(depth, f"{label}: depth", fix="e.g. len(vocabulary) + num_oov_buckets")
    if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        raise DPTransformError(
            f"{label}: ids must be a dense tensor with one id per row, got {type(ids).__name__} "
            "(densify it first, e.g. tf.sparse.to_dense with a default id)"
        )
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        raise DPTransformError(f"{label}: ids must be an integer tensor, got dtype {ids.dtype.name}")
    rank = ids.shape.rank
    if rank is not None and not (rank == 1 or (rank == 2 and ids.shape[1] == 1)):
        raise DPTransformError(
            f"{label}: ids must have one id per row (shape [batch] or [batch, 1]), got shape {ids.shape}"
        )
    return tf.one_hot(tf.reshape(ids, [-1]), depth, dtype=tf.float32)
