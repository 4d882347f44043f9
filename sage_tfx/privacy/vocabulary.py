"""The privacy core's vocabularies, written once.

Every value is the exact string the ledger has always stored (tables, log bodies, grant
records), so ledgers written before these enums existed read unchanged: a ``StrEnum`` member
compares equal to, hashes like, and JSON-encodes as its string. Parse a stored or user-given
string with ``Enum(text)`` (exact match, no substring); an unknown value raises ValueError.

This module imports nothing else of sage-tfx, so every module of the core can import it.
"""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """Every outcome sage-tfx records; each use takes the subset below that applies to it.

    ``PIPELINE_OUTCOMES``: how a pipeline ended (``Ledger.finish``; paper §3.4). ``GRANT_OUTCOMES``: what a run
    under one grant concluded (``Ledger.record_outcome``, the iteration history). ``VALIDATION_OUTCOMES``: what an
    SLA check concludes (``sage_tfx.validation``): ACCEPT, with probability >= 1 - eta the model meets its target
    on new data from the same distribution; REJECT, under the validator's stated assumption the target is out of
    reach; RETRY, not enough data (or budget).
    """

    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    RETRY = "RETRY"
    TIMEOUT = "TIMEOUT"
    FAILED = "FAILED"


PIPELINE_OUTCOMES = (Outcome.ACCEPT, Outcome.REJECT, Outcome.TIMEOUT)
GRANT_OUTCOMES = (Outcome.ACCEPT, Outcome.REJECT, Outcome.RETRY, Outcome.FAILED)
VALIDATION_OUTCOMES = (Outcome.ACCEPT, Outcome.REJECT, Outcome.RETRY)


class Policy(enum.StrEnum):
    """A stream's allocation policy by name (paper §3.3; ``allocation.POLICIES`` holds their implementations)."""

    CONSERVE = "conserve"
    AGGRESSIVE = "aggressive"
    DPF_N = "dpf-n"  # PrivateKube's DPF, budget unlocked per pipeline arrival (docs/scheduling_policies.md)
    DPF_T = "dpf-t"  # PrivateKube's DPF, budget unlocked over a block lifetime T
    DPACK = "dpack"  # efficiency-ordered, in the spirit of DPack (EuroSys'25)


class Accounting(enum.StrEnum):
    """A stream's per-block filter (``filters.BasicFilter``, ``filters.RdpFilter``)."""

    BASIC = "basic"
    RDP = "rdp"


class ChargeRule(enum.StrEnum):
    """How a grant's stages compose into its per-block charge (``privacy/split.py`` has the proof).

    ``SINGLE`` is the rule recorded for a grant without a split (one stage spends it all); a split
    carries ``SUM`` or ``PARALLEL``. One member per rule, parsed exactly.
    """

    SINGLE = "single"
    SUM = "pre+count+train+reject+val"
    PARALLEL = "pre+count+max(train+reject,val)"


class Stage(enum.StrEnum):
    """The pipeline stages a grant's split pays for, in pipeline order (``privacy/split.py``)."""

    PREPROCESSING = "preprocessing"
    COUNT = "count"
    TRAINING = "training"
    REJECTION = "rejection"
    VALIDATION = "validation"


class Side(enum.StrEnum):
    """The two sides of a grant's signed record split (``record_sides.RecordSplit``): a record is read on one only."""

    TRAINING = "training"
    TEST = "test"


class BlockState(enum.StrEnum):
    """A block is active until it cannot admit the stream's smallest grant, then retired for good."""

    ACTIVE = "active"
    RETIRED = "retired"


class PipelineState(enum.StrEnum):
    """A registered pipeline waits (and receives shares of new blocks) until it finishes."""

    WAITING = "waiting"
    DONE = "done"


class Source(enum.StrEnum):
    """Where a charge on one block is drawn from: the pipeline's own reservation, else the unreserved pool."""

    OWN = "own"
    POOL = "pool"


class DemandState(enum.StrEnum):
    """A queued stream's demand (Dpack, DPF): waiting, or charged and its grant not yet collected."""

    PENDING = "pending"
    ADMITTED = "admitted"


class Composition(enum.StrEnum):
    """How a growth schedule's runs compose (the proofs: docs/release_strategies.md, "Growth schedules and PMWG: the proofs")."""

    PURE = "pure"  # delta = 0, basic composition of epsilon-DP runs
    ZCDP = "zcdp"  # delta > 0, zCDP composition + RDP conversion
    BASIC = "basic"  # delta >= 0, (epsilon_i, delta_i) runs, basic composition of both


class Metric(enum.StrEnum):
    """The validator's quality metrics (DPModelValidator's ``metric``, ``SLA.metric``)."""

    MSE = "mse"
    MAE = "mae"
    LOG_LOSS = "log_loss"
    ACCURACY = "accuracy"
    CUSTOM = "custom"  # the user's per-example loss (SLA.loss_module), clipped to [0, loss_bound]

    @property
    def is_loss(self) -> bool:
        return self is not Metric.ACCURACY


LOG_LOSS_FLOOR = 1e-7  # log_loss keeps probabilities in [floor, 1 - floor], so a log loss is <= ln(1 / floor)
