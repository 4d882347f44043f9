"""Every migration of an older ledger, in one place, run by ``sage ledger upgrade`` (``Ledger.upgrade``) and by
nothing else.

The runtime opens only ledgers of this version (``store.SCHEMA_VERSION``); an older one is refused with
``LedgerUpgradeNeeded`` naming the command. Contract: each step (key migration and ledger id, head file
form, DDL per version, the schema 10 time stamps) runs once and in order, is idempotent and writes only
keyed entries, so the audit verifies an upgraded ledger as a new one. The steps: docs/security.md,
"Upgrading a ledger"; docs/running.md lists the command.
"""

from collections.abc import Callable
from typing import Any

from . import stamps
from .store import SCHEMA_VERSION, sql


def upgrade(ledger: Any, log: Callable[..., None], location: str, progress: Callable[[str], None]) -> int:
    """Bring ``ledger`` (opened in upgrade mode: ``Ledger.upgrade``; its key migration done by that open) to this
    version; ``log(tx, kind, body)`` appends a keyed entry; ``progress(text)`` hears each step. Returns how many
    steps ran (0: it was of this version, and nothing was written)."""
    ran: list[str] = []

    def step(text: str) -> None:
        ran.append(text)
        progress(text)

    if ledger.migrated_secret:
        step(f"keys: the secret moved out of the database into the key file {ledger.key_file} (keyed 'keys' entry)")
    if ledger.head_file.upgrade_form():
        step(f"head file: {ledger.head_file.path} rewritten from the JSON form into slots, every head unchanged")
    ledger.head_file.old_form = False
    ledger.store.schema_steps(step)
    if stamp_times(ledger.store, log):
        step(
            f"schema {SCHEMA_VERSION - 1} -> {SCHEMA_VERSION}: the rows' display times bound by a keyed "
            f"'{stamps.UPGRADE_KIND}' entry"
        )
    progress(
        f"ledger {location}: schema version {SCHEMA_VERSION}"
        + (f" ({len(ran)} step(s) run)" if ran else " (already up to date: nothing written)")
    )
    return len(ran)


def stamp_times(store: Any, log: Callable[..., None]) -> bool:
    """Schema 9 -> 10 in one write transaction: the keyed ``upgrade`` entry (``stamps.upgrade_body``), then the
    schema version. False (nothing written) on a ledger past it."""
    with store.transaction() as tx:
        version = int(tx.one(sql.META_SCHEMA_VERSION)[0])
        if version != SCHEMA_VERSION - 1:
            return False
        log(tx, stamps.UPGRADE_KIND, stamps.upgrade_body(tx, version, SCHEMA_VERSION))
        tx.run(sql.META_SET_SCHEMA_VERSION, (str(SCHEMA_VERSION),))
    return True
