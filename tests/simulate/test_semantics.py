"""`sage simulate --semantics`: pipelines granted under event, user-time and user DP, on the real ledger."""

import json
import math

import numpy as np
import pytest

from sage_tfx.cli import main as sage_main
from sage_tfx.simulate import SimConfig
from sage_tfx.simulate.semantics import SEMANTICS, UnitConfig, block_rows, kept_per_unit, run_semantics


@pytest.mark.parametrize("lam, k", [(0.08, 3), (2.0, 1), (4.0, 3), (30.0, 5)])
def test_kept_rows_are_the_mean_of_a_bounded_poisson(lam, k):
    draws = np.minimum(np.random.default_rng(0).poisson(lam, 400_000), k)
    assert kept_per_unit(lam, k) == pytest.approx(draws.mean(), abs=5 * draws.std() / math.sqrt(len(draws)) + 1e-6)
    assert kept_per_unit(lam, 10_000) == pytest.approx(lam)  # a bound no unit reaches keeps every row


def test_the_blocks_of_each_semantics():
    config, units = SimConfig(), UnitConfig(units=1000, max_rows=2, shards=10)
    assert block_rows("event", config, units, 100) == (0, 16_000)
    assert block_rows("user-time", config, units, 100) == (0, int(1000 * kept_per_unit(16.0, 2)))
    assert block_rows("user", config, units, 100) == (10, int(1000 * kept_per_unit(1600.0, 2) / 10))  # 200 each


def test_stronger_semantics_grant_fewer_pipelines_and_runs_are_deterministic():
    runs = {s: run_semantics(s, 2.0, 72, seed=1) for s in SEMANTICS}
    granted = [runs[s]["granted"] for s in SEMANTICS]
    assert granted[0] >= granted[1] >= granted[2] and granted[0] > granted[2]
    assert all(r["pipelines"] == runs["event"]["pipelines"] for r in runs.values())  # one workload
    assert run_semantics("user", 2.0, 72, seed=1) == runs["user"]
    assert runs["user-time"]["per_row_epsilon"] == pytest.approx(0.1 / 3)  # group privacy: epsilon / K


def test_the_cli_prints_each_semantics_and_refuses_a_bad_unit_parameter(capsys, tmp_path):
    args = ["simulate", "--semantics", "--rates", "1", "--hours", "24", "--timeout-h", "6"]
    assert sage_main([*args, "--json", "--plot", str(tmp_path / "sem.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["semantics"] for r in out["results"]] == list(SEMANTICS)
    assert (tmp_path / "sem.png").stat().st_size > 0
    assert sage_main([*args, "--max-rows-per-unit", "0"]) == 2
    assert "max_rows=0 must be an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse's usage error, before anything runs
        sage_main([*args, "--rates", "-1"])
    assert exc.value.code == 2 and "argument --rates: '-1': '-1' is not a finite number > 0" in capsys.readouterr().err
