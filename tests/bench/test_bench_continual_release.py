"""sage bench continual-release: a tiny run on the REAL taxi trips (numpy only, a few seconds)."""

import argparse

import pytest

from sage_tfx.bench import continual_release as bench


def test_tiny_run(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--blocks",
            "6",
            "--rows-per-block",
            "150",
            "--window",
            "3",
            "--trials",
            "1",
            "--plot",
            str(tmp_path / "fig.png"),
        ]
    )
    figures = bench.run(args)
    for v in bench.VARIANTS:
        curve = figures["excess_median_by_t"][v]
        assert len(curve) == 6 and min(curve) >= -1e-9  # excess over the exact minimiser of the same objective
    assert figures["audit_ok"] and figures["block_epsilon_charged"] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert all(0.5 < r <= 1 + 1e-9 for r in figures["max_block_loss_over_bound"].values())
    assert set(figures["next_block_logloss_ratio_vs_non_private"]) == set(bench.VARIANTS)
    assert figures["z_scratch_per_release"] == pytest.approx(figures["z_eff"] * 6**0.5)
    assert (tmp_path / "fig.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="--window 9 is larger than the stream"):
        bench.run(parser.parse_args(["--blocks", "6", "--window", "9", "--plot", ""]))


@pytest.mark.parametrize("variant,models", [("sampled", 4), ("alg5", 2)])
def test_tiny_variant_runs(tmp_path, variant, models):
    # --variant sampled: each strategy beside its sampled variant; alg5: the dyadic window beside Alg. 5 as written.
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    argv = ["--variant", variant, "--blocks", "6", "--rows-per-block", "150", "--trials", "1", "--window", "3"]
    figures = bench.run(parser.parse_args([*argv, "--plot", str(tmp_path / "fig.png")]))
    assert set(figures["excess_median_by_t"]) == {*bench.COMPARISONS[variant], "scratch"}
    assert len(figures["z"]) == models and figures["audit_ok"]
    assert all(0.5 < r <= 1 + 1e-9 for r in figures["max_block_loss_over_bound"].values())
    assert figures["block_epsilon_charged"] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert (tmp_path / "fig.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="--variant sampled compares taxi runs"):
        bench.run(parser.parse_args(["--dataset", "digits", "--variant", "sampled", "--plot", ""]))


def test_tiny_digits_run(tmp_path):
    # The REAL scikit-learn digits (10 classes) through the softmax release, two epsilons, one seed.
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--dataset",
            "digits",
            "--blocks",
            "3",
            "--rows-per-block",
            "256",
            "--window",
            "2",
            "--epsilons",
            "1,10",
            "--trials",
            "1",
            "--plot",
            str(tmp_path / "fig.png"),
        ]
    )
    figures = bench.run(args)
    assert figures["audit_ok"] and figures["block_charge_over_epsilon"] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert set(figures["accuracy_median_by_t"]) == {"1", "10"}
    for curves in figures["accuracy_median_by_t"].values():
        assert all(len(c) == 3 and 0 <= min(c) <= max(c) <= 1 for c in curves.values())
    assert figures["non_private_last_quarter_accuracy"] > 0.6  # chance is 0.1
    assert (tmp_path / "fig.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="digits' training part holds"):
        bench.run(parser.parse_args(["--dataset", "digits", "--rows-per-block", "256", "--blocks", "9", "--plot", ""]))
