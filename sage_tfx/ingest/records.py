"""Rows as tf.Example bytes without TensorFlow: a stream's schema, the input checks, the readers and the content
digest (the input itself: ``inputs.py``; TFRecord files: ``tfrecords.py``).

A stream has one feature schema ({name: "int" | "float" | "bytes"}), fixed at
its first ingest and kept at DATA_ROOT/STREAM/_schema.json, so every block of
the stream has the same feature types. Empty fields become empty features, as
in TFX's CsvExampleGen. tf.Example floats are 32-bit: keep exact integers
(such as unix timestamps) in int columns.
"""

import csv
import hashlib
import io
import json

import numpy as np

from .inputs import FORMATS, InputError, arrow_source, input_format, is_url, open_input  # noqa: F401 (re-exported)
from .tfrecords import (  # noqa: F401 (re-exported)
    frame_tfrecords,
    iter_tfrecords,
    read_tfrecords,
    write_tfrecords,
)

KINDS = ("int", "float", "bytes")  # a stream's feature kinds (DPTransform's raw schema uses the same)
CSV_SAMPLE_BYTES = 16 << 20  # types of a new stream are inferred from the first 16 MiB of a CSV


def kind_of(arrow_type):
    """The tf.Example kind of an Arrow type (lists: of their items)."""
    import pyarrow as pa

    t = arrow_type
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_timestamp(t):
        return "int"
    if pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_null(t):
        return "float"
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_date(t)
    ):
        return "bytes"
    raise InputError(f"column type {arrow_type} has no tf.Example kind (int, float or bytes)")


def schema_of(arrow_schema):
    return {f.name: kind_of(f.type) for f in arrow_schema}


def _value_type(kind):
    import pyarrow as pa

    return {"int": pa.int64(), "float": pa.float32(), "bytes": pa.large_binary()}[kind]


def _csv_type(kind):
    """CSV ints are parsed as float64 and cast exactly later, so "180.0" fits an int column."""
    import pyarrow as pa

    return {"int": pa.float64(), "float": pa.float64(), "bytes": pa.string()}[kind]


def to_example_batch(batch, schema):
    """A RecordBatch whose columns are large_list<kind> in ``schema`` order (ready to encode)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    missing = [name for name in schema if name not in batch.schema.names]
    if missing:
        raise InputError(f"input lacks column(s) {', '.join(missing)} of the stream's schema")
    cols = []
    for name, kind in schema.items():
        col = batch.column(name)
        target = _value_type(kind)
        try:
            if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                col = col.cast(pa.large_list(target))
            else:
                col = _plain(col)
                valid = np.asarray(pc.is_valid(col), dtype=bool)
                offsets = np.concatenate([[0], np.cumsum(valid)]).astype(np.int64)
                values = col.drop_null().cast(target)
                col = pa.LargeListArray.from_arrays(pa.array(offsets), values, mask=pa.array(~valid))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InputError(f"column {name!r} does not fit the stream's {kind} type: {exc}") from None
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, names=list(schema))


def _plain(col):
    """A flat column's ISO date-times as int64 unix seconds and ISO dates as text; others as they are."""
    import pyarrow as pa

    if pa.types.is_timestamp(col.type):
        return col.cast(pa.timestamp("s")).cast(pa.int64())
    if pa.types.is_date(col.type):
        return col.cast(pa.string())
    return col


def typed_batch(batch, schema):
    """``batch`` (as ``read_batches`` yields it) with the stream's types in memory: int columns int64 (CSV ints
    are read as float64, ISO date-times as timestamps), dates as text, so ``schema_of`` of it is ``schema``
    and anything cut from it is typed alike. Float columns stay float64 (tf.Example's 32 bits come at
    ``to_example_batch``; block keys are computed before it)."""
    import pyarrow as pa

    cols = []
    for name, col in zip(batch.schema.names, batch.columns):
        kind = schema.get(name)
        if kind is not None and not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            try:
                col = _plain(col)
                col = col.cast(pa.int64()) if kind == "int" else col
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InputError(f"column {name!r} does not fit the stream's {kind} type: {exc}") from None
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, names=batch.schema.names)


def encode(batch, schema):
    """Serialized tf.Example bytes, one per row of ``batch``."""
    from tfx_bsl.coders import example_coder

    return example_coder.RecordBatchToExamples(to_example_batch(batch, schema))


def tfmd_schema(schema):
    """A serialized tensorflow_metadata Schema for decoding tf.Examples into Arrow."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    proto = schema_pb2.Schema()
    types = {"int": schema_pb2.INT, "float": schema_pb2.FLOAT, "bytes": schema_pb2.BYTES}
    for name, kind in schema.items():
        proto.feature.add(name=name, type=types[kind])
    return proto.SerializeToString()


def decode(records, schema):
    """tf.Example bytes -> RecordBatch of large_list columns (``schema`` order)."""
    from tfx_bsl.coders import example_coder

    return example_coder.ExamplesToRecordBatchDecoder(tfmd_schema(schema)).DecodeBatch(list(records))


# ------------------------------------------------------------------ readers
# ------------------------------------------------------------------ input checks
# Times a record may carry: [1000-01-01, 9000-01-01) UTC in unix seconds. A time in milliseconds or microseconds
# since 1970 lands far beyond it, and every block window stays inside what dates can name.
TIME_MIN = -30610224000
TIME_MAX = 221845392000
_F64_EXACT = 2**53  # CSV ints are parsed as float64: beyond it whole numbers are already rounded


def check_unique_columns(names, path):
    """Refuse a header that names a column twice (pyarrow keeps one of them silently)."""
    seen = {}
    for i, name in enumerate(names):
        if name in seen:
            raise InputError(
                f"input {path}: column {name!r} appears twice in the header (columns {seen[name] + 1} "
                f"and {i + 1}); one would be dropped silently: rename or remove one"
            )
        seen[name] = i


def check_csv_quotes(path, chunk_bytes=8 << 20):
    """Refuse a CSV line with an unclosed quote (pyarrow would merge it with the next lines into one record).

    Values may not span lines, so every line holds an even number of quote characters; the check is a
    vectorised pass over the raw bytes (``""`` escapes count twice and pass).
    """

    parity, line = 0, 1  # quotes seen on the current line (mod 2); its 1-based line number
    with open_input(path, decompress=True) as f:
        while True:
            chunk = f.read(chunk_bytes)
            if not chunk:
                break
            data = np.frombuffer(chunk, dtype=np.uint8)
            quotes = np.cumsum(data == 34, dtype=np.int64)  # '"'
            ends = np.flatnonzero(data == 10)  # '\n'
            if len(ends):
                at_end = quotes[ends]
                per_line = np.diff(np.concatenate([[0], at_end]))
                per_line[0] += parity
                odd = np.flatnonzero(per_line % 2)
                if len(odd):
                    _unclosed(path, line + int(odd[0]))
                line += len(ends)
                parity = int(quotes[-1] - at_end[-1]) % 2
            else:
                parity = (parity + int(quotes[-1])) % 2
    if parity:
        _unclosed(path, line)


def _unclosed(path, line_number):
    """Raise the unclosed-quote error with the column of the quote that never closes."""

    with (
        open_input(path, decompress=True) as raw,
        io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as f,
    ):
        header = next(csv.reader([f.readline()]), [])
        for _ in range(line_number - 2):
            f.readline()
        text = f.readline() if line_number > 1 else ""
    column, inside, start = 0, False, 0
    for ch in text:
        if ch == '"':
            inside = not inside
            if inside:
                start = column
        elif ch == "," and not inside:
            column += 1
    name = header[start] if start < len(header) else f"#{start + 1}"
    where = f"row {line_number - 1} (line {line_number})" if line_number > 1 else "the header (line 1)"
    raise InputError(
        f"input {path}: column {name!r}, {where}: a quote opens and never closes on its line; the "
        "rows after it would merge into one record: close the quote (write a quote inside a value "
        'as ""; values may not span lines)'
    )


def check_batch(batch, path, first_row, schema, time_column=None):
    """Refuse values a typed column must not hold, naming the file, the column and the (1-based) row.

    int and float columns: non-finite values (inf, nan), and CSV ints of 2^53 or more in magnitude; the time
    column: times outside [1000-01-01, 9000-01-01) UTC.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    def fail(name, index, value, problem, fix):
        raise InputError(
            f"input {path}: column {name!r}, row {first_row + int(index) + 1}: value {value!r} {problem}: {fix}"
        )

    for name, kind in schema.items():
        if kind == "bytes" or name not in batch.schema.names:
            continue
        col = batch.column(name)
        rows = None
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            rows = np.asarray(pc.list_parent_indices(col))
            col = pc.list_flatten(col)
        if not (pa.types.is_floating(col.type) or pa.types.is_decimal(col.type)):
            continue
        values = np.asarray(col.cast(pa.float64()).fill_null(0.0), dtype=np.float64)
        row_of = (lambda i: i) if rows is None else (lambda i: rows[i])  # noqa: B023
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            fail(
                name,
                row_of(bad[0]),
                float(values[bad[0]]),
                f"is not finite in a {kind} column",
                "a typed column holds finite numbers only; fix the value, or leave the field empty",
            )
        # (A float column's values are stored as tf.Example's 32-bit floats, as TFX's CsvExampleGen stores them;
        # refusing whole numbers a float32 rounds refused TFX's own taxi file, whose census tracts are written
        # 17031832200.0: not refused. An int column stays int64.)
        if kind == "int":
            big = np.flatnonzero(np.abs(values) >= _F64_EXACT)
            if len(big):
                fail(
                    name,
                    row_of(big[0]),
                    float(values[big[0]]),
                    "is 2^53 or more in magnitude, where CSV parsing already rounds whole numbers",
                    "keep int values below 2^53 = 9007199254740992 in magnitude",
                )
    if time_column and time_column in batch.schema.names:
        from .blocks import seconds

        col = batch.column(time_column)
        if pa.types.is_floating(col.type):
            values = np.asarray(col.fill_null(0.0), dtype=np.float64)
            t = np.where(np.isfinite(values), values, 0.0)
        else:
            try:
                t = seconds(batch, time_column).astype(np.float64)
            except InputError as exc:
                raise InputError(f"input {path}: {exc}") from None
        out = np.flatnonzero((t < TIME_MIN) | (t >= TIME_MAX))
        if len(out):
            raw = batch.column(time_column)[int(out[0])].as_py()
            fail(
                time_column,
                out[0],
                raw,
                "is outside [1000-01-01, 9000-01-01) UTC as a time",
                "times are unix SECONDS or ISO 8601 (a time in milliseconds or microseconds lands far beyond)",
            )


def infer_schema(path, fmt):
    """The feature schema of an input file (CSV: from its first 16 MiB; TFRecord: first 1,000 records).

    The one typing rule of every ingest path (``sage ingest``, ``sage stream replay``, ``sage serve --input``):
    each column's kind is ``kind_of`` the Arrow type its reader infers; ``describe_columns`` says it."""
    arrow_schema = sniff_types(path, fmt)
    return {} if arrow_schema is None else schema_of(arrow_schema)


def sniff_types(path, fmt):
    """The Arrow schema the reader infers for an input file (None: a TFRecord file without records)."""
    import pyarrow as pa

    try:
        if fmt == "csv":
            import pyarrow.csv as pacsv

            with (
                arrow_source(path) as src,
                pacsv.open_csv(src, read_options=pacsv.ReadOptions(block_size=CSV_SAMPLE_BYTES)) as reader,
            ):
                check_unique_columns(reader.schema.names, path)
                return reader.schema
        if fmt == "parquet":
            import pyarrow.parquet as pq

            with arrow_source(path) as src:
                arrow_schema = pq.read_schema(src)
            check_unique_columns(arrow_schema.names, path)
            return arrow_schema
        from tfx_bsl.coders import example_coder

        sample = []
        for rec in read_tfrecords(path):
            sample.append(rec)
            if len(sample) >= 1000:
                break
        if not sample:
            return None
        return example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(sample).schema
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read {fmt} input {path}: {exc}") from None


def _column_note(kind, arrow_type):
    """How a column of ``arrow_type`` (as the reader inferred it) is stored as ``kind``."""
    import pyarrow as pa

    t = arrow_type
    while t is not None and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        t = t.value_type
    if kind == "int" and t is not None and pa.types.is_timestamp(t):
        return (
            "ISO 8601 date-times converted to unix seconds (a time without an offset is read as UTC); "
            "a fraction of a second is refused"
        )
    if kind == "bytes" and t is not None and pa.types.is_date(t):
        return "ISO 8601 dates (no time) kept as text YYYY-MM-DD"
    if kind == "int" and t is not None and pa.types.is_boolean(t):
        return "true/false stored as 1/0"
    return {
        "int": "whole numbers, exact within +-2^53",
        "bytes": "text",
        "float": "32-bit floats (about 7 significant digits: 33554433 is stored as 33554432)",
    }[kind]


def describe_columns(path, fmt, schema):
    """[(column, kind, how its values are stored)] of ``schema`` (the stream's feature types) for an input
    file: what ingest prints, so no column is typed silently (an ISO date-time column becomes unix seconds)."""
    sniffed = sniff_types(path, fmt)
    types = {} if sniffed is None else {f.name: f.type for f in sniffed}
    return [(name, kind, _column_note(kind, types.get(name))) for name, kind in schema.items()]


def format_columns(columns, time_column=None):
    """The column lines ingest prints: one per column, ``name  kind  note``."""
    width = max((len(name) for name, _, _ in columns), default=0)
    marks = {time_column: " (the time column: blocks by it)"} if time_column else {}
    return [f"  {name:<{width}}  {kind:<5}  {note}{marks.get(name, '')}" for name, kind, note in columns]


def read_batches(path, fmt, schema, batch_rows=65536, time_column=None, check=True):
    """Yield RecordBatches of the input file, typed to the stream's ``schema`` (extra columns dropped).

    ``check`` (default): refuse duplicate header names, unclosed quotes (CSV), and values a typed column must
    not hold (``check_batch``; ``time_column``'s times too), naming the file, column and row.
    """
    first_row = 0
    for batch in _read_batches(path, fmt, schema, batch_rows, check):
        if check:
            check_batch(batch, path, first_row, schema, time_column)
        first_row += batch.num_rows
        yield batch


def _read_batches(path, fmt, schema, batch_rows, check):
    import pyarrow as pa

    try:
        if fmt == "csv":
            import pyarrow.csv as pacsv

            if check:
                check_csv_quotes(path)
            with (
                arrow_source(path) as src,
                pacsv.open_csv(src, read_options=pacsv.ReadOptions(block_size=1 << 20)) as probe,
            ):
                if check:
                    check_unique_columns(probe.schema.names, path)
                sniffed = {f.name: f.type for f in probe.schema}
            missing = [n for n in schema if n not in sniffed]
            if missing:
                raise InputError(f"input {path} lacks column(s) {', '.join(missing)} of the stream's schema")
            # ISO times stay timestamps (made unix seconds later), true/false stays boolean (made 1/0)
            types = {
                n: (
                    sniffed[n]
                    if k == "int" and (pa.types.is_timestamp(sniffed[n]) or pa.types.is_boolean(sniffed[n]))
                    else _csv_type(k)
                )
                for n, k in schema.items()
            }
            opts = pacsv.ConvertOptions(column_types=types, include_columns=list(schema), strings_can_be_null=True)
            with (
                arrow_source(path) as src,
                pacsv.open_csv(src, read_options=pacsv.ReadOptions(block_size=8 << 20), convert_options=opts) as reader,
            ):
                for batch in reader:
                    if batch.num_rows:
                        yield batch
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            with arrow_source(path) as src:
                pf = pq.ParquetFile(src)
                if check:
                    check_unique_columns(pf.schema_arrow.names, path)
                missing = [n for n in schema if n not in pf.schema_arrow.names]
                if missing:
                    raise InputError(f"input {path} lacks column(s) {', '.join(missing)} of the stream's schema")
                for batch in pf.iter_batches(batch_size=batch_rows, columns=list(schema)):
                    yield batch
        else:
            chunk = []
            for rec in read_tfrecords(path):
                chunk.append(rec)
                if len(chunk) >= batch_rows:
                    yield decode(chunk, schema)
                    chunk = []
            if chunk:
                yield decode(chunk, schema)
    except pa.ArrowInvalid as exc:
        raise InputError(f"cannot read {fmt} input {path}: {exc}") from None


def load_schema(path):
    with open(path) as f:
        return json.load(f)


# ------------------------------------------------------------------ content digest
def _mix(x):
    """splitmix64 finalizer on a uint64 array (wraps mod 2^64)."""

    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def row_hashes(example_batch):
    """A 64-bit hash of each row's feature values (uint64 array), independent of byte serialization.

    tf.Example bytes are not canonical (feature map order varies), so block
    digests are computed from the values: per column, each value is hashed with
    its position in the row, summed per row, and mixed with the row's length and
    the column's name (so column order does not matter).
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    n = example_batch.num_rows
    total = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name, col in zip(example_batch.schema.names, example_batch.columns):
            salt = np.uint64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big"))
            lengths = np.asarray(pc.fill_null(pc.list_value_length(col), 0), dtype=np.int64)
            flat = pc.list_flatten(col)
            if pa.types.is_integer(flat.type):
                vals = np.asarray(flat, dtype=np.int64).view(np.uint64)
            elif pa.types.is_floating(flat.type):
                vals = np.asarray(flat, dtype=np.float32).view(np.uint32).astype(np.uint64)
            else:
                vals = pd.util.hash_array(np.asarray(flat.to_pylist(), dtype=object), categorize=True)
            starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
            pos = np.arange(len(vals), dtype=np.uint64) - starts.astype(np.uint64)
            h = _mix(vals + pos * np.uint64(0x9E3779B97F4A7C15))
            per_row = np.zeros(n, dtype=np.uint64)
            np.add.at(per_row, np.repeat(np.arange(n), lengths), h)
            total += _mix(per_row + lengths.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93) + salt)
    return total
