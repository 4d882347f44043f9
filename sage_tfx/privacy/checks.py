"""Argument checks, in one place: names, finite numbers in a range, integers in a range, and public
(low, high) ranges.

Every layer uses these with its own error class and message style: ``error`` is the class to raise
(LedgerError by default, the privacy core's; DPTransformError, ValidationInputError, ... elsewhere, each a
``SageError`` and a ValueError), and ``message`` a template of ``{what}`` (the argument's name), ``{value}``
(the bad value, as given) and ``{rule}`` (what it must be, e.g. "finite and > 0", "in (0, 1)"), so the
message names the argument, the value and the fix. Raised before anything is changed. No numpy: the
privacy core's checks run without it.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

from .errors import LedgerError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")

INVALID = "{what} {value!r} is invalid: must be {rule}"


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a valid stream, block or pipeline name (1-128 of letters, digits and ._:@+-)."""
    if not isinstance(value, str) or not NAME.match(value):
        raise LedgerError(
            f"{what} {value!r} is invalid: use 1-128 letters, digits and ._:@+- (starting with a letter or digit)"
        )
    return value


def rule_text(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> str:
    """The range a number must lie in, in words: "finite", "finite and > 0", "in (0, 1)", "in [0, 1)", ..."""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"finite and {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"finite and {'<' if high_open else '<='} {high:g}"
    return "finite"


def number(
    value: Any,
    what: str,
    *,
    error: type[Exception] = LedgerError,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    allow_none: bool = False,
    allow_bool: bool = False,
    message: str = INVALID,
    not_number: str | None = None,
) -> Any:
    """``value`` as a finite float within [low, high] (an end ``*_open`` excludes it; None: unbounded).

    None returns None when ``allow_none``. A bool is refused unless ``allow_bool`` (True is not a budget).
    Otherwise raises ``error(message.format(what=what, value=value, rule=...))``; a value ``float`` cannot
    convert uses ``not_number`` instead when given (same fields).
    """
    if value is None and allow_none:
        return None
    try:
        if isinstance(value, bool) and not allow_bool:
            raise TypeError
        out = float(value)
    except (TypeError, ValueError):
        rule = rule_text(low, high, low_open=low_open, high_open=high_open)
        raise error((not_number or message).format(what=what, value=value, rule=rule)) from None
    if (
        not math.isfinite(out)
        or (low is not None and (out <= low if low_open else out < low))
        or (high is not None and (out >= high if high_open else out > high))
    ):  # the rule's words are built for the error alone (a grant checks two numbers)
        raise error(
            message.format(what=what, value=value, rule=rule_text(low, high, low_open=low_open, high_open=high_open))
        )
    return out


def positive(
    value: Any,
    what: str,
    *,
    error: type[Exception] = LedgerError,
    message: str = INVALID,
    not_number: str | None = None,
    allow_none: bool = False,
    allow_bool: bool = False,
) -> Any:
    """``value`` as a finite float > 0 (an epsilon, a scale, a bound); see ``number``."""
    return number(
        value,
        what,
        error=error,
        low=0.0,
        low_open=True,
        message=message,
        not_number=not_number,
        allow_none=allow_none,
        allow_bool=allow_bool,
    )


def probability(
    value: Any,
    what: str,
    *,
    error: type[Exception] = LedgerError,
    zero: bool = False,
    message: str = INVALID,
    not_number: str | None = None,
    allow_none: bool = False,
) -> Any:
    """``value`` as a float in (0, 1), or [0, 1) with ``zero`` (a delta, a confidence); see ``number``."""
    return number(
        value,
        what,
        error=error,
        low=0.0,
        high=1.0,
        low_open=not zero,
        high_open=True,
        message=message,
        not_number=not_number,
        allow_none=allow_none,
    )


def integer(
    value: Any,
    what: str,
    *,
    error: type[Exception] = LedgerError,
    low: int | None = None,
    high: int | None = None,
    high_open: bool = False,
    message: str = INVALID,
    allow_none: bool = False,
) -> Any:
    """``value`` as an int within [low, high] (``high_open`` excludes high; None: unbounded).

    An int (numpy's too) or an integral float (3.0) passes; a bool, a fraction (2.5: truncating it would
    silently change a noise scale or a count), a non-finite or non-number value raises
    ``error(message.format(what=what, value=value, rule=...))``, the rule reading "an integer >= 1",
    "an integer in [1, 1073741824)", ... None returns None when ``allow_none``.
    """
    if value is None and allow_none:
        return None
    if low is not None and high is not None:
        rule = f"an integer in [{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        rule = f"an integer >= {low}"
    elif high is not None:
        rule = f"an integer {'<' if high_open else '<='} {high}"
    else:
        rule = "an integer"
    out = None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        out = int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        as_float = float(value)
        if math.isfinite(as_float) and as_float.is_integer():
            out = int(as_float)
    if (
        out is None
        or (low is not None and out < low)
        or (high is not None and (out >= high if high_open else out > high))
    ):
        raise error(message.format(what=what, value=value, rule=rule))
    return out


INTERVAL = "{what} {value!r} is invalid: must be {rule}"


def interval(
    value: Any, what: str, *, error: type[Exception] = LedgerError, message: str = INTERVAL
) -> tuple[float, float]:
    """``value`` as a pair of floats (low, high) with both finite and low < high (a public range).

    Anything else (not a pair, a non-number, inf/nan, low >= high) raises
    ``error(message.format(what=what, value=value, rule="a pair (low, high) of finite numbers, low < high"))``.
    """
    rule = "a pair (low, high) of finite numbers, low < high"
    try:
        low, high = (number(v, what) for v in value)
    except (TypeError, ValueError):
        raise error(message.format(what=what, value=value, rule=rule)) from None
    if not low < high:
        raise error(message.format(what=what, value=value, rule=rule))
    return low, high


def finite(
    value: Any,
    what: str,
    allow_none: bool = True,
    nonnegative: bool = False,
    *,
    positive: bool = False,
    error: type[Exception] = LedgerError,
) -> Any:
    """``value`` as a finite float (None stays None when ``allow_none``); ``nonnegative`` also refuses < 0,
    ``positive`` refuses <= 0. The ledger's form (a bool counts as 0/1): "{what} {value!r} is not a number",
    "... is invalid: must be finite" / ">= 0" / "> 0"."""
    if value is None and allow_none:
        return None
    out = number(
        value,
        what,
        error=error,
        allow_bool=True,
        message="{what} {value!r} is invalid: must be finite",
        not_number="{what} {value!r} is not a number",
    )
    if nonnegative and out < 0:
        raise error(f"{what} {value!r} is invalid: must be >= 0")
    if positive and out <= 0:
        raise error(f"{what} {value!r} is invalid: must be > 0")
    return out


def is_real(value: object) -> bool:
    """True for an int or float (numbers.Real) that is not a bool: a number a caller may have meant."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
