"""The ledger's key file (docs/security.md): out of the database, 0600, derived keys."""

import hashlib
import hmac
import json
import os
import sqlite3
import stat

import pytest

from sage_tfx.privacy import GrantError, Ledger, LedgerUpgradeNeeded
from sage_tfx.privacy.chain import canonical
from sage_tfx.privacy.keys import KeyFileError, KeyRing, resolve_key_path


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv("SAGE_KEY_FILE", raising=False)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_key_file_is_created_0600_beside_an_sqlite_ledger(tmp_path):
    path = str(tmp_path / "ledger.db")
    with Ledger.open(path, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        assert ledger.key_file == path + ".key"
    assert _mode(path + ".key") == 0o600 and os.path.getsize(path + ".key") == 32
    assert _mode(path) == 0o600 and _mode(path + ".key.head") == 0o600
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            assert _mode(path + suffix) == 0o600


def test_a_key_file_open_to_others_is_refused_naming_the_fix(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger.open(path, create=True).close()
    os.chmod(path + ".key", 0o644)
    with pytest.raises(KeyFileError, match=f"chmod 600 {path}.key"):
        Ledger.open(path)


def test_a_missing_or_wrong_key_file_is_refused(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger.open(path, create=True).close()
    with pytest.raises(KeyFileError, match="does not exist.*--key-file"):
        Ledger.open(path, key_file=str(tmp_path / "nope.key"))
    KeyRing.create(str(tmp_path / "other.key"))
    with pytest.raises(KeyFileError, match="is not the key of ledger"):
        Ledger.open(path, key_file=str(tmp_path / "other.key"))
    with pytest.raises(KeyFileError, match="already exists"):
        KeyRing.create(str(tmp_path / "other.key"))  # never overwritten


def test_key_file_location_explicit_then_env_then_beside(tmp_path, monkeypatch):
    assert resolve_key_path(str(tmp_path / "l.db")) == str(tmp_path / "l.db.key")
    monkeypatch.setenv("SAGE_KEY_FILE", str(tmp_path / "env.key"))
    assert resolve_key_path(str(tmp_path / "l.db")) == str(tmp_path / "env.key")
    assert resolve_key_path(str(tmp_path / "l.db"), str(tmp_path / "x.key")) == str(tmp_path / "x.key")


def test_postgresql_needs_an_explicit_key_file():
    with pytest.raises(KeyFileError, match="--key-file PATH.*SAGE_KEY_FILE"):
        resolve_key_path("postgresql://postgres@127.0.0.1:5432/sage")
    with pytest.raises(KeyFileError, match="--key-file"):
        Ledger.open("postgresql://postgres@127.0.0.1:1/sage", create=True)  # before any connection


@pytest.mark.postgres
def test_postgresql_ledger_with_explicit_key_file(postgres_url, tmp_path, monkeypatch):
    monkeypatch.delenv("SAGE_KEY_FILE", raising=False)
    key = str(tmp_path / "pg.key")
    with Ledger.open(postgres_url, create=True, key_file=key) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b0", shard=0, rows=3)
        grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
    assert _mode(key) == 0o600
    with pytest.raises(KeyFileError, match="--key-file"):
        Ledger.open(postgres_url)
    with Ledger.open(postgres_url, key_file=key) as ledger:
        assert ledger.verify(grant.to_json()).id == grant.id and ledger.audit().ok
        _assert_key_nowhere(ledger)


def test_derived_keys_are_distinct_and_block_keys_per_block(tmp_path):
    ring = KeyRing.create(str(tmp_path / "k"))
    keys = {
        ring.signing_key,
        ring.noise_key,
        ring.audit_key,
        ring.block_key("s", "b0"),
        ring.block_key("s", "b1"),
        ring.block_key("t", "b0"),
        ring._master,
    }
    assert len(keys) == 7 and all(len(k) == 32 for k in keys)
    assert ring.block_key("s", "b0") == KeyRing.load(str(tmp_path / "k")).block_key("s", "b0")
    assert not any(k.hex() in repr(ring) for k in keys)  # no key bytes in a repr


def _assert_key_nowhere(ledger):
    forms = ledger.keyring.secret_forms()
    with ledger._store.transaction(write=False) as tx:
        tables = ["meta", "streams", "blocks", "grants", "pipelines", "reservations", "log", "outcomes", "releases"]
        for table in tables:
            for row in tx.all(f"SELECT * FROM {table}"):
                for value in row:
                    data = value if isinstance(value, bytes) else str(value).encode()
                    for form in forms:
                        assert form not in data, (table, row)
        assert tx.one("SELECT 1 FROM meta WHERE key = 'secret'") is None


def test_the_key_is_nowhere_in_the_database(tmp_path):
    path = str(tmp_path / "ledger.db")
    with Ledger.open(path, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.register("s", "p")
        ledger.add_block("s", "b0", shard=0, rows=3, digest="ab")
        grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
        ledger.release(grant, "training", "c", 0.5)
        ledger.record_outcome(grant.id, "ACCEPT")
        _assert_key_nowhere(ledger)
    raw = open(path, "rb").read() + (open(path + "-wal", "rb").read() if os.path.exists(path + "-wal") else b"")
    for form in KeyRing.load(path + ".key").secret_forms():
        assert form not in raw


def test_a_grant_signed_without_the_key_is_refused_by_check_grant(tmp_path):
    from sage_tfx.components._grant import check_grant

    path = str(tmp_path / "ledger.db")
    with Ledger.open(path, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b0", shard=0, rows=3)
        grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
    assert check_grant(path, grant.to_json()).id == grant.id
    # A writer of the database (no key file) signs a zero-cost grant as schema 3 did, with what it can read.

    body = dict(grant.body(), id="g-" + "0" * 24, epsilon=0.0, cost=[0.0, 0.0])
    conn = sqlite3.connect(path)
    guesses = [v.encode() for (v,) in conn.execute("SELECT value FROM meta")] + [b""]
    for guess in guesses:
        forged = dict(body, signature=hmac.new(guess, canonical(body).encode(), hashlib.sha256).hexdigest())
        conn.execute(
            "INSERT OR REPLACE INTO grants (id, stream, pipeline, body, signature, created) VALUES (?, ?, ?, ?, ?, ?)",
            (body["id"], "s", "p", canonical(body), forged["signature"], 0.0),
        )
        conn.commit()
        with pytest.raises(GrantError, match="forged"):
            check_grant(path, canonical(forged))
    conn.close()


def test_a_schema_3_ledger_is_migrated_and_its_old_grants_stay_valid(tmp_path):
    """An older ledger (secret in meta.secret, unkeyed chain): refused by an ordinary open, nothing written; on
    `sage ledger upgrade` the key file is written, the secret deleted, old grants verify and keep their seeds, the
    audit stays OK, and new writes are keyed. A second upgrade writes nothing."""
    path = str(tmp_path / "old.db")
    old_grant, old_seed = _make_schema3_ledger(path)
    before = open(path, "rb").read()
    with pytest.raises(LedgerUpgradeNeeded, match="sage ledger upgrade"):
        Ledger.open(path)
    assert open(path, "rb").read() == before and not os.path.exists(path + ".key")
    lines = []
    assert Ledger.upgrade(path, progress=lines.append) == 8  # the key, schema 3 -> 9, the times
    assert lines[0].startswith("keys: the secret moved out") and "schema 9 -> 10" in lines[-2]
    assert Ledger.upgrade(path, progress=lines.append) == 0
    with Ledger.open(path) as ledger:
        assert os.path.exists(path + ".key") and _mode(path + ".key") == 0o600
        assert ledger.verify(old_grant.to_json()).id == old_grant.id
        assert ledger.private_seed(old_grant.id, "training") == old_seed
        new = ledger.request("p", "s", blocks=["b1"], epsilon=0.5)
        assert ledger.verify(new.to_json()).id == new.id
        report = ledger.audit()
        assert report.ok, report.problems
        _assert_key_nowhere(ledger)
        # the old secret never signs a new grant
        forged = dict(new.body(), signature=ledger.keyring.legacy_sign(canonical(new.body()).encode()))
        with pytest.raises(GrantError, match="forged"):
            ledger.verify(canonical(forged))


def test_a_migration_killed_after_the_key_file_is_finished_on_the_next_open(tmp_path):
    path = str(tmp_path / "old.db")
    old_grant, _ = _make_schema3_ledger(path)
    secret = sqlite3.connect(path).execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()[0]
    KeyRing.create_migrated(path + ".key", secret)  # step 1 done, then killed: the secret is still in meta
    Ledger.upgrade(path, progress=lambda line: None)
    with Ledger.open(path) as ledger:
        assert ledger.verify(old_grant.to_json()).id == old_grant.id and ledger.audit().ok
    assert sqlite3.connect(path).execute("SELECT count(*) FROM meta WHERE key = 'secret'").fetchone()[0] == 0
    # a key file that does not hold this ledger's secret is refused, the ledger untouched
    path2 = str(tmp_path / "old2.db")
    _make_schema3_ledger(path2)
    KeyRing.create(path2 + ".key")
    with pytest.raises(KeyFileError, match="old secret"):
        Ledger.upgrade(path2, progress=lambda line: None)
    assert sqlite3.connect(path2).execute("SELECT count(*) FROM meta WHERE key = 'secret'").fetchone()[0] == 1


def _make_schema3_ledger(path):
    """A ledger as schema 3 wrote it: meta.secret, grants signed and the log chained with it, unkeyed."""

    from sage_tfx.privacy.ledger import GENESIS, chain_hash

    with Ledger.open(path, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.register("s", "p")
        ledger.add_block("s", "b0", shard=0, rows=3)
        ledger.add_block("s", "b1", shard=1, rows=4)
        grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.25)
    os.unlink(path + ".key")
    os.unlink(path + ".key.head")
    secret = "ab" * 32
    sign = lambda body: hmac.new(secret.encode(), canonical(body).encode(), hashlib.sha256).hexdigest()  # noqa
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM meta WHERE key IN ('key_id', 'ledger_id')")
    conn.execute("INSERT INTO meta (key, value) VALUES ('secret', ?)", (secret,))
    conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    sig = sign(grant.body())
    conn.execute("UPDATE grants SET signature = ? WHERE id = ?", (sig, grant.id))
    conn.execute("DELETE FROM log WHERE kind = 'ledger'")  # schema 3 bound no ledger id in its log (entry 1 now)
    conn.execute("UPDATE log SET seq = -seq")
    conn.execute("UPDATE log SET seq = -seq - 1")
    prev = GENESIS
    for seq, kind, body in conn.execute("SELECT seq, kind, body FROM log ORDER BY seq").fetchall():
        if kind == "grant":
            data = json.loads(body)
            data["signature"] = sig
            body = canonical(data)
        value = chain_hash(prev, seq, kind, body)
        conn.execute("UPDATE log SET body = ?, prev = ?, hash = ? WHERE seq = ?", (body, prev, value, seq))
        prev = value
    conn.commit()
    conn.close()
    seed = int.from_bytes(
        hmac.new(secret.encode(), f"seed|{grant.id}|training".encode(), hashlib.sha256).digest()[:16], "big"
    )
    return type(grant)(**{**grant.__dict__, "signature": sig}), seed


def test_cli_key_file_flag(tmp_path):
    from sage_tfx.cli import main

    db, key = str(tmp_path / "l.db"), str(tmp_path / "keys" / "l.key")
    os.mkdir(tmp_path / "keys", 0o700)
    assert (
        main(["ledger", "init", "--db", db, "--key-file", key, "--stream", "s", "--epsilon", "1", "--delta", "1e-6"])
        == 0
    )
    assert _mode(key) == 0o600 and not os.path.exists(db + ".key")
    assert main(["ledger", "audit", "--db", db, "--key-file", key]) == 0
    assert main(["ledger", "audit", "--db", db]) == 2  # its key is not beside it
    assert "SAGE_KEY_FILE" not in os.environ
