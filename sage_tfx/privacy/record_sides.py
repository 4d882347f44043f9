"""Which records a grant's splits hold and which side each split is on (``RecordSplit``), signed into the grant.

A record's public hash picks its bucket, and its bucket's split; under the ``PARALLEL`` rule a record is read on
one side only (``split.require_side``; docs/block_composition.md, "What a grant pays for").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .checks import is_real, number
from .errors import LedgerError
from .vocabulary import Side

RECORDS_KEY = "records"  # grant.meta key of the signed record split
SIDES = tuple(Side)


def _split_name(name):
    if not isinstance(name, str) or not name or "-" in name:
        raise LedgerError(f"record split name {name!r} is invalid: a non-empty string without '-'")
    return name


@dataclass(frozen=True)
class RecordSplit:
    """How a grant's records are split: ``buckets`` ((name, count), ... in hashing order: a record's hash
    modulo the total picks its bucket, the buckets of the first name come first), and the split names on the
    ``training`` side (read by training and the REJECT test) and on the ``test`` side (the ACCEPT test's).
    Every name is on exactly one side; the training side is not empty.

    Args:
      buckets: ((name, count), ...) in hashing order.
      training: The split names on the training side.
      test: The split names on the test side.

    Raises:
      LedgerError: malformed buckets or names, or sides that do not place every split once.
    """

    buckets: tuple
    training: tuple
    test: tuple

    def __post_init__(self):
        if not isinstance(self.buckets, (list, tuple)) or not all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in self.buckets
        ):
            raise LedgerError(f"record split buckets {self.buckets!r} must be [[name, count], ...]")
        buckets = tuple((_split_name(name), count) for name, count in self.buckets)
        for name, count in buckets:
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                raise LedgerError(f"record split {name!r} has {count!r} buckets: need an integer > 0")
        names = [name for name, _ in buckets]
        if not names or len(set(names)) != len(names):
            raise LedgerError(f"record split buckets {self.buckets!r} must name at least one split, each once")
        sides = {side: tuple(_split_name(n) for n in getattr(self, side)) for side in SIDES}
        placed = [n for side in SIDES for n in sides[side]]
        if sorted(placed) != sorted(names) or not sides[Side.TRAINING]:
            raise LedgerError(
                f"record split sides training={list(sides[Side.TRAINING])}, "
                f"test={list(sides[Side.TEST])} "
                f"must place every split of {names} on exactly one side, training not empty"
            )
        object.__setattr__(self, "buckets", buckets)
        for side in SIDES:
            object.__setattr__(self, side, sides[side])

    @property
    def splits(self) -> dict:
        """{name: buckets} in hashing order (BlockExampleGen's ``splits``)."""
        return dict(self.buckets)

    @property
    def test_share(self) -> float:
        """The share of records on the test side (the ACCEPT test's): its buckets over all buckets."""
        return sum(count for name, count in self.buckets if name in self.test) / sum(c for _, c in self.buckets)

    def side(self, name: str) -> str | None:
        """ "training" or "test" for a split of this rule, None for a name it does not have.

        Args:
          name: A split's name.

        Returns:
          ``training``, ``test`` or None.
        """
        return next((side for side in SIDES if name in getattr(self, side)), None)

    def to_dict(self) -> dict:
        """The rule as signed into a grant's meta (a list of pairs: JSON objects lose their order when signed)."""
        return {
            "buckets": [[name, count] for name, count in self.buckets],
            Side.TRAINING: list(self.training),
            Side.TEST: list(self.test),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RecordSplit:
        """The record split of its signed form (``to_dict``), checked as the constructor checks it.

        Args:
          raw: A dict with exactly ``buckets`` ([[name, count], ...]), ``training`` and ``test`` (lists of names).

        Returns:
          The ``RecordSplit``.

        Raises:
          LedgerError: other keys, sides that are not lists, or a rule the constructor refuses.
        """
        if not isinstance(raw, dict) or sorted(raw) != sorted(["buckets", *SIDES]):
            raise LedgerError(f"record split {raw!r} must be an object with buckets, training and test")
        if not all(isinstance(raw[side], (list, tuple)) for side in SIDES):
            raise LedgerError(f"record split {raw!r}: training and test must be lists of split names")
        return cls(raw["buckets"], tuple(raw[Side.TRAINING]), tuple(raw[Side.TEST]))

    def describe(self) -> str:
        """The rule in one line for error messages: buckets {...}, training [...], test [...]."""
        return f"buckets {self.splits}, training {list(self.training)}, test {list(self.test)}"


DEFAULT_RECORD_SPLIT = RecordSplit((("train", 9), ("eval", 1)), ("train",), ("eval",))
EVAL_SHARE_DENOMINATOR = 100  # an eval share is a fraction of at most this many buckets


def eval_share_split(eval_share: object, error: type[Exception] = LedgerError) -> RecordSplit:
    """The record split with ``eval_share`` of the records on the test side: "train" and "eval" buckets in the
    least integer ratio (1 - s) : s (0.2 -> train 4, eval 1; 0.1 -> the default, train 9, eval 1). ``error``
    (naming the value and the fix) unless ``eval_share`` is a number in (0, 1) that is a fraction with a
    denominator of at most 100 (0.15, 1/3: yes; 0.123: no): BlockExampleGen splits by whole buckets.

    Args:
      eval_share: The share of records on the test side, in (0, 1).
      error: The exception class raised for a bad share.

    Returns:
      The ``RecordSplit`` with buckets "train" and "eval".

    Raises:
      error: ``eval_share`` is not a number in (0, 1) with a denominator of at most 100.
    """
    message = (
        "{what} {value!r} is invalid: the share of records the ACCEPT test reads must be a number {rule} (e.g. 0.2)"
    )
    if not is_real(eval_share):
        raise error(message.format(what="eval_share", value=eval_share, rule="in (0, 1)"))
    value = number(
        eval_share, "eval_share", error=error, low=0.0, high=1.0, low_open=True, high_open=True, message=message
    )
    share = Fraction(value).limit_denominator(EVAL_SHARE_DENOMINATOR)
    if abs(float(share) - value) > 1e-9 * value:
        raise error(
            f"eval_share {eval_share!r} is invalid: records are split into whole hash buckets, so give a "
            f"fraction with a denominator of at most {EVAL_SHARE_DENOMINATOR} (e.g. {round(value, 2):g})"
        )
    return RecordSplit(
        (("train", share.denominator - share.numerator), ("eval", share.numerator)), ("train",), ("eval",)
    )
