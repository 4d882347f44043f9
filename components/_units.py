"""DPModelValidator on a stream with a privacy unit: the test calibrated to the unit, at the stage's whole share.

On a unit stream (the grant signs ``"unit": {"column": C, "max_rows": K}`` from the stream, ``split.unit_meta``)
the validator's plan names C (``unit_plan``); the executor (trusted code, no user module) reads each test record's
C from the granted records themselves, and runs the validator with ``per_unit=True``: each unit's mean loss (or
accuracy) is one record and the count is the DP count of units (``sage_tfx.validation.units``). That release is
(e, d)-DP per unit at its own (e, d), so the stage spends its whole share of the split (``stage_share``), not the
per-row epsilon / K; its ledger release names C (``Ledger.release(..., per_unit=C)``), which the ledger checks
against the grant's unit before any noise is drawn and ``sage ledger audit`` replays (``privacy.unit_share``).
Nothing here comes from user code: the column is the grant's, the ids are the records'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sage_tfx.privacy import GrantError, require_budget, stage_budget
from sage_tfx.privacy.split import over_budget
from sage_tfx.privacy.unit_share import grant_unit_budget, unit_column

if TYPE_CHECKING:
    from sage_tfx.privacy import Grant

UNIT_PLAN_KEY = "unit_column"  # the validation plan's key: the grant's unit column (absent on a row stream)
MISSING_UNIT = ""  # the id of every record that lacks the unit column (ingest refuses such rows on a unit stream)


def unit_plan(grant: Grant) -> dict[str, str]:
    """{"unit_column": C} for a grant on a unit stream (C signed into its meta), {} on a row stream (so a row
    stream's plan, and its release's fingerprint, are what they were)."""
    column = unit_column(grant.meta)
    return {} if column is None else {UNIT_PLAN_KEY: column}


def stage_share(grant: Grant, stage: str) -> tuple[float, float]:
    """(epsilon, delta) the validator's ``stage`` may spend: the whole share on a unit stream (the test runs per
    unit), the stage's budget (``stage_budget``) on a row stream."""
    column = unit_column(grant.meta)
    return stage_budget(grant, stage) if column is None else grant_unit_budget(grant, stage, column)


def require_share(grant: Grant, stage: str, epsilon: float) -> None:
    """GrantError, before any record is read, when ``epsilon`` is above ``stage_share``."""
    column = unit_column(grant.meta)
    if column is None:
        require_budget(grant, stage, epsilon)
        return
    share = grant_unit_budget(grant, stage, column)
    if over_budget(epsilon, 0.0, share):
        raise GrantError(
            f"the {stage} stage asks for epsilon={float(epsilon):.6g} but grant {grant.id!r} covers "
            f"only epsilon={share[0]:.6g} for {stage} (its whole share, the test run per unit)"
        )


def unit_id(example: Any, column: str) -> str:
    """A parsed tf.Example's unit id: its ``column`` value as text (bytes decoded, numbers as written), or
    ``MISSING_UNIT`` when it has none. A fixed function of the record alone; no value is ever put in a message."""
    feature = example.features.feature.get(column)
    kind = None if feature is None else feature.WhichOneof("kind")
    values = [] if kind is None else list(getattr(feature, kind).value)
    return MISSING_UNIT if not values else _text(values[0])


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
