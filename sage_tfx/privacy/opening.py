"""Opening a ledger's store with its key file, run by ``Ledger.open`` before the facade exists (docs/security.md).

``key_source`` resolves and checks the key file before anything is created; ``open_checked_store`` opens (or
creates) the store, undoing a key file it created if the store cannot be opened. This module imports neither the
``Ledger`` facade nor the audit.
"""

from __future__ import annotations

import os
from typing import Any

from .keys import KeyFileError, resolve_key_path
from .session import KeySource
from .store import open_store


def key_source(location: str, key_file: str | None, create: bool) -> KeySource:
    """The ledger's key file source (``keys.resolve_key_path``), checked before anything is created.

    Args:
        location: the checked ledger location (``store.check_location``).
        key_file: the key file given, or None ($SAGE_KEY_FILE, else ``<sqlite path>.key``).
        create: whether the ledger (and its key file) may be created.

    Returns:
        The ``KeySource``; on PostgreSQL without a key file and ``create`` False, one holding the error (a
        connection error is named first).

    Raises:
        KeyFileError: a key file that is too open or malformed, or whose folder does not exist for ``create``.
    """
    try:
        keys = KeySource(resolve_key_path(location, key_file), create)
    except KeyFileError as exc:
        if create:
            raise  # before anything is created
        keys = KeySource(None, create, error=exc)  # PostgreSQL: a connection error is named first
    if keys.path is None:
        pass
    elif os.path.exists(keys.path):
        keys.keyring()  # a key file that is too open or malformed is refused before anything is created
    elif create and not os.path.isdir(os.path.dirname(keys.path)):
        raise KeyFileError(
            f"cannot create key file {keys.path}: folder {os.path.dirname(keys.path)} does not "
            "exist (create it, mode 0700, or give another --key-file)"
        )
    return keys


def open_checked_store(location: str, keys: KeySource, create: bool, read_only: bool, upgrade: bool = False) -> Any:
    """The store at ``location`` (``store.open_store``; ``upgrade``: an older schema is migrated, else refused);
    a key file created for it is removed if it fails."""
    try:
        return open_store(location, create=create, on_create=keys.new_ledger_meta, read_only=read_only, upgrade=upgrade)
    except BaseException:
        keys.undo_created()
        raise
