"""Charging: a grant's check and charge under each policy, the queued policies' demands and scheduling points,
and the reservation moves when a pipeline finishes (paper §3.3).

Contract: a charge is all blocks or none, in the caller's one write transaction, and only if the policy's
source and the filter admit it on every block; nothing un-charges a grant; the queued policies' admissions
run ``allocation.QueuedAllocation.schedule`` (the simulator's code) and the audit replays them. This module
imports neither the ``Ledger`` facade nor the audit. How: docs/scheduling_policies.md, "The allocation
rules" and "How the ledger runs them".
"""

from __future__ import annotations

import collections
import json
import operator
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import filters
from .allocation import QueuedAllocation, get_policy
from .block_ranges import set_spent
from .blocks import chunks, read_blocks, read_reservations, vector_decoder, vector_text
from .budget_arrays import BudgetArrays
from .chain import canonical
from .checks import finite
from .errors import BudgetRefused, LedgerError
from .grants import Grant, grant_log_text, new_grant
from .store import sql
from .streams import stream_cost
from .vocabulary import Accounting, BlockState, DemandState, Policy, Source
from .write import Charge, StreamWrite

if TYPE_CHECKING:
    from .allocation import AllocationPolicy, Holdings
    from .filters import Filter
    from .store.base import Tx
    from .streams import Stream

PENDING, ADMITTED = DemandState.PENDING, DemandState.ADMITTED
_spent_text = operator.itemgetter(1)  # a found row's spent text


def pick_source(
    filt: Filter,
    spent: Sequence[float],
    cost: Sequence[float],
    block_reservations: Holdings,
    pipeline: str,
    policy: AllocationPolicy | str = Policy.CONSERVE,
) -> Source | NoSource:
    """The policy's source (allocation.py: own reservation first, then the unreserved pool); else a
    NoSource saying what each had left. ``policy``: its name, or the ``AllocationPolicy`` itself."""
    rules = get_policy(policy) if isinstance(policy, str) else policy
    source = rules.source(filt, spent, cost, block_reservations, pipeline)
    if source is not None:
        return source
    own = block_reservations.get(pipeline)
    pool_used, pool_reserved = rules.pool(filt, spent, block_reservations)
    asked = filt.query_epsilon(cost)
    own_left = "none reserved" if own is None else f"{eps_left(filt, own['used'], own['reserved']):.4g} left"
    return NoSource(
        f"epsilon {asked:.4g} asked; this pipeline's reservation: {own_left}; unreserved pool: "
        f"{eps_left(filt, pool_used, pool_reserved):.4g} left; the rest is reserved for other "
        "waiting pipelines"
    )


def charge_now(w: StreamWrite, charge: Charge, found: dict, reservations: dict) -> Grant:
    """Conserve/Aggressive: charge ``charge.cost`` on every block now if the policy's source admits it on all, or
    raise BudgetRefused (nothing charged); return the signed Grant.

    Args:
        w: the stream's write.
        charge: the request.
        found: {block: (state, spent text, place in the store's id order or None)} of the request's blocks, read
            in ``w.tx``.
        reservations: {block: {pipeline: {"reserved", "used"}}} of those blocks.

    Every block is checked, but blocks in the same state (the same stored spent text and the same
    reservations) get the same answer and the same new values from these pure functions, so each distinct
    state is decoded, evaluated and encoded once (32 fresh blocks: once), and written in one UPDATE per
    distinct new value, naming its blocks (by id range where they lie next to each other: ``block_ranges``)."""
    tx, log, s, filt = w.tx, w.log, w.stream, w.filt
    pipeline, blocks, cost = charge.pipeline, charge.blocks, charge.cost
    stream = s.name
    keys, groups = state_groups(blocks, found, reservations)
    verdicts: dict[tuple, tuple[bool, Any, tuple[float, ...]]]
    verdicts, rules = {}, s.rules()
    for key, members in groups.items():
        spent, holdings = tuple(json.loads(key[0])), reservations.get(members[0], {})
        if not filt.admits(spent, cost):
            verdicts[key] = (False, filt.shortfall(spent, cost), spent)
        else:
            source = pick_source(filt, spent, cost, holdings, pipeline, rules)
            verdicts[key] = (True, source, spent) if isinstance(source, str) else (False, source.reason, spent)
    if not all(v[0] for v in verdicts.values()):
        raise BudgetRefused(stream, pipeline, {b: verdicts[k][1] for b, k in zip(blocks, keys) if not verdicts[k][0]})

    now = time.time()
    grant, body_text = new_grant(
        w.keyring, s, filt, pipeline, blocks, cost, charge.rule, charge.meta, now, charge.split
    )
    min_cost = stream_cost(s, filt, s.min_epsilon)
    active, retired_state, own = BlockState.ACTIVE.value, BlockState.RETIRED.value, Source.OWN
    block_groups: dict[tuple, list[str]] = {}
    own_groups: dict[str, list[str]] = {}
    alive_of: dict[tuple, bool] = {}
    for key, members in groups.items():
        _ok, source, spent = verdicts[key]
        spent = filters.add(spent, cost)
        alive = alive_of[key] = not rules.retires(filt, spent, min_cost)
        block_groups.setdefault(
            (vector_text(spent), active if alive else retired_state, None if alive else now), []
        ).extend(members)
        if source == own:
            used = vector_text(filters.add(reservations[members[0]][pipeline]["used"], cost))
            own_groups.setdefault(used, []).extend(members)
    for used, ids in sorted(own_groups.items(), key=lambda kv: kv[1][0]):
        for i in range(0, len(ids), 500):  # stay under SQL variable limits
            chunk = ids[i : i + 500]
            tx.run(sql.reservation_set_used(len(chunk)), [used, stream, pipeline, *chunk])
    for values, ids in sorted(block_groups.items(), key=lambda kv: kv[1][0]):  # (spent text, state, retired)
        set_spent(tx, stream, values, ids, found)
    tx.run(sql.GRANT_INSERT, (grant.id, stream, pipeline, body_text, grant.signature, now))
    sources = [verdicts[k][1] for k in keys]
    log(tx, "grant", None, grant_log_text(grant, body_text, sources))
    if not all(alive_of.values()):
        log(tx, "retire", {"stream": stream, "blocks": [b for b, k in zip(blocks, keys) if not alive_of[k]]}, at=now)
    return grant


def state_groups(blocks: Sequence[str], found: dict, reservations: dict) -> tuple[list[tuple], dict[tuple, list[str]]]:
    """Each block's state key (its spent text as stored and its reservations) in grant order, and the blocks of
    each distinct key ({key: [blocks, in grant order]}); a grant's blocks usually share one state, found at C
    speed (``list.count``) before any per-block loop."""
    if reservations:  # a block's state: its spent text and its reservations
        keys = [
            (found[b][1], tuple((p, h["reserved"], h["used"]) for p, h in reservations.get(b, {}).items()))
            for b in blocks
        ]
    else:  # no reservation on any of the blocks: its spent text alone
        texts = list(map(_spent_text, map(found.__getitem__, blocks)))
        one = texts.count(texts[0]) == len(texts)  # the usual grant: one shared key, no per-block tuple
        keys = [(texts[0], ())] * len(texts) if one else [(text, ()) for text in texts]
    if keys.count(keys[0]) == len(keys):
        return keys, {keys[0]: list(blocks)}
    groups: dict[tuple, list[str]] = {}
    for b, key in zip(blocks, keys):
        groups.setdefault(key, []).append(b)
    return keys, groups


def queued_request(w: StreamWrite, charge: Charge) -> tuple[Grant | None, dict[str, str] | None]:
    """(grant, None) if granted now or collected; (None, {block: why}) once the demand is recorded."""
    tx, log, s, filt = w.tx, w.log, w.stream, w.filt
    pipeline, blocks, cost, rule, meta = charge.pipeline, charge.blocks, charge.cost, charge.rule, charge.meta
    stream, meta_text = s.name, canonical(meta)
    row = tx.one(sql.DEMAND_ROW, (stream, pipeline))
    same = row is not None and (json.loads(row[0]), tuple(json.loads(row[1])), row[2], row[3]) == (
        list(blocks),
        tuple(cost),
        rule,
        meta_text,
    )
    if same and row[4] == ADMITTED:  # admitted and charged by an earlier scheduling point: hand it over
        tx.run(sql.DEMAND_DELETE, (stream, pipeline))
        log(tx, "collect", {"stream": stream, "pipeline": pipeline, "grant": row[5]})
        return Grant.from_row(*tx.one(sql.GRANT_BODY, (row[5],))), None
    if not same:  # a new demand (replacing any earlier one of this pipeline; an admitted grant stays charged)
        log(
            tx,
            "demand",
            {
                "stream": stream,
                "pipeline": pipeline,
                "blocks": list(blocks),
                "cost": list(cost),
                "rule": rule,
                "meta": meta,
            },
        )
        tx.run(sql.DEMAND_DELETE, (stream, pipeline))
        tx.run(
            sql.DEMAND_INSERT,
            (stream, pipeline, json.dumps(list(blocks)), json.dumps(list(cost)), rule, meta_text, tx.head[0], PENDING),
        )
    now = time.time()
    granted, queue = schedule(w, now, caller=pipeline)
    if pipeline in granted:
        return granted[pipeline], None
    why = {}
    for b in blocks:
        if queue.fits(b, cost, now):
            continue
        if b in queue.retired:
            why[b] = "retired meanwhile (budget exhausted)"
        elif not filt.admits(queue.spent[b], cost):
            why[b] = filt.shortfall(queue.spent[b], cost)
        else:
            why[b] = (
                f"waits in the {s.policy} queue: {queue.fraction(b, now):.4g} of the block's budget is "
                "unlocked so far, and unlocked minus spent does not fit this demand; it is recorded and "
                "granted (charged) when it fits, in the policy's order: repeat this request to collect it"
            )
    return None, why or {b: f"waits in the {s.policy} queue behind earlier demands" for b in blocks}


def queue_state(
    tx: Tx, s: Stream, filt: Filter, blocks: Iterable[str] = ()
) -> tuple[dict[str, tuple[str, str]], QueuedAllocation]:
    """The stream's queue as ``QueuedAllocation`` state: the pending demands, and the blocks they (and
    ``blocks``) name, as stored. ({pipeline: (rule, meta text)}, state)."""
    queue = QueuedAllocation(filt, filt.cost(epsilon=s.min_epsilon), s.rules())
    pending = tx.all(sql.DEMAND_IN_STATE, (s.name, PENDING))
    demands = [(p, json.loads(b), tuple(json.loads(c)), r, m, q) for p, b, c, r, m, q in pending]
    ids = list(dict.fromkeys([*blocks, *(b for d in demands for b in d[1])]))
    decode = vector_decoder()
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for block_id, state, spent, created, arrivals in tx.all(sql.block_queue_rows(len(chunk)), [s.name, *chunk]):
            queue.load_block(
                block_id, spent=decode(spent), arrived=created, arrivals=arrivals, retired=state != BlockState.ACTIVE
            )
    for pipeline, demand_blocks, cost, *_rest, seq in demands:
        queue.demand(pipeline, demand_blocks, cost, seq=seq)
    return {d[0]: (d[3], d[4]) for d in demands}, queue


def schedule(w: StreamWrite, now: float, caller: str | None = None) -> tuple[dict[str, Grant], QueuedAllocation]:
    """A scheduling point: grant the pending demands the policy admits now, in its order, each charged at
    once. Returns ({pipeline: Grant} admitted, the queue's state after). ``caller``'s grant is handed to it
    now (its demand row removed); the others wait in ``demands`` as admitted, for their next request."""
    tx, log, s, filt = w.tx, w.log, w.stream, w.filt
    infos, queue = queue_state(tx, s, filt)
    if not infos:
        return {}, queue
    before = set(queue.retired)
    admitted = queue.schedule(now)
    if not admitted:
        return {}, queue
    grants = {}
    for pipeline, blocks, cost in admitted:
        rule, meta_text = infos[pipeline]
        grants[pipeline] = new_grant(w.keyring, s, filt, pipeline, blocks, cost, rule, json.loads(meta_text), now)
    log(
        tx,
        "admit",
        {
            "stream": s.name,
            "now": now,
            ADMITTED: [[p, grants[p][0].id] for p, _, _ in admitted],
            "collected": caller if caller in grants else None,
        },
    )
    touched: list[str] = []
    for pipeline, blocks, _cost in admitted:
        grant, body_text = grants[pipeline]
        touched.extend(b for b in blocks if b not in touched)
        tx.run(sql.GRANT_INSERT, (grant.id, s.name, pipeline, body_text, grant.signature, now))
        log(tx, "grant", dict(grant.body(), signature=grant.signature))
        if pipeline == caller:
            tx.run(sql.DEMAND_DELETE, (s.name, pipeline))
        else:
            tx.run(sql.DEMAND_ADMIT, (ADMITTED, grant.id, s.name, pipeline))
    for b in touched:  # the queue's own sums (filters.add, in admission order) are what is stored
        retired = b in queue.retired
        tx.run(
            sql.BLOCK_SET_SPENT,
            (
                json.dumps(queue.spent[b]),
                BlockState.RETIRED.value if retired else BlockState.ACTIVE.value,
                now if retired else None,
                s.name,
                b,
            ),
        )
    newly_retired = [b for b in touched if b in queue.retired and b not in before]
    if newly_retired:
        log(tx, "retire", {"stream": s.name, "blocks": newly_retired}, at=now)
    return {p: g for p, (g, _text) in grants.items()}, queue


def unlocked(tx: Tx, s: Stream, filt: Filter, blocks: Iterable[str]) -> dict[str, tuple[float, ...]] | None:
    """A queued stream: {block: its unlocked budget now} (``QueuedAllocation.unlocked``; the availability
    answers then say what fits unlocked minus spent, as the scheduler checks). None under other policies."""
    if not s.rules().queued:
        return None
    _infos, queue = queue_state(tx, s, filt, blocks)
    now = time.time()
    return {b: queue.unlocked(b, now) for b in queue.spent}


def budgets_on_all(tx: Tx, s: Stream, pipeline: str, blocks: Sequence[str], delta: float) -> BudgetArrays | None:
    """``available_epsilon``'s read: the ``BudgetArrays`` of what ``pipeline`` could be granted on each of
    ``blocks`` of stream ``s`` now (a queued stream's unlocked budget included), or None if any block is unknown
    or retired (nothing can be granted on all of them)."""
    filt = s.filter()
    found = read_blocks(tx, s.name, blocks)
    if len(found) != len(set(blocks)) or any(b.state != BlockState.ACTIVE for b in found.values()):
        return None
    return BudgetArrays(
        filt,
        pipeline,
        {b: found[b].spent for b in found},
        blocks,
        read_reservations(tx, s.name, blocks),
        delta,
        s.rules(),
        unlocked(tx, s, filt, found),
    )


def budgets_per_block(
    tx: Tx, s: Stream, pipeline: str, blocks: Sequence[str] | None, delta: float
) -> tuple[list[str], list[str], BudgetArrays]:
    """``available_per_block``'s one read: (the blocks asked, in order: ``blocks`` without repeats, or None: every
    active block of ``s`` in key order; the active ones among them; their ``BudgetArrays`` for ``pipeline``)."""
    filt = s.filter()
    if blocks is None:
        decode = vector_decoder()
        spent = {b: decode(text) for b, text in tx.all(sql.BLOCK_ACTIVE_SPENT, (s.name,))}
        blocks = active = list(spent)
        reservations = read_reservations(tx, s.name)
    else:
        blocks = list(dict.fromkeys(blocks))
        spent = {b.id: b.spent for b in read_blocks(tx, s.name, blocks).values() if b.state == BlockState.ACTIVE}
        active = [b for b in blocks if b in spent]
        reservations = read_reservations(tx, s.name, active)
    budgets = BudgetArrays(filt, pipeline, spent, active, reservations, delta, s.rules(), unlocked(tx, s, filt, active))
    return blocks, active, budgets


def release_reservations(tx: Tx, s: Stream, pipeline: str, others: Sequence[str]) -> int:
    """``finish``'s reservation moves: ``pipeline`` keeps only what it used on each active block it holds; the
    rest is split among ``others``, those still waiting (``AllocationPolicy.redistribute``). Returns how many
    blocks it released. Every reservation involved is read at once and written back in a few statements."""
    held: collections.defaultdict[str, dict[str, tuple[str, str]]] = collections.defaultdict(dict)
    for block_id, holder, reserved, used in tx.all(sql.RESERVATION_HELD, (s.name, pipeline)):
        held[block_id][holder] = (reserved, used)
    zero = s.filter().zero()
    rules = s.rules()
    writes = []  # (block, pipeline, reserved, used): upserted, only `reserved` changes on existing rows
    released = sorted(b for b in held if pipeline in held[b])
    for block_id in released:
        holdings = {
            holder: {"reserved": json.loads(reserved), "used": json.loads(used)}
            for holder, (reserved, used) in held[block_id].items()
        }
        # The finished pipeline keeps only what it used; the rest goes to those waiting (allocation.py).
        for holder, (reserved, used) in rules.redistribute(holdings, pipeline, others, zero).items():
            writes.append((block_id, holder, json.dumps(list(reserved)), json.dumps(list(used))))
    for chunk in chunks(writes, 400):  # 5 values a row: under every backend's parameter limit
        tx.run(sql.reservation_upsert(len(chunk)), [v for row in chunk for v in (s.name, *row)])
    return len(released)


class NoSource:
    """Why no source admits a charge on a block (its ``reason``, for the refusal)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def eps_left(filt: Filter, used: Sequence[float], reserved: Sequence[float]) -> float:
    """Epsilon still available in a reservation, in the stream's epsilon units (for messages)."""
    if filt.accounting == Accounting.BASIC:
        return max(0.0, reserved[0] - used[0])
    shares = [(r - u) / c for u, r, c in zip(used[1:], reserved[1:], filt.capacity[1:]) if c > 0]
    return max(0.0, max(shares, default=0.0)) * filt.epsilon


def check_availability_args(filt: Filter, delta: float, tolerance: float) -> None:
    """The availability answers' arguments: ``delta`` as a request would check it, 0 < ``tolerance`` < 1."""
    try:
        filt.cost(epsilon=filt.epsilon, delta=delta)  # the request's own check of delta
    except ValueError as exc:
        raise LedgerError(str(exc)) from None
    tol = finite(tolerance, "tolerance", allow_none=False)
    if not 0 < tol < 1:
        raise LedgerError(f"tolerance {tolerance!r} is invalid: need 0 < tolerance < 1 (a fraction of epsilon)")
