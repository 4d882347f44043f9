"""Per-example values the validators take: squared and absolute errors, log losses, 0/1 correctness.

Each checks that labels and predictions have the same shape (naming their trailing shapes when not: their
lengths are counts of records).

Non-finite records: these values are computed after the budget is charged, so a NaN or +-inf
label or prediction (e.g. a model that outputs NaN on one record) must not make the validation fail, nor
show in an error. Such a record gets the WORST value, a fixed function of the record alone: the loss
bound B for losses (what clipping an infinite loss to [0, B] gives), 0 ("incorrect") for correctness. The
validators' sensitivities (one record moves a clipped sum by at most B, a count by 1) are unchanged. A finite
label other than 0 or 1 (binary log loss, correctness) is mapped alike. Where a value cannot be mapped (a
non-finite record when no B is given), ``RecordError`` names the column only: never a value, index or count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sage_tfx.privacy.errors import RecordError

from .core import ValidationInputError

if TYPE_CHECKING:
    import numpy.typing as npt


def _pair(labels: npt.ArrayLike, predictions: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    labels = np.asarray(labels, dtype=np.float64)
    predictions = np.asarray(predictions, dtype=np.float64)
    if predictions.ndim == 2 and predictions.shape[1] == 1 and labels.ndim == 1:
        predictions = predictions[:, 0]  # a Keras (n, 1) output against (n,) labels
    if labels.shape != predictions.shape:  # their lengths are counts of records: only the rest is named
        raise ValidationInputError(
            f"labels and predictions have different shapes (per record: {labels.shape[1:]} and "
            f"{predictions.shape[1:]}; their lengths are counts of records, not shown): give one prediction per label"
        )
    labels, predictions = labels.ravel(), predictions.ravel()
    return labels, predictions, ~(np.isfinite(labels) & np.isfinite(predictions))


def _worst(values, bad, worst, name):
    """``values`` with the records flagged ``bad`` (or whose value is not finite) set to ``worst``; without
    ``worst`` it raises RecordError (the column only: never a value, index or count)."""
    bad = bad | ~np.isfinite(values)
    if not bad.any():
        return values
    if worst is None:
        raise RecordError(
            name, None, "label or prediction is not finite: pass loss_bound=B to give it the worst loss B"
        )
    return np.where(bad, float(worst), values)


def squared_errors(labels: npt.ArrayLike, predictions: npt.ArrayLike, loss_bound: float | None = None) -> np.ndarray:
    """(label - prediction)^2 per example; ``loss_bound`` (the validator's B) for a record whose label or
    prediction is not finite, or whose error overflows (without it such a record raises RecordError).

    Args:
      labels: One label per example.
      predictions: One prediction per example, in the same order.
      loss_bound: The loss given to a bad record (None: a bad record raises RecordError).

    Returns:
      The per-example losses, float64.

    Raises:
      RecordError: A bad record without ``loss_bound`` (the column only: no value, index or count).
      ValidationInputError: ``labels`` and ``predictions`` have different shapes.
    """
    labels, predictions, bad = _pair(labels, predictions)
    with np.errstate(over="ignore", invalid="ignore"):
        return _worst((labels - predictions) ** 2, bad, loss_bound, "predictions")


def absolute_errors(labels: npt.ArrayLike, predictions: npt.ArrayLike, loss_bound: float | None = None) -> np.ndarray:
    """|label - prediction| per example; ``loss_bound`` (the validator's B) for a non-finite record.

    Args:
      labels: One label per example.
      predictions: One prediction per example, in the same order.
      loss_bound: The loss given to a bad record (None: a bad record raises RecordError).

    Returns:
      The per-example absolute errors, float64.

    Raises:
      RecordError: A bad record without ``loss_bound`` (the column only: no value, index or count).
      ValidationInputError: ``labels`` and ``predictions`` have different shapes.
    """
    labels, predictions, bad = _pair(labels, predictions)
    with np.errstate(over="ignore", invalid="ignore"):
        return _worst(np.abs(labels - predictions), bad, loss_bound, "predictions")


def log_losses(
    labels: npt.ArrayLike, probabilities: npt.ArrayLike, floor: float = 1e-7, loss_bound: float | None = None
) -> np.ndarray:
    """-log p(label) per example for binary labels in {0, 1} and predicted P(label = 1).

    Probabilities are kept in [floor, 1 - floor], so each loss is at most ln(1/floor) (a valid B). A record
    whose label or probability is not finite gets ``loss_bound`` (default ln(1/floor), the largest loss).
    A finite label other than 0 or 1 is a bad record too: the worst loss, never an error naming it.

    Args:
      labels: One label in {0, 1} per example.
      probabilities: The predicted P(label = 1) per example, in the same order.
      floor: Probabilities are kept in [floor, 1 - floor].
      loss_bound: The loss given to a bad record (default ln(1/floor)).

    Returns:
      The per-example losses, float64, each at most ln(1/floor).

    Raises:
      ValidationInputError: ``labels`` and ``probabilities`` have different shapes.
    """
    labels, probabilities, bad = _pair(labels, probabilities)
    bad = _not_binary(labels, bad)
    p = np.clip(np.where(bad, 0.5, probabilities), floor, 1.0 - floor)
    y = np.where(bad, 0.0, labels)
    worst = -np.log(floor) if loss_bound is None else loss_bound
    return _worst(-(y * np.log(p) + (1.0 - y) * np.log1p(-p)), bad, worst, "probabilities")


def correctness(labels: npt.ArrayLike, scores: npt.ArrayLike, threshold: float = 0.5) -> np.ndarray:
    """1.0 where (score >= threshold) equals the binary label, else 0.0; 0.0 ("incorrect") for a record whose
    label or score is not finite, or whose finite label is other than 0 or 1.

    Args:
      labels: One label in {0, 1} per example.
      scores: One score per example, in the same order.
      threshold: A score at or above it predicts 1.

    Returns:
      1.0 or 0.0 per example, float64.

    Raises:
      ValidationInputError: ``labels`` and ``scores`` have different shapes.
    """
    labels, scores, bad = _pair(labels, scores)
    bad = _not_binary(labels, bad)
    return (((scores >= threshold) == (labels == 1.0)) & ~bad).astype(np.float64)


def _not_binary(labels, bad):
    """``bad`` with the records whose label is not 0 or 1 added: they get the worst value (a fixed function of
    the record alone), so no label fails a release after its charge."""
    return bad | ((labels != 0.0) & (labels != 1.0))
