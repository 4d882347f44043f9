"""What each stage of one grant may spend, and how the stages compose into what the ledger charged.

This module is the one home of that rule. Contract: a grant's ``BudgetSplit`` (an epsilon per stage,
training's and preprocessing's deltas, and a ``ChargeRule``: ``SUM`` by basic composition, ``PARALLEL`` by
parallel composition over a signed ``RecordSplit`` of training and test records) composes to at most what
the grant charged, or the grant is refused; a grant without a split is single-stage. ``Ledger.request``,
every data-reading component (``stage_budget``, ``require_side``), ``Ledger.release`` and the audit all
apply this one rule. Rules and proofs: docs/block_composition.md, "What a grant pays for".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from .checks import finite, number, positive, probability
from .errors import GrantError, LedgerError
from .record_sides import (  # noqa: F401 (re-exported)
    DEFAULT_RECORD_SPLIT,
    EVAL_SHARE_DENOMINATOR,
    RECORDS_KEY,
    SIDES,
    RecordSplit,
    eval_share_split,
)
from .vocabulary import ChargeRule, Stage

if TYPE_CHECKING:
    from .grants import Grant

STAGES = tuple(Stage)  # members equal their strings: "preprocessing", "count", "training", ...
DELTA_FIELDS = ("delta", "preprocessing_delta")  # training's delta, preprocessing's delta
SPLIT_KEY = "split"  # grant.meta key of the signed split
SINGLE_RULE = ChargeRule.SINGLE  # the rule recorded for a grant without a split
SLACK = 1e-9  # relative float round-off allowed when a sum of stage epsilons is compared with a charge


SPLIT_RULES = (ChargeRule.SUM, ChargeRule.PARALLEL)  # the rules a split may carry (SINGLE is for no split)


def _stage_value(name, value):
    return finite(value, f"split {name}", allow_none=False, nonnegative=True)


@dataclass(frozen=True)
class BudgetSplit:
    """One grant's epsilon per stage, training's delta, preprocessing's delta, and the rule composing them.

    Args:
      preprocessing: The preprocessing stage's epsilon.
      count: The DP record count's epsilon.
      training: The training stage's epsilon.
      validation: The ACCEPT test's epsilon.
      delta: Training's delta.
      rule: How the stages compose (``ChargeRule.SUM`` or ``PARALLEL``).
      rejection: The REJECT test's epsilon.
      preprocessing_delta: Preprocessing's delta.

    Raises:
      LedgerError: a value or delta out of range, or an unknown rule (naming it).
    """

    preprocessing: float
    count: float
    training: float
    validation: float
    delta: float
    rule: str
    rejection: float = 0.0
    preprocessing_delta: float = 0.0

    def __post_init__(self):
        for name in (Stage.PREPROCESSING, Stage.COUNT, Stage.TRAINING, Stage.VALIDATION, Stage.REJECTION):
            object.__setattr__(self, name, _stage_value(name, getattr(self, name)))
        for name in DELTA_FIELDS:
            value = _stage_value(name, getattr(self, name))
            if value >= 1:
                raise LedgerError(f"split {name} {getattr(self, name)!r} is invalid: must be < 1")
            object.__setattr__(self, name, value)
        if self.total_delta >= 1:
            raise LedgerError(
                f"split deltas {self.delta!r} + {self.preprocessing_delta!r} are invalid: their sum must be < 1"
            )
        try:
            rule = ChargeRule(self.rule)
            if rule not in SPLIT_RULES:
                raise ValueError(rule)
            object.__setattr__(self, "rule", rule.value)
        except ValueError:
            raise LedgerError(
                f"split rule {self.rule!r} is unknown: use {ChargeRule.PARALLEL.value!r} (a per-record "
                f"train/test split) or {ChargeRule.SUM.value!r}"
            ) from None

    # ------------------------------------------------------------------ the rule
    @property
    def parallel(self) -> bool:
        return self.rule == ChargeRule.PARALLEL.value

    @property
    def total_delta(self) -> float:
        """The least delta that pays for every stage: training's plus preprocessing's (basic composition)."""
        return self.delta + self.preprocessing_delta

    @property
    def charged_epsilon(self) -> float:
        """The least per-block epsilon that pays for every stage under the rule (docs/block_composition.md)."""
        shared = self.preprocessing + self.count
        if self.parallel:
            return shared + max(self.training + self.rejection, self.validation)
        return shared + self.training + self.rejection + self.validation

    def stage_budget(self, stage: str) -> tuple[float, float]:
        """(epsilon, delta) of ``stage``; only training and preprocessing have a delta.

        Args:
          stage: The stage (``Stage``).

        Returns:
          (epsilon, delta).

        Raises:
          LedgerError: an unknown stage.
        """
        _check_stage(stage)
        deltas: dict[str, float] = {Stage.TRAINING: self.delta, Stage.PREPROCESSING: self.preprocessing_delta}
        delta = deltas.get(stage, 0.0)
        return getattr(self, stage), delta

    def scaled(self, epsilon_factor: float, delta_factor: float) -> BudgetSplit:
        """This split with every stage's epsilon times ``epsilon_factor`` and both deltas times ``delta_factor``
        (factors in [0, 1]). Each rule composes linearly, so the scaled split composes to ``epsilon_factor`` times
        this one's epsilon and ``delta_factor`` times its delta: a split that fitted a charge fits the charge scaled
        by the same factors (``grants.stage_cap``).

        Args:
          epsilon_factor: The epsilons' factor, in [0, 1].
          delta_factor: The deltas' factor, in [0, 1].

        Returns:
          The scaled ``BudgetSplit``.
        """
        return replace(
            self,
            **{s: getattr(self, s) * epsilon_factor for s in STAGES},
            **{d: getattr(self, d) * delta_factor for d in DELTA_FIELDS},
        )

    def composed(self, spent: dict) -> float:
        """The per-record epsilon of stages that spent ``spent`` ({stage: epsilon}), under this split's rule.

        Args:
          spent: {stage: epsilon}.

        Returns:
          The per-record epsilon.
        """
        part: dict[str, float] = {s: float(spent.get(s, 0.0)) for s in STAGES}
        shared = part[Stage.PREPROCESSING] + part[Stage.COUNT]
        train, rejection, validation = part[Stage.TRAINING], part[Stage.REJECTION], part[Stage.VALIDATION]
        if self.parallel:
            return shared + max(train + rejection, validation)
        return shared + train + rejection + validation

    def check_covered(self, epsilon: float, delta: float, what: str = "the grant") -> None:
        """Refuse (LedgerError) a split that composes to more than ``what`` charged: (epsilon, delta).

        Args:
          epsilon: What was charged.
          delta: What was charged.
          what: Who charged it, for the message.

        Raises:
          LedgerError: the split composes to more epsilon, or its deltas add to more delta.
        """
        if self.charged_epsilon > float(epsilon) * (1 + SLACK):
            raise LedgerError(
                f"split {self.to_dict()} composes to epsilon {self.charged_epsilon:.6g} under rule {self.rule!r}, "
                f"more than {what} charges ({float(epsilon):.6g}): charge at least {self.charged_epsilon:.6g} or "
                "shrink the stages"
            )
        if self.total_delta > float(delta) * (1 + SLACK):
            parts = (
                f"training's {self.delta:.3g} + preprocessing's {self.preprocessing_delta:.3g}"
                if self.preprocessing_delta
                else f"{self.delta:.3g}"
            )
            raise LedgerError(f"split delta {parts} is more than {what} charges ({float(delta):.3g})")

    def to_dict(self) -> dict:
        """The split as signed into a grant's meta (``preprocessing_delta`` only when set, so a split without
        one is stored without that key)."""
        out = asdict(self)
        if not self.preprocessing_delta:
            del out["preprocessing_delta"]
        return out

    # ------------------------------------------------------------------ making one
    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> BudgetSplit | None:
        """The split signed into a grant's ``meta``, or None for a single-stage grant.

        Args:
          meta: The grant's signed metadata (its split under ``SPLIT_KEY``).

        Returns:
          The ``BudgetSplit``, or None if ``meta`` holds no split.

        Raises:
          LedgerError: a split that is not an object, names unknown fields, has no rule or a bad value.
        """
        raw = (meta or {}).get(SPLIT_KEY)
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise LedgerError(f"split {raw!r} must be an object of stage epsilons, delta and rule")
        unknown = sorted(set(raw) - set(STAGES) - set(DELTA_FIELDS) - {"rule"})
        if unknown:
            raise LedgerError(
                f"split names unknown field(s) {unknown}: use {', '.join(STAGES)}, {', '.join(DELTA_FIELDS)} and rule"
            )
        if "rule" not in raw:
            raise LedgerError(
                f"split {raw!r} has no rule: use {ChargeRule.PARALLEL.value!r} or {ChargeRule.SUM.value!r}"
            )
        return cls(
            **{s: raw.get(s, 0.0) for s in STAGES}, **{d: raw.get(d, 0.0) for d in DELTA_FIELDS}, rule=raw["rule"]
        )

    @classmethod
    def parse(cls, text: str, delta: float = 0.0) -> BudgetSplit:
        """A split from the command line: ``"preprocessing=0.1,training=0.3,validation=0.3[,rule=parallel]"``.

        Args:
          text: Comma-separated ``STAGE=EPSILON`` (missing stages get 0), ``rule=sum|parallel`` (default sum) and
            ``preprocessing_delta=D`` parts.
          delta: The grant's delta: training's, less the D ``preprocessing_delta`` gives preprocessing.

        Returns:
          The ``BudgetSplit``.

        Raises:
          LedgerError: a malformed or unknown part, a stage named twice, no stage, or a bad value.
        """
        fields: dict[str, Any] = {}  # the stage values as given: BudgetSplit checks and converts them
        rule, pre_delta = ChargeRule.SUM.value, cast(Any, 0.0)  # pre_delta: the text given, then its float
        for part in (p.strip() for p in str(text).split(",")):
            if not part:
                continue
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep:
                raise LedgerError(
                    f"split part {part!r} must be STAGE=EPSILON (stages: {', '.join(STAGES)}) or rule=sum|parallel"
                )
            if name == "rule":
                rule = {"sum": ChargeRule.SUM.value, "parallel": ChargeRule.PARALLEL.value}.get(
                    value.strip(), value.strip()
                )
            elif name == "preprocessing_delta":
                pre_delta = value.strip()
            elif name in STAGES:
                if name in fields:
                    raise LedgerError(f"split names stage {name!r} twice")
                fields[name] = value.strip()
            else:
                raise LedgerError(
                    f"split stage {name!r} is unknown: use {', '.join(STAGES)} (or rule=, preprocessing_delta=)"
                )
        if not fields:
            raise LedgerError(f"split {text!r} names no stage: e.g. preprocessing=0.1,training=0.3,validation=0.1")
        if pre_delta:
            pre_delta = _stage_value("preprocessing_delta", pre_delta)
            if pre_delta > float(delta):
                raise LedgerError(
                    f"split preprocessing_delta {pre_delta!r} is more than the grant's delta {delta!r}: "
                    "it is taken out of the grant's delta (give a larger --delta)"
                )
            delta = float(delta) - pre_delta
        return cls(**{s: fields.get(s, 0.0) for s in STAGES}, delta=delta, rule=rule, preprocessing_delta=pre_delta)

    @classmethod
    def for_epsilon(
        cls,
        epsilon: float,
        delta: float,
        preprocessing_share: float = 0.2,
        count_share: float = 0.05,
        validation_share: float | None = None,
        rejection_share: float = 0.0,
        disjoint_split: bool = True,
        preprocessing_delta: float = 0.0,
    ) -> BudgetSplit:
        """Split a per-block charge ``epsilon`` into the stages so that ``charged_epsilon == epsilon``.

        Args:
          epsilon: The per-block charge to split (> 0); ``rest`` is what preprocessing and the count leave.
          delta: Training's delta.
          preprocessing_share: Preprocessing's share of ``epsilon``, in [0, 1).
          count_share: The count's share of ``epsilon``, in [0, 1 - preprocessing_share).
          validation_share: Without ``disjoint_split``: the ACCEPT test's share of ``rest`` (None: a third).
          rejection_share: The REJECT test's share of training's side of ``rest``, in [0, 1).
          disjoint_split: A per-record train/test split (rule PARALLEL): the ACCEPT test gets all of ``rest``,
            and so does the training side; otherwise (rule SUM) the two share ``rest``.
          preprocessing_delta: Preprocessing's delta, charged on top of ``delta`` (``total_delta``).

        Returns:
          The ``BudgetSplit``, its ``charged_epsilon`` equal to ``epsilon``.

        Raises:
          LedgerError: a non-positive ``epsilon`` or a share out of its range.
        """
        epsilon = positive(epsilon, "iteration epsilon")
        preprocessing_share = _share(preprocessing_share, "preprocessing_share", 1.0)
        count_share = _share(count_share, "count_share", 1.0 - preprocessing_share, "1 - preprocessing_share = ")
        rejection_share = _share(rejection_share, "rejection_share", 1.0)
        pre, count = epsilon * preprocessing_share, epsilon * count_share
        rest = epsilon - pre - count
        if disjoint_split:
            rule, validation, train_side = ChargeRule.PARALLEL, rest, rest
        else:
            share = 1 / 3 if validation_share is None else validation_share
            share = probability(share, "validation_share")
            rule, validation, train_side = ChargeRule.SUM, rest * share, rest * (1 - share)
        rejection = train_side * rejection_share
        return cls(pre, count, train_side - rejection, validation, delta, rule.value, rejection, preprocessing_delta)


def _share(value, what, high, high_text=""):
    """A stage's share of the iteration epsilon: a float in [0, high), else a LedgerError naming it."""
    return number(
        value,
        what,
        low=0.0,
        high=high,
        high_open=True,
        message=f"{{what}} {{value!r}} is invalid: must be in [0, {high_text}{high:g})",
    )


def _check_stage(stage):
    if stage not in STAGES:
        raise LedgerError(f"stage {stage!r} is unknown: use one of {', '.join(STAGES)}")


# ---------------------------------------------------------------------------------- which record is where


def sign_records(meta: dict, split: BudgetSplit | None) -> None:
    """Put the record split into a new grant's ``meta`` (in place): the one the request gives, checked, or
    the platform's default for a grant with a split. A grant without either keeps none (it reads by the
    default rule: ``record_split``)."""
    if RECORDS_KEY in meta:
        meta[RECORDS_KEY] = RecordSplit.from_dict(meta[RECORDS_KEY]).to_dict()
    elif split is not None:
        meta[RECORDS_KEY] = DEFAULT_RECORD_SPLIT.to_dict()


def record_split(grant: Grant) -> RecordSplit:
    """The record split a verified ``grant`` reads by: the one signed into it, else (a grant made before
    records were signed, or one without a split) the default, except for a ``PARALLEL`` grant: its
    separation of training and test records was never signed, so it is refused (GrantError).

    Args:
      grant: A verified ``Grant``.

    Returns:
      The signed ``RecordSplit``, or ``DEFAULT_RECORD_SPLIT``.

    Raises:
      GrantError: The signed split is malformed, or a ``PARALLEL`` grant carries none.
    """
    raw = (grant.meta or {}).get(RECORDS_KEY)
    if raw is not None:
        try:
            return RecordSplit.from_dict(raw)
        except LedgerError as exc:
            raise GrantError(f"grant {grant.id!r}: {exc}") from None
    split = BudgetSplit.from_meta(grant.meta)
    if split is not None and split.parallel:
        raise GrantError(
            f"grant {grant.id!r} charges the parallel rule ({split.rule}) but carries no signed record "
            "split, so nothing enforces that its test records stay out of training: it was made before "
            "grants signed one. Request a new grant for these blocks (sage run, Ledger.request and "
            "sage ledger charge sign the record split now)"
        )
    return DEFAULT_RECORD_SPLIT


def require_side(grant: Grant, splits: Iterable[str], side: str, reader: str) -> None:
    """Under a ``PARALLEL`` grant, refuse (GrantError) ``reader`` reading any of ``splits`` unless it is on
    ``side`` of the grant's record split ("training" or "test"): a record must be read on one side only, as
    the charge pre + count + max(train + reject, val) assumes. Under any other rule nothing is refused (every
    stage is charged for every record).

    Args:
      grant: A verified ``Grant``.
      splits: The split names ``reader`` reads.
      side: "training" or "test".
      reader: Who reads them, for the message (e.g. "DPTrainer").

    Raises:
      GrantError: A split is not on ``side`` of a parallel grant's record split.
    """
    split = grant_split(grant)
    if split is None or not split.parallel:
        return
    records = record_split(grant)
    wrong = [name for name in splits if records.side(name) != side]
    if wrong:
        raise GrantError(
            f"{reader} reads split(s) {wrong}, which grant {grant.id!r}'s record split ({records.describe()}) does "
            f"not put on the {side} side; its parallel rule charges each record for one side only, so {reader} "
            f"may read the {side} split(s) {list(getattr(records, side))} only"
        )


# ---------------------------------------------------------------------------------- the privacy unit

UNIT_KEY = "unit"  # grant.meta key: {"column": C, "max_rows": K}, signed into every grant on a unit stream


def unit_meta(meta: Mapping[str, Any] | None, column: str | None, max_rows: int | None) -> dict:
    """``meta`` with the stream's privacy unit signed in (``UNIT_KEY``; ``grants.new_grant``): the stream's, never
    the requester's (a ``unit`` given in meta is replaced, or dropped on a stream whose unit is the row)."""
    meta = {k: v for k, v in (meta or {}).items() if k != UNIT_KEY}
    if column is not None:
        if max_rows is None:
            raise LedgerError(f"privacy unit {column!r} has no max_rows_per_unit: the stream must declare both")
        meta[UNIT_KEY] = {"column": column, "max_rows": int(max_rows)}
    return meta


def unit_rows(meta: Mapping[str, Any]) -> int:
    """K of a grant's ``meta``: the most rows one privacy unit has in a block (1 without a unit: unit = row)."""
    unit = (meta or {}).get(UNIT_KEY)
    if unit is None:
        return 1
    k = unit.get("max_rows") if isinstance(unit, dict) else None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise GrantError(f"grant meta {UNIT_KEY} {unit!r} is malformed: max_rows must be an integer >= 1")
    return k


def per_row_budget(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """The (epsilon, delta) a mechanism must meet on ONE row so that it is (epsilon, delta)-DP on K rows.

    Group privacy (Dwork & Roth 2014, Lemma 2.2 and its (epsilon, delta) form): a mechanism that is
    (e, d)-DP for data sets differing in one row is (k e, k e^{(k-1) e} d)-DP for data sets differing in k rows
    (a chain of k neighbouring data sets; each step multiplies the odds by at most e^e and adds at most d, the
    additions themselves amplified by the steps after them). So e = epsilon / K and
    d = delta / (K e^{(K-1) e}) give (epsilon, delta) on K rows, and on any k <= K rows. K = 1: unchanged.
    """
    if k == 1:
        return float(epsilon), float(delta)
    e = float(epsilon) / k
    return e, float(delta) / (k * math.exp((k - 1) * e))


def per_row_split(split: BudgetSplit, k: int) -> BudgetSplit:
    """``split`` with every stage's budget made per row (``per_row_budget``, stage by stage: training's delta with
    training's epsilon, preprocessing's with preprocessing's). Each stage is then (its share)-DP on a unit of K
    rows, and the stages compose on a unit by the split's rule as they do on a row (under ``PARALLEL`` a unit's
    k1 training and k2 test rows, k1 + k2 <= K, cost at most k1/K and k2/K of the two sides: at most the larger)."""
    if k == 1:
        return split
    eps = {s: getattr(split, s) / k for s in STAGES}
    return replace(
        split,
        **eps,
        delta=per_row_budget(split.training, split.delta, k)[1],
        preprocessing_delta=per_row_budget(split.preprocessing, split.preprocessing_delta, k)[1],
    )


# ---------------------------------------------------------------------------------- what a stage may spend


def grant_split(grant: Grant) -> BudgetSplit | None:
    """What each stage of a verified ``grant`` may hand its mechanisms (None: single-stage): the split signed into
    it, made per row on a stream whose privacy unit has K > 1 rows (``per_row_split``: the one place where a unit is
    applied, so every mechanism reading its stage's budget is calibrated to the unit). Refused with GrantError if
    the signed split composes to more than the grant's charge (a grant the ledger signed never does; every
    component's door re-checks, whoever signed it).

    Args:
      grant: A verified ``Grant``.

    Returns:
      The per-row ``BudgetSplit``, or None for a single-stage grant.

    Raises:
      GrantError: The signed split composes to more than the grant's charge.
    """
    split = signed_split(grant)
    return None if split is None else per_row_split(split, unit_rows(grant.meta))


def signed_split(grant: Grant) -> BudgetSplit | None:
    """The split signed into a verified ``grant`` as signed (not made per row; None: single-stage), refused with
    GrantError if it composes to more than the grant's charge."""
    split = BudgetSplit.from_meta(grant.meta)
    if split is not None:
        try:
            split.check_covered(grant.epsilon, grant.delta, f"grant {grant.id!r}")
        except LedgerError as exc:
            raise GrantError(str(exc)) from None
    return split


def stage_budget(grant: Grant, stage: str) -> tuple[float, float]:
    """(epsilon, delta) that ``stage`` may spend under a verified ``grant``.

    With a split: the stage's share, after re-checking that the split composes to at most the grant's
    charge (a grant the ledger signed always does; the check makes every component refuse one that
    does not, whoever signed it). Without a split: the whole grant, for whichever ONE stage opens a
    release under it first (``Ledger.release`` refuses a second stage). Per row on a unit stream (``grant_split``).

    Args:
      grant: A verified ``Grant``.
      stage: A ``Stage`` ("preprocessing", "count", "training", "validation", ...).

    Returns:
      (epsilon, delta) the stage may hand its mechanisms.

    Raises:
      LedgerError: ``stage`` is not a stage.
      GrantError: The signed split composes to more than the grant's charge.
    """
    _check_stage(stage)
    split = grant_split(grant)
    if split is None:
        return per_row_budget(grant.epsilon, grant.delta, unit_rows(grant.meta))
    return split.stage_budget(stage)


def over_budget(epsilon: float, delta: float, allowed: tuple[float, float]) -> bool:
    """True iff a stage's (``epsilon``, ``delta``) is more than ``allowed`` (its share, or a single-stage grant's
    whole budget) beyond float round-off (relative ``SLACK``): the one comparison the components' doors
    (``require_budget``), ``Ledger.release`` and the audit make."""
    return float(epsilon) > allowed[0] * (1 + SLACK) or float(delta) > allowed[1] * (1 + SLACK)


def require_budget(grant: Grant, stage: str, epsilon: float, delta: float = 0.0) -> tuple[float, float]:
    """Refuse (GrantError), before any data is read, a stage that asks more than its share of the grant.

    Args:
      grant: A verified ``Grant``.
      stage: The asking ``Stage``.
      epsilon: The epsilon the stage asks for.
      delta: The delta the stage asks for.

    Returns:
      (epsilon, delta) of the stage's whole share (``stage_budget``).

    Raises:
      GrantError: The ask is above the share.
    """
    have_epsilon, have_delta = stage_budget(grant, stage)
    if over_budget(epsilon, delta, (have_epsilon, have_delta)):
        raise GrantError(
            f"the {stage} stage asks for (epsilon={float(epsilon):.6g}, delta={float(delta):.3g}) but grant "
            f"{grant.id!r} covers only (epsilon={have_epsilon:.6g}, delta={have_delta:.3g}) for {stage}"
        )
    return have_epsilon, have_delta
