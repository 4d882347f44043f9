"""Concentration bounds used by the SLAed validators, each valid for i.i.d. samples of a fixed model.

All accept real-valued (noisy, corrected) n and k and are monotone in them in the direction the validators
need; each docstring states which. A non-positive n gives the vacuous bound.
"""

from __future__ import annotations

import math

from scipy.special import betaincinv  # the Beta quantile; much lighter to import than scipy.stats  # noqa: TID253


def bernstein_upper(mean: float, n: float, delta: float, bound: float) -> float:
    """Upper bound on the expected loss mu from an empirical mean of n losses in [0, B]:

        mu <= mean + sqrt(2 B mean ln(1/delta) / n) + 4 B ln(1/delta) / n     w.p. >= 1 - delta

    Proof. Losses Z_i in [0, B] have variance sigma^2 <= E[Z^2] <= B E[Z] = B mu. One-sided Bernstein:
    P(mu - mean > e) <= exp(-n e^2 / (2 (sigma^2 + B e / 3))); solving for e at probability delta, with
    l = ln(1/delta), gives mu - mean <= sqrt(2 sigma^2 l / n) + 2 B l / (3 n) <= sqrt(2 a mu) + 2a/3,
    a = B l / n. So x = sqrt(mu) solves x^2 - sqrt(2a) x - c <= 0 with c = mean + 2a/3, hence
    mu <= c + a + sqrt(a^2 + 2ac) <= c + 2a + sqrt(2ac) <= mean + sqrt(2 a mean) + (8/3 + 2/sqrt(3)) a, and
    8/3 + 2/sqrt(3) = 3.82 <= 4. (The paper's List. 2 with B = 1; Shalev-Shwartz & Ben-David, App. B.)
    The bound increases with ``mean`` and decreases with ``n``, so a larger mean and a smaller n (the
    DP-corrected S_hi / n_lo and n_lo) keep it valid. A negative mean is raised to 0 (the bound at 0 is
    still above the bound at any smaller true mean, since the true mean is >= 0).

    Args:
      mean: The empirical mean of the losses.
      n: The number of losses (a lower bound on it keeps the bound valid).
      delta: The failure probability.
      bound: B, the losses' upper end.

    Returns:
      The upper confidence bound on mu (inf for n <= 0).
    """
    if n <= 0:
        return math.inf
    mean = max(mean, 0.0)
    log_term = math.log(1.0 / delta)
    return mean + math.sqrt(2.0 * bound * mean * log_term / n) + 4.0 * bound * log_term / n


def hoeffding_lower(mean: float, n: float, delta: float, bound: float) -> float:
    """Lower bound on mu from an empirical mean of n values in [0, B]:

        mu >= mean - B sqrt(ln(1/delta) / (2 n))     w.p. >= 1 - delta

    Proof: one-sided Hoeffding, P(mean - mu > t) <= exp(-2 n t^2 / B^2) = delta at t = B sqrt(ln(1/delta)/(2n)).
    Increasing in ``mean`` and in ``n``: a smaller mean and a smaller n keep it valid.

    Args:
      mean: The empirical mean.
      n: The number of values.
      delta: The failure probability.
      bound: B, the values' upper end.

    Returns:
      The lower confidence bound on mu (-inf for n <= 0).
    """
    if n <= 0:
        return -math.inf
    return mean - bound * math.sqrt(math.log(1.0 / delta) / (2.0 * n))


def hoeffding_width(n: float, delta: float, bound: float) -> float:
    """Two-sided: |mean - mu| <= B sqrt(ln(2/delta) / (2 n)) w.p. >= 1 - delta (Hoeffding, both tails).
    Decreasing in n: a smaller n keeps it valid.

    Args:
      n: The number of values.
      delta: The failure probability (both tails).
      bound: B, the values' upper end.

    Returns:
      The half-width of the interval (inf for n <= 0).
    """
    if n <= 0:
        return math.inf
    return bound * math.sqrt(math.log(2.0 / delta) / (2.0 * n))


def clopper_pearson_lower(k: float, n: float, delta: float) -> float:
    """One-sided Clopper-Pearson lower bound on p from k successes in n Bernoulli(p) trials:
    CPL = BetaQuantile(delta; k, n - k + 1), with P(p < CPL(K, n)) <= delta (exact binomial tail).

    Real-valued k and n are allowed. Beta(a, b) is stochastically increasing in a and decreasing in b
    (monotone likelihood ratio x^a (1-x)^b), so CPL increases with k and decreases with n: a k_lo <= k and an
    n_hi >= n give CPL(k_lo, n_hi) <= CPL(k, n), which keeps the bound valid. k <= 0 gives 0.

    Args:
      k: The successes (real-valued allowed).
      n: The trials (real-valued allowed).
      delta: The failure probability.

    Returns:
      The lower confidence bound on p, in [0, 1].
    """
    if n <= 0 or k <= 0:
        return 0.0
    k = min(k, n)
    return float(betaincinv(k, n - k + 1.0, delta))


def clopper_pearson_upper(k: float, n: float, delta: float) -> float:
    """One-sided Clopper-Pearson upper bound: CPU = BetaQuantile(1 - delta; k + 1, n - k), P(p > CPU) <= delta.

    Increases with k and decreases with n (same monotonicity as above): a k_hi >= k and an n_lo <= n keep it
    valid. n - k <= 0 gives 1.

    Args:
      k: The successes (real-valued allowed).
      n: The trials (real-valued allowed).
      delta: The failure probability.

    Returns:
      The upper confidence bound on p, in [0, 1].
    """
    if n <= 0:
        return 1.0
    k = max(k, 0.0)
    if n - k <= 0:
        return 1.0
    return float(betaincinv(k + 1.0, n - k, 1.0 - delta))
