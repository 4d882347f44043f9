"""Which block each record falls in: a time window, or a keyed user shard.

Both rules look at one record only, so a record's block never depends on the
other records (a block is a disjoint part of the stream, the Sage paper §4):

* time: window k = floor(t / window) for t in unix seconds (UTC-aligned), the
  block id is the window start, e.g. ``2014-05-16.1d`` or ``2014-05-16T19:00.1h``;
* user: shard = keyed BLAKE2b(user value) mod N, the block id ``shard-0003-of-0016``.
  The key (default: the stream name) makes shards stable across ingests and
  independent of everything but the user's own value.
"""

import datetime as _dt
import hashlib
import re

import numpy as np

from sage_tfx.privacy.blocks import DATE_MIN

from .records import TIME_MIN, InputError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
# The longest window: every block of a record time in [1000-01-01, 9000-01-01) then lies inside what a date can
# name (the ledger's bound on block windows), about 999 years
MAX_WINDOW = TIME_MIN - int(DATE_MIN)


def parse_window(text):
    """'1d', '6h', '30m', '90s', '1w' -> seconds (an integer > 0)."""
    m = _WINDOW.match(str(text))
    if not m:
        raise InputError(f"window {text!r} is invalid: use a positive number and a unit s, m, h, d or w (e.g. 1d)")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0 or seconds != int(seconds):
        raise InputError(f"window {text!r} is invalid: it must be a whole number of seconds > 0")
    if seconds > MAX_WINDOW:
        raise InputError(
            f"window {text!r} is invalid: at most {window_text(MAX_WINDOW)} ({MAX_WINDOW} s, about 999 "
            "years), so that every block of a record time in [1000-01-01, 9000-01-01) is a date range"
        )
    return int(seconds)


def window_text(seconds):
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


class TimeBlocks:
    """Blocks of ``window`` seconds by the time column ``column``."""

    by = "time"

    def __init__(self, column, window):
        self.column = column
        self.window = parse_window(window) if isinstance(window, str) else int(window)
        if not 0 < self.window <= MAX_WINDOW:
            raise InputError(
                f"window {window!r} is invalid: it must be > 0 seconds and at most "
                f"{window_text(MAX_WINDOW)} ({MAX_WINDOW} s, about 999 years)"
            )

    def describe(self):
        return {"by": "time", "column": self.column, "window": self.window}

    def keys(self, batch):
        """Window index of every row (int64 numpy array)."""
        return seconds(batch, self.column) // self.window

    def block_id(self, key):
        start = _dt.datetime.fromtimestamp(int(key) * self.window, _dt.UTC)
        stamp = start.strftime("%Y-%m-%d") if self.window % 86400 == 0 else start.strftime("%Y-%m-%dT%H:%M")
        if self.window % 60:
            stamp = start.strftime("%Y-%m-%dT%H:%M:%S")
        return f"{stamp}.{window_text(self.window)}"

    def ledger_key(self, key):
        return {"start": float(int(key) * self.window), "end": float((int(key) + 1) * self.window)}


class UserShards:
    """``shards`` blocks by a keyed hash of the user column ``column``."""

    by = "user"

    def __init__(self, column, shards, hash_key):
        if isinstance(shards, bool) or not isinstance(shards, int) or shards <= 0:
            raise InputError(f"shards {shards!r} is invalid: it must be an integer > 0")
        if not hash_key:
            raise InputError("the user-shard hash key is empty")
        self.column = column
        self.shards = shards
        self.hash_key = hash_key.encode() if isinstance(hash_key, str) else bytes(hash_key)

    def describe(self):
        return {"by": "user", "column": self.column, "shards": self.shards}

    def shard_of(self, value):
        digest = hashlib.blake2b(str(value).encode(), key=self.hash_key[:64], digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.shards

    def keys(self, batch):
        values = _scalar_column(batch, self.column)
        if values.null_count:
            raise InputError(
                f"user column {self.column!r} is empty in {values.null_count} record(s): every record needs a user"
            )
        uniq, inverse = np.unique(np.asarray(values.to_pylist(), dtype=object).astype(str), return_inverse=True)
        return np.array([self.shard_of(u) for u in uniq], dtype=np.int64)[inverse]

    def block_id(self, key):
        width = max(4, len(str(self.shards - 1)))
        return f"shard-{int(key):0{width}d}-of-{self.shards:0{width}d}"

    def ledger_key(self, key):
        return {"shard": int(key)}


def _scalar_column(batch, column):
    import pyarrow as pa
    import pyarrow.compute as pc

    if column not in batch.schema.names:
        raise InputError(f"column {column!r} is not in the input (columns: {', '.join(batch.schema.names)})")
    col = batch.column(column)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        lengths = pc.fill_null(pc.list_value_length(col), 0)
        if pc.any(pc.not_equal(lengths, 1)).as_py():
            bad = int(np.flatnonzero(np.asarray(lengths) != 1)[0])
            raise InputError(
                f"column {column!r} must hold exactly one value per record (record {bad} has {lengths[bad].as_py()})"
            )
        col = pc.list_flatten(col)
    return col


def seconds(batch, column):
    """The time column as int64 unix seconds; a clear error for empty or unparseable values."""
    import pyarrow as pa

    col = _scalar_column(batch, column)
    if col.null_count:
        row = int(np.flatnonzero(~np.asarray(col.is_valid()))[0])
        raise InputError(
            f"time column {column!r} is empty in {col.null_count} record(s) (first: record {row}): "
            "every record needs a time"
        )
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return np.asarray(col.cast(pa.timestamp("s")).cast(pa.int64()), dtype=np.int64)
    if pa.types.is_integer(t):
        return np.asarray(col, dtype=np.int64)
    if pa.types.is_floating(t):
        values = np.asarray(col, dtype=np.float64)
        bad = ~np.isfinite(values)
        if bad.any():
            raise InputError(f"time column {column!r} has a non-finite value {values[bad][0]!r}")
        return np.floor(values).astype(np.int64)
    values = np.asarray(col.cast(pa.string()).to_pylist(), dtype=object)
    try:
        parsed = values.astype(str).astype("datetime64[s]")
    except ValueError:
        for v in values:
            try:
                np.datetime64(str(v), "s")
            except ValueError:
                raise InputError(
                    f"time column {column!r} has an unparseable timestamp {v!r} (use unix seconds or ISO 8601)"
                ) from None
        raise
    if np.isnat(parsed).any():
        raise InputError(f"time column {column!r} has an unparseable timestamp {values[np.isnat(parsed)][0]!r}")
    return parsed.astype(np.int64)
