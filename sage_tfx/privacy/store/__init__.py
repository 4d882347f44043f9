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

__all__ = ["check_location", "open_store", "Store", "Tx", "SqliteStore", "PostgresStore", "SCHEMA_VERSION", "TABLES",
           "MIGRATIONS", "SSLMODES", "DEFAULT_SSLMODE", "postgres_ssl_context", "claim_key", "process_label"]


def check_location(location):
    """``location`` as a text, or LedgerError naming it: not a path or URL, empty, or holding a NUL byte (no file
    has such a name)."""
    if not isinstance(location, (str, os.PathLike)) or not str(location) or "\x00" in str(location):
        raise LedgerError(f"ledger location {location!r} is invalid: give a file path or a postgresql:// URL")
    return str(location)


def open_store(location, create=False, on_create=None):
    """A SqliteStore for a path, a PostgresStore for a ``postgresql://`` URL.

    ``on_create()``, called as a new ledger's schema is written, returns the meta rows to add (the key id and
    ledger id: ``Ledger.open``); the database never holds a key (docs/security.md).
    """
    location = check_location(location)
    if location.startswith(("postgresql://", "postgres://")):
        return PostgresStore(location, create=create, on_create=on_create)
    return SqliteStore(location, create=create, on_create=on_create)
