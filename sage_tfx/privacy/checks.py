"""Argument checks of the privacy core, in one place: names, and finite (non-negative) numbers.

Each raises LedgerError naming the argument and the bad value (the CLI turns it into exit 2), before anything
is changed.
"""
import math
import re

from .errors import LedgerError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")


def check_name(value, what):
    """``value`` if it is a valid stream, block or pipeline name (1-128 of letters, digits and ._:@+-)."""
    if not isinstance(value, str) or not NAME.match(value):
        raise LedgerError(
            f"{what} {value!r} is invalid: use 1-128 letters, digits and ._:@+- (starting with a letter or digit)"
        )
    return value


def finite(value, what, allow_none=True, nonnegative=False):
    """``value`` as a finite float (None stays None when ``allow_none``); ``nonnegative`` also refuses < 0."""
    if value is None and allow_none:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise LedgerError(f"{what} {value!r} is not a number") from None
    if not math.isfinite(out):
        raise LedgerError(f"{what} {value!r} is invalid: must be finite")
    if nonnegative and out < 0:
        raise LedgerError(f"{what} {value!r} is invalid: must be >= 0")
    return out
