"""Per-unit validation: the record of a validator's test is a privacy unit (a rider, a company), not a row.

With ``per_unit=True`` (``DPLossValidator``, ``DPAccuracyValidator``) ``validate`` takes each row's unit id
(``units=``, ``train_units=``) and first replaces the rows by one value per unit: the mean of the unit's row
values, each clipped to [0, B] (``unit_means``). Everything after is the validator's own path on those values,
unchanged: a unit is one record in [0, B], so adding or removing a whole unit (however many rows) changes the
released count by 1 and the released sum by at most B: the sensitivities the releases are calibrated to, at the
validator's epsilon, for the unit. The statistic is the per-unit mean loss (accuracy): the SLA is on the
expected mean loss of a unit drawn from the units' population, and the count is the count of units.

What cannot take it is refused when the validator is made, before any charge: the accuracy validator's
``"clopper_pearson"`` bound (a binomial tail needs 0/1 values; a unit's mean accuracy is a fraction). Its
``"exact"`` bound runs, per unit, the Chernoff tail of values in [0, 1] (``noisy.joint_decision`` with
``binomial=False``: Hoeffding 1963, the moment generating function of a [0, 1] value of mean p is at most
Bernoulli(p)'s), and ``"bernstein"`` is the loss validator's, valid for any values in [0, B].
"""

from typing import Any

import numpy as np
import numpy.typing as npt

from .core import ValidationInputError, check_values

__all__ = ["unit_means", "check_per_unit"]


def check_per_unit(validator: str, per_unit: object, bound: str, binomial_bounds: tuple[str, ...] = ()) -> bool:
    """``per_unit`` as a bool; ValidationInputError naming the reason for a bound of ``binomial_bounds`` (whose
    tail needs 0/1 values) per unit, when the validator is made: before any charge."""
    if not isinstance(per_unit, bool):
        raise ValidationInputError(f"per_unit={per_unit!r} is invalid: pass True (one record per unit) or False")
    if per_unit and bound in binomial_bounds:
        raise ValidationInputError(
            f"bound {bound!r} is invalid per unit: its binomial tail needs 0/1 values and a unit's mean "
            f"{validator} is a fraction; use bound='exact' (the Chernoff tail of values in [0, 1]) or 'bernstein'"
        )
    return per_unit


def unit_means(name: str, values: npt.ArrayLike, units: npt.ArrayLike | None, bound: float) -> np.ndarray:
    """One value per unit: the mean of its rows' ``values`` clipped to [0, ``bound``] (so in [0, bound]).

    ``units``: one id per row (any hashable scalars). A length mismatch is refused naming ``name`` only (these
    are per-record values, read after the charge: no count or value in the message)."""
    rows = check_values(name, values)
    if units is None:
        raise ValidationInputError(f"{name}: a per-unit validator needs units=, one unit id per row")
    ids = np.asarray(units)
    if ids.ndim != 1 or len(ids) != len(rows):
        raise ValidationInputError(f"{name}: units must be 1-D with one unit id per row")
    _, unit = np.unique(ids.astype(str) if ids.dtype == object else ids, return_inverse=True)
    unit = unit.ravel()
    sums = np.bincount(unit, weights=np.clip(rows, 0.0, bound))
    return sums / np.bincount(unit)


def unit_records(
    validator: Any,
    test: np.ndarray,
    train: np.ndarray | None,
    units: npt.ArrayLike | None,
    train_units: npt.ArrayLike | None,
    bound: float,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(test, train) as the validator's records: per-unit means for a ``per_unit`` validator, the rows as given
    otherwise. ``units`` / ``train_units`` given to a row-level validator are refused (its release would be
    calibrated to a row while the caller meant a unit)."""
    if not validator.per_unit:
        if units is not None or train_units is not None:
            raise ValidationInputError(
                f"units= needs {type(validator).__name__}(per_unit=True): a row-level "
                "validator's release is calibrated to one row"
            )
        return test, train
    test = unit_means("test values", test, units, bound)
    train = None if train is None else unit_means("train values", train, train_units, bound)
    return test, train
