"""The store's SQL module (sage_tfx/privacy/store/sql.py): every statement it holds is valid SQL on the schema it
describes, a fresh schema and a migrated one agree, and its placeholder helpers build what they say; the ledger's
modules hold no SQL text of their own (all of it lives in sql.py)."""

import ast
import inspect
import pathlib
import re
import sqlite3

import pytest

from sage_tfx.privacy.store import sql


def _fresh():
    conn = sqlite3.connect(":memory:")
    for ddl in sql.TABLES:
        conn.execute(ddl)
    return conn


def _columns(conn):
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return {t: sorted((r[1], r[2].upper(), r[3], r[4]) for r in conn.execute(sql.sqlite_columns(t))) for t in tables}


def _indexes(conn):
    return sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"))


SQL_WORDS = ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE")
# the module's statements: every upper-case constant holding one (the schema's DDL and the backends' PRAGMAs and
# PostgreSQL-only statements aside: TABLES and MIGRATIONS are run by the migration test below)
STATEMENTS = sorted(
    n
    for n in dir(sql)
    if n.isupper()
    and isinstance(getattr(sql, n), str)
    and getattr(sql, n).startswith(SQL_WORDS[:4])
    and not n.startswith(("PG_", "SQLITE_"))
)
# the statements whose text depends on how many ids they name: sql.<name>(n) (a grant's own: built once per n, cached)
BUILDERS = sorted(
    n
    for n, f in vars(sql).items()
    if inspect.isfunction(inspect.unwrap(f)) and n.startswith(("block_", "reservation_", "draw_"))
)


def test_the_ledgers_statements_are_all_here():
    assert len(STATEMENTS) >= 70 and {
        "STREAM_REQUEST_READ",
        "GRANT_INSERT",
        "LOG_INSERT",
        "DEMAND_ADMIT",
        "AUDIT_LOG",
        "META_ALL",
    } <= set(STATEMENTS)
    assert set(BUILDERS) == {
        "block_ids_present",
        "block_digest_owners",
        "block_rows",
        "block_budgets",
        "block_queue_rows",
        "block_set_spent",
        "reservation_rows",
        "reservation_set_used",
        "reservation_upsert",
        "draw_grants",
        "draw_releases",
        "draw_rows",
    }


@pytest.mark.parametrize("name", STATEMENTS)
def test_each_statement_prepares_on_the_schema(name):
    """SQLite prepares a statement only if its tables and columns exist: a typo in a name fails here."""
    conn = _fresh()
    text = getattr(sql, name)
    conn.execute("EXPLAIN " + text, (None,) * text.count("?"))


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("n", [1, 3])
def test_each_statement_builder_prepares_on_the_schema(name, n):
    conn = _fresh()
    text = getattr(sql, name)(n)
    assert text.count("?") >= n
    conn.execute("EXPLAIN " + text, (None,) * text.count("?"))


# the ledger facade and the modules split out of it (sage_tfx/privacy/__init__.py's layout)
LEDGER_MODULES = [
    "ledger.py",
    "ledger_reads.py",
    "streams.py",
    "blocks.py",
    "charges.py",
    "grants.py",
    "session.py",
    "draws.py",
    "requests.py",
    "releases.py",
    "pipelines.py",
    "trusted_reads.py",
    "opening.py",
]
SQL_TEXT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE)\s")  # how every statement here starts


def _string_literals(path):
    """Every string constant of a module's source, with its line (an f-string's literal parts included)."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


@pytest.mark.parametrize("module", LEDGER_MODULES)
def test_the_ledger_modules_hold_no_sql_text(module):
    path = pathlib.Path(sql.__file__).resolve().parent.parent / module
    found = [(line, text[:60]) for line, text in _string_literals(path) if SQL_TEXT.match(text)]
    assert found == [], f"{module} holds SQL text (move it to store/sql.py): {found}"


def test_the_sql_text_check_finds_sql(tmp_path):
    """The check above can fail: SQL in a string or in an f-string's literal part is found."""
    path = tmp_path / "m.py"
    path.write_text('X = 1\nq = "SELECT 1"\ndef f(n):\n    return f"UPDATE t SET a = {n}"\n')
    assert [t for _line, t in _string_literals(path) if SQL_TEXT.match(t)] == ["SELECT 1", "UPDATE t SET a = "]
    assert not SQL_TEXT.match("Create a stream") and not SQL_TEXT.match("created")


def test_the_schema_reached_by_the_migrations_is_the_fresh_schema():
    """Version 1's tables (the fresh schema less what each migration adds), migrated step by step, end with the
    columns and indexes of a new ledger: the migrations and TABLES describe the same SCHEMA_VERSION."""
    conn = sqlite3.connect(":memory:")
    added = {(s.table, s.column) for steps in sql.MIGRATIONS.values() for s in steps if isinstance(s, sql.AddColumn)}
    assert added == {
        ("blocks", "digest"),
        ("streams", "min_grant_epsilon"),
        ("streams", "policy_params"),
        ("blocks", "arrivals"),
        ("streams", "query_delta_share"),
        ("streams", "split_orders"),
        ("streams", "privacy_unit"),
        ("streams", "max_rows_per_unit"),
    }
    for ddl in sql.TABLES:
        if ddl.startswith("CREATE INDEX") or " releases " in ddl or " demands " in ddl:
            continue  # tables and indexes the migrations create (the two version-1 indexes follow)
        for table, column in added:  # version 1 had not the column a migration adds: ", column TYPE ..." removed
            if f"CREATE TABLE {table} " in ddl:
                ddl, n = re.subn(rf",\s*{column} [^,)]*", "", ddl)
                assert n == 1, (table, column)
        conn.execute(ddl)
    conn.execute("CREATE INDEX blocks_window ON blocks (stream, start_ts)")
    conn.execute("CREATE INDEX grants_stream ON grants (stream, created)")
    for version in sorted(sql.MIGRATIONS):
        assert version + 1 <= sql.SCHEMA_VERSION
        for step in sql.MIGRATIONS[version]:
            if isinstance(step, sql.AddColumn):
                conn.execute(sql.add_column(step))
            else:
                conn.execute(step)
    assert max(sql.MIGRATIONS) + 1 == sql.SCHEMA_VERSION
    fresh = _fresh()
    assert _columns(conn) == _columns(fresh)
    assert _indexes(conn) == _indexes(fresh)


def test_if_not_exists_makes_the_schema_re_runnable():
    conn = _fresh()
    for ddl in sql.TABLES:
        conn.execute(sql.if_not_exists(ddl))  # no "already exists" error


def test_placeholder_helpers():
    assert sql.marks(1) == "?" and sql.marks(3) == "?,?,?"
    assert sql.value_rows(1, 3) == "(?, ?, ?)" and sql.value_rows(2, 2) == "(?, ?),(?, ?)"
    conn = sqlite3.connect(":memory:")
    assert conn.execute(
        f"SELECT count(*) FROM (VALUES {sql.value_rows(3, 2)}) WHERE 1 IN ({sql.marks(2)})", (1, 2, 3, 4, 5, 6, 1, 9)
    ).fetchone() == (3,)
    for bad in (lambda: sql.marks(0), lambda: sql.value_rows(0, 2), lambda: sql.value_rows(2, 0)):
        with pytest.raises(ValueError, match="got"):
            bad()
