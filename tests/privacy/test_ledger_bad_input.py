"""Bad input to the ledger: a clear error that names the bad value, exit 2 on the CLI, and an UNCHANGED ledger.

"Unchanged" is checked on a full dump of every table (and, for broken files, of the
file's bytes and its directory) taken before and after each bad input.
"""

import concurrent.futures
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys

import pytest

from sage_tfx.privacy import Ledger, LedgerError
from sage_tfx.privacy import store as ledger_store
from tests.conftest import raw_connection, run_sql

DAY = 86400.0


def sage(*args):
    return subprocess.run(
        [sys.executable, "-m", "sage_tfx", "ledger", *args], capture_output=True, text=True, timeout=120
    )


def sage_each(actions, location):
    """Run several `sage ledger` actions on one location at once (they all fail; saves wall time)."""
    with concurrent.futures.ThreadPoolExecutor(len(actions)) as pool:
        return list(pool.map(lambda action: (action, sage(*with_db(action, location))), actions))


def is_postgres(location):
    return str(location).startswith("postgresql://")


def sage_cli(args, location):
    """``sage ledger ACTION --db location ARGS...`` -> (exit code, stdout, stderr).

    SQLite: a real `sage` process. PostgreSQL: the same CLI entry point in this process
    (the process boundary is already covered on SQLite; this saves a Python start per case).
    """
    argv = [args[0], "--db", location, *args[1:]]
    if not is_postgres(location):
        out = sage(*argv)
        return out.returncode, out.stdout, out.stderr
    from sage_tfx.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            rc = main(["ledger", *argv])
        except SystemExit as exc:  # argparse rejects bad arguments with exit 2
            rc = exc.code
    return rc, stdout.getvalue(), stderr.getvalue()


def dump(location):
    """Every table's rows (sorted), and the set of tables, of a ledger on either backend."""
    if not is_postgres(location):
        assert os.path.exists(location)
    conn = raw_connection(location)
    try:
        if is_postgres(location):
            sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        else:
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        tables = sorted(t for (t,) in run_sql(location, sql, conn=conn))
        return {t: sorted(map(repr, run_sql(location, f'SELECT * FROM "{t}"', conn=conn))) for t in tables}
    finally:
        conn.close()


def state(location):
    """``dump`` and, for SQLite, the bytes of every file beside the ledger (database, key file, head file; the
    WAL's shared-memory index, which readers write, left out): a refused input changes none of them."""
    tables = dump(location)
    if is_postgres(location):
        return tables
    folder = os.path.dirname(location)
    return tables, {
        name: open(os.path.join(folder, name), "rb").read()
        for name in sorted(os.listdir(folder))
        if not name.endswith("-shm") and os.path.isfile(os.path.join(folder, name))
    }


def populate(location):
    """Stream s (basic) and r (rdp); window blocks b0, b1; shard block bshard; retired block bret;
    pipelines p1 (waiting) and pdone (finished); one grant with a recorded outcome."""
    ledger = Ledger.open(location, create=True)
    ledger.create_stream("s", 1.0, 1e-5)
    ledger.create_stream("r", 1.0, 1e-5, accounting="rdp")
    ledger.register("s", "p1")
    ledger.register("s", "pdone")
    ledger.add_block("s", "b0", start=0, end=DAY, rows=100)
    ledger.add_block("s", "b1", start=DAY, end=2 * DAY, rows=100)
    ledger.finish("s", "pdone", "ACCEPT")
    ledger.add_block("s", "bshard", shard=7, rows=100)
    ledger.add_block("s", "bret", start=2 * DAY, end=3 * DAY, rows=100)
    ledger.add_block("r", "r0", start=0, end=DAY)
    grant = ledger.request("p1", "s", blocks=["b0"], epsilon=0.25)
    ledger.record_outcome(grant.id, "RETRY")
    ledger.request("p1", "s", blocks=["bret"], epsilon=1.0)
    assert ledger.block("s", "bret").state == "retired"
    ledger.close()
    return grant.id


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def populated(request, tmp_path_factory):
    """One populated ledger per backend, shared by the module: bad input must never change it."""
    if request.param == "sqlite":
        location = str(tmp_path_factory.mktemp("bad-input") / "ledger.db")
        grant_id = populate(location)
        yield location, grant_id
        return
    with pytest.MonkeyPatch.context() as mp:  # a PostgreSQL ledger's key file (docs/security.md)
        mp.setenv("SAGE_KEY_FILE", str(tmp_path_factory.mktemp("bad-input-pg") / "ledger.key"))
        location = request.getfixturevalue("postgres_server").new_database("bad")
        grant_id = populate(location)
        yield location, grant_id


CHARGE = ["charge", "--stream", "s", "--pipeline", "p1", "--blocks", "b0,b1"]
INIT = ["init", "--stream", "s2", "--epsilon", "1", "--delta", "1e-6"]
ADD = ["add-block", "--stream", "s", "--block", "b9"]

# (case id, `sage ledger` arguments after the action's --db, substrings the error must contain)
CLI_CASES = [
    # epsilon: negative, zero, NaN, +-inf, not a number
    (
        "charge-split-above-charge",
        CHARGE + ["--epsilon=0.1", "--split", "preprocessing=5,training=5,validation=5"],
        ["composes to epsilon 15", "charges (0.1)"],
    ),
    ("charge-split-unknown-stage", CHARGE + ["--epsilon=0.1", "--split", "trainng=0.1"], ["'trainng'"]),
    ("charge-split-bad-number", CHARGE + ["--epsilon=0.1", "--split", "training=x"], ["'x'"]),
    ("charge-split-bad-rule", CHARGE + ["--epsilon=0.1", "--split", "training=0.1,rule=max"], ["'max'"]),
    ("charge-eps-negative", CHARGE + ["--epsilon=-1"], ["epsilon -1.0", "> 0"]),
    ("charge-eps-zero", CHARGE + ["--epsilon=0"], ["epsilon 0.0", "> 0"]),
    ("charge-eps-nan", CHARGE + ["--epsilon=nan"], ["epsilon nan", "finite"]),
    ("charge-eps-inf", CHARGE + ["--epsilon=inf"], ["epsilon inf", "finite"]),
    ("charge-eps-minus-inf", CHARGE + ["--epsilon=-inf"], ["epsilon -inf"]),
    ("charge-eps-text", CHARGE + ["--epsilon=lots"], ["'lots' is not a number"]),
    # delta: >= 1, negative, NaN
    ("charge-delta-one", CHARGE + ["--epsilon=0.1", "--delta=1"], ["delta 1.0", "delta < 1"]),
    ("charge-delta-above-one", CHARGE + ["--epsilon=0.1", "--delta=1.5"], ["delta 1.5"]),
    ("charge-delta-negative", CHARGE + ["--epsilon=0.1", "--delta=-1e-09"], ["delta -1e-09"]),
    ("charge-delta-nan", CHARGE + ["--epsilon=0.1", "--delta=nan"], ["delta nan"]),
    # blocks: unknown, retired, duplicate, empty
    (
        "charge-unknown-block",
        ["charge", "--stream", "s", "--pipeline", "p1", "--blocks", "nope", "--epsilon=0.1"],
        ["unknown block", "nope"],
    ),
    (
        "charge-unknown-among-known",
        ["charge", "--stream", "s", "--pipeline", "p1", "--blocks", "b0,b1,ghost", "--epsilon=0.1"],
        ["ghost"],
    ),
    (
        "charge-retired-block",
        ["charge", "--stream", "s", "--pipeline", "p1", "--blocks", "b0,bret", "--epsilon=0.1"],
        ["bret", "retired"],
    ),
    (
        "charge-duplicate-block",
        ["charge", "--stream", "s", "--pipeline", "p1", "--blocks", "b0,b1,b0", "--epsilon=0.1"],
        ["more than once", "b0"],
    ),
    (
        "charge-empty-block-set",
        ["charge", "--stream", "s", "--pipeline", "p1", "--blocks", "", "--epsilon=0.1"],
        ["block set is empty"],
    ),
    (
        "charge-only-commas",
        ["charge", "--stream", "s", "--pipeline", "p1", "--blocks", ",,", "--epsilon=0.1"],
        ["block set is empty"],
    ),
    # streams and pipelines
    (
        "charge-unknown-stream",
        ["charge", "--stream", "nosuch", "--pipeline", "p1", "--blocks", "b0", "--epsilon=0.1"],
        ["stream 'nosuch' does not exist"],
    ),
    (
        "charge-bad-pipeline-name",
        ["charge", "--stream", "s", "--pipeline", "bad name!", "--blocks", "b0", "--epsilon=0.1"],
        ["'bad name!'"],
    ),
    (
        "charge-finished-pipeline",
        ["charge", "--stream", "s", "--pipeline", "pdone", "--blocks", "b0", "--epsilon=0.1"],
        ["pdone", "already finished"],
    ),
    (
        "init-duplicate-stream",
        ["init", "--stream", "s", "--epsilon", "1", "--delta", "1e-6"],
        ["stream 's' already exists"],
    ),
    ("init-eps-zero", ["init", "--stream", "s2", "--epsilon=0", "--delta", "1e-6"], ["epsilon 0.0"]),
    ("init-eps-nan", ["init", "--stream", "s2", "--epsilon=nan", "--delta", "1e-6"], ["epsilon nan"]),
    ("init-eps-negative", ["init", "--stream", "s2", "--epsilon=-2", "--delta", "1e-6"], ["epsilon -2.0"]),
    ("init-eps-inf", ["init", "--stream", "s2", "--epsilon=inf", "--delta", "1e-6"], ["epsilon inf"]),
    ("init-delta-one", ["init", "--stream", "s2", "--epsilon", "1", "--delta=1"], ["delta 1.0"]),
    ("init-delta-negative", ["init", "--stream", "s2", "--epsilon", "1", "--delta=-0.1"], ["delta -0.1"]),
    (
        "init-bad-stream-name",
        ["init", "--stream", "white space", "--epsilon", "1", "--delta", "1e-6"],
        ["'white space'"],
    ),
    ("init-min-eps-above-eps", INIT + ["--min-epsilon=2"], ["min_epsilon 2.0"]),
    ("init-min-eps-nan", INIT + ["--min-epsilon=nan"], ["min_epsilon nan"]),
    (
        "init-rdp-zero-delta",
        ["init", "--stream", "s2", "--epsilon", "1", "--delta=0", "--accounting", "rdp"],
        ["delta 0.0", "0 < delta"],
    ),
    ("init-unknown-accounting", INIT + ["--accounting", "fancy"], ["'fancy'"]),
    ("init-unknown-policy", INIT + ["--policy", "greedy"], ["'greedy'"]),
    # limits: a stream epsilon above the maximum (default 10), a grant below the stream's min_epsilon
    (
        "init-eps-above-max",
        ["init", "--stream", "s2", "--epsilon=1e308", "--delta", "1e-6"],
        ["stream epsilon 1e+308", "maximum 10", "--max-epsilon"],
    ),
    (
        "init-eps-above-raised-max",
        INIT[:3] + ["--epsilon=50", "--delta", "1e-6", "--max-epsilon=20"],
        ["stream epsilon 50.0", "maximum 20"],
    ),
    ("init-max-eps-nan", INIT + ["--max-epsilon=nan"], ["max_epsilon nan"]),
    (
        "charge-eps-below-minimum",
        CHARGE + ["--epsilon=1e-300"],
        ["epsilon 1e-300", "minimum grant epsilon 0.001", "epsilon >= 0.001", "--min-grant-epsilon"],
    ),
    ("charge-eps-just-below-minimum", CHARGE + ["--epsilon=0.000999"], ["epsilon 0.000999", "minimum"]),
    ("init-min-grant-eps-zero", INIT + ["--min-grant-epsilon=0"], ["min_grant_epsilon 0.0"]),
    # blocks: duplicate id, overlapping windows, bad orders, bad keys
    (
        "add-duplicate-block",
        ["add-block", "--stream", "s", "--block", "b0", "--start=864000", "--end=950400"],
        ["block 'b0' already exists"],
    ),
    ("add-overlapping-window", ADD + ["--start=43200", "--end=129600"], ["overlaps", "b0", "43200"]),
    ("add-window-inside-another", ADD + ["--start=90000", "--end=100000"], ["overlaps", "b1"]),
    ("add-window-end-before-start", ADD + ["--start=900000", "--end=800000"], ["900000", "800000", "before"]),
    ("add-empty-window", ADD + ["--start=900000", "--end=900000"], ["900000", "before"]),
    ("add-start-without-end", ADD + ["--start=900000"], ["start=900000.0", "end=None"]),
    ("add-window-and-shard", ADD + ["--start=900000", "--end=990000", "--shard", "3"], ["not both"]),
    ("add-negative-shard", ADD + ["--shard=-1"], ["shard -1"]),
    ("add-duplicate-shard", ADD + ["--shard", "7"], ["shard 7", "bshard"]),
    ("add-negative-rows", ADD + ["--rows=-5", "--shard", "8"], ["rows -5"]),
    ("add-bad-block-id", ["add-block", "--stream", "s", "--block", "../etc/passwd"], ["'../etc/passwd'"]),
    ("add-bad-time", ADD + ["--start", "yesterday", "--end", "today"], ["'yesterday'"]),
    ("add-nan-time", ADD + ["--start=nan", "--end=900000"], ["start nan"]),
    # a window no date names: `sage ledger status` crashed for good on it once registered
    ("add-end-1e300", ADD + ["--start=900000", "--end=1e300"], ["window [900000, 1e+300)", "10000-01-01"]),
    ("add-start-before-year-1", ADD + ["--start=-1e12", "--end=900000"], ["window [-1e+12, 900000)", "0001-01-01"]),
    ("add-unknown-stream", ["add-block", "--stream", "nosuch", "--block", "b9"], ["'nosuch'"]),
    # other actions
    ("status-unknown-stream", ["status", "--stream", "nosuch", "--json"], ["'nosuch'"]),
    ("register-unknown-stream", ["register", "--stream", "nosuch", "--pipeline", "p9"], ["'nosuch'"]),
    ("register-finished-pipeline", ["register", "--stream", "s", "--pipeline", "pdone"], ["pdone"]),
    ("finish-unregistered", ["finish", "--stream", "s", "--pipeline", "ghost", "--outcome", "ACCEPT"], ["'ghost'"]),
    ("finish-twice", ["finish", "--stream", "s", "--pipeline", "pdone", "--outcome", "REJECT"], ["'pdone'"]),
    ("finish-bad-outcome", ["finish", "--stream", "s", "--pipeline", "p1", "--outcome", "MAYBE"], ["'MAYBE'"]),
]


def with_db(args, location):
    return [args[0], "--db", location, *args[1:]]


@pytest.mark.parametrize("case, args, expected", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input_exits_2_names_the_value_and_changes_nothing(populated, case, args, expected):
    location, _ = populated
    before = state(location)
    rc, stdout, stderr = sage_cli(args, location)
    assert rc == 2, (case, rc, stdout, stderr)
    for text in expected:
        assert text in stderr, (case, text, stderr)
    assert "Traceback" not in stderr
    assert stdout == ""
    assert state(location) == before


def test_cli_plot_of_unknown_stream_writes_nothing(populated, tmp_path):
    location, _ = populated
    before = dump(location)
    out = sage("plot", "--db", location, "--stream", "nosuch", "--out", str(tmp_path / "x.png"))
    assert out.returncode == 2 and "'nosuch'" in out.stderr, out.stderr
    assert not (tmp_path / "x.png").exists()
    assert dump(location) == before


# --------------------------------------------------------------------------- API
def _rdp_curve_of(n):
    return [0.01] * n


API_CASES = [
    (
        "window-reversed",
        lambda l, g: l.request("p1", "s", window=(2 * DAY, 0), epsilon=0.1),
        ["window [172800.0, 0.0) is empty"],
    ),
    ("window-nan", lambda l, g: l.request("p1", "s", window=(0, math.nan), epsilon=0.1), ["window end nan"]),
    ("window-not-a-pair", lambda l, g: l.request("p1", "s", window=5, epsilon=0.1), ["window 5"]),
    (
        "window-without-blocks",
        lambda l, g: l.request("p1", "s", window=(10 * DAY, 11 * DAY), epsilon=0.1),
        ["holds no active blocks"],
    ),
    (
        "blocks-and-window",
        lambda l, g: l.request("p1", "s", blocks=["b0"], window=(0, DAY), epsilon=0.1),
        ["either blocks or window"],
    ),
    ("no-epsilon", lambda l, g: l.request("p1", "s", blocks=["b0"]), ["give epsilon"]),
    ("epsilon-text", lambda l, g: l.request("p1", "s", blocks=["b0"], epsilon="abc"), ["'abc' is not a number"]),
    ("epsilon-none-list", lambda l, g: l.request("p1", "s", blocks=[], epsilon=0.1), ["block set is empty"]),
    ("curve-wrong-length", lambda l, g: l.request("p1", "r", blocks=["r0"], curve=_rdp_curve_of(3)), ["has 3 values"]),
    ("curve-negative", lambda l, g: l.request("p1", "r", blocks=["r0"], curve=[-0.5] + _rdp_curve_of(11)), ["-0.5"]),
    ("curve-nan", lambda l, g: l.request("p1", "r", blocks=["r0"], curve=[math.nan] * 12), ["nan"]),
    ("curve-missing-order", lambda l, g: l.request("p1", "r", blocks=["r0"], curve={2.0: 0.1}), ["lacks"]),
    (
        "curve-on-basic-without-delta",
        lambda l, g: l.request("p1", "s", blocks=["b0"], curve=_rdp_curve_of(12)),
        ["needs delta > 0"],
    ),
    (
        "rdp-orders-too-small",
        lambda l, g: l.create_stream("s3", 1.0, 1e-6, accounting="rdp", orders=[1.0, 2.0]),
        ["order 1.0"],
    ),
    (
        "rdp-orders-duplicate",
        lambda l, g: l.create_stream("s3", 1.0, 1e-6, accounting="rdp", orders=[2, 2]),
        ["duplicates"],
    ),
    ("rdp-no-budget", lambda l, g: l.create_stream("s3", 1e-6, 1e-12, accounting="rdp"), ["no RDP budget"]),
    ("stream-bad-accounting", lambda l, g: l.create_stream("s3", 1.0, 1e-6, accounting="zcdp"), ["'zcdp'"]),
    ("stream-name-not-str", lambda l, g: l.create_stream(42, 1.0, 1e-6), ["42"]),
    ("block-shard-bool", lambda l, g: l.add_block("s", "b9", shard=True), ["shard True"]),
    ("block-rows-float", lambda l, g: l.add_block("s", "b9", shard=9, rows=1.5), ["rows 1.5"]),
    ("block-start-inf", lambda l, g: l.add_block("s", "b9", start=math.inf, end=math.inf), ["start inf"]),
    ("block-id-too-long", lambda l, g: l.add_block("s", "b" * 200), ["'" + "b" * 200 + "'"]),
    ("add-blocks-names-not-dicts", lambda l, g: l.add_blocks("s", ["b8", "b9"]), ["block 'b8' is not a dict"]),
    ("add-blocks-a-string", lambda l, g: l.add_blocks("s", "b9"), ["block 'b9' is not a dict"]),
    (
        "rdp-grant-below-minimum",
        lambda l, g: l.request("p1", "r", blocks=["r0"], epsilon=1e-300, delta=1e-7),
        ["epsilon 1e-300", "minimum grant epsilon 0.001"],
    ),
    (
        "rdp-curve-below-minimum",
        lambda l, g: l.request("p1", "r", blocks=["r0"], curve=[1e-12] * 12),
        ["RDP curve below", "minimum grant epsilon 0.001"],
    ),
    ("stream-eps-above-max", lambda l, g: l.create_stream("s3", 1e308, 1e-6), ["stream epsilon 1e+308", "maximum 10"]),
    (
        "stream-eps-above-given-max",
        lambda l, g: l.create_stream("s3", 11.0, 1e-6, max_epsilon=10.5),
        ["stream epsilon 11.0", "maximum 10.5"],
    ),
    ("outcome-unknown-grant", lambda l, g: l.record_outcome("g-nope", "ACCEPT"), ["'g-nope'"]),
    ("outcome-twice", lambda l, g: l.record_outcome(g, "ACCEPT"), ["already has an outcome", "g-"]),
    ("finish-outcome-unknown", lambda l, g: l.finish("s", "p1", "RETRY"), ["'RETRY'"]),
    ("blocks-bad-state", lambda l, g: l.blocks("s", state="zombie"), ["'zombie'"]),
    (
        "verify-altered-grant",
        lambda l, g: l.verify(dict(json.loads(l.get_grant(g).to_json()), epsilon=1.0)),
        ["forged"],
    ),
]


@pytest.mark.parametrize("case, call, expected", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input_raises_a_named_error_and_changes_nothing(populated, case, call, expected):
    location, grant_id = populated
    before = state(location)
    with Ledger.open(location) as ledger:
        with pytest.raises(LedgerError) as err:
            call(ledger, grant_id)
    assert isinstance(err.value, ValueError)
    for text in expected:
        assert text in str(err.value), (case, text, str(err.value))
    assert state(location) == before


@pytest.mark.parametrize("location", [None, "", 42])
def test_api_bad_location(location):
    with pytest.raises(LedgerError, match=f"location {location!r} is invalid"):
        Ledger.open(location)


# --------------------------------------------------------------------------- broken files (SQLite)
# Every action opens the ledger the same way (Ledger.open); charge and audit open an existing
# ledger, init may create one.
ACTIONS = [
    ["charge", "--stream", "s", "--pipeline", "p1", "--blocks", "b0", "--epsilon=0.1"],
    ["audit"],
    ["init", "--stream", "s9", "--epsilon", "1", "--delta", "1e-6"],
]
OPENING_ACTIONS = ACTIONS[:2]


def files_of(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def assert_every_action_refuses(path, expected):
    before = files_of(path.parent)
    for action, out in sage_each(ACTIONS, str(path)):
        assert out.returncode == 2, (action, out.stdout, out.stderr)
        assert str(path) in out.stderr, out.stderr
        for text in expected:
            assert text in out.stderr, (action, text, out.stderr)
        assert "Traceback" not in out.stderr
    assert files_of(path.parent) == before  # same bytes, and no -wal/-shm or other file appeared


def real_ledger(path, blocks=40):
    ledger = Ledger.open(path, create=True)
    ledger.create_stream("s", 1.0, 1e-6)
    for i in range(blocks):
        ledger.add_block("s", f"b{i}", start=i * DAY, end=(i + 1) * DAY)
        ledger.request("p1", "s", blocks=[f"b{i}"], epsilon=0.125)
    ledger.close()  # the last connection checkpoints the WAL into the file
    return path


def test_corrupt_database_file(tmp_path):
    path = tmp_path / "ledger.db"
    path.write_bytes(os.urandom(64 * 1024))
    assert_every_action_refuses(path, ["not a sage ledger"])


def test_truncated_database_file(tmp_path):
    path = real_ledger(tmp_path / "ledger.db")
    data = path.read_bytes()
    assert len(data) >= 8192 and not os.path.exists(str(path) + "-wal")
    path.write_bytes(data[: len(data) // 2])
    assert_every_action_refuses(path, ["corrupt"])


def test_database_truncated_inside_its_header(tmp_path):
    path = real_ledger(tmp_path / "ledger.db", blocks=1)
    path.write_bytes(path.read_bytes()[:50])
    assert_every_action_refuses(path, ["truncated"])


def test_empty_file_is_not_silently_turned_into_a_ledger(tmp_path):
    path = tmp_path / "ledger.db"
    path.write_bytes(b"")
    before = files_of(tmp_path)
    for action, out in sage_each(OPENING_ACTIONS, str(path)):
        assert out.returncode == 2, (action, out.stdout, out.stderr)
        assert str(path) in out.stderr and "empty" in out.stderr, out.stderr
    assert files_of(tmp_path) == before


def test_sqlite_database_of_another_application(tmp_path):
    path = tmp_path / "other.db"
    run_sql(str(path), "CREATE TABLE recipes (name TEXT)")
    run_sql(str(path), "INSERT INTO recipes VALUES ('soup')")
    assert_every_action_refuses(path, ["not a sage ledger"])


def test_directory_as_ledger(tmp_path):
    path = tmp_path / "adir"
    path.mkdir()
    for _action, out in sage_each(ACTIONS, str(path)):
        assert out.returncode == 2 and str(path) in out.stderr and "directory" in out.stderr, out.stderr
    assert os.listdir(path) == []


def test_missing_ledger_is_not_created_by_other_actions(tmp_path):
    path = tmp_path / "nothing-here.db"
    for _action, out in sage_each(OPENING_ACTIONS, str(path)):
        assert out.returncode == 2 and "no ledger at" in out.stderr and str(path) in out.stderr, out.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("where", ["proc", "under-a-file"])
def test_read_only_path(tmp_path, monkeypatch, where):
    """As root, permissions do not stop writes: use places no one can create files in. The key file is the
    default ``<db>.key`` (a SAGE_KEY_FILE left by another test's fixture must not decide which check speaks):
    under a plain file its folder is missing, so the key file is refused first, before any ledger exists."""
    monkeypatch.delenv("SAGE_KEY_FILE", raising=False)
    if where == "proc":
        path = "/proc/sage-ledger-test.db"
        refusal = "cannot create ledger"
    else:
        (tmp_path / "plain-file").write_text("not a directory")
        path = str(tmp_path / "plain-file" / "ledger.db")
        refusal = "cannot create key file " + re.escape(path + ".key")
    out = sage("init", "--db", path, "--stream", "s", "--epsilon", "1", "--delta", "1e-6")
    assert out.returncode == 2, out.stdout + out.stderr
    assert path in out.stderr and "cannot" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not os.path.exists(path)
    assert not os.path.exists(path + ".key")
    with pytest.raises(LedgerError, match=refusal):
        Ledger.open(path, create=True)


# --------------------------------------------------------------------------- schema versions (both backends)
def test_newer_schema_version_is_refused_untouched(ledger_url):
    populate(ledger_url)
    run_sql(
        ledger_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(ledger_store.SCHEMA_VERSION + 1),)
    )
    before = dump(ledger_url)
    for action, out in sage_each(ACTIONS, ledger_url):
        assert out.returncode == 2, (action, out.stdout, out.stderr)
        assert f"schema version {ledger_store.SCHEMA_VERSION + 1}" in out.stderr and "newer" in out.stderr
    with pytest.raises(LedgerError, match="newer"):
        Ledger.open(ledger_url)
    assert dump(ledger_url) == before


@pytest.mark.parametrize("version", ["banana", "0"])
def test_invalid_schema_version_is_refused_untouched(ledger_url, version):
    populate(ledger_url)
    run_sql(ledger_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
    before = dump(ledger_url)
    out = sage("status", "--db", ledger_url, "--stream", "s")
    assert out.returncode == 2 and "invalid schema version" in out.stderr and version in out.stderr, out.stderr
    assert dump(ledger_url) == before


# --------------------------------------------------------------------------- PostgreSQL locations
@pytest.mark.postgres
def test_postgres_database_without_a_ledger_is_not_created(postgres_url):
    out = sage("status", "--db", postgres_url, "--stream", "s")
    assert out.returncode == 2 and "no ledger at" in out.stderr, out.stderr
    assert dump(postgres_url) == {}


@pytest.mark.postgres
def test_postgres_unreachable_or_missing_database(postgres_server):
    for url in (postgres_server.url("no_such_database"), "postgresql://postgres@127.0.0.1:1/sage"):
        out = sage("status", "--db", url, "--stream", "s")
        assert out.returncode == 2, out.stderr
        assert "cannot connect to ledger" in out.stderr and url.split("@")[1] in out.stderr, out.stderr


def test_status_shows_a_block_window_no_date_names(tmp_path, monkeypatch):
    """A block registered before windows were bounded (here: with the bound lifted) is shown by `sage ledger
    status`, its times in seconds, instead of a crash on every later status."""
    from sage_tfx.privacy import blocks

    db = str(tmp_path / "ledger.db")
    monkeypatch.setattr(blocks, "DATE_MAX", math.inf)
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "far", start=0.0, end=1e300)
    out = sage("status", "--db", db, "--stream", "s")
    assert out.returncode == 0 and "1e+300 s" in out.stdout, out.stdout + out.stderr
