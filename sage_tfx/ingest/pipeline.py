"""``sage ingest``: a Beam pipeline from input files to registered blocks.

    Create(files) -> ReadBatches (pyarrow/tfx_bsl, typed to the stream schema)
                  -> WriteBlockParts (block of each record, tf.Example bytes, part files in staging)
                  -> ToList -> write the part list
    then, in the driver: commit (rename each block into place, register it in the ledger).

Records travel as Arrow RecordBatches, so Beam's per-element cost is paid per
batch. Each input file is read by one worker: pass several files (or a glob) to
read in parallel. Runs on the DirectRunner unless ``--runner`` and the other
standard Beam options say otherwise (staging and data root must then be a
filesystem every worker and the driver share).
"""
import glob
import os
import shutil
import sys

from . import sealed
from .blocks import TimeBlocks, UserShards
from .records import InputError, infer_schema, input_format, read_batches
from .store import (BlockWriter, check_stream_config, commit, missing_dirs, new_run_dir, read_parts,
                    remove_empty_dirs, remove_run_dir, write_parts)


def resolve_inputs(inputs):
    files = []
    for pattern in inputs:
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for path in matched:
            if not os.path.isfile(path):
                raise InputError(f"input {path!r} does not exist or is not a file")
            files.append(os.path.abspath(path))
    if not files:
        raise InputError(f"no input files match {', '.join(inputs)}")
    return files


def make_spec(block_by, stream, time_column=None, window=None, user_column=None, shards=None, hash_key=None):
    if block_by == "time":
        if not time_column:
            raise InputError("--block-by time needs --time-column")
        if window is None:
            raise InputError("--block-by time needs --window (e.g. 1d)")
        return TimeBlocks(time_column, window)
    if block_by == "user":
        if not user_column:
            raise InputError("--block-by user needs --user-column")
        if shards is None:
            raise InputError("--block-by user needs --shards N")
        return UserShards(user_column, shards, hash_key or stream)
    raise InputError(f"--block-by {block_by!r} is unknown: use time or user")


def plan_schema(files, fmt, data_root, stream, spec):
    """The stream's schema (fixed at its first ingest); the block column must be in it."""
    fmts = {f: input_format(f, fmt) for f in files}
    schema = infer_schema(files[0], fmts[files[0]])
    if not schema:
        raise InputError(f"the input is empty: {files[0]} has no records (nothing registered)")
    if spec.column not in schema:
        what = "time" if spec.by == "time" else "user"
        raise InputError(f"{what} column {spec.column!r} is not in the input (columns: {', '.join(schema)})")
    return check_stream_config(data_root, stream, schema, spec), fmts



def _dofns():
    import apache_beam as beam

    class ReadBatches(beam.DoFn):
        def __init__(self, fmts, schema, batch_rows, time_column=None):
            self.fmts, self.schema, self.batch_rows, self.time_column = fmts, schema, batch_rows, time_column

        def process(self, path):
            yield from read_batches(path, self.fmts[path], self.schema, self.batch_rows,
                                    time_column=getattr(self, "time_column", None))

    class WriteBlockParts(beam.DoFn):
        """``run_key``: the run's random key (sealed.new_run_key), held in memory by the driver and its writers."""

        def __init__(self, run_dir, spec, schema, compresslevel, stream, run_key):
            self.run_dir, self.spec, self.schema, self.compresslevel = run_dir, spec, schema, compresslevel
            self.stream, self.run_key = stream, run_key

        def start_bundle(self):
            self.writer = BlockWriter(self.run_dir, self.spec, self.schema, compresslevel=self.compresslevel,
                                      stream=self.stream, run_key=self.run_key)

        def process(self, batch):
            self.writer.add(batch)

        def finish_bundle(self):
            from apache_beam.transforms.window import GlobalWindow
            from apache_beam.utils.windowed_value import WindowedValue

            for part in self.writer.close():
                yield WindowedValue(part, -1, [GlobalWindow()])

    return ReadBatches, WriteBlockParts


def beam_options(beam_args):
    from apache_beam.options.pipeline_options import PipelineOptions

    args = list(beam_args or [])
    if not any(a.startswith("--runner") for a in args):
        args.append("--runner=DirectRunner")
    return PipelineOptions(args)


def ingest(ledger_location, stream, inputs, data_root, block_by="time", time_column=None, window=None,
           user_column=None, shards=None, hash_key=None, fmt=None, beam_args=None, batch_rows=65536,
           compresslevel=6, progress=True, allow_duplicate_of=()):
    """Ingest input files into blocks of ``stream``; returns {"added", "unchanged", "blocks", "rows_read"...}.

    On any error nothing is registered, the staging run is removed, and so are the data root, stream and
    staging folders this call created (when empty). Blocks whose records are already registered in another
    stream are refused, unless that stream is in ``allow_duplicate_of`` (see ``store.commit``).
    """
    import logging

    import apache_beam as beam

    from sage_tfx.privacy import Ledger

    # Beam logs a worker's exception with its traceback before re-raising it; bad input is reported once, below.
    logging.getLogger("apache_beam.runners.common").addFilter(_not_input_errors)
    spec = make_spec(block_by, stream, time_column, window, user_column, shards, hash_key)
    files = resolve_inputs([inputs] if isinstance(inputs, str) else inputs)
    with Ledger.open(ledger_location) as ledger:
        ledger.stream(stream)  # the stream must exist before data arrives
        created = missing_dirs(data_root, stream)
        run_dir = new_run_dir(data_root, stream)
        ok = False
        try:
            schema, fmts = plan_schema(files, fmt, data_root, stream, spec)
            ReadBatches, WriteBlockParts = _dofns()
            run_key = sealed.new_run_key()
            _say(progress, f"ingest: {len(files)} file(s) -> stream {stream} ({spec.describe()}), staging {run_dir}")
            try:
                with beam.Pipeline(options=beam_options(beam_args)) as p:
                    _ = (p | "Files" >> beam.Create(files)
                         | "Read" >> beam.ParDo(ReadBatches(fmts, schema, batch_rows,
                                                            spec.column if spec.by == "time" else None))
                         | "WriteBlocks" >> beam.ParDo(WriteBlockParts(run_dir, spec, schema, compresslevel, stream,
                                                                       run_key))
                         | "AllParts" >> beam.combiners.ToList()
                         | "PartList" >> beam.Map(lambda parts: write_parts(run_dir, parts)))
            except InputError:
                raise
            except Exception as exc:  # a runner wraps worker errors; surface the cause's message
                raise InputError(_root_message(exc)) from None
            parts = read_parts(run_dir)
            result = commit(ledger, stream, data_root, run_dir, parts, spec, schema,
                            allow_duplicate_of=allow_duplicate_of, run_key=run_key)
            ok = True
        finally:
            remove_run_dir(run_dir)
            if not ok:
                remove_empty_dirs(created)
    result["blocks"] = len(result["added"]) + len(result["unchanged"])
    _say(progress, f"ingest: {len(result['added'])} block(s) added, {len(result['unchanged'])} already present")
    return result


def ingest_batches(ledger, stream, data_root, batches, spec, schema, allow_duplicate_of=()):
    """In-process ingest of RecordBatches (no Beam): the same writer and commit as ``ingest``."""
    created = missing_dirs(data_root, stream)
    run_dir = new_run_dir(data_root, stream)
    ok = False
    try:
        schema = check_stream_config(data_root, stream, schema, spec)
        run_key = sealed.new_run_key()
        writer = BlockWriter(run_dir, spec, schema, stream=stream, run_key=run_key)
        for batch in batches:
            writer.add(batch)
        result = commit(ledger, stream, data_root, run_dir, writer.close(), spec, schema,
                        allow_duplicate_of=allow_duplicate_of, run_key=run_key)
        ok = True
        return result
    finally:
        remove_run_dir(run_dir)
        if not ok:
            remove_empty_dirs(created)


def _not_input_errors(record):
    return not (record.exc_info and isinstance(record.exc_info[1], InputError))


def _root_message(exc):
    """The innermost InputError/ValueError message of a (runner-wrapped) exception."""
    import re

    seen, cur, best = set(), exc, None
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, InputError):
            return re.sub(r"( \[while running '[^']*'\])+$", "", str(cur))
        best = best or (str(cur) if isinstance(cur, ValueError) else None)
        cur = cur.__cause__ or cur.__context__
    text = best or str(exc)
    marker = "InputError: "
    if marker in text:
        text = text.split(marker)[-1]
    return text.strip().splitlines()[0] if text.strip() else repr(exc)


def _say(progress, line):
    if progress:
        print(line, file=sys.stderr, flush=True)
