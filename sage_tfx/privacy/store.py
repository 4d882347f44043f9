"""Ledger storage: one schema, two backends (embedded SQLite, shared PostgreSQL).

Every write is one serializable transaction that first takes the ledger's
write lock, so a check-and-charge over many blocks is atomic and concurrent
writers never interleave:

* SQLite: WAL journal, ``BEGIN IMMEDIATE`` (takes the database write lock up
  front), ``synchronous=FULL`` so an acknowledged grant survives a crash or a
  kill -9. Safe for many processes on one host.
* PostgreSQL: ``SELECT ... FOR UPDATE`` on the ``meta`` lock row at the start of
  every write transaction. Safe for processes on many hosts.

SQL is written once with ``?`` placeholders; the PostgreSQL adapter rewrites
them to pg8000's ``%s``.

PostgreSQL connections use VERIFIED TLS by default, as libpq's ``sslmode=verify-full``:
the server's certificate must chain to ``sslrootcert=PATH`` (or the system's CAs) and
name the host, and a server that does not offer TLS is refused (never plain text).
The URL's ``sslmode`` says otherwise explicitly, with libpq's names: ``verify-ca``
(chain only, any host name), ``require`` (TLS, unverified) or ``disable`` (plain text:
for a loopback test server). ``allow`` and ``prefer``, which fall back to plain text
silently, are refused. ``sslcert=PATH&sslkey=PATH`` give a client certificate.
"""
import contextlib
import os
import socket
import sqlite3
import threading
import urllib.parse

from .errors import LedgerCorrupt, LedgerError, LedgerNotFound

SCHEMA_VERSION = 5
_DEMANDS = """CREATE TABLE demands (
        stream TEXT NOT NULL, pipeline TEXT NOT NULL, blocks TEXT NOT NULL, cost TEXT NOT NULL, rule TEXT NOT NULL,
        meta TEXT NOT NULL, seq BIGINT NOT NULL, state TEXT NOT NULL, grant_id TEXT, PRIMARY KEY (stream, pipeline))"""
# DDL that brings a ledger of the key's schema version to the next one (run in one write transaction).
_MIGRATIONS = {
    1: ["""CREATE TABLE IF NOT EXISTS releases (
        grant_id TEXT NOT NULL, stage TEXT NOT NULL, stream TEXT NOT NULL, pipeline TEXT NOT NULL,
        computation TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        created DOUBLE PRECISION NOT NULL, PRIMARY KEY (grant_id, stage))"""],
    # 3: each block's content digest (ingest), to refuse the same records registered in a second stream, and
    # each stream's minimum grant epsilon (NULL on older streams: the default)
    2: [lambda tx: _add_column(tx, "blocks", "digest", "TEXT"),
        lambda tx: _add_column(tx, "streams", "min_grant_epsilon", "DOUBLE PRECISION"),
        "CREATE INDEX IF NOT EXISTS blocks_digest ON blocks (digest)"],
    # 4: an index on each stream's shards, so add_blocks' shard-clash check is one index look-up, not a scan of the
    # stream's blocks (its cost no longer grows with the stream: docs/BENCHMARKS.md); nothing stored changes
    3: ["CREATE INDEX IF NOT EXISTS blocks_shard ON blocks (stream, shard)"],
    # 5: the queued policies (docs/scheduling_policies.md): each stream's policy parameters (NULL: none, as every
    # stream before), each block's count of pipeline arrivals since it arrived (0 on older blocks: only queued
    # streams count them), and the demands a queued stream's scheduler holds (pending or admitted)
    4: [lambda tx: _add_column(tx, "streams", "policy_params", "TEXT"),
        lambda tx: _add_column(tx, "blocks", "arrivals", "BIGINT NOT NULL DEFAULT 0"),
        _DEMANDS.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS")],
}


def _add_column(tx, table, column, sql_type):
    """ALTER TABLE ... ADD COLUMN unless the column is there (a migration may be re-run on either backend)."""
    if tx._store.kind == "sqlite":
        present = any(r[1] == column for r in tx.all(f"PRAGMA table_info({table})"))
    else:
        present = tx.one("SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' AND table_name = ?"
                         " AND column_name = ?", (table, column)) is not None
    if not present:
        tx.run(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}")

_TABLES = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE streams (
        name TEXT PRIMARY KEY, accounting TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL,
        delta DOUBLE PRECISION NOT NULL, orders TEXT NOT NULL, policy TEXT NOT NULL,
        min_epsilon DOUBLE PRECISION NOT NULL, created DOUBLE PRECISION NOT NULL,
        min_grant_epsilon DOUBLE PRECISION, policy_params TEXT)""",
    """CREATE TABLE blocks (
        stream TEXT NOT NULL, id TEXT NOT NULL, start_ts DOUBLE PRECISION, end_ts DOUBLE PRECISION,
        shard BIGINT, n_rows BIGINT, created DOUBLE PRECISION NOT NULL, state TEXT NOT NULL,
        spent TEXT NOT NULL, retired DOUBLE PRECISION, digest TEXT, arrivals BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (stream, id))""",
    _DEMANDS,
    """CREATE TABLE grants (
        id TEXT PRIMARY KEY, stream TEXT NOT NULL, pipeline TEXT NOT NULL, body TEXT NOT NULL,
        signature TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE pipelines (
        stream TEXT NOT NULL, name TEXT NOT NULL, state TEXT NOT NULL, outcome TEXT,
        registered DOUBLE PRECISION NOT NULL, finished DOUBLE PRECISION, PRIMARY KEY (stream, name))""",
    """CREATE TABLE reservations (
        stream TEXT NOT NULL, block TEXT NOT NULL, pipeline TEXT NOT NULL, reserved TEXT NOT NULL,
        used TEXT NOT NULL, PRIMARY KEY (stream, block, pipeline))""",
    """CREATE TABLE log (
        seq BIGINT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL,
        prev TEXT NOT NULL, hash TEXT NOT NULL)""",
    """CREATE TABLE outcomes (
        grant_id TEXT PRIMARY KEY, stream TEXT NOT NULL, pipeline TEXT NOT NULL, outcome TEXT NOT NULL,
        details TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE releases (
        grant_id TEXT NOT NULL, stage TEXT NOT NULL, stream TEXT NOT NULL, pipeline TEXT NOT NULL,
        computation TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        created DOUBLE PRECISION NOT NULL, PRIMARY KEY (grant_id, stage))""",
    "CREATE INDEX blocks_window ON blocks (stream, start_ts)",
    "CREATE INDEX grants_stream ON grants (stream, created)",
    "CREATE INDEX blocks_digest ON blocks (digest)",
    "CREATE INDEX blocks_shard ON blocks (stream, shard)",
]


def open_store(location, create=False, on_create=None):
    """A SqliteStore for a path, a PostgresStore for a ``postgresql://`` URL.

    ``on_create()``, called as a new ledger's schema is written, returns the meta rows to add (the key id and
    ledger id: ``Ledger.open``); the database never holds a key (docs/security.md).
    """
    if not isinstance(location, (str, os.PathLike)) or not str(location):
        raise LedgerError(f"ledger location {location!r} is invalid: give a file path or a postgresql:// URL")
    location = str(location)
    if location.startswith(("postgresql://", "postgres://")):
        return PostgresStore(location, create=create, on_create=on_create)
    return SqliteStore(location, create=create, on_create=on_create)


class _Store:
    """Shared logic; subclasses provide _connect, _begin_write, _begin_read, _errors, placeholder."""

    placeholder = "?"
    statements = 0  # SQL statements this store executed (an executemany counts one per row): tests bound them
    after_commit = None  # called with a write transaction's ``tx.head`` once it committed (Ledger's head file)
    on_create = None

    def _sql(self, sql):
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    @contextlib.contextmanager
    def transaction(self, write=True):
        """Yield a Tx; commit on success, roll back on any exception (nothing changes)."""
        self._begin_write() if write else self._begin_read()
        tx = Tx(self)
        try:
            yield tx
        except BaseException:
            self._rollback()
            raise
        else:
            self._commit()
            head = getattr(tx, "head", None)
            if write and head is not None and self.after_commit is not None:
                self.after_commit(head)

    def _check_schema(self):
        try:
            with self.transaction(write=False) as tx:
                row = tx.one("SELECT value FROM meta WHERE key = 'schema_version'")
        except self._errors as exc:
            raise LedgerCorrupt(f"{self.display} is not a readable sage ledger: {exc}") from None
        if row is None:
            raise LedgerCorrupt(f"{self.display} is not a sage ledger (no schema version)")
        try:
            version = int(row[0])
        except ValueError:
            raise LedgerCorrupt(f"{self.display} has an invalid schema version {row[0]!r}") from None
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"{self.display} was written by a newer sage-tfx (schema version {version}; "
                f"this version reads up to {SCHEMA_VERSION}): upgrade sage-tfx"
            )
        if version < 1:
            raise LedgerCorrupt(f"{self.display} has an invalid schema version {version}")
        if version < SCHEMA_VERSION:
            self._migrate()

    def _migrate(self):
        """Bring an older ledger to SCHEMA_VERSION, one version per step, each in one write transaction."""
        while True:
            with self.transaction(write=True) as tx:
                version = int(tx.one("SELECT value FROM meta WHERE key = 'schema_version'")[0])
                if version >= SCHEMA_VERSION:
                    return
                for ddl in _MIGRATIONS[version]:
                    ddl(tx) if callable(ddl) else tx.run(ddl)
                tx.run("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version + 1),))

    def _create_schema(self):
        with self.transaction(write=True) as tx:
            if tx.one("SELECT 1 FROM meta WHERE key = 'schema_version'") is not None:
                return False
            extra = self.on_create() if self.on_create is not None else {}
            tx.run("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            tx.run("INSERT INTO meta (key, value) VALUES ('lock', '0')")
            for key, value in sorted(extra.items()):
                tx.run("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
        return True


def _restrict(path):
    """A new SQLite ledger and its WAL/SHM files: mode 0600 (the owner's alone; docs/security.md)."""
    for p in (path, path + "-wal", path + "-shm"):
        try:
            os.chmod(p, 0o600)
        except FileNotFoundError:
            pass


def claim_key(name):
    """A claim's lock key: 63 bits of SHA-256 of its name (a PostgreSQL advisory lock key, a lock file's name)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(b"sage-claim\0" + name.encode()).digest()[:8], "big", signed=True)


def process_label():
    """'sage@HOST pid N': who holds a claim (PostgreSQL's application_name; the text of an SQLite claim file)."""
    return f"sage@{socket.gethostname()} pid {os.getpid()}"[:63]


class Tx:
    """One open transaction: ``run`` executes, ``one``/``all`` fetch."""

    def __init__(self, store):
        self._store = store
        self._cur = store._conn.cursor()

    def run(self, sql, params=()):
        self._store.statements += 1
        try:
            self._cur.execute(self._store._sql(sql), tuple(params))
        except self._store._errors as exc:
            raise self._store._wrap(exc) from None
        return self._cur

    def many(self, sql, rows):
        rows = [tuple(r) for r in rows]
        self._store.statements += len(rows)
        try:
            self._cur.executemany(self._store._sql(sql), rows)
        except self._store._errors as exc:
            raise self._store._wrap(exc) from None

    def one(self, sql, params=()):
        return self.run(sql, params).fetchone()

    def all(self, sql, params=()):
        return self.run(sql, params).fetchall()


# SQLite files this process has open through a SqliteStore: {(st_dev, st_ino): connections}. SQLite's locks are
# POSIX record locks, held per PROCESS and file: closing ANY descriptor of the file in this process drops every
# lock this process holds on it, those of its open connections too (the WAL's shared lock among them). Another
# process then believes it holds the last connection, checkpoints and deletes the WAL under the first one's
# feet: a corrupt ledger (seen with `sage serve`'s worker processes, each holding its ledger while a pipeline
# component opens a second one). So the header is read with open()/close() only while this process has no
# connection to the file; otherwise an open connection already checked it.
_OPEN_FILES = {}
_OPEN_FILES_LOCK = threading.Lock()


def _file_id(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class SqliteStore(_Store):
    kind = "sqlite"
    _file = None

    def __init__(self, path, create=False, on_create=None):
        self.on_create = on_create
        self.path = os.path.abspath(path)
        self.display = self.path
        self._errors = (sqlite3.Error,)
        exists = os.path.exists(self.path)
        if not exists and not create:
            raise LedgerNotFound(f"no ledger at {self.path}: create it with `sage ledger init --db {path} ...`")
        if exists and os.path.isdir(self.path):
            raise LedgerError(f"ledger path {self.path} is a directory, not a ledger file")
        with _OPEN_FILES_LOCK:
            opened_here = bool(_OPEN_FILES.get(_file_id(self.path))) if exists else False
        if exists and not opened_here:  # never open()/close() the file while a connection of ours has it
            self._check_header()
        elif not exists:  # created 0600 before SQLite opens it (its -wal and -shm files take the same mode)
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass
            except OSError as exc:
                raise LedgerError(f"cannot create ledger at {self.path}: {exc.strerror}; check the path and its "
                                  "permissions") from None
        try:
            self._conn = sqlite3.connect(self.path, timeout=120.0, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA busy_timeout=120000")
        except sqlite3.Error as exc:
            verb = "open" if exists else "create"
            raise self._wrap(exc, f"cannot {verb} ledger at {self.path}") from None
        try:
            empty = not exists or self._is_empty()
            if empty and not create:
                raise LedgerNotFound(f"{self.path} is empty, not a sage ledger: create one with "
                                     f"`sage ledger init --db {path} ...`")
            if not empty:
                # Before any write: never switch another application's database to WAL.
                self._check_schema()
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as exc:
            self._conn.close()
            verb = "open" if exists else "create"
            raise self._wrap(exc, f"cannot {verb} ledger at {self.path}") from None
        except LedgerError:
            self._conn.close()
            raise
        if empty:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                for ddl in _TABLES:
                    self._conn.execute(ddl.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS").replace(
                        "CREATE INDEX", "CREATE INDEX IF NOT EXISTS"))
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._conn.rollback() if self._conn.in_transaction else None
                raise self._wrap(exc, f"cannot create ledger at {self.path}") from None
            self._create_schema()
            _restrict(self.path)
        self._check_schema()
        with _OPEN_FILES_LOCK:
            self._file = _file_id(self.path)
            _OPEN_FILES[self._file] = _OPEN_FILES.get(self._file, 0) + 1

    def _check_header(self):
        try:
            with open(self.path, "rb") as f:
                header = f.read(100)
        except OSError as exc:
            raise LedgerError(f"cannot read ledger at {self.path}: {exc.strerror}") from None
        if header and not header.startswith(b"SQLite format 3\x00"):
            raise LedgerCorrupt(f"{self.path} is not a sage ledger (not an SQLite database)")
        if 0 < len(header) < 100:
            raise LedgerCorrupt(f"{self.path} is truncated ({len(header)} bytes): not a usable ledger")

    def _is_empty(self):
        try:
            return self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        except sqlite3.Error as exc:
            raise self._wrap(exc) from None

    def _wrap(self, exc, prefix=None):
        msg = str(exc)
        prefix = prefix or f"ledger {self.path}"
        if isinstance(exc, sqlite3.DatabaseError) and any(
            s in msg for s in ("not a database", "malformed", "corrupt", "no such table")
        ):
            return LedgerCorrupt(f"{prefix} is corrupt or not a sage ledger: {msg}")
        if "readonly" in msg or "read-only" in msg or "unable to open" in msg:
            return LedgerError(f"{prefix}: cannot write ({msg}); check the path and its permissions")
        return LedgerError(f"{prefix}: {msg}")

    def _begin_write(self):
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._wrap(exc) from None

    def _begin_read(self):
        try:
            self._conn.execute("BEGIN")
        except sqlite3.Error as exc:
            raise self._wrap(exc) from None

    def _commit(self):
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._wrap(exc) from None

    def _rollback(self):
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def try_claim(self, name):
        """Hold the claim ``name`` for this process: (handle, None), or (None, who holds it).

        An flock on ``<ledger>.claims/<key>.lock`` (0600, in a 0700 folder): held per open file, so it is this
        process's until ``release_claim`` or its exit (the kernel drops a dead process's flock)."""
        import fcntl

        folder = self.path + ".claims"
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, f"{claim_key(name) & ((1 << 64) - 1):016x}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            finally:
                os.close(fd)
            return None, holder
        os.ftruncate(fd, 0)
        os.pwrite(fd, process_label().encode(), 0)
        return fd, None

    def release_claim(self, handle):
        os.close(handle)  # drops the flock

    def integrity_problems(self):
        rows = self._conn.execute("PRAGMA integrity_check").fetchall()
        return [] if rows == [("ok",)] else [r[0] for r in rows]

    def close(self):
        self._conn.close()
        with _OPEN_FILES_LOCK:
            if self._file is not None and _OPEN_FILES.get(self._file):
                _OPEN_FILES[self._file] -= 1
                if not _OPEN_FILES[self._file]:
                    del _OPEN_FILES[self._file]
            self._file = None


SSLMODES = ("verify-full", "verify-ca", "require", "disable")
DEFAULT_SSLMODE = "verify-full"


def postgres_ssl_context(query, display):
    """pg8000's ``ssl_context`` for a URL's query parameters: an SSLContext (TLS required), or False (sslmode=disable).

    Never None or True: with those pg8000 tries unverified TLS and falls back to plain text.
    """
    import ssl

    mode = query.get("sslmode", DEFAULT_SSLMODE)
    if mode in ("allow", "prefer"):
        raise LedgerError(f"sslmode={mode} in {display} may fall back to plain text silently: use sslmode=verify-full "
                          "(the default: TLS with a verified server certificate), or sslmode=disable explicitly for a "
                          "loopback or test server")
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


def _connect_hint(exc):
    text = str(exc)
    if "refuses SSL" in text:
        return ("the server does not offer TLS, and plain text is refused by default: enable TLS on the server, or "
                "add sslmode=disable to the URL for a loopback or test server")
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text or "match target host" in text:
        return (f"{text}: the server's certificate must verify against sslrootcert=PATH (or the system's CAs) and "
                "name the host; sslmode=require skips the check explicitly (encrypted, not authenticated)")
    return text


class PostgresStore(_Store):
    kind = "postgresql"
    placeholder = "%s"

    def __init__(self, url, create=False, on_create=None):
        import pg8000.dbapi

        self.on_create = on_create
        parsed = urllib.parse.urlparse(url)
        self.display = parsed._replace(netloc=parsed.netloc.rsplit("@", 1)[-1]).geturl()
        self._errors = (pg8000.dbapi.Error,)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        ssl_context = postgres_ssl_context(query, self.display)
        sock = None
        try:
            timeout = float(query.get("timeout", 120))
            sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 5432), timeout)
            # pg8000 leaves Nagle's algorithm on: a statement longer than its 8 KiB write buffer
            # (a batched write, a long IN list) then waits ~40 ms for the server's delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # as pg8000 does by default
            self._conn = pg8000.dbapi.connect(
                user=urllib.parse.unquote(parsed.username or "postgres"),
                password=urllib.parse.unquote(parsed.password) if parsed.password else None,
                database=(parsed.path or "/postgres").lstrip("/") or "postgres",
                host=parsed.hostname or "127.0.0.1",  # with sock, only the name TLS verifies
                sock=sock,
                ssl_context=ssl_context,
                application_name=process_label(),  # who holds a claim (try_claim), in pg_stat_activity
            )
        except Exception as exc:  # pg8000 raises InterfaceError/OSError/SSLError subclasses on connect
            if sock is not None:
                sock.close()
            raise LedgerError(f"cannot connect to ledger {self.display}: {_connect_hint(exc)}") from None
        self._conn.autocommit = True
        has_meta = self._query_one("SELECT to_regclass('public.meta') IS NOT NULL")[0]
        if not has_meta:
            if not create:
                raise LedgerNotFound(f"no ledger at {self.display}: create it with `sage ledger init`")
            self._conn.autocommit = False
            try:
                cur = self._conn.cursor()
                cur.execute("SELECT pg_advisory_xact_lock(727272)")  # serialize concurrent inits
                cur.execute("SELECT to_regclass('public.meta') IS NOT NULL")
                if not cur.fetchone()[0]:
                    for ddl in _TABLES:
                        cur.execute(ddl)
                self._conn.commit()
            except pg8000.dbapi.Error as exc:
                self._conn.rollback()
                raise LedgerError(f"cannot create ledger at {self.display}: {exc}") from None
            self._create_schema()
        self._conn.autocommit = False
        self._check_schema()

    def _query_one(self, sql):
        cur = self._conn.cursor()
        cur.execute(sql)
        return cur.fetchone()

    def _wrap(self, exc, prefix=None):
        return LedgerError(f"{prefix or 'ledger ' + self.display}: {exc}")

    def _begin_write(self):
        self._conn.autocommit = False
        cur = self._conn.cursor()
        cur.execute("SELECT value FROM meta WHERE key = 'lock' FOR UPDATE")

    def _begin_read(self):
        # One snapshot for the whole read transaction (READ COMMITTED, the default, takes one per statement):
        # a read of several tables while another host writes sees one state of the ledger, as the audit
        # needs (audit.py). Read-only, so it never meets a serialization failure.
        self._conn.autocommit = False
        self._conn.cursor().execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def _commit(self):
        self._conn.commit()

    def _rollback(self):
        self._conn.rollback()

    def try_claim(self, name):
        """Hold the claim ``name`` for this connection: (handle, None), or (None, who holds it).

        A session-level advisory lock (``pg_try_advisory_lock``), seen by every host of the ledger and dropped
        by the server when the holder's connection ends (its process exited or was killed)."""
        key = claim_key(name)
        cur = self._conn.cursor()
        try:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
            if cur.fetchone()[0]:
                return key, None
            unsigned = key & ((1 << 64) - 1)
            cur.execute("SELECT a.application_name, host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a"
                        " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                        " AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid AND l.database ="
                        " (SELECT oid FROM pg_database WHERE datname = current_database())",
                        (unsigned >> 32, unsigned & 0xFFFFFFFF))
            row = cur.fetchone()
            holder = "another process"
            if row is not None and row[0]:
                holder = row[0] + (f", connected from {row[1]}" if row[1] else "")
            return None, holder
        finally:
            self._conn.commit()  # a session lock outlives the transaction it was taken in

    def release_claim(self, handle):
        cur = self._conn.cursor()
        cur.execute("SELECT pg_advisory_unlock(%s)", (handle,))
        self._conn.commit()

    def integrity_problems(self):
        return []

    def close(self):
        self._conn.close()
