"""What one process holds of an open ledger besides its store: where the key file is (``KeySource``, creating it
with a new ledger) and the pipeline names it claims (``PipelineClaim``). docs/security.md ("Keys"),
docs/scale_out.md ("Several hosts on one PostgreSQL ledger").

An older ledger (its secret in ``meta.secret``) is migrated by its upgrade (``migrate_secret``), and the keyed ``keys``
log entry the migration wrote is read back by ``migration_entry``. The ``Ledger`` facade (``ledger.py``) uses
these; this module imports neither the facade nor the audit.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .keys import KeyFileError, KeyRing
from .store import sql

if TYPE_CHECKING:
    from .store.base import Store


class PipelineClaim:
    """Pipeline names this process holds (``Ledger.claim``); ``release()`` or leave the ``with`` block."""

    def __init__(self, store: Store, handles: Iterable[Any]) -> None:
        self._store, self._handles = store, list(handles)

    def release(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            self._store.release_claim(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class KeySource:
    """Where a ledger's key file is, and creating it with a new ledger (``Ledger.open``)."""

    path: Any  # the key file's path; None only with an error, which ``keyring()`` raises

    def __init__(self, path: str | None, create: bool, error: Exception | None = None) -> None:
        self.path, self.create, self._error = path, create, error
        self._keyring: KeyRing | None = None
        self.created_key = self.created_ledger = False

    def keyring(self) -> KeyRing:
        if self._error is not None:
            raise self._error
        if self._keyring is None:
            self._keyring = KeyRing.load(self.path)
        return self._keyring

    def new_ledger_meta(self) -> dict[str, str]:
        """Called by the store as it creates a ledger: the meta rows (key id, ledger id); creates the key file
        if it does not exist (an existing key file is used: one key may serve a ledger re-created at its path)."""
        if not os.path.exists(self.path):
            self._keyring = KeyRing.create(self.path)
            self.created_key = True
        self.created_ledger = True
        return {"key_id": self.keyring().key_id, "ledger_id": secrets.token_hex(16)}

    def undo_created(self) -> None:
        """The ledger was not created after all: remove the key file made for it."""
        if self.created_key:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def migrate_secret(
    store: Store,
    key_source: KeySource,
    secret: str,
    log: Callable[..., object],
    adopt: Callable[[KeyRing, str], object],
) -> KeyRing:
    """Move an older ledger's ``meta.secret`` out of the database (docs/security.md, "Migration"); return the
    new ``KeyRing``.

    1. the key file is written (new master key + the old secret, 0600, fsync) unless it exists already
       holding this secret (a migration killed after step 1);
    2. one transaction deletes ``meta.secret``, records the key id and a ledger id, and appends (``log(tx, kind,
       body)``) a keyed ``keys`` log entry naming the grants signed with the old secret and the last entry
       chained without a key (the audit verifies those with the old rules). ``adopt(keys, ledger_id)`` is
       called in that transaction before the entry is logged (the ledger chains and heads under the new key).
    A kill between the steps leaves the secret in the database and the key file beside it: the next open
    finds both and finishes step 2.
    """
    if key_source.path is None:
        key_source.keyring()  # raises: no key file location (PostgreSQL)
    path = key_source.path
    if not os.path.exists(path):
        try:
            KeyRing.create_migrated(path, secret)
        except KeyFileError:
            if not os.path.exists(path):  # else: another process migrating at the same moment
                raise
    keys = KeyRing.load(path)
    if keys.legacy_secret != secret.encode():
        raise KeyFileError(
            f"key file {path} exists but does not hold ledger {store.display}'s old secret: this ledger "
            "is from an older version and is migrated by its upgrade; give its own key file, or a path where none "
            "exists yet (--key-file PATH or SAGE_KEY_FILE=PATH)"
        )
    with store.transaction() as tx:
        if tx.one(sql.META_HAS_SECRET) is None or tx.one(sql.META_HAS_KEY_ID) is not None:
            return keys  # migrated by another process meanwhile
        last = tx.one(sql.LOG_LAST_SEQ)
        grants = sorted(r[0] for r in tx.all(sql.GRANT_IDS))
        ledger_id = (tx.one(sql.META_LEDGER_ID) or [None])[0] or _migrated_ledger_id(secret)
        tx.run(sql.META_DELETE_KEY_ROWS)
        tx.run(sql.META_INSERT_KEY_ID, (keys.key_id,))
        tx.run(sql.META_INSERT_LEDGER_ID, (ledger_id,))
        adopt(keys, ledger_id)
        log(tx, "keys", {"key_id": keys.key_id, "legacy_chain_until": last[0] if last else 0, "legacy_grants": grants})
    return keys


def _migrated_ledger_id(secret):
    """A migrated ledger's id, derived from its old secret: a copy of it restored from before the migration and
    migrated again gets the same id, so this host's head of the ledger still catches the rollback (anchor.py)."""
    return hmac.new(secret.encode(), b"sage-tfx ledger id", "sha256").hexdigest()[:32]


def migration_entry(store: Store, keys: KeyRing) -> dict[str, Any]:
    """The body of the keyed ``keys`` entry a key migration wrote ({} if none, or if it does not verify under
    ``keys``, or if it does not follow the last unkeyed entry)."""
    with store.transaction(write=False) as tx:
        row = tx.one(sql.LOG_FIRST_KEYS_ENTRY)
    if row is None or not keys.entry_ok(row[3], row[0], row[5], row[1], row[2], row[4]):
        return {}
    body = json.loads(row[2])
    return body if body.get("legacy_chain_until") == row[0] - 1 else {}
