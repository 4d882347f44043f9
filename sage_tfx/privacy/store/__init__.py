"""Ledger storage: one schema, two backends (embedded SQLite, shared PostgreSQL); docs/security.md.

* ``base``: the backend-independent ``Store`` (transactions, the schema check and migration driver) and ``Tx``;
* ``sqlite``: ``SqliteStore`` (WAL, ``BEGIN IMMEDIATE``, ``synchronous=FULL``: many processes on one host);
* ``postgres``: ``PostgresStore`` (the ``meta`` lock row ``FOR UPDATE``: processes on many hosts), its TLS
  settings (``postgres_ssl_context``: verified TLS by default) and connection hints;
* ``sql``: ALL the SQL text of the store and the audit (schema per version, migrations, statements).

The package imports nothing from the ledger facade or the audit (tests/test_import_graph.py).
"""
import os

from ..errors import LedgerError
from .base import Store, Tx, claim_key, process_label
from .postgres import DEFAULT_SSLMODE, SSLMODES, PostgresStore, postgres_ssl_context
from .sql import MIGRATIONS, SCHEMA_VERSION, TABLES
from .sqlite import SqliteStore

_Store = Store  # the base class's name before the package (store.py)

__all__ = ["open_store", "Store", "Tx", "SqliteStore", "PostgresStore", "SCHEMA_VERSION", "TABLES", "MIGRATIONS",
           "SSLMODES", "DEFAULT_SSLMODE", "postgres_ssl_context", "claim_key", "process_label"]


def open_store(location, create=False, on_create=None, read_only=False):
    """A SqliteStore for a path, a PostgresStore for a ``postgresql://`` URL; ``read_only`` (never with ``create``):
    opened for reads only, writing nothing (``SqliteStore._open_read_only``; PostgreSQL: a read-only session).

    ``on_create()``, called as a new ledger's schema is written, returns the meta rows to add (the key id and
    ledger id: ``Ledger.open``); the database never holds a key (docs/security.md).
    """
    if not isinstance(location, (str, os.PathLike)) or not str(location):
        raise LedgerError(f"ledger location {location!r} is invalid: give a file path or a postgresql:// URL")
    location = str(location)
    if location.startswith(("postgresql://", "postgres://")):
        return PostgresStore(location, create=create, on_create=on_create, read_only=read_only)
    return SqliteStore(location, create=create, on_create=on_create, read_only=read_only)
