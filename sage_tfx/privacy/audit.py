"""Audit a ledger from its append-only, KEYED hash-chained log alone (paper §3.2).

``audit_ledger`` checks the keyed chain and the head file, replays every entry in log order with the ledger's
own operations and compares EVERY table with the replay (equality, not approximation); what each step checks:
docs/security.md, "What the audit replays".
"""

import hmac
from dataclasses import dataclass, field
from typing import Any

from . import stamps
from .anchor import behind_text, missing_head_text, rewritten_text
from .audit_budgets import _check_block_budgets
from .audit_replay import _Replay, _replay_log
from .audit_tables import _compare_tables, _read_tables
from .store import sql


@dataclass
class AuditReport:
    entries: int = 0
    streams: int = 0
    blocks: int = 0
    grants: int = 0
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    # the log's trusted_read entries, oldest first: {"seq", "time", "stream", "blocks", "purpose"}
    trusted_reads: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self):
        return {
            "ok": self.ok,
            "entries": self.entries,
            "streams": self.streams,
            "blocks": self.blocks,
            "grants": self.grants,
            "problems": list(self.problems),
            "notes": list(self.notes),
            "trusted_read_count": len(self.trusted_reads),
            "trusted_reads": list(self.trusted_reads),
        }


def audit_ledger(ledger: Any) -> AuditReport:
    """Audit ``ledger`` from its keyed log alone (the module docstring lists what is checked).

    Args:
        ledger: an open ``Ledger`` (``read_only=True`` for ``sage ledger audit``); this module imports none.

    Returns:
        The ``AuditReport``: ``ok`` when no problem was found; the notes and trusted reads either way.
    """
    report = AuditReport()
    store = ledger.store
    report.problems.extend(f"database integrity: {p}" for p in store.integrity_problems())
    # The head file first, then the log and every table in ONE read transaction (one snapshot: SQLite's WAL
    # read transaction; PostgreSQL's REPEATABLE READ, store/postgres.py): another process writing meanwhile, on this
    # host or another, changes neither what the log says nor what the tables say, and a head it writes after
    # our snapshot is never ahead of the log we read (docs/scale_out.md, "Several hosts on one PostgreSQL ledger").
    head = ledger.head_file.get(ledger.ledger_id)
    with store.transaction(write=False) as tx:
        entries = tx.all(sql.AUDIT_LOG)
        tables = _read_tables(tx)
        stamp_tables = stamps.read(tx)
    report.entries = len(entries)
    replay = _Replay(ledger, report)
    _replay_log(replay, entries)
    _check_head(ledger, head, entries, report.problems, report.notes)
    report.streams, report.blocks, report.grants = len(replay.streams), len(replay.blocks), len(replay.grants)
    _check_block_budgets(replay)
    _compare_tables(replay, tables, len(entries))
    replay.times.check(stamp_tables, report.problems)
    return report


def _check_head(ledger, head, entries, problems, notes):
    """The log against the head file (outside the database): the entry it names must be there, unchanged.

    A log BEHIND the head was truncated. A log AHEAD of it is accepted when its later entries verify under the
    key (checked above): a crash between a commit and the head write, a power loss that took a grant's head from
    slot C before the grant's first use (``head_file.HeadSync.USE``), or, on PostgreSQL, another host's writes
    (each host's head file knows its own); a writer without the key cannot append such entries. ``head`` was read
    before the log's snapshot, so this host's writes after the snapshot cannot put it ahead of the log.
    """
    path = ledger.head_file.path
    last = entries[-1][0] if entries else 0
    if head is None:
        if entries:
            problems.append(
                missing_head_text(path, ledger.ledger_id, len(entries)) + ": the log's tail cannot be "
                "checked (restore the head file from backup, audit on the host that writes this ledger, "
                "or re-anchor on purpose: sage ledger anchor)"
            )
        return
    seq, chain = int(head.get("seq", 0)), head.get("chain")
    by_seq = {e[0]: e for e in entries}
    if seq > last:
        problems.append(behind_text(path, last, seq))
    elif seq > 0 and (seq not in by_seq or not hmac.compare_digest(by_seq[seq][5], chain or "")):
        problems.append(rewritten_text(path, seq))
    if last > seq:
        notes.append(
            f"{last - seq} log entr{'y' if last - seq == 1 else 'ies'} after the head file's entry {seq} "
            "verify under the key: accepted (a crash between a commit and the head write, a power loss "
            "before a grant's first use, or another host's writes)"
        )
