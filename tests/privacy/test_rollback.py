"""A writer of the database alone (no key file) rolls the ledger back: restores an old copy, cuts the last grant,
changes the unkeyed ``meta.ledger_id``, or (with write access to the key's folder) deletes the head file. Each is
refused by ``Ledger.open`` before any write, naming what was found and the fix, and named by ``sage ledger audit``
(sage_tfx/privacy/anchor.py, docs/security.md "Rollback"). Before the anchor, each let one block be charged its
whole global epsilon twice with an audit that said OK. An honest operator's way out is ``sage ledger anchor``,
explicit and logged. SQLite, no TensorFlow."""

import os
import secrets
import shutil
import sqlite3

import pytest

from sage_tfx.cli import main
from sage_tfx.privacy import BlockRetired, Ledger, LedgerRollback
from sage_tfx.privacy import anchor as anchor_module
from tests.helpers.head_file import backup, restore
from tests.privacy.test_tamper import sql


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv("SAGE_KEY_FILE", raising=False)


def _charged_once(tmp_path):
    """A ledger whose one block (global epsilon 1) was charged its whole budget, and a copy from before the grant."""
    path = str(tmp_path / "ledger.db")
    with Ledger.open(path, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b0", shard=0, rows=10)
    before = str(tmp_path / "before.db")
    backup(path, before)
    with Ledger.open(path) as ledger:
        ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
        with pytest.raises(BlockRetired):  # spent: never offered again
            ledger.request("q", "s", blocks=["b0"], epsilon=1.0)
        assert ledger.audit().ok
    return path, before


def _new_id(path):
    sql(path, "UPDATE meta SET value = ? WHERE key = 'ledger_id'", (secrets.token_hex(16),))


def _files(path):
    """The bytes of the database, its key file and head file (and whether each exists)."""
    out = {}
    for name in (path, path + "-wal", path + ".key", path + ".key.head"):
        out[name] = open(name, "rb").read() if os.path.exists(name) else None
    return out


def _refused_then_audited(path, found, capsys):
    """Ledger.open refuses (naming ``found`` and the fix) and changes no byte; `sage ledger status` exits 2;
    `sage ledger audit` exits 1 naming ``found``."""
    before = _files(path)
    with pytest.raises(LedgerRollback) as caught:
        Ledger.open(path)
    message = str(caught.value)
    assert found in message and "Nothing was written" in message, message
    assert "sage ledger anchor" in message and "restore the ledger database" in message, message
    assert main(["ledger", "status", "--db", path, "--stream", "s"]) == 2
    assert found in capsys.readouterr().err
    assert _files(path) == before  # refused before any write: no grant, no fresh head
    assert main(["ledger", "audit", "--db", path]) == 1
    out = capsys.readouterr().out
    assert "audit FAILED" in out and found in out, out
    assert _files(path) == before  # the audit wrote nothing either
    return out


def test_an_old_copy_restored_with_a_new_ledger_id_is_refused_at_open_and_named_by_the_audit(tmp_path, capsys):
    path, before = _charged_once(tmp_path)
    restore(path, before)
    _new_id(path)
    out = _refused_then_audited(path, "the ledger's id was changed", capsys)
    assert "the database was rolled back or its tail cut" in out  # the head of the bound id: the log is behind it


def test_an_old_copy_restored_as_is_is_refused_at_open(tmp_path, capsys):
    path, before = _charged_once(tmp_path)
    restore(path, before)
    _refused_then_audited(path, "the database was rolled back or its tail cut", capsys)


def test_the_last_grant_cut_with_a_new_ledger_id_is_refused_at_open_and_named_by_the_audit(tmp_path, capsys):
    path, _ = _charged_once(tmp_path)
    seq = sql(path, "SELECT max(seq) FROM log WHERE kind = 'grant'")[0][0]
    sql(path, "DELETE FROM log WHERE seq >= ?", (seq,))
    sql(path, "DELETE FROM grants")
    sql(path, "UPDATE blocks SET spent = '[0.0, 0.0]'")
    _new_id(path)
    out = _refused_then_audited(path, "the ledger's id was changed", capsys)
    assert "the database was rolled back or its tail cut" in out


def test_a_deleted_head_file_is_refused_at_open_and_an_ordinary_write_cannot_erase_it(tmp_path, capsys):
    path, before = _charged_once(tmp_path)
    os.unlink(path + ".key.head")
    _refused_then_audited(path, "has no record of this ledger", capsys)
    assert not os.path.exists(path + ".key.head")  # no fresh head was taken
    restore(path, before)  # ... nor after the database is rolled back as well
    _refused_then_audited(path, "has no record of this ledger", capsys)


def test_an_audit_only_open_writes_nothing_and_verifies_no_grant(tmp_path):
    path, before = _charged_once(tmp_path)
    with Ledger.open(path) as ledger:
        grant = ledger.grants("s")[0]
    os.unlink(path + ".key.head")
    with Ledger.open(path, check_head=False) as ledger:
        assert "has no record of this ledger" in ledger.anchor_problem
        with pytest.raises(LedgerRollback, match="verifies no grant"):
            ledger.verify(grant)
    assert not os.path.exists(path + ".key.head")  # no head made durable for it either
    restore(path, before)
    with Ledger.open(path, check_head=False) as ledger:
        with pytest.raises(LedgerRollback, match="writes nothing"):
            ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    assert sql(path, "SELECT count(*) FROM grants")[0][0] == 0


def test_the_ledger_id_is_bound_in_the_first_keyed_log_entry(tmp_path):
    path = str(tmp_path / "ledger.db")
    with Ledger.open(path, create=True) as ledger:
        ledger_id = ledger.ledger_id
    seq, kind, body = sql(path, "SELECT seq, kind, body FROM log ORDER BY seq")[0]
    assert (seq, kind, body) == (1, "ledger", f'{{"ledger_id":"{ledger_id}"}}')
    for _ in range(3):  # opens of a bound ledger write nothing
        Ledger.open(path).close()
    assert sql(path, "SELECT count(*) FROM log")[0][0] == 1
    sql(path, "UPDATE log SET body = ? WHERE seq = 1", (f'{{"ledger_id":"{secrets.token_hex(16)}"}}',))
    with pytest.raises(LedgerRollback, match="does not verify under the key"):
        Ledger.open(path)


def test_an_operator_re_anchors_a_known_good_copy_explicitly_and_the_audit_lists_it(tmp_path, capsys):
    path, before = _charged_once(tmp_path)
    restore(path, before)
    _new_id(path)
    with pytest.raises(SystemExit) as usage:  # the reason is required
        main(["ledger", "anchor", "--db", path])
    assert usage.value.code == 2
    capsys.readouterr()
    assert main(["ledger", "anchor", "--db", path, "--reason", "restored the nightly backup"]) == 0
    out = capsys.readouterr().out
    assert "audit OK" in out, out
    with Ledger.open(path) as ledger:
        report = ledger.audit()
        assert report.ok, report.problems
        assert any("re-anchored by an operator" in n and "restored the nightly backup" in n for n in report.notes)
        (kind,) = sql(path, "SELECT kind FROM log ORDER BY seq DESC LIMIT 1")[0]
        assert kind == "anchor"
        bound = sql(path, "SELECT body FROM log WHERE kind = 'ledger'")[0][0]
        assert ledger.ledger_id in bound  # meta's id put back to the bound one
        assert sql(path, "SELECT value FROM meta WHERE key = 'ledger_id'")[0][0] == ledger.ledger_id
        ledger.add_block("s", "b1", shard=1, rows=1)  # writes again
    assert main(["ledger", "audit", "--db", path]) == 0


def test_a_host_without_a_head_file_joins_by_re_anchoring(tmp_path):
    """A second host (its own copy of the key file, no head file yet) is refused until it re-anchors."""
    path, _ = _charged_once(tmp_path)
    other = tmp_path / "host2"
    other.mkdir(mode=0o700)
    key = str(other / "ledger.key")
    shutil.copy2(path + ".key", key)
    with pytest.raises(LedgerRollback, match="has no record of this ledger"):
        Ledger.open(path, key_file=key)
    Ledger.reanchor(path, "host2 joins", key_file=key).close()
    with Ledger.open(path, key_file=key) as ledger:
        ledger.add_block("s", "b1", shard=1, rows=1)
    with Ledger.open(path) as ledger:  # the first host's head is behind: the later entries verify, accepted
        report = ledger.audit()
        assert report.ok, report.problems


def test_a_ledger_of_an_older_version_is_bound_on_its_first_open_and_then_protected(tmp_path, monkeypatch):
    path = str(tmp_path / "ledger.db")
    with monkeypatch.context() as m:  # what the version before the anchor wrote: no ledger entry
        m.setattr(anchor_module, "bind_ledger_id", lambda *a: None)
        with Ledger.open(path, create=True) as ledger:
            ledger.create_stream("s", 1.0, 1e-6)
            ledger.add_block("s", "b0", shard=0, rows=10)
    assert sql(path, "SELECT count(*) FROM log WHERE kind = 'ledger'")[0][0] == 0
    before = str(tmp_path / "before.db")
    backup(path, before)
    with Ledger.open(path) as ledger:
        assert sql(path, "SELECT seq, kind FROM log ORDER BY seq DESC LIMIT 1")[0] == (3, "ledger")
        ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
        assert ledger.audit().ok
    restore(path, before)
    _new_id(path)
    with pytest.raises(LedgerRollback, match="has no record of this ledger"):
        Ledger.open(path)


def test_a_copy_from_before_the_key_migration_is_caught_after_it_migrates_again(tmp_path):
    """A schema-3 ledger (secret in meta, no id) restored from before its migration migrates again to the SAME id
    (derived from its old secret), so the head of that id catches the rollback."""
    from tests.privacy.test_keys import _make_schema3_ledger

    path = str(tmp_path / "old.db")
    _make_schema3_ledger(path)
    before = str(tmp_path / "before.db")
    backup(path, before)
    Ledger.upgrade(path, progress=lambda line: None)  # migrates: key file, keys entry, ledger entry, times
    with Ledger.open(path) as ledger:
        first_id = ledger.ledger_id
        ledger.request("p", "s", blocks=["b1"], epsilon=0.5)
    restore(path, before)
    with pytest.raises(LedgerRollback, match="removed from its tail"):
        Ledger.upgrade(path, progress=lambda line: None)
    conn = sqlite3.connect(path)  # migrated again to the same id: this host's head of it caught the rollback
    assert conn.execute("SELECT value FROM meta WHERE key = 'ledger_id'").fetchone()[0] == first_id
    conn.close()


@pytest.mark.parametrize("cut", ["DELETE FROM log WHERE seq = 1", "UPDATE log SET kind = 'stream' WHERE seq = 1"])
def test_the_entry_binding_the_id_cut_out_is_refused_at_open_not_bound_again(tmp_path, capsys, cut):
    """Without its keyed ledger entry the log looked like an older version's: the next open bound it anew (a write,
    even by the audit's open) and only the audit's chain check said anything."""
    path, _ = _charged_once(tmp_path)
    sql(path, cut)
    before = _files(path)
    with pytest.raises(LedgerRollback, match="the entry that bound it was cut out or altered"):
        Ledger.open(path)
    assert main(["ledger", "audit", "--db", path]) == 1
    assert "binding the ledger's id" in capsys.readouterr().out
    assert _files(path) == before  # neither open wrote a ledger entry or a head
