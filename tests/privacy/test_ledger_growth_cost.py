"""Ledger.add_blocks costs the same on a young and on an old stream.

Counted, not timed: the SQL statements the store executes (both backends) and, on SQLite, the virtual-machine
instructions it runs (a progress handler), for the same 40-block add on a 40-block and on a 3,000-block stream.
Before the fix, the window-clash check walked every older window: its instruction count grew with the stream.
"""

import pytest

from sage_tfx.privacy import Ledger
from sage_tfx.privacy import store as ledger_store
from sage_tfx.privacy.errors import LedgerError

HOUR = 3600.0
ADD = 40  # blocks in the counted add_blocks call


def _blocks(i0, n, keyed, tag=0):
    """GENERATED block descriptions: hourly windows (or shards) with distinct content digests."""
    if keyed == "window":
        return [
            dict(id=f"b{i:06d}", start=i * HOUR, end=(i + 1) * HOUR, rows=10, digest=f"{tag:02x}{i:062x}")
            for i in range(i0, i0 + n)
        ]
    return [dict(id=f"b{i:06d}", shard=i, rows=10, digest=f"{tag:02x}{i:062x}") for i in range(i0, i0 + n)]


def _grown(location, stream, size, keyed):
    """Grow ``stream`` to ``size`` blocks, two pipelines waiting (every new block gets their reservations)."""
    with Ledger.open(location, create=True) as ledger:
        if stream not in [s.name for s in ledger.streams()]:
            ledger.create_stream(stream, 10.0, 1e-6)
            ledger.register(stream, "p1")
            ledger.register(stream, "p2")
        for i in range(0, size, 1000):
            ledger.add_blocks(stream, _blocks(i, min(1000, size - i), keyed, len(stream)))


def _count_add(ledger, stream, size, keyed, vm_steps=None):
    """Statements (and SQLite VM steps, if asked) for one add_blocks of ADD blocks after ``size`` blocks."""
    before = ledger._store.statements
    if vm_steps is not None:
        vm_steps[0] = 0

        def step():
            vm_steps[0] += 1
            return 0

        ledger._store._conn.set_progress_handler(step, 10)
    try:
        ledger.add_blocks(stream, _blocks(size, ADD, keyed, len(stream)))
    finally:
        if vm_steps is not None:
            ledger._store._conn.set_progress_handler(None, 10)
    return ledger._store.statements - before


@pytest.mark.parametrize("keyed", ["window", "shard"])
def test_add_blocks_statements_do_not_grow_with_the_stream(ledger_url, keyed):
    small, large = ADD, 3000
    _grown(ledger_url, "young", small, keyed)
    _grown(ledger_url, "old", large, keyed)
    sqlite = not ledger_url.startswith("postgres")
    with Ledger.open(ledger_url) as ledger:
        steps_young, steps_old = [0], [0]
        n_young = _count_add(ledger, "young", small, keyed, steps_young if sqlite else None)
        n_old = _count_add(ledger, "old", large, keyed, steps_old if sqlite else None)
        # the same statements whatever the stream's age: per block a clash look-up, the insert, its log entry,
        # one reservation per waiting pipeline (2) and its log entry; plus a few per call (stream, ids, digests,
        # waiting pipelines)
        assert n_young == n_old, (n_young, n_old)
        assert n_old <= 6 * ADD + 8, n_old
        if sqlite:
            # and each statement's work: an index descent grows like log(size) (75x more blocks: well under 2x
            # the instructions); the scan it replaced grew 75x.
            assert steps_old[0] <= 1.5 * steps_young[0], (steps_young[0], steps_old[0])
        for stream, size in (("young", small), ("old", large)):
            assert len(ledger.blocks(stream)) == size + ADD
        assert ledger.audit().ok


@pytest.mark.parametrize("keyed", ["window", "shard"])
def test_clash_checks_still_refuse_on_an_old_stream(ledger_url, keyed):
    """The cheaper checks refuse what the scans refused: an overlapping window (with the oldest, a middle and the
    newest block), a taken shard, an existing id; and nothing is added."""
    _grown(ledger_url, "s", 1500, keyed)
    with Ledger.open(ledger_url) as ledger:
        before = ledger._store.statements
        if keyed == "window":
            bad = [
                dict(id="x0", start=0.5 * HOUR, end=0.75 * HOUR),  # inside the oldest window
                dict(id="x1", start=700.5 * HOUR, end=701.5 * HOUR),  # across two middle windows
                dict(id="x2", start=-5 * HOUR, end=2000 * HOUR),  # covering them all
                dict(id="x3", start=1499.9 * HOUR, end=1600 * HOUR),
            ]  # the newest window's tail
            for block in bad:
                with pytest.raises(LedgerError, match="overlaps block"):
                    ledger.add_blocks("s", [*_blocks(5000, 3, keyed), block])
            # two new blocks of one call that overlap each other
            with pytest.raises(LedgerError, match="overlaps block 'y0'"):
                ledger.add_blocks(
                    "s",
                    [
                        dict(id="y0", start=9000 * HOUR, end=9002 * HOUR),
                        dict(id="y1", start=9001 * HOUR, end=9003 * HOUR),
                    ],
                )
            # touching windows do not overlap
            ledger.add_blocks("s", [dict(id="z0", start=1500 * HOUR, end=1501 * HOUR)])
        else:
            with pytest.raises(LedgerError, match="shard 700 is already block 'b000700'"):
                ledger.add_blocks("s", [*_blocks(5000, 3, keyed), dict(id="x0", shard=700)])
            ledger.add_blocks("s", [dict(id="z0", shard=1500)])
        with pytest.raises(LedgerError, match="block 'b000003' already exists"):
            ledger.add_blocks("s", [*_blocks(5000, 3, keyed), dict(id="b000003")])
        assert ledger._store.statements > before
        assert len(ledger.blocks("s")) == 1501
        assert ledger.audit().ok


def test_a_version_3_ledger_gains_the_shard_index(tmp_path):
    path = str(tmp_path / "v3.db")
    with Ledger.open(path, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b0", shard=0, rows=5)
        with ledger._store.transaction() as tx:
            tx.run("DROP INDEX blocks_shard")
            tx.run("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    Ledger.upgrade(path, progress=lambda line: None)
    with Ledger.open(path) as ledger:
        with ledger._store.transaction(write=False) as tx:
            assert (
                tx.one("SELECT value FROM meta WHERE key = 'schema_version'")[0]
                == str(ledger_store.SCHEMA_VERSION)
                == "10"
            )
            assert tx.one("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'blocks_shard'")
        ledger.add_block("s", "b1", shard=1, rows=5)
        with pytest.raises(LedgerError, match="shard 0 is already block 'b0'"):
            ledger.add_block("s", "b2", shard=0)
        assert ledger.audit().ok
