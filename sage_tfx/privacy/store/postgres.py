"""The shared backend: a PostgreSQL database, safe for processes on many hosts.

Every write transaction first takes ``SELECT ... FOR UPDATE`` on the ``meta`` lock row; a read transaction is one
REPEATABLE READ snapshot. The SQL (``sql.py``) is written with ``?`` placeholders, rewritten to pg8000's ``%s``.

Connections use VERIFIED TLS by default, as libpq's ``sslmode=verify-full``: the server's certificate must chain
to ``sslrootcert=PATH`` (or the system's CAs) and name the host, and a server that does not offer TLS is refused
(never plain text). The URL's ``sslmode`` says otherwise explicitly, with libpq's names: ``verify-ca`` (chain
only, any host name), ``require`` (TLS, unverified) or ``disable`` (plain text: for a loopback test server).
``allow`` and ``prefer``, which fall back to plain text silently, are refused. ``sslcert=PATH&sslkey=PATH`` give a
client certificate. The password is never in the URL: ``$PGPASSWORD`` or a libpq password file (``location.py``).
"""

from __future__ import annotations

import os
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Mapping

from ..errors import LedgerError, LedgerNotFound
from . import sql
from .base import Store, claim_key, process_label
from .location import PASSWORD_SOURCES, check_location, display, postgres_password

SSLMODES = ("verify-full", "verify-ca", "require", "disable")
DEFAULT_SSLMODE = "verify-full"


def postgres_ssl_context(query: Mapping[str, str], display: str) -> ssl.SSLContext | bool:
    """pg8000's ``ssl_context`` for a URL's query parameters: an SSLContext (TLS required), or False (sslmode=disable).

    Never None or True: with those pg8000 tries unverified TLS and falls back to plain text.
    """

    mode = query.get("sslmode", DEFAULT_SSLMODE)
    if mode in ("allow", "prefer"):
        raise LedgerError(
            f"sslmode={mode} in {display} may fall back to plain text silently: use sslmode=verify-full "
            "(the default: TLS with a verified server certificate), or sslmode=disable explicitly for a "
            "loopback or test server"
        )
    if mode not in SSLMODES:
        raise LedgerError(f"sslmode={mode!r} in {display} is unknown: use one of {', '.join(SSLMODES)}")
    if mode == "disable":
        return False
    for key in ("sslrootcert", "sslcert", "sslkey"):
        if key in query and not os.path.isfile(query[key]):
            raise LedgerError(f"{key}={query[key]!r} in {display} is not a readable file")
    try:
        context = ssl.create_default_context(cafile=query.get("sslrootcert"))
        if "sslcert" in query:
            context.load_cert_chain(query["sslcert"], query.get("sslkey"))
    except (ssl.SSLError, OSError) as exc:
        raise LedgerError(f"TLS settings of {display} are unusable: {exc}") from None
    if mode == "require":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif mode == "verify-ca":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _connect_hint(exc, password):
    text = str(exc)
    if password is None and (isinstance(exc, AttributeError) or "password" in text):  # pg8000, asked for none
        return f"the server asks for a password and none was found: give it by {PASSWORD_SOURCES}"
    if "password authentication failed" in text:
        return f"{text}: check the password given by {PASSWORD_SOURCES}"
    if "refuses SSL" in text:
        return (
            "the server does not offer TLS, and plain text is refused by default: enable TLS on the server, or "
            "add sslmode=disable to the URL for a loopback or test server"
        )
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text or "match target host" in text:
        return (
            f"{text}: the server's certificate must verify against sslrootcert=PATH (or the system's CAs) and "
            "name the host; sslmode=require skips the check explicitly (encrypted, not authenticated)"
        )
    return text


class PostgresStore(Store):
    kind = "postgresql"
    placeholder = "%s"

    def __init__(
        self,
        url: str,
        create: bool = False,
        on_create: Callable[[], Mapping[str, str]] | None = None,
        read_only: bool = False,
        upgrade: bool = False,
    ) -> None:
        import pg8000.dbapi

        self.on_create, self.read_only, self.upgrade = on_create, read_only, upgrade
        parsed = urllib.parse.urlparse(check_location(url))  # never a password in the URL (location.py)
        self.display = display(url)
        self._errors = (pg8000.dbapi.Error,)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        ssl_context = postgres_ssl_context(query, self.display)
        sock, password = None, postgres_password(url)  # PGPASSWORD or a libpq password file (location.py)
        try:
            timeout = float(query.get("timeout", 120))
            sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 5432), timeout)
            # pg8000 leaves Nagle's algorithm on: a statement longer than its 8 KiB write buffer
            # (a batched write, a long IN list) then waits ~40 ms for the server's delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # as pg8000 does by default
            self._conn = pg8000.dbapi.connect(
                user=urllib.parse.unquote(parsed.username or "postgres"),
                password=password,
                database=(parsed.path or "/postgres").lstrip("/") or "postgres",
                host=parsed.hostname or "127.0.0.1",  # with sock, only the name TLS verifies
                sock=sock,
                ssl_context=ssl_context,
                application_name=process_label(),  # who holds a claim (try_claim), in pg_stat_activity
            )
        except Exception as exc:  # pg8000 raises InterfaceError/OSError/SSLError subclasses on connect
            if sock is not None:
                sock.close()
            raise LedgerError(f"cannot connect to ledger {self.display}: {_connect_hint(exc, password)}") from None
        self._conn.autocommit = True
        has_meta = self._query_one(sql.PG_HAS_META)[0]
        if not has_meta:
            if not create:
                raise LedgerNotFound(f"no ledger at {self.display}: create it with `sage ledger init`")
            self._conn.autocommit = False
            try:
                cur = self._conn.cursor()
                cur.execute(sql.PG_INIT_LOCK)  # serialize concurrent inits
                cur.execute(sql.PG_HAS_META)
                if not cur.fetchone()[0]:
                    for ddl in sql.TABLES:
                        cur.execute(ddl)
                self._conn.commit()
            except pg8000.dbapi.Error as exc:
                self._conn.rollback()
                raise LedgerError(f"cannot create ledger at {self.display}: {exc}") from None
            self._create_schema()
        self._conn.autocommit = False
        self._check_schema()

    def _query_one(self, text):
        cur = self._conn.cursor()
        cur.execute(text)
        return cur.fetchone()

    def _wrap(self, exc, prefix=None):
        return LedgerError(f"{prefix or 'ledger ' + self.display}: {exc}")

    def _has_column(self, tx, table, column):
        return tx.one(sql.PG_HAS_COLUMN, (table, column)) is not None

    def _begin_write(self):
        self._conn.autocommit = False
        cur = self._conn.cursor()
        cur.execute(sql.PG_WRITE_LOCK)

    def _begin_read(self):
        # One snapshot for the whole read transaction (READ COMMITTED, the default, takes one per statement):
        # a read of several tables while another host writes sees one state of the ledger, as the audit
        # needs (audit.py). Read-only, so it never meets a serialization failure.
        self._conn.autocommit = False
        self._conn.cursor().execute(sql.PG_BEGIN_READ)

    def _commit(self):
        self._conn.commit()

    def _rollback(self):
        self._conn.rollback()

    def try_claim(self, name: str) -> tuple[int | None, str | None]:
        """Hold the claim ``name`` for this connection: (handle, None), or (None, who holds it).

        A session-level advisory lock (``pg_try_advisory_lock``), seen by every host of the ledger and dropped
        by the server when the holder's connection ends (its process exited or was killed)."""
        key = claim_key(name)
        cur = self._conn.cursor()
        try:
            cur.execute(self._sql(sql.PG_TRY_CLAIM), (key,))
            if cur.fetchone()[0]:
                return key, None
            unsigned = key & ((1 << 64) - 1)
            cur.execute(self._sql(sql.PG_CLAIM_HOLDER), (unsigned >> 32, unsigned & 0xFFFFFFFF))
            row = cur.fetchone()
            holder = "another process"
            if row is not None and row[0]:
                holder = row[0] + (f", connected from {row[1]}" if row[1] else "")
            return None, holder
        finally:
            self._conn.commit()  # a session lock outlives the transaction it was taken in

    def release_claim(self, handle: int) -> None:
        cur = self._conn.cursor()
        cur.execute(self._sql(sql.PG_RELEASE_CLAIM), (handle,))
        self._conn.commit()

    def integrity_problems(self) -> list[str]:
        return []

    def close(self) -> None:
        self._conn.close()
