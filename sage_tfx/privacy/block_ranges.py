"""A grant's blocks read and written by id range where they lie next to each other in the store.

A grant usually names a window of blocks, and a window's blocks are usually consecutive in the blocks table's key
order (stream, id). Reading them with ``id BETWEEN first AND last`` costs one index search instead of one per id,
and so does writing one new value to a run of them. The rows read and written, and every value, are those of the
``IN``-list path (``blocks.block_budgets``, ``block_set_spent``), which stays the fallback.

Contract: the range path is taken only where it is exact. ``ranged_budgets`` reads the request's id range in the
store's own id order (at most ``RANGE_SLACK`` rows more than the request names) and returns None unless it saw
every requested id; each block then carries its place in that order, so a run of places with no gap holds every
row between its first and last id. The write transaction is exclusive (SQLite's write lock, PostgreSQL's meta lock
row), so no row enters a range between the read and the UPDATE. This module imports neither the facade nor the
audit.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .blocks import chunks
from .store import sql

if TYPE_CHECKING:
    from .allocation import Holdings
    from .store.base import Tx

RANGE_SLACK = 32  # rows of other blocks a range read may pass over before the IN lists are cheaper
_place = operator.itemgetter(2)  # a found row's place in the store's id order


def ranged_budgets(
    tx: Tx, stream: str, ids: Sequence[str]
) -> tuple[dict[str, tuple[str, str, int | None]], dict[str, Holdings]] | None:
    """``blocks.block_budgets``'s answer for ``ids`` read as one id range, each block with its place in the
    store's id order; None where a reservation lies in the range (``tx.range_reserved``, set by
    ``requests.read_request``: the ``IN`` lists read them with the blocks, in one statement) or the range does
    not hold every id within its row limit (use the ``IN`` lists).

    Args:
        tx: the request's write transaction.
        stream: the stream's name.
        ids: the requested block ids.

    Returns:
        ``({id: (state, spent text, place)}, {})`` (no reservations) or None.
    """
    wanted = set(ids)
    if not wanted or getattr(tx, "range_reserved", True):  # reservations there (or not known): the IN lists read
        return None  # blocks and reservations in one statement
    lo, hi = min(wanted), max(wanted)
    rows = tx.all(sql.BLOCK_RANGE_BUDGETS, (stream, lo, hi, len(wanted) + RANGE_SLACK))
    found: dict[str, tuple[str, str, int | None]] = {
        block: (state, spent, place) for place, (block, state, spent) in enumerate(rows)
    }
    if len(found) != len(wanted) or found.keys() != wanted:  # other blocks in the range: keep the requested
        found = {block: row for block, row in found.items() if block in wanted}
        if len(found) != len(wanted):  # a requested id outside the store's range order, past the limit, or unknown
            return None
    return found, {}


def runs(ids: Sequence[str], found: Mapping[str, tuple[Any, ...]]) -> list[list[str]]:
    """``ids`` cut into runs of consecutive places in the store's id order (``found[id][2]``), in that order;
    each id its own run, in the given order, where a place is unknown (None)."""
    places = list(map(_place, map(found.__getitem__, ids)))
    if None in places:
        return [[b] for b in ids]
    out: list[list[str]] = []
    last = -2
    for place, block in sorted(zip(places, ids)):
        if place == last + 1:
            out[-1].append(block)
        else:
            out.append([block])
        last = place
    return out


def set_spent(tx: Tx, stream: str, values: Sequence[Any], ids: Sequence[str], found: Mapping[str, tuple]) -> None:
    """Write one (spent, state, retired) ``values`` on the blocks ``ids``: one ranged UPDATE per run of two or
    more blocks next to each other in the store (``runs``), ``IN`` lists of at most ``blocks.CHUNK`` for the rest.

    Args:
        tx: the request's write transaction (exclusive, and the one ``found`` was read in).
        stream: the stream's name.
        values: the new spent text, state and retired time.
        ids: the blocks getting them.
        found: ``ranged_budgets``'s or ``blocks.block_budgets``'s rows of (at least) ``ids``.
    """
    places = list(map(_place, map(found.__getitem__, ids)))
    if len(ids) > 1 and None not in places:
        first, last = min(places), max(places)
        if last - first + 1 == len(ids):  # one run (distinct ids have distinct places): the usual grant, no sort
            tx.run(sql.BLOCK_RANGE_SET_SPENT, [*values, stream, ids[places.index(first)], ids[places.index(last)]])
            return
    singles: list[str] = []
    for run in runs(ids, found):
        if len(run) > 1:
            tx.run(sql.BLOCK_RANGE_SET_SPENT, [*values, stream, run[0], run[-1]])
        else:
            singles.append(run[0])
    for chunk in chunks(singles):
        tx.run(sql.block_set_spent(len(chunk)), [*values, stream, *chunk])
