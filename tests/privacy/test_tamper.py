"""The security review's 14 tamper cases: a writer of the database WITHOUT the key file edits
the ledger behind its back; ``audit_ledger`` (``sage ledger audit``) must name every one. No TensorFlow."""

import json
import os
import sqlite3

import pytest

from sage_tfx.privacy import Ledger, LedgerRollback
from sage_tfx.privacy.chain import GENESIS, canonical, chain_hash


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv("SAGE_KEY_FILE", raising=False)


def honest(path):
    with Ledger.open(path, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.register("s", "p")
        ledger.register("s", "q")
        ledger.add_block("s", "b0", start=0.0, end=86400.0, rows=10, digest="aa")
        ledger.add_block("s", "b1", start=86400.0, end=172800.0, rows=20, digest="bb")
        g1 = ledger.request("p", "s", blocks=["b0", "b1"], epsilon=0.2)
        ledger.record_outcome(g1.id, "RETRY")
        ledger.finish("s", "q", "TIMEOUT")
        g2 = ledger.request("p", "s", blocks=["b1"], epsilon=0.1)
        ledger.release(g2, "training", "c", 0.1)
        report = ledger.audit()
        assert report.ok, report.problems
    return g2


def sql(path, statement, params=()):
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(statement, params).fetchall()
        conn.commit()
        return rows
    finally:
        conn.close()


def rechain(path):
    """Recompute the whole chain as a writer without the key can: the unkeyed SHA-256 of schema 3."""
    prev = GENESIS
    for seq, kind, body in sql(path, "SELECT seq, kind, body FROM log ORDER BY seq"):
        value = chain_hash(prev, seq, kind, body)
        sql(path, "UPDATE log SET prev = ?, hash = ? WHERE seq = ?", (prev, value, seq))
        prev = value


def last_grant_seq(path):
    return sql(path, "SELECT max(seq) FROM log WHERE kind = 'grant'")[0][0]


def t_chain_recomputed(path, grant):
    seq = last_grant_seq(path)
    body = json.loads(sql(path, "SELECT body FROM log WHERE seq = ?", (seq,))[0][0])
    body["cost"] = [0.0, 0.0]
    sql(path, "UPDATE log SET body = ? WHERE seq = ?", (canonical(body), seq))
    rechain(path)
    return "keyed hash chain broken"


def t_last_grant_truncated(path, grant):
    """The last grant removed cleanly everywhere: its log tail, row, release, and its charge on the block."""
    seq = last_grant_seq(path)
    sql(path, "DELETE FROM log WHERE seq >= ?", (seq,))
    sql(path, "DELETE FROM grants WHERE id = ?", (grant.id,))
    sql(path, "DELETE FROM releases WHERE grant_id = ?", (grant.id,))
    spent = sql(path, "SELECT spent FROM blocks WHERE id = 'b0'")[0][0]
    sql(path, "UPDATE blocks SET spent = ? WHERE id = 'b1'", (spent,))
    used = sql(path, "SELECT used FROM reservations WHERE block = 'b0' AND pipeline = 'p'")[0][0]
    sql(path, "UPDATE reservations SET used = ? WHERE block = 'b1' AND pipeline = 'p'", (used,))
    return "removed from its tail"


def t_log_body_edited(path, grant):
    seq = last_grant_seq(path)
    body = json.loads(sql(path, "SELECT body FROM log WHERE seq = ?", (seq,))[0][0])
    body["epsilon"] = 0.01
    sql(path, "UPDATE log SET body = ? WHERE seq = ?", (canonical(body), seq))
    return f"log entry {seq} (grant): keyed hash chain broken"


def t_log_reordered(path, grant):
    rows = sql(path, "SELECT seq, kind, body FROM log WHERE seq IN (3, 4) ORDER BY seq")
    (s1, k1, b1), (s2, k2, b2) = rows
    sql(path, "UPDATE log SET kind = ?, body = ? WHERE seq = ?", (k2, b2, s1))
    sql(path, "UPDATE log SET kind = ?, body = ? WHERE seq = ?", (k1, b1, s2))
    return "log entry 3"


def t_forged_zero_cost_grant(path, grant):
    body = dict(grant.body(), id="g-" + "f" * 24, epsilon=0.0, cost=[0.0, 0.0])
    sql(
        path,
        "INSERT INTO grants (id, stream, pipeline, body, signature, created) VALUES (?, ?, ?, ?, ?, ?)",
        (body["id"], "s", "p", canonical(body), "00" * 32, body["created"]),
    )
    return f"grant {body['id']!r} is in the table but not in the log"


def t_grant_epsilon_edited(path, grant):
    body = json.loads(sql(path, "SELECT body FROM grants WHERE id = ?", (grant.id,))[0][0])
    body["epsilon"] = 5.0
    sql(path, "UPDATE grants SET body = ? WHERE id = ?", (canonical(body), grant.id))
    return f"grant {grant.id!r}: the table's record differs from the log's"


def t_grant_row_deleted(path, grant):
    sql(path, "DELETE FROM grants WHERE id = ?", (grant.id,))
    return f"grant {grant.id!r} is in the log but missing from the table"


def t_reservation_edited(path, grant):
    sql(path, "UPDATE reservations SET reserved = ? WHERE block = 'b1' AND pipeline = 'p'", (json.dumps([0.9, 1e-6]),))
    return "reservation of block 'b1' of stream 's' for pipeline 'p'"


def t_pipeline_edited(path, grant):
    sql(path, "UPDATE pipelines SET state = 'waiting', outcome = NULL WHERE name = 'q'")
    return "pipeline 'q' of stream 's': table says (state, outcome)=('waiting', None)"


def t_block_window_edited(path, grant):
    sql(path, "UPDATE blocks SET end_ts = 90000.0 WHERE id = 'b0'")
    return "block 'b0' of stream 's': table says (start, end, shard, created, rows, digest)=(0.0, 90000.0"


def t_block_rows_edited(path, grant):
    sql(path, "UPDATE blocks SET n_rows = 11 WHERE id = 'b0'")
    return "block 'b0' of stream 's': table says (start, end, shard, created, rows, digest)"


def t_block_digest_edited(path, grant):
    sql(path, "UPDATE blocks SET digest = 'cc' WHERE id = 'b1'")
    return "'cc')"


def t_stream_epsilon_edited(path, grant):
    sql(path, "UPDATE streams SET epsilon = 10.0 WHERE name = 's'")
    return "stream 's': the table's epsilon differ from the log's"


def t_meta_secret_reinserted(path, grant):
    sql(path, "INSERT INTO meta (key, value) VALUES ('secret', ?)", ("ab" * 32,))
    return "meta holds a 'secret'"


def t_schema_version_edited(path, grant):
    # the current version spelled differently ('04'): opened as is, not migrated, and named by the audit
    from sage_tfx.privacy.store import SCHEMA_VERSION

    sql(path, "UPDATE meta SET value = ? WHERE key = 'schema_version'", (f"0{SCHEMA_VERSION}",))
    return f"meta's schema_version is '0{SCHEMA_VERSION}'"


CASES = [
    t_chain_recomputed,
    t_last_grant_truncated,
    t_log_body_edited,
    t_log_reordered,
    t_forged_zero_cost_grant,
    t_grant_epsilon_edited,
    t_grant_row_deleted,
    t_reservation_edited,
    t_pipeline_edited,
    t_block_window_edited,
    t_block_rows_edited,
    t_block_digest_edited,
    t_stream_epsilon_edited,
    t_meta_secret_reinserted,
    t_schema_version_edited,
]


@pytest.mark.parametrize("tamper", CASES, ids=[c.__name__[2:] for c in CASES])
def test_audit_catches_a_writer_without_the_key(tmp_path, tamper):
    path = str(tmp_path / "ledger.db")
    grant = honest(path)
    expected = tamper(path, grant)
    with Ledger.open(path, check_head=False) as ledger:  # as `sage ledger audit`: reported, not refused
        report = ledger.audit()
    assert not report.ok
    assert any(expected in p for p in report.problems), report.problems
    from sage_tfx.cli import main

    assert main(["ledger", "audit", "--db", path]) == 1


def test_a_log_ahead_of_the_head_under_the_key_is_accepted_and_said(tmp_path):
    """A crash between a commit and the head write: the entries verify under the key, so they are accepted."""
    path = str(tmp_path / "ledger.db")
    honest(path)
    with open(path + ".key.head", "rb") as f:
        head = f.read()
    with Ledger.open(path) as ledger:
        ledger.add_block("s", "b2", start=172800.0, end=259200.0, rows=1)
    with open(path + ".key.head", "wb") as f:  # as if the head write had not happened
        f.write(head)
    with Ledger.open(path) as ledger:
        report = ledger.audit()
    assert report.ok, report.problems
    assert any("after the head file's entry" in n for n in report.notes)


def test_a_missing_head_record_is_a_problem(tmp_path):
    path = str(tmp_path / "ledger.db")
    honest(path)
    os.unlink(path + ".key.head")
    with pytest.raises(LedgerRollback, match="has no record of this ledger"):
        Ledger.open(path)
    with Ledger.open(path, check_head=False) as ledger:
        assert any("has no record of this ledger" in p for p in ledger.audit().problems)
