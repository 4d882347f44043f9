"""The exact discrete samplers and grid releases (sage_tfx.privacy.samplers; numpy only, fast).

Statistical tests use fixed seeds (so they are deterministic); each states the false-failure rate it would
have for a random seed. Chi-square tests pass at p > 1e-6 (false failure <= 1e-6, asymptotically); mean and
frequency checks use 6 standard errors (false failure < 2e-9 by the normal approximation).
"""

import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from sage_tfx.privacy import randomness as R
from sage_tfx.privacy import samplers as S

P_MIN = 1e-6


def _chi_square_p(draws, support, pmf):
    """p-value of the chi-square test of integer draws against pmf on ``support`` plus one bin for the rest."""
    observed = np.array([(draws == k).sum() for k in support], dtype=float)
    expected = np.asarray(pmf, dtype=float) * draws.size
    rest_obs, rest_exp = draws.size - observed.sum(), draws.size - expected.sum()
    observed, expected = np.append(observed, rest_obs), np.append(expected, rest_exp)
    keep = expected > 5  # merge too-small bins into the rest
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    chi = ((obs - exp) ** 2 / exp).sum()
    return stats.chi2.sf(chi, obs.size - 1)


def _dlap_pmf(t, ks):
    q = math.exp(-1.0 / t)
    return (1 - q) / (1 + q) * q ** np.abs(ks)


@pytest.mark.parametrize(
    "t,n,batch", [(3, 200_000, 200_000), (3, 20_000, 10), (1, 50_000, 50_000), (40, 100_000, 100_000)]
)
def test_discrete_laplace_matches_its_pmf(t, n, batch):
    """Vectorised (big batches) and scalar (batches <= 48) paths: chi-square vs the exact pmf, mean and variance."""
    rng = R.secure_rng(11, f"dlap{t}/{batch}")
    draws = np.concatenate([S.discrete_laplace(t, batch, rng) for _ in range(n // batch)])
    ks = np.arange(-8 * t, 8 * t + 1)
    assert _chi_square_p(draws, ks, _dlap_pmf(t, ks)) > P_MIN
    q = math.exp(-1.0 / t)
    var = 2 * q / (1 - q) ** 2
    assert abs(draws.mean()) < 6 * math.sqrt(var / n)
    # variance: se of the sample variance ~ sqrt((m4 - var^2) / n); m4 <= 6 var^2 + var for the discrete Laplace
    assert abs(draws.var() - var) < 6 * math.sqrt((6 * var**2 + var) / n)


@pytest.mark.parametrize("s,batch", [(10, 100_000), (10, 7), (2000, 100_000), (2**29 + 12345, 50_000)])
def test_discrete_gaussian_matches_its_pmf(s, batch):
    """Small and large variance parameters (2^29: the int64 limits of the vectorised acceptance and its Python-int
    path for the rare |Y| t >= 2^31), vectorised and scalar paths: chi-square vs the exact pmf, mean, variance."""
    n = 100_000 if batch > 24 else 21_000
    rng = R.secure_rng(12, f"dgauss{s}/{batch}")
    draws = np.concatenate([S.discrete_gaussian(s, batch, rng) for _ in range(max(1, n // batch))])
    width = int(12 * math.sqrt(s)) + 2
    if s > 10**6:  # bin the wide support: 200 equal-probability-ish bins of the continuous approximation
        edges = np.unique(np.round(stats.norm.ppf(np.linspace(0, 1, 201)[1:-1]) * math.sqrt(s)).astype(np.int64))
        ks_all = np.arange(-width, width + 1)
        w = np.exp(-(ks_all.astype(float) ** 2) / (2 * s))
        pmf_all = w / w.sum()
        bins_exp = np.add.reduceat(pmf_all, np.searchsorted(ks_all, np.concatenate([[-width], edges])))
        obs = np.bincount(np.searchsorted(edges, draws, side="right"), minlength=bins_exp.size)
        chi = ((obs - bins_exp * draws.size) ** 2 / (bins_exp * draws.size)).sum()
        assert stats.chi2.sf(chi, bins_exp.size - 1) > P_MIN
        var = float((pmf_all * ks_all.astype(float) ** 2).sum())
        assert abs(draws.mean()) < 6 * math.sqrt(var / draws.size)
        assert abs(draws.var() - var) < 6 * math.sqrt(2.5 * var**2 / draws.size)
        return
    ks = np.arange(-width, width + 1)
    weights = np.exp(-(ks.astype(float) ** 2) / (2 * s))
    pmf = weights / weights.sum()  # the mass beyond 12 sigma is < 1e-30: normalising on ks is exact enough
    assert _chi_square_p(draws, ks, pmf) > P_MIN
    var = float((pmf * ks**2).sum())
    assert var <= s  # CKS Prop. 19: the discrete Gaussian's variance is below its parameter
    assert abs(draws.mean()) < 6 * math.sqrt(var / draws.size)
    assert abs(draws.var() - var) < 6 * math.sqrt(2.5 * var**2 / draws.size)  # kurtosis ~3: se ~ var sqrt(2/n)


@pytest.mark.parametrize("num,den", [(3, 10), (3, 2), (0, 5), (7, 1)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(num, den):
    n = 200_000
    rng = R.secure_rng(13, f"bern{num}/{den}")
    p = math.exp(-num / den)
    vec = S.bernoulli_exp(np.full(n, num), np.full(n, den), rng)
    scalar = np.array([S._bernoulli_exp_scalar(num, den, rng) for _ in range(20_000)])
    for draws in (vec, scalar):
        se = math.sqrt(p * (1 - p) / draws.size)
        assert abs(draws.mean() - p) <= 6 * se + (1e-12 if p in (0.0, 1.0) else 0.0)


def test_uniform_below_is_uniform_for_32_and_64_bit_bounds():
    rng = R.secure_rng(14, "uniform")
    for m in (7, 3 * 2**40 + 1):
        draws = rng.uniform_below(np.full(70_000, m, dtype=np.int64))
        assert draws.min() >= 0 and draws.max() < m
        cells = (draws * 7 // m) if m == 7 else (draws // (m // 7 + 1))
        counts = np.bincount(cells, minlength=7)
        expected = np.full(7, draws.size / 7) if m == 7 else None
        if expected is None:  # cells of size m//7+1, the last one smaller
            size = m // 7 + 1
            expected = np.array([size] * 6 + [m - 6 * size]) / m * draws.size
        assert stats.chisquare(counts, expected).pvalue > P_MIN
    assert all(0 <= rng.randbelow(5) < 5 for _ in range(100))


# ---------------------------------------------------------------- grid releases: privacy arithmetic


@pytest.mark.parametrize(
    "delta,epsilon,cells",
    [(1.0, 1.0, 1), (1.0, 0.01, 1), (7.3, 0.35, 1), (2.0, 5.0, 3), (0.25, 1e-4, 100), (1e6, 0.7, 1)],
)
def test_grid_laplace_parameters_give_exactly_epsilon(delta, epsilon, cells):
    gamma, t = S.grid_laplace_params(delta, epsilon, cells)
    assert math.frexp(gamma)[0] == 0.5  # a power of two
    b = delta / epsilon
    assert gamma <= min(b, delta / cells) / 2**20
    units = math.floor(delta / gamma) + cells  # Lemma G: the grid sensitivity
    assert Fraction(units, t) <= Fraction(epsilon)  # exactly epsilon-DP (the discrete Laplace's ratio bound)
    assert b <= gamma * t <= b * (1 + 2**-20) + gamma  # the noise scale as stated


def test_rounding_moves_a_change_of_d_by_at_most_ceil_d_grid_units():
    """Lemma G on random pairs: |r(x/g) - r(x'/g)| <= ceil(|x - x'|/g), including ties at +-1/2."""
    rng = np.random.default_rng(15)
    gamma = 2.0**-6
    x = np.concatenate([rng.uniform(-1e3, 1e3, 50_000), (np.arange(-200, 200) + 0.5) * gamma])
    d = np.concatenate([rng.uniform(-3, 3, 50_000), rng.uniform(-3, 3, 400)]) * gamma
    d[:100] = np.round(d[:100] / gamma) * gamma  # some exact multiples of the grid
    a, b = S._grid_index(x, gamma), S._grid_index(x + d, gamma)
    assert np.all(np.abs(a - b) <= np.ceil(np.abs(d) / gamma))
    assert np.all(np.abs(a * gamma - x) <= gamma / 2)


def test_grid_releases_lie_on_the_grid():
    rng = R.secure_rng(16, "grid")
    values = np.random.default_rng(16).uniform(-50, 50, 1000)
    for sens, eps, cells in ((1.0, 0.5, 1), (3.7, 0.1, 1), (1.0, 2.0, 4)):
        gamma, _ = S.grid_laplace_params(sens, eps, cells)
        out = S.grid_laplace(values, sens, eps, rng, cells=cells)
        assert np.array_equal(out / gamma, np.round(out / gamma))
    gamma, _ = S.grid_gaussian_params(1.0, 3.0)
    out = S.grid_gaussian(values, 1.0, 3.0, rng)
    assert np.array_equal(out / gamma, np.round(out / gamma))


def test_mironov_attack_no_longer_separates_0_from_1():
    """Mironov 2012: float Laplace releases of 1 are often impossible from 0. Here every release of 0 and of 1
    (add_laplace at scale 1, sensitivity 1, 20,000 each) lies on the same grid gamma Z, and every grid point has
    positive probability from both inputs; the exact log-likelihood ratio of every observed release is within
    epsilon = 1 (computed with integers: it is (|v - r(1)| - |v - r(0)|) / t in grid units)."""
    from sage_tfx.transform.noise import add_laplace

    zeros = add_laplace([np.zeros(20_000)], [1.0], seed=17, stream="m0", sensitivities=[1.0], cells=[1])[0]
    ones = add_laplace([np.ones(20_000)], [1.0], seed=17, stream="m1", sensitivities=[1.0], cells=[1])[0]
    gamma, t = S.grid_laplace_params(1.0, math.nextafter(1.0, 0.0), 1)
    for release in (zeros, ones):
        units = release / gamma
        assert np.array_equal(units, np.round(units))  # on the grid: possible from 0 and from 1 alike
        v = units.astype(np.int64)
        llr = np.abs(np.abs(v - int(1 / gamma)) - np.abs(v)) / t
        assert llr.max() <= 1.0
    # and the two releases really are noisy versions of 0 and 1 (scale ~1: means within 6 se of 0 and 1)
    assert abs(zeros.mean()) < 6 * math.sqrt(2 / 20_000) and abs(ones.mean() - 1) < 6 * math.sqrt(2 / 20_000)


def test_grid_laplace_tails_follow_the_coupling():
    """In law release = x + Lap(scale) + xi, |xi| <= slack: P(|release - x| > scale ln(1/p) + slack) <= p.
    p = 0.01 on 100,000 draws: at most 1000 + 6 se (~60) exceed it (false failure < 1e-9)."""
    scale, slack = S.grid_laplace_coupling(1.0, 0.8)
    x = np.full(100_000, 0.3)
    err = np.abs(S.grid_laplace(x, 1.0, 0.8, R.secure_rng(18, "tail")) - x)
    assert (err > scale * math.log(100) + slack).sum() <= 1000 + 6 * math.sqrt(100_000 * 0.01 * 0.99)
    # the std of the release is the Laplace scale's sqrt(2) b' (rounding and discreteness change it by < 1e-3)
    assert abs(err.std() ** 2 + err.mean() ** 2 - 2 * scale**2) < 6 * math.sqrt(20 * scale**4 / x.size)


def test_grid_gaussian_parameters_keep_rho():
    for d2, sigma, cells in ((1.0, 3.0, 1), (1.0, 0.2, 1), (2.0, 50.0, 9), (0.5, 4.0, 100)):
        gamma, s = S.grid_gaussian_params(d2, sigma, cells)
        assert math.frexp(gamma)[0] == 0.5
        grid_sens = Fraction(d2) / Fraction(gamma) + Fraction(math.ceil(math.sqrt(cells) * 2**20) + 1, 2**20)
        # rho of the grid release (grid_sens^2 / 2S) is at most Delta_2^2 / (2 sigma^2)
        assert grid_sens**2 / (2 * s) <= Fraction(d2) ** 2 / (2 * Fraction(sigma) ** 2)
    # AdaSSP's X'X release on 46 features (1,081 cells) at multiplier 7: the grid's rounding inflates sigma by < 1%
    gamma, s = S.grid_gaussian_params(1.0, 7.0, 46 * 47 // 2)
    assert 49.0 <= gamma**2 * s <= 49.0 * 1.01**2
    values = np.zeros(50_000)
    out = S.grid_gaussian(values, 1.0, 3.0, R.secure_rng(19, "g"))
    gamma, s = S.grid_gaussian_params(1.0, 3.0)
    assert 9.0 <= gamma**2 * s <= 9.0 * 1.01  # the stated sigma, inflated by < 1%
    assert abs(out.var() / (gamma**2 * s) - 1) < 6 * math.sqrt(2 / values.size)


# ---------------------------------------------------------------- the generator


def test_generator_is_reproducible_from_seed_and_stream_and_fresh_without_seed():
    a = S.grid_laplace(np.zeros(50), 1.0, 1.0, R.secure_rng(5, "a"))
    assert np.array_equal(a, S.grid_laplace(np.zeros(50), 1.0, 1.0, R.secure_rng(5, "a")))
    assert not np.array_equal(a, S.grid_laplace(np.zeros(50), 1.0, 1.0, R.secure_rng(5, "b")))
    assert not np.array_equal(a, S.grid_laplace(np.zeros(50), 1.0, 1.0, R.secure_rng(6, "a")))
    assert not np.array_equal(R.secure_rng(None).words(4), R.secure_rng(None).words(4))
    # a numpy Generator keys it with 32 of its bytes: reproducible for a seeded Generator
    g1 = R.as_secure_rng(np.random.default_rng(3), "v").words(8)
    assert np.array_equal(g1, R.as_secure_rng(np.random.default_rng(3), "v").words(8))
    with pytest.raises(ValueError):
        R.secure_rng(-1)
    with pytest.raises(ValueError):
        R.as_secure_rng("seed")


def test_streams_are_independent():
    """Two stream names of one seed: the correlation of 100,000 paired draws is within 6/sqrt(n) of 0, and the
    raw words agree no more than chance (each of 64 bits equal w.p. 1/2)."""
    n = 100_000
    a = S.discrete_laplace(5, n, R.secure_rng(21, "x/")).astype(float)
    b = S.discrete_laplace(5, n, R.secure_rng(21, "y/")).astype(float)
    assert abs(np.corrcoef(a, b)[0, 1]) < 6 / math.sqrt(n)
    wa, wb = R.secure_rng(21, "x/").words(4096), R.secure_rng(21, "y/").words(4096)
    same_bits = np.unpackbits((~(wa ^ wb)).view(np.uint8)).mean()
    assert abs(same_bits - 0.5) < 6 * math.sqrt(0.25 / (4096 * 64))


def test_the_vocabulary_threshold_is_never_below_the_float_formula():
    from sage_tfx.transform.vocabulary import threshold

    for eps, delta, m in ((1.0, 1e-6, 1), (0.5, 1e-5, 2), (0.01, 1e-9, 5)):
        old = m + (m / eps) * math.log(m / (2 * delta))
        assert old <= threshold(eps, delta, m) <= old * (1 + 1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        S.grid_laplace([float("nan")], 1.0, 1.0, 0)
    with pytest.raises(ValueError):
        S.grid_laplace([1e300], 1.0, 1.0, 0)  # beyond 2^52 grid steps
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            S.grid_laplace_params(bad, 1.0)
        with pytest.raises(ValueError):
            S.grid_laplace_params(1.0, bad)
    with pytest.raises(ValueError):
        S.grid_laplace_params(1.0, 1.0, cells=0)
    with pytest.raises(ValueError):
        S.discrete_laplace(0, 3, 0)
    with pytest.raises(ValueError):
        S.discrete_gaussian(2**30, 3, 0)


def test_the_privacy_core_imports_without_tensorflow():

    code = (
        "import sys; import sage_tfx.privacy.samplers, sage_tfx.transform.noise; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_grid_gaussian_refuses_more_noise_than_its_int64_sampler_holds_naming_the_values():
    from sage_tfx.privacy.randomness import SamplerError
    from sage_tfx.privacy.samplers import grid_gaussian_params

    gamma, s = grid_gaussian_params(1.0, 30000.0)  # just inside: sigma / sensitivity < 2^15
    assert s < 2**30 and gamma > 0
    with pytest.raises(SamplerError, match=r"sigma 100000.0 is 1e\+05 times the L2 sensitivity 1.0 over 1 cell"):
        grid_gaussian_params(1.0, 1e5)  # was an OverflowError from a grid doubled to infinity
    with pytest.raises(SamplerError, match="over 4 cell"):
        grid_gaussian_params(1.0, 20000.0, cells=4)  # sqrt(cells) counts: 40,000 > 32,768
