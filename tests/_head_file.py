"""What the head-file suites share (tests/test_head_sync.py, tests/test_head_use.py): a small SQLite ledger with one
stream of ``blocks`` blocks, and the log's last sequence number read behind the ledger's back."""
from sage_tfx.privacy import Ledger


def small_ledger(path, blocks=4):
    ledger = Ledger.open(path, create=True)
    ledger.create_stream("s", 1000.0, 1e-6, min_epsilon=1e-6, max_epsilon=1000.0)
    for i in range(blocks):
        ledger.add_block("s", f"b{i}")
    return ledger


def last_seq(ledger):
    with ledger._store.transaction(write=False) as tx:
        return tx.one("SELECT seq FROM log ORDER BY seq DESC LIMIT 1")[0]
