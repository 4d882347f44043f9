"""The statistical core of one-run auditing (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training
Run", NeurIPS 2023): numpy and scipy only.

The experiment: m canaries, each included in the input independently with probability 1/2 (S_i = +1 in, -1
out); the mechanism runs ONCE; an attacker looks at the output and guesses S_i on r canaries of its choice
(abstaining on the rest), making W correct guesses. Their Theorem 3.1 (pure DP): if the mechanism is epsilon-DP
(with respect to adding or removing one canary), W is stochastically dominated by Binomial(r, q) with
q = e^eps / (1 + e^eps). Their approximate-DP theorem (Theorem 5.2, and the p-value code of their appendix): if
it is (epsilon, delta)-DP, then for every v

    P(W >= v) <= P(Binomial(r, q) >= v) + 2 m delta * max_{1 <= i <= v} P(v - i <= Binomial(r, q) < v) / i.

``one_run_p_value`` is that right-hand side; ``one_run_epsilon_lower_bound`` is the largest epsilon (to 1e-6)
whose p-value for the observed W is below beta = 1 - confidence: P(epsilon_lb > epsilon) <= beta for an
(epsilon, delta)-DP mechanism. At delta = 0 it is the one-sided Clopper-Pearson bound, epsilon_lb =
log(p_lb / (1 - p_lb)). The attacker's rule (which canaries to guess, how) must be fixed before the output is
seen; ``guesses_from_scores`` is one such rule (the k_plus highest scores guessed in, the k_minus lowest
guessed out, fixed k's). The DP-SGD driver that plants the canaries into a ``make_private`` run: ``dpsgd``.
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
