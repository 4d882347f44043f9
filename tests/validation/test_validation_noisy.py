"""The joint noise-and-sample tests (sage_tfx.validation.noisy), the validators' default bounds.

Fixed seeds; every statistical check is a one-sided binomial or KS test at level ALPHA = 1e-3 (see
test_validation.py), so a correct implementation fails each with probability at most 1e-3.
"""

import math

import numpy as np
import pytest
from scipy import stats

from sage_tfx.validation import DPAccuracyValidator, DPLossValidator, Mode, Outcome
from sage_tfx.validation.noisy import (
    binomial_tail,
    chernoff_tail,
    laplace_pair_quantile,
    laplace_pair_sf,
    noise_sf,
    release_pair,
)
from tests.validation.test_validation import ALPHA, assert_rate_at_least, assert_rate_at_most, bernoulli_losses


def _within(observed, trials, probability, what):
    """Two-sided binomial check that a Monte Carlo frequency matches an exact probability."""
    count = round(observed * trials)
    p_value = 2 * min(stats.binom.cdf(count, trials, probability), stats.binom.sf(count - 1, trials, probability))
    assert p_value >= ALPHA, f"{what}: observed {observed:.5f}, exact {probability:.5f} (p = {p_value:.1e})"


# ------------------------------------------------------------------ the noise law and the exact tails


@pytest.mark.parametrize("a, c", [(0.9, 0.1), (0.5, 0.5), (2.0, 0.0), (1.0, 1.0 - 1e-8)])
def test_noise_sf_is_the_law_of_a_difference_of_laplaces(a, c):
    rng = np.random.default_rng(1)
    draws = a * rng.laplace(size=200_000) - c * rng.laplace(size=200_000)
    assert stats.kstest(draws, lambda z: 1.0 - noise_sf(z, a, c)).pvalue > ALPHA
    assert noise_sf(0.0, a, c) == pytest.approx(0.5)


def test_laplace_pair_tail_and_quantile():
    rng = np.random.default_rng(2)
    pair = rng.laplace(size=400_000) + rng.laplace(size=400_000)
    for u in (0.5, 3.0, 6.0):
        _within(np.mean(pair > u), pair.size, laplace_pair_sf(u), f"P(E1 + E2 > {u})")
    for prob in (0.01, 0.0025):
        assert laplace_pair_sf(laplace_pair_quantile(prob, two_sided=False)) == pytest.approx(prob, rel=1e-9)
        _within(
            np.mean(np.abs(pair) > laplace_pair_quantile(prob, two_sided=True)),
            pair.size,
            prob,
            f"two-sided quantile at {prob}",
        )


def test_binomial_tail_is_exact():
    rng = np.random.default_rng(3)
    n, tau, eps = 300, 0.15, 0.8
    a, c = (1 - tau) / eps, tau / eps
    trials = 400_000
    statistic = rng.binomial(n, tau, trials) - tau * n + a * rng.laplace(size=trials) - c * rng.laplace(size=trials)
    for t in (-12.0, -5.0, 0.0, 6.0, 14.0):
        _within(np.mean(statistic <= t), trials, binomial_tail(t, n, tau, a, c, -1), f"P(T~ <= {t})")
        _within(np.mean(statistic >= t), trials, binomial_tail(t, n, tau, a, c, +1), f"P(T~ >= {t})")
    # over several counts it is the largest of the single-count tails
    single = [binomial_tail(-5.0, m, tau, a, c, -1) for m in range(290, 311)]
    assert binomial_tail(-5.0, np.arange(290, 311), tau, a, c, -1) == pytest.approx(max(single), rel=1e-12)


@pytest.mark.parametrize("law", ["bernoulli", "uniform", "beta"])
def test_chernoff_tail_bounds_the_true_tail(law):
    """The Chernoff p-value is an upper bound on the tail for any law on [0, B] with mean tau."""
    rng = np.random.default_rng(4)
    n, bound, tau, eps, trials = 400, 2.0, 0.3, 1.0, 100_000
    draw = {
        "bernoulli": lambda: bound * (rng.random((trials, n)) < tau / bound),
        "uniform": lambda: rng.uniform(0, 2 * tau, (trials, n)),
        "beta": lambda: bound * rng.beta(1.0, bound / tau - 1.0, (trials, n)),
    }[law]
    values = draw()
    a, c = (bound - tau) / eps, tau / eps
    statistic = values.sum(axis=1) - tau * n + a * rng.laplace(size=trials) - c * rng.laplace(size=trials)
    for t in (-30.0, -15.0, 15.0, 30.0):
        side = -1 if t < 0 else 1
        observed = np.mean(statistic <= t) if side < 0 else np.mean(statistic >= t)
        bound_value = chernoff_tail(t, n, tau, bound, a, c, side)
        assert_rate_at_most(round(observed * trials), trials, bound_value, f"Chernoff {law} at t={t}")


# ------------------------------------------------------------------ the release


@pytest.mark.slow(weight=20)
def test_release_pair_noise_is_laplace_b_over_eps_on_each_sum():
    rng = np.random.default_rng(5)
    eps, bound = 0.7, 3.0
    values = np.array([0.5, 10.0, 2.0, 0.0])  # clipped: 0.5, 3, 2, 0
    s_exact, c_exact = 5.5, 4 * bound - 5.5
    pairs = [release_pair(values, bound, eps, rng, Mode.SAGE) for _ in range(3000)]
    s_noise = np.array([s.value for s, _ in pairs]) - s_exact
    c_noise = np.array([c.value for _, c in pairs]) - c_exact
    for noise in (s_noise, c_noise):
        assert stats.kstest(noise, stats.laplace(scale=bound / eps).cdf).pvalue > ALPHA
        assert stats.kstest(noise, stats.laplace(scale=2 * bound / eps).cdf).pvalue < ALPHA
    assert abs(np.corrcoef(s_noise, c_noise)[0, 1]) < 0.1
    exact = release_pair(values, bound, None, rng, Mode.NON_PRIVATE)
    assert (exact[0].value, exact[1].value, exact[0].scale) == (s_exact, c_exact, 0.0)


@pytest.mark.slow(weight=20)
def test_accuracy_release_is_error_and_correct_counts_with_lap_one_over_eps():
    rng = np.random.default_rng(6)
    eps = 0.5
    v = DPAccuracyValidator(0.5, eps)
    correct = np.array([1.0] * 30 + [0.0] * 10)
    results = [v.validate(correct, rng=rng) for _ in range(3000)]
    correct_noise = np.array([r.details["correct_noisy"] for r in results]) - 30
    error_noise = np.array([r.details["errors_noisy"] for r in results]) - 10
    for noise in (correct_noise, error_noise):
        assert stats.kstest(noise, stats.laplace(scale=1 / eps).cdf).pvalue > ALPHA


# ------------------------------------------------------------------ the SLA at the boundary, and sharpness


@pytest.mark.slow(weight=20)
@pytest.mark.parametrize("law", ["bernoulli", "uniform"])
def test_loss_default_false_accept_at_the_boundary(law):
    """True mean exactly at the target (the worst case of a miss): ACCEPT rate <= eta."""
    rng = np.random.default_rng(7)
    trials, n, target, eta, eps = 4000, 2000, 0.1, 0.1, 1.0
    draw = (lambda: bernoulli_losses(rng, n, target)) if law == "bernoulli" else (lambda: rng.uniform(0, 2 * target, n))
    v = DPLossValidator(target, eps, 1 - eta)
    accepts = sum(v.validate(draw(), rng=rng).accepted for _ in range(trials))
    assert_rate_at_most(accepts, trials, eta, f"false ACCEPT at the boundary ({law})")


@pytest.mark.slow(weight=20)
def test_accuracy_default_is_sharp_at_the_boundary():
    """The exact test spends nearly its whole eta at p = target (not vacuous) and never more."""
    rng = np.random.default_rng(8)
    trials, n, target, eta, eps = 6000, 1500, 0.85, 0.1, 1.0
    v = DPAccuracyValidator(target, eps, 1 - eta)
    accepts = sum(v.validate((rng.random(n) < target).astype(float), rng=rng).accepted for _ in range(trials))
    assert_rate_at_most(accepts, trials, eta, "false ACCEPT at the boundary (accuracy, exact)")
    assert accepts > 0.6 * eta * trials


@pytest.mark.slow(weight=20)
def test_default_rejects_within_budget_at_the_boundary():
    # 1,000 trials a side (3,000 before; a validation costs ~3 ms here): the exact binomial test keeps its
    # false-failure probability at ALPHA = 1e-3 for any number of trials, and at 1,000 it fails from 131 REJECTs on:
    # a true rate 1.5 times the guarantee eta / 2 = 0.1 fails with probability 0.96, twice it with 1 - 4e-9
    # (scipy.stats.binom).
    rng = np.random.default_rng(9)
    trials, n, target, eta = 1000, 3000, 0.8, 0.2
    acc = DPAccuracyValidator(target, 1.0, 1 - eta)
    loss = DPLossValidator(0.2, 1.0, 1 - eta)
    acc_rejects = sum(
        acc.validate(np.zeros(5), (rng.random(n) < target).astype(float), rng=rng).outcome is Outcome.REJECT
        for _ in range(trials)
    )
    loss_rejects = sum(
        loss.validate(np.ones(5), bernoulli_losses(rng, n, 0.2), rng=rng).outcome is Outcome.REJECT
        for _ in range(trials)
    )
    assert_rate_at_most(acc_rejects, trials, eta / 2, "false REJECT at the boundary (accuracy)")
    assert_rate_at_most(loss_rejects, trials, eta / 2, "false REJECT at the boundary (loss)")


def test_reported_bound_agrees_with_the_decision():
    rng = np.random.default_rng(10)
    for _ in range(150):
        n = int(rng.integers(50, 20_000))
        eps = float(rng.choice([0.1, 0.5, 2.0]))
        p = float(rng.uniform(0.5, 0.95))
        target = float(np.clip(p + rng.normal(0, 0.03), 0.05, 0.99))
        r = DPAccuracyValidator(target, eps).validate((rng.random(n) < p).astype(float), rng=rng)
        assert (r.bounds["lower"] >= target) == r.accepted, (n, eps, p, target, r.bounds)
        mu = float(rng.uniform(0.01, 0.3))
        loss_target = float(np.clip(mu * rng.uniform(0.8, 1.4), 0.005, 0.9))
        r = DPLossValidator(loss_target, eps).validate(rng.uniform(0, 2 * mu, n), rng=rng)
        assert (r.bounds["upper"] <= loss_target) == r.accepted, (n, eps, mu, loss_target, r.bounds)


# ------------------------------------------------------------------ what the joint test buys: samples vs NP


@pytest.mark.slow(weight=20)
@pytest.mark.parametrize("task", ["accuracy", "loss"])
def test_sage_with_half_again_the_data_accepts_as_often_as_np(task):
    """At epsilon 1, the default Sage test on 1.5x the records ACCEPTs at least as often as the non-private
    test on 1x (the issue's sample-complexity goal, checked at the validator). Targets are where NP accepts
    about half the time."""
    rng = np.random.default_rng(11)
    trials = 600
    if task == "accuracy":
        p, n = 0.89, 800
        target = float(stats.beta.ppf(0.05, p * n, n - p * n + 1))  # NP's median lower bound at n

        def run(mode, eps, size):
            v = DPAccuracyValidator(target, eps, 0.95, mode=mode)
            return sum(v.validate((rng.random(size) < p).astype(float), rng=rng).accepted for _ in range(trials))
    else:
        mu, n = 0.03, 4000
        target = (
            DPLossValidator(0.5, None, 0.95, mode="non_private")
            .validate(bernoulli_losses(np.random.default_rng(0), n, mu))
            .bounds["upper"]
        )

        def run(mode, eps, size):
            v = DPLossValidator(target, eps, 0.95, mode=mode)
            return sum(v.validate(bernoulli_losses(rng, size, mu), rng=rng).accepted for _ in range(trials))

    np_accepts = run("non_private", None, n)
    sage_accepts = run("sage", 1.0, int(1.5 * n))
    assert 0.2 * trials < np_accepts < 0.8 * trials  # the target is where NP is undecided
    # one-sided two-proportion check: Sage's rate is not significantly below NP's
    pooled = (np_accepts + sage_accepts) / (2 * trials)
    z = (np_accepts - sage_accepts) / math.sqrt(2 * trials * pooled * (1 - pooled))
    assert z < stats.norm.isf(ALPHA), f"{task}: Sage {sage_accepts} vs NP {np_accepts} of {trials}"
    assert_rate_at_least(sage_accepts, trials, 0.2, f"{task}: Sage accepts at 1.5x")
