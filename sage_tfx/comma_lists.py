"""Command-line options that take a comma list ("8,16,32", "0.1,1", "ghost,vmap"): argparse ``type=`` callables.

Each reads the whole list before anything runs: an empty item, a value of the wrong kind or out of range is an
``argparse.ArgumentTypeError`` naming the bad item and the fix, so argparse prints the usage and exits 2 before the
command does any work.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["counts", "names", "numbers", "positive_numbers"]


def _parse(text: str, what: str, fix: str, item: Callable[[str], object | None]) -> list:
    """The items of ``text``; ``item`` turns one into its value, or None when it is not ``what`` (``fix``: what to
    give instead, with an example)."""
    parts = [part.strip() for part in str(text).split(",")]
    values = []
    for part in parts:
        value = item(part) if part else None
        if value is None:
            bad = "an empty item" if not part else repr(part)
            raise argparse.ArgumentTypeError(f"{text!r}: {bad} is not {what}; give {fix}")
        values.append(value)
    return values


def _int_at_least_one(part: str) -> int | None:
    try:
        value = int(part)
    except ValueError:
        return None
    return value if value >= 1 else None


def _finite(part: str) -> float | None:
    try:
        value = float(part)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _finite_positive(part: str) -> float | None:
    value = _finite(part)
    return value if value is not None and value > 0 else None


def counts(text: str) -> list[int]:
    """A comma list of whole numbers >= 1 (sizes, horizons, writer counts), e.g. ``"8,16,32"``.

    Args:
        text: the option's value.
    """
    return _parse(
        text, "a whole number >= 1", "whole numbers >= 1 separated by commas, e.g. 8,16,32", _int_at_least_one
    )


def numbers(text: str) -> list[float]:
    """A comma list of finite numbers, e.g. ``"0.5,0.9"``.

    Args:
        text: the option's value.
    """
    return _parse(text, "a finite number", "numbers separated by commas, e.g. 0.5,0.9", _finite)


def positive_numbers(text: str) -> list[float]:
    """A comma list of finite numbers > 0 (epsilons, rates), e.g. ``"0.1,1,10"``.

    Args:
        text: the option's value.
    """
    return _parse(text, "a finite number > 0", "numbers > 0 separated by commas, e.g. 0.1,1,10", _finite_positive)


def names(text: str) -> list[str]:
    """A comma list of names, each stripped and non-empty, e.g. ``"ghost,vmap"`` (the command checks them
    against its choices).

    Args:
        text: the option's value.
    """
    return _parse(text, "a name", "names separated by commas, e.g. ghost,vmap", lambda part: part)
