"""Differentially private tf.Transform analyzers: dp_group_by_mean (Sage, List. 1) and its family.

Each analyzer puts every row's clipped contribution on its table's public grid, sums the integers exactly in ONE
Beam full pass and draws the noise ONCE per analysis; tf.Transform bakes the noisy tables into the transform
graph as constants. Contract: under add/remove one row, values clipped to [0, value_range] (NaN as 0, a key
outside [0, nkeys) in no table) bound each table's sensitivity, and an analyzer's "Laplace(0, b)" below is the
grid release, (sensitivity / b)-DP exactly with a noise scale within a relative 2^-20 of b. Every analyzer
returns float32 tensors and records its epsilon (`sage_tfx.transform.budget.record_spend`); seeds: fresh OS
entropy, or ``sage_tfx.transform.noise_seed`` from trusted code (an analyzer's own ``seed=`` is for tests).

The functions, their sensitivities and proofs: docs/dp_preprocessing.md ("The functions", "Noise once per
analysis").
"""

import collections
import functools

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)  # isort: skip
import tensorflow as tf  # noqa: TID253

from .analyzer_steps import (  # noqa: F401 (OUT_OF_RANGE, _release: scaling and tests name them here)
    OUT_OF_RANGE,
    _check_common,
    _check_fallback,
    _check_finite,
    _clipped_values,
    _dense_vector,
    _float_tables,
    _key_vector,
    _lookup,
    _masked,
    _noisy_tables,
    _one_key,
    _release,
    _selection_keys,
)
from .beam_tables import (  # noqa: F401 (_GridSumsFn, _NoiseOnce: the executor and tests name them here)
    _as_is,
    _GridSumsFn,
    _KeyedGridSumsFn,
    _mean_tables,
    _noise_and_finish,
    _NoiseOnce,
    _SelectOnce,
    _variance_table,
)
from .budget import record_spend
from .errors import DPTransformError
from .moments import sum_release, variance_release
from .noise import (
    CENTRED_MEAN,
    check_mean_form,
    mean_release,
)
from .partitions import COUNT, DEFAULT_MAX_PARTITIONS, MEAN, SUM
from .selected import SelectedKeyMean, SelectedKeyTable, check_selection_options, selected_tables


class PerKeyMean(collections.namedtuple("PerKeyMean", ["counts", "sums", "means"])):
    """Noisy per-key tables of dp_mean_per_key, each a float32 tensor of shape [nkeys].

    `lookup` maps rows to their key's mean.

    Args:
      counts: The noisy row count of each key.
      sums: The noisy sum of each key's clipped values.
      means: The mean of each key, the public fallback where the noisy count is below ``min_count`` (when
        dp_mean_per_key was given one).
    """

    __slots__ = ()

    def lookup(self, key, *, default: float) -> tf.Tensor:
        """float32 [batch]: ``means[key]`` for each row, the PUBLIC ``default`` for a key outside [0, nkeys).

        Post-processing of the released table with the row's own key: no privacy cost. Out-of-range
        keys get ``default`` instead of failing (nothing may fail after the charge).

        Args:
          key: An integer tensor of keys, one per row, over the tables' key space [0, nkeys).
          default: The PUBLIC mean of a key outside [0, nkeys) (finite; never computed from the data).

        Returns:
          A float32 tensor [batch] of each row's mean.

        Raises:
          DPTransformError: a non-finite ``default``, a key that is not an integer tensor, or tables without
            a static size.
        """
        default = _check_finite(default, "PerKeyMean.lookup: default")
        nkeys = self.means.shape[0]
        if nkeys is None:
            raise DPTransformError("PerKeyMean.lookup: the tables have no static size; use tf.gather on .means")
        return _lookup(self.means, _key_vector(key, nkeys, "PerKeyMean.lookup"), default)


# ---------------------------------------------------------------- the analyzers


def dp_count_per_key(
    key,
    nkeys,
    epsilon,
    *,
    partition_selection=None,
    max_partitions_contributed=DEFAULT_MAX_PARTITIONS,
    seed=None,
    name=None,
) -> tf.Tensor | SelectedKeyTable:
    """Noisy number of rows of each key in [0, nkeys), over the whole data set: float32 [nkeys].

    Mechanism: count_k + Laplace(0, 1/epsilon), independently for each k.
    Sensitivity: adding or removing one row changes exactly one count by 1, so the
    L1 sensitivity of the whole count vector is 1.
    Guarantee: (epsilon, 0)-DP. Proof sketch: the Laplace mechanism with scale
    sensitivity/epsilon = 1/epsilon on an L1-sensitivity-1 vector is epsilon-DP
    (Dwork et al. 2006); everything after it is post-processing. With ``partition_selection``, the same count
    over the keys present, kept where it passes the Laplace threshold: (epsilon, delta)-DP
    (docs/dp_preprocessing.md, "Keys not known in advance").

    Args:
      key: An integer tensor, each row's key; a row whose key is outside [0, nkeys) counts nowhere. With
        ``partition_selection``: a tf.string or integer tensor of keys not known in advance.
      nkeys: The number of keys (a public integer >= 1); None with ``partition_selection``.
      epsilon: What the analyzer spends (finite, > 0).
      partition_selection: delta in (0, 1): release only the keys whose noisy count passes the threshold at
        delta, as a `SelectedKeyTable`; spends (epsilon, delta).
      max_partitions_contributed: The keys one row adds to (1, exact here; more only adds noise).
      seed: For tests only (None draws fresh OS entropy).
      name: The name scope of the analyzer (and of its recorded spend).

    Returns:
      A float32 tensor [nkeys] of noisy counts, or with ``partition_selection`` a `SelectedKeyTable`.

    Raises:
      DPTransformError: a bad argument (a ValueError naming it), checked while the function is traced.
      BudgetExceeded: the spend is more than the active ``PreprocessingBudget`` allows.
    """
    label = "dp_count_per_key"
    if partition_selection is not None:
        check_selection_options(label, nkeys)
        args = (None, epsilon, None, seed, name, partition_selection, max_partitions_contributed, CENTRED_MEAN)
        return selected_tables(label, COUNT, key, *args)
    epsilon, seed, nkeys, _ = _check_common(label, epsilon, seed, nkeys=nkeys)
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon)
        keys = _key_vector(key, nkeys, label)
        (noisy,) = _float_tables(
            _noisy_tables(
                scope, keys, [tf.ones_like(keys, dtype=tf.float64)], [1.0 / epsilon], nkeys, _as_is, 1, seed, [1.0]
            )
        )
        return noisy


def dp_sum_per_key(
    key,
    value,
    nkeys,
    epsilon,
    value_range,
    *,
    partition_selection=None,
    max_partitions_contributed=DEFAULT_MAX_PARTITIONS,
    seed=None,
    name=None,
) -> tf.Tensor | SelectedKeyTable:
    """Noisy sum of clip(value, 0, value_range) over the rows of each key: float32 [nkeys].

    Mechanism: sum_k + Laplace(0, value_range/epsilon), independently for each k (`moments.sum_release`).
    Sensitivity: one row adds or removes one clipped value in [0, value_range] from
    exactly one sum, so the L1 sensitivity of the sum vector is value_range.
    Guarantee: (epsilon, 0)-DP (Laplace mechanism, scale = sensitivity/epsilon).
    The expected error chooses the raw sum: a centred sum needs a noisy count too, twice this noise
    variance at its best split (docs/dp_preprocessing.md, "Sums and variances"). With ``partition_selection``:
    a count at epsilon/2 selects the keys, the sum at epsilon/2 is released for them: (epsilon, delta)-DP.

    Args:
      key: An integer tensor, each row's key; a row whose key is outside [0, nkeys) counts nowhere. With
        ``partition_selection``: a tf.string or integer tensor of keys not known in advance.
      value: A numeric tensor, each row's value (NaN counts as 0).
      nkeys: The number of keys (a public integer >= 1); None with ``partition_selection``.
      epsilon: What the analyzer spends (finite, > 0).
      value_range: R: values are clipped to [0, R] (finite, > 0).
      partition_selection: delta in (0, 1): release only the keys whose noisy count passes the threshold at
        delta, as a `SelectedKeyTable`; spends (epsilon, delta).
      max_partitions_contributed: The keys one row adds to (1, exact here; more only adds noise).
      seed: For tests only (None draws fresh OS entropy).
      name: The name scope of the analyzer (and of its recorded spend).

    Returns:
      A float32 tensor [nkeys] of noisy sums, or with ``partition_selection`` a `SelectedKeyTable`.

    Raises:
      DPTransformError: a bad argument (a ValueError naming it), checked while the function is traced.
      BudgetExceeded: the spend is more than the active ``PreprocessingBudget`` allows.
    """
    label = "dp_sum_per_key"
    if partition_selection is not None:
        check_selection_options(label, nkeys)
        args = (epsilon, value_range, seed, name, partition_selection, max_partitions_contributed, CENTRED_MEAN)
        return selected_tables(label, SUM, key, value, *args)
    epsilon, seed, nkeys, value_range = _check_common(label, epsilon, seed, nkeys=nkeys, value_range=value_range)
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon)
        keys = _key_vector(key, nkeys, label)
        release = sum_release(epsilon, value_range)
        values = [_clipped_values(value, value_range, label)]
        (noisy,) = _float_tables(
            _noisy_tables(
                scope, keys, values, list(release.scales), nkeys, _as_is, 1, seed, list(release.sensitivities)
            )
        )
        return noisy


def _mean_per_key(
    label,
    key,
    value,
    nkeys,
    epsilon,
    value_range,
    seed,
    name,
    mask=None,
    min_count=None,
    fallback=None,
    mean_form=CENTRED_MEAN,
):
    epsilon, seed, nkeys, value_range = _check_common(label, epsilon, seed, nkeys=nkeys, value_range=value_range)
    min_count, fallback = _check_fallback(label, min_count, fallback)
    release = mean_release(epsilon, value_range, check_mean_form(mean_form, f"{label}: mean_form"))
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon)
        keys = _masked(_key_vector(key, nkeys, label), mask, label)
        values = _clipped_values(value, value_range, label) - release.shift  # in [-shift, R - shift]
        finish = functools.partial(
            _mean_tables, value_range=value_range, shift=release.shift, min_count=min_count, fallback=fallback
        )
        counts, sums, means = _float_tables(
            _noisy_tables(
                scope,
                keys,
                [tf.ones_like(values), values],
                list(release.scales),
                nkeys,
                finish,
                3,
                seed,
                list(release.sensitivities),
            )
        )
        return PerKeyMean(counts, sums, means), fallback


def dp_mean_per_key(
    key,
    value,
    nkeys,
    epsilon,
    value_range,
    *,
    mask=None,
    min_count=None,
    fallback=None,
    mean_form=CENTRED_MEAN,
    partition_selection=None,
    max_partitions_contributed=DEFAULT_MAX_PARTITIONS,
    seed=None,
    name=None,
) -> PerKeyMean | SelectedKeyMean:
    """Noisy per-key counts, sums and means of clip(value, 0, value_range): a `PerKeyMean` of float32 [nkeys].

    The tables behind `dp_group_by_mean`: the same mechanism, sensitivities (1 for a count, R/2 for a centred
    sum, R for the ``"sage"`` form's) and (epsilon, 0)-DP guarantee; with ``partition_selection``,
    (epsilon, delta)-DP. The proofs: docs/dp_preprocessing.md, "The mean's two forms" and "Keys not known in
    advance"; the options: its "Masks, fallbacks and lookup keys". None of the options changes the guarantee.
    Map rows to their key's mean with ``tables.lookup(any_key, default=...)``.

    Args:
      key: Each row's key: an integer tensor over [0, nkeys), or with ``partition_selection`` a tf.string or
        integer tensor of keys not known in advance.
      value: A numeric tensor, each row's value (NaN counts as 0).
      nkeys: The number of keys (a public integer >= 1); None with ``partition_selection``.
      epsilon: What the analyzer spends (finite, > 0).
      value_range: R: values are clipped to [0, R] (finite, > 0).
      mask: A bool (or numeric: exactly 1 keeps the row) tensor, one value per row: a row not kept counts in
        no table, as if absent.
      min_count: With ``fallback``: a key whose NOISY count is below it gets ``fallback`` as its mean.
      fallback: The PUBLIC mean of such keys (never computed from the data).
      mean_form: ``"centred"`` (default, about half the error) or ``"sage"`` (the paper's List. 1; the tables
        `DPAbsoluteErrorValidator.validate_released` bounds).
      partition_selection: delta in (0, 1): release only the keys whose noisy count passes the Laplace
        threshold at delta, as a `SelectedKeyMean`; spends (epsilon, delta).
      max_partitions_contributed: The keys one row adds to (1, exact here; more only adds noise).
      seed: For tests only (None draws fresh OS entropy).
      name: The name scope of the analyzer (and of its recorded spend).

    Returns:
      A `PerKeyMean` (``sums`` the noisy sum of the clipped values, ``means`` holding the fallback), or with
      ``partition_selection`` a `SelectedKeyMean` over the kept keys.

    Raises:
      DPTransformError: a bad argument (a ValueError naming it), checked while the function is traced.
      BudgetExceeded: the spend is more than the active ``PreprocessingBudget`` allows.
    """
    if partition_selection is not None:
        check_selection_options("dp_mean_per_key", nkeys, mask, min_count)
        return selected_tables(
            "dp_mean_per_key",
            MEAN,
            key,
            value,
            epsilon,
            value_range,
            seed,
            name,
            partition_selection,
            max_partitions_contributed,
            mean_form,
        )
    tables, _ = _mean_per_key(
        "dp_mean_per_key", key, value, nkeys, epsilon, value_range, seed, name, mask, min_count, fallback, mean_form
    )
    return tables


def dp_group_by_mean(
    key_tensor,
    value_tensor,
    nkeys,
    epsilon,
    value_range,
    *,
    mask=None,
    min_count=None,
    fallback=None,
    lookup_key=None,
    mean_form=CENTRED_MEAN,
    partition_selection=None,
    max_partitions_contributed=DEFAULT_MAX_PARTITIONS,
    seed=None,
    name=None,
) -> tf.Tensor:
    """Sage's DP feature (paper List. 1): each row gets the noisy mean value of its key. float32 [batch].

    ``gather(means, key)`` over `dp_mean_per_key`'s tables, drawn once per analysis: every row of a key, every
    transform batch and serving see the same value. One row moves one count by 1 and one sum by at most R/2
    (R for ``mean_form="sage"``); the pair is (epsilon, 0)-DP, (epsilon, delta)-DP with
    ``partition_selection``. Mechanism and proof: docs/dp_preprocessing.md, "The mean's two forms" and "Keys
    not known in advance"; the options: its "Masks, fallbacks and lookup keys".

    Args:
      key_tensor: Each row's key: an integer tensor over [0, nkeys), or with ``partition_selection`` a
        tf.string or integer tensor of keys not known in advance.
      value_tensor: A numeric tensor, each row's value (NaN counts as 0).
      nkeys: The number of keys (a public integer >= 1); None with ``partition_selection``.
      epsilon: What the analyzer spends (finite, > 0).
      value_range: R: values are clipped to [0, R] (finite, > 0).
      mask: A bool (or numeric: exactly 1 keeps the row) tensor, one value per row: a row not kept counts in
        no table but still gets its key's mean.
      min_count: With ``fallback``: a key whose NOISY count is below it gets ``fallback`` as its mean.
      fallback: The PUBLIC mean of such keys, and of a key outside [0, nkeys) or not kept (default R/2).
      lookup_key: Look up ``means[lookup_key]`` (same key space, one value per output row) instead of
        ``means[key]``: aggregate over one column, look up by another.
      mean_form: ``"centred"`` (default, about half the error) or ``"sage"`` (the paper's List. 1).
      partition_selection: delta in (0, 1): keep only the keys whose noisy count passes the Laplace
        threshold at delta; spends (epsilon, delta).
      max_partitions_contributed: The keys one row adds to (1, exact here; more only adds noise).
      seed: For tests only (None draws fresh OS entropy).
      name: The name scope of the analyzer (and of its recorded spend).

    Returns:
      A float32 tensor [batch]: each row's noisy key mean.

    Raises:
      DPTransformError: a bad argument (a ValueError naming it), checked while the function is traced.
      BudgetExceeded: the spend is more than the active ``PreprocessingBudget`` allows.
    """
    label = "dp_group_by_mean"
    if partition_selection is not None:
        check_selection_options(label, nkeys, mask, min_count)
        selected = selected_tables(
            label,
            MEAN,
            key_tensor,
            value_tensor,
            epsilon,
            value_range,
            seed,
            name,
            partition_selection,
            max_partitions_contributed,
            mean_form,
        )
        by = key_tensor if lookup_key is None else lookup_key
        return selected.lookup(by, default=float(value_range) / 2.0 if fallback is None else fallback)
    tables, fallback = _mean_per_key(
        label, key_tensor, value_tensor, nkeys, epsilon, value_range, seed, name, mask, min_count, fallback, mean_form
    )
    nkeys = tables.means.shape[0]
    by = key_tensor if lookup_key is None else lookup_key
    keys = _key_vector(by, nkeys, label, what="key" if lookup_key is None else "lookup_key")
    return _lookup(tables.means, keys, float(value_range) / 2.0 if fallback is None else fallback)


def dp_histogram(x, epsilon, *, num_buckets=None, vocabulary=None, seed=None, name=None):
    """Noisy counts of each value of a categorical feature (Criteo-style count features): float32.

    Give either `num_buckets` (x is an integer id in [0, num_buckets); result shape
    [num_buckets]) or a PUBLIC `vocabulary` (list of strings or ints; result shape
    [len(vocabulary) + 1], the last bucket counting every value not in the vocabulary).
    The domain must be public: releasing counts for values found in the data would
    reveal which values occur. Map rows to their count with ``tf.gather``.

    Mechanism: count_b + Laplace(0, 1/epsilon) for every bucket b.
    Sensitivity: a row falls in exactly one bucket, so one row changes the L1 norm of
    the histogram by 1. Guarantee: (epsilon, 0)-DP (Laplace mechanism).

    Args:
      x: The categorical feature: integer ids, or values of the vocabulary's type.
      epsilon: What the analyzer spends (finite, > 0).
      num_buckets: The number of ids (x in [0, num_buckets)); give it or ``vocabulary``.
      vocabulary: The PUBLIC values (strings or ints, no duplicates); give it or ``num_buckets``.
      seed: For tests only (None draws fresh OS entropy).
      name: The name scope of the analyzer (and of its recorded spend).

    Returns:
      A float32 tensor of noisy counts, [num_buckets] or [len(vocabulary) + 1].

    Raises:
      DPTransformError: a bad argument (a ValueError naming it), checked while the function is traced.
      BudgetExceeded: the spend is more than the active ``PreprocessingBudget`` allows.
    """
    label = "dp_histogram"
    if (num_buckets is None) == (vocabulary is None):
        raise DPTransformError(
            f"{label}: give exactly one of num_buckets or vocabulary, got num_buckets={num_buckets!r}, "
            f"vocabulary={'None' if vocabulary is None else 'a list'}"
        )
    if vocabulary is not None:
        vocabulary = list(vocabulary)
        if not vocabulary:
            raise DPTransformError(f"{label}: vocabulary must not be empty, got {vocabulary!r}")
        if len(set(vocabulary)) != len(vocabulary):
            raise DPTransformError(f"{label}: vocabulary has duplicates: {vocabulary!r}")
        nbuckets = len(vocabulary) + 1
    else:
        nbuckets = num_buckets
    epsilon, seed, nbuckets, _ = _check_common(label, epsilon, seed, nkeys=nbuckets)
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon)
        if vocabulary is None:
            ids = _key_vector(x, nbuckets, label, what="value")
        else:
            ids = _vocabulary_ids(_dense_vector(x, "x", label), vocabulary, label)
        (noisy,) = _float_tables(
            _noisy_tables(
                scope, ids, [tf.ones_like(ids, dtype=tf.float64)], [1.0 / epsilon], nbuckets, _as_is, 1, seed, [1.0]
            )
        )
        return noisy


def _vocabulary_ids(x, vocabulary, label):
    """Index of each value of x in the public vocabulary; len(vocabulary) for any other value."""
    vocab = tf.constant(vocabulary)
    if x.dtype.is_integer and vocab.dtype.is_integer:
        x, vocab = tf.cast(x, tf.int64), tf.cast(vocab, tf.int64)
    elif not (x.dtype == tf.string and vocab.dtype == tf.string):
        raise DPTransformError(
            f"{label}: x of dtype {x.dtype.name} cannot be looked up in a vocabulary of {vocab.dtype.name}"
        )
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(vocab, tf.range(len(vocabulary), dtype=tf.int64)),
        default_value=len(vocabulary),
    )
    return table.lookup(x)


def dp_mean(x, epsilon, value_range, *, mean_form=CENTRED_MEAN, seed=None, name=None):
    """Noisy mean of clip(x, 0, value_range) over the whole data set: a float32 scalar in [0, value_range].

    The one-key case of `dp_group_by_mean`, same mechanism and ``mean_form``: by default a count at
    eps_n = epsilon / (1 + 3^(1/3)) (sensitivity 1) and a sum of clip(x, 0, R) - R/2 at epsilon - eps_n
    (sensitivity R/2), mean = clip(R/2 + sum / max(count, 1), 0, R); ``mean_form="sage"``: count and
    raw sum (sensitivity R) at epsilon/2 each. Guarantee: (epsilon, 0)-DP by basic composition; the rest
    is post-processing (docs/dp_preprocessing.md, "The mean's two forms").

    Args:
      x: A numeric tensor, one value per row (NaN counts as 0).
      epsilon: What the analyzer spends (finite, > 0).
      value_range: R: values are clipped to [0, R] (finite, > 0).
      mean_form: ``"centred"`` (default) or ``"sage"``.
      seed: For tests only (None draws fresh OS entropy).
      name: The name scope of the analyzer (and of its recorded spend).

    Returns:
      A float32 scalar in [0, value_range].

    Raises:
      DPTransformError: a bad argument (a ValueError naming it), checked while the function is traced.
      BudgetExceeded: the spend is more than the active ``PreprocessingBudget`` allows.
    """
    tables, _ = _mean_per_key(
        "dp_mean",
        tf.zeros_like(_dense_vector(x, "x", "dp_mean"), dtype=tf.int64),
        x,
        1,
        epsilon,
        value_range,
        seed,
        name,
        mean_form=mean_form,
    )
    return tables.means[0]


def dp_variance(x, epsilon, value_range, *, seed=None, name=None):
    """Noisy (population) variance of clip(x, 0, value_range): a float32 scalar in [0, value_range^2/4].

    Mechanism: with c = value_range/2 and v = clip(x, 0, R), three sums at eps_n + eps_s + eps_q = epsilon,
    split by the expected error (`moments.variance_release`: ~0.229, 0.404, 0.367 of epsilon):
        n~ = count + Laplace(1/eps_n)                      (sensitivity 1)
        s~ = sum(v - c) + Laplace((R/2)/eps_s)             (sensitivity R/2: |v - c| <= R/2)
        q~ = sum((v - c)^2) + Laplace((R^2/4)/eps_q)       (sensitivity R^2/4)
        variance = clip(q~/n' - clip(s~/n', -c, c)^2, 0, R^2/4), n' = max(n~, 1)
    Centring at R/2 cuts the sensitivities of the two sums by 2 and 4 against raw sums.
    Guarantee: (epsilon, 0)-DP. Proof sketch: three Laplace mechanisms, each eps_i-DP for its
    sensitivity, compose to epsilon; the rest is post-processing (docs/dp_preprocessing.md, "Sums and variances").

    Args:
      x: A numeric tensor, one value per row (NaN counts as 0).
      epsilon: What the analyzer spends (finite, > 0).
      value_range: R: values are clipped to [0, R] (finite, > 0).
      seed: For tests only (None draws fresh OS entropy).
      name: The name scope of the analyzer (and of its recorded spend).

    Returns:
      A float32 scalar in [0, value_range^2/4].

    Raises:
      DPTransformError: a bad argument (a ValueError naming it), checked while the function is traced.
      BudgetExceeded: the spend is more than the active ``PreprocessingBudget`` allows.
    """
    label = "dp_variance"
    epsilon, seed, _, value_range = _check_common(label, epsilon, seed, value_range=value_range)
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon)
        release = variance_release(epsilon, value_range)
        centred = _clipped_values(x, value_range, label) - release.shift
        finish = functools.partial(_variance_table, value_range=value_range)
        (variance,) = _float_tables(
            _noisy_tables(
                scope,
                _one_key(centred),
                [tf.ones_like(centred), centred, centred * centred],
                list(release.scales),
                1,
                finish,
                1,
                seed,
                list(release.sensitivities),
            )
        )
        return variance[0]
