"""`sage bench ledger`'s ``grant_floor`` (sage_tfx/bench/_ledger_floor.py; docs/BENCHMARKS.md, "Ledger"): one grant's
statements as the store runs them, its WAL pages and its CPU by part, against the bare transaction's. Figures are
not asserted, only the shape, the statements a range grant runs, and how the derived figures follow from the parts.
"""

import json
import os
import subprocess
import sys


def _floor(tmp_path, blocks):
    out = subprocess.run(
        [sys.executable, "-m", "sage_tfx", "bench", "ledger", "--json", "--grants", "4", "--blocks", str(blocks)]
        + ["--writers", "1", "--repeats", "2", "--head-sync", "use", "--storage-samples", "0", "--choose-blocks", "0"]
        + ["--growth-blocks", "0", "--floor-grants", "20", "--db-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["grant_floor"]


def test_grant_floor_names_the_grants_statements_pages_and_cpu_by_part(tmp_path):
    floor = _floor(tmp_path, 4)
    assert (floor["blocks_per_grant"], floor["grants_per_round"], floor["rounds"], floor["audit_ok"]) == (
        4,
        20,
        2,
        True,
    )
    # a grant of consecutive blocks: one write transaction of five statements, blocks read and written by id range
    statements = floor["grant_statements"]
    assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT" and len(statements) == 7, statements
    assert statements[1].startswith("SELECT name, accounting") and "FROM streams WHERE name = ?" in statements[1]
    assert statements[2].startswith("SELECT id, state, spent FROM blocks") and "BETWEEN" in statements[2]
    assert statements[3].startswith("UPDATE blocks SET spent") and "BETWEEN" in statements[3]
    assert statements[4].startswith("INSERT INTO grants") and statements[5].startswith("INSERT INTO log")
    assert floor["bare_statements"][1] == "UPDATE blocks SET spent = ? WHERE id = ? (x4)"
    # the grant writes at least its blocks' page, the grant's and the log entry's; the bare transaction one or two
    assert floor["wal_pages"]["grant"] >= 3 and 0.9 <= floor["wal_pages"]["bare"] <= 2.5
    cpu = floor["cpu_ms"]
    assert set(cpu) == {"bare", "grant_sql", "head_write", "grant"}
    for spread in cpu.values():
        assert 0 < spread[0] <= spread[1] <= spread[2]
    medians = {k: v[1] for k, v in cpu.items()}
    assert abs(floor["python_ms"] - (medians["grant"] - medians["grant_sql"] - medians["head_write"])) < 2e-3
    assert abs(floor["cpu_ratio_ceiling"] - medians["bare"] / (medians["grant_sql"] + medians["head_write"])) < 0.01
    assert abs(floor["cpu_ratio"] - medians["bare"] / medians["grant"]) < 0.01
    assert os.listdir(tmp_path) == []  # every database, copy, key and head file of the figure removed
