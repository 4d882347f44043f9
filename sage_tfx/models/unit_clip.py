"""Per-unit DP-SGD (McMahan et al., ICLR 2018): protect a privacy unit's rows together, not each row.

Each step samples UNITS with probability q = batch_size / num_units, sums each sampled unit's per-example
gradients over its rows and clips that sum to C. Contract: adding or removing one whole unit moves the noisy sum
by at most C, so the run is the row-level DpEvent with ``num_examples`` the (public or DP) count of units:
(epsilon, delta)-DP per unit, with no factor K. Only ``UNIT_ENGINES`` ("vmap", "loop") support it; the unit ids
must be the stream's unit column.

Mechanism, engines and what the user must do: docs/models.md ("Per-unit clipping: protect a unit's rows
together").
"""

import sage_tfx  # noqa: F401  (before TensorFlow: tf.keras is Keras 2)  # isort: skip
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf  # noqa: TID253

from sage_tfx.models.dpsgd_engine import _zero_rows, per_example_gradients
from sage_tfx.privacy.dpsgd import DpSgdConfigError

__all__ = ["UNIT_ENGINES", "unit_engine_name", "unit_index", "unit_batches", "unit_clipped_sum", "unit_noisy_sum"]

UNIT_ENGINES = ("vmap", "loop")


def unit_engine_name(per_example: str) -> str:
    """The engine of a per-unit fit for ``per_example``: "auto" -> "vmap"; "vmap" / "loop" as given; the others
    refused (DpSgdConfigError naming the engine and the fix), before anything is read."""
    if per_example == "auto":
        return "vmap"
    if per_example not in UNIT_ENGINES:
        raise DpSgdConfigError(
            f"per_example={per_example!r} is invalid with per-unit clipping: a unit's gradient is the sum of its "
            f"rows' own gradients, which only the engines {UNIT_ENGINES} materialise; use per_example='auto' "
            "or 'vmap'"
        )
    return per_example


def unit_index(units: Any, rows: int) -> tuple[np.ndarray, int]:
    """(the unit of each row as 0..u-1, u): ``units`` one id per row (any hashable scalars); ValueError naming
    the mismatch if it has another length or shape (checked before any value of x or y is used)."""
    ids = np.asarray(units)
    if ids.ndim != 1 or len(ids) != rows:
        raise ValueError(
            f"units: pass one unit id per row of x ({rows} rows), as a 1-D array (got shape {tuple(ids.shape)})"
        )
    names, inverse = np.unique(ids.astype(str) if ids.dtype == object else ids, return_inverse=True)
    return inverse.astype(np.int64).ravel(), len(names)


def unit_batches(
    sampled_units: Iterable[np.ndarray], unit_of_row: np.ndarray, num_units: int
) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """For each batch of units in ``sampled_units`` (the Poisson samples of 0..num_units-1 that
    ``private.poisson_batches`` draws: each unit kept independently with probability q), yield (the row indices
    of those units, each row's segment 0..s-1, s the number of units sampled): all of a unit's rows with it."""
    order = np.argsort(unit_of_row, kind="stable")
    counts = np.bincount(unit_of_row, minlength=num_units)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for sampled in sampled_units:
        if not len(sampled):
            yield np.empty(0, np.int64), np.empty(0, np.int32), 0
            continue
        rows = np.concatenate([order[starts[u] : starts[u] + counts[u]] for u in sampled])
        segments = np.repeat(np.arange(len(sampled), dtype=np.int32), counts[sampled])
        yield rows, segments, len(sampled)


def unit_clipped_sum(engine: Any, x: Any, y: Any, segments: Any, num_segments: Any) -> tuple[list[Any], Any]:
    """(sum over units of each unit's clipped summed gradient, aligned with ``engine.variables``; the units'
    gradient norms): rows of one segment are one unit. ``engine``: a vmap / loop ``PerExampleEngine``."""
    per_row = per_example_gradients(engine.model, engine.per_example_loss, engine.variables, x, y, engine.vectorized)
    per_unit = [tf.math.unsorted_segment_sum(g, segments, num_segments) for g in per_row]
    sq = tf.add_n([tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), axis=1) for g in per_unit])
    factors, norms, finite = engine._factors(sq)
    return [tf.tensordot(factors, _zero_rows(g, finite), axes=1) for g in per_unit], norms


def unit_noisy_sum(engine: Any, x: Any, y: Any, segments: Any, num_segments: Any) -> Any:
    """``unit_clipped_sum`` + N(0, (sigma C)^2) on every coordinate; with an adaptive clip, then its update from
    the noisy count of unclipped UNITS (the engine's own step, on unit norms)."""
    clipped, norms = unit_clipped_sum(engine, x, y, segments, num_segments)
    return engine._then_update_clip([g + n for g, n in zip(clipped, engine.noise())], norms)
