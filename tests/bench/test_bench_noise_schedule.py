"""sage bench noise-schedule: a tiny end-to-end run on the real taxi trips (imports TensorFlow)."""

import argparse

import numpy as np
import pytest

from sage_tfx.bench import noise_schedule as bench

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_tiny_run_end_to_end(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--rows",
            "1500",
            "--epochs",
            "1",
            "--seeds",
            "1",
            "--schedules",
            "constant,exponential",
            "--plot",
            str(tmp_path / "fig.png"),
        ]
    )
    figures = bench.run(args)
    row = figures["dnn_regressor"]
    assert row["metric"] == "mse" and row["ratio_vs_constant"]["constant"] == 1.0
    # equal epsilon: both schedules spend the same budget (within the calibration tolerance), never more
    for name in ("constant", "exponential"):
        assert 0.999 <= row["realised_epsilon"][name] <= 1.0
    assert row["first_sigma"]["exponential"] > row["first_sigma"]["constant"] > row["last_sigma"]["exponential"]
    assert row["ratio_vs_constant"]["exponential"] == pytest.approx(
        row["values"]["exponential"][0] / row["values"]["constant"][0], rel=1e-3
    )
    assert (tmp_path / "fig.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="not one of"):
        bench.run(parser.parse_args(["--schedules", "constant,cosine", "--plot", ""]))


def test_full_batch_regime_equal_budget_and_decay_wins(tmp_path):
    """The paper's regime on a subset of the real rows (numpy only): every schedule has the constant run's zCDP
    budget R and epsilon, and in a long run (T = 32 kappa) Lemma 3.1's shape at a low floor beats constant
    and beats the same shape held to the default floor."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--regime",
            "full-batch",
            "--rows",
            "3000",
            "--seeds",
            "2",
            "--lam",
            "0.05",
            "--t-over-kappa",
            "32",
            "--plot",
            str(tmp_path / "fb.png"),
        ]
    )
    figures = bench.run(args)
    (row,) = figures["runs"]
    assert figures["kappa"] > 1 and row["steps"] == round(32 * figures["kappa"])
    for name, eps in row["realised_epsilon"].items():
        assert eps == pytest.approx(row["realised_epsilon"]["constant"], rel=1e-9), name
    assert row["ratio_vs_constant"]["constant"] == 1.0
    assert row["ratio_vs_constant"]["bound_optimal"] < row["ratio_vs_constant"]["bound_optimal_floor_0.01"] < 1
    assert row["sigma_first_last"]["bound_optimal"][1] < 0.01 * row["sigma_first_last"]["bound_optimal"][0]
    assert (tmp_path / "fb.png").stat().st_size > 1000


def test_equal_budget_sigmas_keep_the_zcdp_sum():
    from sage_tfx.bench import _full_batch_gd as fb
    from sage_tfx.privacy import noise_schedules as ns

    for sched in fb.schedules(kappa=10.0, steps=400, floor=1e-8).values():
        sigmas = fb.equal_budget_sigmas(sched, 400, 30.0)
        assert np.sum(sigmas**-2.0) == pytest.approx(400 / 30.0**2, rel=1e-12)
    assert fb.schedules(10.0, 400, 1e-8)["bound_optimal"].gamma == pytest.approx(0.9)
    with pytest.raises(ns.NoiseScheduleError, match="below floor=0.01"):
        ns.BoundOptimalSchedule(gamma=0.9, stages=400).check_for_run(400)


def test_full_batch_momentum_is_algorithm_2_on_the_same_noisy_gradients():
    """beta = 0 is plain noisy GD; with beta the update is the debiased average of the same noisy gradients
    (checked against sage_tfx.models.momentum's reference on a quadratic where the gradient is known)."""
    from sage_tfx.bench import _full_batch_gd as fb
    from sage_tfx.models.momentum import debiased_momentum_steps

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    task = fb.logistic_task(x, rng.integers(0, 2, size=200), 0.1)
    sigmas = np.full(30, 50.0)
    plain = fb.noisy_gd(task, sigmas, seed=1)
    np.testing.assert_array_equal(plain, fb.noisy_gd(task, sigmas, seed=1, beta=0.0, step=1.0))
    # a zero-data task (x = 0): the gradient is lam * theta + noise only, so replay it step by step
    zero = (np.zeros((200, 3)), np.ones(200), 0.0, 1.0, 1.0)
    noise = np.random.default_rng(2).normal(0.0, 50.0 / 200, size=(30, 3))
    expected = -np.sum(debiased_momentum_steps(noise, 0.9, 0.5), axis=0)
    np.testing.assert_allclose(fb.noisy_gd(zero, sigmas, seed=2, beta=0.9, step=0.5), expected, rtol=1e-10)
