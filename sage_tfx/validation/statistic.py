"""DPAbsoluteErrorValidator: SLAed validation of the absolute error of DP per-key means (paper App. B)."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from sage_tfx.privacy.samplers import grid_laplace, grid_laplace_coupling, grid_laplace_sum

from .bounds import hoeffding_width
from .core import (
    Mode,
    Outcome,
    ValidationInputError,
    ValidationResult,
    check_positive,
    check_probability,
    check_rng,
    check_values,
    laplace_tail,
    resolve_eta,
)
from .loss import _check_epsilon

if TYPE_CHECKING:
    import numpy.typing as npt

    from sage_tfx.privacy.randomness import RngLike

    from .core import ValidationResult


def mean_error_bound(
    dp_sum: float, dp_count: float, value_range: float, epsilon: float, delta: float, mode: Mode
) -> float:
    """Bound on |m~ - mu| for one key's DP mean m~ = clip(S~/c~, 0, R), with probability >= 1 - delta.

    Inputs: S~ = S + Lap(2R/eps), c~ = c + Lap(2/eps), S the sum of c values clipped to [0, R] (the release of
    ``dp_group_by_mean``: eps/2 each, so the released pair is eps-DP), mu the population mean of the
    clipped values.

        t_s = (2R/eps) ln(3/delta)     t_c = (2/eps) ln(3/delta)     c_lo = c~ - t_c
        err = (t_s + R t_c) / c_lo + R sqrt(ln(6/delta) / (2 c_lo))      (infinite unless c_lo > 0)

    The releases are the exact grid Laplace (``samplers.grid_laplace`` with sensitivity R, resp. 1, at eps/2,
    one cell per record): in law S~ = S + L_s + xi_s with L_s ~ Lap(b_s), |xi_s| <= slack_s
    (``samplers.grid_laplace_coupling``; b_s within a relative 2^-20 of 2R/eps), likewise for c~; so the
    code takes t_s = b_s ln(3/delta) + slack_s and t_c = b_c ln(3/delta) + slack_c, and the events below
    are about L_s and L_c.
    Proof: three events, delta/3 each: (1) |Lap(2R/eps)| > t_s (P = exp(-ln(3/delta)) = delta/3),
    (2) |Lap(2/eps)| > t_c, (3) two-sided Hoeffding |S/c - mu| > R sqrt(ln(6/delta)/(2c)). Outside them,
    with e_s, e_c the noises: S~/c~ - S/c = (e_s - (S/c) e_c) / c~, so |S~/c~ - S/c| <= (t_s + R t_c)/c~;
    c_lo <= c~ and c_lo <= c (event 2), hence |S~/c~ - mu| <= (t_s + R t_c)/c_lo + R sqrt(ln(6/delta)/(2c))
    <= err. Clipping the estimate into [0, R], which contains mu, cannot increase the error. Post-processing:
    no privacy cost beyond the release. UC mode: t_s = t_c = 0 with the same delta/3 for Hoeffding;
    NP mode: exact S and c, Hoeffding at the whole delta.

    Args:
      dp_sum: S~, the released sum.
      dp_count: c~, the released count.
      value_range: R, the values' clipping range [0, R].
      epsilon: The release's epsilon.
      delta: The bound's failure probability.
      mode: The validation ``Mode``.

    Returns:
      The bound (inf unless c_lo > 0).
    """
    sampling_delta = mode.event_eta(delta)
    if mode.corrected:
        # tolerance: dp_group_by_mean's tables were drawn at epsilon' = R / fl(2R/eps), within float
        # rounding of eps/2 (noise.add_laplace); the bounds hold for every epsilon' in that range
        scale_s, slack_s = grid_laplace_coupling(value_range, epsilon / 2.0, 1, epsilon_tolerance=2.0**-40)
        scale_c, slack_c = grid_laplace_coupling(1.0, epsilon / 2.0, 1, epsilon_tolerance=2.0**-40)
        t_s = laplace_tail(scale_s, delta / 3, two_sided=True) + slack_s
        t_c = laplace_tail(scale_c, delta / 3, two_sided=True) + slack_c
    else:
        t_s = t_c = 0.0
    c_lo = dp_count - t_c
    if c_lo <= 0:
        return math.inf
    return (t_s + value_range * t_c) / c_lo + hoeffding_width(c_lo, sampling_delta, value_range)


class DPAbsoluteErrorValidator:
    """SLAed validation of DP per-key means: ACCEPT iff every key's DP mean is within ``target`` of its
    population mean, with probability >= 1 - eta over the data and the noise.

    ``DPAbsoluteErrorValidator(target, epsilon, confidence=0.95, value_range=R, num_keys=K, per_key=False,
    mode="sage")``; ``.validate(values, rng=None, keys=None, attempt=None, eta=None)`` with the raw values (clipped
    to [0, R]) and their integer keys in [0, K) (``values`` may also be a ``(keys, values)`` pair). The
    validator releases the statistic itself: per key, c~ = count + Lap(2/eps) and S~ = clipped sum +
    Lap(2R/eps), each drawn as the exact grid Laplace (``samplers.grid_laplace(sums, R, eps/2, cells=1)`` and
    ``grid_laplace(counts, 1, eps/2, cells=1)``: eps/2-DP each, exactly; eps-DP together; each record is in
    one key, so one record touches one cell of each), the DP mean
    clip(S~/c~, 0, R) (R/2 when c~ <= 0), returned in ``details["means"]``; the validation is post-processing.
    ``validate_released`` validates means already released that way (e.g. by ``dp_group_by_mean``) at no
    extra privacy cost. Each key gets eta/K (union bound over K public keys); ``per_key=True`` instead states
    the SLA per key at eta each (outcome ACCEPT iff every key passes; ``details["key_accepted"]`` per key).
    There is no REJECT: more data always shrinks the error bound, so a miss is a RETRY; ``train_values``
    must be None (a statistic has no training set) and the no_sla mode does not apply (no error estimate).
    """

    name = "absolute_error"
    num_keys: int

    def __init__(
        self,
        target: float,
        epsilon: float | None,
        confidence: float = 0.95,
        *,
        value_range: float,
        num_keys: int = 1,
        per_key: bool = False,
        mode: Mode | str = "sage",
    ) -> None:
        """An absolute-error validator of DP per-key means (the class docstring says what it guarantees).

        Args:
          target: The largest absolute error of a key's DP mean (> 0).
          epsilon: The epsilon of the released sums and counts (None only in "non_private" mode).
          confidence: 1 - eta, the SLA's confidence (``validate``'s ``eta`` or ``attempt`` refine it).
          value_range: R: values are clipped to [0, R] (public).
          num_keys: K, the number of keys (groups) released.
          per_key: False: every key within target with probability 1 - eta (eta / K each); True: the SLA per key
            at eta each (ACCEPT iff every key passes; ``details["key_accepted"]`` per key).
          mode: A ``Mode`` (or its name): "sage" (default), "uc" or "non_private" ("no_sla" is refused).

        Raises:
          ValidationInputError: A value out of its range (named with the fix), before anything is drawn.
        """
        self.mode = Mode.parse(mode)
        if self.mode is Mode.NO_SLA:
            raise ValidationInputError(
                "mode 'no_sla' does not apply to an absolute error: there is no "
                "point estimate of the error to compare with the target"
            )
        self.target = check_positive("target absolute error", target)
        self.epsilon = _check_epsilon("epsilon", epsilon, self.mode)
        self.confidence = check_probability("confidence", confidence)
        self.value_range = check_positive("value_range R", value_range)
        if isinstance(num_keys, bool) or not isinstance(num_keys, numbers.Integral) or num_keys < 1:
            raise ValidationInputError(f"num_keys {num_keys!r} must be an integer >= 1")
        self.num_keys = int(num_keys)
        self.per_key = bool(per_key)

    def validate(
        self,
        test_values: npt.ArrayLike,
        train_values: npt.ArrayLike | None = None,
        rng: RngLike = None,
        *,
        keys: npt.ArrayLike | None = None,
        attempt: int | None = None,
        eta: float | None = None,
    ) -> ValidationResult:
        """Release each key's sum and count with this validator's epsilon and test the error of the DP means.

        Args:
          test_values: The values (or a (keys, values) pair); clipped to [0, R].
          train_values: Must be None: an absolute-error SLA has no REJECT test.
          rng: The noise generator (``check_rng``): a SecureRNG, a numpy Generator or None (a fresh key).
          keys: Each value's key in [0, num_keys) (None: one key).
          attempt: The validation's attempt number i >= 1 (eta / (i (i + 1)) of the failure budget).
          eta: The failure probability to use (overrides ``confidence`` and ``attempt``).

        Returns:
          The ``ValidationResult`` (ACCEPT or RETRY), the DP means' error bounds in its details.

        Raises:
          ValidationInputError: A bad input (named with the fix), before anything is drawn.
        """
        if train_values is not None:
            raise ValidationInputError("train_values must be None: an absolute-error SLA has no REJECT test")
        if isinstance(test_values, tuple) and len(test_values) == 2 and keys is None:
            keys, test_values = test_values
        values = check_values("values", test_values)
        keys = self._check_keys(keys, values.size)
        rng = check_rng(rng)
        clipped = np.clip(values, 0.0, self.value_range)
        counts = np.bincount(keys, minlength=self.num_keys).astype(np.float64)
        if self.mode.noisy:  # exact grid Laplace, one record in one key's cell (see mean_error_bound)
            # the records summed exactly on the grid, per key (never a float64 sum first)
            sums = grid_laplace_sum(
                clipped, self.value_range, self.epsilon / 2.0, rng, cells=1, keys=keys, num_cells=self.num_keys
            )
            counts = grid_laplace(counts, 1.0, self.epsilon / 2.0, rng, cells=1)
        else:
            sums = np.bincount(keys, weights=clipped, minlength=self.num_keys).astype(np.float64)
        result = self._decide(sums, counts, self.epsilon, resolve_eta(self.confidence, eta, attempt), attempt)
        result.epsilon_test = self.epsilon if self.mode.noisy else 0.0
        return result

    def validate_released(
        self, dp_sums: npt.ArrayLike, dp_counts: npt.ArrayLike, *, attempt: int | None = None, eta: float | None = None
    ) -> ValidationResult:
        """Validate per-key means released as S~ = S + Lap(2R/eps), c~ = c + Lap(2/eps) with this validator's
        epsilon and R (e.g. ``dp_group_by_mean``'s tables). Post-processing: spends no epsilon.

        Args:
          dp_sums: S~ per key (``num_keys`` of them).
          dp_counts: c~ per key, in the same order.
          attempt: The validation's attempt number i >= 1 (eta / (i (i + 1)) of the failure budget).
          eta: The failure probability to use (overrides ``confidence`` and ``attempt``).

        Returns:
          The ``ValidationResult`` (ACCEPT or RETRY).

        Raises:
          ValidationInputError: Not ``num_keys`` sums and counts, or a non-finite one.
        """
        sums = check_values("dp_sums", np.ravel(dp_sums))
        counts = check_values("dp_counts", np.ravel(dp_counts))
        if sums.size != self.num_keys or counts.size != self.num_keys:
            raise ValidationInputError(
                f"dp_sums ({sums.size}) and dp_counts ({counts.size}) must have num_keys = {self.num_keys} entries"
            )
        result = self._decide(sums, counts, self.epsilon, resolve_eta(self.confidence, eta, attempt), attempt)
        result.epsilon_test = 0.0
        return result

    def _decide(self, sums, counts, epsilon, eta, attempt):
        key_eta = eta if self.per_key else eta / self.num_keys
        errors = np.array(
            [mean_error_bound(s, c, self.value_range, epsilon, key_eta, self.mode) for s, c in zip(sums, counts)]
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            means = np.where(counts > 0, np.clip(sums / counts, 0.0, self.value_range), self.value_range / 2)
        accepted = errors <= self.target
        outcome = Outcome.ACCEPT if accepted.all() else Outcome.RETRY
        return ValidationResult(
            outcome=outcome,
            validator=self.name,
            mode=self.mode.value,
            target=self.target,
            metric=None,
            bounds={"error": float(errors.max()), "key_errors": errors.tolist()},
            epsilon_test=0.0,
            epsilon_train=0.0,
            eta=eta,
            attempt=attempt,
            details={
                "means": means.tolist(),
                "key_eta": key_eta,
                "per_key": self.per_key,
                "key_accepted": accepted.tolist(),
                "value_range": self.value_range,
                "num_keys": self.num_keys,
            },
        )

    def _check_keys(self, keys, size):
        if keys is None:
            if self.num_keys != 1:
                raise ValidationInputError(f"keys are required with num_keys = {self.num_keys}")
            return np.zeros(size, dtype=np.int64)
        array = np.asarray(keys)
        if array.shape != (size,):
            raise ValidationInputError(f"keys shape {array.shape} does not match values shape ({size},)")
        if not np.issubdtype(array.dtype, np.integer):
            raise ValidationInputError(f"keys must be integers in [0, {self.num_keys}), got dtype {array.dtype}")
        bad = (array < 0) | (array >= self.num_keys)
        if bad.any():
            index = int(np.flatnonzero(bad)[0])
            raise ValidationInputError(f"keys[{index}] = {array[index]!r} is outside [0, {self.num_keys})")
        return array.astype(np.int64)
