"""The privacy core: ledger, filters, accounting curves (numpy/stdlib only; no TensorFlow)."""
from .errors import (
    BlockRetired,
    BudgetRefused,
    GrantError,
    LedgerCorrupt,
    LedgerError,
    LedgerNotFound,
    RecordError,
    UnknownBlock,
    UnknownStream,
    public_error_text,
)
from .ledger import OUTCOMES, POLICIES, Block, Grant, Ledger, Stream

__all__ = [
    "Ledger", "Grant", "Block", "Stream", "POLICIES", "OUTCOMES",
    "LedgerError", "LedgerNotFound", "LedgerCorrupt", "UnknownStream", "UnknownBlock", "BlockRetired",
    "GrantError", "BudgetRefused", "RecordError", "public_error_text",
]
