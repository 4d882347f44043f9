"""A growth schedule's and PMWG's argument errors, raised before anything is charged."""

from __future__ import annotations

import numpy as np

from sage_tfx.privacy import checks
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.vocabulary import Stage

STAGE = Stage.TRAINING  # a released statistic is the grant's one release


class GrowthError(SageError, ValueError):
    """Bad parameters or input for a growth schedule / PMWG (raised before anything is charged)."""


def _positive(name: str, value, fix: str) -> float:
    fix = fix.replace("{", "{{").replace("}", "}}")  # a literal in the message template
    return checks.positive(value, name, error=GrowthError, message="{what} {value!r} is invalid: " + fix)


def _int_at_least(name: str, value, low: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise GrowthError(f"{name} {value!r} is invalid: {fix}")
    return int(value)
