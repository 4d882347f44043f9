"""Release on a growing database (Cummings et al., NeurIPS 2018): BBScheduler, BBImprover, ERMG, SmallDBG, PMWG;
numpy only.

A database size is counted in blocks and its public record count in DECLARED rows, never the ledger's exact count.
Every arriving block gets ONE grant charging the whole (epsilon, delta) its records can ever lose, before it is
read. The schedules, the mechanism and the proofs: docs/release_strategies.md, "Growth schedules and PMWG: the
proofs".
"""

from .calibration import filter_scale
from .ermg import erm_mechanism, ermg
from .errors import STAGE, GrowthError
from .improver import BBImprover, ImproverParams
from .pmwg import PMWG, Answer, PMWGParams, Universe, count_query, sum_query
from .scheduled import (
    Mechanism,
    Reader,
    Run,
    Schedule,
    ScheduledRelease,
    ScheduleIdentity,
    charge_lifetime,
    clipped_mean,
    schedule_fingerprint,
)
from .scheduler import BBScheduler, SchedulerParams
from .smalldbg import smalldb_mechanism, smalldbg, synthetic_answers

__all__ = [
    "Answer",
    "BBImprover",
    "BBScheduler",
    "GrowthError",
    "ImproverParams",
    "Mechanism",
    "PMWG",
    "PMWGParams",
    "Reader",
    "Run",
    "STAGE",
    "Schedule",
    "ScheduleIdentity",
    "ScheduledRelease",
    "SchedulerParams",
    "Universe",
    "charge_lifetime",
    "clipped_mean",
    "count_query",
    "erm_mechanism",
    "ermg",
    "filter_scale",
    "schedule_fingerprint",
    "smalldb_mechanism",
    "smalldbg",
    "sum_query",
    "synthetic_answers",
]
