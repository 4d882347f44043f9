"""Ledger storage: one schema, two backends (embedded SQLite, shared PostgreSQL); docs/security.md.

* ``base``: the backend-independent ``Store`` (transactions, the schema check and migration driver) and ``Tx``;
* ``sqlite``: ``SqliteStore`` (WAL, ``BEGIN IMMEDIATE``, ``synchronous=FULL``: many processes on one host);
* ``postgres``: ``PostgresStore`` (the ``meta`` lock row ``FOR UPDATE``: processes on many hosts), its TLS
  settings (``postgres_ssl_context``: verified TLS by default) and connection hints;
* ``location``: a ledger location checked (never a password in a URL), shown, and its PostgreSQL password found
  (``$PGPASSWORD``, a libpq password file);
* ``sql``: ALL the SQL text of the store and the audit (schema per version, migrations, statements).

The package imports nothing from the ledger facade or the audit (tests/architecture/test_import_graph.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from .base import Store, Tx, claim_key, process_label
from .location import check_location, display, is_postgres, postgres_password
from .postgres import DEFAULT_SSLMODE, SSLMODES, PostgresStore, postgres_ssl_context
from .sql import MIGRATIONS, SCHEMA_VERSION, TABLES
from .sqlite import SqliteStore

_Store = Store  # the base class's name before the package (store.py)

__all__ = [
    "open_store",
    "check_location",
    "display",
    "is_postgres",
    "postgres_password",
    "Store",
    "Tx",
    "SqliteStore",
    "PostgresStore",
    "SCHEMA_VERSION",
    "TABLES",
    "MIGRATIONS",
    "SSLMODES",
    "DEFAULT_SSLMODE",
    "postgres_ssl_context",
    "claim_key",
    "process_label",
]


def open_store(
    location: str | os.PathLike[str],
    create: bool = False,
    on_create: Callable[[], Mapping[str, str]] | None = None,
    read_only: bool = False,
    upgrade: bool = False,
) -> Store:
    """A SqliteStore for a path, a PostgresStore for a ``postgresql://`` URL; ``read_only`` (never with ``create``):
    opened for reads only, writing nothing (``SqliteStore._open_read_only``; PostgreSQL: a read-only session).
    A ledger of an older schema is refused (``LedgerUpgradeNeeded``) unless ``upgrade`` (``sage ledger upgrade``:
    ``migrations.py``), which runs its DDL steps.

    ``on_create()``, called as a new ledger's schema is written, returns the meta rows to add (the key id and
    ledger id: ``Ledger.open``); the database never holds a key (docs/security.md).
    """
    location = check_location(location)  # a file path, or a URL without a password (location.py)
    if is_postgres(location):
        return PostgresStore(location, create=create, on_create=on_create, read_only=read_only, upgrade=upgrade)
    return SqliteStore(location, create=create, on_create=on_create, read_only=read_only, upgrade=upgrade)
