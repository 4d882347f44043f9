"""All the SQL text of the ledger's store and of the audit, in one place.

Nothing here runs a statement; every statement is written once with ``?`` placeholders, in sections named
by prefix (``META_*``, ``STREAM_*``, ``AUDIT_*``, ...). The module imports nothing. Contract: a change of
``TABLES``/``MIGRATIONS`` needs a new ``SCHEMA_VERSION`` and a migration step, so every existing ledger
still opens. Sections and rules: docs/block_composition.md, "The store's SQL".
"""

import functools
from typing import Any, NamedTuple

SCHEMA_VERSION = 10


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
        "CREATE INDEX", "CREATE INDEX IF NOT EXISTS"
    )


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

# The draws of run grants from per-block lifetime grants (privacy/draws.py): one row per (lifetime grant, run).
DRAWS = """CREATE TABLE draws (
        lifetime_grant TEXT NOT NULL, run BIGINT NOT NULL, run_grant TEXT NOT NULL, stream TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL, created DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (lifetime_grant, run))"""

# The schema of SCHEMA_VERSION: a new ledger's tables and indexes.
TABLES = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE streams (
        name TEXT PRIMARY KEY, accounting TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL,
        delta DOUBLE PRECISION NOT NULL, orders TEXT NOT NULL, policy TEXT NOT NULL,
        min_epsilon DOUBLE PRECISION NOT NULL, created DOUBLE PRECISION NOT NULL,
        min_grant_epsilon DOUBLE PRECISION, policy_params TEXT, query_delta_share DOUBLE PRECISION,
        split_orders INTEGER, privacy_unit TEXT, max_rows_per_unit BIGINT)""",
    """CREATE TABLE blocks (
        stream TEXT NOT NULL, id TEXT NOT NULL, start_ts DOUBLE PRECISION, end_ts DOUBLE PRECISION,
        shard BIGINT, n_rows BIGINT, created DOUBLE PRECISION NOT NULL, state TEXT NOT NULL,
        spent TEXT NOT NULL, retired DOUBLE PRECISION, digest TEXT, arrivals BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (stream, id))""",
    DEMANDS,
    DRAWS,
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
MIGRATIONS: dict[int, list[Any]] = {
    # 2: the releases of each grant's stages
    1: [
        """CREATE TABLE IF NOT EXISTS releases (
        grant_id TEXT NOT NULL, stage TEXT NOT NULL, stream TEXT NOT NULL, pipeline TEXT NOT NULL,
        computation TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        created DOUBLE PRECISION NOT NULL, PRIMARY KEY (grant_id, stage))"""
    ],
    # 3: each block's content digest (ingest), to refuse the same records registered in a second stream, and
    # each stream's minimum grant epsilon (NULL on older streams: the default)
    2: [
        AddColumn("blocks", "digest", "TEXT"),
        AddColumn("streams", "min_grant_epsilon", "DOUBLE PRECISION"),
        "CREATE INDEX IF NOT EXISTS blocks_digest ON blocks (digest)",
    ],
    # 4: an index on each stream's shards, so add_blocks' shard-clash check is one index look-up, not a scan of the
    # stream's blocks (its cost no longer grows with the stream: docs/BENCHMARKS.md); nothing stored changes
    3: ["CREATE INDEX IF NOT EXISTS blocks_shard ON blocks (stream, shard)"],
    # 5: the queued policies (docs/scheduling_policies.md): each stream's policy parameters (NULL: none, as every
    # stream before), each block's count of pipeline arrivals since it arrived (0 on older blocks: only queued
    # streams count them), and the demands a queued stream's scheduler holds (pending or admitted)
    4: [
        AddColumn("streams", "policy_params", "TEXT"),
        AddColumn("blocks", "arrivals", "BIGINT NOT NULL DEFAULT 0"),
        if_not_exists(DEMANDS),
    ],
    # 6: growth schedules over a TFX pipeline (docs/release_strategies.md): the draws of each run grant from the
    # per-block lifetime grants it reads under (privacy/draws.py); nothing stored before changes
    5: [if_not_exists(DRAWS)],
    # 7: an rdp stream's fixed split of its delta (filters.RdpFilter: the queries' share, the rest converts); NULL on
    # every stream made before, which keeps the legacy rule (docs/block_composition.md)
    6: [AddColumn("streams", "query_delta_share", "DOUBLE PRECISION")],
    # 8: an rdp stream's conversion delta split evenly over its orders (filters.RdpFilter: the union bound over the
    # orders); NULL on every stream made before, whose orders each convert at all of it (docs/block_composition.md)
    7: [AddColumn("streams", "split_orders", "INTEGER")],
    # 9: a stream's privacy unit (a column of its records) and the most rows per unit and block it keeps
    # (docs/block_composition.md, "Privacy units"); NULL on every stream made before: unit = row
    8: [AddColumn("streams", "privacy_unit", "TEXT"), AddColumn("streams", "max_rows_per_unit", "BIGINT")],
    # 10: no DDL: the keyed ``upgrade`` entry binding the rows' display times, written by migrations.py, and every
    # entry's time in its chain value from then on (keys.KeyRing.chain_value)
    9: [],
}
# The versions whose step ends in a keyed log entry (migrations.py runs it and sets the next version), after their DDL.
KEYED_STEPS = frozenset({9})

# ------------------------------------------------------------------------------------------------------ meta rows
META_SCHEMA_VERSION = "SELECT value FROM meta WHERE key = 'schema_version'"
META_SET_SCHEMA_VERSION = "UPDATE meta SET value = ? WHERE key = 'schema_version'"
META_HAS_SCHEMA_VERSION = "SELECT 1 FROM meta WHERE key = 'schema_version'"
META_INSERT_SCHEMA_VERSION = "INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
META_INSERT_LOCK = "INSERT INTO meta (key, value) VALUES ('lock', '0')"
META_INSERT = "INSERT INTO meta (key, value) VALUES (?, ?)"
META_ALL = "SELECT key, value FROM meta"  # every meta row (the ledger's open, the audit)
# an older ledger's secret moved out (session.migrate_secret): what is there, then the key's rows replaced
META_HAS_SECRET = "SELECT 1 FROM meta WHERE key = 'secret'"
META_HAS_KEY_ID = "SELECT 1 FROM meta WHERE key = 'key_id'"
META_LEDGER_ID = "SELECT value FROM meta WHERE key = 'ledger_id'"
META_DELETE_KEY_ROWS = "DELETE FROM meta WHERE key IN ('secret', 'key_id', 'ledger_id')"
META_INSERT_KEY_ID = "INSERT INTO meta (key, value) VALUES ('key_id', ?)"
META_INSERT_LEDGER_ID = "INSERT INTO meta (key, value) VALUES ('ledger_id', ?)"
META_SET_LEDGER_ID = "UPDATE meta SET value = ? WHERE key = 'ledger_id'"  # anchor.reanchor: the bound id back

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
PG_HAS_COLUMN = (
    "SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' AND table_name = ? AND column_name = ?"
)
PG_HAS_META = "SELECT to_regclass('public.meta') IS NOT NULL"
PG_INIT_LOCK = "SELECT pg_advisory_xact_lock(727272)"  # serializes concurrent inits of one database
# Every write transaction first locks the meta 'lock' row: writers on every host take turns.
PG_WRITE_LOCK = "SELECT value FROM meta WHERE key = 'lock' FOR UPDATE"
# One snapshot for a whole read transaction (READ COMMITTED, the default, takes one per statement).
PG_BEGIN_READ = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
PG_TRY_CLAIM = "SELECT pg_try_advisory_lock(?)"
PG_RELEASE_CLAIM = "SELECT pg_advisory_unlock(?)"
# Who holds the advisory lock of a claim key (its two 32-bit halves): the holder's application_name and address.
PG_CLAIM_HOLDER = (
    "SELECT a.application_name, host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a"
    " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.classid = ?::bigint::oid AND l.objid = ?::bigint::oid AND l.database ="
    " (SELECT oid FROM pg_database WHERE datname = current_database())"
)

# ------------------------------------------------------------------------------------------- the ledger: streams
STREAM_COLUMNS = (
    "name, accounting, epsilon, delta, orders, policy, min_epsilon, created, min_grant_epsilon,"
    " policy_params, query_delta_share, split_orders, privacy_unit, max_rows_per_unit"
)  # a stream row as Ledger.stream parses it
STREAM_WIDTH = len(STREAM_COLUMNS.split(","))  # how many columns STREAM_COLUMNS names
STREAM_EXISTS = "SELECT 1 FROM streams WHERE name = ?"
STREAM_INSERT = "INSERT INTO streams (" + STREAM_COLUMNS + ") VALUES (" + marks(STREAM_WIDTH) + ")"
STREAM_ROW = "SELECT " + STREAM_COLUMNS + " FROM streams WHERE name = ?"
STREAM_NAMES = "SELECT name FROM streams ORDER BY name"
# ``request``'s one read: the stream row, the pipeline's state, the log's last entry (seq, hash), and 1 if any
# reservation lies in the requested blocks' id range (params: stream, pipeline, stream, lo, hi, stream)
STREAM_REQUEST_READ = (
    "SELECT " + STREAM_COLUMNS + ","
    " (SELECT state FROM pipelines WHERE stream = ? AND name = ?),"
    " (SELECT seq FROM log ORDER BY seq DESC LIMIT 1), (SELECT hash FROM log ORDER BY seq DESC LIMIT 1),"
    " (SELECT 1 FROM reservations WHERE stream = ? AND block BETWEEN ? AND ? LIMIT 1)"
    " FROM streams WHERE name = ?"
)

# -------------------------------------------------------------------------------------------- the ledger: blocks
BLOCK_COLUMNS = "id, start_ts, end_ts, shard, created, state, spent, retired"  # a Block's row
BLOCK_KEY_ORDER = " ORDER BY start_ts, shard, created, id"  # key order: time window or shard
BLOCK_ROWS = "SELECT " + BLOCK_COLUMNS + " FROM blocks WHERE stream = ?" + BLOCK_KEY_ORDER
BLOCK_ROWS_IN_STATE = "SELECT " + BLOCK_COLUMNS + " FROM blocks WHERE stream = ? AND state = ?" + BLOCK_KEY_ORDER
# add_blocks' overlap check: the one window starting last before ``end``, if it ends after ``start``
BLOCK_LAST_WINDOW_CLASH = (
    "SELECT id FROM (SELECT id, end_ts FROM blocks WHERE stream = ? AND start_ts < ?"
    " ORDER BY start_ts DESC LIMIT 1) last_window WHERE end_ts > ?"
)
BLOCK_FIRST_WINDOW_CLASH = (
    "SELECT id FROM blocks WHERE stream = ? AND start_ts < ? AND end_ts > ?"
    " ORDER BY start_ts LIMIT 1"
)  # the earliest overlapping window, for the refusal
BLOCK_SHARD_CLASH = "SELECT id FROM blocks WHERE stream = ? AND shard = ?"
BLOCK_INSERT = (
    "INSERT INTO blocks (stream, id, start_ts, end_ts, shard, n_rows, created, state, spent, digest)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, 'active', ?, ?)"
)  # a fresh block: active, spent zero
BLOCK_N_ROWS = "SELECT n_rows FROM blocks WHERE stream = ? AND id = ?"
BLOCK_DIGEST = "SELECT digest FROM blocks WHERE stream = ? AND id = ?"
BLOCK_WINDOW_IDS = (
    "SELECT id FROM blocks WHERE stream = ? AND state = 'active' AND start_ts >= ? AND end_ts <= ?"
    " ORDER BY start_ts"
)  # the active blocks inside a window
BLOCK_ACTIVE_SPENT = "SELECT id, spent FROM blocks WHERE stream = ? AND state = 'active'" + BLOCK_KEY_ORDER
BLOCK_COUNT_ARRIVAL = "UPDATE blocks SET arrivals = arrivals + 1 WHERE stream = ? AND state = 'active'"
BLOCK_SET_SPENT = "UPDATE blocks SET spent = ?, state = ?, retired = ? WHERE stream = ? AND id = ?"


def block_ids_present(n: int) -> str:
    """Which of ``n`` ids are blocks of a stream (params: stream, ids)."""
    return f"SELECT id FROM blocks WHERE stream = ? AND id IN ({marks(n)})"


def block_digest_owners(n: int) -> str:
    """The blocks of other streams holding any of ``n`` digests (params: digests, the stream left out)."""
    return f"SELECT digest, stream, id FROM blocks WHERE digest IN ({marks(n)}) AND stream <> ? ORDER BY stream, id"


def block_rows(n: int) -> str:
    """``n`` blocks' rows (``BLOCK_COLUMNS``; params: stream, ids)."""
    return f"SELECT {BLOCK_COLUMNS} FROM blocks WHERE stream = ? AND id IN ({marks(n)})"


@functools.cache  # a grant's statement, built once per block count
def block_budgets(n: int) -> str:
    """``n`` blocks' state and spent with their reservations, one row per (block, holder) (params: stream, ids)."""
    return (
        "SELECT b.id, b.state, b.spent, r.pipeline, r.reserved, r.used FROM blocks b"
        " LEFT JOIN reservations r ON r.stream = b.stream AND r.block = b.id"
        f" WHERE b.stream = ? AND b.id IN ({marks(n)}) ORDER BY b.id, r.pipeline"
    )


# A grant's blocks as one id range (block_ranges.py): each block's state and spent in the store's id order, up to
# a row limit (params: stream, lo, hi, limit)
BLOCK_RANGE_BUDGETS = "SELECT id, state, spent FROM blocks WHERE stream = ? AND id BETWEEN ? AND ? ORDER BY id LIMIT ?"
# one new (spent, state, retired) for the blocks of one id range (params: the three values, stream, first, last)
BLOCK_RANGE_SET_SPENT = "UPDATE blocks SET spent = ?, state = ?, retired = ? WHERE stream = ? AND id BETWEEN ? AND ?"


def block_queue_rows(n: int) -> str:
    """What a queued stream's scheduler loads of ``n`` blocks (params: stream, ids)."""
    return f"SELECT id, state, spent, created, arrivals FROM blocks WHERE stream = ? AND id IN ({marks(n)})"


@functools.cache  # a grant's statement, built once per block count
def block_set_spent(n: int) -> str:
    """One new (spent, state, retired) for ``n`` blocks (params: the three values, stream, ids)."""
    return f"UPDATE blocks SET spent = ?, state = ?, retired = ? WHERE stream = ? AND id IN ({marks(n)})"


# ----------------------------------------------------------------------------------------- the ledger: pipelines
PIPELINE_INSERT = "INSERT INTO pipelines (stream, name, state, registered) VALUES (?, ?, 'waiting', ?)"
PIPELINE_STATE = "SELECT state FROM pipelines WHERE stream = ? AND name = ?"
PIPELINE_STATE_OUTCOME = "SELECT state, outcome FROM pipelines WHERE stream = ? AND name = ?"
PIPELINE_WAITING = "SELECT name FROM pipelines WHERE stream = ? AND state = 'waiting' ORDER BY name"
PIPELINE_ROWS = "SELECT name, state, outcome, registered, finished FROM pipelines WHERE stream = ? ORDER BY registered"
PIPELINE_FINISH = "UPDATE pipelines SET state = 'done', outcome = ?, finished = ? WHERE stream = ? AND name = ?"

# -------------------------------------------------------------------------------------- the ledger: reservations
RESERVATION_INSERT = "INSERT INTO reservations (stream, block, pipeline, reserved, used) VALUES (?, ?, ?, ?, ?)"
# finish: the reservations on active blocks held by the finishing pipeline or one still waiting
RESERVATION_HELD = (
    "SELECT r.block, r.pipeline, r.reserved, r.used FROM reservations r"
    " JOIN blocks b ON b.stream = r.stream AND b.id = r.block"
    " JOIN pipelines p ON p.stream = r.stream AND p.name = r.pipeline"
    " WHERE r.stream = ? AND b.state = 'active' AND (r.pipeline = ? OR p.state = 'waiting')"
)
RESERVATION_ACTIVE = (
    "SELECT r.block, r.pipeline, r.reserved, r.used FROM reservations r JOIN blocks b"
    " ON b.stream = r.stream AND b.id = r.block WHERE r.stream = ? AND b.state = 'active'"
    " ORDER BY r.block, r.pipeline"
)  # every active block's reservations


def reservation_rows(n: int) -> str:
    """The reservations on ``n`` blocks (params: stream, block ids)."""
    return (
        f"SELECT block, pipeline, reserved, used FROM reservations WHERE stream = ? AND block IN ({marks(n)})"
        " ORDER BY block, pipeline"
    )


def reservation_set_used(n: int) -> str:
    """One pipeline's new ``used`` on ``n`` blocks (params: used, stream, pipeline, block ids)."""
    return f"UPDATE reservations SET used = ? WHERE stream = ? AND pipeline = ? AND block IN ({marks(n)})"


def reservation_upsert(n: int) -> str:
    """``n`` reservation rows written; an existing row's ``reserved`` alone changes (params: 5 values a row)."""
    return (
        "INSERT INTO reservations (stream, block, pipeline, reserved, used) VALUES "
        + value_rows(n, 5)
        + " ON CONFLICT (stream, block, pipeline) DO UPDATE SET reserved = excluded.reserved"
    )


# -------------------------------------------------------------------------------------------- the ledger: grants
GRANT_INSERT = "INSERT INTO grants (id, stream, pipeline, body, signature, created) VALUES (?, ?, ?, ?, ?, ?)"
GRANT_BODY = "SELECT body, signature FROM grants WHERE id = ?"
GRANT_BODIES = "SELECT body, signature FROM grants ORDER BY created"
GRANT_STREAM_BODIES = "SELECT body, signature FROM grants WHERE stream = ? ORDER BY created"
GRANT_OWNER = "SELECT stream, pipeline FROM grants WHERE id = ?"
GRANT_COUNT = "SELECT count(*) FROM grants WHERE stream = ?"
GRANT_IDS = "SELECT id FROM grants"
# a pipeline's grants in order, each with its outcome if recorded
GRANT_HISTORY = (
    "SELECT g.body, g.signature, o.outcome, o.details FROM grants g LEFT JOIN outcomes o"
    " ON o.grant_id = g.id WHERE g.stream = ? AND g.pipeline = ? ORDER BY g.created, g.id"
)

# ------------------------------------------------------------------------------ the ledger: demands (queued policies)
DEMAND_ROW = "SELECT blocks, cost, rule, meta, state, grant_id FROM demands WHERE stream = ? AND pipeline = ?"
DEMAND_DELETE = "DELETE FROM demands WHERE stream = ? AND pipeline = ?"
DEMAND_INSERT = (
    "INSERT INTO demands (stream, pipeline, blocks, cost, rule, meta, seq, state, grant_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)"
)
DEMAND_IN_STATE = (
    "SELECT pipeline, blocks, cost, rule, meta, seq FROM demands WHERE stream = ? AND state = ?"
    " ORDER BY seq"
)  # the queue, in arrival order
DEMAND_ADMIT = "UPDATE demands SET state = ?, grant_id = ? WHERE stream = ? AND pipeline = ?"

# ------------------------------------------------------------------------------------------ the ledger: releases
RELEASE_OF_GRANT = "SELECT stage, computation, epsilon, delta, created FROM releases WHERE grant_id = ?"
RELEASE_INSERT = (
    "INSERT INTO releases (grant_id, stage, stream, pipeline, computation, epsilon, delta, created)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
RELEASE_ROWS = (
    "SELECT grant_id, stage, computation, epsilon, delta, created FROM releases ORDER BY created, grant_id, stage"
)
RELEASE_ROWS_OF_GRANT = (
    "SELECT grant_id, stage, computation, epsilon, delta, created FROM releases"
    " WHERE grant_id = ? ORDER BY created, grant_id, stage"
)

# ------------------------------------------------------------------------------------------ the ledger: outcomes
OUTCOME_EXISTS = "SELECT 1 FROM outcomes WHERE grant_id = ?"
OUTCOME_INSERT = (
    "INSERT INTO outcomes (grant_id, stream, pipeline, outcome, details, created) VALUES (?, ?, ?, ?, ?, ?)"
)

# ----------------------------------------------------------------------------------------------- the ledger: log
LOG_ALL = "SELECT seq, ts, kind, body, prev, hash FROM log ORDER BY seq"
LOG_LAST = "SELECT seq, hash FROM log ORDER BY seq DESC LIMIT 1"  # what the next entry chains to
LOG_LAST_SEQ = "SELECT seq FROM log ORDER BY seq DESC LIMIT 1"
LOG_INSERT = "INSERT INTO log (seq, ts, kind, body, prev, hash) VALUES (?, ?, ?, ?, ?, ?)"
LOG_TRUSTED_READS = "SELECT body FROM log WHERE kind = 'trusted_read' ORDER BY seq"  # decryptions outside a grant
LOG_FIRST_OF_KIND = "SELECT seq, kind, body, prev, hash, ts FROM log WHERE kind = ? ORDER BY seq LIMIT 1"  # anchor.py
LOG_HASH_AT = "SELECT hash FROM log WHERE seq = ?"  # the entry a head file names (anchor.head_problem)
LOG_FIRST_KEYS_ENTRY = "SELECT seq, kind, body, prev, hash, ts FROM log WHERE kind = 'keys' ORDER BY seq LIMIT 1"

# ------------------------------------------------------------------------------------- the audit (audit.py, step 4)
AUDIT_LOG = LOG_ALL
AUDIT_STREAMS = (
    "SELECT name, accounting, epsilon, delta, orders, policy, min_epsilon, min_grant_epsilon,"
    " policy_params, query_delta_share, split_orders, privacy_unit, max_rows_per_unit FROM streams"
)
AUDIT_BLOCK_SPENT = "SELECT stream, id, spent, state FROM blocks"
AUDIT_GRANTS = "SELECT id, body, signature FROM grants"
AUDIT_RELEASES = "SELECT grant_id, stage, computation, epsilon, delta, stream, pipeline FROM releases"
AUDIT_BLOCK_ROWS = "SELECT stream, id, start_ts, end_ts, shard, created, n_rows, digest FROM blocks"
AUDIT_GRANT_COLUMNS = "SELECT id, stream, pipeline, created FROM grants"
AUDIT_PIPELINES = "SELECT stream, name, state, outcome FROM pipelines"
AUDIT_RESERVATIONS = "SELECT stream, block, pipeline, reserved, used FROM reservations"
AUDIT_OUTCOMES = "SELECT grant_id, stream, pipeline, outcome, details FROM outcomes"
AUDIT_META = META_ALL
AUDIT_DEMANDS = "SELECT stream, pipeline, blocks, cost, rule, meta, seq, state, grant_id FROM demands"
AUDIT_BLOCK_ARRIVALS = "SELECT stream, id, arrivals FROM blocks"

# --------------------------------------------------------------------- draws of run grants (privacy/draws.py)
DRAW_INSERT = (
    "INSERT INTO draws (lifetime_grant, run, run_grant, stream, epsilon, delta, created) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
DRAW_ALL = "SELECT lifetime_grant, run, run_grant, stream, epsilon, delta FROM draws ORDER BY run, lifetime_grant"


def draw_grants(n: int) -> str:
    """``n`` grants' records (params: ids): the lifetime grants a draw names, or the run grant drawn before."""
    return f"SELECT id, body, signature FROM grants WHERE id IN ({marks(n)})"


def draw_releases(n: int) -> str:
    """The releases opened under ``n`` grants (params: ids)."""
    return f"SELECT grant_id, stage, computation FROM releases WHERE grant_id IN ({marks(n)})"


def draw_rows(n: int) -> str:
    """The draws on ``n`` lifetime grants (params: ids)."""
    return f"SELECT lifetime_grant, run, run_grant, epsilon, delta FROM draws WHERE lifetime_grant IN ({marks(n)})"


AUDIT_DRAWS = "SELECT lifetime_grant, run, run_grant, stream, epsilon, delta FROM draws"

# ----------------------------------------------------- the rows' display times the keyed log binds (stamps.py)
AUDIT_STREAM_CREATED = "SELECT name, created FROM streams"
AUDIT_BLOCK_RETIRED = "SELECT stream, id, retired FROM blocks"
AUDIT_PIPELINE_REGISTERED = "SELECT stream, name, registered FROM pipelines"
AUDIT_PIPELINE_FINISHED = "SELECT stream, name, finished FROM pipelines"
AUDIT_DRAW_CREATED = "SELECT run_grant, lifetime_grant, created FROM draws"
AUDIT_OUTCOME_CREATED = "SELECT grant_id, created FROM outcomes"
AUDIT_RELEASE_CREATED = "SELECT grant_id, stage, created FROM releases"
LOG_TIMES = "SELECT seq, ts FROM log ORDER BY seq"  # every entry's time (an upgrade entry's digest)
