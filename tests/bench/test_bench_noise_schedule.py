"""sage bench noise-schedule: a tiny end-to-end run on the real taxi trips (imports TensorFlow)."""
import argparse

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
