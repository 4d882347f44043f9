"""How sums and variances are released, the budget split chosen by the expected error (numpy and stdlib only).

The mean's rule (`noise.mean_release`) carried to the other moments: each release is a few Laplace tables, one
record moving one cell of each by at most its sensitivity, and epsilon is split between them to minimise the
first-order expected squared error of the estimate under a public uniform prior (the data's statistics are what
is being estimated: reading them to choose the split would cost privacy). The analyzers (`dp_sum_per_key`,
`dp_variance`) and the benchmark's expected errors read their scales and sensitivities here.

Proofs and the arithmetic: docs/dp_preprocessing.md ("Sums and variances").
"""

import math
from typing import NamedTuple

# First-order error weights of the variance's three tables (count, sum of v - R/2, sum of (v - R/2)^2), in units
# of (R^2/4)^2 = R^4/16, under a public prior: the centred mean mu uniform over [-R/2, R/2] and, given mu, the
# variance uniform over [0, R^2/4 - mu^2] (every value it can take for data in [0, R]).
#   count:   E[(var - mu^2)^2] = 11/45 (R^4/16)      (d var~ / d n = -(var - mu^2) / n)
#   sum:     E[(2 mu)^2 (R/2)^2] = 4/3 (R^4/16)       (d var~ / d S = -2 mu / n, sensitivity R/2)
#   squares: (R^2/4)^2 = 1 (R^4/16)                  (d var~ / d Q = 1 / n, sensitivity R^2/4)
VARIANCE_ERROR_WEIGHTS = (11.0 / 45.0, 4.0 / 3.0, 1.0)


def split_by_expected_error(epsilon: float, weights) -> tuple[float, ...]:
    """The epsilons minimising sum_i weights[i] / eps_i^2 subject to sum_i eps_i = epsilon: eps_i ~ weights[i]^(1/3).

    Lagrange: weights[i] / eps_i^3 is the same for every i. The shares never add up above epsilon, not even by
    rounding (the last one is lowered by ulps until the float sum fits).

    Args:
      epsilon: The total to split (> 0).
      weights: The error weight of each table (> 0): the squared sensitivity times the squared first-order
        derivative of the estimate in that table, in expectation under the prior.

    Returns:
      One epsilon per weight, in order.
    """
    roots = [w ** (1.0 / 3.0) for w in weights]
    total = math.fsum(roots)
    shares = [epsilon * r / total for r in roots]
    while math.fsum(shares) > epsilon:
        shares[-1] = math.nextafter(shares[-1], 0.0)
    return tuple(shares)


def expected_error(weights, epsilons) -> float:
    """sum_i weights[i] / epsilons[i]^2: the first-order expected squared error, up to the common 2 / n^2 factor.

    Args:
      weights: The error weight of each table (see `split_by_expected_error`).
      epsilons: The epsilon each table is released at.

    Returns:
      The weighted sum.
    """
    return math.fsum(w / e**2 for w, e in zip(weights, epsilons))


class MomentRelease(NamedTuple):
    """A release of exact tables: the public shift c subtracted from each clipped value v in [0, R] before it is
    summed, and each table's Laplace scale b and L1 sensitivity Delta (one record moves one cell of each table).
    Each table is (Delta / b)-DP; the tables' epsilons add up to the release's epsilon."""

    shift: float
    scales: tuple[float, ...]
    sensitivities: tuple[float, ...]

    @property
    def epsilons(self) -> tuple[float, ...]:
        return tuple(d / b for d, b in zip(self.sensitivities, self.scales))


def variance_release(epsilon: float, value_range: float) -> MomentRelease:
    """The release of a variance at ``epsilon`` for values clipped to [0, value_range] = [0, R].

    Three tables centred at c = R/2: the count (sensitivity 1), the sum of v - c (R/2) and the sum of (v - c)^2
    (R^2/4), at the epsilons `split_by_expected_error` gives `VARIANCE_ERROR_WEIGHTS` (~0.229, 0.404, 0.367 of
    epsilon). Guarantee: (epsilon, 0)-DP by basic composition (one record moves one cell of each table by at most
    its sensitivity); `noise.guarded_variance` of the noisy tables is post-processing.

    Args:
      epsilon: The variance's epsilon (> 0).
      value_range: R (> 0).

    Returns:
      The `MomentRelease` (shift R/2, three scales, three sensitivities).
    """
    half = value_range / 2.0
    sensitivities = (1.0, half, half * half)
    epsilons = split_by_expected_error(epsilon, VARIANCE_ERROR_WEIGHTS)
    return MomentRelease(half, tuple(d / e for d, e in zip(sensitivities, epsilons)), sensitivities)


def sum_release(epsilon: float, value_range: float) -> MomentRelease:
    """The release of a per-key sum of v = clip(value, 0, R) at ``epsilon``: one table of the raw sum, Lap(R/eps).

    The centred alternative (a sum of v - R/2, sensitivity R/2, plus a count to add (R/2) n~ back) has error
    weights (R/2)^2 for both tables; its best split (eps/2 each) gives 2 (R/2)^2 (8 / eps^2) = 4 R^2 / eps^2 of
    noise variance, twice the raw sum's 2 R^2 / eps^2: the expected error chooses the raw sum at every epsilon
    and R. Guarantee: (epsilon, 0)-DP (one record moves one sum by at most R).

    Args:
      epsilon: The sum's epsilon (> 0).
      value_range: R (> 0).

    Returns:
      The `MomentRelease` (shift 0, one scale R / epsilon, sensitivity R).
    """
    return MomentRelease(0.0, (value_range / epsilon,), (value_range,))


def centred_sum_error(epsilon: float, value_range: float) -> float:
    """Noise variance of the centred sum estimate S~ + (R/2) n~ at its best split (the alternative `sum_release`
    rejects): 2 ((R/2)^2 / eps_s^2 + (R/2)^2 / eps_n^2) with eps_s = eps_n = eps / 2."""
    half = value_range / 2.0
    return 2.0 * expected_error((half * half, half * half), split_by_expected_error(epsilon, (1.0, 1.0)))
