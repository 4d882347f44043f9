"""Ingest inputs refused cleanly, duplicate content across streams, and stale staging folders.

Every refusal names the file, the column and the row (or the blocks and streams), registers nothing (a
full dump of the ledger is unchanged) and leaves nothing in the data root: no block, no _staging tree.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from sage_tfx.ingest import layout, staging
from sage_tfx.ingest.pipeline import ingest
from sage_tfx.ingest.records import InputError
from sage_tfx.privacy import Ledger
from tests.privacy.test_ledger_bad_input import dump

T0 = 1600000000  # 2020-09-13T12:26:40Z


@pytest.fixture
def env(tmp_path):
    db = str(tmp_path / "ledger.db")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.create_stream("other", 1.0, 1e-6)
    return dict(db=db, data=str(tmp_path / "data"), tmp=tmp_path)


def _csv(env, name, text):
    path = env["tmp"] / name
    path.write_text(text)
    return str(path)


def _ingest(env, path, stream="s", **kw):
    return ingest(env["db"], stream, path, env["data"], time_column="t", window="1d", progress=False, **kw)


GOOD = f"t,x,s\n{T0},1,a\n{T0 + 1},2,b\n{T0 + 2},3,c\n"
BAD_INPUTS = [
    (
        "duplicate-header",
        f"t,x,x\n{T0},1,2\n{T0 + 1},3,4\n",
        ["column 'x' appears twice in the header (columns 2 and 3)", "rename or remove one"],
    ),
    (
        "unclosed-quote",
        f't,x,s\n{T0},1,ok\n{T0 + 1},2,"abc\n{T0 + 2},3,def\n{T0 + 3},4,ghi\n',
        ["column 's', row 2 (line 3)", "never closes", "would merge"],
    ),
    ("unclosed-quote-last-line", f't,x,s\n{T0},1,ok\n{T0 + 1},2,"abc', ["column 's', row 2 (line 3)", "never closes"]),
    ("inf-in-float", f"t,x\n{T0},1.5\n{T0 + 1},inf\n", ["column 'x', row 2: value inf is not finite", "empty"]),
    ("minus-inf-in-int", f"t,x\n{T0},1\n{T0 + 1},2\n{T0 + 2},-inf\n", ["column 'x', row 3: value -inf"]),
    ("minus-inf-in-time", f"t,x\n{T0}.5,1\n-inf,2\n", ["column 't', row 2: value -inf is not finite"]),
    (
        "time-in-milliseconds",
        f"t,x\n{T0},1\n{T0 * 1000},2\n",
        [f"column 't', row 2: value {T0 * 1000}", "outside [1000-01-01, 9000-01-01)", "milliseconds"],
    ),
    (
        "time-in-the-year-100",
        "t,x\n2020-01-01T00:00:00,1\n0100-01-01T00:00:00,2\n",
        ["column 't', row 2", "outside [1000-01-01, 9000-01-01)"],
    ),
]


@pytest.mark.parametrize("case, text, expected", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_refused_naming_file_column_row_and_leaves_nothing(env, case, text, expected):
    path = _csv(env, f"{case}.csv", text)
    before = dump(env["db"])
    with pytest.raises(InputError) as err:
        _ingest(env, path)
    message = str(err.value)
    assert path in message, message
    for text in expected:
        assert text in message, (text, message)
    assert dump(env["db"]) == before
    assert not os.path.exists(env["data"])  # not even an empty _staging tree


def test_nan_in_a_parquet_float_column_is_refused(env):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(env["tmp"] / "nan.parquet")  # a CSV "nan" is an empty field; Parquet stores a real NaN
    pq.write_table(pa.table({"t": [T0, T0 + 1], "x": [1.5, float("nan")]}), path)
    before = dump(env["db"])
    with pytest.raises(InputError, match=f"input {path}: column 'x', row 2: value nan is not finite"):
        _ingest(env, path)
    assert dump(env["db"]) == before and not os.path.exists(env["data"])


def test_refusal_in_an_existing_stream_folder_leaves_it_as_it_was(env):
    _ingest(env, _csv(env, "good.csv", GOOD))
    root = os.path.join(env["data"], "s")
    listing = sorted(os.listdir(root)), sorted(os.listdir(os.path.join(root, layout.STAGING)))
    before = dump(env["db"])
    with pytest.raises(InputError, match="not finite"):
        _ingest(env, _csv(env, "inf.csv", f"t,x,s\n{T0 + 86400},inf,a\n"))
    assert (sorted(os.listdir(root)), sorted(os.listdir(os.path.join(root, layout.STAGING)))) == listing
    assert dump(env["db"]) == before


def test_cli_names_the_row_and_exits_2(env):
    path = _csv(env, "inf.csv", f"t,x\n{T0},1.5\n{T0 + 1},inf\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "ingest",
            "--db",
            env["db"],
            "--stream",
            "s",
            "--input",
            path,
            "--data-root",
            env["data"],
            "--time-column",
            "t",
            "--window",
            "1d",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert f"input {path}: column 'x', row 2: value inf is not finite" in out.stderr
    assert "Traceback" not in out.stderr and not os.path.exists(env["data"])


def test_same_records_in_a_second_stream_are_refused_unless_allowed(env):
    path = _csv(env, "good.csv", GOOD)
    first = _ingest(env, path)
    before = dump(env["db"])
    other_dir = os.path.join(env["data"], "other")
    with pytest.raises(InputError) as err:
        _ingest(env, path, stream="other")
    message = str(err.value)
    assert "already registered as block '2020-09-13.1d' of stream 's'" in message
    assert "--allow-duplicate-of-stream s" in message
    assert dump(env["db"]) == before
    assert not os.path.exists(other_dir)
    with pytest.raises(InputError, match="of stream 's'"):  # allowing another stream does not allow 's'
        _ingest(env, path, stream="other", allow_duplicate_of=("elsewhere",))
    again = _ingest(env, path, stream="other", allow_duplicate_of=("s",))
    assert again["added"] == first["added"]
    with Ledger.open(env["db"]) as ledger:
        assert [b.id for b in ledger.blocks("other")] == first["added"]
    # Re-ingesting into the same stream is idempotent, not a duplicate.
    assert _ingest(env, path)["unchanged"] == first["added"]


def test_ledger_refuses_a_duplicate_digest_in_the_registering_transaction(ledger_url):
    """The check is also inside add_blocks' transaction (two ingests racing into two streams), on both backends."""
    from sage_tfx.privacy import DuplicateContent

    with Ledger.open(ledger_url, create=True) as ledger:
        ledger.create_stream("a", 1.0, 1e-6)
        ledger.create_stream("b", 1.0, 1e-6)
        ledger.add_blocks("a", [dict(id="d1", start=0, end=86400, rows=3, digest="00000000deadbeef")])
        ledger.add_blocks("b", [dict(id="d1", start=0, end=86400, rows=3, digest="0000000000000001")])
        before = [b.id for b in ledger.blocks("b")]
        with pytest.raises(DuplicateContent, match="'d2'.*block 'd1' of stream 'a'.*allow"):
            ledger.add_blocks("b", [dict(id="d2", start=86400, end=2 * 86400, rows=3, digest="00000000deadbeef")])
        assert [b.id for b in ledger.blocks("b")] == before
        assert ledger.digest_owners(["00000000deadbeef"], exclude_stream="b") == {"00000000deadbeef": [("a", "d1")]}
        ledger.add_blocks(
            "b",
            [dict(id="d2", start=86400, end=2 * 86400, rows=3, digest="00000000deadbeef")],
            allow_duplicate_of=("a",),
        )
        assert ledger.audit().ok


# ------------------------------------------------------------------ stale staging folders
def _hold_a_run(data_root, stream):
    """A child process that creates a staging run (locked) and waits: a live ingest, killable."""
    code = (
        "import sys, time; from sage_tfx.ingest import staging; "
        f"run = staging.new_run_dir({data_root!r}, {stream!r}); "
        "open(run + '/raw-copy.bin', 'wb').write(b'x' * 1000); print(run, flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_staging_of_killed_ingests_is_cleaned_and_live_ones_are_kept(env):
    staging_dir = os.path.join(env["data"], "s", layout.STAGING)
    killed, killed_run = _hold_a_run(env["data"], "s")
    live, live_run = _hold_a_run(env["data"], "s")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        assert os.path.isdir(killed_run) and os.path.isdir(live_run)
        # Left by an older version (no lock): kept while young, removed once an hour old.
        young, old = os.path.join(staging_dir, "0123456789abcdef"), os.path.join(staging_dir, "fedcba9876543210")
        for path in (young, old):
            os.makedirs(path)
            open(os.path.join(path, "part-0.tfrecord.gz"), "wb").close()
        hour_ago = time.time() - staging.STALE_SECONDS - 60
        os.utime(old, (hour_ago, hour_ago))
        result = _ingest(env, _csv(env, "good.csv", GOOD))
        assert result["added"] == ["2020-09-13.1d"]
        assert not os.path.exists(killed_run) and not os.path.exists(old)
        assert os.path.isdir(live_run) and os.path.isfile(os.path.join(live_run, "raw-copy.bin"))
        assert os.path.isdir(young)
    finally:
        live.kill()
        live.wait(30)
    assert staging.clean_stale_runs(staging_dir) == [os.path.basename(live_run)]  # once its process is gone


def test_a_version_2_ledger_gains_the_digest_column(tmp_path):
    from sage_tfx.privacy.store import SCHEMA_VERSION

    path = str(tmp_path / "v2.db")
    with Ledger.open(path, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b0", shard=0, rows=5)
        with ledger._store.transaction() as tx:
            tx.run("DROP INDEX blocks_digest")
            tx.run("ALTER TABLE blocks DROP COLUMN digest")
            tx.run("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    Ledger.upgrade(path, progress=lambda line: None)
    with Ledger.open(path) as ledger:
        with ledger._store.transaction(write=False) as tx:
            assert tx.one("SELECT value FROM meta WHERE key = 'schema_version'")[0] == str(SCHEMA_VERSION) == "10"
        ledger.add_block("s", "b1", shard=1, rows=5, digest="abc")
        assert ledger.digest_owners(["abc"]) == {"abc": [("s", "b1")]} and ledger.audit().ok


@pytest.mark.parametrize("window", ["99999999999w", "364878d"])
def test_a_window_beyond_999_years_is_refused_before_anything_is_read(env, window):
    """`--window 99999999999w` committed a block whose window no date names, after which `sage ledger status`
    crashed for good; a window longer than 364877d (every block of a record time in [1000, 9000) a date range)
    now exits 2 naming it, with nothing registered or written."""
    path = _csv(env, "good.csv", GOOD)
    before = dump(env["db"])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "ingest",
            "--db",
            env["db"],
            "--stream",
            "s",
            "--input",
            path,
            "--data-root",
            env["data"],
            "--time-column",
            "t",
            "--window",
            window,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"window {window!r} is invalid: at most 364877d" in out.stderr and "Traceback" not in out.stderr
    assert dump(env["db"]) == before and not os.path.exists(env["data"])
    status = subprocess.run(
        [sys.executable, "-m", "sage_tfx", "ledger", "status", "--db", env["db"], "--stream", "s"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
