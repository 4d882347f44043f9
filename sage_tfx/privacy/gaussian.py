"""Gaussian noise calibration: every Gaussian multiplier, zCDP rho and Gaussian epsilon of sage-tfx.

Contract: a "Gaussian-type" release of noise multiplier ``c`` (noise std = c times its L2 sensitivity) has
Renyi divergence at most ``alpha / (2 c^2)`` at every order alpha, as the continuous Gaussian and the grid
discrete Gaussian (``samplers.grid_gaussian``) do. Its (epsilon, delta) guarantee here is the RDP conversion
over ``curves.calibration_accountant``'s orders (Balle et al. 2020), never the continuous Gaussian's analytic
profile, which is not proven for the grid releases. Proof: docs/noise.md, "Grid Gaussian".
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dp_accounting

from .curves import calibration_accountant

LOWER_FRACTION = 1e-3  # the search's lower endpoint, as a fraction of its guess: never (epsilon, delta)-DP
RELATIVE_TOL = 1e-7  # the search's tolerance, as a fraction of its guess
# dp_accounting is imported inside the functions: it takes seconds to import, and the ledger never needs it


def releases_event(multiplier: float, releases: int = 1) -> dp_accounting.DpEvent:
    """``releases`` Gaussian releases of ``multiplier``, composed (one ``GaussianDpEvent`` if ``releases`` is 1)."""
    import dp_accounting

    event = dp_accounting.GaussianDpEvent(noise_multiplier=multiplier)
    return event if releases == 1 else dp_accounting.ComposedDpEvent([event] * releases)


def classic_guess(epsilon: float, delta: float, releases: int = 1) -> float:
    """sqrt(releases) * sqrt(2 ln(1.25 / delta)) / epsilon: the classic Gaussian multiplier, a search start only."""
    return math.sqrt(releases) * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


@functools.lru_cache(maxsize=1024)
def rdp_multiplier(epsilon: float, delta: float, *, releases: int = 1, guess: float | None = None) -> float:
    """Smallest multiplier c whose ``releases`` Gaussian-type releases are jointly (epsilon, delta)-DP (RDP).

    Searched by dp_accounting's ``mechanism_calibration.calibrate_dp_mechanism`` from ``guess`` (default
    ``classic_guess``), bracket ``[guess * LOWER_FRACTION, guess]`` widened upward as needed, tolerance
    ``guess * RELATIVE_TOL``. The returned c always meets the target (the search keeps its feasible endpoint);
    it exceeds the smallest such c by at most the tolerance. Memoized: a deterministic search of public
    numbers, repeated by every release of the same budget (one search takes ~30 ms).

    Args:
      epsilon: target epsilon > 0.
      delta: target delta in (0, 1).
      releases: how many releases of c a record's guarantee composes.
      guess: a start for the search (any positive number; the bracket is widened from it).
    """
    from dp_accounting import mechanism_calibration

    guess = classic_guess(epsilon, delta, releases) if guess is None else float(guess)
    return float(
        mechanism_calibration.calibrate_dp_mechanism(
            calibration_accountant,
            lambda c: releases_event(c, releases),
            epsilon,
            delta,
            bracket_interval=mechanism_calibration.LowerEndpointAndGuess(guess * LOWER_FRACTION, guess),
            tol=guess * RELATIVE_TOL,
        )
    )


def zcdp_rho(epsilon: float, delta: float) -> float:
    """rho with rho-zCDP => (epsilon, delta)-DP: 1 / (2 z^2), z = ``rdp_multiplier(epsilon, delta)``."""
    return 1.0 / (2.0 * rdp_multiplier(epsilon, delta) ** 2)


def rdp_event_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    """Epsilon at ``delta`` of a DpEvent of Gaussian-type releases, by the RDP conversion this module calibrates
    against. inf at delta 0 (no RDP conversion to pure DP)."""
    if not delta > 0:
        return math.inf
    return float(calibration_accountant().compose(event).get_epsilon(float(delta)))


def rdp_epsilon(multiplier: float, delta: float, releases: int = 1) -> float:
    """Epsilon at ``delta`` of ``releases`` Gaussian-type releases of ``multiplier`` (``rdp_event_epsilon``)."""
    return rdp_event_epsilon(releases_event(multiplier, releases), delta)


def analytic_delta(epsilon: float, multiplier: float) -> float:
    """Exact delta(epsilon) of ONE continuous Gaussian mechanism of ``multiplier`` (Balle & Wang 2018, Thm. 8):
    Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s), in log space so large epsilon does not overflow.

    A comparison only (the paper's AdaSSP claim, the DP-SGD audit's tests): no release is calibrated by it.
    """
    from scipy.special import log_ndtr  # noqa: PLC0415 (scipy loads in seconds: only where it is used)

    s = float(multiplier)
    a = 1.0 / (2.0 * s)
    first = math.exp(log_ndtr(a - epsilon * s))
    second = math.exp(epsilon + log_ndtr(-a - epsilon * s))
    return max(0.0, first - second)
