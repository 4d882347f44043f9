"""One-run audits of the DP-SGD estimators through their public ``fit`` (``sage_tfx.auditing.estimators``):
each stays below its claim as shipped, and with its noise removed after calibration (the fit still reports the
claim) each is flagged. One training run per audit, fixed seeds (deterministic)."""

from dataclasses import replace

import pytest

from sage_tfx.auditing import ESTIMATORS, audit_estimator, audit_names
from sage_tfx.privacy import noise_schedules

NAMES = sorted(ESTIMATORS)


def test_the_estimators_are_named_by_the_cli():
    assert set(NAMES) <= set(audit_names())


@pytest.mark.parametrize("name", NAMES)
def test_one_fit_of_each_estimator_stays_below_its_claim(name):
    result = audit_estimator(name)
    assert 0.0 <= result.epsilon_lower_bound <= result.claimed_epsilon, result.to_dict()
    assert result.mechanism == name and result.fit["noise_multiplier"] > 1.0


def _noise_off(monkeypatch):
    """The planted bug: the estimator's calibrated noise multipliers set to 0 after calibration."""
    real = noise_schedules.scheduled_spend

    def spend(*args, **kwargs):
        run = real(*args, **kwargs)
        return replace(run, noise_multipliers=run.noise_multipliers * 0.0)

    monkeypatch.setattr(noise_schedules, "scheduled_spend", spend)


@pytest.mark.parametrize("name", NAMES)
def test_each_estimator_with_its_noise_off_is_flagged(monkeypatch, name):
    _noise_off(monkeypatch)
    result = audit_estimator(name)
    assert result.flagged and result.epsilon_lower_bound > 1.5 * result.claimed_epsilon, result.to_dict()
