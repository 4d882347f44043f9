"""The catalogue of database-only tamper cases, generated from a real ledger: a writer of the database alone (no
key file) edits each column, deletes each row, inserts a copy of a row under a new key and swaps two rows' contents
in every ledger table; changes ``ledger_id``; restores an old copy; truncates the last grant; deletes the head
file. Each case must be caught by ``Ledger.open`` (refused) or by the audit (``sage ledger audit``: the same
``Ledger.open(check_head=False).audit()``), never with a traceback.

tests/privacy/test_tamper.py and tests/privacy/test_rollback.py check the exact message of the review's named cases; this file
counts them all. Every column is bound by the keyed log, the display times (``DISPLAY_TIMES``) included: each is
the time of the keyed entry that wrote its row, and the chain value binds that time (privacy/stamps.py). SQLite,
no TensorFlow.
"""

import json
import os
import secrets
import shutil
import sqlite3

import pytest

from sage_tfx.cli import main
from sage_tfx.privacy import BudgetRefused, Ledger, LedgerError
from sage_tfx.release.growth import charge_lifetime, schedule_fingerprint
from tests.helpers.head_file import backup, restore

DAY = 86400.0
PRIMARY_KEYS = {
    "meta": ["key"],
    "streams": ["name"],
    "blocks": ["stream", "id"],
    "demands": ["stream", "pipeline"],
    "draws": ["lifetime_grant", "run"],
    "grants": ["id"],
    "pipelines": ["stream", "name"],
    "reservations": ["stream", "block", "pipeline"],
    "log": ["seq"],
    "outcomes": ["grant_id"],
    "releases": ["grant_id", "stage"],
}
# (table, column): columns no keyed entry binds; none is left (every display time is bound: privacy/stamps.py)
UNBOUND: set[tuple[str, str]] = set()
# (table, column): the display times no budget decision reads, shown by status, history and the audit's trusted reads
DISPLAY_TIMES = {
    ("streams", "created"),
    ("blocks", "retired"),
    ("pipelines", "registered"),
    ("pipelines", "finished"),
    ("draws", "created"),
    ("outcomes", "created"),
    ("releases", "created"),
    ("log", "ts"),
}


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv("SAGE_KEY_FILE", raising=False)


def _fill(ledger):
    """Every table gets rows: two streams (one queued), window and shard blocks, pipelines waiting and finished,
    grants with an outcome and a release, a lifetime grant with a draw, a trusted read, a pending demand."""
    ledger.create_stream("s", 1.0, 1e-6)
    ledger.create_stream("q", 1.0, 1e-6, policy="dpf-n", policy_params={"n": 4}, min_epsilon=0.01)
    ledger.register("s", "p")
    ledger.register("s", "r")
    ledger.add_block("s", "b0", start=0.0, end=DAY, rows=10, digest="aa")
    ledger.add_block("s", "b1", start=DAY, end=2 * DAY, rows=20, digest="bb")
    ledger.add_block("s", "b2", shard=3, rows=5)
    first = ledger.request("p", "s", blocks=["b0", "b1"], epsilon=0.2)
    ledger.record_outcome(first.id, "RETRY")
    ledger.finish("s", "r", "TIMEOUT")


def _fill_more(ledger):
    grant = ledger.request("p", "s", blocks=["b1"], epsilon=0.1)
    ledger.release(grant, "training", "c", 0.1)
    meta = {"strategy": "bbscheduler", "catalogue": 1}
    schedule = schedule_fingerprint("p", "s", meta)
    ledger.draw([charge_lifetime(ledger, "s", "p", "b2", 0.5, 1e-7, meta, schedule)], 0, 0.1, 0.0, schedule=schedule)
    ledger.record_trusted_read("s", ["b0"], "baseline")
    ledger.add_blocks("q", [{"id": "c0"}, {"id": "c1"}])
    ledger.register("q", "p")
    with pytest.raises(BudgetRefused):  # waits in the dpf-n queue: a demands row
        ledger.request("p", "q", blocks=["c0", "c1"], epsilon=0.5)


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """(folder holding ledger.db, its key file and head file; a copy of the database from before the last grants)."""
    folder = tmp_path_factory.mktemp("honest")
    path = str(folder / "ledger.db")
    with Ledger.open(path, create=True) as ledger:
        _fill(ledger)
    old = str(tmp_path_factory.mktemp("old") / "old.db")
    backup(path, old)
    with Ledger.open(path) as ledger:
        _fill_more(ledger)
        report = ledger.audit()
        assert report.ok, report.problems
    return folder, old


def _changed(value):
    """A different value of the same kind: a number moved, a text or JSON value altered in its first field."""
    if value is None:
        return 1
    if isinstance(value, (int, float)):
        return value + 1 if isinstance(value, int) else value + 0.5
    try:
        decoded = json.loads(value)
    except ValueError:
        return value + "x"
    return json.dumps(_changed_json(decoded), separators=(",", ":"), sort_keys=True)


def _changed_json(value):
    if isinstance(value, bool) or value is None:
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [_changed_json(value[0])] + value[1:] if value else [0]
    if not value:
        return {"x": 1}
    first = sorted(value)[0]
    return dict(value, **{first: _changed_json(value[first])})


def _edited_columns(table, columns, n, count):
    """The columns edited in row ``n`` of ``count``: all in each table's first row and the log's last; the kind and
    body of every log entry."""
    if n == 0 or (table == "log" and n == count - 1):
        return columns
    return ["kind", "body"] if table == "log" else []


def _table_cases(conn, table, keys):
    """(case id, [(statement, params)], (table, column) or None) for one table."""
    columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    rows = conn.execute(f"SELECT rowid, * FROM {table} ORDER BY rowid").fetchall()
    last_seq = conn.execute("SELECT max(seq) FROM log").fetchone()[0]
    cases = []
    for n, (rowid, *values) in enumerate(rows):
        row = dict(zip(columns, values))
        name = f"{table}[{','.join(str(row[k]) for k in keys)}]"
        for column in _edited_columns(table, columns, n, len(rows)):
            new = last_seq + 1 if (table, column) == ("log", "seq") else _changed(row[column])
            cases.append(
                (
                    f"edit {name}.{column}",
                    [(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (new, rowid))],
                    (table, column),
                )
            )
        cases.append((f"delete {name}", [(f"DELETE FROM {table} WHERE rowid = ?", (rowid,))], None))
        copy = dict(row, **({"seq": last_seq + 1} if table == "log" else {k: _changed(row[k]) for k in keys}))
        insert = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        cases.append((f"insert a copy of {name}", [(insert, tuple(copy[c] for c in columns))], None))
    others = [c for c in columns if c not in keys]
    pairs = list(zip(rows, rows[1:]))
    for (id_a, *a), (id_b, *b) in pairs if table == "log" else pairs[:1]:
        a, b = dict(zip(columns, a)), dict(zip(columns, b))
        if all(a[c] == b[c] for c in others):
            continue
        sets = ", ".join(f"{c} = ?" for c in others)
        cases.append(
            (
                f"swap {table} rows {id_a} and {id_b}",
                [
                    (f"UPDATE {table} SET {sets} WHERE rowid = ?", tuple(b[c] for c in others) + (id_a,)),
                    (f"UPDATE {table} SET {sets} WHERE rowid = ?", tuple(a[c] for c in others) + (id_b,)),
                ],
                None,
            )
        )
    return cases


def _sql(path, statements):
    conn = sqlite3.connect(path)
    try:
        for statement, params in statements:
            conn.execute(statement, params)
        conn.commit()
    finally:
        conn.close()


def _cut_last_grant(path):
    """The last grant cut as a careful writer would: its log tail, its rows, its charge on its block."""
    conn = sqlite3.connect(path)
    try:
        seq, body = conn.execute("SELECT seq, body FROM log WHERE kind = 'grant' ORDER BY seq DESC LIMIT 1").fetchone()
        grant = json.loads(body)
        conn.execute("DELETE FROM log WHERE seq >= ?", (seq,))
        for table, column in (("grants", "id"), ("releases", "grant_id"), ("outcomes", "grant_id")):
            conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (grant["id"],))
        conn.execute("DELETE FROM draws WHERE lifetime_grant = ? OR run_grant = ?", (grant["id"], grant["id"]))
        conn.execute(
            "UPDATE blocks SET spent = '[0.0, 0.0]', state = 'active' WHERE stream = ? AND id IN "
            f"({', '.join('?' * len(grant['blocks']))})",
            (grant["stream"], *grant["blocks"]),
        )
        conn.commit()
    finally:
        conn.close()


def _new_ledger_id(path):
    _sql(path, [("UPDATE meta SET value = ? WHERE key = 'ledger_id'", (secrets.token_hex(16),))])


def _scenario_cases(old):
    """The review's rollback cases, each alone and with a changed ledger_id."""

    def restored(path):
        restore(path, old)

    def head_deleted(path):
        os.unlink(path + ".key.head")

    def both(*steps):
        return lambda path: [step(path) for step in steps]

    return [
        ("change ledger_id", _new_ledger_id),
        ("restore an old copy", restored),
        ("restore an old copy and change ledger_id", both(restored, _new_ledger_id)),
        ("truncate the last grant", _cut_last_grant),
        ("truncate the last grant and change ledger_id", both(_cut_last_grant, _new_ledger_id)),
        ("delete the head file", head_deleted),
        ("delete the head file and restore an old copy", both(head_deleted, restored)),
    ]


def _caught(path, at_open=True):
    """How the case was caught: 'open' (Ledger.open refused), 'audit' (the audit named a problem or could not
    open the database), both, or ''. A traceback (any other exception) fails the test."""
    how = []
    try:
        if at_open:
            Ledger.open(path).close()
    except LedgerError:
        how.append("open")
    try:
        with Ledger.open(path, check_head=False) as ledger:  # what `sage ledger audit` opens
            if not ledger.audit().ok:
                how.append("audit")
    except LedgerError:  # not even opened for an audit (`sage ledger audit` exits 2, naming it)
        how.append("audit")
    return "+".join(how)


def _run(honest, tmp_path, name, tamper, at_open=True):
    """Tamper with a fresh copy of the honest ledger's folder; how it was caught. Without ``at_open`` only the
    database is copied anew while the other files are as in the honest folder (an open of a database tampered into
    an older schema migrates it, writing the key file)."""
    folder, _ = honest
    case = tmp_path / "case"
    kept = ("ledger.db.key", "ledger.db.key.head")
    if at_open or not all(case.exists() and (case / f).read_bytes() == (folder / f).read_bytes() for f in kept):
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(folder, case)
    else:
        for stale in ("ledger.db-wal", "ledger.db-shm"):
            (case / stale).unlink(missing_ok=True)
        shutil.copyfile(folder / "ledger.db", case / "ledger.db")
    path = str(case / "ledger.db")
    tamper(path)
    try:
        return _caught(path, at_open)
    except Exception as exc:  # a traceback is a failure of its own, named with its case
        raise AssertionError(f"{name}: {type(exc).__name__}: {exc}") from exc


def test_every_database_only_tamper_case_is_caught(honest, tmp_path):
    folder, old = honest
    conn = sqlite3.connect(str(folder / "ledger.db"))
    try:
        table_cases = [c for table, keys in PRIMARY_KEYS.items() for c in _table_cases(conn, table, keys)]
    finally:
        conn.close()
    results, unbound, times = {}, [], []
    for name, statements, column in table_cases:
        # the audit alone (fast): a database writer is refused at open only where the head file shows it
        results[name] = _run(honest, tmp_path, name, lambda path, s=statements: _sql(path, s), at_open=False)
        if column in UNBOUND:
            unbound.append(name)
        if column in DISPLAY_TIMES:
            times.append((column, name))
    for name, tamper in _scenario_cases(old):
        results[name] = _run(honest, tmp_path, name, tamper)
    missed = sorted(name for name, how in results.items() if not how)
    print(
        f"\ntamper catalogue: {len(results)} cases, {len(results) - len(missed)} caught; "
        f"{len(unbound)} edits of unbound display timestamps, {sum(1 for n in unbound if results[n])} of them caught"
    )
    assert set(missed) <= set(unbound), [m for m in missed if m not in unbound]
    assert {column for column, _ in times} == DISPLAY_TIMES  # each display time is edited, and caught above
    assert all(results[name] for _, name in times), [name for _, name in times if not results[name]]
    assert len(results) - len(unbound) > 250  # the catalogue was generated, not empty
    for name, _ in _scenario_cases(old):  # the rollbacks are refused before any write, not only reported
        assert "open" in results[name] and "audit" in results[name], (name, results[name])


def test_sage_ledger_audit_names_each_rollback_case(honest, tmp_path, capsys):
    """The CLI on the review's rollback cases: exit 1 (`audit FAILED`), no traceback, nothing written."""
    folder, old = honest
    for name, tamper in _scenario_cases(old):
        case = tmp_path / name.replace(" ", "-")
        shutil.copytree(folder, case)
        path = str(case / "ledger.db")
        tamper(path)
        before = {f: (case / f).read_bytes() for f in sorted(os.listdir(case))}
        assert main(["ledger", "audit", "--db", path]) == 1, name
        assert "audit FAILED" in capsys.readouterr().out, name
        assert {f: (case / f).read_bytes() for f in sorted(os.listdir(case))} == before, name


@pytest.mark.parametrize(
    "statement, named",
    [
        ("UPDATE streams SET created = created - 86400 WHERE name = 's'", "streams.created of s: the table says"),
        ("UPDATE pipelines SET finished = NULL WHERE name = 'r'", "pipelines.finished of s/r"),
        ("UPDATE blocks SET retired = 0 WHERE id = 'b0'", "blocks.retired of s/b0"),
        ("UPDATE releases SET created = 0", "releases.created of"),
        ("UPDATE log SET ts = ts - 3600 WHERE kind = 'trusted_read'", "keyed hash chain broken"),
    ],
)
def test_an_edited_display_time_is_named_by_the_audit(honest, tmp_path, statement, named):
    """A writer of the database alone backdates a display time (a stream's creation, a pipeline's end, a block's
    retirement, a release, a trusted read's time): the audit names the row and column, or the broken chain."""
    folder, _ = honest
    shutil.copytree(folder, tmp_path / "case")
    path = str(tmp_path / "case" / "ledger.db")
    _sql(path, [(statement, ())])
    with Ledger.open(path, check_head=False) as ledger:
        problems = ledger.audit().problems
    assert any(named in p for p in problems), problems
