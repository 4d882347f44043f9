"""sage bench adaptive-cost: the iterator's schedule, the oracle's bisection, and a small run on the real flights."""

import argparse

import pytest

from sage_tfx.bench import adaptive_cost as bench


class _Attempt:
    """A stand-in for the pipeline: an attempt ACCEPTs iff epsilon x rows reaches ``need`` (no noise)."""

    def __init__(self, need):
        self.need = need

    def __call__(self, task, trial, rows):
        outer = self

        class One:
            def accepts(self, epsilon, target, eta, rng):
                return epsilon * rows >= outer.need

        return One()


def _args(**kw):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([])
    vars(args).update(kw)
    return args


def test_the_schedule_doubles_epsilon_then_the_window_and_the_oracle_finds_the_least_budget(monkeypatch):
    monkeypatch.setattr(bench, "Attempt", _Attempt(need=3000.0))
    trial = type("T", (), {"order": list(range(100_000))})()
    args = _args(epsilon_start=0.125, epsilon_max=1.0, oracle_draws=1)
    resources, oldest, rows = bench.sage_run(None, trial, 0.0, 1000, args, None)
    # 0.125, 0.25, 0.5, 1 at 1,000 rows (RETRY: 125 .. 1,000), then 1 at 2,000 (RETRY), 1 at 4,000: ACCEPT
    assert rows == 4000 and oldest == pytest.approx(0.125 + 0.25 + 0.5 + 1 + 1 + 1)
    assert resources == pytest.approx(125 + 250 + 500 + 1000 + 2000 + 4000)
    ideal, at_rows = bench.ideal_resources(None, trial, 1000, rows, 0.0, args, None)
    assert ideal == pytest.approx(3000, rel=bench.GRID_STEP - 1)  # the grid's resolution
    assert at_rows * rows == pytest.approx(3000, rel=bench.GRID_STEP - 1)


def test_a_small_run_on_the_real_flights(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--trials",
            "1",
            "--fractions",
            "0.5",
            "--start-rows",
            "32000",
            "--oracle-draws",
            "1",
            "--plot",
            str(tmp_path / "cost.png"),
        ]
    )
    figures = bench.run(args)
    (row,) = figures["targets"]
    assert "REAL" in figures["data"] and row["start_rows"] == 32000
    assert row["runs"] + row["timeouts"] == 1
    if row["runs"]:
        assert row["ratio_median"] > 0 and (tmp_path / "cost.png").stat().st_size > 1000
