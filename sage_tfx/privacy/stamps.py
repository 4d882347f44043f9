"""The display times of the ledger's rows, bound by the keyed log (docs/security.md, "The audit").

Each time a row shows (a stream's ``created``, a pipeline's ``registered`` and ``finished``, a block's ``retired``,
an outcome's, a release's and a draw's ``created``) is the time ``ts`` of the keyed log entry that wrote it, and the
keyed chain value binds that time with the entry (``KeyRing.chain_value``). Times written before schema 10 are bound
by the keyed ``upgrade`` entry (``migrations.py``), which carries them as they were and a digest of the earlier
entries' times. ``StampReplay`` replays both; ``check`` compares the tables with the replay (equality).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .chain import canonical
from .store import sql

if TYPE_CHECKING:
    from .store import Tx

UPGRADE_KIND = "upgrade"  # the keyed entry of ``sage ledger upgrade`` (migrations.py)

# column name: (audit statement, how many key columns lead its rows)
COLUMNS = {
    "streams.created": (sql.AUDIT_STREAM_CREATED, 1),
    "blocks.retired": (sql.AUDIT_BLOCK_RETIRED, 2),
    "pipelines.registered": (sql.AUDIT_PIPELINE_REGISTERED, 2),
    "pipelines.finished": (sql.AUDIT_PIPELINE_FINISHED, 2),
    "draws.created": (sql.AUDIT_DRAW_CREATED, 2),  # (run grant, lifetime grant): a draw entry names the run grant
    "outcomes.created": (sql.AUDIT_OUTCOME_CREATED, 1),
    "releases.created": (sql.AUDIT_RELEASE_CREATED, 2),
}
_NULLABLE = ("blocks.retired", "pipelines.finished")  # NULL until the row is retired / finished


def read(tx: Tx) -> dict[str, dict[tuple, float | None]]:
    """{column: {row key: time}} for every bound column, read in ``tx``."""
    return {name: {tuple(r[:n]): r[n] for r in tx.all(statement)} for name, (statement, n) in COLUMNS.items()}


def log_times_digest(times: Iterable[tuple[int, float]]) -> str:
    """The digest of ``[(seq, ts), ...]`` an ``upgrade`` entry binds (the entries before it)."""
    return hashlib.sha256(canonical([[int(s), float(t)] for s, t in times]).encode()).hexdigest()


def upgrade_body(tx: Tx, version: int, to: int) -> dict:
    """The body of the keyed ``upgrade`` entry: the schema versions, every bound column's times as stored (NULLs
    left out) and the digest of every earlier log entry's time."""
    stamps = {
        name: sorted([*key, value] for key, value in rows.items() if value is not None)
        for name, rows in read(tx).items()
    }
    return {"from": version, "to": to, "stamps": stamps, "log_ts": log_times_digest(tx.all(sql.LOG_TIMES))}


class StampReplay:
    """The bound times as the keyed log says, entry by entry (``entry``), then ``check``ed against the tables."""

    def __init__(self) -> None:
        self.values: dict[str, dict[tuple, float | None]] = {name: {} for name in COLUMNS}
        self.unbound: list[int] = []  # entries whose time no keyed value binds (before schema 10, no upgrade)
        self.times: list[tuple[int, float]] = []
        self.problems_at_upgrade: list[str] = []

    def entry(self, seq: int, ts: float, kind: str, body: dict, stamped: bool) -> None:
        """One log entry; ``stamped``: its chain value binds its time."""
        self.times.append((seq, ts))
        if not stamped:
            self.unbound.append(seq)
        v = self.values
        if kind == "stream":
            v["streams.created"][(body["name"],)] = ts
        elif kind == "register":
            v["pipelines.registered"][(body["stream"], body["pipeline"])] = ts
            v["pipelines.finished"][(body["stream"], body["pipeline"])] = None
        elif kind == "finish":
            v["pipelines.finished"][(body["stream"], body["pipeline"])] = ts
        elif kind == "block":
            v["blocks.retired"][(body["stream"], body["id"])] = None
        elif kind == "retire":
            for b in body["blocks"]:
                v["blocks.retired"][(body["stream"], b)] = ts
        elif kind == "outcome":
            v["outcomes.created"][(body["grant"],)] = ts
        elif kind == "release":
            v["releases.created"][(body["grant"], body["stage"])] = ts
        elif kind == "draw":
            v["draws.created"][(body["id"],)] = ts
        elif kind == UPGRADE_KIND and stamped:
            self._upgrade(seq, body)

    def _upgrade(self, seq, body):
        """The times as they were at the upgrade, and the earlier entries' times checked against its digest."""
        if body.get("log_ts") != log_times_digest(self.times[:-1]):
            self.problems_at_upgrade = [
                f"log entry {seq} (upgrade): the times of the log entries before it are "
                "not the ones it bound (altered by a writer of the database)"
            ]
        for name, rows in (body.get("stamps") or {}).items():
            if name not in self.values:
                continue
            if name in _NULLABLE:
                self.values[name] = dict.fromkeys(self.values[name])
            for *key, value in rows:
                self.values[name][tuple(key)] = value
        self.unbound = []

    def check(self, tables: dict[str, dict[tuple, float | None]], problems: list[str]) -> None:
        """Every bound column of ``tables`` (``read``) equal to the replay's; entries whose time nothing binds."""
        problems.extend(self.problems_at_upgrade)
        if self.unbound:
            problems.append(
                f"log entries {self.unbound[:5]}{' ...' if len(self.unbound) > 5 else ''}: their times "
                "are bound by no keyed value (written before schema 10 and no keyed upgrade entry "
                "follows them: run sage ledger upgrade)"
            )
        for name, rows in tables.items():
            replay = self.values[name]
            for key, value in sorted(rows.items(), key=lambda kv: str(kv[0])):
                logged = replay.get(key, replay.get(key[:1], _MISSING))  # a draw's time is its run grant's entry's
                if logged is not _MISSING and logged != value:
                    problems.append(
                        f"{name} of {_key_text(key)}: the table says {value!r}, the keyed log says {logged!r}"
                    )


_MISSING = object()  # a row the log replay does not know (the other checks name it)


def _key_text(key):
    return key[0] if len(key) == 1 else "/".join(str(k) for k in key)
