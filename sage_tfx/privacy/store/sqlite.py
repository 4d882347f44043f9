"""The embedded backend: one SQLite file, safe for many processes on one host.

WAL journal, ``BEGIN IMMEDIATE`` (takes the database write lock up front), ``synchronous=FULL`` so an
acknowledged grant survives a crash or a kill -9. A new ledger file and its WAL/SHM files are mode 0600
(docs/security.md). A read-only open (the audit) writes nothing at all: ``SqliteStore._open_read_only``.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Mapping

from ..errors import LedgerCorrupt, LedgerError, LedgerNotFound
from . import sql
from .base import Store, claim_key, process_label


def _restrict(path):
    """A new SQLite ledger and its WAL/SHM files: mode 0600 (the owner's alone; docs/security.md)."""
    for p in (path, path + "-wal", path + "-shm"):
        try:
            os.chmod(p, 0o600)
        except FileNotFoundError:
            pass


# SQLite files this process has open through a SqliteStore: {(st_dev, st_ino): connections}. SQLite's locks are
# POSIX record locks, held per PROCESS and file: closing ANY descriptor of the file in this process drops every
# lock this process holds on it, those of its open connections too (the WAL's shared lock among them). Another
# process then believes it holds the last connection, checkpoints and deletes the WAL under the first one's
# feet: a corrupt ledger (seen with `sage serve`'s worker processes, each holding its ledger while a pipeline
# component opens a second one). So the header is read with open()/close() only while this process has no
# connection to the file; otherwise an open connection already checked it.
_OPEN_FILES: dict = {}
_OPEN_FILES_LOCK = threading.Lock()


def _file_id(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class SqliteStore(Store):
    kind = "sqlite"
    _file = None

    def __init__(
        self,
        path: str | os.PathLike[str],
        create: bool = False,
        on_create: Callable[[], Mapping[str, str]] | None = None,
        read_only: bool = False,
        upgrade: bool = False,
    ) -> None:
        self.on_create = on_create
        self.read_only, self.upgrade = read_only, upgrade
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
        if read_only:
            self._open_read_only()
        else:
            self._open_writable(path, exists, create)
        self._check_schema()
        with _OPEN_FILES_LOCK:
            self._file = _file_id(self.path)
            _OPEN_FILES[self._file] = _OPEN_FILES.get(self._file, 0) + 1

    def _open_writable(self, path, exists, create):
        """Connect for reads and writes (WAL, synchronous=FULL), creating the file and schema if ``create``."""
        if not exists:  # created 0600 before SQLite opens it (its -wal and -shm files take the same mode)
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass
            except OSError as exc:
                raise LedgerError(
                    f"cannot create ledger at {self.path}: {exc.strerror}; check the path and its permissions"
                ) from None
        try:
            self._conn = sqlite3.connect(self.path, timeout=120.0, isolation_level=None, check_same_thread=False)
            self._conn.execute(sql.SQLITE_BUSY_TIMEOUT)
        except sqlite3.Error as exc:
            verb = "open" if exists else "create"
            raise self._wrap(exc, f"cannot {verb} ledger at {self.path}") from None
        try:
            empty = not exists or self._is_empty()
            if empty and not create:
                raise LedgerNotFound(
                    f"{self.path} is empty, not a sage ledger: create one with `sage ledger init --db {path} ...`"
                )
            if not empty:
                # Before any write: never switch another application's database to WAL.
                self._check_schema()
            self._conn.execute(sql.SQLITE_WAL)
            self._conn.execute(sql.SQLITE_SYNCHRONOUS_FULL)
        except sqlite3.Error as exc:
            self._conn.close()
            verb = "open" if exists else "create"
            raise self._wrap(exc, f"cannot {verb} ledger at {self.path}") from None
        except LedgerError:
            self._conn.close()
            raise
        if empty:
            try:
                self._conn.execute(sql.SQLITE_BEGIN_WRITE)
                for ddl in sql.TABLES:
                    self._conn.execute(sql.if_not_exists(ddl))
                self._conn.execute(sql.SQLITE_COMMIT)
            except sqlite3.Error as exc:
                self._conn.rollback() if self._conn.in_transaction else None
                raise self._wrap(exc, f"cannot create ledger at {self.path}") from None
            self._create_schema()
            _restrict(self.path)

    def _open_read_only(self):
        """Connect without writing a byte (``sage ledger audit``: a read-only copy or mount, a full disk).

        No ``-wal`` file: no connection has the ledger open (the last one to close removes it), so it is opened
        ``immutable=1`` (no locks, no ``-shm``/``-wal`` created: a read-only mount or a full disk cannot refuse
        it) and ``_check_unchanged`` makes sure no writer opened it meanwhile. A ``-wal`` file: the ledger is in
        use (or a crash left committed transactions in it), so it is read through the WAL with ``mode=ro``.
        Never migrated, never switched to WAL."""
        wal = os.path.exists(self.path + "-wal")
        uri = f"file:{urllib.parse.quote(self.path)}?{'mode=ro' if wal else 'immutable=1'}"
        try:
            self._conn = sqlite3.connect(uri, uri=True, timeout=120.0, isolation_level=None, check_same_thread=False)
            self._conn.execute(sql.SQLITE_BUSY_TIMEOUT)
            self._unlocked_state = None if wal else self._file_state()
            if self._is_empty():
                raise LedgerNotFound(f"{self.path} is empty, not a sage ledger")
        except sqlite3.Error as exc:
            self._conn.close()
            hint = (
                f": its -wal file holds transactions not yet in the database file, and SQLite cannot read them "
                f"without a writable -shm file beside it; checkpoint it where it is writable (sqlite3 "
                f"{self.path} 'PRAGMA wal_checkpoint') and copy it again"
                if wal
                else ""
            )
            if hint:
                raise LedgerError(f"cannot open ledger {self.path} read-only ({exc}){hint}") from None
            raise self._wrap(exc, f"cannot open ledger {self.path} read-only") from None
        except LedgerError:
            self._conn.close()
            raise

    def _file_state(self):
        st = os.stat(self.path)
        return st.st_ino, st.st_size, st.st_mtime_ns, os.path.exists(self.path + "-wal")

    def _check_unchanged(self):
        """An ``immutable`` read (``_open_read_only``): LedgerError if a writer opened or changed the file since the
        open (what was read may mix two states)."""
        if getattr(self, "_unlocked_state", None) is not None and self._file_state() != self._unlocked_state:
            raise LedgerError(
                f"ledger {self.path} was opened for writing while it was read without locks "
                "(read-only open): what was read may mix two states; run the audit again"
            )

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
            return self._conn.execute(sql.SQLITE_IS_EMPTY).fetchone()[0] == 0
        except sqlite3.Error as exc:
            raise self._wrap(exc) from None

    def _wrap(self, exc, prefix=None):
        self._check_unchanged()  # a read-only open's file changed under it: that, not what it caused
        msg = str(exc)
        prefix = prefix or f"ledger {self.path}"
        if isinstance(exc, sqlite3.DatabaseError) and any(
            s in msg for s in ("not a database", "malformed", "corrupt", "no such table")
        ):
            return LedgerCorrupt(f"{prefix} is corrupt or not a sage ledger: {msg}")
        if "readonly" in msg or "read-only" in msg or "unable to open" in msg:
            return LedgerError(f"{prefix}: cannot write ({msg}); check the path and its permissions")
        return LedgerError(f"{prefix}: {msg}")

    def _has_column(self, tx, table, column):
        return any(r[1] == column for r in tx.all(sql.sqlite_columns(table)))

    def _control(self, statement):
        """Run a transaction-control statement; an SQLite error becomes the store's LedgerError."""
        try:
            self._conn.execute(statement)
        except sqlite3.Error as exc:
            raise self._wrap(exc) from None

    def _begin_write(self):
        self._control(sql.SQLITE_BEGIN_WRITE)

    def _begin_read(self):
        self._control(sql.SQLITE_BEGIN_READ)

    def _commit(self):
        self._control(sql.SQLITE_COMMIT)
        self._check_unchanged()

    def _rollback(self):
        if self._conn.in_transaction:
            self._conn.execute(sql.SQLITE_ROLLBACK)

    def try_claim(self, name: str) -> tuple[int | None, str | None]:
        """Hold the claim ``name`` for this process: (handle, None), or (None, who holds it).

        An flock on ``<ledger>.claims/<key>.lock`` (0600, in a 0700 folder): held per open file, so it is this
        process's until ``release_claim`` or its exit (the kernel drops a dead process's flock)."""

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

    def release_claim(self, handle: int) -> None:
        os.close(handle)  # drops the flock

    def integrity_problems(self) -> list[str]:
        rows = self._conn.execute(sql.SQLITE_INTEGRITY_CHECK).fetchall()
        return [] if rows == [("ok",)] else [r[0] for r in rows]

    def close(self) -> None:
        self._conn.close()
        with _OPEN_FILES_LOCK:
            if self._file is not None and _OPEN_FILES.get(self._file):
                _OPEN_FILES[self._file] -= 1
                if not _OPEN_FILES[self._file]:
                    del _OPEN_FILES[self._file]
            self._file = None
