"""Budget allocation among a stream's pipelines: the rules, written once, and the policies that plug into them.

Sage's allocation (paper §3.3) on in-memory state: new-block shares, own reservation then the pool,
redistribution on finish, retirement. ``AllocationPolicy`` is the plug-in point (Conserve, Aggressive,
DPF-N, DPF-T, DPack); the ledger and the simulator both apply the rules through a policy. Contract: a
policy never grants more than the filter admits; privacy rests on the filter alone (``filt.admits``),
reservations are a fairness device. The rules: docs/scheduling_policies.md, "The allocation rules".
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
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
    queued: ClassVar[bool] = False  # True: demands wait in a queue the policy orders (QueuedPolicy)

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

    def source(
        self, filt: Filter, spent: Sequence[float], cost: Sequence[float], holdings: Holdings, pipeline: str
    ) -> Source | None:
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
        raise LedgerError(f"policy {policy!r} parameter {name}={value!r} is invalid: give a finite number > 0 ({unit})")
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

    def demand_key(
        self,
        filt: Filter,
        cost: Sequence[float],
        spents: Sequence[Sequence[float]],
        orders_index: Sequence[int | None] | None = None,
    ) -> float:
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

    def demand_key(
        self,
        filt: Filter,
        cost: Sequence[float],
        spents: Sequence[Sequence[float]],
        orders_index: Sequence[int | None] | None = None,
    ) -> float:
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
