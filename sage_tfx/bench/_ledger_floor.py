"""`sage bench ledger`'s ``grant_floor``: where one grant's CPU goes, against the bare transaction's.

In this process, on fresh SQLite files in ``--db-dir``, ``--floor-grants`` grants of ``--blocks`` blocks (one
writer; 0: skip it):

- ``grant_statements``: every SQL statement one ``Ledger.request`` runs, BEGIN and COMMIT included, as the store
  executes them (placeholders, no values); ``bare_statements``: the bare transaction's.
- ``wal_pages``: WAL pages written per grant and per bare transaction (the ``-wal`` file's growth over the grants,
  checkpointing off, in pages of the database's page size plus the frame header).
- ``cpu_ms``: CPU time per operation (user and system of this process, so the kernel's part of the fsync counts),
  in ``--repeats`` rounds taking turns, min / median / max over the rounds, of
  ``bare`` (the bench's baseline transaction), ``grant_sql`` (the grants' own statements with the parameters they
  ran with, recorded from real ``Ledger.request`` calls and run again by a bare ``sqlite3`` connection on a copy
  of the ledger taken before them: the same SQL, rows and values, with none of the ledger's Python), ``head_write``
  (a grant's head-file write, ``use`` mode: slot C, no fdatasync) and ``grant`` (the whole ``Ledger.request``).
- ``cpu_ratio_ceiling``: bare / (grant_sql + head_write), medians: the CPU ratio a ledger writing exactly these
  statements reaches with no Python at all; ``python_ms``: grant - grant_sql - head_write, the rest (checks,
  filters, signing, the chained entry, the head file's bookkeeping).
"""

import os
import resource
import shutil
import statistics
import uuid

from sage_tfx.bench._ledger_baseline import bare_transaction, connect_bare, create_bare_blocks, prepare_stream
from sage_tfx.bench._ledger_growth import remove_ledger_files
from sage_tfx.bench._ledger_storage import _timed_head_writes

WARM_UP = 5  # grants (and bare transactions) before anything is timed or counted
_WAL_FRAME_HEADER = 24  # bytes before each page in a -wal file


class _Recording:
    """A store connection that records every statement run through it, with its parameters (``log``)."""

    def __init__(self, conn, log):
        self._conn, self._log = conn, log

    def execute(self, text, params=()):
        self._log.append((text, tuple(params)))
        return self._conn.execute(text, params)

    def cursor(self):
        return _Recording(self._conn.cursor(), self._log)

    def __getattr__(self, name):  # fetchone, fetchall, in_transaction, close ...
        return getattr(self._conn, name)


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _per_op(ops, count):
    """CPU ms per call of ``ops(i)`` over ``count`` calls."""
    start = _cpu()
    for i in range(count):
        ops(i)
    return 1e3 * (_cpu() - start) / count


def _replayer(conn, grants):
    """``replay(i)``: the ``i``-th recorded grant's statements on ``conn``, each fetched as the ledger fetched it."""

    def replay(i):
        for text, params in grants[i]:
            conn.execute(text, params).fetchall()

    return replay


def _bare(conn, blocks):
    return lambda i: bare_transaction(conn, blocks, i)


def _wal_pages(path, conn, ops, count):
    """WAL pages per call of ``ops(i)`` over ``count`` calls (after one), checkpointing off on ``conn``."""
    ops(0)
    page = conn.execute("PRAGMA page_size").fetchone()[0] + _WAL_FRAME_HEADER
    before = os.path.getsize(path + "-wal")
    for i in range(1, count + 1):
        ops(i)
    return round((os.path.getsize(path + "-wal") - before) / page / count, 2)


def _record_grants(ledger, stream, blocks, count):
    """``count`` real grants, each one's statements as the store ran them: [[(sql, params), ...], ...]."""
    store = ledger.store
    conn, grants = store._conn, []  # the bench wraps the store's connection while it records; nothing else
    try:
        for _ in range(count):
            log: list = []
            store._conn = _Recording(conn, log)
            ledger.request("floor", stream, blocks=blocks, epsilon=1.0)
            grants.append(log)
    finally:
        store._conn = conn
    return grants


def _spread(values):
    return [round(min(values), 4), round(statistics.median(values), 4), round(max(values), 4)]


def _measure_floor(db_dir, block_count, count, rounds):
    """The ``grant_floor`` figure (module docstring) on fresh files in ``db_dir``."""
    from sage_tfx.privacy import Ledger
    from sage_tfx.privacy.head_file import HeadSync

    run_id = uuid.uuid4().hex[:12]
    path, before, copy, bare_path = (
        os.path.join(db_dir, f"floor-{k}-{run_id}.db") for k in ("ledger", "before", "copy", "bare")
    )
    blocks = [f"b{i:03d}" for i in range(block_count)]
    with Ledger.open(path, create=True, head_sync=HeadSync.USE) as ledger:
        prepare_stream(ledger, "bench", blocks)
        for _ in range(WARM_UP):
            ledger.request("floor", "bench", blocks=blocks, epsilon=1.0)
    shutil.copyfile(path, before)  # closed: its WAL checkpointed into the file
    bare_conn = connect_bare(bare_path)
    create_bare_blocks(bare_conn, blocks)
    bare = _bare(bare_conn, blocks)
    cpu: dict[str, list[float]] = {"bare": [], "grant_sql": [], "head_write": [], "grant": []}
    with Ledger.open(path, head_sync=HeadSync.USE) as ledger:
        recorded = _record_grants(ledger, "bench", blocks, count + 1)
        grant = lambda i: ledger.request("floor", "bench", blocks=blocks, epsilon=1.0)  # noqa: E731
        for _ in range(rounds):
            for i in range(WARM_UP):
                bare(i)
            cpu["bare"].append(_per_op(bare, count))
            shutil.copyfile(before, copy)
            with_copy = connect_bare(copy)
            cpu["grant_sql"].append(_per_op(_replayer(with_copy, recorded), count))
            with_copy.close()
            remove_ledger_files(copy)
            cpu["head_write"].append(
                _timed_head_writes(
                    db_dir, count, HeadSync.USE, lambda head, seq: head.advance("bench", seq, "0" * 64, until_use=True)
                )[1]
            )
            cpu["grant"].append(_per_op(grant, count))
        audit_ok = ledger.audit().ok
    shutil.copyfile(before, copy)
    with_copy = connect_bare(copy, checkpoint=False)
    grant_pages = _wal_pages(copy, with_copy, _replayer(with_copy, recorded), count)
    with_copy.close()
    bare_conn.close()
    bare_conn = connect_bare(bare_path, checkpoint=False)
    bare_pages = _wal_pages(bare_path, bare_conn, _bare(bare_conn, blocks), count)
    bare_conn.close()
    remove_ledger_files(path, before, copy, bare_path)
    medians = {k: statistics.median(v) for k, v in cpu.items()}
    floor = medians["grant_sql"] + medians["head_write"]
    return {
        "blocks_per_grant": block_count,
        "grants_per_round": count,
        "rounds": rounds,
        "grant_statements": [text for text, _params in recorded[0]],
        "bare_statements": ["BEGIN IMMEDIATE", f"UPDATE blocks SET spent = ? WHERE id = ? (x{block_count})", "COMMIT"],
        "wal_pages": {"grant": grant_pages, "bare": bare_pages},
        "cpu_ms": {k: _spread(v) for k, v in cpu.items()},
        "cpu_ms_is": "per operation, min / median / max over the rounds (user and system time of this process)",
        "python_ms": round(medians["grant"] - floor, 4),
        "cpu_ratio": round(medians["bare"] / medians["grant"], 3),
        "cpu_ratio_ceiling": round(medians["bare"] / floor, 3),
        "audit_ok": audit_ok,
    }
