"""The typed settings of a release session: one dataclass per strategy (docs/release_strategies.md).

Each settings object is checked when built (``__post_init__``): a bad value raises ``ReleaseInputError`` naming it
(as the `sage release` option that spells it) and the fix, before any ledger is opened or anything charged. What
depends on the stream (its schema, the pipeline's previous grants) is checked by ``open_release``, still before any
charge. The field names are the `sage release STRATEGY` option names with ``_`` for ``-``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from sage_tfx.privacy.errors import SageError
from sage_tfx.release.growth import ImproverParams, PMWGParams, SchedulerParams


class ReleaseInputError(SageError, ValueError):
    """A bad release setting, found before anything was charged (`sage release`: exit 2)."""


@dataclass(kw_only=True)
class ReleaseSettings:
    """What every strategy needs.

    Args:
        db: the ledger's location (a file or a postgresql:// URL).
        stream: the stream released from.
        data_root: where `sage ingest` wrote the stream's blocks.
        pipeline: the name charged in the ledger; its grants are the session's state.
        json: `sage release --json`: progress lines go to stderr (the summary is printed as JSON).
        progress: where progress and error lines go (a `sage serve` worker's pipe), or None for stdout/stderr.
    """

    STRATEGY: ClassVar[str] = ""

    db: str
    stream: str
    data_root: str
    pipeline: str
    json: bool = False
    progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    def say(self, line: str) -> None:
        """Write a progress line: to ``progress`` when set, else stdout (stderr with ``json``).

        Args:
            line: the line, without its newline.
        """

        if self.progress is not None:
            self.progress(line)
        else:
            print(line, file=sys.stderr if self.json else sys.stdout, flush=True)

    def warn(self, line: str) -> None:
        """Write an error or warning line: to ``progress`` when set, else stderr.

        Args:
            line: the line, without its newline.
        """

        if self.progress is not None:
            self.progress(line)
        else:
            print(line, file=sys.stderr, flush=True)


def _bad(message: str) -> ReleaseInputError:
    return ReleaseInputError(message)


@dataclass(kw_only=True)
class FeatureSettings(ReleaseSettings):
    """The features of the ERM strategies: numeric columns, each divided by its public scale.

    Args:
        db: as in `ReleaseSettings`.
        stream: as in `ReleaseSettings`.
        data_root: as in `ReleaseSettings`.
        pipeline: as in `ReleaseSettings`.
        json: as in `ReleaseSettings`.
        progress: as in `ReleaseSettings`.
        label: the numeric label column.
        features: the feature columns ("C1,C2" or a sequence); normalised to a tuple of names.
        scales: one public divisor per feature ("S1,S2", a sequence, or None for 1 each); normalised to floats.
        label_scale: the label's public divisor (> 0).
        intercept: append a constant feature 1 (after scaling).
        epsilon: each block's whole-lifetime epsilon.
        delta: each block's whole-lifetime delta.

    Raises:
        ReleaseInputError: a bad value, named as the `sage release` option that spells it, with the fix.
    """

    label: str
    features: Sequence[str] | str
    scales: Sequence[float] | str | None = None
    label_scale: float = 1.0
    intercept: bool = False
    epsilon: float
    delta: float

    def __post_init__(self):
        raw = self.features
        cols = [c.strip() for c in (raw.split(",") if isinstance(raw, str) else raw) if str(c).strip()]
        if not cols:
            raise _bad(f"--features {raw!r} names no column: give C1,C2,... of the stream's schema")
        if len(set(cols)) != len(cols):
            raise _bad(f"--features {raw!r} names a column twice: give each once")
        self.features = tuple(cols)
        self.scales = self._scales(len(cols))

    def _scales(self, n: int) -> tuple:
        raw = self.scales
        if raw is None:
            scales = [1.0] * n
        else:
            try:
                scales = [float(s) for s in (raw.split(",") if isinstance(raw, str) else raw)]
            except (TypeError, ValueError):
                raise _bad(f"--scales {raw!r} is not a list of numbers: give S1,S2,... (> 0)") from None
            if len(scales) != n:
                raise _bad(
                    f"--scales {raw!r} has {len(scales)} value(s) for {n} feature(s): give one divisor per column"
                )
        for name, s in [("--scales", s) for s in scales] + [("--label-scale", self.label_scale)]:
            if not (math.isfinite(s) and s > 0):
                raise _bad(f"{name} value {s!r} is invalid: give a finite divisor > 0")
        return tuple(scales)

    @property
    def dim(self) -> int:
        """The model's dimension: the features, and the intercept's constant."""
        return len(self.features) + (1 if self.intercept else 0)


@dataclass(kw_only=True)
class ContinualSettings(FeatureSettings):
    """`sage release continual`: a regularised ERM model at every block (all history, or a sliding ``window``).

    Optionally SLA-checked and written for a Pusher: docs/release_strategies.md, "Continual and sliding-window
    model release" (the model's parameters: ``sage_tfx.release.continual.ReleaseParams``).

    Args:
        db: as in `ReleaseSettings`.
        stream: as in `ReleaseSettings`.
        data_root: as in `ReleaseSettings`.
        pipeline: as in `ReleaseSettings`.
        json: as in `ReleaseSettings`.
        progress: as in `ReleaseSettings`.
        label: as in `FeatureSettings`.
        features: as in `FeatureSettings`.
        scales: as in `FeatureSettings`.
        label_scale: as in `FeatureSettings`.
        intercept: as in `FeatureSettings`.
        epsilon: as in `FeatureSettings`.
        delta: as in `FeatureSettings`.
        loss: "logistic", "squared" or "softmax" (multiclass: the label / label_scale rounded to a class 0..k-1).
        classes: softmax: the number of classes k (an integer >= 2, required); refused with any other loss.
        sampling: "none", or "poisson": each release on 2^j blocks reads a Poisson sample of its records with the
            noise of its full size (amplification by sampling, the paper's App. B).
        rows_per_block: the DECLARED records per block m0 that normalises the objective (public).
        window: the sliding window in blocks, or None for all history.
        lam: the ridge weight (lam/2 ||w - w_ref||^2), > 0.
        radius: the parameter ball's radius R, > 0.
        positive_above: logistic: a label is +1 iff its value is above this, else -1.
        push_dir: write every model as a TFX Model artifact and its ModelBlessing here, or None.
        serving_dir: push the BLESSED models here as TFX's Pusher does (needs push_dir), or None.
        sla_target: ACCEPT a model iff its expected clipped loss is at most this (needs sla_epsilon), or None.
        sla_epsilon: the SLA check's epsilon (at most ``epsilon``), or None.
        sla_confidence: the SLA check's confidence 1 - eta.
        sla_loss_bound: losses are clipped to [0, B] for the SLA check.

    Raises:
        ReleaseInputError: a bad value, named as the `sage release` option that spells it, with the fix.
    """

    STRATEGY: ClassVar[str] = "continual"

    loss: str = "logistic"
    classes: int | None = None
    sampling: str = "none"
    rows_per_block: int
    window: int | None = None
    lam: float = 0.05
    radius: float = 10.0
    positive_above: float = 0.0
    push_dir: str | None = None
    serving_dir: str | None = None
    sla_target: float | None = None
    sla_epsilon: float | None = None
    sla_confidence: float = 0.95
    sla_loss_bound: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        if (self.sla_target is None) != (self.sla_epsilon is None):
            raise _bad("--sla-target and --sla-epsilon go together: give both for an SLA check, or neither")
        if self.serving_dir is not None and self.push_dir is None:
            raise _bad(
                f"--serving-dir {self.serving_dir!r} needs --push-dir: the models and their blessings are "
                "written there first (the artifacts a Pusher reads)"
            )
        self._check_classes()

    def _check_classes(self) -> None:
        k = self.classes
        if self.loss != "softmax":
            if k is not None:
                raise _bad(f"--classes {k!r} is for --loss softmax: drop --classes or give --loss softmax")
            return
        if k is None:
            raise _bad("--loss softmax needs --classes K: give the number of classes (an integer >= 2)")
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise _bad(f"--classes {k!r} is invalid: give the number of classes, an integer >= 2")


@dataclass(kw_only=True)
class IncrementalSettings(FeatureSettings):
    """`sage release incremental-regression`: a least-squares regressor at every block by the Tree Mechanism.

    docs/release_strategies.md, "Incremental regression by the Tree Mechanism"
    (``sage_tfx.release.incremental_regression.IncrementalRegressionParams``).

    Args:
        db: as in `ReleaseSettings`.
        stream: as in `ReleaseSettings`.
        data_root: as in `ReleaseSettings`.
        pipeline: as in `ReleaseSettings`.
        json: as in `ReleaseSettings`.
        progress: as in `ReleaseSettings`.
        label: as in `FeatureSettings`.
        features: as in `FeatureSettings`.
        scales: as in `FeatureSettings`.
        label_scale: as in `FeatureSettings`.
        intercept: as in `FeatureSettings`.
        epsilon: as in `FeatureSettings`.
        delta: as in `FeatureSettings`.
        horizon: how many blocks it will ever take.
        bound_x: the public clipping bound of the features.
        bound_y: the public clipping bound of the label.
        radius: the L2 ball the regressor is constrained to.
        iterations: projected-gradient steps per release.

    Raises:
        ReleaseInputError: a bad value, named as the `sage release` option that spells it, with the fix.
    """

    STRATEGY: ClassVar[str] = "incremental-regression"

    horizon: int
    bound_x: float = 1.0
    bound_y: float = 1.0
    radius: float = 10.0
    iterations: int = 200


@dataclass(kw_only=True)
class GrowthSettings(ReleaseSettings):
    """`sage release growth`: a DP mean of ``column`` re-run on a growth schedule (BBScheduler or BBImprover).

    docs/release_strategies.md, "Growth schedules and PMWG" (``sage_tfx.release.growth``).

    Args:
        db: as in `ReleaseSettings`.
        stream: as in `ReleaseSettings`.
        data_root: as in `ReleaseSettings`.
        pipeline: as in `ReleaseSettings`.
        json: as in `ReleaseSettings`.
        progress: as in `ReleaseSettings`.
        schedule: "scheduler" (BBScheduler) or "improver" (BBImprover).
        column: the numeric column whose mean is released.
        bound: values are clipped to [0, bound].
        rows_per_block: the DECLARED records per block (public; n = blocks * M normalises the mean).
        epsilon: each record's whole-lifetime epsilon.
        delta: each record's whole-lifetime delta (0: pure epsilon-DP; BBImprover needs > 0).
        composition: BBScheduler's composition ("zcdp" or "basic"), or None for pure if delta is 0, else zCDP.
        gamma: BBScheduler's growth factor 1 + gamma.
        a: BBImprover's exponent, in (0, 1/2).
        t0: the first run's block count.

    Raises:
        ReleaseInputError: a bad value, named as the `sage release` option that spells it, with the fix.
    """

    STRATEGY: ClassVar[str] = "growth"

    schedule: str = "scheduler"
    column: str
    bound: float
    rows_per_block: int
    epsilon: float
    delta: float = 0.0
    composition: str | None = None
    gamma: float = SchedulerParams.gamma  # the strategies' own defaults
    a: float = ImproverParams.a
    t0: int = SchedulerParams.t0

    def __post_init__(self):
        if self.schedule not in ("scheduler", "improver"):
            raise _bad(f"--schedule {self.schedule!r} is unknown: use scheduler or improver")
        if self.schedule == "improver" and self.composition is not None:
            raise _bad(
                f"--composition {self.composition!r} is for --schedule scheduler: BBImprover always composes in zCDP"
            )


@dataclass(kw_only=True)
class PMWGSettings(ReleaseSettings):
    """`sage release pmwg`: private multiplicative weights answering a declared query stream over a universe.

    docs/release_strategies.md, "Growth schedules and PMWG" (``sage_tfx.release.growth.PMWG``).

    Args:
        db: as in `ReleaseSettings`.
        stream: as in `ReleaseSettings`.
        data_root: as in `ReleaseSettings`.
        pipeline: as in `ReleaseSettings`.
        json: as in `ReleaseSettings`.
        progress: as in `ReleaseSettings`.
        bins: the declared universe, COL=LO:HI:K,... (`parse_bins`); kept as the text given, which is signed into
            the grants' computation.
        queries: the file of the declared query stream (JSON lines).
        rows_per_block: the DECLARED records per block (public; answers are fractions of n = blocks * M).
        epsilon: each record's whole-lifetime epsilon.
        hard_budget: the hard-query budget k at the first block's size.
        threshold: the hardness threshold T (in fraction units).
        eta: the MW learning rate.
        growth_exponent: the exponent p of the per-round epsilon c (n0 / n)^p.
        delta: each record's whole-lifetime delta: 0 for pure epsilon-DP, > 0 for (epsilon, delta)-DP by zCDP
            composition of the rounds (the paper's Theorem 17; ``PMWGParams.delta``).

    Raises:
        ReleaseInputError: a bad value, named as the `sage release` option that spells it, with the fix.
    """

    STRATEGY: ClassVar[str] = "pmwg"

    bins: str
    queries: str
    rows_per_block: int
    epsilon: float
    hard_budget: int = PMWGParams.hard_budget  # PMWG's own defaults
    threshold: float = PMWGParams.threshold
    eta: float = PMWGParams.eta
    growth_exponent: float = PMWGParams.growth_exponent
    delta: float = PMWGParams.delta

    def __post_init__(self):
        self.universe = parse_bins(self.bins)
        if isinstance(self.rows_per_block, bool) or not isinstance(self.rows_per_block, int) or self.rows_per_block < 1:
            raise _bad(
                f"--rows-per-block {self.rows_per_block!r} is invalid: give the declared (public) rows per block >= 1"
            )


def parse_bins(text: str) -> list[tuple[str, float, float, int]]:
    """COL=LO:HI:K,... -> [(column, LO, HI, K)]: K equal bins on [LO, HI] per column."""
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        try:
            name, spec = part.split("=", 1)
            lo, hi, k = spec.split(":")
            lo, hi, k = float(lo), float(hi), int(k)
        except ValueError:
            raise _bad(f"--bins part {part!r} is invalid: give COL=LO:HI:K (K equal bins on [LO, HI])") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi and k >= 1):
            raise _bad(f"--bins part {part!r} is invalid: give finite LO < HI and K >= 1 bins")
        name = name.strip()
        if name in [c for c, *_ in out]:
            raise _bad(f"--bins names column {name!r} twice: give each column once")
        out.append((name, lo, hi, k))
    if not out:
        raise _bad(f"--bins {text!r} names no column: give COL=LO:HI:K,...")
    return out


SETTINGS: dict[str, type[ReleaseSettings]] = {
    cls.STRATEGY: cls for cls in (ContinualSettings, IncrementalSettings, GrowthSettings, PMWGSettings)
}
"""Strategy name (the `sage release` subcommand) -> its settings class."""
