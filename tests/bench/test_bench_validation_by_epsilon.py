"""sage bench validation --by-epsilon: the paper's §5.1 (a plain TFX evaluator vs Sage SLA) over epsilon."""

import argparse
import json

import pytest

from sage_tfx.bench import _validation_epsilons as sweep
from sage_tfx.bench import validation as bench


def _args(*extra):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(
        ["--trials", "3", "--max-iterations", "2", "--holdout", "5000", "--reference-rows", "20000"]
        + ["--start-rows", "2000", "--etas", "0.05", *extra]
    )


def test_by_epsilon_runs_small_and_plots(tmp_path):
    figures = bench.run(_args("--by-epsilon", "0.5,2", "--plot", str(tmp_path / "by_epsilon.png")))
    assert (tmp_path / "by_epsilon.png").stat().st_size > 1000
    json.dumps(figures, allow_nan=False)
    assert "GENERATED" in figures["data"] and figures["settings"]["epsilons"] == [0.5, 2.0]
    for task in ("taxi_mse", "taxi_accuracy"):
        rows = figures[task]["by_epsilon"]
        assert set(rows) == {"0.5", "2.0"}
        for row in rows.values():
            assert set(row["0.05"]) == {"no_sla", "sage"}
            for cell in row["0.05"].values():
                assert 0 <= cell["violations"] <= cell["accepted"] <= 3
                thirds = cell["by_target"].values()
                assert sum(t["accepted"] for t in thirds) == cell["accepted"]
                assert sum(t["violations"] for t in thirds) == cell["violations"]


def test_summarize_counts_rates_and_target_thirds():
    counts = {
        ("no_sla", 0.05): {"accepted": 4, "violations": 2, "iterations": 5, "by_target": [[2, 0], [1, 1], [1, 1]]}
    }
    row = sweep.summarize(counts, trials=8)["0.05"]["no_sla"]
    assert row["violation_rate"] == 0.5 and row["accept_rate"] == 0.5
    assert row["by_target"]["hard"] == pytest.approx({**row["by_target"]["hard"], "violation_rate": 1.0})
    assert row["by_target"]["easy"]["violation_rate"] == 0.0 and row["violation_rate_upper95"] > 0.5


@pytest.mark.parametrize("text", ["0", "-1,1", "inf", ","])
def test_by_epsilon_refuses_a_bad_epsilon_before_any_trial(capsys, text):
    with pytest.raises(SystemExit) as exc:
        _args(f"--by-epsilon={text}")  # "=": argparse reads "-1,1" after a space as an option
    assert exc.value.code == 2 and f"argument --by-epsilon: {text!r}: " in capsys.readouterr().err
