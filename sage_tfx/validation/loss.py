"""DPLossValidator: SLAed validation of a loss target (MSE, log loss, ...), paper List. 2 and App. B.1."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .bounds import bernstein_upper, hoeffding_lower
from .core import (
    Mode,
    NoisyTotal,
    Outcome,
    ValidationInputError,
    ValidationResult,
    check_positive,
    check_probability,
    check_rng,
    check_values,
    resolve_eta,
    split_eta,
)
from .noisy import joint_decision
from .units import check_per_unit, unit_records

if TYPE_CHECKING:
    import numpy.typing as npt

    from sage_tfx.privacy.randomness import RngLike, SecureRNG

    from .core import NoisyTotal, ValidationResult


def release_count_and_sum(
    values: np.ndarray, bound: float, epsilon: float | None, rng: SecureRNG, mode: Mode
) -> tuple[NoisyTotal, NoisyTotal]:
    """(n~, S~): the count and the sum of ``values`` clipped to [0, B], each with half of epsilon.

    Privacy: adding or removing one record changes n by 1 and the clipped sum by at most B, so
    n + Lap(2/eps) and S + Lap(2B/eps) are each (eps/2)-DP (Laplace mechanism) and together eps-DP
    (basic composition). Exact in non_private mode.
    """
    clipped = np.clip(values, 0.0, bound)
    half = None if epsilon is None else epsilon / 2.0  # None only in non_private mode
    count = NoisyTotal.release(clipped.size, 1.0, half, rng, mode)
    total = NoisyTotal.release(clipped, bound, half, rng, mode)  # the records, summed exactly on the grid
    return count, total


def loss_accept_bound(
    count: NoisyTotal, total: NoisyTotal, bound: float, eta: float, mode: Mode
) -> tuple[float, dict[str, float]]:
    """The ACCEPT test's upper bound UB on the expected loss, from the released (n~, S~); eta is the whole
    failure budget of the test. Returns (UB, details).

        n_lo = n~ - (2/eps) ln(3/(2 eta))      S_hi = S~ + (2B/eps) ln(3/(2 eta))     L_hi = S_hi / n_lo
        UB   = L_hi + sqrt(2 B L_hi ln(3/eta) / n_lo) + 4 B ln(3/eta) / n_lo      (Bernstein at eta/3)

    Claim (Prop. 3.1/B.1): for a model fixed independently of the test set, P(UB < mu) <= eta, mu the expected
    clipped loss. Proof: three events, eta/3 each: (1) Lap(2/eps) > (2/eps) ln(3/(2eta)), probability
    exp(-ln(3/(2eta)))/2 = eta/3, else n_lo <= n; (2) likewise for the sum, else S_hi >= S; (3) the Bernstein
    bound at (S/n, n) fails (see ``bernstein_upper``). Outside their union (probability >= 1 - eta),
    0 < n_lo <= n and S_hi >= S >= 0 give L_hi >= S/n, and the Bernstein bound, increasing in the mean and
    decreasing in n, gives UB >= bernstein_upper(S/n, n) >= mu. So ACCEPT (UB <= tau) with mu > tau happens
    with probability <= eta. UC mode drops the corrections (no guarantee); NP mode has exact n, S and puts
    all of eta on the Bernstein event. Post-processing of (n~, S~): no extra privacy cost.
    """
    delta = mode.event_eta(eta)
    n_lo = count.lower(delta, mode)
    s_hi = total.upper(delta, mode)
    mean_hi = s_hi / n_lo if n_lo > 0 else math.inf
    upper = bernstein_upper(mean_hi, n_lo, delta, bound) if n_lo > 0 else math.inf
    return upper, {"n_lo": n_lo, "sum_hi": s_hi, "mean_hi": mean_hi}


def loss_reject_bound(
    count: NoisyTotal, total: NoisyTotal, bound: float, eta: float, mode: Mode
) -> tuple[float, dict[str, float]]:
    """The REJECT test's lower bound LB on the loss, from the training set's released (n~, S~).

        c_n  = (2/eps) ln(3/eta)  (two-sided)     n_lo = n~ - c_n     n_hi = n~ + c_n
        S_lo = S~ - (2B/eps) ln(3/(2 eta))         L_lo = S_lo / n_hi
        LB   = L_lo - B sqrt(ln(3/eta) / (2 n_lo))                                    (Hoeffding at eta/3)

    Assumption (A): the trained model's empirical loss on its training sample is at most that of a reference
    model h fixed independently of the sample (exact empirical risk minimisation over a class satisfies this
    for every h of the class, in particular the class's best model).
    Claim: P(LB > L(h)) <= eta, so under (A) REJECT (LB > tau) means, with probability >= 1 - eta, that
    L(h) > tau: even the class's best model misses the target, and more data will not help.
    Proof: events at eta/3 each: (1) |Lap(2/eps)| > c_n, probability exp(-ln(3/eta)) = eta/3, else
    n_lo <= n <= n_hi; (2) Lap(2B/eps) < -(2B/eps) ln(3/(2eta)), else S_lo <= S; (3) Hoeffding for h on the
    training sample: L^_S(h) < L(h) + B sqrt(ln(3/eta)/(2n)) fails w.p. <= eta/3. Outside their union:
    if S_lo < 0 then LB < 0 <= L(h); else L_lo = S_lo/n_hi <= S/n = L^_S(model) <= L^_S(h) by (A), and
    B sqrt(ln(3/eta)/(2 n_lo)) >= B sqrt(ln(3/eta)/(2n)), so LB <= L^_S(h) - B sqrt(.../(2n)) < L(h).
    (a first draft of these formulas used the one-sided c = (2/eps) ln(3/(2 eta)) on both sides of n~, which costs
    2 eta/3 for the count event and 4 eta/3 in all; the two-sided c_n above keeps the total at eta.)
    """
    delta = mode.event_eta(eta)
    n_lo = count.lower(delta, mode, two_sided=True)
    n_hi = count.upper(delta, mode, two_sided=True)
    s_lo = total.lower(delta, mode)
    mean_lo = s_lo / n_hi if n_hi > 0 else -math.inf
    lower = hoeffding_lower(mean_lo, n_lo, delta, bound) if n_lo > 0 and n_hi > 0 else -math.inf
    return lower, {"train_n_lo": n_lo, "train_n_hi": n_hi, "train_sum_lo": s_lo, "train_mean_lo": mean_lo}


BOUNDS = ("chernoff", "bernstein")


class DPLossValidator:
    """SLAed validation of a loss target: ACCEPT iff, with probability >= 1 - eta, the expected (clipped) loss
    is <= the target.

    ``DPLossValidator(target, epsilon, confidence=0.95, loss_bound=1.0, bound="chernoff", train_epsilon=None,
    mode="sage", per_unit=False)``; ``.validate(test_losses, train_losses=None, rng=None, attempt=None, eta=None,
    units=None, train_units=None)``. ``per_unit=True``: each unit's mean clipped loss is one record, the count
    is the count of units (``sage_tfx.validation.units``); ``units`` / ``train_units`` give each row's unit.

    Losses are clipped to [0, B] (B = ``loss_bound``); the guarantee is on the expected clipped loss (which
    is <= the expected loss). eta = 1 - confidence (or ``eta``, or eta/(i(i+1)) at ``attempt`` i). The ACCEPT
    test on the test set gets all of eta when no training losses are given, and half of it otherwise; the
    REJECT test on the training set (run when ``train_values`` is given) gets the other half. Privacy:
    ``epsilon``-DP on the test set and ``train_epsilon``-DP (default ``epsilon``) on the training set; both
    tests always run when their data is given, so the epsilon spent never depends on the data. Decision order
    as in List. 2: ACCEPT, else REJECT, else RETRY.

    ``bound``:
    - ``"chernoff"`` (default): the sum of clipped losses and of B minus them, Lap(B/eps) each, and one
      Chernoff bound for the sample and the noise together (``sage_tfx.validation.noisy``, with the proofs).
      It needs about as many records as the non-private test with the same bound.
    - ``"bernstein"``: the paper's App. B as written: n and the clipped sum with eps/2 each, each moved by the
      worst case of its noise, then Bernstein, the three events at eta/3 (``loss_accept_bound``,
      ``loss_reject_bound``).
    REJECT assumes (A): the model's clipped empirical loss on its training sample is at most that of a
    reference model fixed independently of the sample (exact empirical risk minimisation over a class gives
    this for every model of the class); it then means that even the reference model misses the target.
    """

    name = "loss"
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
        loss_bound: float = 1.0,
        bound: str = "chernoff",
        train_epsilon: float | None = None,
        mode: Mode | str = "sage",
        per_unit: bool = False,
    ) -> None:
        """A loss validator (the class docstring says what it guarantees).

        Args:
          target: The loss to stay under (> 0).
          epsilon: The epsilon spent on the test set (None only in "non_private" mode).
          loss_bound: B: each loss is clipped to [0, B].
          confidence: 1 - eta, the SLA's confidence (``validate``'s ``eta`` or ``attempt`` refine it).
          bound: The test's bound: "chernoff" (default) or "bernstein".
          train_epsilon: The epsilon spent on the training set (default ``epsilon``).
          mode: A ``Mode`` (or its name): "sage" (default), or an ablation ("no_sla", "uc", "non_private").
          per_unit: Validate per privacy unit (``validation.units``): each unit's mean loss is one record, so the
            release is DP for adding or removing a whole unit; ``validate`` then takes ``units``.

        Raises:
          ValidationInputError: A value out of its range (named with the fix), before anything is drawn.
        """
        self.mode = Mode.parse(mode)
        self.target = check_positive("target loss", target)
        self.loss_bound = check_positive("loss bound B", loss_bound)
        _set_test_parameters(self, confidence, bound, BOUNDS, epsilon, train_epsilon)
        self.per_unit = check_per_unit(self.name, per_unit, bound)

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
        """Run the ACCEPT test on ``test_values`` and, if given, the REJECT test on ``train_values``.

        Args:
          test_values: Per-example losses on the test set (finite; a non-finite one is refused without naming
            it: map it to the worst loss first).
          train_values: Per-example losses on the training set (None: no REJECT test).
          rng: The noise generator (``check_rng``): a SecureRNG, a numpy Generator or None (a fresh key).
          attempt: The validation's attempt number i >= 1 (eta / (i (i + 1)) of the failure budget).
          eta: The failure probability to use (overrides ``confidence`` and ``attempt``).
          units: ``per_unit`` validators: each test row's privacy unit id (the same length as ``test_values``).
          train_units: ``per_unit`` validators: each training row's unit id.

        Returns:
          The ``ValidationResult``: ACCEPT, REJECT or RETRY, the bounds, the epsilon spent and the eta used.

        Raises:
          ValidationInputError: A bad input (named with the fix), before anything is drawn.
        """
        test = check_values("test losses", test_values)
        train = None if train_values is None else check_values("train losses", train_values)
        test, train = unit_records(self, test, train, units, train_units, self.loss_bound)
        rng = check_rng(rng)
        eta = resolve_eta(self.confidence, eta, attempt)
        eta_accept, eta_reject = split_eta(eta, train is not None)
        decide = self._decide_bernstein if self.bound == "bernstein" else self._decide_chernoff
        accepted, rejected, metric, bounds, details = decide(test, train, rng, eta_accept, eta_reject)
        details.update(
            {"loss_bound": self.loss_bound, "bound": self.bound, "eta_accept": eta_accept, "eta_reject": eta_reject}
        )
        outcome = Outcome.ACCEPT if accepted else Outcome.REJECT if rejected else Outcome.RETRY
        noisy = self.mode.noisy
        return ValidationResult(
            outcome=outcome,
            validator=self.name,
            mode=self.mode.value,
            target=self.target,
            metric=metric,
            bounds=bounds,
            epsilon_test=self.epsilon if noisy else 0.0,
            epsilon_train=self.train_epsilon if noisy and train is not None and self.mode is not Mode.NO_SLA else 0.0,
            eta=eta,
            attempt=attempt,
            details=details,
        )

    def _decide_chernoff(self, test, train, rng, eta_accept, eta_reject):
        return joint_decision(
            test,
            train,
            self.loss_bound,
            self.target,
            self.epsilon,
            self.train_epsilon,
            rng,
            self.mode,
            eta_accept,
            eta_reject,
        )

    def _decide_bernstein(self, test, train, rng, eta_accept, eta_reject):
        mode, bound = self.mode, self.loss_bound
        count, total = release_count_and_sum(test, bound, self.epsilon, rng, mode)
        metric = total.value / count.value if count.value > 0 else math.inf
        details = {"n_noisy": count.value, "sum_noisy": total.value}
        if mode is Mode.NO_SLA:
            return metric <= self.target, False, metric, {"upper": metric}, details
        upper, more = loss_accept_bound(count, total, bound, eta_accept, mode)
        details.update(more)
        bounds, lower = {"upper": upper}, -math.inf
        if train is not None:
            train_count, train_total = release_count_and_sum(train, bound, self.train_epsilon, rng, mode)
            lower, more = loss_reject_bound(train_count, train_total, bound, eta_reject, mode)
            details.update(more)
            bounds["lower"] = lower
        return upper <= self.target, lower > self.target, metric, bounds, details


def _set_test_parameters(validator, confidence, bound, bounds, epsilon, train_epsilon):
    """Check and set what the loss and accuracy validators share (after their mode and target): confidence,
    the bound (one of ``bounds``), epsilon, and train_epsilon (default: epsilon)."""
    validator.confidence = check_probability("confidence", confidence)
    if bound not in bounds:
        raise ValidationInputError(f"bound {bound!r} must be one of {bounds}")
    validator.bound = bound
    validator.epsilon = _check_epsilon("epsilon", epsilon, validator.mode)
    validator.train_epsilon = (
        validator.epsilon if train_epsilon is None else _check_epsilon("train_epsilon", train_epsilon, validator.mode)
    )


def _check_epsilon(name, epsilon, mode):
    """Epsilon must be a positive finite number; non_private mode also takes None (it spends nothing)."""
    if epsilon is None and mode is Mode.NON_PRIVATE:
        return None
    if epsilon is None:
        raise ValidationInputError(f"{name} None: mode {mode.value!r} needs a positive epsilon")
    return check_positive(name, epsilon)
