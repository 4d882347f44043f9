"""A fixed scenario on a fixed clock, fixed ids and a fixed key leaves exactly the stored tables and log recorded in
tests/data/ledger_snapshot.json, on both backends (moving the ledger's SQL and splitting its module
must change no stored byte).

The scenario touches every write path of the ledger: streams of each accounting and a queued policy, blocks keyed by
window, shard and digest, registrations and reservations, grants from a pipeline's own reservation and from the pool,
a refusal, retirement, a split grant's releases, outcomes, a finish that redistributes, and a queued demand that is
admitted and collected. Randomness (``secrets.token_bytes``/``token_hex``: the key, the ledger id, grant ids) and the
clock (``time.time``, set before each operation) are fixed, so every column, signatures and chain values included,
is determined. The snapshot was recorded at commit b5b8b03 (before the split) with ``SAGE_SNAPSHOT_WRITE=1``, and
recorded again for schema 7 (its rdp stream now stores its delta split, query_delta_share 0.5: the stream row, its
log entry, schema_version and the reservation shares that follow from the split changed; nothing else), and again
when rdp grants began to record what was asked apart from the conversion (the two rdp grants' epsilon and their
converted_epsilon: their rows, their log entries and the chain values from there on changed; nothing else), and
for schema 8 (its rdp stream splits its conversion delta over its orders, split_orders 1: the streams' rows, the
rdp stream's log entry and the chain values from there on, schema_version and the rdp reservation share that
follows from the split changed; nothing else), and again
when every ledger began binding its id in a keyed first log entry (the ``ledger`` entry 1: every later entry's
sequence number one higher, its chain values and the queued demand's log sequence number changed; nothing else),
and with it for the record split every grant with a split now signs (``meta["records"]``: the grants' rows,
their log entries and the chain values from there on changed; nothing else), and for schema 9 (each stream's
privacy unit and bound, NULL on the scenario's streams, whose unit is the row: the streams' rows gained two NULL
columns and schema_version changed; nothing else), and for schema 10 (every log entry's chain value binds its time:
the log's chain values and schema_version changed; nothing else). The schema-9 recording is kept
(tests/data/ledger_snapshot_v9.json): an old ledger, which only ``sage ledger upgrade`` opens, then audits OK.
"""

import json
import os
import pathlib
import secrets
import sqlite3
import time

import pytest

from sage_tfx.cli import main
from sage_tfx.privacy import BudgetRefused, BudgetSplit, ChargeRule, Ledger, LedgerUpgradeNeeded
from sage_tfx.privacy.head_file import HeadFile

SNAPSHOT = pathlib.Path(__file__).parents[1] / "data" / "ledger_snapshot.json"
SNAPSHOT_V9 = pathlib.Path(__file__).parents[1] / "data" / "ledger_snapshot_v9.json"  # the scenario at schema 9
TABLES = {  # every table, each in a total order of its key
    "meta": "SELECT key, value FROM meta ORDER BY key",
    "streams": "SELECT * FROM streams ORDER BY name",
    "blocks": "SELECT * FROM blocks ORDER BY stream, id",
    "pipelines": "SELECT * FROM pipelines ORDER BY stream, name",
    "reservations": "SELECT * FROM reservations ORDER BY stream, block, pipeline",
    "grants": "SELECT * FROM grants ORDER BY id",
    "demands": "SELECT * FROM demands ORDER BY stream, pipeline",
    "releases": "SELECT * FROM releases ORDER BY grant_id, stage",
    "outcomes": "SELECT * FROM outcomes ORDER BY grant_id",
    "log": "SELECT * FROM log ORDER BY seq",
}


class _Fixed:
    """Deterministic stand-ins: a clock the scenario sets, and counters for random bytes and hex ids."""

    def __init__(self):
        self.now, self.n = 1_700_000_000.0, 0

    def time(self):
        return self.now

    def token_bytes(self, k=32):
        self.n += 1
        return bytes((self.n * 7 + i) % 256 for i in range(k))

    def token_hex(self, k=32):
        return self.token_bytes(k).hex()


def _scenario(ledger, clock):
    def at(t):
        clock.now = 1_700_000_000.0 + t

    at(1)
    ledger.create_stream("s", 1.0, 1e-5, min_epsilon=0.25)
    at(2)
    ledger.create_stream("r", 2.0, 1e-6, accounting="rdp", policy="aggressive")
    at(3)
    ledger.create_stream("q", 1.0, 1e-6, policy="dpf-n", policy_params={"n": 4}, min_epsilon=0.01)
    at(4)
    ledger.add_blocks(
        "s",
        [
            {"id": "w0", "start": 0.0, "end": 10.0, "rows": 5, "digest": "ab01"},
            {"id": "w1", "start": 10.0, "end": 20.0, "rows": 7},
        ],
    )
    at(5)
    ledger.register("s", "p")
    ledger.register("s", "o")
    at(6)
    ledger.add_blocks("s", [{"id": "w2", "start": 20.0, "end": 30.0}, {"id": "w3", "start": 30.0, "end": 40.0}])
    at(7)
    g1 = ledger.request("p", "s", blocks=["w3", "w0", "w2"], epsilon=0.5)  # own (w2, w3) and pool (w0)
    at(8)
    with pytest.raises(BudgetRefused):
        ledger.request("o", "s", blocks=["w0"], epsilon=0.75)
    at(9)
    split = BudgetSplit(0.1, 0.05, 0.15, 0.2, 1e-7, ChargeRule.SUM.value)
    g2 = ledger.request("o", "s", window=(0.0, 20.0), epsilon=0.5, delta=1e-7, split=split)  # retires w0
    at(10)
    ledger.release(g2, "preprocessing", "c-pre", 0.1)
    ledger.release(g2, "training", "c-train", 0.15, 1e-7)
    ledger.record_outcome(g1.id, "REJECT", {"loss": 0.5})
    ledger.record_outcome(g2.id, "ACCEPT")
    at(11)
    ledger.finish("s", "p", "ACCEPT")  # p's unused reservation on w2, w3 goes to o
    at(12)
    ledger.add_blocks("r", [{"id": f"k{i}", "shard": i} for i in range(3)])
    at(13)
    ledger.register("r", "a")
    ledger.add_block("r", "k3", shard=3)
    ledger.request("a", "r", blocks=["k0", "k3"], epsilon=0.5, delta=1e-8)
    ledger.request("a", "r", blocks=["k1"], curve={o: 0.01 * o for o in ledger.stream("r").orders})
    at(14)
    ledger.add_blocks("q", [{"id": "b0"}, {"id": "b1"}])
    ledger.register("q", "x")
    with pytest.raises(BudgetRefused):
        ledger.request("x", "q", blocks=["b0", "b1"], epsilon=0.4)  # recorded as x's demand
    at(15)
    ledger.register("q", "y")  # an arrival: x's demand is admitted and charged
    at(16)
    ledger.request("x", "q", blocks=["b0", "b1"], epsilon=0.4)  # collected
    at(17)
    ledger.finish("q", "y", "TIMEOUT")
    at(18)
    with pytest.raises(BudgetRefused):
        ledger.request("z", "q", blocks=["b1"], epsilon=0.5)  # a pending demand stays in the table


def _dump(ledger):
    out = {}
    with ledger.store.transaction(write=False) as tx:
        for table, query in TABLES.items():
            out[table] = [[float(v) if isinstance(v, float) else v for v in row] for row in tx.all(query)]
    return json.loads(json.dumps(out))


def test_a_fixed_scenario_stores_the_recorded_tables_and_log(ledger_url, monkeypatch):
    fixed = _Fixed()
    monkeypatch.setattr(secrets, "token_bytes", fixed.token_bytes)
    monkeypatch.setattr(secrets, "token_hex", fixed.token_hex)
    monkeypatch.setattr(time, "time", fixed.time)
    ledger = Ledger.open(ledger_url, create=True)
    try:
        _scenario(ledger, fixed)
        dump = _dump(ledger)
        report = ledger.audit()
    finally:
        ledger.close()
    assert report.ok, report.problems
    if os.environ.get("SAGE_SNAPSHOT_WRITE") and not SNAPSHOT.exists():
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(dump, indent=1, sort_keys=True) + "\n")
    expected = json.loads(SNAPSHOT.read_text())
    assert sorted(dump) == sorted(expected)
    for table in TABLES:  # one table at a time: a difference names its table
        assert dump[table] == expected[table], table


def _old_ledger(tmp_path, monkeypatch):
    """The schema-9 recording as a SQLite ledger with its key file and head file: the scenario's key (fixed
    randomness), its tables replaced by the recorded rows, the head file on the recorded log's last entry."""
    fixed = _Fixed()
    monkeypatch.setattr(secrets, "token_bytes", fixed.token_bytes)
    monkeypatch.setattr(secrets, "token_hex", fixed.token_hex)
    path = str(tmp_path / "old.db")
    with Ledger.open(path, create=True) as ledger:
        ledger_id, head_path = ledger.ledger_id, ledger.head_file.path
    monkeypatch.undo()
    old = json.loads(SNAPSHOT_V9.read_text())
    conn = sqlite3.connect(path)
    for table, rows in old.items():
        conn.execute(f"DELETE FROM {table}")
        if rows:
            conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    conn.commit()
    conn.close()
    seq, chain = old["log"][-1][0], old["log"][-1][5]
    head = HeadFile(head_path)
    head.advance(ledger_id, seq, chain, reset=True)
    head.close()
    return path


def _files(folder):
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


def test_an_old_ledger_is_refused_until_upgraded_then_audits_ok(tmp_path, monkeypatch, capsys):
    path = _old_ledger(tmp_path, monkeypatch)
    before = _files(tmp_path)
    with pytest.raises(LedgerUpgradeNeeded, match="sage ledger upgrade --db"):
        Ledger.open(path)
    assert main(["ledger", "status", "--db", path, "--stream", "s"]) == 2  # refused: exit 2, naming the command
    assert main(["ledger", "audit", "--db", path]) == 2
    assert "sage ledger upgrade" in capsys.readouterr().err
    assert _files(tmp_path) == before  # nothing written by a refused open
    assert main(["ledger", "upgrade", "--db", path]) == 0
    err = capsys.readouterr().err
    assert "upgrade: schema 9 -> 10" in err and "1 step(s) run" in err
    with Ledger.open(path) as ledger:
        report = ledger.audit()
        assert report.ok, report.problems
        assert [e[2] for e in ledger.log_entries()][-1] == "upgrade"
        dump = _dump(ledger)
    old = json.loads(SNAPSHOT_V9.read_text())
    for table in TABLES:  # the upgrade changes the schema version and appends its entry; nothing else
        if table not in ("meta", "log"):
            assert dump[table] == old[table], table
    assert dump["log"][:-1] == old["log"]
    after = _files(tmp_path)
    assert main(["ledger", "upgrade", "--db", path]) == 0  # idempotent: nothing written the second time
    assert "already up to date" in capsys.readouterr().err
    assert _files(tmp_path) == after


def test_an_upgraded_ledgers_old_times_are_bound(tmp_path, monkeypatch):
    """A time written before the upgrade (a stream's created, an old entry's ts), edited after it: the audit names
    it, through the keyed upgrade entry that carries the old values."""
    path = _old_ledger(tmp_path, monkeypatch)
    assert main(["ledger", "upgrade", "--db", path]) == 0
    for statement in (
        "UPDATE streams SET created = created + 1 WHERE name = 's'",
        "UPDATE pipelines SET finished = finished - 1 WHERE finished IS NOT NULL",
        "UPDATE log SET ts = ts + 1 WHERE seq = 3",
    ):
        conn = sqlite3.connect(path)
        conn.execute("SAVEPOINT edit")
        conn.execute(statement)
        conn.commit()
        with Ledger.open(path, check_head=False) as ledger:
            report = ledger.audit()
        assert not report.ok, statement
        conn.execute(statement.replace("+ 1", "- 1") if "+ 1" in statement else statement.replace("- 1", "+ 1"))
        conn.commit()
        conn.close()
    with Ledger.open(path) as ledger:
        assert ledger.audit().ok
