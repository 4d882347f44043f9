"""sage bench sample-complexity: the window grid, the k fit, and a small end-to-end run (no TensorFlow)."""

import argparse
import math

import numpy as np
import pytest

from sage_tfx.bench import sample_complexity as bench


def test_windows_grow_by_a_quarter_power_of_two():
    grid = bench.windows(1000, 16000)
    assert grid[0] == 1000 and grid[4] == 2000 and grid[-1] == 16000 and len(grid) == 17
    assert all(b > a for a, b in zip(grid, grid[1:]))


def test_fit_k_recovers_k_from_exact_ratios():
    epsilons = [0.5, 1.0, 2.0]
    rows = [{"ratio": {str(e): 1 + 0.4 / e for e in epsilons}} for _ in range(3)]
    fitted = bench.fit_k(rows, epsilons)
    assert fitted["k_least_squares"] == pytest.approx(0.4)
    assert all(k == pytest.approx(0.4) for k in fitted["k_median_per_epsilon"].values())


def test_small_run_end_to_end(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--trials",
            "2",
            "--tasks",
            "taxi_accuracy",
            "--epsilons",
            "1",
            "--fractions",
            "0.5,0.8",
            "--max-rows",
            "40000",
            "--reference-rows",
            "50000",
            "--holdout",
            "20000",
            "--plot",
            str(tmp_path / "fig.png"),
        ]
    )
    figures = bench.run(args)
    rows = figures["taxi_accuracy"]["targets"]
    assert [r["fraction"] for r in rows] == [0.5, 0.8]
    for r in rows:  # the easy accuracy targets are reached within 40,000 rows by NP SLA
        assert r["np"] is not None and r["np"] >= 250  # the smallest window
        if r["sage"]["1.0"] is not None:
            assert r["ratio"]["1.0"] == pytest.approx(r["sage"]["1.0"] / r["np"])
    assert figures["summary"]["epsilon"] == 1.0 and (tmp_path / "fig.png").stat().st_size > 1000
    assert math.isfinite(figures["seconds"])


def test_bad_arguments_are_named():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    for argv, message in (
        (["--epsilons", "-1"], "epsilons"),
        (["--fractions", "1.2"], "fractions"),
        (["--tasks", "criteo"], "task 'criteo'"),
        (["--confidence", "1"], "confidence"),
        (["--steps-per-doubling", "0"], "steps_per_doubling 0"),
    ):
        with pytest.raises(ValueError, match=message):
            bench.run(parser.parse_args(argv))


def test_summary_counts_only_targets_np_reaches():
    def row(np_n, sage_n):
        return {"np": np_n, "sage": {"1.0": sage_n}, "ratio": {"1.0": sage_n / np_n if np_n and sage_n else None}}

    met = bench.summarize([row(1000, 1400), row(2000, 2000), row(None, None)], 1.0)
    assert met["goal_met"] and met["max_ratio_sage_over_np"] == pytest.approx(1.4)
    assert met["targets_beyond_the_grid_for_both"] == 1 and met["targets_reached_by_np_not_by_sage"] == 0
    over = bench.summarize([row(1000, 1700), row(2000, 2000)], 1.0)
    assert not over["goal_met"]
    unreached = bench.summarize([row(1000, 1000), row(2000, None)], 1.0)  # NP reaches it, Sage does not
    assert not unreached["goal_met"] and unreached["targets_reached_by_np_not_by_sage"] == 1


def test_finer_windows():
    grid = bench.windows(1000, 4000, steps_per_doubling=8)
    assert grid[8] == 2000 and grid[-1] == 4000 and len(grid) == 17


def test_samples_needed_interpolates_the_half_crossing_in_log_n():

    grid = [1000, 2000, 4000]
    accepted = np.array([[0, 0, 1], [0, 1, 1], [0, 1, 1], [0, 0, 1]], dtype=bool)  # 0, 1/2, 1 accept
    assert bench.samples_needed(accepted, grid) == pytest.approx(2000)
    accepted[3, 1] = True  # 3/4 at 2000: half is reached 2/3 of the way (in log n) from 1000
    assert bench.samples_needed(accepted, grid) == pytest.approx(1000 * 2 ** (2 / 3))
    assert bench.samples_needed(np.zeros((4, 3), dtype=bool), grid) is None
    assert bench.samples_needed(np.ones((4, 3), dtype=bool), grid) == 1000


def test_ratio_interval_is_paired_and_contains_the_ratio():

    rng = np.random.default_rng(0)
    grid = [1000, 2000, 4000, 8000]
    reference = np.array([[0, 1, 1, 1]] * 6 + [[0, 0, 1, 1]] * 6, dtype=bool)
    shifted = np.roll(reference, 1, axis=1)  # every trial needs one window more
    shifted[:, 0] = False
    low, high = bench.ratio_interval(shifted, reference, grid, rng)
    point = bench.samples_needed(shifted, grid) / bench.samples_needed(reference, grid)
    assert low <= point <= high and point == pytest.approx(2.0)


def test_ratio_interval_upper_end_is_unbounded_when_resamples_never_reach():

    grid = [1000, 2000]
    reference = np.ones((10, 2), dtype=bool)
    sage = np.zeros((10, 2), dtype=bool)
    sage[:6, 1] = True  # 6 of 10 reach the target at 2000: some resamples have fewer than half
    low, high = bench.ratio_interval(sage, reference, grid, np.random.default_rng(1))
    assert 1.0 < low < 2.0 and high is None  # half-crossing interpolated between 1000 and 2000


def test_flights_run_on_real_rows():
    """--dataset flights: REAL rows, the example pipeline; NP reaches the easy target within 20,000 rows, and the
    per-block charge is split as sage run splits it; a window past the stream's size is named."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        ["--dataset", "flights", "--trials", "2", "--epsilons", "4", "--fractions", "0.5", "--max-rows", "20000"]
    )
    figures = bench.run(args)
    task = figures["flights_mse"]
    assert "REAL rows" in figures["data"] and 250 < task["best_metric"] < task["naive_metric"]
    row = task["targets"][0]
    assert row["np"] is not None and row["np"] < 20000
    split = figures["settings"]["split"]["4.0"]
    assert split["preprocessing"] == pytest.approx(0.8) and split["validation"] == pytest.approx(3.0)
    assert split["training"] == pytest.approx(2.7)
    with pytest.raises(ValueError, match="max_rows 400000 exceeds the 300326 real flights"):
        bench.run(parser.parse_args(["--dataset", "flights", "--max-rows", "400000"]))
