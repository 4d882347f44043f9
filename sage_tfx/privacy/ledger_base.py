"""What every ``Ledger`` operation stands on: the store, the key ring, the head file and the keyed log append.

``LedgerBase`` checks a ledger against its anchor (``anchor.py``: the id its keyed ``ledger`` entry binds, this
host's head file) before any write, appends every entry to the keyed hash chain (``_log``) and records the last one
in the head file after each commit (docs/security.md, "Rollback: the database against its anchor, on every open").
The ``Ledger`` facade (``ledger.py``) adds the operations; this module imports neither the facade nor the audit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import anchor as _anchor
from .chain import GENESIS, canonical
from .errors import LedgerError, LedgerRollback, LedgerUpgradeNeeded
from .grants import signature_ok
from .head_file import HeadFile, HeadSync, head_sync_mode, warn_head_write
from .keys import KeyFileError
from .ledger_reads import LedgerReads
from .session import KeySource, PipelineClaim, migrate_secret, migration_entry
from .store import sql
from .store.base import Store, upgrade_text

if TYPE_CHECKING:
    from .keys import KeyRing


class LedgerBase(LedgerReads):
    """An open ledger's store, keys, head file and keyed log (open one with ``Ledger.open``)."""

    def __init__(
        self,
        store: Store,
        keys: KeySource,
        head_sync: HeadSync | str | None = None,
        check_head: bool = True,
        read_only: bool = False,
        upgrade: bool = False,
    ) -> None:
        """``keys``: the ledger's ``_KeySource`` (use ``Ledger.open``)."""
        self._read_only = read_only
        self._head_sync = head_sync_mode(head_sync)
        self._store = store
        self._claims: list[PipelineClaim] = []  # PipelineClaims of this process (Ledger.claim), released by close()
        self._key_source = keys
        self._legacy_grants: frozenset[str] = frozenset()
        self.migrated_secret = False  # this open (``migrations.upgrade``) moved an older ledger's secret out
        self._anchored = False  # the head file may record this ledger's writes (set by _check_anchor)
        self.anchor_problem = None  # what _check_anchor found (check_head=False): then nothing is written
        with store.transaction(write=False) as tx:
            meta = dict(tx.all(sql.META_ALL))
        if "secret" in meta and "key_id" not in meta:
            if read_only or not upgrade:
                raise LedgerUpgradeNeeded(upgrade_text(store.display, "<9 (its secret is still in the database)"))
            self._keys = self._migrate_secret(meta["secret"])
            self.migrated_secret = True
            with store.transaction(write=False) as tx:
                meta = dict(tx.all(sql.META_ALL))
        else:
            self._keys = keys.keyring()
        if meta.get("key_id") != self._keys.key_id:
            raise KeyFileError(
                f"key file {keys.path} is not the key of ledger {store.display} (key id {self._keys.key_id}, the "
                f"ledger's {meta.get('key_id')}): give this ledger's key file (--key-file PATH or SAGE_KEY_FILE=PATH)"
            )
        self._head = HeadFile(self._keys.head_path, self._head_sync)
        self._head.old_form = upgrade  # its JSON form read, to be rewritten (``migrations.py``)
        store.after_commit = self._advance_head
        self._check_anchor(meta.get("ledger_id") or "", keys.created_ledger, check_head)
        if self._keys.legacy_secret is not None:
            self._legacy_grants = frozenset(self._migration_entry().get("legacy_grants", ()))

    def _check_anchor(self, meta_id, created, check_head):
        """The database against the anchor outside it (``anchor.py``), before any write: the id its keyed ``ledger``
        entry binds, and this host's head. A mismatch raises ``LedgerRollback`` naming what was found and the fix;
        with ``check_head=False`` (the audit, ``reanchor``) it is kept in ``anchor_problem`` instead, and this
        ledger then never writes the head file (a missing head is never recreated) nor binds its id. A ledger
        that passes and has no ``ledger`` entry yet (new, or from an older version) gets it now."""
        self._ledger_id, bound, problem = _anchor.bound_id(self._store, self._keys, meta_id)
        if created:
            self._advance_head((0, GENESIS), reset=True)
        problem = problem or _anchor.head_problem(
            self._store, self._head.get(self._ledger_id), self._ledger_id, self._head.path
        )
        if problem is None and not bound:
            legacy_until = (
                self._migration_entry().get("legacy_chain_until", 0) if self._keys.legacy_secret is not None else 0
            )
            problem = _anchor.unbound_log_problem(self._store, self._keys, legacy_until)
        self.anchor_problem = problem
        if problem is not None:
            if check_head:
                raise LedgerRollback(
                    f"ledger {self._store.display} does not match its anchor: {problem}. "
                    "Nothing was written. Fix: "
                    f"{_anchor.fix_text(self._store.display, self._key_source.path)}"
                )
            return
        self._anchored = not self._read_only  # a read-only ledger never writes the head file
        if not bound and not self._read_only:
            _anchor.bind_ledger_id(self._store, self._keys, self._ledger_id, self._log)

    @property
    def keyring(self) -> KeyRing:
        """The ledger's ``KeyRing`` (derived keys; ``block_key(stream, block)``). TRUSTED CODE ONLY."""
        return self._keys

    @property
    def key_file(self) -> str:
        return self._keys.path

    def _advance_head(self, head, until_use=False, reset=False):
        """After a committed write: record its last log entry in the head file (outside the database); ``until_use``
        (a grant's write, ``HeadSync.USE``): durable before the grant's first use (``verify``), not before now."""
        seq, chain = head
        if not (self._anchored or reset):  # a failed anchor check: never a fresh head for a used ledger
            return
        try:
            self._head.advance(self._ledger_id, seq, chain, reset=reset, until_use=until_use)
        except (OSError, LedgerError) as exc:  # the write is committed: the audit will say the head is behind
            warn_head_write(self._head.path, exc)

    def _migrate_secret(self, secret):
        """Move an older ledger's ``meta.secret`` out of the database (``session.migrate_secret``); the ledger id
        and head file it records are this ledger's from the migration's commit on. Returns the new KeyRing."""

        def adopt(keys, ledger_id):
            self._keys, self._ledger_id = keys, ledger_id
            self._head = HeadFile(keys.head_path, self._head_sync)
            self._anchored = True  # the migration's commit is where an older ledger's head begins
            self._store.after_commit = self._advance_head

        return migrate_secret(self._store, self._key_source, secret, self._log, adopt)

    def _migration_entry(self):
        """The body of the keyed ``keys`` entry a migration wrote ({} if none, or if it does not verify)."""
        return migration_entry(self._store, self._keys)

    @property
    def backend(self) -> str:
        return self._store.kind

    def close(self) -> None:
        for claim in getattr(self, "_claims", ()):
            claim.release()
        try:
            if hasattr(self, "_head"):
                self._head.flush()  # GROUP and USE: this ledger's last head made durable now (commit: nothing)
                self._head.close()  # the descriptors kept open between writes
        except (OSError, LedgerError) as exc:  # as _advance_head: the commits stand, the audit says the head lags
            warn_head_write(self._head.path, exc)
        finally:
            self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _signature_ok(self, body, signature):
        """``signature`` signs ``body``, or a pre-migration grant's body under the old rule (``grants``)."""
        return signature_ok(self._keys, self._legacy_grants, body, signature)

    def private_seed(self, grant_id: str, purpose: str) -> int:
        """A 128-bit seed only trusted code can derive (HMAC under the key ring's noise key). TRUSTED CODE ONLY.

        A release under a grant draws its noise from this seed: a re-run under the same grant returns the same value,
        and the pipeline, which never sees the key, cannot reproduce the noise.

        Args:
          grant_id: The grant's id.
          purpose: What the seed is for (one seed per purpose).

        Returns:
          The seed.
        """
        text = f"seed|{grant_id}|{purpose}".encode()
        return self._keys.seed(text, legacy=grant_id in self._legacy_grants)

    def _head_before_use(self, last):
        """The head file durably at or beyond ``last`` (the log's last entry as of the read that found the grant,
        so at or beyond the grant's own entry) before anything is read under the grant (docs/security.md,
        ``HeadSync.USE``). In every mode: the grant may have been made by a process in ``use`` mode, whose head of
        it may still be in slot C only. A ledger that does not match its anchor reads nothing under a grant."""
        self._refuse_unanchored()
        if last is None:
            return
        try:
            self._head.make_durable(self._ledger_id, last[0], last[1])
        except (OSError, LedgerError) as exc:  # as _advance_head: the audit will say the head is behind
            warn_head_write(self._head.path, exc)

    # ----------------------------------------------------------- the keyed log
    def _log(self, tx, kind, body, text=None, at=None):
        """Append ``body`` (its canonical text ``text`` if the caller has it) to the chained log at time ``at``
        (default now: the time a row it writes shows, bound by the chain); refused (the write rolled back) on a
        ledger that does not match its anchor (opened with ``check_head=False``)."""
        self._refuse_unanchored()
        self._append(tx, kind, body, text, at)

    def _refuse_unanchored(self):
        """LedgerRollback if this ledger was opened (``check_head=False``) although it does not match its anchor;
        LedgerError if it was opened ``read_only``."""
        if self._read_only:
            raise LedgerError(f"ledger {self._store.display} is opened read-only (the audit): it writes nothing")
        if self.anchor_problem is not None:
            raise LedgerRollback(
                f"ledger {self._store.display} does not match its anchor ({self.anchor_problem}): "
                "it is opened for the audit only, writes nothing and verifies no grant; fix: "
                f"{_anchor.fix_text(self._store.display, self._key_source.path)}"
            )

    def _append(self, tx, kind, body, text=None, at=None):
        """``_log`` without the anchor's guard (``reanchor`` writes its entry through it)."""
        # The entry this write transaction logged last is the log's last one (a write transaction is exclusive).
        # ``request`` reads it with the stream row in its own write transaction (``tx.log_last``).
        last = getattr(tx, "head", None) or getattr(tx, "log_last", None) or tx.one(sql.LOG_LAST)
        seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
        text = canonical(body) if text is None else text
        ts = time.time() if at is None else float(at)
        value = self._keys.chain_value(prev, seq, kind, text, ts)
        tx.run(sql.LOG_INSERT, (seq, ts, kind, text, prev, value))
        tx.head = (seq, value)  # written to the head file once the transaction commits

    # What the audit reads of a ledger (audit.py imports no ledger name: it is handed the ledger).
    @property
    def store(self) -> Store:
        """The backend store (``store/``): the audit reads every table through it. TRUSTED CODE ONLY."""
        return self._store

    @property
    def head_file(self) -> HeadFile:
        """The head file outside the database (``head_file.HeadFile``) recording this ledger's last log entry."""
        return self._head

    @property
    def ledger_id(self) -> str:
        return self._ledger_id

    def migration_entry(self) -> dict[str, Any]:
        """The body of the keyed ``keys`` entry a key migration wrote ({} if none, or if it does not verify)."""
        return self._migration_entry()

    def signature_ok(self, body: Mapping[str, Any], signature: str) -> bool:
        """Whether ``signature`` is this ledger's signature of the grant ``body`` (or a pre-migration one it lists).

        Args:
          body: The grant's body, without its signature.
          signature: The signature to check.

        Returns:
          True if it signs ``body``.
        """
        return self._signature_ok(body, signature)
