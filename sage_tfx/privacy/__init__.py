"""The privacy core: ledger, filters, accounting curves (numpy/stdlib only; no TensorFlow).

Layout (issue 13); imports run one way:

* ``store/``: the ledger's storage. ``base`` (the backend-independent ``Store``: transactions, schema check and
  migration driver, ``Tx``), ``sqlite`` (``SqliteStore``: one host), ``postgres`` (``PostgresStore``: several
  hosts, verified TLS by default), ``sql`` (the SQL of the store and the audit: the schema of each version, the
  migrations, the statements; it imports nothing) and ``open_store`` in its ``__init__``. The store imports
  neither the ledger nor the audit.
* ``audit.py``: replays the hash-chained log (``chain.py``) and compares every table with it; it reads through
  ``store.sql`` and never imports the ledger (tests/test_import_graph.py checks both rules).
* ``allocation.py``: the allocation rules and scheduling policies on in-memory state (Conserve, Aggressive,
  DPF-N, DPF-T, DPack), used by the ledger, the audit and the simulator alike; ``filters.py`` the per-block
  filters; ``vocabulary.py`` the stored strings as enums; ``checks.py`` the argument checks.
* ``ledger.py``: the ``Ledger`` facade over the store, the allocation rules, filters and signing; it imports the
  store and the audit, never the other way round.
"""
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
