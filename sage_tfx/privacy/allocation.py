"""A stream's allocation state in memory, under one policy: ``BlockAllocation`` (Conserve, Aggressive) and
``QueuedAllocation`` (DPF-N, DPF-T, DPack), applying the rules of ``allocation_policies.py`` (re-exported here).

The simulator proposes from this state and the ledger's queued scheduler runs ``QueuedAllocation.schedule``;
every charge is still made, and checked against the filter, by the ledger (docs/scheduling_policies.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

from . import filters
from .allocation_policies import (  # noqa: F401 (re-exported)
    Aggressive,
    AllocationPolicy,
    ArrivalUnlocking,
    Conserve,
    DPack,
    DpfN,
    DpfT,
    Holdings,
    QueuedPolicy,
    block_share,
    dominant_share,
    get_policy,
    policy_names,
    register,
)
from .errors import LedgerError
from .vocabulary import Accounting, Policy, Source

if TYPE_CHECKING:
    from .filters import Filter


# ------------------------------------------------------------------------------- in-memory state (simulator)
def newest_fitting(active: Sequence[str], fits: Callable[[str], bool], window: int) -> list[str] | None:
    """The newest ``window`` blocks of ``active`` (kept oldest first) for which ``fits(block)``, oldest first; or None."""
    chosen = []
    for block in reversed(active):
        if fits(block):
            chosen.append(block)
            if len(chosen) == window:
                return chosen[::-1]
    return None


class BlockAllocation:
    """A stream's allocation state in memory, under one policy: what the ledger keeps in its tables.

    The simulator asks, hundreds of times per simulated hour, "on which blocks can pipeline p still spend
    this cost?"; this answers from memory with the ledger's own rules (the policy's). It only proposes:
    every charge is then made by the real ledger, which refuses anything this state gets wrong.
    """

    def __init__(
        self, filt: Filter, min_cost: Sequence[float], policy: AllocationPolicy | str = Policy.CONSERVE
    ) -> None:
        self.filt = filt
        self.min_cost = tuple(min_cost)
        self.policy = policy if isinstance(policy, AllocationPolicy) else get_policy(policy)
        self.spent: dict = {}  # block -> spent vector
        self.holdings: dict = {}  # block -> {pipeline: {"reserved", "used"}}, pipeline name order
        self.active: list = []  # active block ids, oldest first
        self.retired: set = set()
        self._pools: dict = {}  # block -> (pool_used, pool_reserved), dropped whenever the block changes

    def add_block(self, block: str, waiting: Sequence[str]) -> None:
        zero = self.filt.zero()
        self.spent[block] = zero
        self.active.append(block)
        share = self.policy.new_block_shares(self.filt.capacity, waiting)
        self.holdings[block] = {} if share is None else {p: {"reserved": share, "used": zero} for p in sorted(waiting)}

    def _pool(self, block):
        pool = self._pools.get(block)
        if pool is None:
            pool = self._pools[block] = self.policy.pool(self.filt, self.spent[block], self.holdings[block])
        return pool

    def source(self, block: str, pipeline: str, cost: Sequence[float]) -> Source | None:
        """Source.OWN, Source.POOL or None, by the policy's rule (the filter must admit as well)."""
        if block in self.retired or not self.filt.admits(self.spent[block], cost):
            return None
        holdings = self.holdings[block]
        own = holdings.get(pipeline)
        if own is not None and self.filt.fits_share(own["used"], cost, own["reserved"]):
            return Source.OWN
        pool_used, pool_reserved = self._pool(block)
        if self.filt.fits_share(pool_used, cost, pool_reserved):
            return Source.POOL
        return None

    def fits(self, block: str, pipeline: str, cost: Sequence[float]) -> bool:
        return self.source(block, pipeline, cost) is not None

    def available_epsilon(self, block: str, pipeline: str, delta: float) -> float:
        """Basic accounting only: the largest epsilon ``pipeline`` may spend on ``block`` (closed form)."""
        if self.filt.accounting != Accounting.BASIC:
            raise ValueError(
                f"available_epsilon has a closed form under basic accounting only, not {self.filt.accounting!r}"
            )
        if block in self.retired:
            return 0.0
        cap_eps, cap_delta = self.filt.capacity
        spent_eps, spent_delta = self.spent[block]
        if spent_delta + delta > cap_delta:
            return 0.0
        best = 0.0
        own = self.holdings[block].get(pipeline)
        if own is not None and own["used"][1] + delta <= own["reserved"][1]:
            best = own["reserved"][0] - own["used"][0]
        pool_used, pool_reserved = self._pool(block)
        if pool_used[1] + delta <= pool_reserved[1]:
            best = max(best, pool_reserved[0] - pool_used[0])
        return max(0.0, min(best, cap_eps - spent_eps))

    def choose(self, pipeline: str, cost: Sequence[float], window: int) -> list[str] | None:
        """The newest ``window`` active blocks on which ``pipeline`` can spend ``cost``, oldest first; or None."""
        return newest_fitting(self.active, lambda block: self.fits(block, pipeline, cost), window)

    def charge(self, blocks: Iterable[str], pipeline: str, cost: Sequence[float]) -> None:
        """Charge ``cost`` on every block (all must fit: AssertionError otherwise); retire exhausted blocks."""
        sources = [self.source(block, pipeline, cost) for block in blocks]
        missing = [b for b, s in zip(blocks, sources) if s is None]
        if missing:
            raise AssertionError(f"allocation: block(s) {missing} cannot take {cost} for {pipeline}")
        for block, source in zip(blocks, sources):
            self.spent[block] = filters.add(self.spent[block], cost)
            self._pools.pop(block, None)
            if source == Source.OWN:
                own = self.holdings[block][pipeline]
                own["used"] = filters.add(own["used"], cost)
            if self.policy.retires(self.filt, self.spent[block], self.min_cost):
                self.retired.add(block)
                self.active.remove(block)

    def finish(self, pipeline: str, others: Sequence[str]) -> None:
        """``pipeline`` finished; ``others`` are the pipelines still waiting."""
        others = sorted(others)
        zero = self.filt.zero()
        for block in self.active:
            holdings = self.holdings[block]
            if pipeline not in holdings:
                continue
            self._pools.pop(block, None)
            changes = self.policy.redistribute(holdings, pipeline, others, zero)
            for holder, (reserved, used) in changes.items():
                holdings[holder] = {"reserved": reserved, "used": used}
            if any(h not in holdings for h in changes) or list(holdings) != sorted(holdings):
                self.holdings[block] = dict(sorted(holdings.items()))


class QueuedAllocation:
    """A stream's state under a queued policy (``QueuedPolicy``: DPF-N, DPF-T, DPack), in memory.

    Times are in seconds (the ledger's block times). ``arrive`` counts a pipeline arrival on every live
    block (DPF-N's and DPack's unlocking); ``demand`` records a pipeline's pending demand (one per pipeline;
    a new one replaces it); ``schedule`` grants pending demands in the policy's order, all-or-nothing, and
    returns them. Only demands that might have become grantable are re-checked: a demand that failed on a
    block stays failed while that block's unlocked fraction is unchanged (spent only grows), so the result
    is the same as checking all of them (tests/simulate/test_allocation_policies.py checks it against a full scan).
    """

    def __init__(self, filt: Filter, min_cost: Sequence[float], policy: AllocationPolicy | str) -> None:
        self.filt = filt
        self.min_cost = tuple(min_cost)
        self.policy = cast(QueuedPolicy, policy if isinstance(policy, AllocationPolicy) else get_policy(policy))
        if not self.policy.queued:
            raise LedgerError(f"policy {str(self.policy.name)!r} is not a queued policy: use BlockAllocation")
        self.spent: dict = {}  # block -> spent vector
        self.arrived: dict = {}  # block -> arrival time (s)
        self.arrivals: dict = {}  # block -> pipeline arrivals since the block arrived (capped once unlocked)
        self.active: list = []  # active block ids, oldest first
        self.retired: set = set()
        self.pending: dict = {}  # pipeline -> [blocks tuple, cost, seq, blocked_on, fraction_then]
        self._seq = 0
        self.full_scan = False  # tests: check every pending demand at every scheduling point

    # -- blocks and arrivals
    def add_block(self, block: str, now: float) -> None:
        if block in self.spent:
            raise LedgerError(f"block {block!r} exists already")
        self.spent[block] = self.filt.zero()
        self.arrived[block] = float(now)
        self.arrivals[block] = 0
        self.active.append(block)

    def load_block(
        self, block: str, *, spent: Sequence[float], arrived: float, arrivals: int, retired: bool = False
    ) -> None:
        """Restore one block's state as stored elsewhere (the ledger's tables, the audit's replay): the same
        fields ``add_block``, ``arrive`` and ``charge`` keep, so the rules run unchanged on them."""
        self.spent[block] = tuple(spent)
        self.arrived[block] = float(arrived)
        self.arrivals[block] = int(arrivals)
        if retired:
            self.retired.add(block)
        else:
            self.active.append(block)

    def arrive(self, now: float | None = None) -> None:
        """A pipeline arrived: one more share of every live block unlocks (policies that unlock per arrival)."""
        for block in self.active:
            self.arrivals[block] += 1

    def fraction(self, block: str, now: float) -> float:
        return self.policy.unlocked_fraction(arrivals=self.arrivals[block], age=float(now) - self.arrived[block])

    def unlocked(self, block: str, now: float) -> tuple[float, ...]:
        f = self.fraction(block, now)
        return tuple(c * f for c in self.filt.capacity)

    def fits(self, block: str, cost: Sequence[float], now: float) -> bool:
        """Privacy (the filter admits ``cost`` on the block) AND the policy (it fits unlocked minus spent)."""
        if block in self.retired or block not in self.spent:
            return False
        spent = self.spent[block]
        return self.filt.admits(spent, cost) and self.filt.fits_share(spent, cost, self.unlocked(block, now))

    def choose(self, cost: Sequence[float], window: int, now: float) -> list[str] | None:
        """The newest ``window`` active blocks on which ``cost`` fits now, oldest first; or None."""
        return newest_fitting(self.active, lambda block: self.fits(block, cost, now), window)

    # -- demands
    def demand(self, pipeline: str, blocks: Sequence[str], cost: Sequence[float], seq: int | None = None) -> None:
        """Record ``pipeline``'s pending demand of ``cost`` on each of ``blocks`` (replacing any earlier one).

        ``seq`` orders demands whose keys tie (smaller: older, first); None: after every demand so far. The
        ledger passes the log sequence number of the demand's entry, so its audit can recompute the order."""
        blocks = tuple(blocks)
        if not blocks or len(set(blocks)) != len(blocks):
            raise LedgerError(f"demand of {pipeline!r} names blocks {list(blocks)!r}: give distinct blocks")
        unknown = [b for b in blocks if b not in self.spent]
        if unknown:
            raise LedgerError(f"demand of {pipeline!r} names unknown blocks {unknown!r}")
        self._seq = self._seq + 1 if seq is None else max(self._seq, int(seq))
        self.pending[pipeline] = [blocks, tuple(cost), self._seq if seq is None else int(seq), None, None]

    def withdraw(self, pipeline: str) -> None:
        self.pending.pop(pipeline, None)

    def key(self, pipeline: str, orders_index: Mapping[str, int | None] | None = None) -> tuple[float, int]:
        blocks, cost, seq = self.pending[pipeline][:3]
        spents = [self.spent[b] for b in blocks]
        idx = None if orders_index is None else [orders_index.get(b) for b in blocks]
        return (self.policy.demand_key(self.filt, cost, spents, idx), seq)

    def _best_orders(self):
        """DPack under RDP: per block, the order index at which the most pending demands fit, smallest first."""
        if not (self.filt.accounting == Accounting.RDP and isinstance(self.policy, DPack)):
            return None
        per_block = {}
        for blocks, cost, *_ in self.pending.values():
            for b in blocks:
                per_block.setdefault(b, []).append(cost)
        best = {}
        for b, costs in per_block.items():
            remaining = [max(0.0, c - s) for c, s in zip(self.filt.capacity, self.spent[b])]
            top, top_k = -1, None
            for k in range(1, len(self.filt.capacity)):
                room, count = remaining[k], 0
                for c in sorted(x[k] for x in costs):
                    if c > room:
                        break
                    room -= c
                    count += 1
                if count > top:
                    top, top_k = count, k
            best[b] = top_k
        return best

    def _maybe(self, entry, now):
        blocked_on, fraction_then = entry[3], entry[4]
        if self.full_scan or blocked_on is None:
            return True
        return blocked_on not in self.retired and self.fraction(blocked_on, now) != fraction_then

    def schedule(self, now: float) -> list:
        """Grant pending demands in the policy's order, all-or-nothing; returns [(pipeline, blocks, cost)]."""
        orders_index = self._best_orders()
        candidates = [p for p, e in self.pending.items() if self._maybe(e, now)]
        candidates.sort(key=lambda p: self.key(p, orders_index))
        granted = []
        for pipeline in candidates:
            entry = self.pending[pipeline]
            blocks, cost = entry[0], entry[1]
            failed = next((b for b in blocks if not self.fits(b, cost, now)), None)
            if failed is not None:
                entry[3] = failed
                entry[4] = self.fraction(failed, now) if failed in self.spent else None
                continue
            self.charge(blocks, cost, now)
            del self.pending[pipeline]
            granted.append((pipeline, blocks, cost))
        return granted

    def charge(self, blocks: Iterable[str], cost: Sequence[float], now: float) -> None:
        """Charge ``cost`` on every block (all must fit: AssertionError otherwise); retire exhausted blocks."""
        missing = [b for b in blocks if not self.fits(b, cost, now)]
        if missing:
            raise AssertionError(f"allocation: block(s) {missing} cannot take {cost}")
        for block in blocks:
            self.spent[block] = filters.add(self.spent[block], cost)
            if self.policy.retires(self.filt, self.spent[block], self.min_cost):
                self.retired.add(block)
                self.active.remove(block)
