"""Small real ledgers for the tests: one stream ``s`` of daily blocks."""

from sage_tfx.privacy import Ledger

DAY = 86400


def daily_ledger(tmp_path, blocks, *, epsilon, delta, rows, ids="b{:03d}", **stream_options):
    """A new ledger at ``tmp_path/ledger.db`` with stream ``s`` and ``blocks`` daily blocks of ``rows`` rows each.

    Args:
        tmp_path: the folder of the ledger file.
        blocks: how many blocks; block i is day i (start i * DAY, end (i + 1) * DAY), named ``ids.format(i)``.
        epsilon, delta: the stream's budget per block.
        rows: each block's row count.
        **stream_options: passed to ``Ledger.create_stream`` (``policy``, ``accounting``, ``min_epsilon``, ...).
    """
    ledger = Ledger.open(str(tmp_path / "ledger.db"), create=True)
    ledger.create_stream("s", epsilon, delta, **stream_options)
    for i in range(blocks):
        ledger.add_block("s", ids.format(i), start=i * DAY, end=(i + 1) * DAY, rows=rows)
    return ledger
