"""Tests on a DP sum of bounded per-example values that account for the Laplace noise and the sampling
error *jointly*, the default of the loss and accuracy validators.

Contract: the release (``release_pair``: S~, S'~ with Lap(B/eps) each, L1 sensitivity B) is eps-DP, and a
false ACCEPT (or REJECT) has probability at most the test's eta, for either p-value (``chernoff_tail``:
any law on [0, B]; ``binomial_tail``: 0/1 values). Each function's docstring has its proof;
``noisy_sum_test`` assembles them. The release, the statistic and the tails: docs/validation.md, "The
default tests: noise and sample together".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from scipy.special import betainc, gammaln  # noqa: TID253

from sage_tfx.privacy.randomness import as_secure_rng
from sage_tfx.privacy.samplers import grid_laplace_pair

from .core import Mode, NoisyTotal

if TYPE_CHECKING:
    import numpy.typing as npt

    from sage_tfx.privacy.randomness import RngLike

COUNT_SHARE = 0.05  # fraction of a test's eta for the event "the true count is outside the noisy count's interval"


def release_pair(
    values: np.ndarray, bound: float, epsilon: float | None, rng: RngLike, mode: Mode
) -> tuple[NoisyTotal, NoisyTotal]:
    """(S~, S'~): the sums of ``values`` clipped to [0, B] and of B minus them, each + Lap(B/eps), drawn as the
    exact grid Laplace of the pair, summed exactly on the grid (``samplers.grid_laplace_pair``: one vector of L1
    sensitivity B whose change touches its 2 cells, eps-DP for the pair, exactly).

    eps-DP under adding or removing one record: the pair moves by (v, B - v), L1 norm B (see the module
    docstring). Released exactly in non_private mode (``epsilon`` may then be None).
    """
    clipped = np.clip(values, 0.0, bound)
    if not mode.noisy:
        total = NoisyTotal.release(clipped, bound, epsilon, rng, mode)
        return total, NoisyTotal(bound * clipped.size - total.value, 0.0)

    epsilon = cast(float, epsilon)  # None only in non_private mode (above)
    pair = grid_laplace_pair(clipped, bound, epsilon, as_secure_rng(rng))  # summed exactly on the grid
    return NoisyTotal.coupled(pair[0], bound, epsilon, cells=2), NoisyTotal.coupled(pair[1], bound, epsilon, cells=2)


# ---------------------------------------------------------------- the noise X = a E1 - c E2


def laplace_pair_sf(u: float) -> float:
    """P(E1 + E2 > u) for independent standard Laplace E1, E2 and u >= 0: exp(-u) (2 + u) / 4.

    (The density of E1 + E2 is (1 + |u|) exp(-|u|) / 4, from the characteristic function 1/(1 + t^2)^2;
    integrating from u to infinity gives the formula.)"""
    return math.exp(-u) * (2.0 + u) / 4.0


def laplace_pair_quantile(prob: float, two_sided: bool) -> float:
    """The u >= 0 with P(E1 + E2 > u) = prob (or P(|E1 + E2| > u) = prob), in closed form.

    With v = 2 + u, ``laplace_pair_sf`` = t reads v e^{-v} = 4 t e^{-2}, so v = -W_{-1}(-4 t e^{-2}) on the
    lower branch of Lambert's W (v >= 2 > 1; the argument lies in (-1/e, 0) for 0 < t < 1/2; t >= 1/2 gives 0). The result
    is then nudged up (a few ulps) until sf(u) <= t, so the interval [n~ - u/eps, n~ + u/eps] misses n
    with probability at most ``prob``. (Replaces a 100-step bisection: it is no mechanism calibration,
    so dp-accounting's calibrate_dp_mechanism does not apply.)
    """
    from scipy.special import lambertw

    target = prob / 2.0 if two_sided else prob
    if not target > 0.0:
        raise ValueError(f"laplace_pair_quantile: prob {prob!r} must be > 0 (an error probability)")
    if target >= 0.5:
        return 0.0  # sf(0) = 1/2 already meets it
    u = max(0.0, float(-lambertw(-4.0 * target * math.exp(-2.0), -1).real) - 2.0)
    while laplace_pair_sf(u) > target:
        u = math.nextafter(u, math.inf)
    return u


def laplace_sum_quantile(prob: float, copies: int, two_sided: bool = False) -> float:
    """The u >= 0 with P(S > u) <= prob (or P(|S| > u) <= prob), S the sum of ``copies`` independent pairs E1 + E2
    of standard Laplace draws: the noise of ``copies`` disjoint releases summed (a partitioned query).

    One pair: the exact quantile (``laplace_pair_quantile``). More: Chernoff's bound exp(-lam u) (1 - lam^2)^(-2
    copies) = prob (the standard Laplace MGF is 1 / (1 - lam^2)), minimised over a grid of lam in (0, 1); any lam
    gives a valid u, so the grid only costs tightness.

    Args:
        prob: the probability u may be exceeded, in (0, 1).
        copies: how many pairs are summed (>= 1).
        two_sided: bound P(|S| > u) instead (S is symmetric: prob / 2 a side).

    Returns:
        u.
    """
    if copies == 1:
        return laplace_pair_quantile(prob, two_sided)
    target = prob / 2.0 if two_sided else prob
    lams = np.linspace(1e-4, 1 - 1e-4, 20_000)
    return float(np.min((math.log(1 / target) - 2 * copies * np.log1p(-(lams**2))) / lams))


def noise_sf(z: npt.ArrayLike, a: float, c: float) -> np.ndarray:
    """P(a E1 - c E2 > z), vectorized in z (a, c >= 0).

    a E1 - c E2 has the law of a E1 + c E2 (E2 is symmetric), whose characteristic function
    1/((1 + a^2 t^2)(1 + c^2 t^2)) = [a^2/(1 + a^2 t^2) - c^2/(1 + c^2 t^2)] / (a^2 - c^2) makes its law the
    signed mixture (a^2 Lap(a) - c^2 Lap(c)) / (a^2 - c^2). For z >= 0 that gives
    (a^2 e^{-z/a} - c^2 e^{-z/c}) / (2 (a^2 - c^2)), and as c -> a the limit e^{-z/a} (2 + z/a) / 4 (used when
    the scales agree to 1e-6); for z < 0, 1 - P(X > -z) by symmetry.
    """
    z = np.asarray(z, dtype=np.float64)
    u = np.abs(z)
    a, c = max(a, c), min(a, c)
    if c == 0.0:
        upper = 0.5 * np.exp(-u / a)
    elif (a - c) <= 1e-6 * a:
        b = (a + c) / 2.0
        upper = np.exp(-u / b) * (2.0 + u / b) / 4.0
    else:
        upper = (a * a * np.exp(-u / a) - c * c * np.exp(-u / c)) / (2.0 * (a * a - c * c))
    return np.where(z >= 0, upper, 1.0 - upper)


def noise_log_mgf(lam: float, a: float, c: float) -> float:
    """log E exp(lam X) = -log(1 - a^2 lam^2) - log(1 - c^2 lam^2) for |lam| < 1/max(a, c) (Laplace MGFs)."""
    return -math.log1p(-((a * lam) ** 2)) - math.log1p(-((c * lam) ** 2))


# ---------------------------------------------------------------- tails of T~ under mean tau


def chernoff_tail(
    t: float, n: float, tau: float, bound: float, a: float, c: float, side: int, noise_copies: int = 1
) -> float:
    """An upper bound on P(T~ <= t) (side -1) or P(T~ >= t) (side +1) for n values in [0, B] with mean mu,
    valid whenever mu >= tau (side -1) or mu <= tau (side +1); a = c = 0 for no noise. ``noise_copies`` k:
    the noise is a sum of k independent copies of X (k releases of disjoint parts summed, as a partitioned
    query is; ``sage bench block-composition``): its MGF is the k-th power of X's.

        P(s T~ >= s t) <= exp(-lam s t) * [E exp(lam s (v - tau))]^n * E exp(lam s X)        (Chernoff, lam > 0)
        E exp(lam s (v - tau)) <= exp(-lam s tau) (1 - q + q exp(lam s B)),  q = tau / B

    Proof: exp(lam s v) is convex in v, so on [0, B] it lies below its chord, and E exp(lam s v) <=
    1 - mu/B + (mu/B) exp(lam s B) (Hoeffding 1963), which is increasing in mu for s = +1 and decreasing
    for s = -1: the worst case over mu <= tau (resp. >= tau) is mu = tau. X is independent of the sample and
    its MGF is exact (``noise_log_mgf``). The bound holds for every lam in (0, 1/max(a, c)); we minimise the
    convex log-bound by golden-section search, and any lam it returns gives a valid bound.
    Monotone in n: the bracket is >= 1 (Jensen: E exp(lam s (V - tau)) >= exp(0) for the two-point V of
    mean tau), so the bound grows with n and an n_hi >= n keeps it valid.
    """
    q = tau / bound
    lam_max = (1.0 / max(a, c)) * (1.0 - 1e-9) if max(a, c) > 0 else 200.0 / bound

    def log_bound(lam):
        sample = n * (-side * lam * tau + math.log1p(q * math.expm1(side * lam * bound)))
        noise = noise_copies * noise_log_mgf(lam, a, c) if max(a, c) > 0 else 0.0
        return -side * lam * t + sample + noise

    lo, hi = 0.0, lam_max
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    f1, f2 = log_bound(x1), log_bound(x2)
    for _ in range(80):
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - ratio * (hi - lo)
            f1 = log_bound(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + ratio * (hi - lo)
            f2 = log_bound(x2)
    return min(1.0, math.exp(min(f1, f2, 0.0)))


def binomial_tail(t: float, counts: npt.ArrayLike, tau: float, a: float, c: float, side: int) -> float:
    """max over the integer counts n of P(T~ <= t) (side -1) or P(T~ >= t) (side +1), computed exactly for
    T~ = M - tau n + X, M ~ Bin(n, tau), plus the binomial mass left out of the summation window (so each value
    is an upper bound). ``counts`` is an int or a sequence of ints >= 1.

    Valid for 0/1 values with mean mu >= tau (side -1) or mu <= tau (side +1): Bin(n, mu) is stochastically
    increasing in mu and X is independent, so the tail at mu = tau is the largest.
        P(T~ >= t) = sum_m P(M = m) P(X > t - m + tau n)
    (X is continuous, so > and >= agree.) The sum runs over m within 10 standard deviations + 10 of n tau;
    the probability of the other m is added in full. Vectorized over m and, in chunks, over n.
    """
    counts = np.atleast_1d(np.asarray(counts, dtype=np.int64))
    if counts.size == 0 or counts.min() <= 0:
        return 1.0
    worst = 0.0
    for chunk in np.array_split(counts, max(1, counts.size // 64)):
        n = chunk.astype(np.float64)[:, None]
        sd = math.sqrt(float(chunk.max()) * tau * (1.0 - tau))
        lo = max(0, int(math.floor(chunk.min() * tau - 10 * sd - 10)))
        hi = min(int(chunk.max()), int(math.ceil(chunk.max() * tau + 10 * sd + 10)))
        m = np.arange(lo, hi + 1, dtype=np.float64)[None, :]
        with np.errstate(invalid="ignore"):
            log_pmf = (
                gammaln(n + 1.0)
                - gammaln(m + 1.0)
                - gammaln(n - m + 1.0)
                + m * math.log(tau)
                + (n - m) * math.log1p(-tau)
            )
        pmf = np.where(m <= n, np.exp(log_pmf), 0.0)
        upper_tail = noise_sf(t - m + tau * n, a, c)  # P(X > t - m + tau n): T~ >= t given M = m
        tail = upper_tail if side > 0 else 1.0 - upper_tail
        left_out = np.maximum(0.0, 1.0 - pmf.sum(axis=1))
        worst = max(worst, float(np.max((pmf * tail).sum(axis=1) + left_out)))
    return min(1.0, worst)


def binomial_test(m: float, n: float, tau: float, side: int) -> float:
    """P(M <= m) (side -1) or P(M >= m) (side +1) for M ~ Bin(n, tau), through the regularised incomplete
    beta function (which also takes real m and n: the UC ablation's noisy counts). Inverting it in tau is
    exactly the Clopper-Pearson bound."""
    if side < 0:
        return 0.0 if m < 0 else 1.0 if m >= n else float(betainc(n - m, m + 1.0, 1.0 - tau))
    return 1.0 if m <= 0 else 0.0 if m > n else float(betainc(m, n - m + 1.0, tau))


# ---------------------------------------------------------------- the test


def count_interval(
    total: NoisyTotal,
    complement: NoisyTotal,
    bound: float,
    prob: float,
    mode: Mode,
    two_sided: bool,
    noise_copies: int = 1,
) -> tuple[float, float]:
    """(n_lo, n_hi) containing n = (S + S')/B except with probability ``prob`` (with noise and correction);
    the point (S~ + S'~)/B otherwise. One-sided tests only use n_hi (then n_lo = -inf). ``noise_copies`` k: each
    total is the sum of k disjoint releases (``laplace_sum_quantile``; its slack the sum of theirs)."""
    n_noisy = (total.value + complement.value) / bound
    if not mode.corrected or total.scale == 0.0:
        return n_noisy, n_noisy
    half_width = laplace_sum_quantile(prob, noise_copies, two_sided) * total.scale / bound  # (scale/B)(E1 + E2)
    # the grid release: each total is exact + L + xi in law, |xi| <= slack (samplers.grid_laplace_coupling)
    half_width += (total.slack + complement.slack) / bound
    return (n_noisy - half_width if two_sided else -math.inf), n_noisy + half_width


def noisy_sum_test(
    total: NoisyTotal,
    complement: NoisyTotal,
    bound: float,
    tau: float,
    eta: float,
    mode: Mode,
    side: int,
    binomial: bool = False,
    noise_copies: int = 1,
) -> tuple[float, float, dict[str, Any]]:
    """The p-value of the ACCEPT (side -1: mu <= tau) or REJECT (side +1: mu > tau) test and the count
    interval it used. The test passes iff the p-value is <= the sampling share of eta. ``noise_copies`` k: each
    total sums k disjoint releases of the same scale (a partitioned query, ``sage bench block-composition``):
    the noise is k copies of X (``count_interval``, ``chernoff_tail``); the Chernoff test only.

    Claim (side -1; side +1 is symmetric): if the n values are i.i.d. with mean mu >= tau (the model misses the
    target), P(p-value <= eta_s) <= eta_s + eta_n = eta, where eta_n = COUNT_SHARE * eta in Sage mode.
    Proof. Let F_n(t) be the tail bound at the true count n (``chernoff_tail`` or ``binomial_tail``): an
    upper bound on P(T~ <= t), so P(F_n(T~) <= eta_s) <= eta_s (the probability integral transform of the
    continuous T~, whose true CDF is <= F_n). The event E = {n outside [n_lo, n_hi]} has probability <= eta_n
    (``count_interval``; the interval uses the same noise as T~, which the union bound allows; it is widened
    by the grid release's slack, and the bound is evaluated at t -+ slack, see the code). Outside E the
    p-value is the max of F_{n'}(t) over n' in the interval (only n' = n_hi for the Chernoff bound, which
    grows with n), which is >= F_n(t); so p-value <= eta_s implies F_n(T~) <= eta_s or E. Everything is
    post-processing of the eps-DP pair (S~, S'~).
    NP mode: exact S and n, no noise, eta_s = eta. UC mode: the same bound on the noisy S~, n~ with the noise
    ignored (no guarantee; the paper's ablation).
    """
    corrected = mode.corrected and total.scale > 0.0
    eta_n = COUNT_SHARE * eta if corrected else 0.0
    eta_s = eta - eta_n
    if binomial and noise_copies != 1:
        raise ValueError(f"noise_copies={noise_copies!r}: the binomial test takes one release (noise_copies=1)")
    n_lo, n_hi = count_interval(total, complement, bound, eta_n, mode, two_sided=binomial, noise_copies=noise_copies)
    statistic = total.value - tau * (total.value + complement.value) / bound
    # Grid noise (samplers.grid_laplace_coupling): in law S~ = S + L1 + xi1, S'~ = S' + L2 + xi2 with
    # |xi_i| <= slack_i, so T~ = T + X + xi, |xi| <= (1 - tau/B) slack1 + (tau/B) slack2 <= slack. The
    # tail bounds are for T + X: side -1 evaluates P(T + X <= t + slack) >= P(T~ <= t) (side +1: t - slack);
    # F is monotone, so P(F(T~ - side slack) <= eta_s) <= P(F(T + X) <= eta_s) <= eta_s.
    slack = max(total.slack, complement.slack) if corrected else 0.0
    tested = statistic - side * slack
    a = (bound - tau) / bound * total.scale if corrected else 0.0
    c = tau / bound * total.scale if corrected else 0.0
    details = {
        "n_noisy": (total.value + complement.value) / bound,
        "n_hi": n_hi,
        "statistic": statistic,
        "eta_sampling": eta_s,
        "eta_count": eta_n,
    }
    if n_hi < 1:
        return 1.0, eta_s, details
    if not binomial:
        return chernoff_tail(tested, n_hi, tau, bound, a, c, side, noise_copies=noise_copies), eta_s, details
    details["n_lo"] = n_lo
    if not corrected:  # no noise to convolve: the exact binomial test (Clopper-Pearson) on the (noisy) counts
        return binomial_test(total.value, n_hi, tau / bound, side), eta_s, details
    counts = np.arange(max(1, math.ceil(n_lo)), math.floor(n_hi) + 1)
    return binomial_tail(tested, counts, tau / bound, a, c, side), eta_s, details


def confidence_limit(
    total: NoisyTotal, complement: NoisyTotal, bound: float, eta: float, mode: Mode, side: int, binomial: bool = False
) -> float:
    """The reported bound: for side -1 the smallest tau in (0, B) at which the ACCEPT test passes (an upper
    confidence limit on mu; B when none does), for side +1 the largest tau at which REJECT passes (a lower
    limit; 0 when none does). The decision is always the test at the target itself; this limit summarises the
    data. It is the root of log p-value(tau) = log eta_s (Brent's method, to 1e-9 B): the p-value is continuous
    in tau and, in every case we have checked, monotone, so limit <= target exactly when the test at the
    target passes (tests/validation/test_validation_noisy.py checks this agreement)."""
    from scipy.optimize import brentq

    def excess(tau):
        p_value, eta_s, _ = noisy_sum_test(total, complement, bound, tau, eta, mode, side, binomial)
        return math.log(max(p_value, 1e-300)) - math.log(eta_s)

    lo, hi = bound * 1e-9, bound * (1.0 - 1e-9)
    passing_end, failing_end = (hi, lo) if side < 0 else (lo, hi)
    if excess(passing_end) > 0:
        return bound if side < 0 else 0.0
    if excess(failing_end) <= 0:
        return failing_end
    return brentq(excess, lo, hi, xtol=bound * 1e-9)


def joint_decision(
    test: np.ndarray,
    train: np.ndarray | None,
    bound: float,
    tau: float,
    epsilon: float,
    train_epsilon: float,
    rng: RngLike,
    mode: Mode,
    eta_accept: float,
    eta_reject: float,
    binomial: bool = False,
) -> tuple[bool, bool, float, dict[str, float], dict[str, Any]]:
    """Both tests of the default validators on values in [0, B] (clipped losses, or 0/1 errors with B = 1).

    Returns (accepted, rejected, mean, limits, details): ``mean`` is the DP mean B S~ / (S~ + S'~) (inf when the
    noisy count is not positive); ``limits`` has "upper" (``confidence_limit`` on the test set) and, when
    ``train`` is given, "lower" (on the training set, released with ``train_epsilon``). The tests run at
    min(tau, B (1 - 1e-9)): the clipped mean is at most B, so a target >= B is tested at B. No SLA (TFX's plain
    validator) accepts iff the DP mean is <= tau, and has no limits but the mean.
    """
    total, complement = release_pair(test, bound, epsilon, rng, mode)
    n_noisy = (total.value + complement.value) / bound
    mean = bound * total.value / (total.value + complement.value) if n_noisy > 0 else math.inf
    details = {"n_noisy": n_noisy, "sum_noisy": total.value, "complement_noisy": complement.value}
    if mode is Mode.NO_SLA:
        return mean <= tau, False, mean, {"upper": mean}, details
    tested = min(tau, bound * (1.0 - 1e-9))
    p_value, eta_s, more = noisy_sum_test(total, complement, bound, tested, eta_accept, mode, -1, binomial)
    details.update(more, p_value=p_value)
    limits = {"upper": confidence_limit(total, complement, bound, eta_accept, mode, -1, binomial)}
    accepted, rejected = p_value <= eta_s, False
    if train is not None:
        train_total, train_complement = release_pair(train, bound, train_epsilon, rng, mode)
        p_reject, eta_r, more = noisy_sum_test(
            train_total, train_complement, bound, tested, eta_reject, mode, +1, binomial
        )
        details.update({f"train_{k}": v for k, v in more.items()}, train_p_value=p_reject)
        limits["lower"] = confidence_limit(train_total, train_complement, bound, eta_reject, mode, +1, binomial)
        rejected = p_reject <= eta_r
    return accepted, rejected, mean, limits, details
