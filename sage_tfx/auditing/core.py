"""Empirical privacy auditing: a high-confidence LOWER bound on a mechanism's epsilon from its outputs.

numpy and scipy only. The black-box distinguisher of the auditing literature (Jagielski, Ullman, Oprea 2020;
Nasr et al. 2021; Lu et al. 2022): run the mechanism on D and on a neighbour D' with fresh seeds, choose a
threshold test on one half of the runs and bound its error rates on the other half by Clopper-Pearson. Contract:
for an (epsilon, delta)-DP mechanism, P(epsilon_lb > epsilon) <= 1 - confidence; a result above the claim is a
violation at that confidence, a result below it proves nothing.

The method, the bound and its confidence: docs/privacy_auditing.md ("The method", "Limits").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import beta

from sage_tfx.privacy.errors import SageError

__all__ = [
    "AuditConfigError",
    "AuditConfig",
    "AuditResult",
    "Mechanism",
    "audit",
    "audit_outputs",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "trial_seeds",
]


class AuditConfigError(SageError, ValueError):
    """An audit parameter is out of range (raised before any run of the mechanism)."""


@dataclass(frozen=True)
class AuditConfig:
    """The parameters of one audit.

    Args:
        trials: runs of the mechanism on EACH of the two neighbouring data sets (>= 20; half select the test,
            half evaluate it).
        confidence: the probability, in (0, 1), with which the reported lower bound is below the true epsilon of
            a correct mechanism (e.g. 0.95).
        seed: the master seed: trial i's seed is a 63-bit integer drawn from ``numpy.random.SeedSequence(seed)``
            (``trial_seeds``), distinct for every run on either data set.
    """

    trials: int = 2000
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.trials, bool) or not isinstance(self.trials, (int, np.integer)) or self.trials < 20:
            raise AuditConfigError(
                f"trials {self.trials!r} must be an integer >= 20 (half select the test, half "
                "evaluate it): pass e.g. trials=2000"
            )
        if not isinstance(self.confidence, (int, float)) or not 0.0 < float(self.confidence) < 1.0:
            raise AuditConfigError(f"confidence {self.confidence!r} must be a number in (0, 1), e.g. 0.95")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise AuditConfigError(f"seed {self.seed!r} must be an integer >= 0")


@dataclass(frozen=True)
class Mechanism:
    """A mechanism to audit (a claimed epsilon <= 0 or delta outside [0, 1) raises ``AuditConfigError``).

    Args:
        name: what the result calls it.
        release: ``release(neighbour, seed)`` runs the real release once, on D (``neighbour=False``) or on
            D' = D plus one record (``neighbour=True``), with the integer ``seed``, and returns one scalar
            statistic of the output.
        epsilon: the epsilon it claims for that pair (> 0).
        delta: the delta it claims, in [0, 1).
        about: one line on what it runs.
    """

    name: str
    release: Callable[[bool, int], float]
    epsilon: float
    delta: float = 0.0
    about: str = ""

    def __post_init__(self):
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise AuditConfigError(f"mechanism {self.name!r}: claimed epsilon {self.epsilon!r} must be > 0")
        if not (isinstance(self.delta, (int, float)) and 0.0 <= self.delta < 1.0):
            raise AuditConfigError(f"mechanism {self.name!r}: claimed delta {self.delta!r} must be in [0, 1)")


class Verdict:
    """What every audit result shares (its fields ``mechanism``, ``claimed_epsilon``, ``claimed_delta``,
    ``epsilon_lower_bound``, ``confidence``, ``seed``): the verdict and the claim's part of ``to_dict``."""

    mechanism: str
    claimed_epsilon: float
    claimed_delta: float
    epsilon_lower_bound: float
    confidence: float
    seed: int

    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the claimed epsilon: a violation at ``confidence``."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    @property
    def ratio(self) -> float:
        """Empirical lower bound over the claim."""
        return self.epsilon_lower_bound / self.claimed_epsilon

    def _verdict_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "claimed_epsilon": self.claimed_epsilon,
            "claimed_delta": self.claimed_delta,
            "epsilon_lower_bound": self.epsilon_lower_bound,
            "ratio": self.ratio,
            "flagged": self.flagged,
            "confidence": self.confidence,
            "seed": self.seed,
        }


@dataclass
class AuditResult(Verdict):
    """One audit's outcome. ``flagged``: the lower bound exceeds the claimed epsilon (a violation at
    ``confidence``).

    Args:
        mechanism: the mechanism's name.
        claimed_epsilon: the epsilon it claims.
        claimed_delta: the delta it claims (subtracted in the bound).
        epsilon_lower_bound: the empirical lower bound at ``confidence``.
        confidence: the bound's confidence.
        trials: runs on each of D and D'.
        seed: the master seed of the trials.
        test: the chosen threshold test (``threshold``, ``direction`` +1 for s > t, -1 for s < t) and its
            evaluation counts and Clopper-Pearson upper bounds.
        outputs: the statistics, ``d`` (on D) and ``d_prime`` (on D'), in trial order.
    """

    mechanism: str
    claimed_epsilon: float
    claimed_delta: float
    epsilon_lower_bound: float
    confidence: float
    trials: int
    seed: int
    test: dict[str, Any]
    outputs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        return f"{self.trials} trials per data set"

    def to_dict(self) -> dict[str, Any]:
        return {**self._verdict_dict(), "trials": self.trials, "test": dict(self.test)}


def trial_seeds(seed: int, count: int) -> list:
    """``count`` distinct-in-practice 63-bit seeds from ``numpy.random.SeedSequence(seed)``.

    Args:
        seed: the master seed (an integer >= 0).
        count: how many seeds.
    """
    state = np.random.SeedSequence(seed).generate_state(count, np.uint64)
    return [int(s >> np.uint64(1)) for s in state]


def clopper_pearson_upper(k, n, alpha):
    """One-sided Clopper-Pearson upper bound on a binomial rate from k successes in n trials: P(rate > bound) <=
    alpha. Vectorised over k.

    Args:
        k: the successes (a number or an array).
        n: the trials.
        alpha: the level: the bound is below the true rate with probability at most ``alpha``.
    """
    k = np.asarray(k, dtype=np.float64)
    upper = beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, upper)


def epsilon_lower_bound(fpr_upper, fnr_upper, delta=0.0):
    """max(log((1 - delta - FNR_u) / FPR_u), log((1 - delta - FPR_u) / FNR_u), 0), vectorised (see the module
    docstring for why it holds).

    Args:
        fpr_upper: FPR_u, an upper bound on the test's false positive rate (on D).
        fnr_upper: FNR_u, an upper bound on its false negative rate (on D').
        delta: the claimed delta.
    """
    fpr_upper, fnr_upper = np.asarray(fpr_upper, dtype=np.float64), np.asarray(fnr_upper, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.log(np.maximum(1.0 - delta - fnr_upper, 0.0) / fpr_upper)
        two = np.log(np.maximum(1.0 - delta - fpr_upper, 0.0) / fnr_upper)
    return np.maximum(np.nan_to_num(np.maximum(one, two), nan=0.0, neginf=0.0), 0.0)


def _rates(d, d_prime, thresholds, direction):
    """False positives (D said D') and false negatives (D' said D) of "say D' iff direction * s > direction * t"."""
    a, b = np.sort(direction * d), np.sort(direction * d_prime)
    t = direction * thresholds
    fp = a.size - np.searchsorted(a, t, side="right")
    fn = np.searchsorted(b, t, side="right")
    return fp, fn


def _select(d, d_prime, alpha, delta):
    """The threshold test with the largest bound on the selection half: (threshold, direction).

    The bound here is taken at ``alpha`` divided by the number of tests tried (Bonferroni over them): a test in
    a tail, where a few lucky counts look good, is not preferred to one that holds up on fresh samples. Only the
    choice depends on it; the reported bound is the evaluation half's."""
    pooled = np.unique(np.concatenate([d, d_prime]))
    if pooled.size > 512:
        pooled = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, 512)))
    alpha = alpha / (2 * pooled.size)
    best = (-1.0, float(pooled[0]), 1)
    for direction in (1, -1):
        fp, fn = _rates(d, d_prime, pooled, direction)
        bounds = epsilon_lower_bound(
            clopper_pearson_upper(fp, d.size, alpha), clopper_pearson_upper(fn, d_prime.size, alpha), delta
        )
        i = int(np.argmax(bounds))
        if bounds[i] > best[0]:
            best = (float(bounds[i]), float(pooled[i]), direction)
    return best[1], best[2]


def audit(mechanism: Mechanism, config: AuditConfig | None = None) -> AuditResult:
    """Audit ``mechanism``: ``config.trials`` runs on each neighbour with fresh seeds, the best threshold test
    chosen on one half, its epsilon lower bound (module docstring) at ``config.confidence`` on the other.

    For a mechanism that is (epsilon, delta)-DP as claimed, the returned bound exceeds the claim with probability
    at most 1 - confidence (over the trial seeds).

    Args:
        mechanism: the release and its claim.
        config: trials, confidence and master seed (default ``AuditConfig()``).
    """
    config = config or AuditConfig()
    seeds = trial_seeds(config.seed, 2 * config.trials)
    d = np.array([float(mechanism.release(False, s)) for s in seeds[: config.trials]])
    d_prime = np.array([float(mechanism.release(True, s)) for s in seeds[config.trials :]])
    return audit_outputs(mechanism.name, d, d_prime, mechanism.epsilon, mechanism.delta, config)


def audit_outputs(name: str, d, d_prime, epsilon: float, delta: float, config: AuditConfig) -> AuditResult:
    """The bound of ``audit`` from given statistics: ``d`` of independent runs on D, ``d_prime`` on D' (the same
    number of each, ``config.trials``, every run with its own randomness), for a release claiming (``epsilon``,
    ``delta``).

    Args:
        name: the mechanism's name in the result.
        d: the statistics of the runs on D.
        d_prime: the statistics of the runs on D'.
        epsilon: the claimed epsilon.
        delta: the claimed delta.
        config: ``trials`` (the length of each array), confidence and seed.
    """
    d, d_prime = np.asarray(d, dtype=np.float64), np.asarray(d_prime, dtype=np.float64)
    if d.shape != (config.trials,) or d_prime.shape != (config.trials,):
        raise AuditConfigError(f"{name!r}: {d.size} and {d_prime.size} statistics for {config.trials} trials a side")
    if not (np.all(np.isfinite(d)) and np.all(np.isfinite(d_prime))):
        raise AuditConfigError(
            f"mechanism {name!r} returned a non-finite statistic: its release must return one finite float"
        )
    alpha = (1.0 - config.confidence) / 2.0
    half = config.trials // 2
    threshold, direction = _select(d[:half], d_prime[:half], alpha, delta)
    fp, fn = _rates(d[half:], d_prime[half:], np.array([threshold]), direction)
    n, m = d.size - half, d_prime.size - half
    fpr_u = float(clopper_pearson_upper(fp, n, alpha)[0])
    fnr_u = float(clopper_pearson_upper(fn, m, alpha)[0])
    bound = float(epsilon_lower_bound(fpr_u, fnr_u, delta))
    test = {
        "threshold": threshold,
        "direction": direction,
        "false_positives": int(fp[0]),
        "negatives": n,
        "false_negatives": int(fn[0]),
        "positives": m,
        "fpr_upper": fpr_u,
        "fnr_upper": fnr_u,
        "selection_trials": half,
    }
    return AuditResult(
        name,
        float(epsilon),
        float(delta),
        bound,
        float(config.confidence),
        int(config.trials),
        int(config.seed),
        test,
        {"d": d, "d_prime": d_prime},
    )
