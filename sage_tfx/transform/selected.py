"""The per-key analyzers with private partition selection (``partition_selection=delta``): keys not known in advance.

The graph side of `partitions.select_tables`: each row's key (a tf.string or integer) and clipped contribution go
into ONE Beam full pass (`beam_tables._SelectOnce`) that sums them exactly per key and draws the noise and the
selection once. Every analyzer records (epsilon, delta) before it reads data. Mechanism and proof:
docs/dp_preprocessing.md ("Keys not known in advance: private partition selection").
"""

import collections

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)  # isort: skip
import numpy as np
import tensorflow as tf  # noqa: TID253
import tensorflow_transform as tft  # noqa: TID253

from .analyzer_steps import _check_common, _check_finite, _clipped_values, _float_tables, _selection_keys
from .beam_tables import _SelectOnce
from .budget import record_spend
from .errors import DPTransformError
from .lookup import _search_index
from .noise import CENTRED_MEAN, check_mean_form
from .partitions import COUNT, MEAN, check_selection, output_count, selection_release
from .seeding import resolve_seed


def _lookup_selected(keys, table, key, default, label):
    """float32 [batch]: ``table`` at each row's key among the kept ``keys``, the PUBLIC ``default`` elsewhere."""
    default = _check_finite(default, f"{label}: default")
    index = _search_index(_selection_keys(key, label), keys)
    found = index >= 0
    return tf.where(
        found, tf.gather(table, tf.where(found, index, tf.zeros_like(index))), tf.constant(default, tf.float32)
    )


class SelectedKeyMean(collections.namedtuple("SelectedKeyMean", ["keys", "counts", "sums", "means"])):
    """The per-key mean's tables over the keys kept by private partition selection (``partition_selection=``):
    ``keys`` (1-D, the key's dtype: tf.string or tf.int64, sorted) and float32 tables aligned with it.
    `lookup` maps rows to their key's mean, the PUBLIC ``default`` for a key that was not kept."""

    __slots__ = ()

    def lookup(self, key, *, default: float) -> tf.Tensor:
        return _lookup_selected(self.keys, self.means, key, default, "SelectedKeyMean.lookup")


class SelectedKeyTable(collections.namedtuple("SelectedKeyTable", ["keys", "values"])):
    """A per-key count or sum over the keys kept by private partition selection: ``keys`` (1-D, tf.string or
    tf.int64, sorted) and ``values`` (float32, aligned with it). `lookup` maps rows to their key's value, the
    PUBLIC ``default`` for a key that was not kept."""

    __slots__ = ()

    def lookup(self, key, *, default: float) -> tf.Tensor:
        return _lookup_selected(self.keys, self.values, key, default, "SelectedKeyTable.lookup")


def check_selection_options(label, nkeys, mask=None, min_count=None):
    """With partition_selection the keys come from the data: refuse nkeys, mask and min_count (before any charge)."""
    given = {"nkeys": nkeys, "mask": mask, "min_count": min_count}
    bad = [k for k, v in given.items() if v is not None]
    if bad:
        raise DPTransformError(
            f"{label}: with partition_selection the keys come from the data; give {bad[0]}=None (got "
            f"{'a tensor' if bad[0] == 'mask' else repr(given[bad[0]])}): a mask filters rows before the analyzer, "
            "min_count is the selection's threshold, and public keys in [0, nkeys) need no selection"
        )


def selected_tables(label, kind, key, value, epsilon, value_range, seed, name, delta, max_partitions, mean_form):
    """The analyzer ``label`` with private partition selection of ``kind`` (`partitions.MEAN`, COUNT or SUM):
    arguments checked, (epsilon, delta) recorded, then one pass. ``value``/``value_range`` are None for a count.

    Returns:
      A `SelectedKeyMean` for MEAN, else a `SelectedKeyTable`.
    """
    epsilon, seed, _, value_range = _check_common(label, epsilon, seed, value_range=value_range)
    delta, m = check_selection(delta, max_partitions, label)
    form = check_mean_form(mean_form, f"{label}: mean_form") if kind == MEAN else CENTRED_MEAN
    release = selection_release(kind, epsilon, 1.0 if value_range is None else value_range, form)
    keys = _selection_keys(key, label)
    selection = dict(
        kind=kind,
        epsilon=epsilon,
        delta=delta,
        value_range=1.0 if value_range is None else value_range,
        mean_form=form,
        max_partitions_contributed=m,
    )
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon, delta)
        if kind == COUNT:
            values = tf.zeros_like(keys, dtype=tf.float64)
        else:
            values = _clipped_values(value, value_range, label) - release.shift
        n_tables = output_count(kind) - 1
        kept, *tables = tft.experimental.ptransform_analyzer(
            inputs=[keys, values],
            ptransform=_SelectOnce(
                object if keys.dtype == tf.string else np.int64, selection, resolve_seed(seed, scope), scope
            ),
            output_dtypes=[keys.dtype] + [tf.float64] * n_tables,
            output_shapes=[[None]] * (n_tables + 1),
            name="select_once",
        )
        tables = _float_tables(tables)
        return SelectedKeyMean(kept, *tables) if kind == MEAN else SelectedKeyTable(kept, *tables)
