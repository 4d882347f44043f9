"""The allocation rules as array operations, for the ledger's availability queries (``Ledger.request``'s question
on many blocks, or many epsilons, at once).

``BudgetArrays`` writes the filters' rules and a policy's reservation rule (``allocation.py``) operation for
operation on numpy arrays, so its answers are bit-identical to the scalar code's; ``bisect`` runs many epsilon
bisections at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from . import curves
from .allocation import AllocationPolicy, Conserve
from .errors import LedgerError
from .vocabulary import Accounting

if TYPE_CHECKING:
    import numpy as np

    from .allocation import Holdings
    from .filters import Filter
from .filters import RdpFilter


def _numpy():
    import numpy  # noqa: PLC0415 (lazily: the ledger CLI's other commands start without it)

    return numpy


def bisect(fits: Callable[[np.ndarray], np.ndarray], size: int, top: float, tolerance: float) -> np.ndarray:
    """``size`` bisections over epsilon in [0, top] at once, each exactly this scalar loop::

        if fits(top): return top
        lo, hi = 0, top
        while hi - lo > tolerance * top:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    ``fits`` maps an array of ``size`` epsilons to ``size`` booleans (entry i for bisection i).
    Float64 arrays do the same IEEE operations as Python floats, so each result is bit-identical
    to the scalar loop's.
    """
    np = _numpy()
    lo, hi = np.zeros(size), np.full(size, float(top))
    at_top = np.asarray(fits(hi), dtype=bool)
    going = ~at_top
    width = tolerance * top
    while True:
        going &= hi - lo > width
        if not going.any():
            return np.where(at_top, hi, lo)
        mid = (lo + hi) / 2
        ok = np.asarray(fits(mid), dtype=bool)
        lo = np.where(going & ok, mid, lo)
        hi = np.where(going & ~ok, mid, hi)


class BudgetArrays:
    """The budget state of some blocks for one pipeline, as arrays: may it spend epsilon on each, now?

    ``fits(eps)`` answers ``Ledger.request``'s question for an (eps, delta) query on every block
    at once: the filter admits spent + cost, and the cost fits the pipeline's own reservation
    (``fits_share``) or else the unreserved pool (``AllocationPolicy.pool``). ``eps`` is one epsilon
    for all blocks or one per block. The filters' rules are written here as array operations, operation
    for operation (``BasicFilter``/``RdpFilter``: ``cost`` of a plain epsilon, ``admits``,
    ``fits_share``), so the answers are bit-identical; tests/privacy/test_ledger_availability.py checks
    them against the scalar rules on random ledgers. Advisory only: ``request`` always re-checks
    with the filter itself, so a mismatch could refuse a grant, never overspend a block.
    """

    def __init__(
        self,
        filt: Filter,
        pipeline: str,
        spent: Mapping[str, Sequence[float]],
        blocks: Sequence[str],
        reservations: Mapping[str, Holdings],
        delta: float,
        policy: AllocationPolicy | None = None,
        unlocked: dict | None = None,
    ) -> None:
        """``spent``: {block: spent vector}; ``blocks``: the ids to evaluate, in order (repeats allowed);
        ``reservations``: {block: holdings}. ``unlocked`` ({block: unlocked vector}, a queued policy's
        ``QueuedAllocation.unlocked``) replaces reservations and pool: the cost must then fit unlocked minus
        spent (``QueuedAllocation.fits``), the same ``fits_share`` with spent as used and unlocked as reserved."""
        np = _numpy()
        policy = policy or Conserve()
        self.np, self.filt, self.delta = np, filt, float(delta)
        n, dim = len(blocks), len(filt.capacity)
        self.spent = np.array([spent[b] for b in blocks], dtype=float).reshape(n, dim)
        self.has_own = np.zeros(n, dtype=bool)
        self.own_used, self.own_reserved = np.zeros((n, dim)), np.zeros((n, dim))
        pools = []
        for i, b in enumerate(blocks):
            block_reservations = reservations.get(b, {})
            own = block_reservations.get(pipeline)
            if own is not None:
                self.has_own[i] = True
                self.own_used[i], self.own_reserved[i] = own["used"], own["reserved"]
            pools.append(policy.pool(filt, spent[b], block_reservations))
        self.pool_used = np.array([p[0] for p in pools], dtype=float).reshape(n, dim)
        self.pool_reserved = np.array([p[1] for p in pools], dtype=float).reshape(n, dim)
        if unlocked is not None:  # queued: no pool; "own" is the unlocked budget, spent all of what is drawn on it
            self.has_own[:] = True
            self.own_used = self.spent.copy()
            self.own_reserved = np.array([unlocked[b] for b in blocks], dtype=float).reshape(n, dim)
            self.pool_used, self.pool_reserved = np.ones((n, dim)), np.zeros((n, dim))
        self.capacity = np.array(filt.capacity, dtype=float)
        if isinstance(filt, RdpFilter):  # Accounting.RDP
            self.orders = np.array(filt.orders, dtype=float)
            if filt.terms is not None:
                # RdpFilter.admits: spent[0] + cost[0] <= delta_queries and some order has
                # eps_g - (spent[i] + cost[i] + terms[i]) >= 0, the terms fixed by the filter's delta split.
                self.delta_ok = self.spent[:, 0] + self.delta <= filt.delta_queries
                self.terms = np.array(filt.terms, dtype=float)
            else:
                # the legacy rule: delta_left = delta_g - spent[0] - cost[0] > 0 and some order has
                # eps_g - (spent[i] + cost[i] + conversion_term(alpha_i, delta_left)) >= 0. The
                # conversion terms do not depend on epsilon: computed once per distinct delta_left.
                delta_left = filt.delta - (self.spent[:, 0] + self.delta)
                self.delta_ok = delta_left > 0
                terms = {}
                for left in set(delta_left.tolist()):
                    terms[left] = [curves.conversion_term(a, left) if left > 0 else math.inf for a in filt.orders]
                self.terms = np.array([terms[x] for x in delta_left.tolist()], dtype=float).reshape(n, len(filt.orders))
        elif filt.accounting != Accounting.BASIC:
            raise LedgerError(f"accounting {filt.accounting!r} has no array form of its filter")

    def cost(self, eps: np.ndarray) -> np.ndarray:
        """Rows of filt.cost(epsilon=eps, delta=delta): one row, or one per block."""
        np = self.np
        eps = np.asarray(eps, dtype=float).reshape(-1, 1)
        if self.filt.accounting == Accounting.BASIC:
            return np.hstack([eps, np.full_like(eps, self.delta)])
        # curves.pure_dp_curve: min(eps, alpha * eps * eps / 2.0), in that evaluation order.
        return np.hstack([np.full_like(eps, self.delta), np.minimum(eps, self.orders * eps * eps / 2.0)])

    def best_slack(self, cost: np.ndarray) -> np.ndarray:
        """RdpFilter._best_slack's slack for each block: the most epsilon any order leaves (-inf: no delta left)."""
        slack = (self.filt.epsilon - (self.spent[:, 1:] + cost[:, 1:] + self.terms)).max(axis=1)
        return self.np.where(self.delta_ok, slack, -math.inf)

    def admits(self, cost: np.ndarray) -> np.ndarray:
        if self.filt.accounting == Accounting.BASIC:
            return (self.spent + cost <= self.capacity).all(axis=1)
        return self.best_slack(cost) >= 0

    def fits_share(self, used: np.ndarray, cost: np.ndarray, reserved: np.ndarray) -> np.ndarray:
        if self.filt.accounting == Accounting.BASIC:
            return (used + cost <= reserved).all(axis=1)
        return (used[:, 0] + cost[:, 0] <= reserved[:, 0]) & (used[:, 1:] + cost[:, 1:] <= reserved[:, 1:]).any(axis=1)

    def fits(self, eps: np.ndarray) -> np.ndarray:
        cost = self.cost(eps)
        own = self.has_own & self.fits_share(self.own_used, cost, self.own_reserved)
        return self.admits(cost) & (own | self.fits_share(self.pool_used, cost, self.pool_reserved))
