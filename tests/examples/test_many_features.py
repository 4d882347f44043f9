"""examples/flights/many_features.py (docs/your_pipeline.md, "Many features"): AdaSSP on one-hot features of the
REAL flights, at a small size: its JSON, and the bounds and ridges the docs explain."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "flights", "many_features.py")


def test_help_names_the_options():
    out = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for option in ("--sizes", "--seeds", "--epsilon", "--delta", "--encoding-share", "--categoricals", "--models"):
        assert option in out.stdout


def _script():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import many_features
    finally:
        sys.path.pop(0)
    return many_features


def test_the_bounds_hold_for_every_real_row(capsys):
    """The docs' bounds: a row's one-hot part has norm sqrt(m) exactly (one 1 per block, whatever its width), the
    centred row (0.5 for the delay, 1/k in a k-column block) is within the right_centred bound; and the non-private
    references run without TensorFlow."""

    mf = _script()
    train, test = mf.load(mf.CATEGORICALS)
    assert len(train["y"]) == 300_326 and len(test["y"]) == 27_020
    rows = np.arange(len(train["y"]))
    x = mf.one_hot_matrix(train, rows, mf.CATEGORICALS)
    assert x.shape[1] == 1 + 17 + 4 + 24 and np.all((x[:, 0] >= 0) & (x[:, 0] <= 1))
    assert np.allclose(np.linalg.norm(x[:, 1:], axis=1), math.sqrt(3))
    center = np.concatenate([[0.5]] + [np.full(mf.depth(n), 1.0 / mf.depth(n)) for n in mf.CATEGORICALS])
    bound = math.sqrt(0.25 + sum((mf.depth(n) - 1) / mf.depth(n) for n in mf.CATEGORICALS))
    assert np.linalg.norm(x - center, axis=1).max() <= bound + 1e-12
    assert mf.main(["--sizes", "1000", "--seeds", "2", "--models", "least_squares", "mean"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert rows["least_squares"]["clipped_mse"] < rows["mean"]["clipped_mse"] <= 3600


@pytest.mark.slow
@pytest.mark.tf
def test_small_run_reports_the_bounds_and_the_ridge(capsys):
    """DPLinearRegressor (imports TensorFlow: about 17 s alone on 2 cores, hence slow)."""
    many_features = _script()
    assert (
        many_features.main(
            [
                "--sizes",
                "1000",
                "--seeds",
                "2",
                "--models",
                "naive",
                "right",
                "target_encoding",
                "least_squares",
                "mean",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["held_out_rows"] == 27_020 and report["one_hot_columns"] == 17 + 4 + 24
    rows = {r["model"]: r for r in report["results"]}
    assert set(rows) == {"naive", "right", "target_encoding", "least_squares", "mean"}
    # B_x^2 with the intercept column: d + 1 for the naive bound over d = 46 columns, m + 1 + 1 for the right one
    assert rows["naive"]["bx2"] == pytest.approx(46 + 1) and rows["right"]["bx2"] == pytest.approx(3 + 1 + 1)
    assert rows["target_encoding"]["bx2"] == pytest.approx(4 / 4 + 1)
    # the ridge scales with B_x^2 and grows with d: the naive bound's is about 9x the right one's (same d), whose is
    # about 8x the target encoding's (B_x^2 5 vs 2, d 47 vs 5, and more noise at the smaller epsilon)
    assert (
        rows["naive"]["ridge"] > 8 * rows["right"]["ridge"]
        and rows["right"]["ridge"] > 4 * rows["target_encoding"]["ridge"]
    )
    for row in rows.values():
        assert math.isfinite(row["clipped_mse"]) and 0 < row["clipped_mse"] <= 3600 and row["mse"] >= row["clipped_mse"]
    assert rows["least_squares"]["clipped_mse"] < rows["mean"]["clipped_mse"]
