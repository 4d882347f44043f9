"""DP-SGD accounting: the privacy event of a training run and noise calibration.

Contract: one DP-SGD step (Poisson sampling at q = batch_size / num_examples, per-example clip C,
N(0, (sigma*C)^2) on the sum) is a Poisson-sampled Gaussian mechanism of multiplier sigma, the run is
``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps)``, and calibration returns
a sigma whose epsilon (dp_accounting's RDP or PLD accountant) is <= the target. ``num_examples`` must be
public or a DP count. dp_accounting is imported lazily. Proof: docs/models.md, "DP-SGD calibration".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import checks
from .errors import SageError

if TYPE_CHECKING:
    import dp_accounting

ACCOUNTANTS = ("rdp", "pld")


class DpSgdConfigError(SageError, ValueError):
    """A DP-SGD privacy or training parameter is invalid; the message names it."""


_INVALID = "{what}={value!r} is invalid: must be {rule}"
_NOT_NUMBER = "{what}={value!r} is not a number"


def _positive(value, name, integer=False):
    number = checks.positive(value, name, error=DpSgdConfigError, message=_INVALID, not_number=_NOT_NUMBER)
    if integer:
        if number != int(number):
            raise DpSgdConfigError(f"{name}={value!r} is invalid: must be a whole number")
        return int(number)
    return number


def check_budget(epsilon: float, delta: float) -> tuple[float, float]:
    """Validate an (epsilon, delta) target for a Gaussian-noise mechanism; return floats."""
    epsilon = _positive(epsilon, "epsilon")
    delta = checks.probability(
        delta, "delta", error=DpSgdConfigError, not_number=_NOT_NUMBER, message=_INVALID + " for Gaussian noise"
    )
    return epsilon, delta


def check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise DpSgdConfigError(f"accountant={accountant!r} is invalid: choose one of {ACCOUNTANTS}")
    return accountant


def sampling_rate(num_examples: int, batch_size: int) -> float:
    """Poisson sampling probability q = batch_size / num_examples."""
    num_examples = _positive(num_examples, "num_examples", integer=True)
    batch_size = _positive(batch_size, "batch_size", integer=True)
    if batch_size > num_examples:
        raise DpSgdConfigError(f"batch_size={batch_size} is invalid: larger than num_examples={num_examples}")
    return batch_size / num_examples


def num_steps(num_examples: int, batch_size: int, epochs: float) -> int:
    """Training steps of ``epochs`` passes: ceil(epochs / q) (tensorflow-privacy's count)."""
    q = sampling_rate(num_examples, batch_size)
    epochs = _positive(epochs, "epochs")
    # round first so that 3 epochs at q = 1/3 is 9 steps, not 10 from float error
    return max(1, int(math.ceil(round(epochs / q, 9))))


def dpsgd_event(noise_multiplier: float, num_examples: int, batch_size: int, epochs: float) -> dp_accounting.DpEvent:
    """The dp_accounting DpEvent of a DP-SGD run (Poisson-sampled Gaussian, self-composed)."""
    import dp_accounting

    sigma = _positive(noise_multiplier, "noise_multiplier")
    q = sampling_rate(num_examples, batch_size)
    steps = num_steps(num_examples, batch_size, epochs)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sampling_probability=q, event=dp_accounting.GaussianDpEvent(noise_multiplier=sigma)
        ),
        steps,
    )


def _make_accountant(accountant):
    if accountant == "rdp":
        from dp_accounting.rdp import rdp_privacy_accountant

        return rdp_privacy_accountant.RdpAccountant()
    from dp_accounting.pld import pld_privacy_accountant

    return pld_privacy_accountant.PLDAccountant()


def event_epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str = "rdp") -> float:
    """Epsilon at ``delta`` of any DpEvent, from dp_accounting's RDP or PLD accountant.

    Memoized on the event's value (a hashable event, e.g. a DP-SGD run's; others are computed each time): a
    calibration asks for the same event more than once (its bracket's ends, Brent's last point, the realised
    epsilon), and the answer is the same float either way."""
    check_accountant(accountant)
    try:
        return _memo_epsilon(event, float(delta), accountant)
    except TypeError:  # an unhashable event (a ComposedDpEvent holds a list)
        return _accounted_epsilon(event, delta, accountant)


def _accounted_epsilon(event, delta, accountant):
    return float(_make_accountant(accountant).compose(event).get_epsilon(delta))


@functools.lru_cache(maxsize=512)
def _memo_epsilon(event, delta, accountant):
    return _accounted_epsilon(event, delta, accountant)


class _MemoAccountant:
    """The fresh accountant ``calibrate_dp_mechanism`` asks for, answering from ``event_epsilon``'s memo (the
    same float a fresh dp_accounting accountant gives)."""

    def __init__(self, accountant: str) -> None:
        import dp_accounting

        self.ledger = dp_accounting.NoOpDpEvent()
        self._accountant, self._event = accountant, None

    def compose(self, event: dp_accounting.DpEvent) -> _MemoAccountant:
        self._event = event
        return self

    def get_epsilon(self, delta: float) -> float:
        return event_epsilon(self._event, delta, self._accountant)


def epsilon_for(
    noise_multiplier: float, delta: float, num_examples: int, batch_size: int, epochs: float, accountant: str = "rdp"
) -> float:
    """Epsilon at ``delta`` of a DP-SGD run with the given noise multiplier."""
    _, delta = check_budget(1.0, delta)
    event = dpsgd_event(noise_multiplier, num_examples, batch_size, epochs)
    return event_epsilon(event, delta, accountant)


MIN_SIGMA = 1e-3


def calibrate_scale(
    make_event: Callable[[float], dp_accounting.DpEvent],
    epsilon: float,
    delta: float,
    accountant: str = "rdp",
    rtol: float = 1e-4,
    max_sigma: float = 1e4,
    context: str = "",
) -> float:
    """Smallest scale s (to ``rtol`` relative) with ``make_event(s)`` (epsilon, delta)-DP on the accountant.

    ``make_event(s)`` must give a DpEvent whose epsilon decreases as s grows (a noise multiplier, or
    the scale of a whole noise schedule). The search is dp_accounting's ``calibrate_dp_mechanism``
    (Brent's method) over x = log(s) in a bracket [log(s/2), log(s)] found by doubling s from 1
    (down to MIN_SIGMA when 1 already suffices; above ``max_sigma`` refused), with tolerance
    log(1 + rtol) in x, i.e. relative ``rtol`` in s; calibrate_dp_mechanism only returns a value
    whose epsilon is <= the target (it steps by the tolerance if Brent's root is above it), so the
    result never overspends. Each epsilon comes from ``event_epsilon``'s memo (the same search and result,
    without accounting an event twice). ``context`` names the training shape in the error messages.
    """
    from dp_accounting import mechanism_calibration as mc

    epsilon, delta = check_budget(epsilon, delta)
    check_accountant(accountant)
    rtol = _positive(rtol, "rtol")
    max_sigma = _positive(max_sigma, "max_sigma")

    def eps_at(scale):
        return event_epsilon(make_event(scale), delta, accountant)

    # bracket: double from 1 (as far out as needed only: the RDP of a huge sigma is numerically unstable)
    high = 1.0
    while eps_at(high) > epsilon:
        high *= 2.0
        if high > max_sigma:
            raise DpSgdConfigError(
                f"epsilon={epsilon!r} at delta={delta!r} needs a noise multiplier above {max_sigma} "
                f"{context}; raise epsilon or num_examples, or lower batch_size or epochs"
            )
    low = high / 2.0
    if high == 1.0:
        low = MIN_SIGMA
        if eps_at(low) <= epsilon:
            raise DpSgdConfigError(
                f"epsilon={epsilon!r} at delta={delta!r} is met with a noise multiplier below {MIN_SIGMA} "
                f"{context}: that is no meaningful privacy; lower epsilon"
            )
    log_scale = mc.calibrate_dp_mechanism(
        lambda: _MemoAccountant(accountant),
        lambda x: make_event(math.exp(x)),
        epsilon,
        delta,
        bracket_interval=mc.ExplicitBracketInterval(math.log(low), math.log(high)),
        tol=math.log1p(rtol),
    )
    return math.exp(log_scale)


def calibrate_noise_multiplier(
    epsilon: float,
    delta: float,
    num_examples: int,
    batch_size: int,
    epochs: float,
    accountant: str = "rdp",
    rtol: float = 1e-4,
    max_sigma: float = 1e4,
) -> float:
    """Smallest noise multiplier (to ``rtol``) whose DP-SGD run is (epsilon, delta)-DP.

    ``calibrate_scale`` (dp_accounting's ``calibrate_dp_mechanism``) on the run's DpEvent: the
    returned sigma always satisfies ``epsilon_for(sigma, ...) <= epsilon`` and is within ``rtol``
    relative of the smallest such sigma, so the realised epsilon is within a fraction of a percent
    of the target. Memoized on the validated public numbers (a model's checks and its fit ask twice).
    """
    epsilon, delta = check_budget(epsilon, delta)
    check_accountant(accountant)
    # validate the training shape once, with a readable error
    num_steps(num_examples, batch_size, epochs)
    return _calibrated_multiplier(epsilon, delta, num_examples, batch_size, epochs, accountant, rtol, max_sigma)


@functools.lru_cache(maxsize=256)
def _calibrated_multiplier(
    epsilon: float,
    delta: float,
    num_examples: int,
    batch_size: int,
    epochs: float,
    accountant: str,
    rtol: float,
    max_sigma: float,
) -> float:
    """``calibrate_noise_multiplier``'s search: a deterministic function of public numbers."""
    return calibrate_scale(
        lambda sigma: dpsgd_event(sigma, num_examples, batch_size, epochs),
        epsilon,
        delta,
        accountant,
        rtol=rtol,
        max_sigma=max_sigma,
        context=f"(num_examples={num_examples}, batch_size={batch_size}, epochs={epochs})",
    )


def dpsgd_spend(
    epsilon: float, delta: float, num_examples: int, batch_size: int, epochs: float, accountant: str = "rdp"
) -> tuple[float, dp_accounting.DpEvent, float, int]:
    """Calibrate a run to (epsilon, delta); return (sigma, event, realised epsilon, steps)."""
    sigma = calibrate_noise_multiplier(epsilon, delta, num_examples, batch_size, epochs, accountant)
    event = dpsgd_event(sigma, num_examples, batch_size, epochs)
    realised = event_epsilon(event, delta, accountant)
    return sigma, event, realised, num_steps(num_examples, batch_size, epochs)
