"""sage bench dp-quality: a small end-to-end run on the real taxi trips (imports TensorFlow)."""

import argparse

import pytest

from sage_tfx.bench import dp_quality as bench

pytestmark = pytest.mark.tf


def test_small_run_end_to_end(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--models",
            "linear,logistic",
            "--epsilons",
            "3",
            "--seeds",
            "1",
            "--epochs",
            "1",
            "--plot",
            str(tmp_path / "fig.png"),
        ]
    )
    figures = bench.run(args)
    lin, logit = figures["linear"], figures["logistic"]
    assert lin["metric"] == "mse" and logit["metric"] == "accuracy"
    # the non-private baselines learn on the real trips: well below the constant predictor / above majority
    assert lin["nonprivate"] < 0.5 * lin["trivial"] and logit["nonprivate"] > logit["trivial"] + 0.05
    assert lin["ratio"]["3"] == pytest.approx(lin["dp"]["3"] / lin["nonprivate"], rel=1e-2)
    assert 0 < logit["dp"]["3"] <= 1 and (tmp_path / "fig.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="not one of"):
        bench.run(parser.parse_args(["--models", "forest"]))
