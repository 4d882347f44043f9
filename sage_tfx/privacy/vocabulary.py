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
    """How a pipeline ended (``Ledger.finish``, ``Ledger.record_outcome``; paper §3.4)."""

    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    TIMEOUT = "TIMEOUT"


class GrantOutcome(enum.StrEnum):
    """What a pipeline run under one grant concluded (``Ledger.record_outcome``): the iteration history."""

    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    RETRY = "RETRY"
    FAILED = "FAILED"


class Policy(enum.StrEnum):
    """A stream's allocation policy by name (paper §3.3; ``allocation.POLICIES`` holds their implementations)."""

    CONSERVE = "conserve"
    AGGRESSIVE = "aggressive"
    DPF_N = "dpf-n"     # PrivateKube's DPF, budget unlocked per pipeline arrival (docs/scheduling_policies.md)
    DPF_T = "dpf-t"     # PrivateKube's DPF, budget unlocked over a block lifetime T
    DPACK = "dpack"     # efficiency-ordered, in the spirit of DPack (EuroSys'25)


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
