"""The ledger's read-only queries, each one read transaction: ``Ledger``'s base (docs/block_composition.md).

Streams, blocks, pipelines, grants, releases, draws and each pipeline's history as the store holds them, and what
a pipeline could be granted now (``available_epsilon``, ``available_per_block``: advisory, ``Ledger.request``
decides). The facade (``ledger.py``) adds the writes, the keys and the anchor; this module imports neither the
facade nor the audit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import blocks as _blocks
from . import charges as _charges
from .blocks import Block
from .budget_arrays import bisect as _bisect
from .checks import finite as _finite
from .errors import GrantError, LedgerError, UnknownBlock
from .grants import Grant, Release
from .store import sql
from .streams import Stream, read_stream, stream_status
from .vocabulary import BlockState

if TYPE_CHECKING:
    from .store import Tx


def recorded_grant(grant_id: str, row: Sequence[Any] | None) -> Grant:
    """The Grant of a ``sql.GRANT_BODY`` row; GrantError if there is none (never charged by this ledger)."""
    if row is None:
        raise GrantError(f"grant {grant_id!r} is unknown to this ledger")
    return Grant.from_row(*row)


class LedgerReads:
    """The read-only queries of a ``Ledger`` (open one with ``Ledger.open``): one read transaction each."""

    _store: Any  # the backend store (``store/``), set by ``Ledger.__init__``

    def stream(self, name: str, tx: Tx | None = None) -> Stream:
        if tx is None:
            with self._store.transaction(write=False) as tx:
                return self.stream(name, tx)
        return read_stream(tx, name)

    def streams(self) -> list[Stream]:
        with self._store.transaction(write=False) as tx:
            return [self.stream(r[0], tx) for r in tx.all(sql.STREAM_NAMES)]

    def digest_owners(
        self, digests: Iterable[str], exclude_stream: str | None = None
    ) -> dict[str, list[tuple[str, str]]]:
        """{digest: [(stream, block id), ...]} for the given content digests registered in streams other than
        ``exclude_stream``. TRUSTED CODE ONLY (ingest)."""
        with self._store.transaction(write=False) as tx:
            return _blocks.digest_owners(tx, digests, exclude_stream)

    def block(self, stream: str, block_id: str) -> Block:
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = _blocks.read_blocks(tx, stream, [block_id])
        if not rows:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return rows[block_id]

    def blocks(self, stream: str, state: BlockState | str | None = None) -> list[Block]:
        """The stream's blocks in key order (time or shard), optionally only 'active' or 'retired'."""
        if state is not None and state not in tuple(BlockState):
            raise LedgerError(f"block state {state!r} is unknown: use 'active' or 'retired'")
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = tx.all(sql.BLOCK_ROWS_IN_STATE, (stream, state)) if state else tx.all(sql.BLOCK_ROWS, (stream,))
        return _blocks.block_rows(stream, rows)

    def private_row_count(self, stream: str, block_id: str) -> int | None:
        """The exact row count of a block. TRUSTED CODE ONLY (ingest, data readers' sanity checks).

        Never show this to a pipeline: what a pipeline learns about its data size
        must be the public block count or a DP count charged to its grant.
        """
        with self._store.transaction(write=False) as tx:
            row = tx.one(sql.BLOCK_N_ROWS, (stream, block_id))
        if row is None:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return row[0]

    def block_digest(self, stream: str, block_id: str) -> str | None:
        """The content digest registered for a block at ingest (None for blocks registered without one).

        TRUSTED CODE ONLY (the block readers check the block files against it, docs/security.md).
        """
        with self._store.transaction(write=False) as tx:
            row = tx.one(sql.BLOCK_DIGEST, (stream, block_id))
        if row is None:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return row[0]

    def trusted_reads(self, stream: str) -> list[dict[str, Any]]:
        """The ``trusted_read`` log entries of ``stream`` (bodies: stream, blocks, purpose), oldest first."""
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            bodies = [json.loads(r[0]) for r in tx.all(sql.LOG_TRUSTED_READS)]
        return [b for b in bodies if b.get("stream") == stream]

    def window_blocks(self, stream: str, start: float, end: float) -> list[str]:
        """Active blocks whose time window lies inside [start, end)."""
        start, end = _finite(start, "window start", False), _finite(end, "window end", False)
        if not start < end:
            raise LedgerError(f"window [{start}, {end}) is empty: start must be before end")
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            ids = [r[0] for r in tx.all(sql.BLOCK_WINDOW_IDS, (stream, start, end))]
        if not ids:
            raise LedgerError(f"window [{start}, {end}) holds no active blocks of stream {stream!r}")
        return ids

    def pipelines(self, stream: str) -> list[dict[str, Any]]:
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            return [
                dict(zip(("name", "state", "outcome", "registered", "finished"), r))
                for r in tx.all(sql.PIPELINE_ROWS, (stream,))
            ]

    def available_epsilon(
        self, pipeline: str, stream: str, blocks: Sequence[str], delta: float = 0.0, *, tolerance: float = 1e-4
    ) -> float:
        """The largest epsilon a (epsilon, delta) request by ``pipeline`` on ALL of ``blocks`` would be granted now.

        A bisection over epsilon in [0, the stream's epsilon], from below, to within
        ``tolerance`` times the stream's epsilon: the answer itself is granted (unless
        another writer spends first). 0.0 if any block is unknown or retired.
        """
        with self._store.transaction(write=False) as tx:
            s = self.stream(stream, tx)
            _charges.check_availability_args(s.filter(), delta, tolerance)
            budgets = _charges.budgets_on_all(tx, s, pipeline, list(blocks), delta)
        if budgets is None:
            return 0.0
        return float(_bisect(lambda eps: budgets.fits(eps[0]).all().reshape(1), 1, s.epsilon, tolerance)[0])

    def available_per_block(
        self,
        pipeline: str,
        stream: str,
        blocks: Sequence[str] | None = None,
        delta: float = 0.0,
        *,
        tolerance: float = 1e-4,
    ) -> dict[str, float]:
        """{block id: the largest epsilon ``pipeline`` could be granted on that block ALONE now}, in ONE read.

        For every block b this equals ``available_epsilon(pipeline, stream, [b], delta,
        tolerance)`` exactly (the same bisection, run on all blocks at once). ``blocks``
        None: every active block of the stream, in key order (time window or shard),
        oldest first. Given ids map in their order; an unknown or retired block maps to
        0.0, as in ``available_epsilon`` (nothing can be granted on it).
        """
        with self._store.transaction(write=False) as tx:
            s = self.stream(stream, tx)
            _charges.check_availability_args(s.filter(), delta, tolerance)
            blocks, active, budgets = _charges.budgets_per_block(tx, s, pipeline, blocks, delta)
        out = dict.fromkeys(blocks, 0.0)
        out.update(zip(active, _bisect(budgets.fits, len(active), s.epsilon, tolerance).tolist()))
        return out

    def get_grant(self, grant_id: str) -> Grant:
        with self._store.transaction(write=False) as tx:
            return recorded_grant(grant_id, tx.one(sql.GRANT_BODY, (grant_id,)))

    def grants(self, stream: str | None = None) -> list[Grant]:
        with self._store.transaction(write=False) as tx:
            if stream is None:
                rows = tx.all(sql.GRANT_BODIES)
            else:
                rows = tx.all(sql.GRANT_STREAM_BODIES, (stream,))
        return [Grant.from_row(*row) for row in rows]

    def releases(self, grant_id: str | None = None) -> list[Release]:
        """The releases opened so far (all, or one grant's), oldest first."""
        with self._store.transaction(write=False) as tx:
            rows = tx.all(sql.RELEASE_ROWS_OF_GRANT, (grant_id,)) if grant_id else tx.all(sql.RELEASE_ROWS)
        return [Release(*r, reopened=False) for r in rows]  # type: ignore[misc]  # a row is Release's first six

    def draws(self) -> list[tuple]:
        """Every draw row: (lifetime grant, run, run grant, stream, epsilon, delta), by run."""
        with self._store.transaction(write=False) as tx:
            return [tuple(r) for r in tx.all(sql.DRAW_ALL)]

    def history(self, stream: str, pipeline: str) -> list[tuple[Grant, str | None, Any]]:
        """The pipeline's grants in order, each with its recorded outcome (None while running or killed)."""
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = tx.all(sql.GRANT_HISTORY, (stream, pipeline))
        return [
            (Grant.from_row(body, sig), outcome, json.loads(details) if details else None)
            for body, sig, outcome, details in rows
        ]

    def status(self, stream: str) -> dict[str, Any]:
        """A JSON-ready summary: the stream's guarantee and each block's spent and remaining budget."""
        s = self.stream(stream)
        return stream_status(s, self.blocks(stream), self._grant_count(stream), self.pipelines(stream))

    def _grant_count(self, stream):
        with self._store.transaction(write=False) as tx:
            return tx.one(sql.GRANT_COUNT, (stream,))[0]

    def log_entries(self) -> list[tuple]:
        with self._store.transaction(write=False) as tx:
            return tx.all(sql.LOG_ALL)
