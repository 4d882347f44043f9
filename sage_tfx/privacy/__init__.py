"""The privacy core: ledger, filters, accounting curves (numpy/stdlib only; no TensorFlow)."""
from .errors import (
    BlockRetired,
    BudgetRefused,
    GrantError,
    LedgerCorrupt,
    DuplicateContent,
    LedgerError,
    LedgerNotFound,
    PipelineBusy,
    RecordError,
    SageError,
    UnknownBlock,
    UnknownStream,
    public_error_text,
)
from .ledger import OUTCOMES, POLICIES, Block, Grant, Ledger, Release, Stream
from .split import STAGES, BudgetSplit, ChargeRule, grant_split, require_budget, stage_budget

__all__ = [
    "Ledger", "Grant", "Block", "Stream", "Release", "POLICIES", "OUTCOMES",
    "BudgetSplit", "ChargeRule", "STAGES", "grant_split", "stage_budget", "require_budget",
    "LedgerError", "DuplicateContent", "LedgerNotFound", "LedgerCorrupt", "UnknownStream", "UnknownBlock", "BlockRetired",
    "PipelineBusy", "GrantError", "BudgetRefused", "RecordError", "SageError", "public_error_text",
]
