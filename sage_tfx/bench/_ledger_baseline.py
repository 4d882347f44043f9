"""`sage bench ledger`'s baseline and set-up, shared by its figures: the bare SQLite transaction a grant is
compared with (one UPDATE of ``spent`` per block, the ledger's pragmas) and the bench stream every grant is
admitted on."""

import json
import sqlite3

LEDGER_PRAGMAS = ("journal_mode=WAL", "synchronous=FULL", "busy_timeout=120000")


def connect_bare(path, checkpoint=True):
    """A connection to ``path`` with the ledger's pragmas (autocheckpoint off when ``checkpoint`` is False)."""
    conn = sqlite3.connect(path, timeout=120.0, isolation_level=None)
    for pragma in LEDGER_PRAGMAS:
        conn.execute(f"PRAGMA {pragma}")
    if not checkpoint:
        conn.execute("PRAGMA wal_autocheckpoint=0")
    return conn


def create_bare_blocks(conn, blocks):
    """The baseline's table: one row per block id, ``spent`` as the ledger stores it."""
    conn.execute("CREATE TABLE blocks (id TEXT PRIMARY KEY, spent TEXT NOT NULL)")
    conn.executemany("INSERT INTO blocks VALUES (?, ?)", [(b, "[0.0, 0.0]") for b in blocks])


def bare_transaction(conn, blocks, i):
    """The baseline transaction number ``i``: every block's ``spent`` updated, one UPDATE each."""
    value = json.dumps([float(i), 0.0])
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("UPDATE blocks SET spent = ? WHERE id = ?", [(value, b) for b in blocks])
    conn.execute("COMMIT")


def prepare_stream(ledger, stream, blocks):
    """``stream`` with ``blocks`` and a budget no grant of the run can exhaust: every grant is admitted and
    charged."""
    ledger.create_stream(stream, 1e12, 0.5, min_epsilon=1e-9, max_epsilon=1e12)
    for b in blocks:
        ledger.add_block(stream, b)
