"""The scale of an approximate schedule's runs: the largest the ledger's zCDP filter admits forever
(docs/release_strategies.md, "Growth schedules and PMWG: the proofs").
"""

from __future__ import annotations

import math

import numpy as np

from sage_tfx.privacy import gaussian
from sage_tfx.privacy.draws import zcdp_filter
from sage_tfx.privacy.errors import LedgerError

from .errors import GrowthError


def filter_scale(epsilon: float, delta: float, head: np.ndarray, tail_squares: float) -> float:
    """The largest c (times 1 - 1e-9) such that runs epsilon_i = c w_i, w = ``head`` followed by weights whose
    squares sum to at most ``tail_squares``, stay admitted by the ledger's "zcdp" draw rule on a lifetime grant of
    (epsilon, delta) over the infinite horizon: some order alpha of ``curves.DEFAULT_ORDERS`` has
    sum_i min(c w_i, alpha c^2 w_i^2 / 2) <= epsilon - conversion_term(alpha, delta / 2) (docs/release_strategies.md)."""
    head = np.asarray(head, dtype=float)
    best = 0.0
    try:
        filt = zcdp_filter(epsilon, delta)
    except LedgerError:  # no order has any budget once delta / 2 converts: refused below
        filt = None
    for alpha, term in [] if filt is None else zip(filt.orders, filt.terms):
        budget = epsilon - term
        if budget <= 0:
            continue

        def cost(c: float) -> float:
            return float(np.minimum(c * head, alpha * c * c * head * head / 2).sum()) + alpha * c * c * tail_squares / 2  # noqa: B023

        low, high = 0.0, 1.0
        while cost(high) <= budget:
            low, high = high, 2.0 * high
        for _ in range(200):
            mid = (low + high) / 2
            low, high = (mid, high) if cost(mid) <= budget else (low, mid)
        best = max(best, low)
    if best <= 0:
        raise GrowthError(
            f"(epsilon {epsilon!r}, delta {delta!r}) leaves no Renyi budget at any order once delta / 2 "
            "converts it: raise epsilon or delta"
        )
    return best * (1.0 - 1e-9)


def pmwg_round_scale(epsilon: float, delta: float, hard_budget: int, growth_exponent: float) -> float:
    """c of PMWG's rounds: a round opened at public size n costs c min(1, (n0 / n)^p) (pure epsilon-DP per round).

    delta = 0 (pure, basic composition): c = epsilon / (k + 1 / (exp(p / k) - 1)), so the worst-case rounds sum to
    epsilon. delta > 0 (the paper's Theorem 17, CDP composition): each round is c_r^2 / 2-zCDP, the worst-case
    sum of squares is c^2 (k + 1 / (exp(2 p / k) - 1)), and c is set so that half of it equals
    rho = ``gaussian.zcdp_rho(epsilon, delta)`` (dp-accounting's calibration; docs/release_strategies.md); or the
    pure c when that is larger (few rounds: k small), as epsilon-DP is (epsilon, delta)-DP.

    Args:
        epsilon: the total per-record epsilon.
        delta: the total per-record delta (0: pure).
        hard_budget: k, the hard queries at the first block's size n0.
        growth_exponent: p, the per-round epsilon's decay exponent.
    """
    k, p = hard_budget, growth_exponent
    pure = epsilon / (k + 1.0 / math.expm1(p / k))
    if delta == 0:
        return pure
    return max(pure, math.sqrt(2.0 * gaussian.zcdp_rho(epsilon, delta) / (k + 1.0 / math.expm1(2.0 * p / k))))
