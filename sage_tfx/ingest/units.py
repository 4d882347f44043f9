"""Contribution bounding at ingest: at most K rows of each privacy unit in each block.

A unit stream's grants make their mechanisms DP on K rows, which holds only if no unit has more than K rows in a
block: ingest keeps K of a unit's rows per block, chosen by a keyed hash of (block, unit) alone, stores nothing
else and reports no drop count. A block is written by one run, and a unit stream's run reads all its files in
one writer, so the bound holds per block.

docs/block_composition.md, "Privacy units: protect people, not rows".
"""

import hashlib
import hmac
import json
from collections.abc import Sequence

import numpy as np

from .blocks import _scalar_column
from .records import InputError

BOUND_LABEL = b"sage-tfx unit bound|"


class UnitBound:
    """Keep at most ``max_rows`` rows per (block, value of ``column``), chosen under ``key`` (bytes)."""

    def __init__(self, column: str, max_rows: int, key: bytes):
        self.column, self.max_rows, self.key = column, int(max_rows), bytes(key)

    def __repr__(self):  # never the key
        return f"UnitBound(column={self.column!r}, max_rows={self.max_rows})"

    def keep(self, batches: Sequence, spec) -> list:
        """``batches`` (Arrow RecordBatches, in input order) with each unit's rows beyond K per block of ``spec``
        dropped; InputError naming the column if the unit column is missing or empty in a record."""
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return []
        blocks = np.concatenate([spec.keys(b) for b in batches])
        units = np.concatenate([self._units(b) for b in batches])
        keep = self._mask(blocks, units, spec)
        out, start = [], 0
        for b in batches:
            part = keep[start : start + b.num_rows]
            start += b.num_rows
            if part.any():
                out.append(b if part.all() else b.filter(_arrow_mask(part)))
        return out

    def _units(self, batch):
        check_schema(self, batch.schema.names)
        values = _scalar_column(batch, self.column)
        if values.null_count:
            raise InputError(
                f"privacy unit column {self.column!r} is empty in {values.null_count} record(s): every "
                "record needs a unit (drop or fill them before ingest)"
            )
        return np.asarray(values.to_pylist(), dtype=object).astype(str)

    def _mask(self, blocks, units, spec):
        """True for the rows kept: all rows of a (block, unit) with at most K rows; K of the others."""
        unit_names, unit_idx = np.unique(units, return_inverse=True)
        block_keys, block_idx = np.unique(blocks, return_inverse=True)
        group = block_idx.astype(np.int64) * len(unit_names) + unit_idx
        groups, inverse, counts = np.unique(group, return_inverse=True, return_counts=True)
        keep = np.ones(len(units), dtype=bool)
        heavy = np.flatnonzero(counts > self.max_rows)
        if not len(heavy):
            return keep
        order = np.argsort(inverse, kind="stable")  # the rows of each group, in input order
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for g in heavy:
            rows = order[starts[g] : starts[g] + counts[g]]
            block = spec.block_id(block_keys[groups[g] // len(unit_names)])
            unit = unit_names[groups[g] % len(unit_names)]
            chosen = self._chosen(block, unit, counts[g])
            keep[rows] = False
            keep[rows[chosen]] = True
        return keep

    def _chosen(self, block: str, unit: str, n: int):
        """The K occurrence numbers (of 0..n-1) kept of ``unit``'s n rows in ``block``: a permutation's first K,
        drawn by a generator seeded with HMAC-SHA256(key, [block, unit]). Depends on n and the unit alone."""
        seed = hmac.digest(self.key, json.dumps([block, unit]).encode(), "sha256")
        return np.random.default_rng(int.from_bytes(seed[:16], "big")).permutation(int(n))[: self.max_rows]


def _arrow_mask(mask):
    import pyarrow as pa

    return pa.array(mask, type=pa.bool_())


def bound_key(keyring, stream: str) -> bytes:
    """The stream's bounding key: HMAC-SHA256 under the key ring's content-digest key of a label and the stream."""
    return hmac.digest(keyring.content_key, BOUND_LABEL + stream.encode(), hashlib.sha256)


def stream_bound(ledger, stream: str) -> UnitBound | None:
    """The ``UnitBound`` of ``stream`` (None for unit = row); UnknownStream if there is no such stream."""
    s = ledger.stream(stream)
    if s.privacy_unit is None:
        return None
    return UnitBound(s.privacy_unit, s.unit_rows, bound_key(ledger.keyring, stream))


def unit_user_column(bound: UnitBound | None, user_column: str | None) -> str | None:
    """The column ``--block-by user`` shards by on a stream with ``bound``: the privacy unit column (the default
    when none is given), so a unit's rows never straddle two shards; InputError for another column."""
    if bound is None:
        return user_column
    if user_column not in (None, bound.column):
        raise InputError(
            f"--user-column {user_column!r} differs from the stream's privacy unit {bound.column!r}: "
            "shards of another column would split a unit's rows over blocks; give --user-column "
            f"{bound.column} (or leave it out)"
        )
    return bound.column


def check_schema(bound: UnitBound | None, schema) -> None:
    """InputError, before a record is written, if the stream's unit column is not a column of the input."""
    if bound is not None and bound.column not in schema:
        raise InputError(
            f"privacy unit column {bound.column!r} is not in the input (columns: {', '.join(schema)}): "
            "ingest records that name their unit, or create the stream with the unit column they have "
            "(sage ledger init --privacy-unit)"
        )
