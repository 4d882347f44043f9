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
        (["--fractions", "1.2"], "fractions"),
        (["--tasks", "criteo"], "task 'criteo'"),
        (["--confidence", "1"], "confidence"),
        (["--steps-per-doubling", "0"], "steps_per_doubling 0"),
    ):
        with pytest.raises(ValueError, match=message):
            bench.run(parser.parse_args(argv))


def test_a_bad_epsilon_is_a_usage_error(capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--epsilons", "-1"])
    assert (
        exc.value.code == 2 and "argument --epsilons: '-1': '-1' is not a finite number > 0" in capsys.readouterr().err
    )


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


def test_centred_release_is_least_squares_in_raw_coordinates_without_noise():
    """The centred statistics come from the raw ones by algebra: at a huge epsilon (noise and AdaSSP's ridge
    vanish) the mapped-back coefficients are the raw least-squares fit."""
    from sage_tfx.bench._taxi_centred import centred_release

    rng = np.random.default_rng(3)
    x = np.column_stack([np.ones(2000), rng.random((2000, 8))])
    y = np.clip(x @ rng.normal(0.0, 0.1, 9) + 0.3 + rng.normal(0.0, 0.05, 2000), 0.0, 1.0)
    w = centred_release((x.T @ x, x.T @ y), 1e9, 1e-6, rng)
    np.testing.assert_allclose(w, np.linalg.lstsq(x, y, rcond=None)[0], atol=1e-4)


def test_centred_trainer_lowers_the_dp_models_excess_mse():
    """On the generated taxi rows at epsilon 1 (30,000 train rows, 8 streams, fixed seed), AdaSSP with the public centre has
    a lower test MSE than without it: its feature and label bounds are sqrt(3) and 0.5 instead of sqrt(6) and 1."""
    from types import SimpleNamespace

    from sage_tfx.bench._taxi_centred import centred_release
    from sage_tfx.bench.validation import Task, TaxiGenerator, load_real_rows

    rng = np.random.default_rng(11)
    generator = TaxiGenerator(load_real_rows())
    task = Task("taxi_mse", SimpleNamespace(reference_rows=1000, delta=1e-6), generator.draw(20000, rng))
    excess = {"uncentred": [], "centred": []}
    for _ in range(8):
        x, y = task.features(generator.draw(30000, rng))
        fitted = task.fit(x, y)
        exact = task.held_out_metric(np.linalg.lstsq(*fitted, rcond=None)[0])
        excess["uncentred"].append(task.held_out_metric(task.release(fitted, 1.0, y.size, rng)) - exact)
        excess["centred"].append(task.held_out_metric(centred_release(fitted, 1.0, 1e-6, rng)) - exact)
    assert np.mean(excess["centred"]) < 0.8 * np.mean(excess["uncentred"])


@pytest.mark.parametrize("trainer", [None, "uncentred"])
def test_taxi_trainer_runs_end_to_end(trainer):
    """The default trains taxi_mse with the public centre; ``--taxi-trainer uncentred`` keeps the raw features."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        ["--trials", "2", "--tasks", "taxi_mse", "--epsilons", "1", "--fractions", "0.5", "--start-rows", "4000"]
        + ["--max-rows", "16000", "--reference-rows", "20000", "--holdout", "5000"]
        + (["--taxi-trainer", trainer] if trainer else [])
    )
    figures = bench.run(args)
    assert figures["settings"]["taxi_trainer"] == (trainer or "centred")
    assert [r["fraction"] for r in figures["taxi_mse"]["targets"]] == [0.5]
