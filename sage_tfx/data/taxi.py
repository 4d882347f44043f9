"""The real Chicago taxi trips that ship inside the tfx wheel (no downloads at run time).

Three files share one schema (some fields are empty): ``simple`` (15,002 trips),
``big_tipper`` (the same 15,002 trips plus a ``big_tipper`` label) and ``external``
(10,000 rows from TFX's test data). The ``external`` rows are NOT other trips:
every one of them is also a row of ``simple`` (same timestamp, seconds, miles,
fare and census tracts; only the last float digits of some coordinates differ),
so the wheel holds 15,002 distinct real trips in all (``load_all_taxi``), and
``external`` can never serve as held-out data for a run that reads ``simple``.
Timestamps are Chicago local time written as unix seconds, rounded to 15
minutes; trip_start_day is 1=Sunday.
"""

import importlib.resources

import numpy as np

TAXI_FILES = {
    "simple": "examples/chicago_taxi_pipeline/data/simple/data.csv",
    "big_tipper": "examples/chicago_taxi_pipeline/data/big_tipper_label/data.csv",
    "external": "components/testdata/external/csv/data.csv",
}

TIME_COLUMN = "trip_start_timestamp"

# Column -> kind, in the order of the shipped CSV header.
TAXI_SCHEMA = {
    "pickup_community_area": "int",
    "fare": "float",
    "trip_start_month": "int",
    "trip_start_hour": "int",
    "trip_start_day": "int",
    "trip_start_timestamp": "int",
    "pickup_latitude": "float",
    "pickup_longitude": "float",
    "dropoff_latitude": "float",
    "dropoff_longitude": "float",
    "trip_miles": "float",
    "pickup_census_tract": "int",
    "dropoff_census_tract": "int",
    "payment_type": "string",
    "company": "string",
    "trip_seconds": "float",
    "dropoff_community_area": "int",
    "tips": "float",
}


def taxi_csv_path(name="simple"):
    """Filesystem path of a shipped taxi CSV (``simple``, ``big_tipper`` or ``external``)."""
    if name not in TAXI_FILES:
        raise ValueError(f"taxi data set {name!r} is unknown: use one of {', '.join(TAXI_FILES)}")
    path = importlib.resources.files("tfx").joinpath(TAXI_FILES[name])
    if not path.is_file():
        raise FileNotFoundError(f"taxi data set {name!r} is missing from the installed tfx wheel ({path})")
    return str(path)


def arrow_schema(with_generated=False):
    """The taxi schema as a pyarrow schema (nullable ints, float64, strings)."""
    import pyarrow as pa

    kinds = {"int": pa.int64(), "float": pa.float64(), "string": pa.string()}
    fields = [pa.field(name, kinds[kind]) for name, kind in TAXI_SCHEMA.items()]
    if with_generated:
        fields.append(pa.field("generated", pa.int64()))
    return pa.schema(fields)


def load_taxi(name="simple"):
    """The real trips as a pyarrow Table with the taxi schema (empty fields are nulls)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    schema = arrow_schema()
    table = pacsv.read_csv(
        taxi_csv_path(name),
        convert_options=pacsv.ConvertOptions(
            column_types={f.name: (pa.float64() if f.type == pa.int64() else f.type) for f in schema},
            strings_can_be_null=True,
        ),
    )
    # Integer columns are read as float first (some files write 8.0) and cast exactly.
    cols = {}
    for f in schema:
        col = table.column(f.name)
        cols[f.name] = col.cast(f.type) if f.type != col.type else col
    extra = [n for n in table.column_names if n not in cols]
    for n in extra:
        cols[n] = table.column(n)
    return pa.table(cols)


# The columns that identify a trip (as the overlap of ``external`` with ``simple`` was checked).
TRIP_KEY = ("trip_start_timestamp", "trip_seconds", "trip_miles", "fare", "pickup_census_tract", "dropoff_census_tract")
COORDINATE_DECIMALS = 6  # ``external`` writes some coordinates with float noise past the 9th decimal


def row_keys(table, columns=None):
    """One hashable key per row of ``table``: the values of ``columns`` (default: every column of the taxi
    schema, i.e. the full row), floats rounded to ``COORDINATE_DECIMALS`` decimals, nulls as None."""

    columns = list(TAXI_SCHEMA) if columns is None else list(columns)
    values = []
    for name in columns:
        col = table.column(name).to_pylist()
        if TAXI_SCHEMA.get(name) == "float":
            col = [None if v is None or not np.isfinite(v) else round(float(v), COORDINATE_DECIMALS) for v in col]
        values.append(col)
    return list(zip(*values))


def distinct_rows(table, columns=None):
    """``table`` without the rows whose ``row_keys`` already appeared (the first copy is kept)."""
    import pyarrow as pa

    seen, keep = set(), []
    for i, key in enumerate(row_keys(table, columns)):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return table.take(pa.array(keep, pa.int64()))


def load_all_taxi():
    """Every distinct real trip of the tfx wheel (the generator's fitting set): 15,002 trips.

    ``simple`` and ``external`` together, each trip once (by ``row_keys``, the full row): every ``external``
    row is also a row of ``simple``, so this is the ``simple`` file's 15,002 trips, not 25,002.
    """
    import pyarrow as pa

    return distinct_rows(pa.concat_tables([load_taxi("simple"), load_taxi("external")]))
