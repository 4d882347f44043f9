"""GENERATED taxi-like rows (hour of day, speed in mph) for tests and the group-by-mean benchmark.

Small and self-contained on purpose (numpy and stdlib only). The distributions are
fitted to the 15,002 real Chicago taxi trips that ship inside the tfx wheel
(tfx/examples/chicago_taxi_pipeline/data/simple/data.csv, read with importlib.resources):

- hour of day: the empirical frequency of trip_start_hour;
- speed = trip_miles / (trip_seconds / 3600) per hour of day: a log-normal fitted to
  the trips with a plausible speed (0 < speed <= 100 mph, at least 60 s), and, with
  the real data's frequency of implausible speeds (above 100 mph: GPS and meter
  glitches), an outlier drawn uniformly in (100, 1000] mph, which clipping must absorb.

Any figure computed from these rows comes from generated data: say so (GENERATED_LABEL).
"""

import csv
import functools
import importlib.resources
import io

import numpy as np

TAXI_CSV = "examples/chicago_taxi_pipeline/data/simple/data.csv"
GENERATED_LABEL = (
    "generated data: hour ~ empirical, speed ~ log-normal per hour plus glitch outliers, "
    "fitted to the 15,002 real Chicago taxi trips in the tfx wheel"
)
NKEYS = 24
MAX_PLAUSIBLE_MPH = 100.0


def read_taxi_trips():
    """(hour, miles, seconds) arrays of the real trips with all three fields present."""
    text = (importlib.resources.files("tfx") / TAXI_CSV).read_text()
    hours, miles, seconds = [], [], []
    for row in csv.DictReader(io.StringIO(text)):
        if row["trip_start_hour"] and row["trip_miles"] and row["trip_seconds"]:
            hours.append(int(row["trip_start_hour"]))
            miles.append(float(row["trip_miles"]))
            seconds.append(float(row["trip_seconds"]))
    return np.array(hours, dtype=np.int64), np.array(miles), np.array(seconds)


@functools.lru_cache(maxsize=1)
def taxi_speed_model():
    """The fitted model: hour probabilities, per-hour log-normal (mu, sigma), outlier fraction."""
    hours, miles, seconds = read_taxi_trips()
    moving = (miles > 0) & (seconds >= 60)
    speed = np.where(moving, miles / np.maximum(seconds, 1.0) * 3600.0, np.nan)
    plausible = moving & (speed <= MAX_PLAUSIBLE_MPH)
    outlier_fraction = float(np.mean(moving & (speed > MAX_PLAUSIBLE_MPH)) / max(np.mean(moving), 1e-12))
    hour_probs = np.bincount(hours, minlength=NKEYS).astype(np.float64)
    hour_probs /= hour_probs.sum()
    log_speed = np.log(speed[plausible])
    all_mu, all_sigma = float(log_speed.mean()), float(log_speed.std())
    mu, sigma = np.full(NKEYS, all_mu), np.full(NKEYS, all_sigma)
    for h in range(NKEYS):
        in_hour = log_speed[hours[plausible] == h]
        if len(in_hour) >= 20:  # too few trips: keep the all-hours fit
            mu[h], sigma[h] = in_hour.mean(), max(in_hour.std(), 1e-3)
    return {
        "hour_probs": hour_probs,
        "log_mu": mu,
        "log_sigma": sigma,
        "outlier_fraction": outlier_fraction,
        "fitted_on_trips": int(plausible.sum()),
    }


def generate_taxi_speeds(rows, seed=0):
    """GENERATED (hour int64 [rows], speed_mph float64 [rows]) drawn from `taxi_speed_model()`."""
    model = taxi_speed_model()
    rng = np.random.default_rng(seed)
    hours = rng.choice(NKEYS, size=rows, p=model["hour_probs"]).astype(np.int64)
    speeds = rng.lognormal(model["log_mu"][hours], model["log_sigma"][hours])
    glitch = rng.random(rows) < model["outlier_fraction"]
    speeds[glitch] = rng.uniform(MAX_PLAUSIBLE_MPH, 10 * MAX_PLAUSIBLE_MPH, size=int(glitch.sum()))
    return hours, speeds


def exact_clipped_means(keys, values, nkeys, value_range):
    """The non-private truth dp_group_by_mean estimates: per-key mean of clip(value, 0, R) (NaN for empty keys)."""
    clipped = np.clip(np.nan_to_num(values, nan=0.0), 0.0, value_range)
    counts = np.bincount(keys, minlength=nkeys).astype(np.float64)
    sums = np.bincount(keys, weights=clipped, minlength=nkeys)
    with np.errstate(invalid="ignore", divide="ignore"):
        return counts, sums, sums / counts
