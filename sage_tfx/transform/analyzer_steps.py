"""The DP tf.Transform analyzers' shared steps: their argument checks, each row's key and contribution in the
TensorFlow graph (nothing random, no sum), and the one full-pass release (``_NoiseOnce``) that draws the noise.
The mechanism and its proof: ``sage_tfx.transform.analyzers`` and docs/dp_preprocessing.md.
"""

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)  # isort: skip
import tensorflow as tf  # noqa: TID253
import tensorflow_transform as tft  # noqa: TID253

from sage_tfx.privacy import checks

from .beam_tables import _NoiseOnce
from .errors import DPTransformError
from .noise import check_epsilon, check_nkeys, check_seed, check_value_range
from .seeding import resolve_seed


def _dense_vector(tensor, what, label):
    if isinstance(tensor, (tf.SparseTensor, tf.RaggedTensor)):
        raise DPTransformError(
            f"{label}: {what} must be a dense tensor with one value per row, got {type(tensor).__name__} "
            "(densify it first, e.g. tft.sparse_tensor_to_dense_with_shape or tf.sparse.to_dense)"
        )
    tensor = tf.convert_to_tensor(tensor)
    rank = tensor.shape.rank
    if rank is not None and not (rank == 1 or (rank == 2 and tensor.shape[1] == 1)):
        raise DPTransformError(
            f"{label}: {what} must have one value per row (shape [batch] or [batch, 1]), got shape {tensor.shape}"
        )
    return tf.reshape(tensor, [-1])


OUT_OF_RANGE = -1  # the key of a row outside [0, nkeys): _GridSumsFn drops negative keys


def _key_vector(key, nkeys, label, what="key"):
    """int64 keys of the batch, a key outside [0, nkeys) replaced by OUT_OF_RANGE (the row counts nowhere)."""
    key = _dense_vector(key, what, label)
    if not key.dtype.is_integer:
        raise DPTransformError(f"{label}: {what} must be an integer tensor, got dtype {key.dtype.name}")
    key = tf.cast(key, tf.int64)
    bad = tf.logical_or(key < 0, key >= nkeys)
    return tf.where(bad, tf.constant(OUT_OF_RANGE, tf.int64), key)


def _masked(keys, mask, label):
    """Keys with every row whose mask is not set replaced by OUT_OF_RANGE (the row then counts nowhere).

    ``mask``: bool, or numeric where exactly 1 keeps the row (0, NaN or any other value drops it), one
    value per row. A fixed function of the row alone, so a masked row is as if absent from the tables.
    """
    if mask is None:
        return keys
    mask = _dense_vector(mask, "mask", label)
    if mask.dtype != tf.bool:
        if not (mask.dtype.is_integer or mask.dtype.is_floating):
            raise DPTransformError(
                f"{label}: mask must be a bool (or 0/1 numeric) tensor, got dtype "
                f"{mask.dtype.name} (e.g. mask=inputs['arr_delay'] > 0)"
            )
        mask = tf.equal(mask, tf.ones_like(mask))
    if mask.shape[0] is not None and keys.shape[0] is not None and mask.shape[0] != keys.shape[0]:
        raise DPTransformError(
            f"{label}: mask has {mask.shape[0]} rows but key has {keys.shape[0]}; give one mask value per row of key"
        )
    same = tf.debugging.assert_equal(
        tf.size(mask),
        tf.size(keys),
        message=f"{label}: mask and key differ in rows (a shape error of the preprocessing_fn, never of a value)",
    )
    with tf.control_dependencies([same]):
        return tf.where(mask, keys, tf.constant(OUT_OF_RANGE, tf.int64))


def _lookup(table, keys, default):
    """table[key] per row (keys from _key_vector), the public ``default`` where the key is OUT_OF_RANGE."""
    in_range = keys >= 0
    return tf.where(
        in_range, tf.gather(table, tf.where(in_range, keys, tf.zeros_like(keys))), tf.constant(default, tf.float32)
    )


def _check_finite(value, what):
    return checks.number(
        value, what, error=DPTransformError, message="{what} must be a finite number (a public constant), got {value!r}"
    )


def _check_fallback(label, min_count, fallback):
    """(min_count, fallback) as floats, both or neither; raise naming the bad or missing one."""
    if min_count is None and fallback is None:
        return None, None
    if min_count is None or fallback is None:
        raise DPTransformError(
            f"{label}: give both min_count and fallback, got min_count={min_count!r}, fallback={fallback!r} "
            "(e.g. min_count=20, fallback=value_range / 2 or a public prior)"
        )
    min_count = _check_finite(min_count, f"{label}: min_count")
    if min_count < 0:
        raise DPTransformError(f"{label}: min_count must be >= 0, got {min_count!r}")
    return min_count, _check_finite(fallback, f"{label}: fallback")


def _clipped_values(value, value_range, label):
    """float64 values clipped to [0, value_range]; NaN counts as 0 (so one row moves a sum by <= value_range)."""
    value = _dense_vector(value, "value", label)
    if not (value.dtype.is_floating or value.dtype.is_integer):
        raise DPTransformError(f"{label}: value must be a numeric tensor, got dtype {value.dtype.name}")
    value = tf.cast(value, tf.float64)
    value = tf.where(tf.math.is_nan(value), tf.zeros_like(value), value)
    return tf.clip_by_value(value, 0.0, value_range)


def _noisy_tables(scope, keys, values, scales, num_cells, finish, n_outputs, seed, sensitivities):
    """The full-pass analyzer: each row's key and its contribution to each table in, noisy finished tables out.

    `keys`: int64 [batch] in [0, num_cells) or OUT_OF_RANGE (the row counts nowhere); `values`: one float64
    [batch] per table. `scales` are the Laplace scales b = sensitivity / epsilon and `sensitivities` the L1
    sensitivities, one per table; one record touches at most one cell of each table (every caller's
    sensitivity argument). Beam sums the rows exactly on each table's grid (`_GridSumsFn`), then draws
    `noise.add_laplace`, the exact discrete Laplace on that grid: nothing is summed in float64 first.
    Outputs: float64 tables of shape [num_cells] (as returned by `finish`).

    The seed is fixed here, while the analyzer is traced: the test-only `seed`, or, inside
    `noise_seed`, one derived from the grant's seed and `scope` (see `seeding`). It goes to
    the Beam PTransform only, never into the TensorFlow graph.
    """
    return _release(scope, keys, values, num_cells, scales, finish, [[num_cells]] * n_outputs, seed, sensitivities)


def _release(scope, keys, values, num_cells, scales, finish, output_shapes, seed, sensitivities):
    """`_noisy_tables` with the outputs of `finish` shaped apart from the tables (`output_shapes`): float64."""
    seed = resolve_seed(seed, scope)
    return tft.experimental.ptransform_analyzer(
        inputs=[keys] + list(values),
        ptransform=_NoiseOnce(
            num_cells, scales, finish, len(output_shapes), seed, stream=scope, sensitivities=sensitivities
        ),
        output_dtypes=[tf.float64] * len(output_shapes),
        output_shapes=[list(shape) for shape in output_shapes],
        name="noise_once",
    )


def _selection_keys(key, label):
    """The keys of a selection analysis: a dense tf.string, or integer cast to int64, one per row."""
    key = _dense_vector(key, "key", label)
    if key.dtype.is_integer:
        return tf.cast(key, tf.int64)
    if key.dtype != tf.string:
        raise DPTransformError(f"{label}: key must be a tf.string or integer tensor, got dtype {key.dtype.name}")
    return key


def _float_tables(tables):
    return [tf.cast(t, tf.float32) for t in tables]


def _one_key(values):
    """Key 0 for every row: the one-cell tables of a whole-data-set total."""
    return tf.zeros_like(values, dtype=tf.int64)


def _check_common(label, epsilon, seed, nkeys=None, value_range=None):
    epsilon = check_epsilon(epsilon, f"{label}: epsilon")
    seed = check_seed(seed)
    nkeys = check_nkeys(nkeys, f"{label}: nkeys") if nkeys is not None else None
    value_range = check_value_range(value_range, f"{label}: value_range") if value_range is not None else None
    return epsilon, seed, nkeys, value_range
