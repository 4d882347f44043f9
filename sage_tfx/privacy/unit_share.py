"""A stage calibrated to the privacy unit itself gets its whole share of the grant, not the per-row budget.

Contract: a release above the per-row budget epsilon / K must carry ``per_unit=C`` (signed into its log
entry as ``PER_UNIT_KEY``), with C the grant's signed unit column and a stage whose mechanism is calibrated
to the unit (``PER_UNIT_STAGES``); otherwise the ledger refuses it before anything is drawn and the audit
flags it (``per_unit_problem``). The stages still compose on a unit to the charge. Explanation:
docs/block_composition.md, "Privacy units: protect people, not rows" ("Mechanisms calibrated to the unit
itself").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import GrantError
from .split import UNIT_KEY, BudgetSplit, signed_split
from .vocabulary import Stage

if TYPE_CHECKING:
    from .grants import Grant

__all__ = ["PER_UNIT_KEY", "PER_UNIT_STAGES", "unit_column", "per_unit_problem", "unit_stage_budget"]

PER_UNIT_KEY = "per_unit"  # a release log entry's key: the unit column its mechanism was calibrated to
# The stages whose platform mechanism honours the unit: DPModelValidator's ACCEPT and REJECT tests.
PER_UNIT_STAGES = (Stage.VALIDATION.value, Stage.REJECTION.value)


def unit_column(meta: Mapping[str, Any] | None) -> str | None:
    """The privacy unit's column signed into a grant's ``meta`` (``split.unit_meta``); None: the unit is the row."""
    unit = (meta or {}).get(UNIT_KEY)
    column = unit.get("column") if isinstance(unit, dict) else None
    return column if isinstance(column, str) and column else None


def per_unit_problem(meta: Mapping[str, Any] | None, stage: str, per_unit: object) -> str | None:
    """Why a release of ``stage`` claiming ``per_unit`` under a grant with ``meta`` may not take the whole unit
    share (None: it may, or ``per_unit`` is None and the release gets the per-row budget)."""
    if per_unit is None:
        return None
    signed = unit_column(meta)
    if signed is None:
        return (
            f"per_unit={per_unit!r} names no privacy unit of the grant: its stream's unit is the row, so its "
            "stages get the row-level budget (drop per_unit)"
        )
    if per_unit != signed:
        return (
            f"per_unit={per_unit!r} is not the grant's privacy unit {signed!r} (signed from the stream): a "
            f"mechanism calibrated to another column does not protect {signed!r}"
        )
    if stage not in PER_UNIT_STAGES:
        return (
            f"stage {stage!r} has no mechanism calibrated to the unit (per_unit applies to "
            f"{', '.join(PER_UNIT_STAGES)}): it gets the per-row budget, epsilon / K"
        )
    return None


def unit_stage_budget(
    epsilon: float, delta: float, meta: Mapping[str, Any] | None, stage: str, split: BudgetSplit | None = None
) -> tuple[float, float]:
    """(epsilon, delta) a per-unit release of ``stage`` may spend: the stage's share of the signed ``split`` (None:
    the whole (``epsilon``, ``delta``) of a single-stage grant), NOT made per row. ``meta`` is re-read for the split
    when ``split`` is None (a grant's own meta); pass the capped split of an older rdp grant."""
    if split is None:
        split = BudgetSplit.from_meta(meta or {})
    if split is None:
        return float(epsilon), float(delta)
    return split.stage_budget(stage)


def grant_unit_budget(grant: Grant, stage: str, per_unit: str) -> tuple[float, float]:
    """``unit_stage_budget`` of a verified ``grant`` for a per-unit release of ``stage`` on column ``per_unit``;
    GrantError (``per_unit_problem``) before anything is read or drawn when it may not take the whole share."""
    problem = per_unit_problem(grant.meta, stage, per_unit)
    if problem is not None:
        raise GrantError(f"grant {grant.id!r}: {problem}")
    return unit_stage_budget(grant.epsilon, grant.delta, grant.meta, stage, signed_split(grant))


def audited_share(
    gid: str,
    meta: Mapping[str, Any] | None,
    stage: str,
    per_unit: object,
    row_share: tuple[float, float],
    epsilon: float,
    delta: float,
    split: BudgetSplit | None,
    problems: list[str],
) -> tuple[float, float]:
    """What a recorded release of ``stage`` under grant ``gid`` may have spent, as the audit replays it: the per-row
    ``row_share`` without ``per_unit``; with a valid one the whole unit share of the grant's (``epsilon``,
    ``delta``) and its unscaled ``split``; with an invalid one (``per_unit_problem``, appended to ``problems``) the
    per-row share."""
    if per_unit is None:
        return row_share
    problem = per_unit_problem(meta, stage, per_unit)
    if problem is not None:
        problems.append(f"grant {gid!r}: stage {stage!r} released per unit: {problem}")
        return row_share
    return unit_stage_budget(epsilon, delta, meta, stage, split)


def audited_shares(
    gid: str,
    meta: Mapping[str, Any] | None,
    units: Mapping[str, object],
    row_shares: Mapping[str, tuple[float, float]],
    epsilon: float,
    delta: float,
    split: BudgetSplit | None,
    problems: list[str],
) -> dict[str, tuple[float, float]]:
    """``audited_share`` of every released stage: ``units`` and ``row_shares`` keyed by stage."""
    return {
        stage: audited_share(gid, meta, stage, units.get(stage), row, epsilon, delta, split, problems)
        for stage, row in row_shares.items()
    }


def unit_costs(spent: Mapping[str, tuple[float, float]], per_unit: Mapping[str, object], k: int) -> dict[str, float]:
    """Each released stage's epsilon as it costs one unit: a per-unit release its own, a per-row one K times it
    (group privacy), for composing by the grant's unscaled split."""
    return {s: e if per_unit.get(s) is not None else e * k for s, (e, _) in spent.items()}
