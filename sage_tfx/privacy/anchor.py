"""The ledger's anchor outside the database, checked on every open before any write.

Contract: the keyed ``ledger`` log entry (the ledger's id) and the head file's record of the last entry this
host committed make every rollback of a used ledger (an old copy restored, the log's tail cut,
``meta.ledger_id`` changed) visible, refused at ``Ledger.open`` before any write and flagged by the audit; a
deliberate recovery is a keyed ``anchor`` entry (``Ledger.reanchor``). This module imports neither the
``Ledger`` facade nor the audit. Explanation: docs/security.md, "Rollback".
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .chain import GENESIS, chain_hash
from .errors import LedgerError
from .store import sql

if TYPE_CHECKING:
    from .keys import KeyRing
    from .store.base import Store, Tx

LEDGER_KIND = "ledger"  # the keyed log entry binding the ledger's id
ANCHOR_KIND = "anchor"  # an operator's explicit re-anchoring of this host's head


def fix_text(display: str, key_path: str) -> str:
    """What an operator does about a refused open: restore the matching database, or re-anchor on purpose."""
    return (
        f"restore the ledger database that matches the head file {key_path}.head (it is the newer copy), or, "
        f"ONLY if this database is a known-good copy restored on purpose (or this host joins a PostgreSQL ledger "
        f"and has no copy of a head file), re-anchor it explicitly: sage ledger anchor --db {display} "
        f"--key-file {key_path} --reason TEXT (logged in the ledger and listed by the audit)"
    )


def ledger_entry(tx: Tx, keys: KeyRing) -> tuple[int, str | None] | None:
    """(seq, ledger id) of the log's first ``ledger`` entry, or None if there is none; the id is None when the entry
    does not verify under the key."""
    row = tx.one(sql.LOG_FIRST_OF_KIND, (LEDGER_KIND,))
    if row is None:
        return None
    seq, kind, body_text, prev, chain, ts = row
    if not keys.entry_ok(prev, seq, ts, kind, body_text, chain):
        return seq, None
    try:
        return seq, json.loads(body_text).get("ledger_id")
    except (ValueError, AttributeError):
        return seq, None


def bound_id(store: Store, keys: KeyRing, meta_id: str) -> tuple[str, bool, str | None]:
    """(id, bound, problem): the ledger's id, the one its keyed ``ledger`` entry names, else (not yet bound,
    ``bound`` False) ``meta_id``; ``problem`` (text) if the entry does not verify or names another id than
    ``meta_id``, else None."""
    with store.transaction(write=False) as tx:
        entry = ledger_entry(tx, keys)
    if entry is None:
        return meta_id, False, None
    seq, ledger_id = entry
    if ledger_id is None:
        return meta_id, True, f"log entry {seq} ({LEDGER_KIND}) does not verify under the key: the log was rewritten"
    if ledger_id != meta_id:
        return ledger_id, True, changed_id_text(meta_id, seq, ledger_id)
    return ledger_id, True, None


def changed_id_text(meta_id: str, seq: int, ledger_id: str) -> str:
    return (
        f"meta.ledger_id is {meta_id!r}, but the keyed log entry {seq} binds this ledger to id {ledger_id!r}: "
        "the ledger's id was changed"
    )


def missing_head_text(head_path: str, ledger_id: str, entries: int) -> str:
    return (
        f"the head file {head_path} has no record of this ledger (id {ledger_id!r}), whose log has {entries} "
        "entries: the head file was deleted or replaced, or the database was swapped or its id changed (a missing "
        "head is never recreated for a used ledger)"
    )


def behind_text(head_path: str, last_seq: int, seq: int) -> str:
    return (
        f"the log ends at entry {last_seq}, but the head file {head_path} recorded entry {seq}: "
        f"{seq - last_seq} entr{'y was' if seq - last_seq == 1 else 'ies were'} removed from its tail (the "
        "database was rolled back or its tail cut)"
    )


def rewritten_text(head_path: str, seq: int) -> str:
    return f"log entry {seq} is not the one the head file {head_path} recorded: the log was rewritten or replaced"


def head_problem(store: Store, head: Mapping[str, Any] | None, ledger_id: str, head_path: str) -> str | None:
    """The log against this host's head (``head``: the head file's record of ``ledger_id``, or None): None if the log
    reaches the head's entry with its chain value (a log AHEAD of the head is accepted here; the audit verifies the
    later entries under the key), else what was found."""
    with store.transaction(write=False) as tx:
        last = tx.one(sql.LOG_LAST)
        at = None if head is None else tx.one(sql.LOG_HASH_AT, (int(head.get("seq", 0)),))
    last_seq = last[0] if last else 0
    if head is None:
        return missing_head_text(head_path, ledger_id, last_seq) if last_seq else None
    seq = int(head.get("seq", 0))
    if seq > last_seq:
        return behind_text(head_path, last_seq, seq)
    if seq > 0 and (at is None or not hmac.compare_digest(at[0], head.get("chain") or "")):
        return rewritten_text(head_path, seq)
    return None


def unbound_log_problem(store: Store, keys: KeyRing, legacy_until: int | None) -> str | None:
    """For a log with no ``ledger`` entry (an older ledger's first open, bound next): None if every entry chains in
    sequence from the start under the key (those up to ``legacy_until`` under the unkeyed chain of before the key
    migration), else what was found. A bound ledger whose ``ledger`` entry was cut out or altered must be refused,
    not bound again. It reads the whole log, once in an older ledger's life."""
    prev, expected = GENESIS, 1
    with store.transaction(write=False) as tx:
        entries = tx.all(sql.LOG_ALL)
    for seq, ts, kind, body, entry_prev, chain in entries:
        verified = (
            hmac.compare_digest(chain, chain_hash(entry_prev, seq, kind, body))
            if seq <= legacy_until
            else keys.entry_ok(entry_prev, seq, ts, kind, body, chain)
        )
        if seq != expected or entry_prev != prev or not verified:
            return (
                f"the log has no keyed {LEDGER_KIND} entry binding the ledger's id, and its entry {seq} ({kind}) "
                "breaks the keyed chain: the entry that bound it was cut out or altered"
            )
        prev, expected = chain, seq + 1
    return None


def bind_ledger_id(store: Store, keys: KeyRing, ledger_id: str, log: Callable[..., object]) -> None:
    """Write the keyed ``ledger`` entry naming ``ledger_id`` unless the log has one by now (a new ledger: entry 1; an
    older ledger: on its upgrade, after its head was checked; called only when ``bound_id`` found none, so an open
    of a bound ledger takes no write transaction). ``log(tx, kind, body)`` appends a keyed entry."""
    with store.transaction() as tx:
        if ledger_entry(tx, keys) is None:
            log(tx, LEDGER_KIND, {"ledger_id": ledger_id})


def reanchor(
    store: Store,
    keys: KeyRing,
    ledger_id: str,
    meta_id: str | None,
    head: Mapping[str, Any] | None,
    reason: str,
    host: str,
    log: Callable[..., object],
) -> tuple[int, str]:
    """The operator's explicit re-anchoring, in one write transaction: bind the id if the log has no ``ledger``
    entry, put ``ledger_id`` back into meta if it was changed, and log a keyed ``anchor`` entry (the reason, the host,
    the head it replaces, meta's id if it differed). Returns the anchor entry's (seq, chain) for the head file."""
    if not isinstance(reason, str) or not reason.strip():
        raise LedgerError(
            "a re-anchoring needs a reason (--reason TEXT): it is logged in the ledger and listed by the audit"
        )
    with store.transaction() as tx:
        if ledger_entry(tx, keys) is None:
            log(tx, LEDGER_KIND, {"ledger_id": ledger_id})
        body = {"reason": reason.strip(), "host": host, "replaced_head": head}
        if meta_id != ledger_id:
            tx.run(sql.META_SET_LEDGER_ID, (ledger_id,))
            body["meta_ledger_id_was"] = meta_id
        log(tx, ANCHOR_KIND, body)
        return tx.head
