"""The audit's log replay: every entry of the keyed log, in order, applied to the tables it rebuilds.

``_replay_log`` checks the keyed chain entry by entry and hands each entry to its kind's step (``_REPLAY``); the
state it rebuilds (``_Replay``) is what ``audit_tables`` compares with the database (docs/security.md, "What the
audit replays").
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import filters, stamps
from .anchor import ANCHOR_KIND, LEDGER_KIND
from .chain import GENESIS, TRUSTED_READ, chain_hash
from .chain import canonical as _canonical
from .draws import DrawReplay, audit_draw
from .errors import LedgerError
from .grants import grant_budget
from .queue_replay import QueueReplay
from .split import UNIT_KEY, unit_meta
from .unit_share import PER_UNIT_KEY
from .vocabulary import Accounting, BlockState, PipelineState, Source

if TYPE_CHECKING:
    from .audit import AuditReport


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


def _replay_log(replay: _Replay, entries: list) -> None:
    """Check the keyed chain of ``entries`` and replay each one in order."""
    keys, problems = replay.ledger.keyring, replay.problems
    legacy_until = replay.ledger.migration_entry().get("legacy_chain_until", 0) if keys.legacy_secret is not None else 0
    prev_hash, expected_seq = GENESIS, 1
    for seq, ts, kind, body_text, prev, digest in entries:
        if seq != expected_seq:
            problems.append(f"log entry {seq}: expected sequence number {expected_seq} (entries missing)")
        # Entries before a key migration keep the old unkeyed chain; the keyed entry after them covers its value.
        # From schema 10 on an entry's value binds its time too (``stamped``); earlier times the upgrade entry binds.
        stamped = seq > legacy_until and hmac.compare_digest(digest, keys.chain_value(prev, seq, kind, body_text, ts))
        value = (
            chain_hash(prev, seq, kind, body_text)
            if seq <= legacy_until
            else keys.chain_value(prev, seq, kind, body_text)
        )
        if prev != prev_hash or not (stamped or hmac.compare_digest(digest, value)):
            problems.append(
                f"log entry {seq} ({kind}): keyed hash chain broken (the log was altered, or "
                "rewritten without the ledger's key)"
            )
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
            problems.append(
                f"log entry {seq} ({kind}): cannot be replayed on the entries before it ({type(exc).__name__}: {exc})"
            )


def _replay_stream(r: _Replay, seq: int, ts: float, body: dict) -> None:
    r.stream_configs[body["name"]] = dict(
        {
            "min_grant_epsilon": None,
            "policy_params": None,
            "query_delta_share": None,
            "split_orders": None,
            "privacy_unit": None,
            "max_rows_per_unit": None,
        },
        **body,
    )
    try:  # an entry without a query_delta_share (before schema 7, or basic) replays the legacy rule, one
        # without split_orders (before schema 8) every order converting at all of the conversion delta
        r.streams[body["name"]] = filters.make_filter(
            body["accounting"],
            body["epsilon"],
            body["delta"],
            body["orders"] or None,
            body.get("query_delta_share"),
            bool(body.get("split_orders")),
        )
    except LedgerError as exc:
        r.problems.append(f"log entry {seq}: stream {body['name']!r} cannot be replayed ({exc})")
        r.streams[body["name"]] = filters.make_filter(
            body["accounting"], body["epsilon"], body["delta"], body["orders"] or None, None
        )


def _replay_block(r: _Replay, seq: int, ts: float, body: dict) -> None:
    filt = r.streams.get(body["stream"])
    if filt is None:
        r.problems.append(f"log entry {seq}: block {body['id']!r} of unknown stream {body['stream']!r}")
        return
    r.blocks[(body["stream"], body["id"])] = {"spent": filt.zero(), "state": BlockState.ACTIVE.value}
    r.block_rows[(body["stream"], body["id"])] = (
        body.get("start"),
        body.get("end"),
        body.get("shard"),
        body.get("created"),
        body.get("rows", _UNLOGGED),
        body.get("digest", _UNLOGGED),
    )
    r.queued.arrivals[(body["stream"], body["id"])] = 0


def _replay_register(r: _Replay, seq: int, ts: float, body: dict) -> None:
    r.pipelines[(body["stream"], body["pipeline"])] = (PipelineState.WAITING.value, None)
    r.queued.arrive(body["stream"])


def _replay_reserve(r: _Replay, seq: int, ts: float, body: dict) -> None:
    for p in body["pipelines"]:
        r.reservations[(body["stream"], body["block"], p)] = (
            tuple(body["share"]),
            tuple(r.streams[body["stream"]].zero()),
        )


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
    r.report.notes.append(
        f"log entry {seq}: this ledger was re-anchored by an operator on host "
        f"{body.get('host')!r} ({body.get('reason')!r}; the head file's record it "
        f"replaced: {body.get('replaced_head')})"
    )


def _replay_retire(r: _Replay, seq: int, ts: float, body: dict) -> None:
    for b in body["blocks"]:
        if (body["stream"], b) in r.blocks:
            r.blocks[(body["stream"], b)]["state"] = BlockState.RETIRED.value


# log entry kind -> its replay step (a kind not listed, e.g. ``keys``, changes no table)
_REPLAY = {
    "stream": _replay_stream,
    "block": _replay_block,
    "register": _replay_register,
    "reserve": _replay_reserve,
    "finish": _replay_finish_entry,
    "demand": lambda r, seq, ts, body: r.queued.demand(seq, body),
    "admit": lambda r, seq, ts, body: r.queued.admit(seq, body),
    "collect": lambda r, seq, ts, body: r.queued.collect(seq, body),
    "outcome": _replay_outcome,
    "grant": _replay_grant_entry,
    "draw": _replay_draw,
    ANCHOR_KIND: _replay_anchor,
    "retire": _replay_retire,
    "release": lambda r, seq, ts, body: _replay_release(seq, body, r, r.problems, r.draws),
    TRUSTED_READ: lambda r, seq, ts, body: _replay_trusted_read(
        seq, ts, body, r.blocks, r.report.trusted_reads, r.problems
    ),
    LEDGER_KIND: lambda r, seq, ts, body: r.bindings.append((seq, body.get("ledger_id"))),
}


_UNLOGGED = object()  # a block column its log entry did not hold (entries written before the key migration)


def _replay_trusted_read(seq, ts, body, blocks, reads, problems):
    """A ``trusted_read`` entry: listed; a block the log never registered in its stream is a problem."""
    stream, ids = body.get("stream"), list(body.get("blocks") or ())
    unknown = [b for b in ids if (stream, b) not in blocks]
    if unknown or not ids or not str(body.get("purpose") or "").strip():
        problems.append(
            f"log entry {seq} (trusted_read): blocks {ids} of stream {stream!r} with purpose "
            f"{body.get('purpose')!r} do not name registered blocks and a purpose"
        )
    reads.append({"seq": seq, "time": ts, "stream": stream, "blocks": ids, "purpose": body.get("purpose")})


def _replay_finish(body, streams, blocks, pipelines, reservations):
    """``Ledger.finish``'s reservation moves, operation for operation, on the replayed state."""
    stream, pipeline, others = body["stream"], body["pipeline"], list(body["to"])
    pipelines[(stream, pipeline)] = (PipelineState.DONE.value, body["outcome"])
    filt = streams.get(stream)
    if filt is None:
        return
    zero = tuple(filt.zero())
    mine = sorted(
        b
        for (s, b, p) in reservations
        if s == stream and p == pipeline and blocks.get((s, b), {}).get("state") == BlockState.ACTIVE
    )
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
        problems.append(
            f"log entry {seq}: grant {body.get('id')!r} signs privacy unit {signed}, but stream "
            f"{body.get('stream')!r} declares {declared}: its stages were handed another per-row budget"
        )


def _replay_release(seq, body, r, problems, draws):
    key, grants, releases = (body.get("grant"), body.get("stage")), r.grants, r.releases
    if key[0] not in grants:
        problems.append(
            f"log entry {seq}: release of stage {key[1]!r} under grant {key[0]!r}, which was never charged before it"
        )
        return
    if key in releases:
        problems.append(f"log entry {seq}: a second release of stage {key[1]!r} under grant {key[0]!r}")
        return
    releases[key] = (body.get("computation"), float(body.get("epsilon")), float(body.get("delta")))
    r.per_unit[key] = body.get(PER_UNIT_KEY)
    draws.release(*key)  # the draw replay's per-grant index of releases


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
        problems.append(
            f"log entry {seq}: grant {body.get('id')!r} records (epsilon, delta, converted_epsilon)="
            f"{recorded}, but its charge pays for {(epsilon, delta, converted)}"
        )


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
            problems.append(
                f"log entry {seq}: grant {gid!r} overspent block {b!r} ({filt.shortfall(block['spent'], cost)})"
            )
        block["spent"] = filters.add(block["spent"], cost)
    grants[gid] = (_canonical(body), signature)
