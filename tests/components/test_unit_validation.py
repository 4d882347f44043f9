"""DPModelValidator on a unit stream: the platform runs the test per unit at the validation stage's whole share.

The exploit as the platform allowed it: on a stream whose unit has up to K rows, handing a row-level test the
whole share (instead of epsilon / K) lets one unit's K rows move its release K times as far as the epsilon it was
charged. Now the validation plan (``validation_plan``, from the verified grant only) names the grant's signed unit
column, gets the whole share, and ``make_validator`` builds the per-unit test: a whole unit added moves the
released statistic within e^epsilon of that share (statistical test, fixed seeds), while the row-level test at
the same share does not. The ledger side (the per-unit release, its refusals and the audit):
tests/privacy/test_unit_share.py; a real `sage run`: tests/pipelines/test_privacy_unit_runs.py.
"""

import numpy as np
import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.privacy import BudgetSplit, GrantError, Ledger, stage_budget
from sage_tfx.privacy.randomness import secure_rng
from tests.helpers.neighbours import violations

pytestmark = pytest.mark.tf

UNIT, K = "tailnum", 5
SPLIT = BudgetSplit.for_epsilon(2.0, 1e-7)


def _plan(tmp_path, unit=UNIT, **props):
    from sage_tfx.components.dp_model_validator_executor import validation_plan

    tmp_path.mkdir(exist_ok=True)
    db = str(tmp_path / "l.db")
    with Ledger.open(db, create=True) as ledger:
        kwargs = {} if unit is None else {"privacy_unit": unit, "max_rows_per_unit": K}
        ledger.create_stream("s", 10.0, 1e-5, **kwargs)
        ledger.add_block("s", "b0", start=0.0, end=86400.0, rows=300, digest="aa")
        grant = ledger.request("p", "s", blocks=["b0"], epsilon=2.0, delta=1e-7, split=SPLIT)
    props = {
        "grant": grant.to_json(),
        "ledger": db,
        "metric": "mse",
        "target": 0.5,
        "label_key": "y",
        "loss_bound": 1.0,
        **props,
    }
    return validation_plan(props, grant), grant


def test_the_plan_on_a_unit_stream_names_the_signed_unit_and_takes_the_whole_share(tmp_path):
    from sage_tfx.components.dp_model_validator_executor import make_validator

    plan, grant = _plan(tmp_path)
    assert plan["unit_column"] == UNIT and plan["epsilon"] == pytest.approx(SPLIT.validation)
    assert stage_budget(grant, "validation")[0] == pytest.approx(SPLIT.validation / K)  # every other reader
    assert make_validator(plan).per_unit
    row_plan, _ = _plan(tmp_path / "rows", unit=None)
    assert "unit_column" not in row_plan and not make_validator(row_plan).per_unit
    with pytest.raises(GrantError, match="its whole share, the test run per unit"):
        _plan(tmp_path / "over", epsilon=SPLIT.validation * 1.01)


def _sums(validator, values, units, seed, draws=3000):
    rng = secure_rng(seed, "unit-stream-validator")
    return np.array([validator.validate(values, rng=rng, units=units).details["sum_noisy"] for _ in range(draws)])


@pytest.mark.slow
def test_a_whole_unit_moves_the_release_at_the_whole_share_within_e_to_the_epsilon(tmp_path):
    """D' holds 100 units of 3 rows; D adds one unit of K rows at the worst loss B = 1. The plan's per-unit test at
    the whole share (epsilon 1.5, 3,000 draws each) stays within e^epsilon at every cut (tests/helpers/neighbours.py:
    a correct release fails with probability below 3e-5); the row-level test at that share moves by K B and does not."""
    from sage_tfx.components.dp_model_validator_executor import make_validator
    from sage_tfx.validation import DPLossValidator
    from sage_tfx.validation.units import unit_means

    plan, _ = _plan(tmp_path)
    rng = np.random.default_rng(0)
    values, units = rng.uniform(0.0, 0.6, size=300), np.repeat(np.arange(100), 3).astype(str)
    heavy, heavy_units = np.concatenate([values, np.ones(K)]), np.concatenate([units, np.full(K, "N-new")])
    base = float(np.sum(unit_means("v", values, units, 1.0)))
    validator = make_validator(plan)
    d, d_prime = _sums(validator, heavy, heavy_units, 1), _sums(validator, values, units, 2)
    assert violations(d, d_prime, base, plan["epsilon"]) == []

    row_level = DPLossValidator(plan["target"], plan["epsilon"], loss_bound=1.0)
    d, d_prime = (_sums(row_level, heavy, None, 1, 1000), _sums(row_level, values, None, 2, 1000))
    shift = float(np.sum(values)) - base  # the row-level sums on the per-unit scale of the cuts
    assert violations(d - shift, d_prime - shift, base, plan["epsilon"])
