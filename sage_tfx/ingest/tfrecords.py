"""TFRecord files without TensorFlow: the framing (length, masked CRC32C of both), written gzip-compressed and read
gzip-compressed or not. Block files hold the same stream, encrypted (``sealed.py``).
"""

import contextlib
import gzip
import os
import struct

from .inputs import InputError, open_input


def _masked_crc(data):
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_tfrecords(out, records):
    """Write records to the file object ``out`` in TFRecord framing (length, CRCs)."""
    pack, parts, size = struct.pack, [], 0
    for rec in records:
        header = pack("<Q", len(rec))
        parts += (header, pack("<I", _masked_crc(header)), rec, pack("<I", _masked_crc(rec)))
        size += len(rec) + 16
        if size >= 1 << 20:  # one write (one compress call) per MiB, not per record
            out.write(b"".join(parts))
            parts, size = [], 0
    if parts:
        out.write(b"".join(parts))


def write_tfrecords(path, records, compresslevel=6, fsync=False):
    """Write records to a gzip-compressed TFRecord file (the format of TFX Examples). Block files are
    written by ``sealed.write_records`` (the same stream, encrypted)."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compresslevel, mtime=0) as out:
        frame_tfrecords(out, records)
    if fsync:
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def read_tfrecords(path, check_crc=True):
    """Yield the records of a TFRecord file, gzip-compressed or not (checks CRCs)."""
    with open_input(path) as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    with open_input(path) as raw, gzip.GzipFile(fileobj=raw, mode="rb") if gz else contextlib.nullcontext(raw) as f:
        yield from iter_tfrecords(f, path, check_crc)


def iter_tfrecords(f, path, check_crc=True):
    """Yield the records of the TFRecord stream ``f`` (a file object); ``path`` names it in errors."""
    while True:
        header = f.read(12)
        if not header:
            return
        if len(header) < 12:
            raise InputError(f"TFRecord file {path} is truncated")
        (length,) = struct.unpack("<Q", header[:8])
        if check_crc and struct.unpack("<I", header[8:])[0] != _masked_crc(header[:8]):
            raise InputError(f"TFRecord file {path} is corrupt (length CRC mismatch)")
        data = f.read(length)
        footer = f.read(4)
        if len(data) < length or len(footer) < 4:
            raise InputError(f"TFRecord file {path} is truncated")
        if check_crc and struct.unpack("<I", footer)[0] != _masked_crc(data):
            raise InputError(f"TFRecord file {path} is corrupt (data CRC mismatch)")
        yield data
