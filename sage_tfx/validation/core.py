"""What every SLAed validator shares: outcomes, the result record, the ablation modes,
the eta schedule, input checks, and Laplace-noised totals with their worst-case corrections.

numpy/scipy/stdlib only: this is part of the privacy core.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from sage_tfx.privacy.checks import is_real, positive
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.randomness import SecureRNG, as_secure_rng
from sage_tfx.privacy.samplers import grid_laplace, grid_laplace_coupling, grid_laplace_sum
from sage_tfx.privacy.vocabulary import Outcome, Stage

if TYPE_CHECKING:
    import numpy.typing as npt

    from sage_tfx.privacy.randomness import RngLike


class ValidationInputError(SageError, ValueError):
    """Bad validator input. The message names the bad value."""


class Mode(enum.StrEnum):
    """The validation variants compared in the paper's Tab. 2.

    - ``sage`` (Sage SLA): DP counts and sums, each corrected for the worst case of its Laplace noise at
      probability eta/3, then a concentration bound at eta/3.
    - ``uncorrected`` (UC DP SLA): the same DP counts and sums and the same concentration bound at eta/3,
      without the noise corrections. Not a valid SLA: the ablation shows why the correction matters.
    - ``non_private`` (NP SLA): exact counts and sums, the concentration bound at the whole eta (it is the
      only event that can fail). Spends no epsilon; the best a rigorous test can do.
    - ``no_sla`` (TFX's plain validator): the DP metric compared with the target. Never REJECTs: a plain
      validator has no negative guarantee, so a miss is a RETRY.
    """

    SAGE = "sage"
    UNCORRECTED = "uncorrected"
    NON_PRIVATE = "non_private"
    NO_SLA = "no_sla"

    @classmethod
    def parse(cls, value: Mode | str) -> Mode:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower().replace("-", "_"))
        except ValueError:
            raise ValidationInputError(f"mode {value!r} is not one of {[m.value for m in cls]}") from None

    @property
    def noisy(self) -> bool:
        """True when counts and sums carry Laplace noise (every mode but non_private)."""
        return self is not Mode.NON_PRIVATE

    @property
    def corrected(self) -> bool:
        return self is Mode.SAGE

    def event_eta(self, eta: float) -> float:
        """Failure probability given to each event of a test with failure budget ``eta``.

        With noise there are three events (count noise, sum noise, sampling), eta/3 each; the exact
        (non_private) test has only the sampling event and gives it all of eta.
        """
        return eta / 3 if self.noisy else eta


def eta_for_attempt(eta: float, attempt: int) -> float:
    """eta_i = eta / (i (i+1)) for attempt i >= 1.

    Proof that repeated validation keeps the SLA: sum_{i>=1} 1/(i(i+1)) = sum (1/i - 1/(i+1)) = 1, so by a
    union bound over any number of attempts, P(some attempt fails) <= sum_i eta_i <= eta.

    Args:
      eta: The overall failure probability, in (0, 1).
      attempt: The attempt's number i, from 1.

    Returns:
      eta_i.
    """
    eta = check_probability("eta", eta)
    if isinstance(attempt, bool) or not isinstance(attempt, numbers.Integral) or attempt < 1:
        raise ValidationInputError(f"attempt {attempt!r} must be an integer >= 1")
    return eta / (attempt * (attempt + 1))


def resolve_eta(confidence: float, eta: float | None = None, attempt: int | None = None) -> float:
    """The failure probability of one validation: explicit ``eta``, else (1 - confidence) at ``attempt``."""
    if eta is not None and attempt is not None:
        raise ValidationInputError(f"give eta ({eta!r}) or attempt ({attempt!r}), not both")
    if eta is not None:
        return check_probability("eta", eta)
    base = 1.0 - confidence
    return base if attempt is None else eta_for_attempt(base, attempt)


def split_eta(eta: float, reject_test: bool) -> tuple[float, float]:
    """(eta_accept, eta_reject): all of eta to the ACCEPT test when no REJECT test runs, else half each.

    The SLA bounds P(ACCEPT and the model misses the target) + P(REJECT and the target is reachable); with no
    REJECT test the second term is 0, so the ACCEPT test may use all of eta (the spec's halving is for List. 2,
    which always runs both)."""
    return (eta / 2, eta / 2) if reject_test else (eta, 0.0)


# ---------------------------------------------------------------- input checks


def check_positive(name: str, value: object) -> float:
    """A finite number > 0, as float; otherwise an error naming ``name`` and the value."""
    if not is_real(value):
        raise ValidationInputError(f"{name} {value!r} must be a positive number")
    return positive(value, name, error=ValidationInputError, message="{what} {value!r} must be {rule}")


def check_probability(name: str, value: object) -> float:
    """A number strictly inside (0, 1), as float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValidationInputError(f"{name} {value!r} must be a number in (0, 1)")
    value = float(value)
    if not 0.0 < value < 1.0:  # also false for NaN
        raise ValidationInputError(f"{name} {value!r} must be in (0, 1)")
    return value


def check_values(name: str, values: npt.ArrayLike) -> np.ndarray:
    """A 1-D float array of finite numbers. The refusal of a non-finite one names the array only: these are
    per-record values, often computed after a charge, so neither the value, its index nor a count is shown
    (map NaN / inf to the worst value first, as ``squared_errors(..., loss_bound=B)`` does). An empty array is a valid set
    of records (the DP release of zero records is noise only): a validator reading a split in which no record
    is usable decides on it like on any other, rather than failing after the charge with a count of 0."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValidationInputError(f"{name} must be numbers: {err}") from None
    if array.ndim != 1:
        raise ValidationInputError(f"{name} must be 1-D, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValidationInputError(
            f"{name} holds a value that is not finite (NaN or +-inf): give each such record "
            "the worst value first (e.g. squared_errors(..., loss_bound=B))"
        )
    return array


def check_rng(rng: RngLike) -> SecureRNG:
    """The noise generator: a ``randomness.SecureRNG`` (as DPModelValidator passes, keyed by the grant's seed),
    one keyed by 32 bytes of the caller's numpy Generator (reproducible for a seeded Generator), or, for
    None, one with a fresh key from ``secrets``. Never a fixed seed here."""

    if rng is not None and not isinstance(rng, (np.random.Generator, SecureRNG)):
        raise ValidationInputError(f"rng {rng!r} must be a numpy.random.Generator, a SecureRNG (or None)")
    return as_secure_rng(rng, Stage.VALIDATION.value)


# ---------------------------------------------------------------- noisy totals


def laplace_tail(scale: float, prob: float, two_sided: bool = False) -> float:
    """The t with P(Lap(scale) > t) = prob (one-sided) or P(|Lap(scale)| > t) = prob (two-sided).

    P(Lap(b) > t) = exp(-t/b)/2, so t = b ln(1/(2 prob)); P(|Lap(b)| > t) = exp(-t/b), so t = b ln(1/prob).
    (prob <= 1/2 for the one-sided tail, always true here since prob <= eta/3.)

    Args:
      scale: The Laplace scale b > 0.
      prob: The tail probability, in (0, 1/2] one-sided.
      two_sided: The two-sided tail P(|Lap(b)| > t) instead.

    Returns:
      t.
    """
    if scale == 0.0:
        return 0.0
    return scale * math.log(1.0 / prob) if two_sided else scale * math.log(1.0 / (2.0 * prob))


@dataclass(frozen=True)
class NoisyTotal:
    """A count or a sum released as ``exact + Lap(scale) + xi`` in law, |xi| <= slack (scale 0: released exactly).

    The release is the exact grid Laplace (``samplers.grid_laplace``); ``scale`` and ``slack`` are its
    coupling (``samplers.grid_laplace_coupling``): in law value = exact + L + xi with L ~ Laplace(scale)
    and |xi| <= slack = 3 gamma / 2, so every float-Laplace tail bound below holds after widening by slack.
    """

    value: float
    scale: float
    slack: float = 0.0

    @classmethod
    def release(
        cls,
        exact: float | np.ndarray,
        sensitivity: float,
        epsilon: float | None,
        rng: RngLike,
        mode: Mode,
        cells: int = 1,
    ) -> NoisyTotal:
        """The grid-Laplace release of ``exact`` (one cell) with ``sensitivity`` and ``epsilon``.

        ``exact``: an integer total (a count: exact in float64 below 2^53), or the per-record values of a sum (a
        1-D array), then summed exactly on the grid (``samplers.grid_laplace_sum``), never in float64 first: a
        float sum's rounding depends on the other records and their order, and breaks the integer sensitivity
        the proof uses. Epsilon-DP,
        exactly, for a total whose value one record changes by at most ``sensitivity`` (``grid_laplace``:
        rounding to the public grid gamma and adding gamma times exact discrete Laplace noise of integer scale
        t = ceil((floor(sensitivity/gamma) + 1)/epsilon)). Its noise scale gamma t is within a relative 2^-20
        of sensitivity/epsilon. Released exactly in non_private mode. ``rng``: see ``check_rng``. ``cells`` > 1:
        this total is one coordinate of a vector released together (every coordinate with the same
        sensitivity, epsilon and cells), whose change by one record has L1 norm <= sensitivity and touches
        at most ``cells`` coordinates: then the vector is epsilon-DP (``grid_laplace`` with k = cells)."""
        records = np.ndim(exact) > 0
        if not mode.noisy:
            return cls(math.fsum(np.asarray(exact, dtype=np.float64).tolist()) if records else float(exact), 0.0)
        epsilon = cast(float, epsilon)  # None only in non_private mode (above)
        if records:
            value = grid_laplace_sum(
                np.asarray(exact, dtype=np.float64), sensitivity, epsilon, as_secure_rng(rng), cells=cells
            )[0]
        else:
            value = grid_laplace(np.array([float(exact)]), sensitivity, epsilon, as_secure_rng(rng), cells=cells)[0]
        return cls.coupled(value, sensitivity, epsilon, cells)

    @classmethod
    def coupled(cls, value: float, sensitivity: float, epsilon: float, cells: int = 1) -> NoisyTotal:
        """A grid-Laplace release ``value`` with its coupling's scale and slack (``samplers.grid_laplace_coupling``)."""

        scale, slack = grid_laplace_coupling(sensitivity, epsilon, cells)
        return cls(float(value), scale, slack)

    def lower(self, prob: float, mode: Mode, two_sided: bool = False) -> float:
        """<= the exact total except with probability ``prob`` (one-sided), when the mode corrects.
        (value - exact = L + xi with |xi| <= slack: value - tail - slack > exact needs L > tail.)"""
        return self.value - (laplace_tail(self.scale, prob, two_sided) + self.slack if mode.corrected else 0.0)

    def upper(self, prob: float, mode: Mode, two_sided: bool = False) -> float:
        """>= the exact total except with probability ``prob`` (one-sided), when the mode corrects."""
        return self.value + (laplace_tail(self.scale, prob, two_sided) + self.slack if mode.corrected else 0.0)


# ---------------------------------------------------------------- the result


def _json_safe(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None  # an undefined bound (e.g. noisy count <= 0)
    return value


@dataclass
class ValidationResult:
    """One validation: the outcome, the bounds behind it, the epsilon spent and the eta/confidence used.

    ``metric`` is the released point estimate (DP in every mode but non_private). ``bounds`` holds the
    bounds the decision used (e.g. ``upper`` for ACCEPT, ``lower`` for REJECT); a bound is +-inf (None in
    ``to_dict``) when its noisy count was not positive. Epsilon is charged to the test set
    (``epsilon_test``) and, when a REJECT test ran, to the training set (``epsilon_train``); it does not
    depend on the data. ``epsilon_spent`` is their sum (always safe; with a per-record train/test split the
    two sets are disjoint and the max suffices by parallel composition).

    Args:
      outcome: The decision (``Outcome``).
      validator: The validator's name.
      mode: The ``Mode`` it ran in.
      target: The SLA target the metric is tested against.
      metric: The released point estimate (None when none was released).
      bounds: The bounds the decision used, by name.
      epsilon_test: The epsilon charged to the test set.
      epsilon_train: The epsilon charged to the training set (the REJECT test; 0 without one).
      eta: The failure probability this validation used.
      attempt: The attempt's number (``eta_for_attempt``), if any.
      details: Further figures, JSON-able.
    """

    outcome: Outcome
    validator: str
    mode: str
    target: float
    metric: float | None
    bounds: dict
    epsilon_test: float
    epsilon_train: float
    eta: float
    attempt: int | None = None
    details: dict = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        return 1.0 - self.eta

    @property
    def epsilon_spent(self) -> float:
        return self.epsilon_test + self.epsilon_train

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPT

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (non-finite numbers become None)."""
        return _json_safe(
            {
                "outcome": self.outcome,
                "validator": self.validator,
                "mode": self.mode,
                "target": self.target,
                "metric": self.metric,
                "bounds": self.bounds,
                "epsilon_test": self.epsilon_test,
                "epsilon_train": self.epsilon_train,
                "epsilon_spent": self.epsilon_spent,
                "eta": self.eta,
                "confidence": self.confidence,
                "attempt": self.attempt,
                "details": self.details,
            }
        )
