"""Input handling shared by the DP models: arrays, feature dicts, tf.data datasets, as one float32 matrix.

Features given as a dict are laid out in a fixed key order (remembered at fit time, reused by predict and
serving). Contract: every non-finite value maps to a PUBLIC default before any DP computation
(``FEATURE_DEFAULT`` = 0.0 for features, ``LABEL_DEFAULT`` = 0.0 for the DP-SGD models' labels), a fixed
function of the record, so no sensitivity changes and a fit never fails because of one value; what cannot be
mapped raises ``RecordError`` naming the column only.

The defaults and why: docs/models.md ("Non-finite inputs: public defaults").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from sage_tfx.privacy.errors import RecordError

if TYPE_CHECKING:
    import numpy.typing as npt

    # What the estimators read as x: a matrix, or {feature name: column} (a column may be a matrix).
    Features = npt.ArrayLike | Mapping[str, npt.ArrayLike]

FEATURE_DEFAULT = 0.0
LABEL_DEFAULT = 0.0


def finite_or(values: np.ndarray, default: float) -> np.ndarray:
    """``values`` with every NaN or +-inf entry replaced by the public ``default`` (same dtype)."""
    values = np.asarray(values)
    bad = ~np.isfinite(values)
    if bad.any():
        values = np.where(bad, np.asarray(default, dtype=values.dtype), values)
    return values


class FeatureLayout:
    """Feature names and widths, in the column order the model uses."""

    def __init__(self, keys: Sequence[str], widths: Sequence[int]) -> None:
        self.keys = list(keys)
        self.widths = [int(w) for w in widths]

    @property
    def dim(self) -> int:
        return sum(self.widths)

    @classmethod
    def from_input(cls, x: Features) -> FeatureLayout:
        if isinstance(x, dict):
            keys = list(x)
            if not keys:
                raise ValueError("features: the feature dict is empty")
            return cls(keys, [_column_block(x[k], k).shape[1] for k in keys])
        matrix = np.asarray(x)
        if matrix.ndim == 1:
            matrix = matrix[:, None]
        if matrix.ndim != 2:
            raise ValueError(f"features must be a 2-D array or a dict of arrays, got {matrix.ndim} dimensions")
        return cls(["x"], [matrix.shape[1]])

    def to_matrix(self, x: Features) -> np.ndarray:
        if isinstance(x, dict):
            missing = [k for k in self.keys if k not in x]
            if missing:
                raise ValueError(f"features: missing column(s) {missing}; the model uses {self.keys}: pass them all")
            blocks = [_column_block(x[k], k) for k in self.keys]
            for key, block, width in zip(self.keys, blocks, self.widths):
                if block.shape[1] != width:
                    raise ValueError(f"feature {key!r} has width {block.shape[1]}, the model expects {width}")
            matrix = np.concatenate(blocks, axis=1)
        else:
            if self.keys != ["x"]:
                raise ValueError(f"features: the model was fitted on a dict of {self.keys}; pass a dict")
            matrix = np.asarray(x, dtype=np.float32)
            if matrix.ndim == 1:
                matrix = matrix[:, None]
            if matrix.ndim != 2 or matrix.shape[1] != self.dim:
                raise ValueError(
                    f"features have {matrix.shape[1:]} columns per row, the model expects "
                    f"({self.dim},): pass an (n, {self.dim}) array"
                )
        # non-finite entries (after the float32 conversion) -> the public FEATURE_DEFAULT (module docstring)
        return finite_or(matrix.astype(np.float32, copy=False), FEATURE_DEFAULT)


def _column_block(values, key):
    block = np.asarray(values, dtype=np.float32)
    if block.ndim == 1:
        block = block[:, None]
    if block.ndim != 2:
        raise ValueError(f"feature {key!r} must be 1-D or 2-D, got {block.ndim} dimensions")
    return block


def split_input(
    x: Features | tuple[Features, npt.ArrayLike | None], y: npt.ArrayLike | None
) -> tuple[Features, npt.ArrayLike | None]:
    """(features, labels) as numpy from arrays or a tf.data.Dataset of (features, label).

    A dataset is read fully into memory: Poisson sampling needs random access to
    every record at every step. Batched and unbatched datasets both work. An empty
    dataset gives empty arrays shaped by its ``element_spec`` (no error: whether the
    data are empty must not decide whether a charged fit fails).
    """
    if y is None:
        if not hasattr(x, "as_numpy_iterator"):
            raise ValueError("fit/evaluate: pass labels y, or a tf.data.Dataset of (features, label)")
        feats, labels = [], []
        for fx, fy in x.as_numpy_iterator():
            feats.append(fx)
            labels.append(np.asarray(fy))
        if not labels:
            return _empty_input(x.element_spec)
        batched = labels[0].ndim >= 1
        join = np.concatenate if batched else np.stack
        if isinstance(feats[0], dict):
            features = {k: join([np.asarray(f[k]) for f in feats]) for k in feats[0]}
        else:
            features = join([np.asarray(f) for f in feats])
        return features, join(labels)
    return x, np.asarray(y)


def _empty_input(element_spec):
    """(features, labels) with no rows, shaped like the records of a dataset with this element_spec."""
    feature_spec, label_spec = element_spec
    batched = label_spec.shape.rank is not None and label_spec.shape.rank >= 1

    def empty(spec):
        dims = spec.shape.as_list() if spec.shape.rank is not None else []
        dims = dims[1:] if batched and dims else dims
        return np.zeros((0, *[1 if d is None else d for d in dims]), dtype=spec.dtype.as_numpy_dtype)

    if isinstance(feature_spec, dict):
        return {k: empty(s) for k, s in feature_spec.items()}, empty(label_spec)
    return empty(feature_spec), empty(label_spec)


def _rows(y, n):
    y = np.asarray(y).reshape(-1)
    if y.shape[0] != n:
        raise ValueError("features and labels have different numbers of rows: pass one label per record")
    return y


def labels_vector(
    y: npt.ArrayLike | Mapping[str, npt.ArrayLike] | None,
    n: int,
    dtype: npt.DTypeLike,
    default: float | None = LABEL_DEFAULT,
) -> np.ndarray:
    """The labels as a 1-D ``dtype`` array of ``n`` rows; NaN and +-inf (after the conversion to ``dtype``)
    become the public ``default`` (``LABEL_DEFAULT``; None keeps them, for a caller that clips first)."""
    y = _rows(y, n).astype(dtype)
    if default is not None and np.issubdtype(y.dtype, np.floating):
        y = finite_or(y, default)
    return y


def class_labels(
    y: npt.ArrayLike | Mapping[str, npt.ArrayLike] | None,
    n: int,
    n_classes: int,
    dtype: npt.DTypeLike = np.int32,
    column: str = "label",
) -> np.ndarray:
    """Class ids in [0, n_classes) as a 1-D ``dtype`` array of ``n`` rows.

    NaN and +-inf become class ``LABEL_DEFAULT`` (0), the public default. A finite label that is not an
    integer in [0, n_classes) cannot be mapped without guessing: ``RecordError`` names ``column`` and the
    first such record's index, never its value.
    """
    y = _rows(y, n)
    if np.issubdtype(y.dtype, np.floating):
        y = finite_or(y.astype(np.float64), LABEL_DEFAULT)
        bad = (y != np.floor(y)) | (y < 0) | (y >= n_classes)
    elif np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        y = y.astype(np.int64)
        bad = (y < 0) | (y >= n_classes)
    else:
        raise ValueError(f"labels have dtype {y.dtype}: pass numeric class ids in [0, {n_classes})")
    if bad.any():
        raise RecordError(column, None, f"is not a class id in [0, {n_classes})")
    return y.astype(dtype)
