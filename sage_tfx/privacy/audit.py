"""Audit a ledger from its append-only, KEYED hash-chained log alone (paper §3.2).

``audit_ledger`` checks the keyed chain and the head file, replays every entry in log order with the ledger's
own operations and compares EVERY table with the replay (equality, not approximation); what each step checks:
docs/security.md, "What the audit replays".
"""
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from . import filters, stamps
from .anchor import ANCHOR_KIND, LEDGER_KIND, behind_text, changed_id_text, missing_head_text, rewritten_text
from .chain import GENESIS, TRUSTED_READ, chain_hash
from .chain import canonical as _canonical
from .draws import DrawReplay, audit_draw
from .errors import LedgerError
from .grants import Grant, cap_text, capped, grant_budget, older_rdp, stage_cap
from .queue_replay import QueueReplay
from .split import SLACK, UNIT_KEY, BudgetSplit, over_budget, per_row_budget, per_row_split, unit_meta, unit_rows
from .store import sql
from .unit_share import PER_UNIT_KEY, audited_shares, unit_costs
from .vocabulary import Accounting, BlockState, PipelineState, Source


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
        return {"ok": self.ok, "entries": self.entries, "streams": self.streams, "blocks": self.blocks,
                "grants": self.grants, "problems": list(self.problems), "notes": list(self.notes),
                "trusted_read_count": len(self.trusted_reads), "trusted_reads": list(self.trusted_reads)}


@dataclass
class _Replay:
    """The ledger's tables as the log replays them, entry by entry (``_replay_entry``); problems go to ``report``."""

    ledger: Any
    report: AuditReport
    streams: dict = field(default_factory=dict)
    stream_configs: dict = field(default_factory=dict)
    blocks: dict = field(default_factory=dict)
    grants: dict = field(default_factory=dict)
    releases: dict = field(default_factory=dict)
    per_unit: dict = field(default_factory=dict)  # (grant, stage) -> the unit column of a per-unit release
    block_rows: dict = field(default_factory=dict)
    pipelines: dict = field(default_factory=dict)
    reservations: dict = field(default_factory=dict)
    outcomes: dict = field(default_factory=dict)
    draws: DrawReplay = field(default_factory=DrawReplay)
    bindings: list = field(default_factory=list)  # (seq, ledger id) of each keyed ``ledger`` entry (anchor.py)
    times: stamps.StampReplay = field(default_factory=stamps.StampReplay)  # display times the keyed log binds

    def __post_init__(self) -> None:
        self.queued = QueueReplay(self.streams, self.stream_configs, self.blocks, self.block_rows, self.problems)

    @property
    def problems(self) -> list:
        return self.report.problems


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


def _replay_log(replay: _Replay, entries: list) -> None:
    """Check the keyed chain of ``entries`` and replay each one in order."""
    keys, problems = replay.ledger.keyring, replay.problems
    legacy_until = (replay.ledger.migration_entry().get("legacy_chain_until", 0)
                    if keys.legacy_secret is not None else 0)
    prev_hash, expected_seq = GENESIS, 1
    for seq, ts, kind, body_text, prev, digest in entries:
        if seq != expected_seq:
            problems.append(f"log entry {seq}: expected sequence number {expected_seq} (entries missing)")
        # Entries before a key migration keep the old unkeyed chain; the keyed entry after them covers its value.
        # From schema 10 on an entry's value binds its time too (``stamped``); earlier times the upgrade entry binds.
        stamped = seq > legacy_until and hmac.compare_digest(digest, keys.chain_value(prev, seq, kind, body_text, ts))
        value = (chain_hash(prev, seq, kind, body_text) if seq <= legacy_until
                 else keys.chain_value(prev, seq, kind, body_text))
        if prev != prev_hash or not (stamped or hmac.compare_digest(digest, value)):
            problems.append(f"log entry {seq} ({kind}): keyed hash chain broken (the log was altered, or "
                            "rewritten without the ledger's key)")
        prev_hash, expected_seq = digest, seq + 1
        try:
            body = json.loads(body_text)
        except ValueError:
            problems.append(f"log entry {seq}: body is not JSON")
            continue
        try:  # an entry altered or cut out of the log (a problem above) can leave the next ones without the
            # stream, block or grant they name: each is named, never a traceback
            replay.times.entry(seq, ts, kind, body, stamped)
            handler = _REPLAY.get(kind)
            if handler is not None:
                handler(replay, seq, ts, body)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            problems.append(f"log entry {seq} ({kind}): cannot be replayed on the entries before it "
                            f"({type(exc).__name__}: {exc})")


def _replay_stream(r: _Replay, seq: int, ts: float, body: dict) -> None:
    r.stream_configs[body["name"]] = dict({"min_grant_epsilon": None, "policy_params": None,
                                           "query_delta_share": None, "split_orders": None,
                                           "privacy_unit": None, "max_rows_per_unit": None}, **body)
    try:  # an entry without a query_delta_share (before schema 7, or basic) replays the legacy rule, one
        # without split_orders (before schema 8) every order converting at all of the conversion delta
        r.streams[body["name"]] = filters.make_filter(body["accounting"], body["epsilon"], body["delta"],
                                                      body["orders"] or None, body.get("query_delta_share"),
                                                      bool(body.get("split_orders")))
    except LedgerError as exc:
        r.problems.append(f"log entry {seq}: stream {body['name']!r} cannot be replayed ({exc})")
        r.streams[body["name"]] = filters.make_filter(body["accounting"], body["epsilon"], body["delta"],
                                                      body["orders"] or None, None)


def _replay_block(r: _Replay, seq: int, ts: float, body: dict) -> None:
    filt = r.streams.get(body["stream"])
    if filt is None:
        r.problems.append(f"log entry {seq}: block {body['id']!r} of unknown stream {body['stream']!r}")
        return
    r.blocks[(body["stream"], body["id"])] = {"spent": filt.zero(), "state": BlockState.ACTIVE.value}
    r.block_rows[(body["stream"], body["id"])] = (
        body.get("start"), body.get("end"), body.get("shard"), body.get("created"),
        body.get("rows", _UNLOGGED), body.get("digest", _UNLOGGED))
    r.queued.arrivals[(body["stream"], body["id"])] = 0


def _replay_register(r: _Replay, seq: int, ts: float, body: dict) -> None:
    r.pipelines[(body["stream"], body["pipeline"])] = (PipelineState.WAITING.value, None)
    r.queued.arrive(body["stream"])


def _replay_reserve(r: _Replay, seq: int, ts: float, body: dict) -> None:
    for p in body["pipelines"]:
        r.reservations[(body["stream"], body["block"], p)] = (tuple(body["share"]),
                                                              tuple(r.streams[body["stream"]].zero()))


def _replay_finish_entry(r: _Replay, seq: int, ts: float, body: dict) -> None:
    _replay_finish(body, r.streams, r.blocks, r.pipelines, r.reservations)
    r.queued.demands.pop((body["stream"], body["pipeline"]), None)


def _replay_outcome(r: _Replay, seq: int, ts: float, body: dict) -> None:
    r.outcomes[body["grant"]] = (body["stream"], body["pipeline"], body["outcome"], _canonical(body["details"]))


def _replay_grant_entry(r: _Replay, seq: int, ts: float, body: dict) -> None:
    _check_grant_unit(seq, body, r.stream_configs, r.problems)
    sources = body.get("sources")
    r.queued.grant(seq, body)
    _replay_grant(r.ledger, seq, body, r.streams, r.blocks, r.grants, r.problems)
    if sources and body.get("id") in r.grants:
        for b, source in zip(body["blocks"], sources):
            key = (body["stream"], b, body["pipeline"])
            if source == Source.OWN and key in r.reservations:
                reserved, used = r.reservations[key]
                r.reservations[key] = (reserved, tuple(filters.add(list(used), tuple(body["cost"]))))


def _replay_draw(r: _Replay, seq: int, ts: float, body: dict) -> None:
    _check_grant_unit(seq, body, r.stream_configs, r.problems)
    audit_draw(r.ledger, seq, body, r.grants, r.releases, r.draws, r.problems)


def _replay_anchor(r: _Replay, seq: int, ts: float, body: dict) -> None:
    r.report.notes.append(f"log entry {seq}: this ledger was re-anchored by an operator on host "
                          f"{body.get('host')!r} ({body.get('reason')!r}; the head file's record it "
                          f"replaced: {body.get('replaced_head')})")


def _replay_retire(r: _Replay, seq: int, ts: float, body: dict) -> None:
    for b in body["blocks"]:
        if (body["stream"], b) in r.blocks:
            r.blocks[(body["stream"], b)]["state"] = BlockState.RETIRED.value


# log entry kind -> its replay step (a kind not listed, e.g. ``keys``, changes no table)
_REPLAY = {
    "stream": _replay_stream, "block": _replay_block, "register": _replay_register, "reserve": _replay_reserve,
    "finish": _replay_finish_entry, "demand": lambda r, seq, ts, body: r.queued.demand(seq, body),
    "admit": lambda r, seq, ts, body: r.queued.admit(seq, body),
    "collect": lambda r, seq, ts, body: r.queued.collect(seq, body), "outcome": _replay_outcome,
    "grant": _replay_grant_entry, "draw": _replay_draw, ANCHOR_KIND: _replay_anchor, "retire": _replay_retire,
    "release": lambda r, seq, ts, body: _replay_release(seq, body, r, r.problems, r.draws),
    TRUSTED_READ: lambda r, seq, ts, body: _replay_trusted_read(seq, ts, body, r.blocks, r.report.trusted_reads,
                                                               r.problems),
    LEDGER_KIND: lambda r, seq, ts, body: r.bindings.append((seq, body.get("ledger_id"))),
}


def _check_block_budgets(r: _Replay) -> None:
    """Every replayed block within its stream's global budget."""
    for (stream, block_id), replayed in r.blocks.items():
        filt = r.streams[stream]
        if not filt.admits(replayed["spent"], filt.zero()):
            r.problems.append(f"block {block_id!r} of stream {stream!r} exceeds the global budget: "
                              f"{filt.shortfall(replayed['spent'], filt.zero()) or replayed['spent']}")


def _compare_tables(r: _Replay, tables: tuple, entry_count: int) -> None:
    """Every table (``_read_tables``) against the replay ``r``: equality, not approximation."""
    (table_streams, table_blocks, table_grants, table_releases, table_block_rows, table_grant_cols,
     table_pipelines, table_reservations, table_outcomes, meta, table_demands, table_arrivals, table_draws,
     table_release_owners) = tables
    problems, block_rows, grants = r.problems, r.block_rows, r.grants
    _check_meta(r.ledger, meta, problems)
    _check_binding(meta, r.bindings, entry_count, problems)
    for key, logged in block_rows.items():  # columns a block's log entry did not hold (before keys) are not compared
        if key in table_block_rows:
            block_rows[key] = tuple(t if v is _UNLOGGED else v for v, t in zip(logged, table_block_rows[key]))
    _reconcile(problems, table_block_rows, block_rows, lambda key: f"block {key[1]!r} of stream {key[0]!r}",
               lambda table, log: f"table says (start, end, shard, created, rows, digest)={_brief(table)}, the log "
                                  f"says {_brief(log)}")
    log_grant_cols = {gid: (json.loads(b)["stream"], json.loads(b)["pipeline"], json.loads(b)["created"])
                      for gid, (b, _sig) in grants.items()}
    _reconcile(problems, table_grant_cols, log_grant_cols, lambda gid: f"grant {gid!r}'s columns",
               lambda table, log: f"table says (stream, pipeline, created)={table}, the log says {log}")
    _reconcile(problems, table_pipelines, r.pipelines, lambda key: f"pipeline {key[1]!r} of stream {key[0]!r}",
               lambda table, log: f"table says (state, outcome)={table}, the log replay says {log}")
    _reconcile(problems, table_reservations, r.reservations,
               lambda key: f"reservation of block {key[1]!r} of stream {key[0]!r} for pipeline {key[2]!r}",
               lambda table, log: f"table says (reserved, used)={table}, the log replay says {log}")
    _reconcile(problems, table_outcomes, r.outcomes, lambda gid: f"outcome of grant {gid!r}",
               lambda table, log: f"table says {table}, the log says {log}")
    _reconcile(problems, table_streams, r.stream_configs, lambda name: f"stream {name!r}", _stream_difference)
    _reconcile(problems, table_blocks, {k: (tuple(v["spent"]), v["state"]) for k, v in r.blocks.items()},
               lambda key: f"block {key[1]!r} of stream {key[0]!r}",
               lambda table, log: f"table says spent={table[0]} state={table[1]}, "
                                  f"log replay says spent={log[0]} state={log[1]}")
    _reconcile(problems, table_grants, grants, lambda gid: f"grant {gid!r}",
               lambda table, log: "the table's record differs from the log's", missing_note=" (never charged)")
    _reconcile(problems, table_releases, r.releases,
               lambda key: f"release of stage {key[1]!r} under grant {key[0]!r}",
               lambda table, log: f"table says {table}, log says {log}")
    _check_release_owners(table_release_owners, table_grant_cols, problems)
    _check_release_totals(grants, r.releases, r.streams, problems, r.per_unit)
    _note_converted_rule(grants, r.report.notes)
    _compare_queue_tables(r, table_draws, table_demands, table_arrivals)


def _compare_queue_tables(r: _Replay, table_draws: dict, table_demands: dict, table_arrivals: dict) -> None:
    """The draws, the queued policies' demands and each block's arrival count against the replay."""
    problems = r.problems
    _reconcile(problems, table_draws, r.draws.rows,
               lambda key: f"draw of run {key[1]!r} from lifetime grant {key[0]!r}",
               lambda table, log: f"table says (run grant, stream, epsilon, delta)={table}, the log replay says {log}")
    r.queued.finish_checks()
    _reconcile(problems, table_demands, {k: tuple(v) for k, v in r.queued.demands.items()},
               lambda key: f"demand of pipeline {key[1]!r} on stream {key[0]!r}",
               lambda table, log: f"table says (blocks, cost, rule, meta, seq, state, grant)={table}, the log "
                                  f"replay says {log}")
    _reconcile(problems, table_arrivals, r.queued.arrivals, lambda key: f"block {key[1]!r} of stream {key[0]!r}",
               lambda table, log: f"table says {table} pipeline arrivals since it arrived, the log replay says {log}")


def _read_tables(tx):
    """Every table the audit compares with the log replay, read in the caller's transaction."""
    table_streams = {r[0]: {"name": r[0], "accounting": r[1], "epsilon": r[2], "delta": r[3],
                            "orders": json.loads(r[4]), "policy": r[5], "min_epsilon": r[6],
                            "min_grant_epsilon": r[7], "policy_params": json.loads(r[8]) if r[8] else None,
                            "query_delta_share": r[9], "split_orders": r[10], "privacy_unit": r[11],
                            "max_rows_per_unit": r[12]}
                     for r in tx.all(sql.AUDIT_STREAMS)}
    table_blocks = {(r[0], r[1]): (tuple(json.loads(r[2])), r[3])
                    for r in tx.all(sql.AUDIT_BLOCK_SPENT)}
    table_grants = {r[0]: (r[1], r[2]) for r in tx.all(sql.AUDIT_GRANTS)}
    release_rows = tx.all(sql.AUDIT_RELEASES)
    table_releases = {(r[0], r[1]): (r[2], r[3], r[4]) for r in release_rows}
    table_release_owners = {(r[0], r[1]): (r[5], r[6]) for r in release_rows}
    table_block_rows = {(r[0], r[1]): tuple(r[2:]) for r in tx.all(sql.AUDIT_BLOCK_ROWS)}
    table_grant_cols = {r[0]: (r[1], r[2], r[3]) for r in tx.all(sql.AUDIT_GRANT_COLUMNS)}
    table_pipelines = {(r[0], r[1]): (r[2], r[3]) for r in tx.all(sql.AUDIT_PIPELINES)}
    table_reservations = {(r[0], r[1], r[2]): (tuple(json.loads(r[3])), tuple(json.loads(r[4])))
                          for r in tx.all(sql.AUDIT_RESERVATIONS)}
    table_outcomes = {r[0]: (r[1], r[2], r[3], r[4]) for r in tx.all(sql.AUDIT_OUTCOMES)}
    meta = dict(tx.all(sql.AUDIT_META))
    table_demands = {(r[0], r[1]): (tuple(json.loads(r[2])), tuple(json.loads(r[3])), r[4], r[5], r[6], r[7], r[8])
                     for r in tx.all(sql.AUDIT_DEMANDS)}
    table_arrivals = {(r[0], r[1]): r[2] for r in tx.all(sql.AUDIT_BLOCK_ARRIVALS)}
    table_draws = {(r[0], r[1]): (r[2], r[3], float(r[4]), float(r[5])) for r in tx.all(sql.AUDIT_DRAWS)}
    return (table_streams, table_blocks, table_grants, table_releases, table_block_rows, table_grant_cols,
            table_pipelines, table_reservations, table_outcomes, meta, table_demands, table_arrivals, table_draws,
            table_release_owners)


_UNLOGGED = object()  # a block column its log entry did not hold (entries written before the key migration)


def _brief(values):
    return tuple("<not logged>" if v is _UNLOGGED else v for v in values)


def _replay_trusted_read(seq, ts, body, blocks, reads, problems):
    """A ``trusted_read`` entry: listed; a block the log never registered in its stream is a problem."""
    stream, ids = body.get("stream"), list(body.get("blocks") or ())
    unknown = [b for b in ids if (stream, b) not in blocks]
    if unknown or not ids or not str(body.get("purpose") or "").strip():
        problems.append(f"log entry {seq} (trusted_read): blocks {ids} of stream {stream!r} with purpose "
                        f"{body.get('purpose')!r} do not name registered blocks and a purpose")
    reads.append({"seq": seq, "time": ts, "stream": stream, "blocks": ids, "purpose": body.get("purpose")})


_META_KEYS = {"schema_version", "key_id", "ledger_id", "lock"}  # every key a ledger's meta holds (store/sql.py)
_META_LOCK_VALUE = "0"  # sql.META_INSERT_LOCK's value, never changed


def _check_meta(ledger, meta, problems):
    """meta: the schema version this code writes, this key's id, and never a key or secret."""
    if "secret" in meta:
        problems.append("meta holds a 'secret': the ledger's key must never be in the database (a key in the data "
                        "it protects); it was put back by a writer of the database")
    if meta.get("schema_version") != str(sql.SCHEMA_VERSION):
        problems.append(f"meta's schema_version is {meta.get('schema_version')!r}, not {str(sql.SCHEMA_VERSION)!r}")
    if meta.get("key_id") != ledger.keyring.key_id:
        problems.append(f"meta's key_id {meta.get('key_id')!r} is not the key file's {ledger.keyring.key_id!r}")
    unknown = sorted(set(meta) - _META_KEYS - {"secret"})
    if unknown:
        problems.append(f"meta holds key(s) {unknown} this ledger never writes: added by a writer of the database")
    if meta.get("lock") != _META_LOCK_VALUE:
        problems.append(f"meta's write-lock row is {meta.get('lock')!r}, not {_META_LOCK_VALUE!r}: writers on "
                        "PostgreSQL take turns on it (deleted or altered by a writer of the database)")
    forms = ledger.keyring.secret_forms()
    if any(form in str(v).encode() for v in meta.values() for form in forms):
        problems.append("meta holds the ledger's key bytes")


def _check_binding(meta, bindings, entry_count, problems):
    """The ledger's id as its keyed ``ledger`` entry binds it (anchor.py): exactly one such entry in a used log, naming
    the id in meta (the head file's record is looked up by that id)."""
    if entry_count and not bindings:
        problems.append("the log has no keyed ledger entry binding the ledger's id (a ledger of an older version "
                        "is bound when first opened; a log without it was replaced or cut)")
    if len(bindings) > 1:
        problems.append(f"the log binds the ledger's id {len(bindings)} times (entries "
                        f"{', '.join(str(seq) for seq, _ in bindings)}): only one is ever written")
    if bindings and bindings[0][1] != meta.get("ledger_id"):
        problems.append(changed_id_text(meta.get("ledger_id"), bindings[0][0], bindings[0][1]))


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
            problems.append(missing_head_text(path, ledger.ledger_id, len(entries)) + ": the log's tail cannot be "
                            "checked (restore the head file from backup, audit on the host that writes this ledger, "
                            "or re-anchor on purpose: sage ledger anchor)")
        return
    seq, chain = int(head.get("seq", 0)), head.get("chain")
    by_seq = {e[0]: e for e in entries}
    if seq > last:
        problems.append(behind_text(path, last, seq))
    elif seq > 0 and (seq not in by_seq or not hmac.compare_digest(by_seq[seq][5], chain or "")):
        problems.append(rewritten_text(path, seq))
    if last > seq:
        notes.append(f"{last - seq} log entr{'y' if last - seq == 1 else 'ies'} after the head file's entry {seq} "
                     "verify under the key: accepted (a crash between a commit and the head write, a power loss "
                     "before a grant's first use, or another host's writes)")


def _replay_finish(body, streams, blocks, pipelines, reservations):
    """``Ledger.finish``'s reservation moves, operation for operation, on the replayed state."""
    stream, pipeline, others = body["stream"], body["pipeline"], list(body["to"])
    pipelines[(stream, pipeline)] = (PipelineState.DONE.value, body["outcome"])
    filt = streams.get(stream)
    if filt is None:
        return
    zero = tuple(filt.zero())
    mine = sorted(b for (s, b, p) in reservations if s == stream and p == pipeline
                  and blocks.get((s, b), {}).get("state") == BlockState.ACTIVE)
    for b in mine:
        reserved, used = reservations[(stream, b, pipeline)]
        leftover = [max(0.0, r - u) for r, u in zip(reserved, used)]
        reservations[(stream, b, pipeline)] = (tuple(used), tuple(used))
        share = [x / len(others) for x in leftover] if others else None
        for other in others:
            cur = reservations.get((stream, b, other))
            if cur is None:
                reservations[(stream, b, other)] = (tuple(share), zero)
            else:
                reservations[(stream, b, other)] = (tuple(filters.add(list(cur[0]), share)), cur[1])


def _check_grant_unit(seq, body, configs, problems):
    """A grant (or a drawn run grant) signs its stream's privacy unit as the stream's log entry declares it
    (``split.unit_meta``): a grant made while the streams table said another unit or K is a problem."""
    config = configs.get(body.get("stream"))
    if config is None:
        return
    declared = unit_meta({}, config["privacy_unit"], config["max_rows_per_unit"]).get(UNIT_KEY)
    signed = (body.get("meta") or {}).get(UNIT_KEY)
    if signed != declared:
        problems.append(f"log entry {seq}: grant {body.get('id')!r} signs privacy unit {signed}, but stream "
                        f"{body.get('stream')!r} declares {declared}: its stages were handed another per-row budget")


def _grant_split(grant_body_text):
    """(grant body, its BudgetSplit or None, or an error text)."""
    body = json.loads(grant_body_text)
    try:
        return body, BudgetSplit.from_meta(body.get("meta")), None
    except LedgerError as exc:
        return body, None, str(exc)


def _replay_release(seq, body, r, problems, draws):
    key, grants, releases = (body.get("grant"), body.get("stage")), r.grants, r.releases
    if key[0] not in grants:
        problems.append(f"log entry {seq}: release of stage {key[1]!r} under grant {key[0]!r}, which was never "
                        "charged before it")
        return
    if key in releases:
        problems.append(f"log entry {seq}: a second release of stage {key[1]!r} under grant {key[0]!r}")
        return
    releases[key] = (body.get("computation"), float(body.get("epsilon")), float(body.get("delta")))
    r.per_unit[key] = body.get(PER_UNIT_KEY)
    draws.release(*key)  # the draw replay's per-grant index of releases


def _check_release_owners(owners, grant_cols, problems):
    """Each release row's stream and pipeline are its grant's (the log's release entry names the grant only)."""
    for (gid, stage), owner in sorted(owners.items()):
        if gid in grant_cols and owner != grant_cols[gid][:2]:
            problems.append(f"release of stage {stage!r} under grant {gid!r}: table says (stream, pipeline)={owner}, "
                            f"its grant's are {grant_cols[gid][:2]}")


def _check_release_totals(grants, releases, streams, problems, per_unit):
    """Every grant's released stages, recomposed by its split's rule, within what the grant charged. An older ``rdp``
    grant's stages within what its cost pays for (``grants.stage_cap``, with its stream's replayed filter: the rule
    ``Ledger.release`` applies); a release above it is a problem whenever it was made (the sage of its day allowed
    it, but it spent more than the filter charged its blocks, so the stream's guarantee does not cover it)."""
    by_grant = {}
    for (gid, stage), (_, eps, delta) in releases.items():
        by_grant.setdefault(gid, {})[stage] = (eps, delta)
    for gid, (body_text, _sig) in grants.items():
        body, split, error = _grant_split(body_text)
        if error:
            problems.append(f"grant {gid!r}: its split is invalid ({error})")
            continue
        epsilon, delta = float(body["epsilon"]), float(body["delta"])
        if split is not None and split.charged_epsilon > epsilon * (1 + SLACK):
            problems.append(f"grant {gid!r}: its split composes to epsilon {split.charged_epsilon:.6g} under "
                            f"{split.rule!r}, more than its charge {epsilon:.6g}")
        if split is not None and split.total_delta > delta * (1 + SLACK):
            problems.append(f"grant {gid!r}: its split's deltas add to {split.total_delta:.3g}, more than its "
                            f"charge {delta:.3g}")
        spent = by_grant.get(gid, {})
        if not spent:
            continue
        cap = stage_cap(Grant.from_json(body), streams[body["stream"]])
        recorded = epsilon
        epsilon, delta, split = capped(epsilon, delta, split, cap)
        try:  # a unit stream's stages spend per row (split.per_row_budget)
            k = unit_rows(body.get("meta"))
        except LedgerError as exc:  # GrantError is one
            problems.append(f"grant {gid!r}: {exc}")
            continue
        unit_split, split = split, None if split is None else per_row_split(split, k)
        units = {stage: per_unit.get((gid, stage)) for stage in spent}
        why = "" if cap is None else (f" ({cap_text(gid, recorded, cap, split)}; a release above that spent more "
                                      "than the filter charged the grant's blocks, whichever sage allowed it)")
        rows = {s: per_row_budget(epsilon, delta, k) if split is None else split.stage_budget(s) for s in spent}
        allowed = audited_shares(gid, body.get("meta"), units, rows, epsilon, delta, unit_split, problems)
        if split is None and len(spent) > 1:
            problems.append(f"grant {gid!r} is single-stage but stages {sorted(spent)} each released under it")
        what = "the charge allows" if split is None else "its share"
        for stage, (eps, dlt) in spent.items():
            if over_budget(eps, dlt, allowed[stage]):
                problems.append(f"grant {gid!r}: stage {stage!r} released (epsilon={eps:.6g}, delta={dlt:.3g}), "
                                f"more than {what} (epsilon={allowed[stage][0]:.6g}, "
                                f"delta={allowed[stage][1]:.3g}){why}")
        if split is None:
            continue
        total = unit_split.composed(unit_costs(spent, units, k))
        if total > epsilon * (1 + SLACK):
            problems.append(f"grant {gid!r}: its stages released epsilon {total:.6g} under {split.rule!r}, more "
                            f"than its charge {epsilon:.6g}{why}")
        total_delta = sum(d for _, d in spent.values())
        if total_delta > delta * (1 + SLACK):
            problems.append(f"grant {gid!r}: its stages released delta {total_delta:.3g}, more than its charge "
                            f"{delta:.3g}{why}")


def _note_converted_rule(grants, notes):
    """A note naming how many ``rdp`` grants were made before grants recorded what was asked (``grants.older_rdp``:
    their epsilon the conversion; their stages capped at what their charge pays for)."""
    older = sum(1 for text, _sig in grants.values() if older_rdp(Grant.from_json(text)))
    if older:
        notes.append(f"{older} rdp grant(s) were made before grants recorded what was asked: their epsilon is the "
                     "charge converted at the stream's delta, more than the filter charged; their stages may spend "
                     "only what the charge pays for, and a release above it is listed as a problem "
                     "(docs/block_composition.md, 'What an rdp grant's stages may spend')")


def _check_grant_budget(seq, body, filt, cost, problems):
    """The (epsilon, delta) a grant records for its stages is what its charge pays for (``grants.grant_budget``,
    recomputed from its cost with the stream's filter: equality). An ``rdp`` grant without ``converted_epsilon`` was
    made before the stages' budget was recorded apart from the conversion: its epsilon is the conversion, and its
    releases are checked against what its cost pays for instead (``_check_release_totals``)."""
    if filt.accounting == Accounting.RDP and "converted_epsilon" not in body:
        return
    epsilon, delta, converted = grant_budget(filt, cost)
    recorded = (float(body["epsilon"]), float(body["delta"]), body.get("converted_epsilon"))
    if recorded != (epsilon, delta, converted):
        problems.append(f"log entry {seq}: grant {body.get('id')!r} records (epsilon, delta, converted_epsilon)="
                        f"{recorded}, but its charge pays for {(epsilon, delta, converted)}")


def _reconcile(problems, table, log, name, difference, missing_note=""):
    """Report every key the table and the log disagree on: present in one only, or with other values."""
    for key in sorted(set(table) | set(log)):
        if key not in log:
            problems.append(f"{name(key)} is in the table but not in the log{missing_note}")
        elif key not in table:
            problems.append(f"{name(key)} is in the log but missing from the table")
        elif table[key] != log[key]:
            problems.append(f"{name(key)}: {difference(table[key], log[key])}")


def _stream_difference(table, log):
    changed = sorted(k for k in table if table[k] != log.get(k))
    return (f"the table's {', '.join(changed)} differ from the log's "
            f"(table {[table[k] for k in changed]}, log {[log.get(k) for k in changed]})")


def _replay_grant(ledger, seq, body, streams, blocks, grants, problems):
    signature = body.pop("signature", "")
    body.pop("sources", None)
    gid = body.get("id")
    if not ledger.signature_ok(body, signature):
        problems.append(f"log entry {seq}: grant {gid!r} has an invalid signature")
    filt = streams.get(body["stream"])
    if filt is None:
        problems.append(f"log entry {seq}: grant {gid!r} on unknown stream {body['stream']!r}")
        return
    cost = tuple(body["cost"])
    _check_grant_budget(seq, body, filt, cost, problems)
    for b in body["blocks"]:
        block = blocks.get((body["stream"], b))
        if block is None:
            problems.append(f"log entry {seq}: grant {gid!r} charged unknown block {b!r}")
            continue
        if block["state"] != BlockState.ACTIVE:
            problems.append(f"log entry {seq}: grant {gid!r} charged retired block {b!r}")
        if not filt.admits(block["spent"], cost):
            problems.append(f"log entry {seq}: grant {gid!r} overspent block {b!r} "
                            f"({filt.shortfall(block['spent'], cost)})")
        block["spent"] = filters.add(block["spent"], cost)
    grants[gid] = (_canonical(body), signature)
