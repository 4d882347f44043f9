"""The privacy core: ledger, filters, accounting curves (numpy/stdlib only; no TensorFlow).

Layout; imports run one way:

* ``store/``: the ledger's storage. ``base`` (the backend-independent ``Store``: transactions, schema check and
  migration driver, ``Tx``), ``sqlite`` (``SqliteStore``: one host), ``postgres`` (``PostgresStore``: several
  hosts, verified TLS by default), ``sql`` (ALL the SQL of the store, the ledger and the audit: the schema of
  each version, the migrations, the statements; it imports nothing) and ``open_store`` in its ``__init__``. The
  store imports neither the ledger nor the audit.
* ``audit.py``: replays the hash-chained log (``chain.py``; ``audit_replay.py``) and compares every table with it
  (``audit_tables.py``, ``audit_budgets.py``); it reads through ``store.sql`` and never imports the ledger
  (tests/architecture/test_import_graph.py checks both rules).
* ``keys.py``: the key ring (the master key in its key file, the keys derived from it); ``head_file.py``: the
  head file beside it (the last log entry this host committed, per ledger; its slots in ``head_slots.py``, its
  statx look-up in ``head_stat.py``).
* ``allocation_policies.py``: the allocation rules and scheduling policies (Conserve, Aggressive, DPF-N, DPF-T,
  DPack); ``allocation.py``: the in-memory state applying them, used by the ledger, the audit and the simulator alike; ``budget_arrays.py`` the same
  rules as array operations (the ledger's availability queries); ``filters.py`` the per-block filters;
  ``vocabulary.py`` the stored strings as enums; ``checks.py`` the argument checks; ``randomness.py`` the keyed
  generator every release draws from, ``samplers.py`` the exact samplers and grid releases on it.
* ``streams.py`` (a stream's row, its checks, the grant floor), ``blocks.py`` (a new block's checks and
  registration; block and reservation reads), ``charges.py`` (a grant's check and charge under each policy, the
  queued policies' demands and scheduling points, a finishing pipeline's reservation moves), ``grants.py``
  (``Grant``, ``Release``, signing, what a stage may release), ``session.py`` (the key file's source, pipeline
  claims, the key migration), ``requests.py`` (a request's checks and charge), ``releases.py`` (a stage's
  release), ``pipelines.py`` (register, claim, outcomes, finish), ``trusted_reads.py`` (reads outside a grant),
  ``opening.py`` (the key file and store of an open): the ledger's steps, run in the facade's transactions; they
  import the store's SQL and the modules above, never the facade or the audit.
* ``ledger_reads.py``: ``LedgerReads``, the facade's read-only queries (one read transaction each);
  ``ledger_base.py``: ``LedgerBase``, what the facade stands on (store, keys, head file, keyed log append).
* ``ledger.py``: the thin ``Ledger`` facade: one store transaction per public method, running the steps of the
  modules above; it imports them, the store and the audit, never the other way round. Only this package's
  ``__init__``, the CLI and higher layers import it.
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
