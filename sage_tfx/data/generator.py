"""A taxi-like stream GENERATED from distributions fitted to the real Chicago taxi rows.

``TaxiModel.fit`` fits the model to the 15,002 distinct real trips shipped in the tfx wheel; the generator
makes ``rows_per_day`` rows a day in vectorized chunks, chunk k from its own seeded generator (seed, k).
Contract: every generated row carries ``generated = 1``, and every figure computed from these rows must say
"generated". The model, column by column, and its measured fit: docs/growing_database.md, "Real and
generated data".
"""

import datetime as _dt
import json
import math

import numpy as np

from .taxi import TAXI_SCHEMA, arrow_schema, load_all_taxi

DEFAULT_START = "2017-01-01"
FLAG_DROP = 3.25


def _categorical(values):
    """Frequencies of a column's values (None for missing), as (values, probs)."""
    vals, counts = np.unique(
        np.array(["\x00" if v is None else str(v) for v in values], dtype=object), return_counts=True
    )
    return [None if v == "\x00" else v for v in vals], (counts / counts.sum()).tolist()


class TaxiModel:
    """Fitted parameters, JSON-serializable (``to_dict`` / ``from_dict``)."""

    def __init__(self, params):
        self.params = params

    def to_dict(self):
        return json.loads(json.dumps(self.params))

    @classmethod
    def from_dict(cls, params):
        return cls(dict(params))

    @classmethod
    def fit(cls, table=None):
        """Fit to a pyarrow Table of real taxi rows (default: the 15,002 distinct shipped real trips)."""
        if table is None:
            table = load_all_taxi()
        col = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}

        def num(name):
            return np.asarray(col[name], dtype=float)

        hour = num("trip_start_hour").astype(int)
        miles, secs, fare, tips = num("trip_miles"), num("trip_seconds"), num("fare"), num("tips")
        p = {}
        p["hour_probs"] = (np.bincount(hour, minlength=24) / len(hour)).tolist()

        pos_miles = miles[miles > 0]
        p["miles_zero"] = float(np.mean(miles == 0))
        p["miles_log_mu"], p["miles_log_sigma"] = float(np.mean(np.log(pos_miles))), float(np.std(np.log(pos_miles)))
        p["miles_max"] = float(np.quantile(pos_miles, 0.999))

        ok = np.isfinite(secs) & (secs > 0)
        p["seconds_zero"] = float(np.mean(~ok))
        design = np.column_stack([np.log1p(miles[ok]), np.eye(24)[hour[ok]]])
        coef, *_ = np.linalg.lstsq(design, np.log(secs[ok]), rcond=None)
        resid = np.log(secs[ok]) - design @ coef
        p["seconds_b_miles"], p["seconds_hour"] = float(coef[0]), coef[1:].tolist()
        p["seconds_sigma"] = float(np.std(resid))
        p["seconds_max"] = float(np.quantile(secs[ok], 0.999))

        secs0 = np.nan_to_num(secs)
        ok = fare > 0
        design = np.column_stack([np.ones(ok.sum()), np.log1p(miles[ok]), np.log1p(secs0[ok] / 60.0)])
        coef, *_ = np.linalg.lstsq(design, np.log(fare[ok]), rcond=None)
        p["fare_coef"] = coef.tolist()
        p["fare_sigma"] = float(np.std(np.log(fare[ok]) - design @ coef))
        p["fare_max"] = float(np.quantile(fare, 0.999))

        payment = col["payment_type"]
        p["payment_values"], p["payment_probs"] = _categorical(payment)
        p["tip_prob"] = {v: float(np.mean(tips[payment == v] > 0)) for v in p["payment_values"]}
        tipped = (tips > 0) & (fare > 0)
        ratio = tips[tipped] / fare[tipped]
        p["tip_log_mu"], p["tip_log_sigma"] = float(np.mean(np.log(ratio))), float(np.std(np.log(ratio)))

        p["company_values"], p["company_probs"] = _categorical(col["company"])
        for side in ("pickup", "dropoff"):
            area = num(f"{side}_community_area")
            vals, probs = _categorical([None if math.isnan(a) else int(a) for a in area])
            p[f"{side}_area_values"] = [None if v is None else int(v) for v in vals]
            p[f"{side}_area_probs"] = probs
            lat, lon = num(f"{side}_latitude"), num(f"{side}_longitude")
            cent = {}
            for a in p[f"{side}_area_values"]:
                if a is None:
                    continue
                m = (area == a) & np.isfinite(lat)
                cent[str(a)] = [float(lat[m].mean()), float(lon[m].mean())] if m.any() else None
            p[f"{side}_centroids"] = cent
        tract = num("dropoff_census_tract")
        darea = num("dropoff_community_area")
        p["dropoff_tract_missing"] = float(np.mean(~np.isfinite(tract)))
        tracts = {}
        for a in p["dropoff_area_values"]:
            if a is None:
                continue
            t = tract[(darea == a) & np.isfinite(tract)]
            if len(t):
                v, c = np.unique(t, return_counts=True)
                tracts[str(a)] = int(v[np.argmax(c)])
        p["dropoff_tracts"] = tracts
        p["fitted_rows"] = int(table.num_rows)
        return cls(p)


class TaxiGenerator:
    """A steady stream of GENERATED taxi-like rows: ``rows_per_day`` trips per day from ``start``."""

    def __init__(self, model=None, seed=0, rows_per_day=100_000, start=DEFAULT_START, chunk_rows=100_000):
        if isinstance(rows_per_day, bool) or not isinstance(rows_per_day, int) or rows_per_day <= 0:
            raise ValueError(f"rows_per_day {rows_per_day!r} must be a positive integer")
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows <= 0:
            raise ValueError(f"chunk_rows {chunk_rows!r} must be a positive integer")
        self.model = model if model is not None else TaxiModel.fit()
        self.seed = int(seed)
        self.rows_per_day = rows_per_day
        self.chunk_rows = chunk_rows
        try:
            day = _dt.date.fromisoformat(str(start))
        except ValueError:
            raise ValueError(f"start {start!r} is not an ISO date (YYYY-MM-DD)") from None
        self.start = int(_dt.datetime(day.year, day.month, day.day, tzinfo=_dt.UTC).timestamp())

    def chunks(self, n_rows):
        """Yield pyarrow RecordBatches of at most ``chunk_rows`` rows, ``n_rows`` in all."""
        if isinstance(n_rows, bool) or not isinstance(n_rows, int) or n_rows < 0:
            raise ValueError(f"n_rows {n_rows!r} must be an integer >= 0")
        for k, first in enumerate(range(0, n_rows, self.chunk_rows)):
            yield self.chunk(k, first, min(self.chunk_rows, n_rows - first))

    def table(self, n_rows):
        import pyarrow as pa

        batches = list(self.chunks(n_rows))
        if not batches:
            return arrow_schema(with_generated=True).empty_table()
        return pa.Table.from_batches(batches)

    def chunk(self, k, first, n):
        """Rows first..first+n-1 of the stream, from generator (seed, k)."""
        import pyarrow as pa

        p = self.model.params
        rng = np.random.default_rng([self.seed, k])
        day = (first + np.arange(n)) // self.rows_per_day
        hour = rng.choice(24, size=n, p=np.asarray(p["hour_probs"]) / np.sum(p["hour_probs"]))
        ts = self.start + day * 86400 + hour * 3600 + rng.integers(0, 4, size=n) * 900
        dt = ts.astype("datetime64[s]")
        month = dt.astype("datetime64[M]").astype(int) % 12 + 1
        weekday = (dt.astype("datetime64[D]").astype(int) + 4) % 7  # 1970-01-01 was a Thursday; 0 = Sunday

        miles = np.exp(rng.normal(p["miles_log_mu"], p["miles_log_sigma"], n))
        miles = np.round(np.minimum(miles, p["miles_max"]), 1)
        miles[rng.random(n) < p["miles_zero"]] = 0.0

        log_s = (
            np.asarray(p["seconds_hour"])[hour]
            + p["seconds_b_miles"] * np.log1p(miles)
            + rng.normal(0.0, p["seconds_sigma"], n)
        )
        secs = np.clip(np.round(np.exp(log_s) / 60.0) * 60.0, 60.0, p["seconds_max"])
        secs[rng.random(n) < p["seconds_zero"]] = 0.0

        f0, f1, f2 = p["fare_coef"]
        fare = np.exp(f0 + f1 * np.log1p(miles) + f2 * np.log1p(secs / 60.0) + rng.normal(0.0, p["fare_sigma"], n))
        fare = np.round(np.clip(fare, FLAG_DROP, p["fare_max"]) * 20.0) / 20.0

        pay_idx = rng.choice(len(p["payment_values"]), size=n, p=p["payment_probs"])
        tip_prob = np.array([p["tip_prob"][v] for v in p["payment_values"]])[pay_idx]
        ratio = np.minimum(np.exp(rng.normal(p["tip_log_mu"], p["tip_log_sigma"], n)), 1.0)
        tips = np.where(rng.random(n) < tip_prob, np.round(fare * ratio, 2), 0.0)

        cols, tract = _area_columns(p, rng, n)

        def strings(values, probs):
            idx = rng.choice(len(values), size=n, p=probs)
            return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), pa.array(values, pa.string())).cast(
                pa.string()
            )

        cols.update(
            {
                "fare": pa.array(fare),
                "trip_start_month": pa.array(month.astype(np.int64)),
                "trip_start_hour": pa.array(hour.astype(np.int64)),
                "trip_start_day": pa.array((weekday + 1).astype(np.int64)),
                "trip_start_timestamp": pa.array(ts.astype(np.int64)),
                "trip_miles": pa.array(miles),
                "pickup_census_tract": pa.nulls(n, pa.int64()),
                "dropoff_census_tract": pa.array(tract, mask=tract < 0),
                "payment_type": pa.array(np.array(p["payment_values"], dtype=object)[pay_idx], pa.string()),
                "company": strings(p["company_values"], p["company_probs"]),
                "trip_seconds": pa.array(secs),
                "tips": pa.array(tips),
            }
        )
        names = list(TAXI_SCHEMA) + ["generated"]
        cols["generated"] = pa.array(np.ones(n, dtype=np.int64))
        return pa.record_batch([cols[c] for c in names], names=names)


def _area_columns(p, rng, n):
    """``TaxiGenerator.chunk``'s pickup and dropoff areas and their centroids (Arrow columns by name), and the
    dropoff census tract of each row (-1: none), drawn from ``rng`` in this order."""
    import pyarrow as pa

    cols = {}
    areas = {}
    for side in ("pickup", "dropoff"):
        values = p[f"{side}_area_values"]
        idx = rng.choice(len(values), size=n, p=p[f"{side}_area_probs"])
        area = np.array([-1 if v is None else v for v in values], dtype=np.int64)[idx]
        areas[side] = area
        cent = np.array(
            [
                p[f"{side}_centroids"].get(str(v)) or [np.nan, np.nan] if v is not None else [np.nan, np.nan]
                for v in values
            ],
            dtype=float,
        )[idx]
        cols[f"{side}_community_area"] = pa.array(area, mask=area < 0)
        cols[f"{side}_latitude"] = pa.array(cent[:, 0], mask=np.isnan(cent[:, 0]))
        cols[f"{side}_longitude"] = pa.array(cent[:, 1], mask=np.isnan(cent[:, 1]))
    tract_by_area = np.full(100, -1, dtype=np.int64)
    for a, t in p["dropoff_tracts"].items():
        tract_by_area[int(a)] = t
    tract = np.where(areas["dropoff"] >= 0, tract_by_area[np.maximum(areas["dropoff"], 0)], -1)
    tract[rng.random(n) < p["dropoff_tract_missing"]] = -1
    return cols, tract
