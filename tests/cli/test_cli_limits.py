"""CLI paths that must answer with their documented exit code and leave nothing behind.

Each refused command names the bad value and the fix, exits 2 before it opens, creates, registers or
charges anything, and the ledger (a full dump of every table) and the folders around it are unchanged.
"""

import os
import subprocess
import sys

import pytest

from sage_tfx.privacy import Ledger, LedgerError
from tests.conftest import run_sql
from tests.privacy.test_ledger_bad_input import state

DAY = 86400.0


def sage(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sage_tfx", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


@pytest.fixture
def ledger_db(tmp_path):
    db = str(tmp_path / "ledger.db")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        for i in range(3):
            ledger.add_block("s", f"b{i}", start=i * DAY, end=(i + 1) * DAY, rows=10)
    return db


def _listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root) for f in files + dirs)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--stream", "bad/name", "--epsilon", "1", "--delta", "1e-6"], ["'bad/name'"]),
        (["--stream", "s", "--epsilon", "1e308", "--delta", "1e-6"], ["stream epsilon 1e+308", "maximum 10"]),
        (["--stream", "s", "--epsilon", "1", "--delta", "1e-6", "--min-epsilon", "5"], ["min_epsilon 5.0"]),
    ],
)
def test_refused_init_creates_no_ledger_file(tmp_path, args, expected):
    db = tmp_path / "new.db"
    out = sage("ledger", "init", "--db", str(db), *args)
    assert out.returncode == 2, out.stderr
    assert all(text in out.stderr for text in expected), out.stderr
    assert "Traceback" not in out.stderr
    assert os.listdir(tmp_path) == []  # no ledger file, no -wal/-shm


@pytest.mark.postgres
def test_refused_init_creates_no_tables_in_postgresql(postgres_url):
    from sage_tfx.cli import main

    assert main(["ledger", "init", "--db", postgres_url, "--stream", "s", "--epsilon", "1e308", "--delta", "1e-6"]) == 2
    tables = run_sql(postgres_url, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
    assert tables == []


def test_raised_max_epsilon_is_accepted_knowingly(tmp_path):
    db = str(tmp_path / "l.db")
    out = sage(
        "ledger", "init", "--db", db, "--stream", "s", "--epsilon", "50", "--delta", "1e-6", "--max-epsilon", "100"
    )
    assert out.returncode == 0, out.stderr
    with Ledger.open(db) as ledger:
        assert ledger.stream("s").epsilon == 50.0


def test_plot_to_a_missing_folder_exits_2_naming_the_path(ledger_db, tmp_path):
    before = state(ledger_db)
    out = sage("ledger", "plot", "--db", ledger_db, "--stream", "s", "--out", str(tmp_path / "nope" / "x.png"))
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert str(tmp_path / "nope") in out.stderr and "does not exist" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "nope").exists()
    assert state(ledger_db) == before


def test_status_into_a_closed_pipe_exits_quietly(ledger_db):
    """`sage ledger status | head`: the reader goes away; no BrokenPipe traceback, exit 141 as SIGPIPE."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sage_tfx", "ledger", "status", "--db", ledger_db, "--stream", "s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the child has written anything: its first write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


def test_status_through_head_in_a_shell(ledger_db):
    out = subprocess.run(
        f"'{sys.executable}' -m sage_tfx ledger status --db '{ledger_db}' --stream s | head -c 1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stderr == "" and len(out.stdout) == 1


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--name", "../x"], ["--name '../x' is invalid", "letters, digits"]),
        (["--name", "a b"], ["--name 'a b' is invalid"]),
        (["--max-seconds", "-1"], ["--max-seconds -1.0 is invalid", "> 0"]),
        (["--max-seconds", "nan"], ["--max-seconds nan is invalid"]),
        (["--max-iterations", "0"], ["--max-iterations 0 is invalid"]),
    ],
)
def test_sage_run_bad_limits_exit_2_before_anything(ledger_db, tmp_path, extra, expected):
    before = state(ledger_db)
    work = tmp_path / "work"
    out = sage(
        "run",
        "taxi_regression",
        "--db",
        ledger_db,
        "--stream",
        "s",
        "--data-root",
        str(tmp_path / "data"),
        "--target",
        "800000",
        "--work-dir",
        str(work),
        *extra,
        cwd=str(tmp_path),
    )
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert all(text in out.stderr for text in expected), out.stderr
    assert "Traceback" not in out.stderr
    assert state(ledger_db) == before  # nothing registered, charged or finished
    assert not work.exists() and not (tmp_path / "x").exists() and not (tmp_path / "data").exists()


def test_min_grant_epsilon_is_per_stream_and_capped_by_min_epsilon(tmp_path):
    db = str(tmp_path / "l.db")
    assert (
        sage(
            "ledger",
            "init",
            "--db",
            db,
            "--stream",
            "s",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
            "--min-grant-epsilon",
            "0.05",
        ).returncode
        == 0
    )
    with Ledger.open(db) as ledger:
        ledger.create_stream("tiny", 0.01, 1e-6)  # min_epsilon 1e-4: below the default 0.001, so the floor
        ledger.add_block("s", "b0", shard=0)
        ledger.add_block("tiny", "t0", shard=0)
        assert ledger.status("s")["min_grant_epsilon"] == 0.05
        before = state(db)
        with pytest.raises(LedgerError, match="epsilon 0.04 is below stream 's''s minimum grant epsilon 0.05"):
            ledger.request("p", "s", blocks=["b0"], epsilon=0.04)
        assert state(db) == before
        assert ledger.request("p", "s", blocks=["b0"], epsilon=0.05).epsilon == 0.05
        assert ledger.request("p", "tiny", blocks=["t0"], epsilon=1e-4).epsilon == 1e-4


def test_iterator_refuses_a_start_the_ledger_would_refuse(ledger_db):
    from sage_tfx.adaptive import IteratorSettings, SageIterator
    from sage_tfx.privacy import LedgerError

    before = state(ledger_db)
    with Ledger.open(ledger_db) as ledger:
        with pytest.raises(LedgerError, match=r"epsilon_start 0\.0001 charges .* below .*minimum grant epsilon 0\.001"):
            SageIterator(ledger, "s", "p", lambda *a: None, settings=IteratorSettings(epsilon_start=0.0001))
        SageIterator(ledger, "s", "p", lambda *a: None, settings=IteratorSettings(epsilon_start=0.125))
    assert state(ledger_db) == before
