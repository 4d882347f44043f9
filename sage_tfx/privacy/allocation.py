"""Budget allocation among a stream's pipelines: the rules, written once, and the policies that plug into them.

Sage's allocation (paper §3.3), on in-memory state. A block's *holdings* map each
pipeline holding a reservation on it to ``{"reserved": vector, "used": vector}``, in pipeline name
order (every reader sums a block's pool in that order, so the floats agree everywhere):

* **new-block shares**: a new block's capacity is split evenly among the pipelines waiting then;
* **own reservation, then the pool**: a charge draws on the pipeline's own reservation if it fits
  there (``filt.fits_share``), else on the unreserved pool (capacity not reserved, minus what was
  spent outside reservations);
* **redistribution on finish**: a finished pipeline keeps what it used; the rest of each of its
  reservations on active blocks is split evenly among those still waiting (with nobody waiting it
  falls back to the pool);
* **retirement**: a block that cannot admit the stream's ``min_epsilon`` more is retired for good.

Privacy rests on the filter alone (``filt.admits``, checked by the ledger on every charge, whatever
the policy); reservations are a fairness device. A policy never grants more than the filter admits.

``AllocationPolicy`` is the plug-in point: Conserve and Aggressive (the paper's two, §3.3) differ
only in how much epsilon a pipeline asks for (``plan_epsilon``); a policy that changes the rules
(DPF-N, DPF-T, a DPack-style one) overrides the methods it changes and registers itself by name
(``register``). ``Ledger`` (the tables) and the simulator (``BlockAllocation``, in memory) both apply
the rules through a policy, so they cannot drift apart.

``budget_arrays.BudgetArrays`` is the same rule as array operations, for the ledger's availability queries.
"""
from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from . import filters
from .errors import LedgerError
from .vocabulary import Accounting, Policy, Source

if TYPE_CHECKING:
    from .filters import Filter

# One block's reservations: {pipeline: {"reserved": vector, "used": vector}}, in pipeline name order.
Holdings = dict[str, dict[str, Sequence[float]]]


# ------------------------------------------------------------------------------------------------- the rules
class AllocationPolicy(abc.ABC):
    """The allocation rules of one policy, on plain vectors (tuples of floats). Stateless."""

    name: ClassVar[str]
    queued: ClassVar[bool] = False   # True: demands wait in a queue the policy orders (QueuedPolicy)

    def params(self) -> dict:
        """The policy's parameters, as stored with a stream (none for Conserve and Aggressive)."""
        return {}

    def new_block_shares(self, capacity: Sequence[float], waiting: Sequence[str]) -> tuple | None:
        """The reservation each of ``waiting`` gets on a new block (None: nobody waits, all goes to the pool)."""
        if not waiting:
            return None
        return tuple(c / len(waiting) for c in capacity)

    @staticmethod
    def pool(filt: Filter, spent: Sequence[float], holdings: Holdings) -> tuple[list[float], list[float]]:
        """A block's unreserved pool as (used, reserved): capacity not reserved to anyone, and the part of
        ``spent`` not drawn from reservations. Summed in the holdings' (pipeline name) order."""
        pool_reserved = list(filt.capacity)
        pool_used = list(spent)
        for r in holdings.values():
            pool_reserved = [p - x for p, x in zip(pool_reserved, r["reserved"])]
            pool_used = [p - x for p, x in zip(pool_used, r["used"])]
        return pool_used, pool_reserved

    def source(self, filt: Filter, spent: Sequence[float], cost: Sequence[float], holdings: Holdings,
               pipeline: str) -> Source | None:
        """Where ``pipeline``'s charge of ``cost`` on one block is drawn from: its own reservation first, then the
        pool; None if neither has room. The caller checks ``filt.admits(spent, cost)`` as well (privacy)."""
        own = holdings.get(pipeline)
        if own is not None and filt.fits_share(own["used"], cost, own["reserved"]):
            return Source.OWN
        pool_used, pool_reserved = self.pool(filt, spent, holdings)
        if filt.fits_share(pool_used, cost, pool_reserved):
            return Source.POOL
        return None

    @staticmethod
    def retires(filt: Filter, spent: Sequence[float], min_cost: Sequence[float]) -> bool:
        """A block whose filter cannot admit ``min_cost`` more is retired for good."""
        return not filt.admits(spent, min_cost)

    def redistribute(self, holdings: Holdings, pipeline: str, others: Sequence[str], zero: Sequence[float]) -> dict:
        """``pipeline`` finished: {holder: (new reserved, used)} for every holding of this block that changes.

        ``pipeline`` keeps what it used; the rest of its reservation is split evenly among ``others`` (the
        pipelines still waiting, name order); a waiting pipeline without a holding gets one with ``zero`` used.
        """
        mine = holdings[pipeline]
        changes = {pipeline: (tuple(mine["used"]), tuple(mine["used"]))}
        if others:
            leftover = [max(0.0, r - u) for r, u in zip(mine["reserved"], mine["used"])]
            share = [x / len(others) for x in leftover]
            for other in others:
                cur = holdings.get(other)
                if cur is None:
                    changes[other] = (tuple(share), tuple(zero))
                else:
                    changes[other] = (filters.add(cur["reserved"], share), tuple(cur["used"]))
        return changes

    @abc.abstractmethod
    def plan_epsilon(self, available: float, start_epsilon: float) -> float:
        """The epsilon a pipeline asks for next, given what it could be granted now."""


class Conserve(AllocationPolicy):
    """Sage's conserve policy (paper §3.3): start small (``start_epsilon``), never more than available."""

    name = Policy.CONSERVE

    def plan_epsilon(self, available: float, start_epsilon: float) -> float:
        return min(float(start_epsilon), available)


class Aggressive(AllocationPolicy):
    """Sage's aggressive policy (paper §3.3): ask for everything available at once."""

    name = Policy.AGGRESSIVE

    def plan_epsilon(self, available: float, start_epsilon: float) -> float:
        return available


_REGISTRY: dict[str, type[AllocationPolicy]] = {}


def register(cls: type[AllocationPolicy]) -> type[AllocationPolicy]:
    """Register a policy class under its ``name`` (usable as a class decorator); refuses a name taken twice."""
    if not (isinstance(cls, type) and issubclass(cls, AllocationPolicy)):
        raise TypeError(f"{cls!r} is not an AllocationPolicy subclass")
    name = str(cls.name)
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"allocation policy {name!r} is already registered ({_REGISTRY[name].__name__})")
    _REGISTRY[name] = cls
    return cls


register(Conserve)
register(Aggressive)


# ------------------------------------------------------------------------------------- queued policies
def _int_param(policy, name, value, floor):
    if isinstance(value, bool) or not isinstance(value, int) or value < floor:
        raise LedgerError(f"policy {policy!r} parameter {name}={value!r} is invalid: give an integer >= {floor}")
    return value


def _positive_param(policy, name, value, unit):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LedgerError(f"policy {policy!r} parameter {name}={value!r} is invalid: give a finite number > 0 "
                          f"({unit})")
    return float(value)


class QueuedPolicy(AllocationPolicy):
    """A policy that queues demands and grants them all-or-nothing in its own order (docs/scheduling_policies.md).

    State (``QueuedAllocation`` in memory): per block its ``spent`` vector, its arrival time and the number of
    pipeline arrivals since; per pipeline at most one pending *demand* (blocks, cost: the same cost on every
    block named, as ``Ledger.request`` charges). At every scheduling point (a block or pipeline arrives, a
    demand is made or withdrawn, time passes) the pending demands are considered in the order of
    ``demand_key`` (ties: oldest demand first); each is granted only if, on EVERY block it names, the
    filter admits it (``filt.admits``: privacy, the global budget) and it fits the block's unlocked budget
    minus what was spent (``filt.fits_share(spent, cost, unlocked)``: for RDP the curve need only fit at one
    order, PrivateKube's rule). Nothing is charged on any block otherwise (all-or-nothing). Unlocking only
    gates *when* budget may be granted; the filter alone bounds what is spent, so no policy overspends.

    No reservations: ``new_block_shares`` gives none and ``redistribute`` moves nothing; ``plan_epsilon``
    is Conserve's (a pipeline asks small and doubles on RETRY, paper §3.3).
    """

    queued = True

    def new_block_shares(self, capacity: Sequence[float], waiting: Sequence[str]) -> None:
        return None

    def redistribute(self, holdings: Holdings, pipeline: str, others: Sequence[str], zero: Sequence[float]) -> dict:
        return {}

    def plan_epsilon(self, available: float, start_epsilon: float) -> float:
        return min(float(start_epsilon), available)

    @abc.abstractmethod
    def unlocked_fraction(self, *, arrivals: int, age: float) -> float:
        """The share of a block's capacity unlocked ``age`` seconds after it arrived, ``arrivals`` pipelines later."""

    def demand_key(self, filt: Filter, cost: Sequence[float], spents: Sequence[Sequence[float]],
                   orders_index: Sequence[int | None] | None = None) -> float:
        """Sort key of a demand of ``cost`` on blocks whose spent vectors are ``spents`` (smaller: served first)."""
        return dominant_share(filt, cost, len(spents))


def block_share(filt: Filter, cost: Sequence[float], capacity: Sequence[float]) -> float:
    """A demand's share of one block: basic, the largest of cost/capacity over (epsilon, delta); RDP, the
    smallest over the orders of cost/capacity (the best alpha, PrivateKube §4.3: an RDP demand only needs to
    fit at one order). ``capacity``: the block's capacity vector (or what remains of it); inf where it is 0."""
    if filt.accounting == Accounting.RDP:
        ratios = [c / cap if cap > 0 else math.inf for c, cap in zip(cost[1:], capacity[1:])]
        return min(ratios) if ratios else math.inf
    ratios = [(c / cap if cap > 0 else math.inf) if c > 0 else 0.0 for c, cap in zip(cost, capacity)]
    return max(ratios)


def dominant_share(filt: Filter, cost: Sequence[float], n_blocks: int) -> float:
    """DPF's dominant share of a demand: the max over its blocks of its share of the block's capacity (all
    blocks have the stream's capacity, so it is one block's share; 0 for a demand naming no block)."""
    return block_share(filt, cost, filt.capacity) if n_blocks else 0.0


class ArrivalUnlocking(QueuedPolicy):
    """A queued policy whose blocks unlock per pipeline arrival: a block's capacity unlocks in ``n`` equal
    shares, one per pipeline that arrives while the block is live, until fully unlocked (DPF-N and DPack)."""

    DEFAULT_N = 100

    def __init__(self, *, n: int = DEFAULT_N) -> None:
        self.n = _int_param(str(self.name), "n", n, 1)

    def params(self) -> dict:
        return {"n": self.n}

    def unlocked_fraction(self, *, arrivals: int, age: float) -> float:
        return min(1.0, arrivals / self.n)


class DpfN(ArrivalUnlocking):
    """DPF-N: Dominant Private-block Fairness with budget unlocked per pipeline arrival (PrivateKube, Luo et
    al., OSDI'21 "Privacy Budget Scheduling" §4; docs/scheduling_policies.md).

    Unlocking: ``ArrivalUnlocking`` (``n`` shares, one per arrival). Order: increasing dominant share
    (``dominant_share``; RDP: best alpha per block). Guarantees: all-or-nothing; no overspend (the filter
    checks every grant); fairness share: a demand within one share (1/n) of every block it names is served
    once its blocks have unlocked that share and no smaller demand waits (the order behind DPF's sharing
    incentive, PrivateKube §4.2).
    """

    name = Policy.DPF_N


class DpfT(QueuedPolicy):
    """DPF-T: DPF with each block's capacity unlocked linearly over ``lifetime`` seconds after it arrives
    (PrivateKube, OSDI'21 §4.4; docs/scheduling_policies.md). Order and guarantees as ``DpfN``."""

    name = Policy.DPF_T
    DEFAULT_LIFETIME = 24 * 3600.0

    def __init__(self, *, lifetime: float = DEFAULT_LIFETIME) -> None:
        self.lifetime = _positive_param(str(self.name), "lifetime", lifetime, "seconds")

    def params(self) -> dict:
        return {"lifetime": self.lifetime}

    def unlocked_fraction(self, *, arrivals: int, age: float) -> float:
        return min(1.0, max(0.0, age) / self.lifetime)


class DPack(ArrivalUnlocking):
    """An efficiency-oriented policy in the spirit of DPack (Tholoniat et al., EuroSys'25 "DPack:
    Efficiency-Oriented Privacy Budget Scheduling" §4; docs/scheduling_policies.md).

    Unlocking as ``DpfN`` (``n`` shares, one per pipeline arrival), so DPack and DPF-N differ only in the
    order. Order: decreasing efficiency weight / sum over the demanded blocks of demand / remaining capacity
    (all weights 1 here); under RDP the ratio on block j is taken at the order alpha_j that DPack's per-block
    heuristic picks: the order at which the most pending demands on j fit, packed smallest first (ties: the
    lower order). Guarantees: all-or-nothing and no overspend as every queued policy; NO fairness share (it
    trades fairness for the number of pipelines granted, DPack §6).
    """

    name = Policy.DPACK

    def demand_key(self, filt: Filter, cost: Sequence[float], spents: Sequence[Sequence[float]],
                   orders_index: Sequence[int | None] | None = None) -> float:
        total = 0.0
        for i, spent in enumerate(spents):
            remaining = [max(0.0, c - s) for c, s in zip(filt.capacity, spent)]
            if filt.accounting == Accounting.RDP and orders_index is not None and orders_index[i] is not None:
                k = cast(int, orders_index[i])
                total += cost[k] / remaining[k] if remaining[k] > 0 else math.inf
            else:
                total += block_share(filt, cost, remaining)
        return total  # weight 1: ascending total = descending efficiency


register(DpfN)
register(DpfT)
register(DPack)


def policy_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get_policy(name: str, params: Mapping[str, Any] | None = None) -> AllocationPolicy:
    """The policy registered as ``name`` with ``params`` (a queued policy's n / lifetime; None: defaults);
    LedgerError (a ValueError) naming the known ones, or the bad parameter, otherwise."""
    cls = _REGISTRY.get(str(name))
    if cls is None:
        raise LedgerError(f"policy {name!r} is unknown: use one of {', '.join(_REGISTRY)}")
    params = dict(params or {})
    if not params:
        return cls()
    if not cls.queued:
        raise LedgerError(f"policy {str(name)!r} takes no parameters, got {params!r}")
    try:
        return cls(**params)
    except TypeError:
        known = ", ".join(cls().params())
        raise LedgerError(f"policy {str(name)!r} parameters {params!r} are invalid: it takes {known}") from None


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

    def __init__(self, filt: Filter, min_cost: Sequence[float],
                 policy: AllocationPolicy | str = Policy.CONSERVE) -> None:
        self.filt = filt
        self.min_cost = tuple(min_cost)
        self.policy = policy if isinstance(policy, AllocationPolicy) else get_policy(policy)
        self.spent: dict = {}          # block -> spent vector
        self.holdings: dict = {}       # block -> {pipeline: {"reserved", "used"}}, pipeline name order
        self.active: list = []         # active block ids, oldest first
        self.retired: set = set()
        self._pools: dict = {}         # block -> (pool_used, pool_reserved), dropped whenever the block changes

    def add_block(self, block: str, waiting: Sequence[str]) -> None:
        zero = self.filt.zero()
        self.spent[block] = zero
        self.active.append(block)
        share = self.policy.new_block_shares(self.filt.capacity, waiting)
        self.holdings[block] = {} if share is None else {
            p: {"reserved": share, "used": zero} for p in sorted(waiting)}

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
            raise ValueError(f"available_epsilon has a closed form under basic accounting only, not "
                             f"{self.filt.accounting!r}")
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
        self.spent: dict = {}          # block -> spent vector
        self.arrived: dict = {}        # block -> arrival time (s)
        self.arrivals: dict = {}       # block -> pipeline arrivals since the block arrived (capped once unlocked)
        self.active: list = []         # active block ids, oldest first
        self.retired: set = set()
        self.pending: dict = {}        # pipeline -> [blocks tuple, cost, seq, blocked_on, fraction_then]
        self._seq = 0
        self.full_scan = False   # tests: check every pending demand at every scheduling point

    # -- blocks and arrivals
    def add_block(self, block: str, now: float) -> None:
        if block in self.spent:
            raise LedgerError(f"block {block!r} exists already")
        self.spent[block] = self.filt.zero()
        self.arrived[block] = float(now)
        self.arrivals[block] = 0
        self.active.append(block)

    def load_block(self, block: str, *, spent: Sequence[float], arrived: float, arrivals: int,
                   retired: bool = False) -> None:
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
