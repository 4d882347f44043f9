"""`sage bench ledger` reports CPU time beside wall time (sage_tfx/bench/ledger.py; docs/BENCHMARKS.md, "Ledger"):
each run's writer processes give their CPU time per grant and per baseline transaction, and the storage note gives
the head-file write's CPU time beside its wall time. On shared storage the wall-time ratio moves with fsync
latency; the CPU figures are what a change to the ledger's own work moves. Figures are not asserted, only their
presence and the bound a single writer process obeys (its CPU time fits inside its timed span).
"""

import json
import os
import re
import statistics
import subprocess
import sys


def test_bench_ledger_reports_cpu_per_grant_and_per_head_file_write(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "bench",
            "ledger",
            "--json",
            "--grants",
            "8",
            "--blocks",
            "4",
            "--writers",
            "1",
            "--repeats",
            "2",
            "--choose-blocks",
            "0",
            "--growth-blocks",
            "0",
            "--head-sync",
            "commit",
            "--storage-samples",
            "5",
            "--db-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    one = figures["writers"]["1"]
    assert len(one["runs"]) == 2 and figures["audit_ok"] is True
    for run in one["runs"]:
        for kind, rate in (
            ("cpu_ms_per_grant", "grants_per_second"),
            ("baseline_cpu_ms_per_transaction", "baseline_transactions_per_second"),
        ):
            # one writer: its CPU time lies inside the timed span (rounding aside)
            assert 0 < run[kind] <= 1.01 * 1e3 / run[rate] + 1e-3, (kind, run)
    assert one["cpu_ms_per_grant"] == statistics.median(r["cpu_ms_per_grant"] for r in one["runs"])
    for run in one["runs"]:  # the bare transaction's CPU over the grant's, per repeat; the median and range of them
        assert abs(run["cpu_ratio"] - run["baseline_cpu_ms_per_transaction"] / run["cpu_ms_per_grant"]) < 0.01, run
    ratios = [r["cpu_ratio"] for r in one["runs"]]
    assert one["cpu_ratio"] == statistics.median(ratios) and one["cpu_ratio_min_max"] == [min(ratios), max(ratios)]
    storage = figures["storage"]
    assert storage["head_file_write_cpu_ms"] > 0
    assert storage["cpu_ms_per_grant"] == round(one["cpu_ms_per_grant"], 4)
    assert storage["baseline_cpu_ms_per_transaction"] == round(one["baseline_cpu_ms_per_transaction"], 4)
    noted = re.search(r"head-file write \(.*?\) (\d+\.\d{3}) ms, (\d+\.\d{3}) ms of it CPU time", storage["note"])
    assert noted, storage["note"]  # the note gives the figures (to 3 places; the JSON's are rounded to 4)
    assert abs(float(noted[1]) - storage["head_file_write_ms"]) <= 0.0011
    assert abs(float(noted[2]) - storage["head_file_write_cpu_ms"]) <= 0.0011
    # use mode's grant write (no fdatasync) and what the grant's first use then pays, both named in the note
    assert storage["grant_head_file_write_ms"] > 0 and storage["grant_head_file_write_cpu_ms"] > 0
    assert storage["first_use_ms"] >= 0 and storage["head_sync"] == "commit"
    lazy = re.search(r"a grant's head-file write in use mode \(slot C, no fdatasync\) (\d+\.\d{3}) ms", storage["note"])
    assert lazy and abs(float(lazy[1]) - storage["grant_head_file_write_ms"]) <= 0.0011, storage["note"]
    # the ceiling counts the headline mode's head-file write per grant (commit: the durable one)
    base = storage["baseline_ms_per_transaction"]
    assert abs(storage["ratio_ceiling"] - base / (base + storage["head_file_write_ms"])) <= 0.002
    grant_cpu = re.search(r"and a grant in commit mode \d+\.\d{3} ms \((\d+\.\d{3}) ms CPU\)", storage["note"])
    assert grant_cpu, storage["note"]  # the grant's CPU time, to 3 places (double rounding aside, as above)
    assert abs(float(grant_cpu[1]) - storage["cpu_ms_per_grant"]) <= 0.0011
    # each run's line names its CPU figures
    assert len(re.findall(r"CPU \d+\.\d{3} ms per grant vs \d+\.\d{3} ms per transaction", out.stderr)) == 2
    assert os.listdir(tmp_path) == []
