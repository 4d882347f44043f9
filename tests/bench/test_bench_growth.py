"""sage bench growth: a tiny run on the REAL taxi trips (numpy only, seconds)."""

import argparse

import pytest

from sage_tfx.bench import growth as bench


def test_tiny_run(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--blocks",
            "6",
            "--rows-per-block",
            "100",
            "--trials",
            "1",
            "--queries-per-block",
            "2",
            "--plot",
            str(tmp_path / "fig.png"),
        ]
    )
    figures = bench.run(args)
    for v in bench.VARIANTS:
        assert len(figures["median_abs_error_by_t"][v]) == 6 and min(figures["median_abs_error_by_t"][v]) >= 0
    assert figures["audit_ok"]
    assert figures["block_epsilon_charged"] == {"sched": [1.0], "impr": [1.0], "pmwg": [1.0]}
    assert figures["scheduler_runs"] == [1, 2, 3, 4, 6]  # ceil(1.5^i) for i = 0..4 (gamma 0.5, t0 1)
    assert len(figures["pmwg_error_by_t"]) == 6 and figures["pmw_per_epoch_over_pmwg"] > 0
    assert (tmp_path / "fig.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="--blocks 0 is invalid"):
        bench.run(parser.parse_args(["--blocks", "0", "--plot", ""]))


def test_tiny_ermg_run():
    # ERMG under both schedules and the re-run baseline on REAL taxi blocks, a real ledger audited.
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    figures = bench.run(
        parser.parse_args(["--ermg", "--blocks", "8", "--rows-per-block", "100", "--trials", "1", "--plot", ""])
    )
    assert figures["audit_ok"]
    for v in ("bbimprover", "bbscheduler", "rerun"):
        curve = [e for e in figures["excess_median_by_t"][v] if e == e]  # NaN before a schedule's first run
        assert len(curve) >= 1 and min(curve) >= -1e-9  # excess over the exact minimiser of the same objective


def test_tiny_smalldbg_run(tmp_path):
    # SmallDBG under both schedules and the re-run baseline on GENERATED blocks, a real ledger audited
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    plot = tmp_path / "sdb.png"
    figures = bench.run(
        parser.parse_args(
            ["--smalldbg", "--blocks", "4", "--rows-per-block", "50", "--trials", "1", "--plot", str(plot)]
        )
    )
    assert figures["audit_ok"] and figures["candidates"] == 1716 and plot.stat().st_size > 1000
    for v in ("bbimprover", "bbscheduler", "rerun"):
        assert len(figures["median_error_by_t"][v]) == 4
    # every error is at least the best synthetic database's (opt_m, the floor)
    assert all(e >= o - 1e-9 for v in figures["median_error_by_t"].values() for e, o in zip(v, figures["opt_m_by_t"]))
    assert figures["doubling_bins_first_t"] == [1, 2, 4]
    with pytest.raises(SystemExit, match="two benchmarks"):
        bench.run(parser.parse_args(["--smalldbg", "--ermg", "--plot", ""]))
