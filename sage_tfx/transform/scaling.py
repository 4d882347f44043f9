"""DP counterparts of tf.Transform's scalers and bucketizers: dp_scale_to_z_score, dp_scale_to_0_1, dp_quantiles,
dp_bucketize.

Each reads its statistics from ONE Laplace release, drawn once in Beam like every Sage analyzer, of values clipped
into a public range (which bounds the sensitivities); the per-row mapping is post-processing, and a NaN row gets a
public default, never an error. Mechanisms and proofs: docs/dp_preprocessing.md, "Scaling and bucketizing".
"""

import functools
import math
from typing import Union

import sage_tfx  # noqa: F401  (Keras 2 before TensorFlow)  # isort: skip
import numpy as np
import tensorflow as tf  # noqa: TID253
import tensorflow_transform as tft  # noqa: TID253

from sage_tfx.privacy import checks

from .analyzers import _check_common, _dense_vector, _one_key, _release
from .budget import record_spend
from .errors import DPTransformError
from .noise import check_int, check_value_range, guarded_variance

ValueRange = Union[float, tuple[float, float]]  # noqa: UP007

DEFAULT_GRID_SIZE = 1000
DEFAULT_TAIL = 0.01
MIN_STD_FRACTION = 1e-3  # default public floor of the noisy std: 1/1000 of the public range
# The z-score's variance is never taken below this many standard deviations of its own noise
# (sqrt(2) b / n' for the sum of squares' Laplace(b)): see `_mean_and_variance_table`.
VARIANCE_NOISE_FLOOR_SDS = 2.0


# ---------------------------------------------------------------- argument checks


def _check_range(value_range, label) -> tuple[float, float]:
    """(low, high) of the public range: a number R > 0 means [0, R]; a pair needs finite low < high."""
    if isinstance(value_range, (tuple, list)):
        fix = "give the public range as a number R > 0 (for [0, R]) or a pair (low, high) of finite numbers, low < high"
        if len(value_range) != 2:
            raise DPTransformError(f"{label}: value_range {value_range!r} is not a pair; {fix}")
        try:
            low, high = float(value_range[0]), float(value_range[1])
        except (TypeError, ValueError):
            raise DPTransformError(f"{label}: value_range {value_range!r} is not numeric; {fix}") from None
        if any(isinstance(v, bool) for v in value_range) or not (math.isfinite(low) and math.isfinite(high)):
            raise DPTransformError(f"{label}: value_range {value_range!r} must be finite; {fix}")
        if not low < high:
            raise DPTransformError(f"{label}: value_range {value_range!r} needs low < high; {fix}")
        return low, high
    return 0.0, check_value_range(value_range, f"{label}: value_range")


def _check_fraction(value, what, upper, fix):
    fix = fix.replace("{", "{{").replace("}", "}}")
    return checks.number(
        value,
        what,
        error=DPTransformError,
        low=0.0,
        high=upper,
        low_open=True,
        high_open=True,
        message="{what} must be a number {rule}, got {value!r} (" + fix + ")",
    )


# ---------------------------------------------------------------- post-processing (numpy, Beam side)


def monotone_cdf(noisy_counts) -> np.ndarray:
    """A nondecreasing CDF on the grid's G+1 edges, from G noisy cell counts: float64 [G+1], 0 at the
    first edge, 1 at the last.

    With F~(i) = the sum of the first i noisy counts (F~(0) = 0), the estimate is the average of the
    running maximum of F~ from the left and its running minimum from the right, clipped into
    [0, its last value] and divided by it. Both running extrema are nondecreasing, so the average is.
    If the exact CDF C is within delta of F~ at every edge, so are both running extrema (C is
    monotone), hence so is their average: the repair adds no error beyond the noise's own. If the
    noisy total is not positive, the data say nothing usable and the CDF is uniform over the range.
    Uses only the noisy counts: post-processing.
    """
    noisy = np.asarray(noisy_counts, dtype=np.float64).reshape(-1)
    raw = np.concatenate([[0.0], np.cumsum(noisy)])
    cdf = (np.maximum.accumulate(raw) + np.minimum.accumulate(raw[::-1])[::-1]) / 2.0
    total = cdf[-1]
    if not (np.isfinite(total) and total > 0.0):
        return np.linspace(0.0, 1.0, len(raw))
    return np.clip(cdf, 0.0, total) / total


def cdf_quantiles(cdf, levels, low, high) -> np.ndarray:
    """Positions in [low, high] where the grid CDF `cdf` (from `monotone_cdf`) reaches each level in (0, 1).

    Linear interpolation inside the cell where the CDF crosses the level (values spread
    evenly inside a cell). Nondecreasing in the level, strictly increasing where the levels are.
    """
    cdf = np.asarray(cdf, dtype=np.float64)
    cells = len(cdf) - 1
    levels = np.asarray(levels, dtype=np.float64)
    right = np.clip(np.searchsorted(cdf, levels, side="left"), 1, cells)  # cdf[right-1] < level <= cdf[right]
    below, above = cdf[right - 1], cdf[right]
    frac = np.clip((levels - below) / np.where(above > below, above - below, 1.0), 0.0, 1.0)
    return low + (right - 1 + frac) * ((high - low) / cells)


def _quantile_table(noisy_counts, levels, low, high):
    return (cdf_quantiles(monotone_cdf(noisy_counts), levels, low, high),)


def _mean_and_variance_table(counts, centred_sums, centred_squares, width, square_scale):
    """(mean of the shifted values in [0, W], variance in [0, W^2/4]) from the noisy centred sums (c = W/2),
    the variance floored at what the noise alone can explain.

    `square_scale` is b, the scale of the Laplace noise on the sum of squares; its standard deviation over
    the noisy count n' = max(n~, 1) is sqrt(2) b / n'. A variance estimate below
    ``VARIANCE_NOISE_FLOOR_SDS`` of those standard deviations is not distinguishable from 0, and clipping it
    to 0 (then dividing by the public `min_std`) scales that feature up by as much as W / min_std: measured
    on the taxi trips (15,000 rows, epsilon 0.022 per analyzer), 5-7% of the draws per feature, which sank
    the model trained on them. So the variance is max(estimate, min(2 sqrt(2) b / n', W^2/4)): a draw can
    then overstate the std (z-scores shrink; on those rows P(std > 2x the true std) <= 5e-4 per feature),
    but no longer understate it below what the noise explains (P(std < half the true std) was 0 in 10^5
    draws). Post-processing: b is public and n' is the released count, so the guarantee is unchanged.
    """
    half = width / 2.0
    n = np.maximum(np.asarray(counts, dtype=np.float64), 1.0)
    centred_mean = np.clip(np.asarray(centred_sums) / n, -half, half)
    floor = np.minimum(VARIANCE_NOISE_FLOOR_SDS * math.sqrt(2.0) * float(square_scale) / n, half * half)
    return centred_mean + half, np.maximum(guarded_variance(counts, centred_sums, centred_squares, width), floor)


# ---------------------------------------------------------------- graph side


def _numeric(x, label):
    """(x as given, as a tensor; its values as float64 [batch])."""
    if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)):
        _dense_vector(x, "x", label)  # raises, naming the fix
    x = tf.convert_to_tensor(x)
    values = _dense_vector(x, "x", label)
    if not (values.dtype.is_floating or values.dtype.is_integer):
        raise DPTransformError(f"{label}: x must be a numeric tensor, got dtype {values.dtype.name}")
    return x, tf.cast(values, tf.float64)


def _grid_cells(values, low, high, grid_size):
    """The grid cell of each value in [0, grid_size); values outside [low, high] fall in the end cells, NaN in
    none (-1, which the grid sums drop)."""
    nan = tf.math.is_nan(values)
    at_low = tf.fill(tf.shape(values), tf.constant(low, tf.float64))
    scaled = (tf.where(nan, at_low, values) - low) * (grid_size / (high - low))
    cells = tf.cast(tf.floor(tf.clip_by_value(scaled, 0.0, grid_size - 0.5)), tf.int64)
    return tf.where(nan, tf.constant(-1, tf.int64), cells)


def _dp_quantile_positions(label, x, levels, epsilon, low, high, grid_size, seed, scope):
    """Records the spend, then: noisy grid histogram of x (one release, epsilon) -> (x as a tensor, its float64
    values [batch], the positions of `levels`, float64 [len(levels)])."""
    record_spend(scope.rstrip("/"), epsilon)
    x, values = _numeric(x, label)
    cells = _grid_cells(values, low, high, grid_size)
    finish = functools.partial(_quantile_table, levels=tuple(float(v) for v in levels), low=low, high=high)
    (positions,) = _release(
        scope, cells, [tf.ones_like(values)], grid_size, [1.0 / epsilon], finish, [[len(levels)]], seed, [1.0]
    )
    return x, values, positions


def _quantile_args(label, num_buckets, epsilon, value_range, grid_size, seed):
    epsilon, seed, _, _ = _check_common(label, epsilon, seed)
    num_buckets = check_int(
        num_buckets,
        f"{label}: num_buckets",
        2,
        fix="num_buckets - 1 boundaries split the values into num_buckets buckets",
    )
    grid_size = check_int(grid_size, f"{label}: grid_size", 2, fix="the number of cells of the public grid")
    low, high = _check_range(value_range, label)
    return epsilon, seed, num_buckets, low, high, grid_size


def dp_quantiles(
    x: tf.Tensor,
    num_buckets: int,
    epsilon: float,
    value_range: ValueRange,
    *,
    grid_size: int = DEFAULT_GRID_SIZE,
    seed: int | None = None,
    name: str | None = None,
) -> tf.Tensor:
    """DP quantile boundaries of x over the whole data set, like ``tft.quantiles(x, num_buckets, ...)``.

    One noisy histogram over ``grid_size`` equal cells of the public range (Laplace(1/epsilon) per cell,
    sensitivity 1), repaired into a monotone CDF (`monotone_cdf`) and cut at the levels i/num_buckets
    (`cdf_quantiles`): (epsilon, 0)-DP. Proof and accuracy bound: docs/dp_preprocessing.md, "Scaling and
    bucketizing".

    Args:
        x: a dense numeric tensor, one value per row.
        num_buckets: the number of buckets, an integer >= 2.
        epsilon: the epsilon this analyzer spends, > 0.
        value_range: the public range: a number R > 0 for [0, R], or a pair (low, high) of finite numbers,
            low < high; values are clipped into it.
        grid_size: the number of cells of the public grid, an integer >= 2.
        seed: for tests only; None draws fresh OS entropy (refused under DPTransform).
        name: the name scope, or None.

    Returns:
        float32 [1, num_buckets - 1] boundaries, nondecreasing, in the public range (for ``tft.apply_buckets``).

    Raises:
        DPTransformError: a bad argument (the message names it and the fix).
        BudgetExceeded: epsilon would take the preprocessing_fn past its `PreprocessingBudget`.
    """
    _, boundaries = _dp_boundaries("dp_quantiles", x, num_buckets, epsilon, value_range, grid_size, seed, name)
    return boundaries


def _dp_boundaries(label, x, num_buckets, epsilon, value_range, grid_size, seed, name):
    """(x as analyzed, the num_buckets - 1 DP boundaries as float32 [1, num_buckets - 1]): dp_quantiles' release."""
    epsilon, seed, num_buckets, low, high, grid_size = _quantile_args(
        label, num_buckets, epsilon, value_range, grid_size, seed
    )
    levels = [i / num_buckets for i in range(1, num_buckets)]
    with tf.compat.v1.name_scope(name, label) as scope:
        x, _, positions = _dp_quantile_positions(label, x, levels, epsilon, low, high, grid_size, seed, scope)
        return x, tf.reshape(tf.cast(positions, tf.float32), [1, num_buckets - 1])


def dp_bucketize(
    x: tf.Tensor,
    num_buckets: int,
    epsilon: float,
    value_range: ValueRange,
    *,
    grid_size: int = DEFAULT_GRID_SIZE,
    seed: int | None = None,
    name: str | None = None,
) -> tf.Tensor:
    """Bucket id of each row in [0, num_buckets), like ``tft.bucketize(x, num_buckets)``.

    The boundaries are `dp_quantiles` (same mechanism, (epsilon, 0)-DP); the ids are ``tft.apply_buckets(x,
    boundaries)``, post-processing: b[i-1] <= x < b[i] gets i, a NaN row num_buckets - 1 (tft's own rule).

    Args:
        x: a dense numeric tensor, one value per row.
        num_buckets: the number of buckets, an integer >= 2.
        epsilon: the epsilon this analyzer spends, > 0.
        value_range: the public range: a number R > 0 for [0, R], or a pair (low, high) of finite numbers,
            low < high; values are clipped into it.
        grid_size: the number of cells of the public grid, an integer >= 2.
        seed: for tests only; None draws fresh OS entropy (refused under DPTransform).
        name: the name scope, or None.

    Returns:
        int64 bucket ids, shaped as x.

    Raises:
        DPTransformError: a bad argument (the message names it and the fix).
        BudgetExceeded: epsilon would take the preprocessing_fn past its `PreprocessingBudget`.
    """
    x, boundaries = _dp_boundaries("dp_bucketize", x, num_buckets, epsilon, value_range, grid_size, seed, name)
    return tft.apply_buckets(x, boundaries)


def dp_scale_to_0_1(
    x: tf.Tensor,
    epsilon: float,
    value_range: ValueRange,
    *,
    tail: float = DEFAULT_TAIL,
    grid_size: int = DEFAULT_GRID_SIZE,
    seed: int | None = None,
    name: str | None = None,
) -> tf.Tensor:
    """x scaled to [0, 1] by the data's DP spread, like ``tft.scale_to_0_1(x)``.

    Maps the DP ``tail`` quantile to 0 and the DP ``1 - tail`` quantile to 1 (both from ONE noisy histogram,
    as `dp_quantiles`) and clips: (epsilon, 0)-DP; a NaN row gets 0.5. Why quantiles and not the min and max,
    and the proof: docs/dp_preprocessing.md, "Scaling and bucketizing".

    Args:
        x: a dense numeric tensor, one value per row.
        epsilon: the epsilon this analyzer spends, > 0.
        value_range: the public range: a number R > 0 for [0, R], or a pair (low, high) of finite numbers,
            low < high; values are clipped into it.
        tail: the public fraction of rows mapped to 0 (and to 1), in (0, 0.5).
        grid_size: the number of cells of the public grid, an integer >= 2.
        seed: for tests only; None draws fresh OS entropy (refused under DPTransform).
        name: the name scope, or None.

    Returns:
        float32 values in [0, 1], shaped as x.

    Raises:
        DPTransformError: a bad argument (the message names it and the fix).
        BudgetExceeded: epsilon would take the preprocessing_fn past its `PreprocessingBudget`.
    """
    label = "dp_scale_to_0_1"
    epsilon, seed, _, _ = _check_common(label, epsilon, seed)
    tail = _check_fraction(tail, f"{label}: tail", 0.5, "the fraction of rows mapped to 0 (and to 1), e.g. 0.01")
    grid_size = check_int(grid_size, f"{label}: grid_size", 2, fix="the number of cells of the public grid")
    low, high = _check_range(value_range, label)
    with tf.compat.v1.name_scope(name, label) as scope:
        x, values, positions = _dp_quantile_positions(
            label, x, [tail, 1.0 - tail], epsilon, low, high, grid_size, seed, scope
        )
        lo, hi = positions[0], positions[1]
        span = tf.maximum(hi - lo, (high - low) * 1e-9)  # > 0 by construction; the floor only guards rounding
        scaled = tf.clip_by_value((values - lo) / span, 0.0, 1.0)
        scaled = tf.where(tf.math.is_nan(values), tf.fill(tf.shape(values), tf.constant(0.5, tf.float64)), scaled)
        return tf.reshape(tf.cast(scaled, tf.float32), tf.shape(x))


def dp_scale_to_z_score(
    x: tf.Tensor,
    epsilon: float,
    value_range: ValueRange,
    *,
    min_std: float | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> tf.Tensor:
    """(x - mean) / std of each row, like ``tft.scale_to_z_score(x)``, the mean and variance from ONE DP release.

    Three Laplace sums (count, centred sum, centred sum of squares; epsilon/3 each) over the values clipped into
    the public range: (epsilon, 0)-DP. The variance is floored at two standard deviations of its own noise and
    the std at ``min_std``; a NaN row gets 0.0. Mechanism and proof: docs/dp_preprocessing.md, "Scaling and
    bucketizing".

    Args:
        x: a dense numeric tensor, one value per row.
        epsilon: the epsilon this analyzer spends, > 0.
        value_range: the public range: a number R > 0 for [0, R], or a pair (low, high) of finite numbers,
            low < high; values are clipped into it.
        min_std: the public floor of the std, > 0; None for 1/1000 of the range's width.
        seed: for tests only; None draws fresh OS entropy (refused under DPTransform).
        name: the name scope, or None.

    Returns:
        float32 z-scores of the clipped values, shaped as x.

    Raises:
        DPTransformError: a bad argument (the message names it and the fix).
        BudgetExceeded: epsilon would take the preprocessing_fn past its `PreprocessingBudget`.
    """
    label = "dp_scale_to_z_score"
    epsilon, seed, _, _ = _check_common(label, epsilon, seed)
    low, high = _check_range(value_range, label)
    width = high - low
    if min_std is None:
        min_std = width * MIN_STD_FRACTION
    else:
        min_std = check_value_range(min_std, f"{label}: min_std (a public floor of the std, e.g. {width / 1000!r})")
    with tf.compat.v1.name_scope(name, label) as scope:
        record_spend(scope.rstrip("/"), epsilon)
        x, values = _numeric(x, label)
        present = tf.logical_not(tf.math.is_nan(values))
        at_low = tf.fill(tf.shape(values), tf.constant(low, tf.float64))
        clipped = tf.clip_by_value(tf.where(present, values, at_low), low, high)
        weight = tf.cast(present, tf.float64)
        centred = (clipped - low - width / 2.0) * weight
        third = epsilon / 3.0
        scales = [1.0 / third, (width / 2.0) / third, (width**2 / 4.0) / third]
        finish = functools.partial(_mean_and_variance_table, width=width, square_scale=scales[2])
        shifted_mean, variance = _release(
            scope,
            _one_key(centred),
            [weight, centred, centred * centred],
            1,
            scales,
            finish,
            [[1], [1]],
            seed,
            [1.0, width / 2.0, width**2 / 4.0],
        )
        mean = low + shifted_mean[0]
        std = tf.maximum(tf.sqrt(variance[0]), min_std)
        z = tf.where(present, (clipped - mean) / std, tf.zeros_like(clipped))
        return tf.reshape(tf.cast(z, tf.float32), tf.shape(x))


__all__ = ["dp_scale_to_z_score", "dp_scale_to_0_1", "dp_quantiles", "dp_bucketize", "monotone_cdf", "cdf_quantiles"]
