"""Blocks: a new block's checks and registration, and the reads of blocks and their reservations (paper §3.2-3.3).

A stream's blocks are disjoint, keyed by a time window [start, end) or a user shard; each carries a budget filter
(``filters.py``) and, under Conserve and Aggressive, the reservations of the pipelines that were waiting when it
arrived. A block's exact row count stays in the ledger (``Block`` does not carry it). The ``Ledger`` facade
(``ledger.py``) adds and reads blocks through these; this module imports neither the facade nor the audit.

Reads that name many ids go in statements of at most ``CHUNK`` ids (``chunks``): under every backend's limit on
a statement's parameters, and each a primary-key look-up, so their cost does not grow with the stream.
"""

from __future__ import annotations

import collections
import collections.abc
import json
import re
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .chain import json_text
from .checks import check_name, finite
from .errors import DuplicateContent, LedgerError
from .store import sql
from .write import StreamWrite

if TYPE_CHECKING:
    from .allocation import Holdings
    from .store.base import Tx

DIGEST = re.compile(r"^[0-9a-f]{1,64}$")  # a block's content digest (ingest's): 1-64 lowercase hex digits
CHUNK = 500  # ids per statement


@dataclass(frozen=True)
class Block:
    """A block's public description. Its exact row count is NOT here: it stays in the ledger.

    Args:
      stream: The stream it belongs to.
      id: The block's id.
      start: The start of its time window, unix seconds (None: not a time block).
      end: The end of its time window, unix seconds.
      shard: Its user shard (None: not a user block).
      created: When it was added, unix seconds.
      state: ``active`` or ``retired`` (``BlockState``).
      spent: What grants have spent of it (the filter's vector).
      retired: When it was retired, unix seconds (None: active).
    """

    stream: str
    id: str
    start: float | None
    end: float | None
    shard: int | None
    created: float
    state: str
    spent: tuple
    retired: float | None = None

    @property
    def key(self) -> dict[str, Any]:
        if self.shard is not None:
            return {"shard": self.shard}
        if self.start is not None:
            return {"start": self.start, "end": self.end}
        return {}


class BlockSource(Protocol):
    """What reads a stream's registered blocks: the ``Ledger``, or a confined run's ``GrantClient``."""

    def blocks(self, stream: str, state: str | None = None) -> list[Block]: ...

    def block_digest(self, stream: str, block_id: str) -> str | None: ...


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    """``items`` (a list) in consecutive slices of at most ``size``."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def vector_text(values: Sequence[float]) -> str:
    """The stored text of a budget vector (a tuple or list of floats): ``json.dumps(values)``."""
    return _VECTOR_TEXT(values)


_VECTOR_TEXT = json_text()  # json.dumps's own defaults, its encoders built once (chain.json_text)


def vector_decoder() -> Callable[[str], tuple[float, ...]]:
    """A json.loads for stored budget vectors (as tuples) that parses each distinct text once.

    Thousands of rows hold few distinct vectors (fresh blocks, equal shares), and parsing
    dominates reading them.
    """
    cache: dict[str, tuple[float, ...]] = {}

    def decode(text):
        value = cache.get(text)
        if value is None:
            value = cache[text] = tuple(json.loads(text))
        return value

    return decode


# The span a block's time window may cover: what a date can name, [0001-01-01, 10000-01-01) UTC in unix seconds
# (reports print every window as dates; a time in milliseconds lands far beyond)
DATE_MIN, DATE_MAX = -62135596800.0, 253402300800.0


MAX_STORED_INT = 2**63 - 1  # a BIGINT column's largest value (SQLite and PostgreSQL)


def check_block(
    id: object,
    start: float | None = None,
    end: float | None = None,
    shard: str | None = None,
    rows: int | None = None,
    created: float | None = None,
    digest: str | None = None,
) -> tuple:
    """One new block's fields checked: (id, start, end, shard, rows, created, digest), or LedgerError naming the
    value. ``created`` defaults to now."""
    block_id = check_name(id, "block id")
    start, end = finite(start, "start"), finite(end, "end")
    if (start is None) != (end is None):
        raise LedgerError(f"block {block_id!r}: give both start and end of its window (start={start}, end={end})")
    if start is not None and not start < end:
        raise LedgerError(f"block {block_id!r}: window start {start} must be before end {end}")
    if start is not None and not DATE_MIN <= start < end <= DATE_MAX:
        raise LedgerError(
            f"block {block_id!r}: window [{start:g}, {end:g}) is outside [0001-01-01, 10000-01-01) "
            f"UTC (unix seconds [{DATE_MIN:.0f}, {DATE_MAX:.0f}]): give its start and end in unix "
            "seconds or ISO 8601 (a time in milliseconds lands far beyond)"
        )
    if shard is not None:
        if start is not None:
            raise LedgerError(f"block {block_id!r}: a block is keyed by a time window or a shard, not both")
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard <= MAX_STORED_INT:
            raise LedgerError(f"block {block_id!r}: shard {shard!r} must be an integer in [0, 2^63 - 1]")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= MAX_STORED_INT):
        raise LedgerError(f"block {block_id!r}: rows {rows!r} must be an integer in [0, 2^63 - 1]")
    created = time.time() if created is None else finite(created, "created", allow_none=False)
    if digest is not None and not (isinstance(digest, str) and DIGEST.match(digest)):
        raise LedgerError(f"block {block_id!r}: digest {digest!r} must be 1-64 lowercase hex digits")
    return block_id, start, end, shard, rows, created, digest


def check_new_blocks(blocks: Iterable[Mapping[str, Any]]) -> list[tuple]:
    """``add_blocks``' list checked before anything is read: each block's fields (``check_block``), no id twice."""
    if not isinstance(blocks, collections.abc.Iterable):
        raise LedgerError(
            f"add_blocks: blocks {blocks!r} is not a list: give a list of dicts with 'id' and the "
            "keyword arguments of add_block (e.g. [{'id': 'b0'}])"
        )
    if isinstance(blocks, (str, bytes)) or not all(isinstance(b, collections.abc.Mapping) for b in blocks):
        bad = (
            blocks
            if isinstance(blocks, (str, bytes))
            else next(b for b in blocks if not isinstance(b, collections.abc.Mapping))
        )
        raise LedgerError(
            f"add_blocks: block {bad!r} is not a dict: give a list of dicts with 'id' and the keyword "
            "arguments of add_block (e.g. [{'id': 'b0'}]), or call add_block(stream, id)"
        )
    checked = [check_block(**b) for b in blocks]
    dupes = sorted(i for i, n in collections.Counter(b[0] for b in checked).items() if n > 1)
    if dupes:
        raise LedgerError(f"block id(s) given more than once: {', '.join(dupes)}")
    return checked


def check_block_set(blocks: str | Iterable[str] | None) -> list[str]:
    """A request's block ids as a list (a comma-separated string is split): not empty, no id twice; LedgerError
    naming the ids otherwise."""
    given = blocks
    if isinstance(blocks, str):
        blocks = [b for b in blocks.split(",") if b]
    if not isinstance(blocks, collections.abc.Iterable):
        raise LedgerError(f"blocks {blocks!r} is not a list of block ids: give a list (or one comma-separated text)")
    blocks = list(blocks)
    bad = [] if set(map(type, blocks)) <= {str} else [b for b in blocks if not isinstance(b, str)]
    if bad:
        raise LedgerError(f"block id {bad[0]!r} is not a text: give block ids as texts, e.g. ['b0', 'b1']")
    if not blocks:
        raise LedgerError(f"the block set is empty ({given!r} names no block): name at least one block")
    dupes = len(set(blocks)) != len(blocks) and sorted(b for b, n in collections.Counter(blocks).items() if n > 1)
    if dupes:
        raise LedgerError(f"the block set names blocks more than once: {', '.join(map(str, dupes))}")
    return blocks


def check_new_ids(tx: Tx, stream: str, checked: Sequence[tuple], allowed: Container[str]) -> None:
    """In ``add_blocks``' transaction: refuse an id the stream holds, then a digest another stream (not in
    ``allowed``) registered (DuplicateContent: the same records would get a fresh budget here)."""
    # before the digest check: a block of this stream is never taken for a copy. One query per CHUNK ids
    # (primary key look-ups), so the cost does not grow with the stream (docs/BENCHMARKS.md).
    ids, existing = [b[0] for b in checked], set[str]()
    for chunk in chunks(ids):
        existing.update(r[0] for r in tx.all(sql.block_ids_present(len(chunk)), [stream, *chunk]))
    for block_id in ids:
        if block_id in existing:
            raise LedgerError(f"block {block_id!r} already exists in stream {stream!r}")
    owners = digest_owners(tx, [b[-1] for b in checked if b[-1]], stream)
    for args in checked:
        others = [o for o in owners.get(args[-1], []) if o[0] not in allowed]
        if others:
            raise DuplicateContent(
                f"block {args[0]!r}: its records (digest {args[-1]}) are already registered as block "
                f"{others[0][1]!r} of stream {others[0][0]!r}; in stream {stream!r} they would get a fresh "
                f"budget: nothing was added (allow the copy knowingly with "
                f"--allow-duplicate-of-stream {others[0][0]}, allow_duplicate_of=({others[0][0]!r},))"
            )


def digest_owners(tx: Tx, digests: Iterable[str], exclude_stream: str | None) -> dict[str, list[tuple[str, str]]]:
    """{digest: [(stream, block id), ...]} for ``digests`` registered in streams other than ``exclude_stream``."""
    out: dict[str, list[tuple[str, str]]]
    digests, out = sorted(set(digests)), {}
    for chunk in chunks(digests):
        for digest, stream, block_id in tx.all(sql.block_digest_owners(len(chunk)), [*chunk, exclude_stream or ""]):
            out.setdefault(digest, []).append((stream, block_id))
    return out


def insert_block(w: StreamWrite, block: tuple, *, waiting: Sequence[str], share: Sequence[float] | None) -> None:
    """Register one fresh block (zero loss) and, if ``share`` is not None, reserve it for ``waiting``; each step
    appended to the log. Refuses a window that overlaps one of the stream's or a shard it holds (LedgerError; the
    caller's transaction then changes nothing).

    Args:
        w: the stream's write.
        block: the block's fields as ``check_block`` returns them.
        waiting: the pipelines waiting on the stream, which share a new block's budget.
        share: each waiting pipeline's reservation on the block (the stream's rules), or None.
    """
    tx, log, stream, filt = w.tx, w.log, w.stream.name, w.filt
    block_id, start, end, shard, rows, created, digest = block
    # The caller (add_blocks) refused ids present in the stream or repeated in the batch, in the same transaction.
    if start is not None:
        # Does [start, end) overlap a window of the stream? The windows already there are pairwise disjoint
        # (each was checked here), so it is enough to look at the ONE window that starts last before ``end``:
        # if some window B overlaps (B.start < end, B.end > start) and the last-starting one M is not B, then
        # B.start < M.start, so M.start >= B.end > start, and M overlaps too (M.end > M.start > start). The
        # look-up is one descent of the (stream, start_ts) index, not a scan of every older window.
        clash = tx.one(sql.BLOCK_LAST_WINDOW_CLASH, (stream, end, start))
        if clash:  # refused: name the earliest overlapping window, as the scan this replaced did
            clash = tx.one(sql.BLOCK_FIRST_WINDOW_CLASH, (stream, end, start)) or clash
            raise LedgerError(f"block {block_id!r}: window [{start}, {end}) overlaps block {clash[0]!r}")
    if shard is not None:
        clash = tx.one(sql.BLOCK_SHARD_CLASH, (stream, shard))
        if clash:
            raise LedgerError(f"block {block_id!r}: shard {shard} is already block {clash[0]!r}")
    zero = filt.zero()
    tx.run(sql.BLOCK_INSERT, (stream, block_id, start, end, shard, rows, created, json.dumps(zero), digest))
    log(
        tx,
        "block",
        {
            "stream": stream,
            "id": block_id,
            "start": start,
            "end": end,
            "shard": shard,
            "created": created,
            "rows": rows,
            "digest": digest,
        },
    )
    if share is not None:
        tx.many(sql.RESERVATION_INSERT, [(stream, block_id, p, json.dumps(share), json.dumps(zero)) for p in waiting])
        log(tx, "reserve", {"stream": stream, "block": block_id, "pipelines": waiting, "share": list(share)})


def block_rows(stream: str, rows: Iterable[Sequence[Any]]) -> list[Block]:
    """The ``Block``s of stored rows (``sql.BLOCK_COLUMNS``)."""
    decode = vector_decoder()
    return [Block(stream, r[0], r[1], r[2], r[3], r[4], r[5], decode(r[6]), r[7]) for r in rows]


def read_blocks(tx: Tx, stream: str, ids: Iterable[str]) -> dict[str, Block]:
    """{id: Block} for those of ``ids`` that are blocks of ``stream``."""
    found: dict[str, Block] = {}
    for chunk in chunks(list(ids)):
        found.update((b.id, b) for b in block_rows(stream, tx.all(sql.block_rows(len(chunk)), [stream, *chunk])))
    return found


def block_budgets(
    tx: Tx, stream: str, ids: Iterable[str]
) -> tuple[dict[str, tuple[str, str, int | None]], dict[str, Holdings]]:
    """What ``request`` checks of the blocks ``ids`` that exist, in one read by ``IN`` lists: ({id: (state, spent
    TEXT as stored, None)}, their reservations as ``read_reservations`` gives them: {block: {pipeline: {"reserved",
    "used"}}}, pipelines in name order). The spent text is decoded by the caller once per distinct text; the None
    says the blocks' places in the store's id order are unknown (``block_ranges.ranged_budgets`` knows them)."""
    found: dict[str, tuple[str, str, int | None]]
    reservations: dict[str, Holdings]
    found, reservations, decode = {}, {}, vector_decoder()
    for chunk in chunks(list(ids)):
        for block, state, spent, pipeline, reserved, used in tx.all(sql.block_budgets(len(chunk)), [stream, *chunk]):
            found[block] = (state, spent, None)
            if pipeline is not None:
                reservations.setdefault(block, {})[pipeline] = {"reserved": decode(reserved), "used": decode(used)}
    return found, reservations


def read_reservations(tx: Tx, stream: str, blocks: Iterable[str] | None = None) -> dict[str, Holdings]:
    """{block: {pipeline: {"reserved", "used"}}} for ``blocks`` (None: every active block of the stream).

    Pipelines come in name order, so every reader sums a block's pool in the same order.
    """
    if blocks is None:
        rows = tx.all(sql.RESERVATION_ACTIVE, (stream,))
    else:
        rows = []
        for chunk in chunks(list(blocks)):
            rows += tx.all(sql.reservation_rows(len(chunk)), [stream, *chunk])
    out: dict[str, Holdings]
    out, decode = {}, vector_decoder()
    for block, pipeline, reserved, used in rows:
        out.setdefault(block, {})[pipeline] = {"reserved": decode(reserved), "used": decode(used)}
    return out
