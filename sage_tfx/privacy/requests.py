"""A grant request's steps, run by ``Ledger.request`` in its one write transaction (docs/block_composition.md).

``requested_ids`` parses the blocks or window before any transaction; then ``read_request`` reads the stream, the
pipeline's state and the log's tail in one statement, ``request_cost`` prices the request on the stream's filter,
``requested_blocks`` checks every block, ``check_request`` the grant floor and the pipeline's state, and
``charge_request`` charges under the stream's policy. Every error comes before anything is written. This module
imports neither the ``Ledger`` facade nor the audit.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import blocks as _blocks
from . import charges as _charges
from .block_ranges import ranged_budgets
from .errors import BlockRetired, LedgerError, UnknownBlock
from .store import sql
from .streams import Stream, check_minimum, check_unit_charge, parsed_stream, read_stream
from .vocabulary import BlockState, PipelineState
from .write import Charge, StreamWrite

if TYPE_CHECKING:
    from .filters import BasicFilter, RdpFilter
    from .grants import Grant
    from .store import Tx


def requested_ids(
    blocks: Sequence[str] | str | None,
    window: tuple[float, float] | None,
    window_blocks: Callable[[float, float], list[str]],
) -> list[str]:
    """The request's block ids, checked (``blocks.check_block_set``).

    Args:
        blocks: the block ids, or None when ``window`` is given.
        window: a (start, end) pair whose active blocks are asked for, or None when ``blocks`` is given.
        window_blocks: ``Ledger.window_blocks`` bound to the stream: the active blocks of a window.

    Returns:
        The ids, in the request's order, each once.

    Raises:
        LedgerError: both or neither of ``blocks`` and ``window``, a window that is not a pair, or bad ids.
    """
    if (blocks is None) == (window is None):
        raise LedgerError("give either blocks or window, not both and not neither")
    if window is not None:
        try:
            start, end = window
        except (TypeError, ValueError):
            raise LedgerError(f"window {window!r} must be a (start, end) pair") from None
        blocks = window_blocks(start, end)
    return _blocks.check_block_set(blocks)


def read_request(tx: Tx, stream: str, pipeline: str, blocks: Sequence[str] = ()) -> tuple[Stream, str | None]:
    """The stream and the pipeline's state, read with the log's last entry in ONE statement.

    All three are as of this write transaction, which is exclusive (SQLite's write lock, PostgreSQL's meta lock
    row), so nothing read here is from before another writer's commit. The log's last entry (what the grant's
    entry chains to) is kept in ``tx.log_last``; ``tx.range_reserved`` says whether any reservation lies in the
    requested blocks' id range (``block_ranges.ranged_budgets``); ``tx.head_until_use`` asks ``HeadSync.USE``'s head write (durable
    before the grant's first use, ``verify``).

    Args:
        tx: the request's write transaction.
        stream: the stream's name.
        pipeline: the requesting pipeline's name.
        blocks: the requested block ids.

    Returns:
        ``(stream, pipeline state)``; the state is None for a pipeline never registered.

    Raises:
        UnknownStream: no such stream (naming the streams there are).
    """
    lo, hi = (min(blocks), max(blocks)) if blocks else ("", "")
    row = (
        tx.one(sql.STREAM_REQUEST_READ, (stream, pipeline, stream, lo, hi, stream)) if isinstance(stream, str) else None
    )
    if row is None:
        read_stream(tx, stream)  # raises UnknownStream, naming the streams there are
    w = sql.STREAM_WIDTH
    s = parsed_stream(tuple(row[:w]))
    tx.log_last = (row[w + 1], row[w + 2]) if row[w + 1] is not None else None
    tx.range_reserved = row[w + 3] is not None
    tx.head_until_use = True
    return s, row[w]


def request_cost(s: Stream, filt: BasicFilter | RdpFilter, epsilon: float | None, delta: float, curve: Any) -> tuple:
    """The filter's cost vector of the request's (``epsilon``, ``delta``) or RDP ``curve``.

    Raises:
        LedgerError: neither epsilon nor a curve, a curve on a stream whose unit forbids it, or a bad cost.
    """
    try:
        check_unit_charge(s, curve)
        if curve is None and epsilon is None:
            raise ValueError("give epsilon (and delta) or an RDP curve")
        return filt.cost(epsilon=epsilon, delta=delta, curve=curve)
    except ValueError as exc:
        raise LedgerError(str(exc)) from None


def requested_blocks(tx: Tx, stream: str, blocks: Sequence[str]) -> tuple[dict, dict]:
    """Every requested block's budget row and reservations, all of them active: read as one id range where the
    blocks lie next to each other in the store (``block_ranges.ranged_budgets``), else by ``blocks.block_budgets``.

    Returns:
        ``(found, reservations)`` as ``blocks.block_budgets`` returns them (``found`` with each block's place in
        the store's id order where the range read knows it).

    Raises:
        UnknownBlock: a block the stream does not hold.
        BlockRetired: a retired block (it is never offered again).
    """
    found, reservations = ranged_budgets(tx, stream, blocks) or _blocks.block_budgets(tx, stream, blocks)
    if len(found) != len(blocks):  # found holds requested blocks only
        missing = [b for b in blocks if b not in found]
        raise UnknownBlock(f"unknown block(s) in stream {stream!r}: {', '.join(map(str, missing))}")
    active = BlockState.ACTIVE.value
    if list(map(_state, found.values())).count(active) != len(found):  # no per-block loop while all are active
        retired = [b for b in blocks if found[b][0] != active]
        raise BlockRetired(
            f"block(s) {', '.join(retired)} of stream {stream!r} are retired "
            "(budget exhausted) and are never offered again"
        )
    return found, reservations


_state = operator.itemgetter(0)  # a found row's state


def check_request(
    filt: BasicFilter | RdpFilter,
    s: Stream,
    cost: tuple,
    epsilon: float | None,
    curve: Any,
    pipeline: str,
    pipeline_state: str | None,
) -> None:
    """The grant floor (``streams.check_minimum``) and a pipeline that has not finished.

    Raises:
        LedgerError: a charge under the stream's grant floor, or a pipeline that already finished.
    """
    check_minimum(filt, s, cost, epsilon if curve is None else None)
    if pipeline_state is not None and pipeline_state != PipelineState.WAITING:
        raise LedgerError(f"pipeline {pipeline!r} already finished on stream {s.name!r}")


def charge_request(
    write: StreamWrite, charge: Charge, found: dict, reservations: dict
) -> tuple[Grant | None, dict[str, str] | None]:
    """Charge ``charge`` under the stream's policy: at once (``charges.charge_now``), or as a queued demand.

    Returns:
        ``(grant, None)`` when granted now; ``(None, refusal)`` when a queued policy recorded the demand instead.

    Raises:
        BudgetRefused: a block cannot pay (conserve, aggressive: nothing written).
        LedgerError: a queued request whose split does not compose to its charge (nothing written).
    """
    if write.stream.rules().queued:
        if charge.split is not None:  # checked before the demand is recorded: its grant's split must compose
            charge.split.check_covered(*write.filt.spendable(charge.cost))
        return _charges.queued_request(write, charge)
    return _charges.charge_now(write, charge, found, reservations), None
