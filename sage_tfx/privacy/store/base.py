"""The ledger store's backend-independent part: transactions, the schema check and migration driver, ``Tx``.

Every write is one serializable transaction that first takes the ledger's write lock, so a check-and-charge over
many blocks is atomic and concurrent writers never interleave; how a backend takes that lock is its own
(``sqlite.py``: ``BEGIN IMMEDIATE``; ``postgres.py``: ``SELECT ... FOR UPDATE`` on the ``meta`` lock row). The SQL
text lives in ``sql.py``, written once with ``?`` placeholders; a backend whose driver wants another placeholder
sets ``placeholder`` and ``Tx`` rewrites each statement. This package imports nothing from the ledger facade or
the audit (tests/architecture/test_import_graph.py).
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import LedgerCorrupt, LedgerError, LedgerUpgradeNeeded
from . import sql
from .sql import SCHEMA_VERSION


class Store:
    """Shared logic; a backend provides ``kind``, ``display``, ``_conn``, ``_errors``, ``_wrap``, ``_begin_write``,
    ``_begin_read``, ``_commit``, ``_rollback``, ``_has_column``, ``try_claim``, ``release_claim``,
    ``integrity_problems`` and ``close``, and ``placeholder`` if its driver does not take ``?``."""

    kind: str | None = None
    placeholder = "?"
    statements = 0  # SQL statements this store executed (an executemany counts one per row): tests bound them
    # called with a write transaction's ``tx.head`` (and ``tx.head_until_use``) once it committed
    after_commit: Callable[..., None] | None = None
    on_create: Callable[[], Mapping[str, str]] | None = None
    read_only = False  # opened for reads only (the audit): never migrated, never written
    upgrade = False  # opened by ``sage ledger upgrade`` (migrations.py): an older schema is migrated, not refused
    # Provided by each backend (declared here for the type checker only).
    display: str
    _conn: Any
    _errors: tuple[type[BaseException], ...]
    _wrap: Callable[..., Any]
    try_claim: Callable[[str], tuple[Any, str | None]]
    release_claim: Callable[[Any], None]
    integrity_problems: Callable[[], list[str]]
    _has_column: Callable[..., bool]
    close: Callable[[], None]

    def _sql(self, text):
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def transaction(self, write: bool = True) -> _Transaction:
        """A context giving a Tx; commit on success, roll back on any exception (nothing changes). A write on a
        ``read_only`` store is refused before it begins."""
        if write and self.read_only:
            raise LedgerError(f"ledger {self.display} is opened read-only (the audit): it writes nothing")
        return _Transaction(self, write)

    def _check_schema(self):
        try:
            with self.transaction(write=False) as tx:
                row = tx.one(sql.META_SCHEMA_VERSION)
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
            if not self.upgrade or self.read_only:
                raise LedgerUpgradeNeeded(upgrade_text(self.display, version))

    def schema_steps(self, progress: Callable[[str], None] | None = None) -> None:
        """Run the DDL steps (``sql.MIGRATIONS``) that bring an older ledger towards SCHEMA_VERSION, one version per
        write transaction, up to the first keyed step (``sql.KEYED_STEPS``: its DDL run, its version left for
        ``migrations.py`` to set with its keyed entry). ``progress(text)`` hears each version."""
        while True:
            with self.transaction(write=True) as tx:
                version = int(tx.one(sql.META_SCHEMA_VERSION)[0])
                if version not in sql.MIGRATIONS:
                    return
                for step in sql.MIGRATIONS[version]:
                    if isinstance(step, sql.AddColumn):
                        # a migration may be re-run on either backend: add the column only where it is missing
                        if not self._has_column(tx, step.table, step.column):
                            tx.run(sql.add_column(step))
                    else:
                        tx.run(step)
                if version in sql.KEYED_STEPS:
                    return
                tx.run(sql.META_SET_SCHEMA_VERSION, (str(version + 1),))
            if progress is not None:
                progress(f"schema {version} -> {version + 1}: tables and columns")

    def _create_schema(self):
        with self.transaction(write=True) as tx:
            if tx.one(sql.META_HAS_SCHEMA_VERSION) is not None:
                return False
            extra = self.on_create() if self.on_create is not None else {}
            tx.run(sql.META_INSERT_SCHEMA_VERSION, (str(SCHEMA_VERSION),))
            tx.run(sql.META_INSERT_LOCK)
            for key, value in sorted(extra.items()):
                tx.run(sql.META_INSERT, (key, value))
        return True


def upgrade_text(display: str, version: object) -> str:
    """The refusal of a ledger of an older schema, naming the one command that upgrades it."""
    return (
        f"ledger {display} has schema version {version}, older than this sage-tfx's {SCHEMA_VERSION}: nothing "
        f"was written; upgrade it once (keyed, logged in the ledger, idempotent) with: sage ledger upgrade "
        f"--db {display} (add --key-file PATH if its key file is not the default), then retry"
    )


def claim_key(name: str) -> int:
    """A claim's lock key: 63 bits of SHA-256 of its name (a PostgreSQL advisory lock key, a lock file's name)."""
    return int.from_bytes(hashlib.sha256(b"sage-claim\0" + name.encode()).digest()[:8], "big", signed=True)


def process_label() -> str:
    """'sage@HOST pid N': who holds a claim (PostgreSQL's application_name; the text of an SQLite claim file)."""
    return f"sage@{socket.gethostname()} pid {os.getpid()}"[:63]


class _Transaction:
    """``Store.transaction``'s context (a class, not a generator: entered once per ledger call, the hot path of a
    grant): begin; on leaving, roll back on any exception, else commit and hand a write's ``tx.head`` to
    ``after_commit``."""

    __slots__ = ("store", "write", "tx")

    def __init__(self, store, write) -> None:
        self.store, self.write, self.tx = store, write, None

    def __enter__(self):
        store = self.store
        store._begin_write() if self.write else store._begin_read()
        self.tx = Tx(store)
        return self.tx

    def __exit__(self, exc_type, exc, tb):
        store = self.store
        if exc_type is not None:
            store._rollback()
            return False
        store._commit()
        head = getattr(self.tx, "head", None)
        if self.write and head is not None and store.after_commit is not None:
            store.after_commit(head, getattr(self.tx, "head_until_use", False))
        return False


class Tx:
    """One open transaction: ``run`` executes, ``one``/``all`` fetch."""

    # Set by the ledger facade on a write: the log's head after its last append, the log's last entry as the
    # request read it, and whether the head must be durable before the grant's first use (HeadSync.USE).
    head: tuple
    log_last: tuple | None
    range_reserved: bool  # a reservation lies in the requested blocks' id range (requests.read_request)
    head_until_use: bool

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cur = store._conn.cursor()

    def run(self, sql: str, params: Sequence[Any] = ()) -> Any:
        store = self._store
        store.statements += 1
        try:
            self._cur.execute(store._sql(sql), tuple(params))
        except store._errors as exc:
            raise store._wrap(exc) from None
        return self._cur

    def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = [tuple(r) for r in rows]
        self._store.statements += len(rows)
        try:
            self._cur.executemany(self._store._sql(sql), rows)
        except self._store._errors as exc:
            raise self._store._wrap(exc) from None

    def one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.run(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.run(sql, params).fetchall()
