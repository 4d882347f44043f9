"""The statistical core of one-run auditing (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training
Run", NeurIPS 2023), for pure epsilon-DP: numpy and scipy only.

The experiment: m canaries, each included in the input independently with probability 1/2 (S_i = +1 in, -1
out); the mechanism runs ONCE; an attacker looks at the output and guesses S_i on r canaries of its choice
(abstaining on the rest), making W correct guesses. Their Theorem 3.1: if the mechanism is epsilon-DP (with
respect to adding or removing one canary), W is stochastically dominated by Binomial(r, e^eps / (1 + e^eps)).
So at confidence C, with beta = 1 - C,

    p_lb = the one-sided Clopper-Pearson lower bound on a binomial rate from W of r (level beta),
    epsilon_lb = max(0, log(p_lb / (1 - p_lb))),

and P(epsilon_lb > epsilon) <= beta for an epsilon-DP mechanism. The attacker's rule (which canaries to guess,
how) must be fixed before the output is seen; ``guesses_from_scores`` is one such rule (the k_plus highest scores
guessed in, the k_minus lowest guessed out, fixed k's).

Not built here: the (epsilon, delta) version (their Theorem 3.3 adds a delta term), and the DP-SGD driver
(inserting the canaries into a ``make_private`` training run and scoring them); docs/privacy_auditing.md.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import beta

from .core import AuditConfigError

__all__ = ["one_run_epsilon_lower_bound", "guesses_from_scores"]


def one_run_epsilon_lower_bound(correct: int, guesses: int, confidence: float = 0.95) -> float:
    """epsilon_lb from ``correct`` right guesses out of ``guesses`` made (module docstring): exceeds the epsilon of
    an epsilon-DP mechanism with probability at most 1 - ``confidence``."""
    if not 0.0 < confidence < 1.0:
        raise AuditConfigError(f"confidence {confidence!r} must be a number in (0, 1), e.g. 0.95")
    if not (isinstance(guesses, (int, np.integer)) and isinstance(correct, (int, np.integer))
            and 0 <= correct <= guesses):
        raise AuditConfigError(f"correct {correct!r} and guesses {guesses!r} must be integers with "
                               "0 <= correct <= guesses")
    if correct == 0:
        return 0.0
    p_lb = float(beta.ppf(1.0 - confidence, correct, guesses - correct + 1))
    if p_lb <= 0.5:
        return 0.0
    return math.log(p_lb / (1.0 - p_lb)) if p_lb < 1.0 else math.inf


def guesses_from_scores(scores, included, k_plus: int, k_minus: int) -> tuple:
    """(correct, guesses) for the rule: guess "in" on the ``k_plus`` highest ``scores``, "out" on the ``k_minus``
    lowest, abstain on the rest. ``included``: the canaries' true membership (bool)."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise AuditConfigError("scores and included must be 1-D arrays of one length (one per canary)")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > scores.size:
        raise AuditConfigError(f"k_plus {k_plus!r} + k_minus {k_minus!r} must be >= 0 each and at most the "
                               f"{scores.size} canaries")
    order = np.argsort(scores, kind="stable")
    correct = int(included[order[scores.size - k_plus:]].sum()) if k_plus else 0
    correct += int((~included[order[:k_minus]]).sum())
    return correct, k_plus + k_minus
