"""`sage serve` with one worker process per pipeline: pipelines progress at once on one
ledger, and a worker killed mid-run is reported, restarted and resumes under its grant."""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from sage_tfx.privacy import Ledger

PY = sys.executable


def test_a_second_ledger_in_a_process_keeps_the_first_ones_locks(tmp_path):
    """SQLite's POSIX locks are per process: reading the file's header with open()/close() while a connection
    of this process has it dropped that connection's locks, and another process's last close then checkpointed
    and DELETED the WAL under it (the corrupt ledgers first seen with serve's worker processes)."""
    db = tmp_path / "ledger.db"
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
    first = Ledger.open(db)
    first.register("s", "p")  # a write: the WAL exists while `first` is open
    second = Ledger.open(db)  # a second ledger in this process, as a pipeline component opens one
    other = subprocess.run(
        [
            PY,
            "-c",
            f"import sqlite3; c = sqlite3.connect({str(db)!r}); "
            "c.execute('select count(*) from sqlite_master').fetchall(); c.close()",
        ]
    )
    assert other.returncode == 0
    assert os.path.exists(f"{db}-wal"), "another process deleted the WAL that this process's ledgers still use"
    first.register("s", "q")
    second.close()
    first.close()
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
        assert {p["name"] for p in ledger.pipelines("s")} == {"p", "q"}


def _serve(tmp_path, *extra):
    """`sage serve` of two taxi_regression pipelines on 256 real taxi days, one iteration each (easy ACCEPTs,
    hard RETRYs then TIMEOUTs), as tests/adaptive/test_serve_beam_options.py's serve test; a Popen whose stdout lines are
    collected with their arrival times."""
    from sage_tfx.data.taxi import taxi_csv_path

    db, data = tmp_path / "ledger.db", tmp_path / "data"
    init = subprocess.run(
        [PY, "-m", "sage_tfx", "ledger", "init", "--db", db, "--stream", "taxi", "--epsilon", "1", "--delta", "1e-6"],
        capture_output=True,
        text=True,
    )
    assert init.returncode == 0, init.stderr
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "sage_tfx",
            "serve",
            "--db",
            db,
            "--stream",
            "taxi",
            "--data-root",
            data,
            "--input",
            taxi_csv_path("simple"),
            "--time-column",
            "trip_start_timestamp",
            "--window",
            "1d",
            "--initial-blocks",
            "256",
            "--blocks-per-step",
            "256",
            "--pipeline",
            "easy=taxi_regression:3000000",
            "--pipeline",
            "hard=taxi_regression:100000",
            "--max-iterations",
            "1",
            "--rejection-share",
            "0",
            "--work-dir",
            tmp_path / "work",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines = []

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return db, proc, lines, reader


def _finish(proc, reader, timeout=900):
    code = proc.wait(timeout=timeout)
    reader.join(timeout=30)
    return code


def _check_ledger(db):
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
        stream = ledger.stream("taxi")
        for block in ledger.blocks("taxi"):
            assert block.spent[0] <= stream.epsilon + 1e-9, block.id  # no block over its budget
        return {p: [g for g, _o, _d in ledger.history("taxi", p)] for p in ("easy", "hard")}


# That the two pipelines' TFX runs go at once (their MLMD executions' spans overlap) is checked on the same serve
# run (easy and hard on 256 taxi days, one iteration each) by tests/adaptive/test_serve_beam_options.py::
# test_serve_runs_pipelines_on_multi_processing_workers_with_a_staging_dir_and_a_url_root.


@pytest.mark.slow
@pytest.mark.tf
def test_a_killed_worker_is_reported_restarted_and_resumes_under_its_grant(tmp_path):
    db, proc, lines, reader = _serve(tmp_path)
    try:
        pid = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # hard's worker, once its grant is charged (its TFX run under way)
            for _t, line in list(lines):
                m = re.match(r"\[hard\] worker started \(pid (\d+)\)", line)
                pid = int(m.group(1)) if m else pid
            if pid is not None and os.path.exists(db):
                with Ledger.open(db) as ledger:
                    if ledger.history("taxi", "hard"):
                        break
            time.sleep(0.5)
        else:
            pytest.fail("hard's grant never appeared: " + "\n".join(line for _t, line in lines))
        time.sleep(8)  # inside the TFX run
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()  # noqa: F841
        code = _finish(proc, reader)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "\n".join(line for _t, line in lines)
    assert code == 0, out
    assert (
        f"[hard] worker (pid {pid}) died (killed by SIGKILL (signal 9)); restarting (1/3): it resumes under its grant"
    ) in out, out
    history = _check_ledger(db)
    assert len(history["hard"]) == 1, history  # resumed under the same grant: no second charge
    grant = history["hard"][0].id
    assert f"[hard] resuming iteration 1 under its grant {grant} (already charged; not charged again)" in out, out
    assert "hard: TIMEOUT after 1 iteration(s)" in out and "audit: OK" in out, out
    # The other pipeline went on: its one worker never restarted and it reached its outcome on one grant.
    assert out.count("[easy] worker started") == 1 and "[easy] worker" not in out.replace("[easy] worker started", "")
    assert "easy: ACCEPT after 1 iteration(s)" in out and len(history["easy"]) == 1
