"""How a release strategy reads a block's records: numeric columns of the stream's schema, public defaults.

A missing or non-finite value becomes 0 (a public default, never an error naming a record); the features are divided
by their public scales (docs/release_strategies.md, "Features").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sage_tfx.ingest.records import decode

from .settings import ReleaseInputError

NUMERIC_TYPES = ("float", "int")


def check_numeric(stream: str, schema: dict, cols: Sequence[str]) -> None:
    """ReleaseInputError unless every column of ``cols`` is a numeric column of the stream's schema (naming it and
    the choices)."""
    for c in cols:
        if c not in schema:
            raise ReleaseInputError(
                f"column {c!r} is not in stream {stream!r}'s schema: use one of "
                f"{', '.join(sorted(n for n, t in schema.items() if t in NUMERIC_TYPES))}"
            )
        if schema[c] not in NUMERIC_TYPES:
            raise ReleaseInputError(f"column {c!r} is {schema[c]}, not numeric: give a float or int column")


def column_reader(schema: dict, cols: Sequence[str]) -> Callable:
    """records -> (n, len(cols)) array of the columns (missing / non-finite -> 0, a public default)."""

    def read(records):
        batch = decode(records, schema)
        out = np.zeros((batch.num_rows, len(cols)))
        for k, name in enumerate(cols):
            v = np.array([(float(x[0]) if x else 0.0) for x in batch.column(name).to_pylist()], dtype=np.float64)
            out[:, k] = np.where(np.isfinite(v), v, 0.0)
        return out

    return read


def featurizer(
    schema: dict, cols: Sequence[str], scales: Sequence[float], label: str, label_scale: float, intercept: bool
) -> Callable:
    """records -> (X, y): the scaled columns (missing / non-finite -> 0, a public default), label / label_scale."""
    read = column_reader(schema, list(cols) + [label])

    def featurize(records):
        values = read(records)
        x = values[:, :-1] / np.asarray(scales, dtype=np.float64)
        if intercept:
            x = np.concatenate([x, np.ones((len(values), 1))], 1)
        return x, values[:, -1] / label_scale

    return featurize


def sign_labels(featurize: Callable, threshold: float) -> Callable:
    """``featurize`` with each label +1 iff its (scaled) value > ``threshold``, else -1 (logistic labels)."""

    def signed(records):
        x, y = featurize(records)
        return x, (y > threshold).astype(float) * 2 - 1

    return signed
