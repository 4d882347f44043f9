"""DP-SGD accounting: the privacy event of a training run and noise calibration.

DP-SGD (Abadi et al. 2016) as the sage models run it: every step includes each
training record independently with probability ``q = batch_size / num_examples``
(Poisson sampling), clips each included record's gradient to L2 norm C, sums,
and adds N(0, (sigma*C)^2) to every coordinate of the sum. Under add/remove-one
adjacency the clipped sum has L2 sensitivity C, so one step is a Poisson-sampled
Gaussian mechanism with noise multiplier sigma, and the run is that mechanism
self-composed over ``steps = ceil(epochs * num_examples / batch_size)`` steps::

    SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps)

(the same event and step count as tensorflow-privacy's
``compute_dp_sgd_privacy_statement`` under Poisson sampling, without
microbatching). Its (epsilon, delta) comes from dp_accounting's RDP accountant
(default) or PLD accountant. Calibration is a binary search over sigma on that
accountant: epsilon is decreasing in sigma, so the search returns the smallest
sigma (to a relative tolerance) whose epsilon is <= the target. Never a table.

``num_examples`` fixes q and the step count. It must be a public number or a DP
count (e.g. the ledger's DP row count of the granted blocks), never the exact
private count: the noise multiplier is released with the model, so a sigma
computed from the exact count would leak it. The accounting stays valid when the
true row count differs from ``num_examples``, because Poisson sampling includes
each present record with probability q whatever the number of records.

dp_accounting is imported lazily (it takes over a second to load).
"""
import math

from .errors import SageError

ACCOUNTANTS = ("rdp", "pld")


class DpSgdConfigError(SageError, ValueError):
    """A DP-SGD privacy or training parameter is invalid; the message names it."""


def _positive(value, name, integer=False):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DpSgdConfigError(f"{name}={value!r} is not a number") from None
    if not math.isfinite(number) or number <= 0:
        raise DpSgdConfigError(f"{name}={value!r} is invalid: must be finite and > 0")
    if integer:
        if number != int(number):
            raise DpSgdConfigError(f"{name}={value!r} is invalid: must be a whole number")
        return int(number)
    return number


def check_budget(epsilon, delta):
    """Validate an (epsilon, delta) target for a Gaussian-noise mechanism; return floats."""
    epsilon = _positive(epsilon, "epsilon")
    try:
        delta = float(delta)
    except (TypeError, ValueError):
        raise DpSgdConfigError(f"delta={delta!r} is not a number") from None
    if not (math.isfinite(delta) and 0 < delta < 1):
        raise DpSgdConfigError(f"delta={delta!r} is invalid: must be in (0, 1) for Gaussian noise")
    return epsilon, delta


def check_accountant(accountant):
    if accountant not in ACCOUNTANTS:
        raise DpSgdConfigError(f"accountant={accountant!r} is invalid: choose one of {ACCOUNTANTS}")
    return accountant


def sampling_rate(num_examples, batch_size):
    """Poisson sampling probability q = batch_size / num_examples."""
    num_examples = _positive(num_examples, "num_examples", integer=True)
    batch_size = _positive(batch_size, "batch_size", integer=True)
    if batch_size > num_examples:
        raise DpSgdConfigError(
            f"batch_size={batch_size} is invalid: larger than num_examples={num_examples}"
        )
    return batch_size / num_examples


def num_steps(num_examples, batch_size, epochs):
    """Training steps of ``epochs`` passes: ceil(epochs / q) (tensorflow-privacy's count)."""
    q = sampling_rate(num_examples, batch_size)
    epochs = _positive(epochs, "epochs")
    # round first so that 3 epochs at q = 1/3 is 9 steps, not 10 from float error
    return max(1, int(math.ceil(round(epochs / q, 9))))


def dpsgd_event(noise_multiplier, num_examples, batch_size, epochs):
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


def event_epsilon(event, delta, accountant="rdp"):
    """Epsilon at ``delta`` of any DpEvent, from dp_accounting's RDP or PLD accountant."""
    check_accountant(accountant)
    return float(_make_accountant(accountant).compose(event).get_epsilon(delta))


def epsilon_for(noise_multiplier, delta, num_examples, batch_size, epochs, accountant="rdp"):
    """Epsilon at ``delta`` of a DP-SGD run with the given noise multiplier."""
    _, delta = check_budget(1.0, delta)
    event = dpsgd_event(noise_multiplier, num_examples, batch_size, epochs)
    return event_epsilon(event, delta, accountant)


def calibrate_noise_multiplier(epsilon, delta, num_examples, batch_size, epochs, accountant="rdp",
                               rtol=1e-4, max_sigma=1e4):
    """Smallest noise multiplier (to ``rtol``) whose DP-SGD run is (epsilon, delta)-DP.

    Binary search on the accountant's epsilon, which decreases as sigma grows.
    The returned sigma always satisfies ``epsilon_for(sigma, ...) <= epsilon``
    (it is the upper end of the final bracket), and the search stops when the
    bracket is narrower than ``rtol`` relative, so the realised epsilon is within
    a fraction of a percent of the target.
    """
    epsilon, delta = check_budget(epsilon, delta)
    check_accountant(accountant)
    # validate the training shape once, with a readable error
    num_steps(num_examples, batch_size, epochs)

    def eps_at(sigma):
        return epsilon_for(sigma, delta, num_examples, batch_size, epochs, accountant)

    low, high = 0.0, 1.0
    while eps_at(high) > epsilon:
        low, high = high, high * 2.0
        if high > max_sigma:
            raise DpSgdConfigError(
                f"epsilon={epsilon!r} at delta={delta!r} needs a noise multiplier above {max_sigma} "
                f"(num_examples={num_examples}, batch_size={batch_size}, epochs={epochs}); "
                "raise epsilon or num_examples, or lower batch_size or epochs"
            )
    while high - low > rtol * high:
        mid = (low + high) / 2.0
        if mid <= 0:
            break
        if eps_at(mid) > epsilon:
            low = mid
        else:
            high = mid
    return high


def dpsgd_spend(epsilon, delta, num_examples, batch_size, epochs, accountant="rdp"):
    """Calibrate a run to (epsilon, delta); return (sigma, event, realised epsilon, steps)."""
    sigma = calibrate_noise_multiplier(epsilon, delta, num_examples, batch_size, epochs, accountant)
    event = dpsgd_event(sigma, num_examples, batch_size, epochs)
    realised = event_epsilon(event, delta, accountant)
    return sigma, event, realised, num_steps(num_examples, batch_size, epochs)
