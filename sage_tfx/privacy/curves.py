"""Rényi-DP accounting curves and their exact conversion to (epsilon, delta).

A *curve* is a query's Rényi-DP guarantee eps(alpha) over a fixed tuple of orders (``DEFAULT_ORDERS``).
Contract: mechanisms' curves are exactly dp-accounting's (imported lazily), and a curve converts to
(epsilon, delta) by dp-accounting's conversion (Balle et al. 2020, Prop. 12); ``conversion_term`` is its
curve-free part, so a filter can test admission without dp-accounting. Details: docs/block_composition.md,
"Rényi curves and their conversion".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

from .checks import number
from .errors import LedgerError

if TYPE_CHECKING:
    import dp_accounting
    from dp_accounting import rdp

    # A user-supplied RDP curve: values aligned with the orders, {order: value}, or a dp_accounting DpEvent.
    CurveLike: TypeAlias = Sequence[float] | Mapping[float, float] | dp_accounting.DpEvent

# the Sage paper §4. Low orders serve small-noise (large eps) queries, high
# orders the many-small-steps DP-SGD regime.
DEFAULT_ORDERS = (1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 16.0, 32.0, 64.0)


def check_orders(orders: Iterable[float]) -> tuple[float, ...]:
    """``orders`` as a tuple of distinct finite floats > 1.01, else a LedgerError naming the bad order."""
    orders = tuple(_order(a) for a in orders)
    if not orders:
        raise LedgerError("RDP orders: need at least one order")
    if len(set(orders)) != len(orders):
        raise LedgerError(f"RDP orders {orders!r} contain duplicates")
    return orders


def _order(value):
    return number(
        value, "RDP order", low=1.01, low_open=True, message="{what} {value!r} is invalid: orders must be {rule}"
    )


def conversion_term(alpha: float, delta: float) -> float:
    """The curve-independent part of the RDP -> (eps, delta) conversion at order alpha.

    Valid for any mechanism that is (alpha, r)-RDP: it is (r + term, delta)-DP
    (Balle et al. 2020, Prop. 12). +inf where delta <= 0 (no pure-DP conversion).
    """
    if delta <= 0:
        return math.inf
    return math.log1p(-1.0 / alpha) - math.log(delta * alpha) / (alpha - 1.0)


def rdp_to_dp(orders: Sequence[float], curve: Sequence[float], delta: float) -> tuple[float, float | None]:
    """(epsilon, best order) of a mechanism with RDP ``curve`` over ``orders`` at ``delta``.

    Same result as ``dp_accounting.rdp.compute_epsilon`` except that we skip its
    KL shortcut (which can only report a smaller epsilon): ours is never smaller,
    so it is always a valid (conservative) bound, and equal in all practical cases.
    """
    best, best_order = math.inf, None
    for alpha, r in zip(orders, curve):
        # dp_accounting's own evaluation order: ``r + conversion_term`` rounds differently
        # (1 ulp either way in ~20% of cases), and the conversion is meant to be bit-identical.
        eps = math.inf if delta <= 0 else r + math.log1p(-1.0 / alpha) - math.log(delta * alpha) / (alpha - 1.0)
        if eps < best:
            best, best_order = eps, alpha
    return max(0.0, best), best_order


def pure_dp_curve(epsilon: float, orders: Sequence[float] = DEFAULT_ORDERS) -> tuple[float, ...]:
    """RDP curve implied by ANY epsilon-DP mechanism (no knowledge of the mechanism).

    eps-DP implies (alpha, min(eps, alpha*eps^2/2))-RDP for every alpha: the
    first term because the Rényi divergence of order alpha is at most the
    max-divergence eps; the second because eps-DP implies (eps^2/2)-zCDP
    (Bun & Steinke 2016, Prop. 3.3), i.e. rho*alpha-RDP with rho = eps^2/2.
    A ledger uses this for a plain (epsilon, delta) request on an `rdp` stream.
    """
    eps = float(epsilon)
    return tuple(min(eps, a * eps * eps / 2.0) for a in orders)


def pure_epsilon(curve: Sequence[float], orders: Sequence[float] = DEFAULT_ORDERS) -> float:
    """The largest epsilon whose ``pure_dp_curve`` lies on or below ``curve`` at every order: an epsilon-DP
    mechanism of at most this epsilon spends no more than ``curve`` at any order.

    At order alpha, min(e, alpha e^2 / 2) <= c holds iff e <= c or e <= sqrt(2 c / alpha), so the answer is the
    least over the orders of max(c, sqrt(2 c / alpha)). For the curve of an epsilon-DP charge
    (``pure_dp_curve(epsilon)``) it is that epsilon (to within a rounding of the square root).
    """
    return min(max(float(c), math.sqrt(2.0 * float(c) / a)) for a, c in zip(orders, curve))


# Orders beyond dp_accounting's default 1,024, for searching a noise multiplier: at a small epsilon the best order
# of a Gaussian-type composition, about 1 + sqrt(log(1/delta) / rho), passes 1,024 (rho ~ epsilon^2 / (4 log(1/delta))
# puts it near 4,400 at epsilon 0.0078, delta 3.8e-8), and an accountant stopped at 1,024 then asks for far more
# noise than needed (a multiplier of 3.4e7 for three releases where about 1,700 meets the target).
WIDE_ORDERS_TAIL = (
    1536.0,
    2048.0,
    3072.0,
    4096.0,
    6144.0,
    8192.0,
    12288.0,
    16384.0,
    32768.0,
    65536.0,
    131072.0,
    262144.0,
    1048576.0,
)


def calibration_accountant() -> rdp.RdpAccountant:
    """A fresh dp_accounting ``RdpAccountant`` over its default orders and ``WIDE_ORDERS_TAIL``, for
    ``mechanism_calibration.calibrate_dp_mechanism`` and the epsilon of a calibrated release. More orders only
    lower (tighten) the epsilon it reports: each order's conversion is valid alone (Balle et al. 2020)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    return rdp.RdpAccountant(orders=list(rdp.DEFAULT_RDP_ORDERS) + list(WIDE_ORDERS_TAIL))


def event_curve(event: dp_accounting.DpEvent, orders: Sequence[float] = DEFAULT_ORDERS) -> tuple[float, ...]:
    """RDP curve of a dp_accounting ``DpEvent`` (Laplace, Gaussian, Poisson-sampled, composed...)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    accountant = rdp.RdpAccountant(orders=list(orders))
    accountant.compose(event)
    return tuple(float(v) for v in accountant._rdp)  # the accumulated per-order RDP vector


def laplace_curve(epsilon: float, orders: Sequence[float] = DEFAULT_ORDERS) -> tuple[float, ...]:
    """RDP curve of a Laplace mechanism of sensitivity 1 and scale 1/epsilon (an epsilon-DP query)."""
    import dp_accounting

    return event_curve(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / float(epsilon)), orders)


def gaussian_curve(noise_multiplier: float, orders: Sequence[float] = DEFAULT_ORDERS) -> tuple[float, ...]:
    """RDP curve of a Gaussian mechanism, std = noise_multiplier * L2 sensitivity: alpha/(2 sigma^2)."""
    import dp_accounting

    return event_curve(dp_accounting.GaussianDpEvent(noise_multiplier=float(noise_multiplier)), orders)


def dpsgd_curve(
    noise_multiplier: float, sampling_rate: float, steps: int, orders: Sequence[float] = DEFAULT_ORDERS
) -> tuple[float, ...]:
    """RDP curve of DP-SGD: ``steps`` compositions of a Poisson-sampled Gaussian (Abadi et al. 2016)."""
    import dp_accounting

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sampling_probability=float(sampling_rate),
            event=dp_accounting.GaussianDpEvent(noise_multiplier=float(noise_multiplier)),
        ),
        int(steps),
    )
    return event_curve(event, orders)


def as_curve(value: CurveLike, orders: Sequence[float]) -> tuple[float, ...]:
    """Normalize a user-supplied curve (sequence aligned with orders, {order: eps} mapping, or DpEvent)."""
    if hasattr(value, "to_named_tuple") or type(value).__module__.startswith("dp_accounting"):
        return event_curve(value, orders)
    if isinstance(value, dict):
        by_order = {_order(k): v for k, v in value.items()}
        missing = [a for a in orders if a not in by_order]
        if missing:
            raise LedgerError(f"RDP curve lacks the stream's orders {missing}")
        values = [by_order[a] for a in orders]
    else:
        values = list(value)
        if len(values) != len(orders):
            raise LedgerError(
                f"RDP curve has {len(values)} values but the stream has {len(orders)} orders {list(orders)}"
            )
    return tuple(
        number(
            v, "RDP curve value", low=0.0, message=f"{{what}} {{value!r}} at order {alpha} is invalid: must be {{rule}}"
        )
        for alpha, v in zip(orders, values)
    )
