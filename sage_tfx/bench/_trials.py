"""What the release benchmarks' trials share: a fresh ledger holding the same blocks in several streams, a
reader that opens a block only under a grant the ledger recorded, and the first real taxi trips as the stream."""

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def trial_ledger(tmp: str, trial: int, streams: Sequence[str], blocks: int, rows: int, epsilon: float, delta: float):
    """A new ledger in ``tmp`` with ``streams`` of (epsilon, delta), each holding blocks b000.. of ``rows`` rows."""
    from sage_tfx.privacy import Ledger

    ledger = Ledger.open(os.path.join(tmp, f"ledger{trial}.db"), create=True)
    for stream in streams:
        ledger.create_stream(stream, epsilon, delta)
        for i in range(blocks):
            ledger.add_block(stream, f"b{i:03d}", start=i, end=i + 1, rows=rows)
    return ledger


def block_reader(ledger, data: Sequence[Any]) -> Callable[[Any], Any]:
    """A reader: a grant's one block's data (``data[i]`` for block b{i:03d})."""

    def reader(grant):
        (block,) = ledger.verify(grant).blocks  # only a recorded (charged) grant opens a block
        return data[int(block[1:])]

    return reader


def first_taxi_trips(blocks: int, rows: int) -> Any:
    """The first ``blocks * rows`` REAL taxi trips in time order (a pyarrow table); SystemExit naming --blocks and
    --rows-per-block when the data holds fewer."""
    from sage_tfx.data.taxi import TIME_COLUMN, load_taxi

    table = load_taxi().sort_by(TIME_COLUMN)
    need = blocks * rows
    if need > table.num_rows:
        raise SystemExit(
            f"--blocks {blocks} x --rows-per-block {rows} = {need} rows: the taxi data has only "
            f"{table.num_rows}; lower one of them"
        )
    return table.slice(0, need)


def numeric_column(table: Any, name: str) -> np.ndarray:
    """Column ``name`` of ``table`` as float64, a missing value as 0."""
    return np.nan_to_num(np.asarray(table.column(name).to_pylist(), dtype=np.float64))
