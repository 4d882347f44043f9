"""Gaussian calibration (sage_tfx/privacy/gaussian.py): the one home of the multipliers the releases use.

Each former caller's own search is written out here as it was (same accountant, bracket and tolerance), and the
module must give the same multiplier to within the searches' tolerances on a grid of budgets.
"""

import math

import dp_accounting
import pytest
from dp_accounting import mechanism_calibration

from sage_tfx.privacy import adassp, gaussian
from sage_tfx.privacy.curves import calibration_accountant

GRID = [(eps, delta) for eps in (0.1, 0.5, 1.0, 3.0, 10.0) for delta in (1e-9, 1e-6, 1e-5, 1e-3)]


def _old_continual_z(epsilon, delta):
    """continual.calibrate_z_eff as it was: one Gaussian, bracket [1e-3, 1e4], absolute tolerance 1e-6."""
    return float(
        mechanism_calibration.calibrate_dp_mechanism(
            calibration_accountant,
            lambda z: dp_accounting.GaussianDpEvent(z),
            epsilon,
            delta,
            mechanism_calibration.ExplicitBracketInterval(1e-3, 1e4),
            tol=1e-6,
        )
    )


def _old_adassp_c(epsilon, delta, releases):
    """adassp.exact_multiplier as it was: from the paper's c, bracket [c 1e-3, c], tolerance c 1e-7."""
    guess = adassp.paper_multiplier(epsilon, delta)
    return float(
        mechanism_calibration.calibrate_dp_mechanism(
            calibration_accountant,
            lambda c: dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(noise_multiplier=c)] * releases),
            epsilon,
            delta,
            bracket_interval=mechanism_calibration.LowerEndpointAndGuess(guess * 1e-3, guess),
            tol=guess * 1e-7,
        )
    )


@pytest.mark.parametrize("epsilon,delta", GRID)
def test_the_one_search_gives_the_former_callers_multipliers(epsilon, delta):
    z = gaussian.rdp_multiplier(epsilon, delta)
    tol = max(1e-6, gaussian.classic_guess(epsilon, delta) * gaussian.RELATIVE_TOL)
    assert abs(z - _old_continual_z(epsilon, delta)) <= tol  # continual.calibrate_z_eff and growth's mean
    assert gaussian.zcdp_rho(epsilon, delta) == 1 / (2 * z**2)  # growth.rho_for was 1 / (2 z^2) of the same z
    for releases in (3, 12):  # adassp.exact_multiplier keeps its own start, so its numbers are the same
        assert adassp.exact_multiplier(epsilon, delta, releases) == _old_adassp_c(epsilon, delta, releases)


@pytest.mark.parametrize("epsilon,delta", GRID)
@pytest.mark.parametrize("releases", [1, 3])
def test_the_multiplier_meets_the_target_and_is_the_smallest(epsilon, delta, releases):
    c = gaussian.rdp_multiplier(epsilon, delta, releases=releases)
    assert gaussian.rdp_epsilon(c, delta, releases) <= epsilon
    slack = 2 * gaussian.classic_guess(epsilon, delta, releases) * gaussian.RELATIVE_TOL
    assert gaussian.rdp_epsilon(c - slack, delta, releases) > epsilon


def test_the_event_epsilon_is_the_rdp_conversion_and_inf_at_delta_zero():
    event = gaussian.releases_event(4.0, 3)
    expected = calibration_accountant().compose(event).get_epsilon(1e-5)
    assert gaussian.rdp_event_epsilon(event, 1e-5) == expected == gaussian.rdp_epsilon(4.0, 1e-5, 3)
    assert gaussian.rdp_event_epsilon(event, 0.0) == math.inf
