"""`sage run` to ACCEPT on a stream with a privacy unit: REAL NYC flights, the unit a plane (``tailnum``).

User-time DP (daily blocks, at most K flights of a plane a day) and user DP (blocks by shards of the plane, at most
K flights of a plane for all time): examples/flights runs to ACCEPT under both, and `sage ledger audit` is OK. The
validator runs per unit (each plane's mean loss one record, the count of planes) at its whole share, its release
signed per unit; every other stage is released at its per-row budget (the unit's share through group privacy).
"""

import glob
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from sage_tfx.data import flights
from sage_tfx.privacy import Ledger

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPELINE = os.path.join(ROOT, "examples", "flights", "pipeline.py")


def _sage(*args):
    return subprocess.run(
        [sys.executable, "-m", "sage_tfx", *map(str, args)], capture_output=True, text=True, timeout=900
    )


def _validation_result(work):
    paths = glob.glob(os.path.join(str(work), "**", "validation_result", "**", "result.json"), recursive=True)
    assert paths, "no validation result written"
    with open(sorted(paths, key=os.path.getmtime)[-1]) as f:
        return json.load(f)


def _release_entries(db):
    with sqlite3.connect(str(db)) as conn:
        bodies = [json.loads(b) for (b,) in conn.execute("SELECT body FROM log WHERE kind = 'release'")]
    return {b["stage"]: b for b in bodies}


@pytest.mark.slow
@pytest.mark.parametrize(
    "semantics, k, block_args",
    [
        ("user-time", 3, ["--block-by", "time", "--time-column", flights.TIME_COLUMN, "--window", "1d"]),
        ("user", 2, ["--block-by", "user", "--shards", "8"]),
    ],
)
def test_sage_run_accepts_on_a_unit_stream_with_the_validator_per_unit(tmp_path, semantics, k, block_args):
    db, data, csv, work = tmp_path / "ledger.db", tmp_path / "data", tmp_path / "flights.csv", tmp_path / "work"
    flights.write_flights_csv(str(csv), since="2013-11-01", until="2013-11-09")  # 8 real days
    init = _sage(
        "ledger",
        "init",
        "--db",
        db,
        "--stream",
        "flights",
        "--epsilon",
        "1",
        "--delta",
        "1e-6",
        "--privacy-unit",
        "tailnum",
        "--max-rows-per-unit",
        k,
    )
    assert init.returncode == 0, init.stderr[-2000:]
    ingest = _sage(
        "ingest", "--db", db, "--stream", "flights", "--input", csv, "--data-root", data, *block_args, "--quiet"
    )
    assert ingest.returncode == 0, ingest.stderr[-2000:]
    run = _sage(
        "run",
        PIPELINE,
        "--db",
        db,
        "--stream",
        "flights",
        "--data-root",
        data,
        "--target",
        700,
        "--min-window",
        8,
        "--max-iterations",
        1,
        "--work-dir",
        work,
    )
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert "(8), epsilon 0.5" in run.stdout and "-> ACCEPT" in run.stdout, run.stdout[-2000:]
    with Ledger.open(str(db), read_only=True) as ledger:
        (grant,) = ledger.grants("flights")
        assert grant.meta["unit"] == {"column": "tailnum", "max_rows": k}  # signed with the grant
        assert ledger.audit().ok
        released = {r.stage: r.epsilon for r in ledger.releases(grant.id)}
    result = _validation_result(work)
    split = grant.meta["split"]
    assert result["per_unit"] == "tailnum"  # the test calibrated to the plane, at its whole share
    assert result["validation_share_epsilon"] == pytest.approx(split["validation"])
    assert released["validation"] == pytest.approx(split["validation"])
    assert released["training"] <= split["training"] / k * (1 + 1e-9)  # the other stages per row
    assert _release_entries(db)["validation"].get("per_unit") == "tailnum"  # signed in the log
    audit = _sage("ledger", "audit", "--db", db)
    assert audit.returncode == 0 and "audit OK" in audit.stdout
