"""Floating-point-safe noise: exact discrete Laplace and discrete Gaussian samplers on a public grid.

Every release is ``gamma * (r(x / gamma) + Y)``, ``gamma`` a public power of two, ``r`` an exact rounding
and ``Y`` integer noise drawn exactly (Canonne, Kamath, Steinke 2020), so its support is the same grid
whatever the input (no Mironov 2012 attack); the grid releases (``grid_laplace``, ``grid_gaussian``) state
their privacy in their docstrings. numpy and the standard library only (no TensorFlow); randomness from
``randomness.py``. Samplers, the rounding lemma (Lemma G) and the proofs: docs/noise.md, "The samplers and
the rounding" and "Privacy, as stated in each docstring".
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, cast

import numpy as np

from .checks import integer, positive
from .randomness import BAD_ARGUMENT, SamplerError, as_secure_rng

if TYPE_CHECKING:
    import numpy.typing as npt

    from .randomness import RngLike, SecureRNG

__all__ = [
    "bernoulli_exp",
    "discrete_laplace",
    "discrete_gaussian",
    "grid_laplace",
    "grid_laplace_params",
    "grid_gaussian",
    "grid_gaussian_params",
    "grid_laplace_coupling",
    "grid_sums",
    "grid_laplace_sum",
    "grid_gaussian_sum",
    "grid_laplace_pair",
    "GRID_BITS",
    "GAUSS_GRID_BITS",
]

# The grid is at least 2^GRID_BITS times finer than the Laplace scale and than Delta / k (see grid_laplace).
GRID_BITS = 20
# The discrete Gaussian's grid: sigma / gamma in [2^GAUSS_GRID_BITS, 2^(GAUSS_GRID_BITS + 2)),
# which keeps every intermediate of CKS Algorithm 3 below 2^63 (see _gauss_accept).
GAUSS_GRID_BITS = 13
_MAX_GAUSS_S = 2**30  # the discrete Gaussian's variance parameter S stays below this (int64 arithmetic)
_MAX_INDEX = 2.0**52  # |x / gamma| must stay below this: float64 then holds every grid index exactly


# ------------------------------------------------------------------------------------------- samplers


def _bernoulli_ratio(num, den, rng):
    """Bernoulli(num / den) per entry (0 <= num <= den, den >= 1), exactly."""
    return rng.uniform_below(den) < num


_UNIT_ROUND = 4  # A_1..A_4 drawn in one vectorised round; P(all four are 1) <= 1/4! < 0.042
_LCM_1_TO_8 = 840  # Bernoulli(1/k) for k <= 8 is "u < 840 / k" for u uniform in [0, 840): exact, k divides 840


def _bernoulli_exp_unit(num, den, rng):
    """CKS Algorithm 1: Bernoulli(exp(-g)) for g = num/den in [0, 1].

    Draw A_k ~ Bernoulli(g / k) for k = 1, 2, ... until the first A_k = 0; return 1 iff that k is odd.
    P(K > k) = g^k / k!, so P(K odd) = sum_k (-1)^k g^k / k! = exp(-g). A_k is drawn as the AND of
    independent Bernoulli(num / den) and Bernoulli(1 / k) (probability (g / k) exactly), so no product
    den * k is ever formed: den may be any int64 >= 1. Vectorised: A_1..A_8 of every entry in one round
    (drawing A_k past the first zero changes nothing: only the first zero is read); the entries
    whose four are all 1 go on one k at a time.
    """
    num = np.asarray(num, dtype=np.int64).reshape(-1)
    den = np.asarray(den, dtype=np.int64).reshape(-1)
    n = num.size
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    kk = _UNIT_ROUND
    ratio = rng.uniform_below(np.tile(den, kk)).reshape(kk, n) < num  # Bernoulli(num/den), kk per entry
    inverse = rng.uniform_below(np.full(kk * n, _LCM_1_TO_8, dtype=np.int64)).reshape(kk, n)
    a = ratio & (inverse < (_LCM_1_TO_8 // np.arange(1, kk + 1, dtype=np.int64))[:, None])  # Bernoulli(g / k)
    first_zero = np.argmin(a, axis=0)  # the index of the first A_k = 0 (0 if none: resolved below)
    stopped = ~a.all(axis=0)
    out[stopped] = (first_zero[stopped] % 2) == 0  # k = index + 1 odd
    pending = np.flatnonzero(~stopped)
    k = kk + 1
    while pending.size:
        a = _bernoulli_ratio(num[pending], den[pending], rng)
        a &= rng.uniform_below(np.full(pending.size, k, dtype=np.int64)) == 0
        out[pending[~a]] = (k % 2) == 1
        pending = pending[a]
        k += 1
    return out


def _bernoulli_exp_parts(whole, frac, den, rng):
    """Bernoulli(exp(-(whole + frac / den))) per entry (int64 arrays, 0 <= frac < den): floor(g) independent
    Bernoulli(exp(-1)) factors, then Bernoulli(exp(-frac/den)), stopped at the first 0 (a later factor cannot
    change a 0)."""
    out = np.ones(whole.shape, dtype=bool)
    pending = np.flatnonzero(whole > 0)
    left = whole.copy()
    while pending.size:
        one = np.ones(pending.size, dtype=np.int64)
        ok = _bernoulli_exp_unit(one, one, rng)
        out[pending[~ok]] = False
        left[pending] -= 1
        pending = pending[ok & (left[pending] > 0)]
    alive = np.flatnonzero(out)
    if alive.size:
        out[alive] = _bernoulli_exp_unit(frac[alive], den[alive], rng)
    return out


def bernoulli_exp(num: np.ndarray, den: np.ndarray | int, rng: SecureRNG) -> np.ndarray:
    """Bernoulli(exp(-num/den)) per entry, exactly, for integer arrays num >= 0 and den >= 1.

    exp(-g) = exp(-1)^floor(g) * exp(-(g - floor(g))): a product of independent Bernoullis (CKS Alg. 1),
    stopped at the first 0 (a later factor cannot change a 0).
    """
    rng = as_secure_rng(rng)
    num = np.atleast_1d(np.asarray(num, dtype=np.int64))
    den = np.broadcast_to(np.asarray(den, dtype=np.int64), num.shape).copy()
    if (num < 0).any() or (den < 1).any():
        raise SamplerError("bernoulli_exp: need num >= 0 and den >= 1")
    return _bernoulli_exp_parts(num // den, num % den, den, rng)


_GEOMETRIC_ROUND = 4  # Bernoulli(exp(-1)) trials per entry per round; all four succeed with probability e^-4


def _geometric_exp1(n, rng):
    """n draws of V with P(V = v) = (1 - e^-1) e^-v: the number of Bernoulli(exp(-1)) successes before a failure.

    Vectorised: four independent trials per entry per round; V adds the successes before the first failure
    (trials after it are drawn but never read), and entries whose four all succeed go on to another round.
    """
    v = np.zeros(n, dtype=np.int64)
    pending = np.arange(n)
    kk = _GEOMETRIC_ROUND
    while pending.size:
        m = pending.size
        one = np.ones(kk * m, dtype=np.int64)
        ok = _bernoulli_exp_unit(one, one, rng).reshape(kk, m)
        failed = ~ok.all(axis=0)
        v[pending] += np.where(failed, np.argmin(ok, axis=0), kk)
        pending = pending[~failed]
    return v


# Larger batches are drawn in consecutive chunks of this many cells (the vectorised rounds hold ~40 words per cell).
_CHUNK = 1 << 16
# Batches up to this size are drawn one by one with Python integers (the same algorithms; faster than the
# vectorised rounds for a handful of cells, e.g. a validator's totals or a record count).
_SCALAR_BATCH = 48


def _bernoulli_exp_unit_scalar(num: int, den: int, rng) -> bool:
    """CKS Algorithm 1 for g = num/den in [0, 1], with Python integers."""
    k = 1
    while rng.randbelow(den * k) < num:  # A_k ~ Bernoulli(g / k) is 1: go on
        k += 1
    return k % 2 == 1


def _bernoulli_exp_scalar(num: int, den: int, rng) -> bool:
    """Bernoulli(exp(-num/den)) with Python integers: floor(num/den) exp(-1) factors, then the fraction."""
    whole, frac = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_unit_scalar(1, 1, rng):
            return False
    return _bernoulli_exp_unit_scalar(frac, den, rng)


def _discrete_laplace_scalar(t: int, rng) -> int:
    """CKS Algorithm 2 (s = 1) for one draw, with Python integers."""
    while True:
        u = rng.randbelow(t)
        if not _bernoulli_exp_unit_scalar(u, t, rng):
            continue
        v = 0
        while _bernoulli_exp_unit_scalar(1, 1, rng):
            v += 1
        x = u + t * v
        negative = rng.randbelow(2) == 1
        if negative and x == 0:
            continue
        return -x if negative else x


def discrete_laplace(t: int, size: int | tuple[int, ...], rng: SecureRNG) -> np.ndarray:
    """``size`` iid draws of the discrete Laplace of integer scale t >= 1: P(y) = tanh(1/(2t)) exp(-|y|/t).

    CKS Algorithm 2 with s = 1, vectorised: U uniform in [0, t), kept with probability exp(-U/t); then
    V ~ Geometric(1 - e^-1) and X = U + tV, so P(X = x) is proportional to exp(-x/t) on {0, 1, ...};
    a fair sign B; (B = 1, X = 0) is rejected so that 0 is not counted twice. Exact: only integer
    arithmetic and exact Bernoullis.
    """
    rng = as_secure_rng(rng)
    t = integer(t, "discrete_laplace: the scale t", low=1, high=2**52, error=SamplerError, message=BAD_ARGUMENT)
    n = int(np.prod(size)) if np.ndim(size) else int(cast(int, size))
    if n <= _SCALAR_BATCH:
        return np.array([_discrete_laplace_scalar(t, rng) for _ in range(n)], dtype=np.int64).reshape(size)
    if n > _CHUNK:  # bounded memory: consecutive chunks from the same generator
        return np.concatenate([discrete_laplace(t, min(_CHUNK, n - i), rng) for i in range(0, n, _CHUNK)]).reshape(size)
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    tt = np.int64(t)
    while pending.size:
        m = pending.size
        u = rng.uniform_below(np.full(m, t, dtype=np.int64)) if t > 1 else np.zeros(m, dtype=np.int64)
        keep = _bernoulli_exp_unit(u, np.full(m, t, dtype=np.int64), rng)  # U / t < 1
        idx, u = pending[keep], u[keep]
        x = u + tt * _geometric_exp1(idx.size, rng)
        sign = rng.bits(idx.size)
        good = ~((sign == 1) & (x == 0))
        out[idx[good]] = np.where(sign[good] == 1, -x[good], x[good])
        done = np.zeros(m, dtype=bool)
        done[np.flatnonzero(keep)[good]] = True
        pending = pending[~done]
    return out.reshape(size)


def _gauss_accept(y, s, t, rng):
    """Bernoulli(exp(-(|y| - s/t)^2 / (2s))) = Bernoulli(exp(-num / den)), num = (|y| t - s)^2, den = 2 s t^2, exactly.

    With s < 2^30 and t = floor(sqrt(s)) + 1 <= 2^15 + 1, den = 2 s t^2 < 2^62; num, whole = num // den and frac =
    num % den are computed in int64 while |y| t < 2^31 (then |num| < 2^62), and with Python integers
    otherwise (the rare large |y|); whole is capped at 2^62 exp(-1) factors (surviving that many has
    probability below exp(-2^62): the cap changes nothing a float could represent). Then one vectorised
    ``_bernoulli_exp_parts``.
    """
    y = np.abs(np.asarray(y, dtype=np.int64))
    den = 2 * s * t * t
    fast = y < (2**31) // t
    whole = np.empty(y.shape, dtype=np.int64)
    frac = np.empty(y.shape, dtype=np.int64)
    num = (y[fast] * t - s) ** 2
    whole[fast], frac[fast] = num // den, num % den
    for i in np.flatnonzero(~fast):
        w, f = divmod((int(y[i]) * t - s) ** 2, den)
        whole[i], frac[i] = min(w, 2**62), f
    return _bernoulli_exp_parts(whole, frac, np.full(y.shape, den, dtype=np.int64), rng)


def discrete_gaussian(s: int, size: int | tuple[int, ...], rng: SecureRNG) -> np.ndarray:
    """``size`` iid draws of the discrete Gaussian N_Z(0, s): P(y) proportional to exp(-y^2 / (2s)), s an integer.

    CKS Algorithm 3, vectorised: t = floor(sqrt(s)) + 1; Y ~ discrete Laplace(t); accept with
    probability exp(-(|Y| - s/t)^2 / (2s)), else draw again. Requires 1 <= s < 2^30.
    """
    rng = as_secure_rng(rng)
    s = integer(
        s,
        "discrete_gaussian: the variance parameter",
        low=1,
        high=_MAX_GAUSS_S,
        high_open=True,
        error=SamplerError,
        message=BAD_ARGUMENT,
    )
    t = math.isqrt(s) + 1
    n = int(np.prod(size)) if np.ndim(size) else int(cast(int, size))
    if n <= _SCALAR_BATCH:
        draws = []
        for _ in range(n):
            while True:
                y = _discrete_laplace_scalar(t, rng)
                if _bernoulli_exp_scalar((abs(y) * t - s) ** 2, 2 * s * t * t, rng):
                    draws.append(y)
                    break
        return np.array(draws, dtype=np.int64).reshape(size)
    if n > _CHUNK:  # bounded memory: consecutive chunks from the same generator
        return np.concatenate([discrete_gaussian(s, min(_CHUNK, n - i), rng) for i in range(0, n, _CHUNK)]).reshape(
            size
        )
    out = np.empty(n, dtype=np.int64)
    pending = np.arange(n)
    while pending.size:
        ys = discrete_laplace(t, pending.size, rng)
        ok = _gauss_accept(ys, s, t, rng)
        out[pending[ok]] = ys[ok]
        pending = pending[~ok]
    return out.reshape(size)


# -------------------------------------------------------------------------------------- grid releases


def _pow2_at_most(value: float) -> float:
    """The largest power of two <= value (value > 0 and finite)."""
    mantissa, exponent = math.frexp(value)  # value = mantissa * 2^exponent, mantissa in [0.5, 1)
    return math.ldexp(1.0, exponent - 1)


def _check_positive(name, value):
    return positive(value, name, error=SamplerError, message="{what} must be a finite number > 0, got {value!r}")


def _cells(cells):
    return integer(cells, "cells", low=1, error=SamplerError, message=BAD_ARGUMENT)


def _grid_index(values, gamma):
    """r(x / gamma) = floor(x / gamma + 1/2) as int64, computed exactly (Lemma G, docs/noise.md)."""
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).all():
        raise SamplerError("grid release: values must be finite")
    y = x / gamma
    if x.size and float(np.abs(y).max()) >= _MAX_INDEX:
        raise SamplerError(f"grid release: |value| / gamma must stay below 2^52 (gamma = {gamma!r})")
    fl = np.floor(y)
    return (fl + (y - fl >= 0.5)).astype(np.int64)


def grid_laplace_params(sensitivity: float, epsilon: float, cells: int = 1) -> tuple[float, int]:
    """(gamma, t): the grid and the integer noise scale of ``grid_laplace``; gamma * t is the noise's scale.

    gamma = the largest power of two <= min(b, Delta / k) / 2^GRID_BITS, b = Delta / epsilon;
    D = floor(Delta / gamma) + k grid units (Lemma G); t = ceil(D / epsilon) (exact rational arithmetic).
    Then b <= gamma * t <= b (1 + 2^-GRID_BITS) + gamma: the noise is at most ~1e-6 relative larger than
    the float Laplace(b) it replaces.
    """
    delta = _check_positive("sensitivity", sensitivity)
    epsilon = _check_positive("epsilon", epsilon)
    k = _cells(cells)
    gamma = _pow2_at_most(min(delta / epsilon, delta / k) / 2.0**GRID_BITS)
    units = math.floor(delta / gamma) + k
    t = math.ceil(Fraction(units) / Fraction(epsilon))
    return gamma, int(t)


def grid_laplace(
    values: npt.ArrayLike, sensitivity: float, epsilon: float, rng: RngLike = None, cells: int = 1
) -> np.ndarray:
    """An epsilon-DP release of ``values`` on the grid gamma * Z: gamma * (r(values / gamma) + Y), Y iid discrete Laplace(t).

    Mechanism: (gamma, t) = grid_laplace_params(sensitivity, epsilon, cells); each cell is rounded to
    the grid (r(y) = floor(y + 1/2)) and gets gamma times its own discrete Laplace draw
    (P(Y = y) proportional to exp(-|y| / t)), drawn exactly by CKS Algorithm 2 from ``rng``
    (``as_secure_rng``: None, an int seed, a SecureRNG, a numpy Generator).
    Sensitivity: ``sensitivity`` Delta bounds the L1 norm of the change of the whole array when one
    record is added or removed, and ``cells`` k bounds how many cells that change touches (k = the
    array's size is always safe).
    Guarantee: (epsilon, 0)-DP, exactly, with no floating-point caveat.
    Proof sketch: by Lemma G (docs/noise.md) the integer vectors r(x / gamma), r(x' / gamma) of
    neighbouring inputs differ by at most D = floor(Delta / gamma) + k in L1. The discrete Laplace
    density ratio is p(z) / p(z + d) <= exp(|d| / t), so the product over cells of the density
    ratios at any output is at most exp(D / t) <= exp(epsilon) because t >= D / epsilon. The output
    is an exact integer times a power of two (float64 holds it exactly since |index| < 2^52 and
    |Y| < 2^52 with overwhelming probability), so floating point adds nothing.
    Noise: scale gamma * t in [b, b (1 + 2^-20) + gamma], b = Delta / epsilon; plus the rounding,
    |r(x / gamma) gamma - x| <= gamma / 2.
    """
    gamma, t = grid_laplace_params(sensitivity, epsilon, cells)
    rng = as_secure_rng(rng)
    index = _grid_index(values, gamma)
    noise = discrete_laplace(t, index.shape, rng)
    return (index + noise).astype(np.float64) * gamma


def grid_laplace_coupling(
    sensitivity: float, epsilon: float, cells: int = 1, epsilon_tolerance: float = 0.0
) -> tuple[float, float]:
    """(scale, slack): a grid_laplace release is x + L + xi in law, L ~ Laplace(scale), |xi| <= slack.

    scale = gamma t and slack = 3 gamma / 2 for (gamma, t) = grid_laplace_params(...). Proof: the discrete
    Laplace Y of scale t is G1 - G2 for iid geometrics with P(G >= m) = q^m, q = exp(-1/t), and
    floor(t E) for E ~ Exp(1) is such a geometric (P(floor(tE) >= m) = P(E >= m/t) = q^m). So
    gamma Y = gamma t (E1 - E2) - gamma (frac(t E1) - frac(t E2)) = L + xi1 with L ~ Laplace(gamma t) and
    |xi1| < gamma; the rounding adds xi2 = gamma r(x / gamma) - x, |xi2| <= gamma / 2. Any tail bound
    of the float Laplace(scale) therefore holds for the release after widening it by ``slack`` (e.g.
    P(release - x > u + slack) <= P(L > u) = exp(-u / scale) / 2).

    epsilon_tolerance = tau > 0: bounds valid for a release made with any epsilon' in [epsilon (1 - tau),
    epsilon] (e.g. an epsilon recomputed in float as sensitivity / scale): scale = Delta / eps_lo
    (1 + 2^-20) + gamma_lo and slack = 3 gamma_lo / 2, eps_lo = epsilon (1 - tau), gamma_lo its grid (the
    largest of the range, gamma being non-increasing in epsilon); by ``grid_laplace_params``, every such
    release has gamma' t' <= Delta / eps' (1 + 2^-20) + gamma' <= scale, and a larger Laplace scale only
    loosens a tail bound.
    """
    if epsilon_tolerance:
        low = float(epsilon) * (1.0 - float(epsilon_tolerance))
        gamma, _ = grid_laplace_params(sensitivity, low, cells)
        return float(sensitivity) / low * (1.0 + 2.0**-GRID_BITS) + gamma, 1.5 * gamma
    gamma, t = grid_laplace_params(sensitivity, epsilon, cells)
    return gamma * t, 1.5 * gamma


def grid_gaussian_params(l2_sensitivity: float, sigma: float, cells: int = 1) -> tuple[float, int]:
    """(gamma, S): the grid and the integer variance parameter of ``grid_gaussian``.

    gamma = the largest power of two <= min(sigma, Delta_2 / sqrt(k)) / 2^GAUSS_GRID_BITS, raised (doubled)
    until sigma / gamma < 2^(GAUSS_GRID_BITS + 2); D2 = Delta_2 / gamma + sqrt(k) bounds the grid L2
    sensitivity (Lemma G per cell and the triangle inequality); S = ceil((sigma / gamma * D2 /
    (Delta_2 / gamma))^2), so that S >= (D2 sigma / Delta_2)^2 / gamma^2: the grid release keeps
    rho = Delta_2^2 / (2 sigma^2).
    """
    d2 = _check_positive("l2_sensitivity", l2_sensitivity)
    sigma = _check_positive("sigma", sigma)
    k = _cells(cells)
    # S >= (D2 sigma / Delta_2)^2 > k (sigma / Delta_2)^2 whatever the grid: beyond this no S fits the int64 sampler
    if sigma * math.sqrt(k) / d2 >= math.sqrt(_MAX_GAUSS_S):
        raise SamplerError(
            f"sigma {sigma!r} is {sigma / d2:.4g} times the L2 sensitivity {d2!r} over {k} cell(s): "
            f"the grid Gaussian supports sigma * sqrt(cells) / sensitivity < {math.sqrt(_MAX_GAUSS_S):g}; "
            "so much noise leaves nothing of the value: give the release a larger epsilon"
        )
    gamma = _pow2_at_most(min(sigma, d2 / math.sqrt(k)) / 2.0**GAUSS_GRID_BITS)
    while sigma / gamma >= 2.0 ** (GAUSS_GRID_BITS + 2):
        gamma *= 2.0
    while True:
        # sigma_grid >= sigma / gamma * (1 + sqrt(k) gamma / Delta_2), rounded up via a safe rational bound
        inflation = Fraction(1) + Fraction(math.ceil(math.sqrt(k) * 2**20) + 1, 2**20) * Fraction(gamma) / Fraction(d2)
        sigma_grid = Fraction(sigma) / Fraction(gamma) * inflation
        s = math.ceil(sigma_grid * sigma_grid)
        if s < _MAX_GAUSS_S:
            break
        gamma *= 2.0  # a coarser grid: S falls about fourfold (the inflation grows by at most 2x its excess)
    return gamma, int(s)


def grid_gaussian(
    values: npt.ArrayLike, l2_sensitivity: float, sigma: float, rng: RngLike = None, cells: int = 1
) -> np.ndarray:
    """A release of ``values`` on the grid gamma * Z: gamma * (r(values / gamma) + Y), Y iid discrete Gaussian N_Z(0, S).

    Mechanism: (gamma, S) = grid_gaussian_params(l2_sensitivity, sigma, cells); each cell rounded to the
    grid gets gamma times its own exact discrete Gaussian draw (CKS Algorithm 3).
    Sensitivity: Delta_2 bounds the L2 norm of the change of the array when one record is added or
    removed; ``cells`` k bounds how many cells it touches (the array's size is always safe).
    Guarantee: rho-zCDP with rho = Delta_2^2 / (2 sigma^2), the same as the continuous Gaussian
    mechanism N(0, sigma^2) it replaces; hence (rho + 2 sqrt(rho ln(1/delta)), delta)-DP for every
    delta > 0 (Bun, Steinke 2016, Prop. 1.3).
    Proof sketch: by Lemma G, neighbouring inputs give integer vectors at L2 distance <= D2 =
    Delta_2 / gamma + sqrt(k). CKS 2020 (Thm. 4 and its multivariate form, Sec. 4: adding iid
    N_Z(0, S) to an integer vector of L2 sensitivity D2 is (D2^2 / (2S))-zCDP, proved via the Renyi
    divergence D_alpha(N_Z(m, S) || N_Z(m', S)) <= alpha (m - m')^2 / (2S)). S >= (D2 sigma / Delta_2)^2
    gives D2^2 / (2S) <= Delta_2^2 / (2 sigma^2) = rho. Outputs are exact grid points.
    Noise: standard deviation gamma sqrt(Var N_Z(0, S)) <= gamma sqrt(S) (CKS Prop. 19: the discrete
    Gaussian's variance is below its parameter), and gamma sqrt(S) ~ sigma (1 + sqrt(k) gamma / Delta_2).
    """
    gamma, s = grid_gaussian_params(l2_sensitivity, sigma, cells)
    rng = as_secure_rng(rng)
    index = _grid_index(values, gamma)
    noise = discrete_gaussian(s, index.shape, rng)
    return (index + noise).astype(np.float64) * gamma


# ------------------------------------------------------------------------- grid releases of sums, summed exactly


def grid_sums(
    records: npt.ArrayLike, gamma: float, keys: npt.ArrayLike | None = None, num_cells: int | None = None
) -> list:
    """The exact integer sums, per cell, of the records' grid indices r(v / gamma) (Python ints: no rounding).

    ``records``: one record's contribution per row, shape (n,) (one cell) or (n, m) (m cells); with ``keys``
    (n integers in [0, num_cells)) record i adds its value to cell keys[i] only (a keyed sum, shape (n,)).
    Each record is put on the grid on its own (``_grid_index``: exact), and the integers are added exactly:
    in int64 while no partial sum can reach 2^62, else as Python ints.
    """
    x = np.asarray(records, dtype=np.float64)
    if keys is not None:
        keys = np.asarray(keys)
        if x.ndim != 1 or keys.shape != x.shape or num_cells is None:
            raise SamplerError("grid sums by key: give 1-D records, one integer key per record and num_cells")
        if keys.size and (keys.min() < 0 or keys.max() >= num_cells):
            raise SamplerError(f"grid sums by key: keys must be in [0, {num_cells})")
    elif x.ndim not in (1, 2):
        raise SamplerError(f"grid sums: records must be one value or one row of cells per record, got shape {x.shape}")
    index = _grid_index(x, gamma)
    bound = float(np.abs(index).max()) * max(len(index), 1) if index.size else 0.0
    if keys is not None:
        if bound < 2.0**62:
            out = np.zeros(int(cast(int, num_cells)), dtype=np.int64)
            np.add.at(out, keys.astype(np.int64), index)
            return [int(v) for v in out]
        sums = [0] * int(cast(int, num_cells))
        for k, v in zip(keys.tolist(), index.tolist()):
            sums[k] += v
        return sums
    columns = index if index.ndim == 2 else index.reshape(-1, 1)  # one column per cell (an empty 1-D: one cell)
    if bound < 2.0**62:
        return [int(v) for v in columns.sum(axis=0, dtype=np.int64)]
    return [sum(col.tolist()) for col in columns.T]


def _grid_total(sums, noise, gamma):
    """gamma * (sums + noise) as float64, refused (SamplerError) unless every cell is an integer below 2^53: float64
    then holds it, and its product with the power of two gamma, exactly."""
    total = [int(s_) + int(y) for s_, y in zip(sums, noise.tolist())]
    if any(abs(v) >= 2**53 for v in total):
        raise SamplerError("grid release: a sum is too large for its grid (|sum| / gamma must stay below 2^53)")
    return np.array(total, dtype=np.float64) * gamma


def grid_laplace_sum(
    records: npt.ArrayLike,
    sensitivity: float,
    epsilon: float,
    rng: RngLike = None,
    cells: int = 1,
    keys: npt.ArrayLike | None = None,
    num_cells: int | None = None,
) -> np.ndarray:
    """``grid_laplace`` of the sums of ``records`` (``grid_sums``' shapes), summed exactly on the grid.

    Mechanism: (gamma, t) = grid_laplace_params(sensitivity, epsilon, cells); each cell's release is
    gamma * (sum_i r(v_i / gamma) + Y), the integers summed exactly (``grid_sums``), Y iid discrete Laplace(t).
    Sensitivity: ``sensitivity`` Delta bounds the L1 norm of one record's contribution (its row, or its one keyed
    value), ``cells`` k how many cells it touches. Guarantee: (epsilon, 0)-DP, exactly, and with no float sum in
    between: adding or removing record i changes the integer sums by r(v_i / gamma) alone, and |r(a)| <=
    ceil(|a|) (Lemma G with b = 0), so by at most floor(Delta / gamma) + k in L1: the D of ``grid_laplace``'s
    proof. A float64 sum of the records first (``grid_laplace(np.sum(...))``) has rounding that depends on the
    other records and their order, so two neighbouring inputs may round beyond that integer bound.
    """
    gamma, t = grid_laplace_params(sensitivity, epsilon, cells)
    sums = grid_sums(records, gamma, keys, num_cells)
    return _grid_total(sums, discrete_laplace(t, (len(sums),), as_secure_rng(rng)), gamma)


def grid_gaussian_sum(
    records: npt.ArrayLike,
    l2_sensitivity: float,
    sigma: float,
    rng: RngLike = None,
    cells: int = 1,
    keys: npt.ArrayLike | None = None,
    num_cells: int | None = None,
) -> np.ndarray:
    """``grid_gaussian`` of the sums of ``records`` (``grid_sums``' shapes), summed exactly on the grid.

    As ``grid_laplace_sum``: gamma * (sum_i r(v_i / gamma) + Y), Y iid N_Z(0, S) for (gamma, S) =
    grid_gaussian_params(l2_sensitivity, sigma, cells). One record changes the integer sums by its own grid vector,
    of L2 norm <= Delta_2 / gamma + sqrt(k) (|r(a)| <= |a| + 1 per cell, the triangle inequality): the D2 of
    ``grid_gaussian``'s proof, so the release is rho-zCDP, rho = Delta_2^2 / (2 sigma^2), exactly.
    """
    gamma, s = grid_gaussian_params(l2_sensitivity, sigma, cells)
    sums = grid_sums(records, gamma, keys, num_cells)
    return _grid_total(sums, discrete_gaussian(s, (len(sums),), as_secure_rng(rng)), gamma)


def grid_laplace_pair(records: npt.ArrayLike, bound: float, epsilon: float, rng: RngLike = None) -> tuple[float, float]:
    """(S~, S'~): the sums of ``records`` (each in [0, bound]) and of bound minus them, as ONE epsilon-DP grid
    release of the pair, summed exactly on the grid.

    Mechanism: (gamma, t) = grid_laplace_params(bound, epsilon, 2), R = r(bound / gamma); record i contributes
    the integer pair (r(v_i / gamma), R - r(v_i / gamma)), both in [0, R] (r is non-decreasing); the release is
    gamma * (sum of the pairs + (Y1, Y2)), Y iid discrete Laplace(t), the integers summed exactly. Guarantee:
    (epsilon, 0)-DP, exactly: one record changes the integer pair by its own pair, of L1 norm R <= floor(bound /
    gamma) + 1, within the D = floor(bound / gamma) + 2 ``grid_laplace``'s proof allows for two cells.
    """
    gamma, t = grid_laplace_params(bound, epsilon, 2)
    values = np.asarray(records, dtype=np.float64).ravel()
    if values.size and (values.min() < 0 or values.max() > bound):
        raise SamplerError(f"grid pair: records must lie in [0, {bound!r}]")
    (total,) = grid_sums(values, gamma)
    top = int(_grid_index(np.array([float(bound)]), gamma)[0])
    return tuple(
        _grid_total([total, top * values.size - total], discrete_laplace(t, (2,), as_secure_rng(rng)), gamma).tolist()
    )
