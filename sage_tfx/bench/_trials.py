"""What the release benchmarks' trials share: a fresh ledger holding the same blocks in several streams, and a
reader that opens a block only under a grant the ledger recorded."""

import os
from collections.abc import Callable, Sequence
from typing import Any


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
