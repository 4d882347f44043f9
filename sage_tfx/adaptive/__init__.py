"""Privacy-adaptive training: Sage's iterator (TF-free; the TFX run is a callable it is given)."""

from sage_tfx.validation import eta_for_attempt

from .iterator import (
    BudgetSplit,
    Iteration,
    IterationInterrupted,
    IterationResult,
    RunResult,
    SageIterator,
)
from .plan import AttemptPlan, PlannedAttempt, plan_attempts
from .settings import IteratorSettings

__all__ = [
    "SageIterator",
    "IteratorSettings",
    "BudgetSplit",
    "IterationResult",
    "Iteration",
    "IterationInterrupted",
    "RunResult",
    "eta_for_attempt",
    "AttemptPlan",
    "PlannedAttempt",
    "plan_attempts",
]
