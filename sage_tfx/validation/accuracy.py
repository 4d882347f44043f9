"""DPAccuracyValidator: SLAed validation of an accuracy target (paper App. B): the exact binomial test of the DP
counts (default), the spec's corrected Clopper-Pearson, or Bernstein."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .bounds import clopper_pearson_lower, clopper_pearson_upper
from .core import (
    Mode,
    NoisyTotal,
    Outcome,
    ValidationInputError,
    ValidationResult,
    check_probability,
    check_rng,
    check_values,
    resolve_eta,
    split_eta,
)
from .loss import DPLossValidator, _set_test_parameters
from .noisy import joint_decision
from .units import check_per_unit, unit_records

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from sage_tfx.privacy.randomness import RngLike, SecureRNG

    from .core import NoisyTotal, ValidationResult

BOUNDS = ("exact", "clopper_pearson", "bernstein")


def release_correct_and_count(
    correct: np.ndarray, epsilon: float | None, rng: SecureRNG, mode: Mode
) -> tuple[NoisyTotal, NoisyTotal]:
    """(k~, n~): the number of correct predictions and of examples, each + Lap(2/eps).

    Privacy: one record changes k by at most 1 and n by 1; each count is (eps/2)-DP, both eps-DP.
    """
    half = None if epsilon is None else epsilon / 2.0
    return (
        NoisyTotal.release(correct.sum(), 1.0, half, rng, mode),
        NoisyTotal.release(correct.size, 1.0, half, rng, mode),
    )


def accuracy_accept_bound(
    correct: NoisyTotal, count: NoisyTotal, eta: float, mode: Mode
) -> tuple[float, dict[str, float]]:
    """Lower bound LB on the expected accuracy p (ACCEPT iff LB >= target); eta is the test's whole budget.

        t    = (2/eps) ln(3/(2 eta))      k_lo = k~ - t      n_hi = n~ + t
        LB   = ClopperPearsonLower(k_lo, n_hi, eta/3)

    Claim: P(LB > p) <= eta for a model fixed independently of the test set. Proof: (1) P(Lap(2/eps) > t)
    = eta/3, else k_lo <= k; (2) P(Lap(2/eps) < -t) = eta/3, else n_hi >= n; (3) P(CPL(k, n, eta/3) > p)
    <= eta/3 (exact binomial tail). Outside their union, CPL is increasing in k and decreasing in n (see
    ``clopper_pearson_lower``), so LB <= CPL(k, n) <= p. Post-processing of (k~, n~).
    """
    delta = mode.event_eta(eta)
    k_lo = correct.lower(delta, mode)
    n_hi = count.upper(delta, mode)
    return clopper_pearson_lower(k_lo, n_hi, delta), {"correct_lo": k_lo, "n_hi": n_hi}


def accuracy_reject_bound(
    correct: NoisyTotal, count: NoisyTotal, eta: float, mode: Mode
) -> tuple[float, dict[str, float]]:
    """Upper bound UB on the accuracy of a reference model, from the training set (REJECT iff UB < target).

        t  = (2/eps) ln(3/(2 eta))      k_hi = k~ + t      n_lo = n~ - t
        UB = ClopperPearsonUpper(k_hi, n_lo, eta/3)

    Assumption (A): the trained model is at least as accurate on its training sample as a reference model h
    fixed independently of the sample (exact empirical risk minimisation of the 0/1 loss over a class gives
    this for every h of the class, in particular its most accurate model).
    Claim: P(UB < acc(h)) <= eta, so under (A) REJECT means acc(h) < target with probability >= 1 - eta.
    Proof: (1), (2) each eta/3: k_hi >= k and n_lo <= n; (3) P(CPU(k_h, n, eta/3) < acc(h)) <= eta/3 for h's
    correct count k_h on the sample. Outside the union, CPU increases in k and decreases in n, and (A) says
    k >= k_h, so UB >= CPU(k, n) >= CPU(k_h, n) >= acc(h).
    """
    delta = mode.event_eta(eta)
    k_hi = correct.upper(delta, mode)
    n_lo = count.lower(delta, mode)
    return clopper_pearson_upper(k_hi, n_lo, delta), {"train_correct_hi": k_hi, "train_n_lo": n_lo}


class DPAccuracyValidator:
    """SLAed validation of an accuracy target: ACCEPT iff, with probability >= 1 - eta, the expected accuracy
    is >= the target.

    ``DPAccuracyValidator(target, epsilon, confidence=0.95, bound="exact", train_epsilon=None, mode="sage")``;
    ``.validate(test_correct, train_correct=None, rng=None, attempt=None, eta=None, units=None,
    train_units=None)`` with per-example 0/1 correctness. ``per_unit=True``: each unit's mean accuracy is one
    record and the count is the count of units (``sage_tfx.validation.units``; "exact" then uses the Chernoff
    tail of values in [0, 1], "clopper_pearson" is refused). Same eta split, epsilon accounting, decision order and REJECT assumption as
    ``DPLossValidator`` (for the 0/1 loss).

    ``bound``:
    - ``"exact"`` (default): the error and the correct counts with Lap(1/eps) each (disjoint records: parallel
      composition) and the exact binomial test of the noisy counts, Clopper-Pearson's test with the Laplace
      noise convolved in (``sage_tfx.validation.noisy``, with the proofs). Without noise (NP SLA) it is
      Clopper-Pearson.
    - ``"clopper_pearson"``: the paper's App. B as written: k and n with Lap(2/eps) each, moved by the worst case
      of their noise, then the Clopper-Pearson bound, the three events at eta/3.
    - ``"bernstein"``: the loss validator's spec bound on the 0/1 error (B = 1, target 1 - the accuracy
      target), reporting accuracy bounds (1 - the error bounds).
    """

    name = "accuracy"
    # set by _set_test_parameters
    confidence: float
    bound: str
    epsilon: float  # and train_epsilon: None only in non_private mode, where nothing is drawn or spent
    train_epsilon: float

    def __init__(
        self,
        target: float,
        epsilon: float | None,
        confidence: float = 0.95,
        *,
        bound: str = "exact",
        train_epsilon: float | None = None,
        mode: Mode | str = "sage",
        per_unit: bool = False,
    ) -> None:
        """An accuracy validator (the class docstring says what it guarantees).

        Args:
          target: The accuracy to reach, in (0, 1).
          epsilon: The epsilon spent on the test set (None only in "non_private" mode).
          confidence: 1 - eta, the SLA's confidence (``validate``'s ``eta`` or ``attempt`` refine it).
          bound: The test's bound: "exact" (default), "clopper_pearson" or "bernstein".
          train_epsilon: The epsilon spent on the training set (default ``epsilon``).
          mode: A ``Mode`` (or its name): "sage" (default), or an ablation ("no_sla", "uc", "non_private").
          per_unit: Validate per privacy unit (``validation.units``): each unit's accuracy is one record in [0, 1];
            ``validate`` then takes ``units`` ("clopper_pearson" is refused).

        Raises:
          ValidationInputError: A value out of its range (named with the fix), before anything is drawn.
        """
        self.mode = Mode.parse(mode)
        self.target = check_probability("target accuracy", target)
        _set_test_parameters(self, confidence, bound, BOUNDS, epsilon, train_epsilon)
        self.per_unit = check_per_unit(self.name, per_unit, bound, binomial_bounds=("clopper_pearson",))

    def validate(
        self,
        test_values: npt.ArrayLike,
        train_values: npt.ArrayLike | None = None,
        rng: RngLike = None,
        *,
        attempt: int | None = None,
        eta: float | None = None,
        units: npt.ArrayLike | None = None,
        train_units: npt.ArrayLike | None = None,
    ) -> ValidationResult:
        """``DPLossValidator.validate`` on per-example correctness: the ACCEPT test on the test set and, if given,
        the REJECT test on the training set.

        Args:
          test_values: 1.0 (correct) or 0.0 (incorrect) per test example (``validation.correctness``).
          train_values: The same on the training set (None: no REJECT test).
          rng: The noise generator, as ``DPLossValidator.validate``.
          attempt: As ``DPLossValidator.validate``.
          eta: As ``DPLossValidator.validate``.
          units: As ``DPLossValidator.validate`` (``per_unit`` validators).
          train_units: As ``DPLossValidator.validate``.

        Returns:
          The ``ValidationResult`` (the accuracy's lower and upper confidence bounds in ``bounds``).

        Raises:
          ValidationInputError: A value other than 0 and 1 (named without the value), before anything is drawn.
        """
        test = _check_correctness("test correctness", test_values)
        train = None if train_values is None else _check_correctness("train correctness", train_values)
        test, train = unit_records(self, test, train, units, train_units, 1.0)
        if self.bound == "bernstein":
            return self._validate_bernstein(test, train, rng, attempt, eta)
        rng = check_rng(rng)
        eta = resolve_eta(self.confidence, eta, attempt)
        eta_accept, eta_reject = split_eta(eta, train is not None)
        decide = self._decide_exact if self.bound == "exact" else self._decide_clopper_pearson
        lower, upper, metric, bounds, details = decide(test, train, rng, eta_accept, eta_reject)
        details.update({"bound": self.bound, "eta_accept": eta_accept, "eta_reject": eta_reject})
        epsilon_train = (
            self.train_epsilon if train is not None and self.mode.noisy and self.mode is not Mode.NO_SLA else 0.0
        )
        return self._result(lower, upper, metric, bounds, epsilon_train, eta, attempt, details)

    def _decide_exact(self, test, train, rng, eta_accept, eta_reject):
        """The joint tests on the 0/1 error (B = 1, target 1 - target), reported as accuracies."""
        accepted, rejected, error, limits, details = joint_decision(
            1.0 - test,
            None if train is None else 1.0 - train,
            1.0,
            1.0 - self.target,
            self.epsilon,
            self.train_epsilon,
            rng,
            self.mode,
            eta_accept,
            eta_reject,
            binomial=not self.per_unit,
        )
        details["errors_noisy"], details["correct_noisy"] = details.pop("sum_noisy"), details.pop("complement_noisy")
        bounds = {"lower": 1.0 - limits["upper"]}
        if "lower" in limits:
            bounds["upper"] = 1.0 - limits["lower"]
        return accepted, rejected, 1.0 - error, bounds, details

    def _decide_clopper_pearson(self, test, train, rng, eta_accept, eta_reject):
        mode = self.mode
        correct, count = release_correct_and_count(test, self.epsilon, rng, mode)
        metric = correct.value / count.value if count.value > 0 else -math.inf
        details = {"correct_noisy": correct.value, "n_noisy": count.value}
        if mode is Mode.NO_SLA:
            return metric >= self.target, False, metric, {"lower": metric}, details
        lower, more = accuracy_accept_bound(correct, count, eta_accept, mode)
        details.update(more)
        bounds, upper = {"lower": lower}, math.inf
        if train is not None:
            train_correct, train_count = release_correct_and_count(train, self.train_epsilon, rng, mode)
            upper, more = accuracy_reject_bound(train_correct, train_count, eta_reject, mode)
            details.update(more)
            bounds["upper"] = upper
        return lower >= self.target, upper < self.target, metric, bounds, details

    def _validate_bernstein(self, test, train, rng, attempt, eta):
        errors = DPLossValidator(
            1.0 - self.target,
            self.epsilon,
            self.confidence,
            loss_bound=1.0,
            bound="bernstein",
            train_epsilon=self.train_epsilon,
            mode=self.mode,
        )
        inner = errors.validate(1.0 - test, None if train is None else 1.0 - train, rng, attempt=attempt, eta=eta)
        bounds = {"lower": 1.0 - inner.bounds["upper"]}
        if "lower" in inner.bounds:
            bounds["upper"] = 1.0 - inner.bounds["lower"]
        details = dict(inner.details, bound=self.bound, error_bounds=inner.bounds)
        return self._result(
            inner.outcome is Outcome.ACCEPT,
            inner.outcome is Outcome.REJECT,
            1.0 - inner.metric,
            bounds,
            inner.epsilon_train,
            inner.eta,
            attempt,
            details,
        )

    def _result(self, accepted, rejected, metric, bounds, epsilon_train, eta, attempt, details):
        outcome = Outcome.ACCEPT if accepted else Outcome.REJECT if rejected else Outcome.RETRY
        return ValidationResult(
            outcome=outcome,
            validator=self.name,
            mode=self.mode.value,
            target=self.target,
            metric=metric,
            bounds=bounds,
            epsilon_test=self.epsilon if self.mode.noisy else 0.0,
            epsilon_train=epsilon_train,
            eta=eta,
            attempt=attempt,
            details=details,
        )


def _check_correctness(name, values):
    array = check_values(name, values)
    if ((array != 0.0) & (array != 1.0)).any():  # per-record values: no value, index or count in the message
        raise ValidationInputError(f"{name} holds a value other than 0 or 1: correctness must be 0 or 1")
    return array
