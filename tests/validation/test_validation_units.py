"""Per-unit validators: a privacy unit's rows are one record of the test, so one unit moves a release by one record.

The attack as a row-level validator allows it: a unit with K rows of worst loss moves the released sum by K B, so
a release at epsilon leaks K epsilon about that unit. With ``per_unit=True`` the unit's rows are first replaced
by their mean (one value in [0, B]) and the count is the count of units. All data here is GENERATED.
"""

import numpy as np
import pytest

from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.validation import DPAccuracyValidator, DPLossValidator, Outcome, ValidationInputError
from sage_tfx.validation.units import unit_means
from tests.helpers.neighbours import violations as neighbour_violations

K = 5


def _rows(units=100, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0.0, 0.6, size=units * 3), np.repeat(np.arange(units), 3)


def test_unit_means_are_one_clipped_value_per_unit():
    values = np.array([0.2, 5.0, 0.4, -1.0, 0.9])
    means = unit_means("test values", values, ["b", "a", "b", "c", "a"], bound=1.0)
    np.testing.assert_allclose(means, [(1.0 + 0.9) / 2, (0.2 + 0.4) / 2, 0.0])  # units a, b, c; clipped first


def test_a_per_unit_validator_counts_units_and_accepts_on_their_means():
    values, units = _rows(units=2000)
    result = DPLossValidator(0.4, 1.0, loss_bound=1.0, per_unit=True).validate(
        values, rng=secure_rng(0, "t"), units=units
    )
    assert result.outcome is Outcome.ACCEPT
    assert abs(result.details["n_noisy"] - 2000) < 50  # the count of units, not of the 6,000 rows
    correct = (values < 0.45).astype(float)
    accuracy = DPAccuracyValidator(0.6, 1.0, per_unit=True).validate(correct, rng=secure_rng(1, "t"), units=units)
    assert accuracy.outcome is Outcome.ACCEPT and abs(accuracy.details["n_noisy"] - 2000) < 50


@pytest.mark.parametrize(
    "make, call, match",
    [
        (
            lambda: DPAccuracyValidator(0.6, 1.0, per_unit=True, bound="clopper_pearson"),
            None,
            "bound 'clopper_pearson' is invalid per unit: its binomial tail needs 0/1 values",
        ),
        (lambda: DPLossValidator(0.3, 1.0, per_unit="yes"), None, "per_unit='yes' is invalid"),
        (lambda: DPLossValidator(0.3, 1.0, per_unit=True), {}, "a per-unit validator needs units="),
        (lambda: DPLossValidator(0.3, 1.0, per_unit=True), {"units": np.arange(5)}, "one unit id per row"),
        (
            lambda: DPLossValidator(0.3, 1.0),
            {"units": np.arange(300)},
            r"units= needs DPLossValidator\(per_unit=True\)",
        ),
        (
            lambda: DPAccuracyValidator(0.6, 1.0),
            {"units": np.arange(300)},
            r"units= needs DPAccuracyValidator\(per_unit=True\)",
        ),
    ],
)
def test_what_cannot_be_calibrated_to_the_unit_is_refused_before_any_noise(make, call, match):
    values, _ = _rows()
    with pytest.raises(ValidationInputError, match=match):
        validator = make()
        draws = []

        class Counting:  # a generator that records whether anything was drawn from it
            def __getattr__(self, name):
                draws.append(name)
                raise AssertionError("noise drawn")

        validator.validate((values < 0.3).astype(float), rng=Counting(), **call)
    assert call is None or draws == []


def _released_sums(validator, values, units, draws, seed):
    rng = secure_rng(seed, "unit-validator-neighbours")
    kwargs = {} if units is None else {"units": units}
    return np.array([validator.validate(values, rng=rng, **kwargs).details["sum_noisy"] for _ in range(draws)])


@pytest.mark.slow
def test_neighbours_differing_by_a_whole_unit_give_validator_releases_within_e_to_the_epsilon():
    """D holds one unit of K rows of worst loss B more than D'. The validator's release (the noisy clipped sum) at
    epsilon must satisfy P[M(D) in S] <= e^eps P[M(D') in S] for S = {out >= c} and {out <= c} at four cuts,
    from 10,000 draws each (fixed seeds); each comparison allows 4.5 standard errors (binomial variance of both
    rates): a correct release fails one with probability below 3.4e-6, the 8 below 3e-5 (union bound). The
    row-level validator on the same rows moves by K B: far past e^eps at the far cuts."""
    eps, draws = 1.0, 10000
    values, units = _rows()
    heavy_values = np.concatenate([values, np.ones(K)])
    heavy_units = np.concatenate([units, np.full(K, 10_000)])
    base = float(np.sum(unit_means("v", values, units, 1.0)))

    def violations(per_unit):
        validator = DPLossValidator(0.3, eps, loss_bound=1.0, per_unit=per_unit, mode="no_sla")
        if per_unit:
            d, d_prime = (
                _released_sums(validator, heavy_values, heavy_units, draws, 1),
                _released_sums(validator, values, units, draws, 2),
            )
            shift = 1.0
        else:
            d, d_prime = (
                _released_sums(validator, heavy_values, None, draws, 1),
                _released_sums(validator, values, None, draws, 2),
            )
            base_rows = float(np.sum(values))
            d, d_prime, shift = d - base_rows + base, d_prime - base_rows + base, float(K)
        return [(shift, *v) for v in neighbour_violations(d, d_prime, base, eps)]

    assert violations(per_unit=True) == []
    assert violations(per_unit=False)  # the row-level release: the unit's K rows move it K times as far
