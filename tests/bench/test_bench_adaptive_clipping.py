"""sage bench adaptive-clipping: a tiny end-to-end run on its GENERATED imbalanced task (imports TensorFlow)."""

import argparse

import numpy as np
import pytest

from sage_tfx.bench import adaptive_clipping as bench

pytestmark = pytest.mark.tf


def test_generated_task_has_twelve_percent_positives():
    x, y, xt, yt = bench.generated_task(20000)
    assert x.shape == (20000, bench.DIM) and len(yt) == bench.TEST_ROWS
    assert abs(float(np.mean(np.concatenate([y, yt]))) - 0.12) < 0.01  # 25,000 draws: 4.6 s.d.


def test_tiny_run_end_to_end(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--rows", "2048", "--epochs", "1", "--seeds", "1", "--plot", str(tmp_path / "f.png")])
    figures = bench.run(args)
    assert "GENERATED" in figures["data"] and figures["steps"] == 4
    epsilons = {figures[v]["epsilon"] for v in bench.VARIANTS}
    assert len(epsilons) == 1 and 0.499 <= epsilons.pop() <= 0.5  # the same budget for every variant
    assert figures["fixed"]["final_clip_norm"] == 1.0 and figures["imbalanced"]["final_clip_norm"] != 1.0
    for variant in bench.VARIANTS:
        assert 0 < figures[variant]["fitted_positive_rate"] < 1 and figures[variant]["log_loss"] > 0
    assert (tmp_path / "f.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="--rows >= 1024"):
        bench.run(parser.parse_args(["--rows", "10", "--plot", ""]))
