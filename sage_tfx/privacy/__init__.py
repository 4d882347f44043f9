"""The privacy core: ledger, filters, accounting curves (numpy/stdlib only; no TensorFlow).

The store (``store/``) imports neither the ledger nor the audit; the audit (``audit.py``) never imports the
ledger; the ledger's steps never import the facade (``ledger.py``), which only this package's ``__init__``,
the CLI and higher layers import (tests/architecture/test_import_graph.py). Each module's role and the
import rules: docs/block_composition.md, "The privacy core's layout".
"""

from .errors import (
    BlockRetired,
    BudgetRefused,
    DuplicateContent,
    GrantError,
    LedgerCorrupt,
    LedgerError,
    LedgerNotFound,
    LedgerRollback,
    LedgerUpgradeNeeded,
    PipelineBusy,
    RecordError,
    SageError,
    UnknownBlock,
    UnknownStream,
    error_chain,
    public_error_text,
)
from .ledger import OUTCOMES, POLICIES, Block, Grant, Ledger, Release, Stream
from .split import (
    DEFAULT_RECORD_SPLIT,
    STAGES,
    BudgetSplit,
    ChargeRule,
    RecordSplit,
    eval_share_split,
    grant_split,
    record_split,
    require_budget,
    require_side,
    stage_budget,
)

__all__ = [
    "Ledger",
    "Grant",
    "Block",
    "Stream",
    "Release",
    "POLICIES",
    "OUTCOMES",
    "BudgetSplit",
    "ChargeRule",
    "STAGES",
    "grant_split",
    "stage_budget",
    "require_budget",
    "RecordSplit",
    "DEFAULT_RECORD_SPLIT",
    "eval_share_split",
    "record_split",
    "require_side",
    "LedgerError",
    "DuplicateContent",
    "LedgerNotFound",
    "LedgerCorrupt",
    "LedgerRollback",
    "LedgerUpgradeNeeded",
    "UnknownStream",
    "UnknownBlock",
    "BlockRetired",
    "PipelineBusy",
    "GrantError",
    "BudgetRefused",
    "RecordError",
    "SageError",
    "public_error_text",
    "error_chain",
]
