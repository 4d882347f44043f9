"""All the SQL text of the ledger's store and of the audit, in one place (issue 13 part 1).

Nothing here runs a statement: the store (``base``, ``sqlite``, ``postgres``) and the audit (``audit.py``) run
these. Every statement is written once with ``?`` placeholders; ``PostgresStore`` rewrites them to pg8000's
``%s``. The module imports nothing, so any module of the privacy core may import it.

Sections, each a prefix of its names (the ledger's own statements, still in ``ledger.py``, are to join as
``LEDGER_*`` constants, and as small functions of ``n`` where a statement's text depends on how many ids it
names: ``marks(n)`` for an ``IN (...)`` list, ``value_rows(n, width)`` for a multi-row ``VALUES``):

* the schema: ``SCHEMA_VERSION``, ``TABLES`` (a new ledger's DDL) and ``MIGRATIONS`` (the DDL that brings a
  ledger of one version to the next: text, or an ``AddColumn`` the store applies when the column is missing);
* ``META_*``: the schema version and the write-lock row in ``meta``;
* ``SQLITE_*`` and ``PG_*``: statements one backend alone runs;
* ``AUDIT_*``: what the audit reads, in its one read transaction.

Changing a text here changes stored data only through ``TABLES``/``MIGRATIONS``: a change of those needs a new
``SCHEMA_VERSION`` and a migration step, so that every existing ledger still opens (tests/test_ledger*.py).
"""
from typing import NamedTuple

SCHEMA_VERSION = 5


class AddColumn(NamedTuple):
    """A migration step: ``ALTER TABLE table ADD COLUMN column sql_type`` unless the column is there."""

    table: str
    column: str
    sql_type: str


def add_column(step: AddColumn) -> str:
    return f"ALTER TABLE {step.table} ADD COLUMN {step.column} {step.sql_type}"


def if_not_exists(ddl: str) -> str:
    """A CREATE TABLE / CREATE INDEX statement made a no-op where its object exists (a re-run migration)."""
    return ddl.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS").replace(
        "CREATE INDEX", "CREATE INDEX IF NOT EXISTS")


def marks(n: int) -> str:
    """``n`` placeholders for an ``IN (...)`` list: ``marks(3) == "?,?,?"``."""
    if n < 1:
        raise ValueError(f"marks(n) needs n >= 1 placeholders, got {n!r}: an empty IN () list is not SQL")
    return ",".join("?" * n)


def value_rows(n: int, width: int) -> str:
    """``n`` rows of ``width`` placeholders for a multi-row ``VALUES``: ``value_rows(2, 2) == "(?, ?),(?, ?)"``."""
    if n < 1 or width < 1:
        raise ValueError(f"value_rows(n, width) needs n >= 1 and width >= 1, got n={n!r}, width={width!r}")
    return ",".join(["(" + ", ".join("?" * width) + ")"] * n)


# ---------------------------------------------------------------------------------------------------- the schema
DEMANDS = """CREATE TABLE demands (
        stream TEXT NOT NULL, pipeline TEXT NOT NULL, blocks TEXT NOT NULL, cost TEXT NOT NULL, rule TEXT NOT NULL,
        meta TEXT NOT NULL, seq BIGINT NOT NULL, state TEXT NOT NULL, grant_id TEXT, PRIMARY KEY (stream, pipeline))"""

# The schema of SCHEMA_VERSION: a new ledger's tables and indexes.
TABLES = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE streams (
        name TEXT PRIMARY KEY, accounting TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL,
        delta DOUBLE PRECISION NOT NULL, orders TEXT NOT NULL, policy TEXT NOT NULL,
        min_epsilon DOUBLE PRECISION NOT NULL, created DOUBLE PRECISION NOT NULL,
        min_grant_epsilon DOUBLE PRECISION, policy_params TEXT)""",
    """CREATE TABLE blocks (
        stream TEXT NOT NULL, id TEXT NOT NULL, start_ts DOUBLE PRECISION, end_ts DOUBLE PRECISION,
        shard BIGINT, n_rows BIGINT, created DOUBLE PRECISION NOT NULL, state TEXT NOT NULL,
        spent TEXT NOT NULL, retired DOUBLE PRECISION, digest TEXT, arrivals BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (stream, id))""",
    DEMANDS,
    """CREATE TABLE grants (
        id TEXT PRIMARY KEY, stream TEXT NOT NULL, pipeline TEXT NOT NULL, body TEXT NOT NULL,
        signature TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE pipelines (
        stream TEXT NOT NULL, name TEXT NOT NULL, state TEXT NOT NULL, outcome TEXT,
        registered DOUBLE PRECISION NOT NULL, finished DOUBLE PRECISION, PRIMARY KEY (stream, name))""",
    """CREATE TABLE reservations (
        stream TEXT NOT NULL, block TEXT NOT NULL, pipeline TEXT NOT NULL, reserved TEXT NOT NULL,
        used TEXT NOT NULL, PRIMARY KEY (stream, block, pipeline))""",
    """CREATE TABLE log (
        seq BIGINT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL,
        prev TEXT NOT NULL, hash TEXT NOT NULL)""",
    """CREATE TABLE outcomes (
        grant_id TEXT PRIMARY KEY, stream TEXT NOT NULL, pipeline TEXT NOT NULL, outcome TEXT NOT NULL,
        details TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE releases (
        grant_id TEXT NOT NULL, stage TEXT NOT NULL, stream TEXT NOT NULL, pipeline TEXT NOT NULL,
        computation TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        created DOUBLE PRECISION NOT NULL, PRIMARY KEY (grant_id, stage))""",
    "CREATE INDEX blocks_window ON blocks (stream, start_ts)",
    "CREATE INDEX grants_stream ON grants (stream, created)",
    "CREATE INDEX blocks_digest ON blocks (digest)",
    "CREATE INDEX blocks_shard ON blocks (stream, shard)",
]

# The steps that bring a ledger of the key's schema version to the next one (run in one write transaction).
MIGRATIONS = {
    # 2: the releases of each grant's stages
    1: ["""CREATE TABLE IF NOT EXISTS releases (
        grant_id TEXT NOT NULL, stage TEXT NOT NULL, stream TEXT NOT NULL, pipeline TEXT NOT NULL,
        computation TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        created DOUBLE PRECISION NOT NULL, PRIMARY KEY (grant_id, stage))"""],
    # 3: each block's content digest (ingest), to refuse the same records registered in a second stream, and
    # each stream's minimum grant epsilon (NULL on older streams: the default)
    2: [AddColumn("blocks", "digest", "TEXT"),
        AddColumn("streams", "min_grant_epsilon", "DOUBLE PRECISION"),
        "CREATE INDEX IF NOT EXISTS blocks_digest ON blocks (digest)"],
    # 4: an index on each stream's shards, so add_blocks' shard-clash check is one index look-up, not a scan of the
    # stream's blocks (its cost no longer grows with the stream: docs/BENCHMARKS.md); nothing stored changes
    3: ["CREATE INDEX IF NOT EXISTS blocks_shard ON blocks (stream, shard)"],
    # 5: the queued policies (docs/scheduling_policies.md): each stream's policy parameters (NULL: none, as every
    # stream before), each block's count of pipeline arrivals since it arrived (0 on older blocks: only queued
    # streams count them), and the demands a queued stream's scheduler holds (pending or admitted)
    4: [AddColumn("streams", "policy_params", "TEXT"),
        AddColumn("blocks", "arrivals", "BIGINT NOT NULL DEFAULT 0"),
        if_not_exists(DEMANDS)],
}

# ------------------------------------------------------------------------------------------------------ meta rows
META_SCHEMA_VERSION = "SELECT value FROM meta WHERE key = 'schema_version'"
META_SET_SCHEMA_VERSION = "UPDATE meta SET value = ? WHERE key = 'schema_version'"
META_HAS_SCHEMA_VERSION = "SELECT 1 FROM meta WHERE key = 'schema_version'"
META_INSERT_SCHEMA_VERSION = "INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
META_INSERT_LOCK = "INSERT INTO meta (key, value) VALUES ('lock', '0')"
META_INSERT = "INSERT INTO meta (key, value) VALUES (?, ?)"

# --------------------------------------------------------------------------------------------------------- SQLite
SQLITE_BUSY_TIMEOUT = "PRAGMA busy_timeout=120000"
SQLITE_WAL = "PRAGMA journal_mode=WAL"
SQLITE_SYNCHRONOUS_FULL = "PRAGMA synchronous=FULL"
SQLITE_IS_EMPTY = "SELECT count(*) FROM sqlite_master"
SQLITE_INTEGRITY_CHECK = "PRAGMA integrity_check"
SQLITE_BEGIN_WRITE = "BEGIN IMMEDIATE"  # takes the database's write lock up front
SQLITE_BEGIN_READ = "BEGIN"
SQLITE_COMMIT = "COMMIT"
SQLITE_ROLLBACK = "ROLLBACK"


def sqlite_columns(table: str) -> str:
    """The columns of ``table``: rows whose second field is a column's name (a name from MIGRATIONS, not input)."""
    return f"PRAGMA table_info({table})"


# ----------------------------------------------------------------------------------------------------- PostgreSQL
PG_HAS_COLUMN = ("SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' AND table_name = ?"
                 " AND column_name = ?")
PG_HAS_META = "SELECT to_regclass('public.meta') IS NOT NULL"
PG_INIT_LOCK = "SELECT pg_advisory_xact_lock(727272)"  # serializes concurrent inits of one database
# Every write transaction first locks the meta 'lock' row: writers on every host take turns.
PG_WRITE_LOCK = "SELECT value FROM meta WHERE key = 'lock' FOR UPDATE"
# One snapshot for a whole read transaction (READ COMMITTED, the default, takes one per statement).
PG_BEGIN_READ = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
PG_TRY_CLAIM = "SELECT pg_try_advisory_lock(?)"
PG_RELEASE_CLAIM = "SELECT pg_advisory_unlock(?)"
# Who holds the advisory lock of a claim key (its two 32-bit halves): the holder's application_name and address.
PG_CLAIM_HOLDER = ("SELECT a.application_name, host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a"
                   " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                   " AND l.classid = ?::bigint::oid AND l.objid = ?::bigint::oid AND l.database ="
                   " (SELECT oid FROM pg_database WHERE datname = current_database())")

# ------------------------------------------------------------------------------------- the audit (audit.py, step 4)
AUDIT_LOG = "SELECT seq, ts, kind, body, prev, hash FROM log ORDER BY seq"
AUDIT_STREAMS = ("SELECT name, accounting, epsilon, delta, orders, policy, min_epsilon, min_grant_epsilon,"
                 " policy_params FROM streams")
AUDIT_BLOCK_SPENT = "SELECT stream, id, spent, state FROM blocks"
AUDIT_GRANTS = "SELECT id, body, signature FROM grants"
AUDIT_RELEASES = "SELECT grant_id, stage, computation, epsilon, delta FROM releases"
AUDIT_BLOCK_ROWS = "SELECT stream, id, start_ts, end_ts, shard, created, n_rows, digest FROM blocks"
AUDIT_GRANT_COLUMNS = "SELECT id, stream, pipeline, created FROM grants"
AUDIT_PIPELINES = "SELECT stream, name, state, outcome FROM pipelines"
AUDIT_RESERVATIONS = "SELECT stream, block, pipeline, reserved, used FROM reservations"
AUDIT_OUTCOMES = "SELECT grant_id, stream, pipeline, outcome, details FROM outcomes"
AUDIT_META = "SELECT key, value FROM meta"
AUDIT_DEMANDS = "SELECT stream, pipeline, blocks, cost, rule, meta, seq, state, grant_id FROM demands"
AUDIT_BLOCK_ARRIVALS = "SELECT stream, id, arrivals FROM blocks"
