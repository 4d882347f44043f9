"""How many test rows the validator's ACCEPT test needs, from public numbers only (``estimate_accept``): at each
attempt the budget allows, the least number of test rows at which the ACCEPT test at the SLA's target passes when
the model's true loss is a public guess (``expected``) and the released sums equal their expectations. The test is
the validator's own (``noisy_sum_test``), so the estimate cannot drift from it (docs/validation.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sage_tfx.privacy import DEFAULT_RECORD_SPLIT, eval_share_split
from sage_tfx.privacy.vocabulary import Metric

EXPECTED_FRACTION = 0.5  # default public guess of the true loss: half the target (accuracy: half the target's error)
ESTIMATE_DOUBLINGS = 4  # epsilons estimated: epsilon_start, 2x, 4x, 8x (the iterator doubles after a RETRY)
MAX_TEST_ROWS = 1e8  # beyond this the target is treated as out of reach (and the exact binomial tail gets costly)


@dataclass(frozen=True)
class AcceptRow:
    """At one iteration epsilon (attempt ``attempt``): what the ACCEPT test gets and the test rows it needs."""

    epsilon: float
    attempt: int
    validation_epsilon: float
    eta_accept: float
    test_rows: int | None  # None: out of reach (no n up to MAX_TEST_ROWS passes)
    rows: int | None  # test_rows / the eval split's share of the rows


@dataclass(frozen=True)
class AcceptEstimate:
    metric: str
    target: float
    expected: float  # in the SLA's unit (a loss, or an accuracy)
    expected_is_default: bool
    bound: float  # B: losses clipped to [0, B] (1 for accuracy's 0/1 errors)
    confidence: float
    eval_share: float
    rows: list


def _accept_test(metric, target, expected, bound):
    """(B, tau, mean, binomial) of the validator's ACCEPT test on values in [0, B]: a loss tested at the target,
    or the 0/1 error tested at 1 - target (DPAccuracyValidator's "exact" bound), as make_validator builds them."""
    if metric == Metric.ACCURACY:
        return 1.0, 1.0 - target, 1.0 - expected, True
    return float(bound), target, expected, False


def accept_passes(n, *, metric, target, expected, bound, epsilon, eta_accept) -> bool:
    """Whether the validator's ACCEPT test passes on ``n`` test rows whose released sums equal their expectations:
    S~ = n mean and S'~ = n (B - mean), Lap(B/epsilon) each (the noise at its median, 0). The same call
    ``joint_decision`` decides with: ``noisy_sum_test`` at the target, ACCEPT iff p-value <= eta's sampling share."""
    return (
        accept_margin(
            n, metric=metric, target=target, expected=expected, bound=bound, epsilon=epsilon, eta_accept=eta_accept
        )
        <= 0.0
    )


def accept_margin(n, *, metric, target, expected, bound, epsilon, eta_accept) -> float:
    """log(p-value) - log(sampling share of eta) of the ACCEPT test at ``n`` (real n allowed): <= 0 iff it passes."""

    from sage_tfx.validation.core import Mode, NoisyTotal
    from sage_tfx.validation.noisy import noisy_sum_test

    b, tau, mean, binomial = _accept_test(metric, target, expected, bound)
    scale = b / epsilon  # release_pair: Lap(B/eps) on each sum
    total, complement = NoisyTotal(n * mean, scale), NoisyTotal(n * (b - mean), scale)
    p_value, eta_s, _ = noisy_sum_test(
        total, complement, b, min(tau, b * (1.0 - 1e-9)), eta_accept, Mode.SAGE, -1, binomial
    )
    return math.log(max(p_value, 1e-300)) - math.log(eta_s)


def least_test_rows(*, metric, target, expected, bound, epsilon, eta_accept) -> int | None:
    """The least integer n at which ``accept_passes``; None if none up to MAX_TEST_ROWS does.

    Brent's method (scipy.optimize.brentq) on the margin over log n, evaluated at whole rows (a step
    function), then the integer neighbours checked: the result passes and n - 1 does not. The margin decreases in n
    when the expected value meets the target with room (more rows
    shrink both the sampling and the noise terms), which the check of the neighbours confirms at the answer.
    """

    from scipy.optimize import brentq

    args = dict(metric=metric, target=target, expected=expected, bound=bound, epsilon=epsilon, eta_accept=eta_accept)

    def margin(log_n):  # at whole rows: the exact binomial test sums over the integer counts near n
        return accept_margin(max(1, round(math.exp(log_n))), **args)

    lo, hi = 0.0, math.log(MAX_TEST_ROWS)
    if margin(hi) > 0:
        return None
    if margin(lo) <= 0:
        return 1
    n = max(1, math.ceil(math.exp(brentq(margin, lo, hi, xtol=1e-12, rtol=1e-12))))
    for _ in range(1000):  # at most a few steps: brentq stops within 1e-12 of the crossing in log n
        if not accept_passes(n, **args):
            n += 1
        elif n > 1 and accept_passes(n - 1, **args):
            n -= 1
        else:
            return n
    raise RuntimeError(f"the ACCEPT test is not monotone in n near {n} rows ({args})")


def iterator_settings(settings: dict) -> dict:
    """SageIterator's settings that shape the split and the first epsilon: its own defaults, then ``settings``."""
    from dataclasses import asdict

    from sage_tfx.adaptive import IteratorSettings

    return {**asdict(IteratorSettings()), **{k: v for k, v in settings.items() if v is not None}}


def estimate_accept(
    sla,
    target: float,
    *,
    expected: float | None = None,
    confidence: float = 0.95,
    settings: dict | None = None,
    attempts=None,
) -> AcceptEstimate:
    """Test rows (and rows) at which the ACCEPT test at ``target`` passes, at each of a few iteration epsilons.

    ``expected``: a PUBLIC guess of the model's true metric (a loss, or an accuracy); default: half the target
    (accuracy: half the target's error rate). ``settings``: the iterator's (the pipeline's defaults and the CLI's
    overrides: epsilon_start, preprocessing_share, count_share, rejection_share, disjoint_split, eval_share).
    ``attempts``: the attempts to estimate, ``PlannedAttempt``s (``sage_tfx.adaptive.plan_attempts``: those the
    stream's budget allows now) or (attempt, epsilon) pairs; default: epsilon e = epsilon_start * 2^k (k = 0..3,
    attempt k + 1: the iterator doubles epsilon after each RETRY when the budget allows). At each, the split is
    ``BudgetSplit.for_epsilon`` as the iterator makes it; the ACCEPT test gets the split's validation epsilon and
    eta_i = eta / (i (i + 1)), halved when a REJECT test runs (split_eta). Rows = test rows / the test side's
    share of the record split the grants sign (``eval_share``, default 1 in 10). Spends nothing: public numbers.
    """
    from sage_tfx.privacy import BudgetSplit
    from sage_tfx.validation.core import eta_for_attempt, split_eta

    metric = sla.metric
    target = sla.check_target(target)
    bound = 1.0 if metric == Metric.ACCURACY else float(sla.loss_bound)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence!r} must be in (0, 1)")
    is_default = expected is None
    if metric == Metric.ACCURACY:
        expected = 1.0 - EXPECTED_FRACTION * (1.0 - target) if is_default else float(expected)
        if not target < expected <= 1.0:
            raise ValueError(
                f"expected accuracy {expected!r} must be above the target {target:g} and at most 1: "
                "the ACCEPT test cannot pass for a model whose accuracy misses the target"
            )
    else:
        expected = EXPECTED_FRACTION * target if is_default else float(expected)
        if not 0.0 <= expected < target:
            raise ValueError(
                f"expected loss {expected!r} must be in [0, target {target:g}): the ACCEPT test cannot "
                "pass for a model whose loss misses the target"
            )
    s = iterator_settings(settings or {})
    records = DEFAULT_RECORD_SPLIT if s.get("eval_share") is None else eval_share_split(s["eval_share"], ValueError)
    buckets = records.splits
    all_buckets, test_buckets = sum(buckets.values()), sum(buckets[name] for name in records.test)
    if attempts is None:
        attempts = [(k + 1, float(s["epsilon_start"]) * 2**k) for k in range(ESTIMATE_DOUBLINGS)]
    rows = []
    for attempt, epsilon in (_attempt_pair(a) for a in attempts):
        split = BudgetSplit.for_epsilon(
            epsilon,
            0.0,
            s["preprocessing_share"],
            s["count_share"],
            rejection_share=s["rejection_share"],
            disjoint_split=s["disjoint_split"],
        )
        eta_accept, _ = split_eta(eta_for_attempt(1.0 - confidence, attempt), split.rejection > 0)
        n = least_test_rows(
            metric=metric,
            target=target,
            expected=expected,
            bound=bound,
            epsilon=split.validation,
            eta_accept=eta_accept,
        )
        total = None if n is None else -(-n * all_buckets // test_buckets)
        rows.append(AcceptRow(epsilon, attempt, split.validation, eta_accept, n, total))
    return AcceptEstimate(metric, target, expected, is_default, bound, confidence, records.test_share, rows)


def _attempt_pair(attempt) -> tuple:
    """(attempt number, epsilon) of a ``PlannedAttempt`` or of a pair."""
    if hasattr(attempt, "epsilon"):
        return attempt.attempt, float(attempt.epsilon)
    number, epsilon = attempt
    return int(number), float(epsilon)
