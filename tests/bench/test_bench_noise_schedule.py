"""sage bench noise-schedule: a tiny end-to-end run on the real taxi trips (imports TensorFlow)."""
import argparse

import numpy as np
import pytest

from sage_tfx.bench import noise_schedule as bench

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_tiny_run_end_to_end(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--rows", "1500", "--epochs", "1", "--seeds", "1", "--schedules", "constant,exponential",
                              "--plot", str(tmp_path / "fig.png")])
    figures = bench.run(args)
    row = figures["dnn_regressor"]
    assert row["metric"] == "mse" and row["ratio_vs_constant"]["constant"] == 1.0
    # equal epsilon: both schedules spend the same budget (within the calibration tolerance), never more
    for name in ("constant", "exponential"):
        assert 0.999 <= row["realised_epsilon"][name] <= 1.0
    assert row["first_sigma"]["exponential"] > row["first_sigma"]["constant"] > row["last_sigma"]["exponential"]
    assert row["ratio_vs_constant"]["exponential"] == pytest.approx(
        row["values"]["exponential"][0] / row["values"]["constant"][0], rel=1e-3)
    assert (tmp_path / "fig.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="not one of"):
        bench.run(parser.parse_args(["--schedules", "constant,cosine", "--plot", ""]))


def test_full_batch_regime_equal_budget_and_decay_wins(tmp_path):
    """The paper's regime on a subset of the real rows (numpy only): every schedule has the constant run's zCDP
    budget R and epsilon, and in a long run (T = 32 kappa) Lemma 3.1's shape at a low floor beats constant
    and beats the same shape held to the default floor."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--regime", "full-batch", "--rows", "3000", "--seeds", "2", "--lam", "0.05",
                              "--t-over-kappa", "32", "--plot", str(tmp_path / "fb.png")])
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
        assert np.sum(sigmas ** -2.0) == pytest.approx(400 / 30.0 ** 2, rel=1e-12)
    assert fb.schedules(10.0, 400, 1e-8)["bound_optimal"].gamma == pytest.approx(0.9)
    with pytest.raises(ns.NoiseScheduleError, match="below floor=0.01"):
        ns.BoundOptimalSchedule(gamma=0.9, stages=400).check_for_run(400)
