"""The real taxi rows load from the tfx wheel; the generator's marginals match them (generated rows are labelled)."""

import numpy as np
import pytest

from sage_tfx.data.generator import TaxiGenerator, TaxiModel
from sage_tfx.data.taxi import TAXI_SCHEMA, TRIP_KEY, load_all_taxi, load_taxi, row_keys, taxi_csv_path


def test_real_files_load_with_empty_fields():
    simple, external = load_taxi("simple"), load_taxi("external")
    assert (simple.num_rows, external.num_rows) == (15002, 10000)
    assert simple.column_names == list(TAXI_SCHEMA)
    assert "big_tipper" in load_taxi("big_tipper").column_names
    assert simple.column("company").null_count > 0  # empty fields are nulls
    with pytest.raises(ValueError, match="'nope' is unknown"):
        taxi_csv_path("nope")


def test_external_rows_are_simple_trips_counted_once():
    """The wheel's 25,002 rows are 15,002 distinct trips: every external row is also a row of simple."""
    simple, external = load_taxi("simple"), load_taxi("external")
    trips = set(row_keys(simple, TRIP_KEY))
    assert len(trips) == simple.num_rows == 15002
    assert sum(key in trips for key in row_keys(external, TRIP_KEY)) == external.num_rows == 10000
    full = set(row_keys(simple))  # full rows: coordinates rounded to 6 decimals (external has float noise)
    assert all(key in full for key in row_keys(external))
    every = load_all_taxi()
    assert every.num_rows == 15002 and set(row_keys(every)) == full
    assert TaxiModel.fit().params["fitted_rows"] == 15002


@pytest.fixture(scope="module")
def both():
    real = load_all_taxi().to_pandas()
    model = TaxiModel.fit()
    gen = TaxiGenerator(model, seed=7, rows_per_day=50_000).table(200_000).to_pandas()
    return real, gen, model


def test_generated_rows_are_labelled_and_steady(both):
    _, gen, _ = both
    assert (gen["generated"] == 1).all()
    per_day = np.bincount((gen["trip_start_timestamp"] - gen["trip_start_timestamp"].min()) // 86400)
    assert per_day.tolist() == [50_000] * 4  # a steady rate
    assert (gen["trip_start_timestamp"] % 900 == 0).all()  # 15-minute slots, as in the real data


def test_generated_marginals_match_real(both):
    """Fixed seed; tolerances are several times the generator-vs-real gaps measured at fit time."""
    real, gen, _ = both
    for col, tol in (("fare", 0.10), ("trip_miles", 0.10), ("trip_seconds", 0.10), ("tips", 0.15)):
        assert abs(gen[col].mean() / real[col].mean() - 1) < tol, col
    assert abs(gen["trip_seconds"].median() - real["trip_seconds"].median()) <= 120
    assert abs((gen["tips"] > 0).mean() - (real["tips"] > 0).mean()) < 0.02
    assert abs((gen["trip_miles"] == 0).mean() - (real["trip_miles"] == 0).mean()) < 0.02
    hours = lambda d: np.bincount(d["trip_start_hour"], minlength=24) / len(d)  # noqa: E731
    assert 0.5 * np.abs(hours(gen) - hours(real)).sum() < 0.03  # total variation of the hour histogram
    real_pay = real["payment_type"].value_counts(normalize=True)
    gen_pay = gen["payment_type"].value_counts(normalize=True)
    assert abs(real_pay["Cash"] - gen_pay["Cash"]) < 0.02


def test_generated_duration_depends_on_distance_and_hour(both):
    real, gen, model = both
    assert model.params["seconds_b_miles"] > 0
    pos = gen[(gen.trip_miles > 0) & (gen.trip_seconds > 0)]
    r = np.corrcoef(np.log1p(pos.trip_miles), np.log(pos.trip_seconds))[0, 1]
    realpos = real[(real.trip_miles > 0) & (real.trip_seconds > 0)]
    r_real = np.corrcoef(np.log1p(realpos.trip_miles), np.log(realpos.trip_seconds))[0, 1]
    assert abs(r - r_real) < 0.15
    # Longer trips cost more; card trips are the tipped ones.
    assert gen.groupby(gen.trip_miles > 5).fare.mean()[True] > 2 * gen.groupby(gen.trip_miles > 5).fare.mean()[False]
    assert (gen[gen.payment_type == "Cash"].tips > 0).mean() < 0.01


def test_chunks_are_reproducible_and_bad_input_named():
    g = TaxiGenerator(seed=1, chunk_rows=1000)
    a, b = g.table(2500), TaxiGenerator(g.model, seed=1, chunk_rows=1000).table(2500)
    assert a.equals(b)
    for bad in (0, -5, 1.5):
        with pytest.raises(ValueError, match=repr(bad)):
            TaxiGenerator(g.model, rows_per_day=bad)
    with pytest.raises(ValueError, match="'2017-13-01'"):
        TaxiGenerator(g.model, start="2017-13-01")
