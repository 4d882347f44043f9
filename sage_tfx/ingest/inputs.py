"""An ingest input: a local path or a URL (read through Beam's FileSystems), opened for binary reading, and its
format (``csv``, ``tfrecord``, ``parquet``); ``InputError`` names the file, column or value at fault.
"""

import contextlib
import gzip
import re

from sage_tfx.privacy.errors import SageError

FORMATS = ("csv", "tfrecord", "parquet")


class InputError(SageError, ValueError):
    """Bad ingest input: names the file, column or value at fault."""


_URL = re.compile(r"^[a-zA-Z][-a-zA-Z0-9+.]*://")  # the scheme rule of Beam's FileSystems.get_scheme


def is_url(path: str) -> bool:
    """True for a path with a scheme (``gs://``, ``s3://``, ``hdfs://``...): read and written through Beam's
    FileSystems; False for a local path (docs/scale_out.md)."""
    return bool(_URL.match(str(path)))


@contextlib.contextmanager
def open_input(path, decompress=False):
    """An input file opened for binary reading: a local path with ``open``, a URL through Beam's
    ``FileSystems.open`` (so ``gs://``/``s3://``/``hdfs://`` inputs are read by the workers themselves, not
    from the launcher's disk; docs/scale_out.md). ``decompress``: a ``.gz`` file is gunzipped."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        raw = FileSystems.open(
            path, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
        )
    else:
        raw = open(path, "rb")
    try:
        if decompress and str(path).lower().endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                yield gz
        else:
            yield raw
    finally:
        raw.close()


@contextlib.contextmanager
def arrow_source(path):
    """What pyarrow reads: a local path as is (pyarrow opens it and gunzips ``.gz`` by its name), a URL as a
    file object from ``open_input`` (gunzipped here)."""
    if not is_url(path):
        yield path
        return
    with open_input(path, decompress=True) as f:
        yield f


def input_format(path, given=None):
    """``csv``, ``tfrecord`` or ``parquet``: the given one, else from the file name."""
    if given:
        if given not in FORMATS:
            raise InputError(f"input format {given!r} is unknown: use one of {', '.join(FORMATS)}")
        return given
    name = path.lower()
    for fmt, ends in (
        ("csv", (".csv", ".csv.gz")),
        ("parquet", (".parquet", ".pq")),
        ("tfrecord", (".tfrecord", ".tfrecord.gz", ".tfrecords", ".tfrecords.gz", ".gz")),
    ):
        if name.endswith(ends):
            return fmt
    raise InputError(f"cannot tell the format of input {path!r} from its name: pass --format csv|tfrecord|parquet")
