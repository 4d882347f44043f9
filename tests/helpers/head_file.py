"""What the head-file suites share (tests/privacy/test_head_sync.py, tests/privacy/test_head_use.py, tests/privacy/test_rollback.py): a small
SQLite ledger with one stream of ``blocks`` blocks, the log's last sequence number read behind the ledger's back, and
a copy of the database taken and put back as a writer of it alone can."""

import os
import sqlite3

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


def backup(path, to):
    """A consistent copy of the ledger's database at ``path`` as of now (SQLite's online backup)."""
    src, dst = sqlite3.connect(path), sqlite3.connect(to)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def restore(path, copy):
    """Put ``copy`` back as the ledger's database (no ledger open on it): WAL and shared memory go with it."""
    for suffix in ("-wal", "-shm"):
        if os.path.exists(str(path) + suffix):
            os.remove(str(path) + suffix)
    with open(copy, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data)
