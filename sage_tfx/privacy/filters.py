"""Per-block privacy filters: the rule that decides whether a query may still touch a block.

Sage's block composition (the Sage paper §4, Thm. 4.2/4.3): the privacy loss of the whole adaptive
interaction with a stream is at most the largest loss accumulated by any single block, so each block keeps
its own budget filter and a query runs only if every block it reads admits it. Contract: ``BasicFilter``
((epsilon, delta) sums) and ``RdpFilter`` (Rényi curves, its delta split once per stream) each admit only
queries whose composition stays (eps_g, delta_g)-DP per block under fully adaptive choice; reservations
(``fits_share``) are a fairness device, privacy rests on ``admits`` alone. Rules and proof sketch:
docs/block_composition.md, "The filters: their rules and the rdp filter's proof sketch".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from . import curves
from .checks import positive, probability
from .errors import LedgerError
from .vocabulary import Accounting

if TYPE_CHECKING:
    from .curves import CurveLike

NOT_A_NUMBER = "{what} {value!r} is not a number"
DEFAULT_QUERY_DELTA_SHARE = 0.5  # RdpFilter: the share of delta_g its approximate-DP queries' deltas may sum to


def add(a: Sequence[float], b: Sequence[float]) -> tuple[float, ...]:
    return tuple(x + y for x, y in zip(a, b))


def check_epsilon(epsilon: object, what: str = "epsilon") -> float:
    """``epsilon`` as a finite float > 0, else a LedgerError naming ``what`` and the value."""
    return positive(epsilon, what, not_number=NOT_A_NUMBER)


def check_delta(delta: object, what: str = "delta", allow_zero: bool = True) -> float:
    """``delta`` as a float in [0, 1) ((0, 1) unless ``allow_zero``), else a LedgerError naming it."""
    bound = "0 <= delta < 1" if allow_zero else "0 < delta < 1"
    return probability(
        delta, what, zero=allow_zero, not_number=NOT_A_NUMBER, message="{what} {value!r} is invalid: need " + bound
    )


class BasicFilter:
    """Adaptive basic composition per block: spent (eps, delta) + query <= (eps_g, delta_g)."""

    accounting = Accounting.BASIC

    def __init__(self, epsilon: float, delta: float) -> None:
        self.epsilon = check_epsilon(epsilon, "global epsilon")
        self.delta = check_delta(delta, "global delta")
        self.capacity = (self.epsilon, self.delta)

    def zero(self) -> tuple[float, ...]:
        return (0.0, 0.0)

    def cost(
        self, epsilon: float | None = None, delta: float = 0.0, curve: Sequence[float] | None = None
    ) -> tuple[float, ...]:
        """The vector a query charges. A curve is converted to epsilon at the query's delta."""
        delta = check_delta(delta)
        if curve is not None:
            if delta <= 0:
                raise LedgerError("an RDP curve on a 'basic' stream needs delta > 0 to convert to (epsilon, delta)")
            epsilon, _ = curves.rdp_to_dp(curves.DEFAULT_ORDERS, curve, delta)
        return (check_epsilon(epsilon), delta)

    def admits(self, spent: Sequence[float], cost: Sequence[float]) -> bool:
        return all(s + c <= cap for s, c, cap in zip(spent, cost, self.capacity))

    @staticmethod
    def fits_share(used: Sequence[float], cost: Sequence[float], reserved: Sequence[float]) -> bool:
        return all(u + c <= r for u, c, r in zip(used, cost, reserved))

    def shortfall(self, spent: Sequence[float], cost: Sequence[float]) -> str:
        """Human-readable reason why ``admits`` is False."""
        eps_left = self.epsilon - spent[0]
        delta_left = self.delta - spent[1]
        parts = []
        if spent[0] + cost[0] > self.epsilon:
            parts.append(f"epsilon: {cost[0]:.6g} asked, {max(eps_left, 0):.6g} left")
        if spent[1] + cost[1] > self.delta:
            parts.append(f"delta: {cost[1]:.6g} asked, {max(delta_left, 0):.6g} left")
        return "; ".join(parts)

    def summary(self, spent: Sequence[float]) -> tuple[float, float, float]:
        """(epsilon_spent, delta_spent, epsilon_remaining) for reports."""
        return spent[0], spent[1], max(0.0, self.epsilon - spent[0])

    def query_epsilon(self, cost: Sequence[float]) -> float:
        return cost[0]

    @staticmethod
    def spendable(cost: Sequence[float]) -> tuple[float, float]:
        """(epsilon, delta) the stages of a grant charged ``cost`` may spend: what was asked."""
        return cost[0], cost[1]


class RdpFilter:
    """Per-block Rényi filter over a vector of orders (proof: docs/block_composition.md, "The filters")."""

    accounting = Accounting.RDP

    def __init__(
        self,
        epsilon: float,
        delta: float,
        orders: Sequence[float] = curves.DEFAULT_ORDERS,
        query_delta_share: float | None = DEFAULT_QUERY_DELTA_SHARE,
        split_orders: bool = True,
    ) -> None:
        """``query_delta_share``: q in [0, 1), the fixed split of delta (docs/block_composition.md); None: the legacy rule of
        streams made before schema 7. ``split_orders``: the conversion's delta is split evenly over the orders (the
        union bound of docs/block_composition.md); False: every order converts at all of it, the rule of streams made
        before schema 8 (and of the legacy rule, whatever is given)."""
        self.epsilon = check_epsilon(epsilon, "global epsilon")
        self.delta = check_delta(delta, "global delta", allow_zero=False)
        self.orders = curves.check_orders(orders)
        self.query_delta_share = check_query_delta_share(query_delta_share)
        legacy = self.query_delta_share is None  # legacy: the conversion at the delta left (docs/block_composition.md)
        self.split_orders = bool(split_orders) and not legacy
        self.delta_queries = self.delta if legacy else self.delta * cast(float, self.query_delta_share)
        conversion = self.delta if legacy else self.delta - self.delta_queries
        self.delta_per_order = conversion / len(self.orders) if self.split_orders else conversion
        terms = tuple(curves.conversion_term(a, self.delta_per_order) for a in self.orders)
        self.terms = None if legacy else terms  # fixed by the split; the legacy rule recomputes them per check
        # Reservation capacity: the queries' delta and the per-order RDP headroom of a fresh block.
        self.capacity = (self.delta_queries,) + tuple(max(0.0, self.epsilon - term) for term in terms)
        if not any(self.capacity[1:]):
            raise LedgerError(
                f"global (epsilon={self.epsilon}, delta={self.delta}) leaves no RDP budget at any order "
                f"{list(self.orders)}: raise epsilon or delta"
            )

    def zero(self) -> tuple[float, ...]:
        return (0.0,) * (1 + len(self.orders))

    def cost(
        self, epsilon: float | None = None, delta: float = 0.0, curve: CurveLike | None = None
    ) -> tuple[float, ...]:
        delta = check_delta(delta)
        if curve is None:
            curve = curves.pure_dp_curve(check_epsilon(epsilon), self.orders)
        else:
            curve = curves.as_curve(curve, self.orders)
        return (delta,) + tuple(curve)

    def _best_slack(self, spent, cost):
        if self.terms is None:  # legacy
            delta_left = self.delta - (spent[0] + cost[0])  # the stored sum, so the audit's replay agrees
            if delta_left <= 0:
                return -math.inf, None
            terms = [curves.conversion_term(alpha, delta_left) for alpha in self.orders]
        else:
            if spent[0] + cost[0] > self.delta_queries:
                return -math.inf, None
            terms = self.terms
        best, best_order = -math.inf, None
        for i, (alpha, term) in enumerate(zip(self.orders, terms), start=1):
            slack = self.epsilon - (spent[i] + cost[i] + term)
            if slack > best:
                best, best_order = slack, alpha
        return best, best_order

    def admits(self, spent: Sequence[float], cost: Sequence[float]) -> bool:
        return self._best_slack(spent, cost)[0] >= 0

    @staticmethod
    def fits_share(used: Sequence[float], cost: Sequence[float], reserved: Sequence[float]) -> bool:
        if used[0] + cost[0] > reserved[0]:
            return False
        return any(u + c <= r for u, c, r in zip(used[1:], cost[1:], reserved[1:]))

    def shortfall(self, spent: Sequence[float], cost: Sequence[float]) -> str:
        if self.terms is None and spent[0] + cost[0] >= self.delta:
            return f"delta: {cost[0]:.6g} asked, {max(self.delta - spent[0], 0):.6g} left"
        if self.terms is not None and spent[0] + cost[0] > self.delta_queries:
            if self.query_delta_share == 0:
                return (
                    f"delta: {cost[0]:.6g} asked on a curves-only stream (query_delta_share 0): charge an RDP "
                    "curve, or use a stream with a query delta share"
                )
            return (
                f"delta: {cost[0]:.6g} asked, {max(self.delta_queries - spent[0], 0):.6g} left (the queries' "
                f"deltas may sum to {self.query_delta_share:g} of the stream's delta {self.delta:.6g}; the rest "
                "converts the Renyi sum)"
            )
        slack, alpha = self._best_slack(spent, cost)
        return f"RDP: at the best order {alpha:g} the query overshoots epsilon by {-slack:.6g}"

    def used_fraction(self, spent: Sequence[float]) -> float:
        """Share of the block's budget used, at the order where most remains (0 fresh, >= 1 exhausted)."""
        shares = [s / cap for s, cap in zip(spent[1:], self.capacity[1:]) if cap > 0]
        return min(shares) if shares else 1.0

    def summary(self, spent: Sequence[float]) -> tuple[float, float, float]:
        """(epsilon_spent, delta_spent, epsilon_remaining), epsilon normalized at the best order."""
        used = min(1.0, self.used_fraction(spent))
        return used * self.epsilon, spent[0], (1.0 - used) * self.epsilon

    def query_epsilon(self, cost: Sequence[float]) -> float:
        """The query's own epsilon at the stream's delta: the charged curve converted (for information only; the
        stages of its grant may spend ``spendable(cost)``, never this)."""
        return curves.rdp_to_dp(self.orders, cost[1:], self.delta)[0]

    def spendable(self, cost: Sequence[float]) -> tuple[float, float]:
        """(epsilon, delta) the stages of a grant charged ``cost`` may spend: what was asked.

        The filter charged the pure-DP curve of the epsilon asked (or the curve given) and the delta asked, and its
        proof covers a query that spends exactly that (docs/block_composition.md). So the stages get the largest epsilon
        whose pure-DP curve lies within the charged curve (``curves.pure_epsilon``: the epsilon asked, for an
        (epsilon, delta) charge) and the charge's own delta; never ``query_epsilon``, the curve converted at the
        stream's delta, which is larger (0.1875 for a charge of 0.05 at delta 1e-6) and which the filter did not
        charge.
        """
        return curves.pure_epsilon(cost[1:], self.orders), cost[0]


Filter = BasicFilter | RdpFilter  # a stream's filter: what make_filter returns


def check_query_delta_share(value: object) -> float | None:
    """An RDP stream's ``query_delta_share`` as a float in [0, 1), or None (legacy); LedgerError naming it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value < 1:
        raise LedgerError(
            f"query_delta_share {value!r} is invalid: give 0 <= share < 1, the part of the stream's "
            "delta its approximate-DP queries may spend (0: curves only; the rest converts the Renyi "
            f"sum; default {DEFAULT_QUERY_DELTA_SHARE:g})"
        )
    return float(value)


_DEFAULT: Any = object()  # make_filter without a query_delta_share: an RDP stream gets DEFAULT_QUERY_DELTA_SHARE


def make_filter(
    accounting: str,
    epsilon: float,
    delta: float,
    orders: Sequence[float] | None = None,
    query_delta_share: float | None = _DEFAULT,
    split_orders: bool = True,
) -> Filter:
    """The stream's filter. ``query_delta_share`` is an RDP stream's (default ``DEFAULT_QUERY_DELTA_SHARE``; None:
    the legacy rule of a stream stored before schema 7); a basic stream has none (its deltas simply add up).
    ``split_orders``: an RDP stream's conversion delta split over its orders (False: a stream stored before
    schema 8, whose orders each convert at all of it)."""
    if accounting == Accounting.BASIC:
        if query_delta_share is not _DEFAULT and query_delta_share is not None:
            raise LedgerError(
                f"query_delta_share {query_delta_share!r} is for an 'rdp' stream: a 'basic' stream's "
                "deltas simply add up (leave it out)"
            )
        return BasicFilter(epsilon, delta)
    if accounting == Accounting.RDP:
        share = DEFAULT_QUERY_DELTA_SHARE if query_delta_share is _DEFAULT else query_delta_share
        return RdpFilter(epsilon, delta, orders or curves.DEFAULT_ORDERS, share, split_orders)
    raise LedgerError(f"accounting {accounting!r} is unknown: use 'basic' or 'rdp'")
