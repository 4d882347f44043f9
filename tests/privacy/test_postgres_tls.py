"""PostgreSQL ledgers connect with VERIFIED TLS by default and never fall back to plain text.

The session's loopback server (conftest.py) offers TLS with a self-signed certificate for 127.0.0.1 and
still accepts plain connections, so each sslmode can be checked against a real server; a fake server that
answers "no TLS" checks that the default refuses plain text instead of falling back to it.
"""

import socket
import struct
import threading

import pytest

from sage_tfx.privacy import Ledger, LedgerError
from tests.conftest import run_sql

pytestmark = pytest.mark.postgres


@pytest.fixture
def tls_server(postgres_server):
    if postgres_server.ssl_ca is None:
        pytest.skip("openssl did not make a certificate for the test server")
    return postgres_server


@pytest.fixture(autouse=True)
def _key_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGE_KEY_FILE", str(tmp_path / "ledger.key"))  # PostgreSQL has no default key file


def _database(server):
    return server.new_database("tls").split("?")[0]  # the URL without the tests' sslmode=disable


def _encrypted(ledger):
    cur = ledger._store._conn.cursor()
    cur.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    return cur.fetchone()[0]


def _tables(url):
    return run_sql(
        url + "?sslmode=disable", "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    )


def test_default_refuses_a_certificate_it_cannot_verify(tls_server):
    url = _database(tls_server)
    with pytest.raises(LedgerError, match="certificate verify failed.*sslrootcert=PATH"):
        Ledger.open(url, create=True)
    assert _tables(url) == []  # nothing was created


def test_verify_full_with_the_servers_ca_connects_encrypted(tls_server):
    url = _database(tls_server) + f"?sslrootcert={tls_server.ssl_ca}"  # default sslmode: verify-full
    with Ledger.open(url, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        assert _encrypted(ledger) is True
    with Ledger.open(url.replace("?", "?sslmode=verify-ca&")) as ledger:
        assert ledger.stream("s").epsilon == 1.0 and _encrypted(ledger) is True


def test_verify_full_checks_the_host_name(tls_server):
    url = _database(tls_server).replace("127.0.0.1", "localhost") + f"?sslrootcert={tls_server.ssl_ca}"
    with pytest.raises(LedgerError, match="certificate|match target host"):
        Ledger.open(url, create=True)


def test_explicit_opt_outs(tls_server):
    url = _database(tls_server)
    with Ledger.open(url + "?sslmode=require", create=True) as ledger:  # encrypted, unverified: said explicitly
        assert _encrypted(ledger) is True
    with Ledger.open(url + "?sslmode=disable") as ledger:  # plain text: said explicitly
        assert _encrypted(ledger) is False


@pytest.mark.parametrize(
    "mode, message",
    [
        ("prefer", "sslmode=prefer .* may fall back to plain text"),
        ("allow", "sslmode=allow .* may fall back to plain text"),
        ("verify_full", "sslmode='verify_full' .* is unknown"),
    ],
)
def test_modes_that_fall_back_or_are_unknown_are_refused(postgres_server, mode, message):
    url = _database(postgres_server)
    with pytest.raises(LedgerError, match=message):
        Ledger.open(f"{url}?sslmode={mode}", create=True)
    assert _tables(url) == []


def test_missing_root_certificate_file_is_named(postgres_server, tmp_path):
    url = _database(postgres_server) + f"?sslrootcert={tmp_path / 'nope.pem'}"
    with pytest.raises(LedgerError, match="nope.pem' .* not a readable file"):
        Ledger.open(url, create=True)


def test_a_server_without_tls_is_refused_not_used_in_plain_text():
    """A fake server answers the TLS request with 'N' (as PostgreSQL with ssl=off does); by default the ledger
    refuses instead of sending its startup message (user name, database) in plain text."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port, seen = listener.getsockname()[1], []

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            seen.append(conn.recv(8))
            conn.sendall(b"N")
            try:
                seen.append(conn.recv(1024))  # a plain-text startup message would arrive here
            except OSError:
                seen.append(b"")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(LedgerError, match="does not offer TLS.*sslmode=disable"):
            Ledger.open(f"postgresql://postgres@127.0.0.1:{port}/sage", create=True)
        thread.join(15)
    finally:
        listener.close()
    assert seen[0] == struct.pack("!ii", 8, 80877103)  # the TLS request
    assert seen[1] == b""  # and nothing after it: no plain-text fallback
