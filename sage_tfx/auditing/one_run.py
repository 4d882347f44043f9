"""The statistical core of one-run auditing (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training
Run", NeurIPS 2023): numpy and scipy only.

m canaries, each in with probability 1/2, one run, r guesses of which W are right. ``one_run_p_value`` is the
bound of their approximate-DP theorem (Theorem 5.2) on P(W >= v); ``one_run_epsilon_lower_bound`` is the largest
epsilon (to 1e-6) whose p-value for the observed W is below 1 - confidence. Contract: P(epsilon_lb > epsilon)
<= 1 - confidence for an (epsilon, delta)-DP mechanism, if the guessing rule is fixed before the output is seen
(``guesses_from_scores``: the k_plus highest scores in, the k_minus lowest out). DP-SGD driver: ``dpsgd``.

The theorem and the bound: docs/privacy_auditing.md ("One-run auditing").
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta, binom

from .core import AuditConfigError

__all__ = ["one_run_epsilon_lower_bound", "one_run_p_value", "guesses_from_scores"]


def _check_counts(correct, guesses, canaries):
    if not (
        isinstance(guesses, (int, np.integer)) and isinstance(correct, (int, np.integer)) and 0 <= correct <= guesses
    ):
        raise AuditConfigError(
            f"correct {correct!r} and guesses {guesses!r} must be integers with 0 <= correct <= guesses"
        )
    if canaries is not None and not (isinstance(canaries, (int, np.integer)) and canaries >= guesses):
        raise AuditConfigError(f"canaries {canaries!r} must be an integer >= the {guesses} guesses made")


def one_run_p_value(
    correct: int, guesses: int, epsilon: float, delta: float = 0.0, canaries: int | None = None
) -> float:
    """An upper bound on P(W >= ``correct``) for W the correct guesses among ``guesses`` made on ``canaries``
    canaries (default: as many as guesses) of an (``epsilon``, ``delta``)-DP mechanism (module docstring).

    Args:
        correct: W, the correct guesses.
        guesses: r, the guesses made.
        epsilon: the epsilon tested.
        delta: the delta tested.
        canaries: m, the canaries (>= guesses).
    """
    _check_counts(correct, guesses, canaries)
    m = guesses if canaries is None else int(canaries)
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(correct - 1, guesses, q))  # P(Binomial(r, q) >= v)
    if delta <= 0.0 or correct == 0:
        return min(tail, 1.0)
    below = np.cumsum(binom.pmf(correct - np.arange(1, correct + 1), guesses, q))  # P(v - i <= B < v), i = 1..v
    alpha = float(np.max(below / np.arange(1, correct + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def one_run_epsilon_lower_bound(
    correct: int, guesses: int, confidence: float = 0.95, *, delta: float = 0.0, canaries: int | None = None
) -> float:
    """epsilon_lb from ``correct`` right guesses out of ``guesses`` made on ``canaries`` canaries (module
    docstring): exceeds the epsilon of an (epsilon, ``delta``)-DP mechanism with probability at most
    1 - ``confidence``. ``delta`` = 0: the pure-DP bound (Clopper-Pearson).

    Args:
        correct: W, the correct guesses.
        guesses: r, the guesses made.
        confidence: in (0, 1).
        delta: the claimed delta; 0 gives the pure-DP bound.
        canaries: m, the canaries (>= guesses; default ``guesses``).
    """
    if not 0.0 < confidence < 1.0:
        raise AuditConfigError(f"confidence {confidence!r} must be a number in (0, 1), e.g. 0.95")
    if not (isinstance(delta, (int, float)) and 0.0 <= delta < 1.0):
        raise AuditConfigError(f"delta {delta!r} must be a number in [0, 1), e.g. 1e-5")
    _check_counts(correct, guesses, canaries)
    if correct == 0:
        return 0.0
    if delta == 0.0:
        p_lb = float(beta.ppf(1.0 - confidence, correct, guesses - correct + 1))
        if p_lb <= 0.5:
            return 0.0
        return math.log(p_lb / (1.0 - p_lb)) if p_lb < 1.0 else math.inf
    level = 1.0 - confidence
    if one_run_p_value(correct, guesses, 0.0, delta, canaries) >= level:
        return 0.0
    low, high = 0.0, 1.0  # p-value(low) < level <= p-value(high)
    while one_run_p_value(correct, guesses, high, delta, canaries) < level:
        low, high = high, 2.0 * high
        if high > 1e3:
            return math.inf
    while high - low > 1e-6:
        mid = 0.5 * (low + high)
        if one_run_p_value(correct, guesses, mid, delta, canaries) < level:
            low = mid
        else:
            high = mid
    return low


def guesses_from_scores(scores, included, k_plus: int, k_minus: int) -> tuple:
    """(correct, guesses) for the rule: guess "in" on the ``k_plus`` highest ``scores``, "out" on the ``k_minus``
    lowest, abstain on the rest.

    Args:
        scores: one score per canary (higher: more likely in).
        included: the canaries' true membership (bool).
        k_plus: guesses "in".
        k_minus: guesses "out".
    """
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise AuditConfigError("scores and included must be 1-D arrays of one length (one per canary)")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > scores.size:
        raise AuditConfigError(
            f"k_plus {k_plus!r} + k_minus {k_minus!r} must be >= 0 each and at most the {scores.size} canaries"
        )
    order = np.argsort(scores, kind="stable")
    correct = int(included[order[scores.size - k_plus :]].sum()) if k_plus else 0
    correct += int((~included[order[:k_minus]]).sum())
    return correct, k_plus + k_minus
