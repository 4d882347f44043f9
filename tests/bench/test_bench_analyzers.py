"""sage bench analyzers: a tiny end-to-end run (GENERATED rows; imports TensorFlow, tf.Transform, Beam).
Checks the JSON keys and that the values are sane, never speed."""

import argparse
import json

import pytest

from sage_tfx.bench import analyzers as bench

pytestmark = pytest.mark.tf


def _parse(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.slow  # every analyzer's Beam job, DP and tf.Transform's: 56 s alone at load 10
def test_tiny_run_keys_and_sanity():
    # 20,000 rows in 4 batches; epsilon 10 so that the DP figures are close to the exact ones at this size
    figures = bench.run(
        _parse("--rows", "20000", "--batch-rows", "5000", "--repeats", "1", "--epsilon", "10", "--no-warmup")
    )
    json.dumps(figures)  # --json can print it
    assert figures["rows"] == 20000 and "GENERATED" in figures["data"]
    exact = figures["exact"]
    assert 0 <= exact["min"] < exact["q01"] < exact["mean"] < exact["q99"] < exact["max"] <= 100
    for name in bench.ANALYZERS:
        f = figures[name]
        assert f["dp_seconds"] > 0 and f["tft_seconds"] > 0
        assert f["ratio"] == pytest.approx(f["dp_seconds"] / f["tft_seconds"], rel=1e-2)
        assert len(f["dp_seconds_all"]) == len(f["tft_seconds_all"]) == 1
    assert figures["max_ratio"] == max(figures[n]["ratio"] for n in bench.ANALYZERS)

    z = figures["z_score"]  # tft's mean / std are exact; DP's within a few percent of the std at epsilon 10
    assert z["tft_mean_abs_error"] < 1e-3 * exact["std"] and z["tft_std_abs_error"] < 1e-3 * exact["std"]
    assert z["dp_mean_abs_error"] < 0.05 * exact["std"] and z["dp_std_abs_error"] < 0.05 * exact["std"]
    s01 = figures["scale_0_1"]  # tft: min / max; DP: about the 1% / 99% quantiles
    assert s01["tft_lo"] == pytest.approx(exact["min"], abs=1e-3) and s01["tft_hi"] == pytest.approx(
        exact["max"], abs=1e-3
    )
    assert abs(s01["dp_lo_rank"] - 0.01) < 0.01 and abs(s01["dp_hi_rank"] - 0.99) < 0.01
    assert 0 <= s01["dp_mean_abs_output_difference"] < 0.2
    q = figures["quantiles"]
    assert len(q["dp_boundaries"]) == len(q["tft_boundaries"]) == bench.NUM_BUCKETS - 1
    assert q["dp_boundaries"] == sorted(q["dp_boundaries"])
    assert q["tft_max_rank_error"] < 0.02 and q["dp_max_rank_error"] < 0.05
    b = figures["bucketize"]
    assert b["tft_max_share_error"] < 0.02 and b["dp_max_share_error"] < 0.05
    assert 0 < figures["vocabulary"]["dp_size"] <= bench.TOP_K
    v = figures["compute_and_apply_vocabulary"]
    assert v["tft_size"] == bench.TOP_K
    assert v["tft_recall_top100"] == v["tft_recall_top1000"] == v["tft_precision_top1000"] == 1.0
    assert 0 < v["dp_size"] <= bench.TOP_K
    assert v["dp_recall_top100"] > 0.9 and v["dp_precision_top1000"] > 0.9
    assert 0 < v["dp_row_coverage"] <= v["tft_row_coverage"] + 1e-9 <= 1 + 1e-9


def test_bad_arguments_name_the_value():
    with pytest.raises(SystemExit, match="--rows must be >= 1, got 0"):
        bench.run(_parse("--rows", "0"))
    with pytest.raises(SystemExit, match="'median' is not one of"):
        bench.run(_parse("--analyzers", "median"))
