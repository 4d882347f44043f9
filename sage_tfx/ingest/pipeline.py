"""``sage ingest``: a Beam pipeline from input files to registered blocks.

One DoFn call per input file reads Arrow RecordBatches typed to the stream schema, assigns each record its
block and writes encrypted part files to staging; then the driver alone commits (renames each block into
place, registers it in the ledger) and deletes a staged run, also after an error. Runs on the DirectRunner
unless the standard Beam options (``--runner``) say otherwise; with a ``staging_location``, no step assumes
the workers share the launcher's disk.

Runners, staging and the DaskRunner work-around: docs/scale_out.md, "Ingest on distributed runners".
"""

import glob
import logging
import os
import re
import sys
from collections.abc import Iterable, Sequence

from . import sealed, units
from .blocks import TimeBlocks, UserShards
from .layout import check_stream_config, missing_dirs, remove_empty_dirs
from .records import InputError, describe_columns, infer_schema, input_format, is_url, read_batches
from .staging import (
    check_staging_location,
    missing_staging_dirs,
    new_run_dir,
    new_staged_run,
    read_parts,
    remove_run_dir,
    remove_staged_run,
    write_parts,
)
from .store import BlockWriter, commit


def resolve_inputs(inputs: Sequence[str]) -> list:
    """The input files: local paths and globs (absolute paths), and URLs or URL globs of any Beam filesystem
    (``gs://bucket/*.csv``: ``FileSystems.match``, read later by the workers themselves)."""
    files = []
    for pattern in inputs:
        if is_url(pattern):
            files.extend(_match_url(pattern))
            continue
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for path in matched:
            if not os.path.isfile(path):
                raise InputError(f"input {path!r} does not exist or is not a file")
            files.append(os.path.abspath(path))
    if not files:
        raise InputError(f"no input files match {', '.join(inputs)}")
    return files


def _match_url(pattern):
    from apache_beam.io.filesystems import FileSystems

    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception as exc:  # an unknown scheme, a missing Beam extra, a store refusing the listing
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            f"input {pattern!r} cannot be listed through Beam's FileSystems ({detail}): check the URL, "
            "and install the Beam extra of its scheme (gs://: apache-beam[gcp], s3://: [aws], hdfs://: "
            "[hadoopfs])"
        ) from None
    paths = sorted(m.path for m in found if not m.path.endswith("/"))
    if not paths:
        raise InputError(f"input {pattern!r} does not exist (no object matches it)")
    return paths


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


def plan_schema(files, fmt, data_root, stream, spec, bound=None):
    """The stream's schema (fixed at its first ingest); the block column, and the privacy unit column of a
    ``bound`` (``units.UnitBound``), must be in it."""
    fmts = {f: input_format(f, fmt) for f in files}
    schema = infer_schema(files[0], fmts[files[0]])
    if not schema:
        raise InputError(f"the input is empty: {files[0]} has no records (nothing registered)")
    if spec.column not in schema:
        what = "time" if spec.by == "time" else "user"
        raise InputError(f"{what} column {spec.column!r} is not in the input (columns: {', '.join(schema)})")
    units.check_schema(bound, schema)
    return check_stream_config(data_root, stream, schema, spec), fmts


def _dofns():
    import apache_beam as beam

    class ReadBatches(beam.DoFn):
        def __init__(self, fmts, schema, batch_rows, time_column=None):
            self.fmts, self.schema, self.batch_rows, self.time_column = fmts, schema, batch_rows, time_column

        def process(self, path):
            yield from read_batches(
                path, self.fmts[path], self.schema, self.batch_rows, time_column=getattr(self, "time_column", None)
            )

    class IngestFile(beam.DoFn):
        """One input file -> its part files in staging; yields each part's description (from ``process``).

        ``run_key``: the run's random key (sealed.new_run_key), held in memory by the driver and its writers.
        One BlockWriter per file: the parts a file makes do not depend on how a runner bundles the files.
        """

        def __init__(
            self, fmts, schema, batch_rows, time_column, run_dir, spec, compresslevel, stream, run_key, bound=None
        ):
            self.fmts, self.schema, self.batch_rows, self.time_column = fmts, schema, batch_rows, time_column
            self.run_dir, self.spec, self.compresslevel = run_dir, spec, compresslevel
            self.stream, self.run_key, self.bound = stream, run_key, bound

        def process(self, paths):
            """``paths``: one file, or (a unit stream's run: ``units``) all the run's files, bounded together."""
            writer = BlockWriter(
                self.run_dir,
                self.spec,
                self.schema,
                compresslevel=self.compresslevel,
                stream=self.stream,
                run_key=self.run_key,
            )
            paths = [paths] if isinstance(paths, str) else list(paths)
            batches = (
                batch
                for path in paths
                for batch in read_batches(
                    path, self.fmts[path], self.schema, self.batch_rows, time_column=self.time_column
                )
            )
            bound = getattr(self, "bound", None)
            for batch in batches if bound is None else bound.keep(list(batches), self.spec):
                writer.add(batch)
            yield from writer.close()

    return ReadBatches, IngestFile


RUNNER_ALIASES = {"dask": "apache_beam.runners.dask.dask_runner.DaskRunner", "direct": "DirectRunner"}


def beam_options(beam_args, n_inputs=None):
    """PipelineOptions of ``sage ingest``: the one home of its runner options.

    ``--runner`` defaults to the DirectRunner; ``--runner dask`` (or ``direct``) is a shorthand for Beam's
    DaskRunner class (``RUNNER_ALIASES``); ``--dask-address ADDR`` stands for ``--dask_client_address=ADDR``.
    On Dask, unless ``--dask_npartitions``/``--dask_partition_size`` is given, each input file is its own
    partition (Beam's default puts up to 128 files in one partition, i.e. on one worker).
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    args, runner, rest = list(beam_args or []), None, []
    i = 0
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if name in ("--runner", "--dask-address", "--dask_address"):
            if not eq:
                if i + 1 >= len(args):
                    raise InputError(f"{name} needs a value")
                i, value = i + 1, args[i + 1]
            if name == "--runner":
                runner = RUNNER_ALIASES.get(value.lower(), value)
            else:
                rest.append(f"--dask_client_address={value}")
        else:
            rest.append(a)
        i += 1
    runner = runner or "DirectRunner"
    if runner.endswith("DaskRunner"):
        import apache_beam.runners.dask.dask_runner  # noqa: F401 (registers DaskOptions: --dask_* are parsed)
    if (
        runner.endswith("DaskRunner")
        and n_inputs
        and not any(a.startswith(("--dask_npartitions", "--dask_partition_size")) for a in rest)
    ):
        rest.append(f"--dask_npartitions={n_inputs}")
    return PipelineOptions([f"--runner={runner}"] + rest)


def ingest(
    ledger_location: str,
    stream: str,
    inputs: str | Sequence[str],
    data_root: str,
    block_by: str = "time",
    time_column: str | None = None,
    window: str | None = None,
    user_column: str | None = None,
    shards: int | None = None,
    hash_key: str | None = None,
    fmt: str | None = None,
    beam_args: Iterable[str] | None = None,
    batch_rows: int = 65536,
    compresslevel: int = 6,
    progress: bool = True,
    allow_duplicate_of: Iterable[str] = (),
    staging_location: str | None = None,
) -> dict:
    """Ingest input files into blocks of ``stream``; returns {"added", "unchanged", "blocks", "columns"...}
    (``columns``: ``records.describe_columns``, each column's stored type and how its values were converted).

    ``inputs``: local paths or globs, or URLs/URL globs of any Beam filesystem (``gs://bucket/*.csv``).
    ``staging_location``: where the Beam workers write the run's sealed part files and part list: a Beam
    FileSystems URL (``gs://``, ``s3://``, ``hdfs://``) or a local folder outside the data root; default
    ``DATA_ROOT/STREAM/_staging`` (docs/scale_out.md). With it, workers need not reach the data root: the driver
    copies the parts in (sizes and SHA-256 checked against the workers' sealed part list) and deletes the
    staged run afterwards, on success or error (docs/security.md, "Staging outside the data root"); a run it
    could not delete is reported on stderr and in ``result["staging_left"]``.

    On any error nothing is registered, the staging run is removed, and so are the data root, stream and
    staging folders this call created (when empty). Blocks whose records are already registered in another
    stream are refused, unless that stream is in ``allow_duplicate_of`` (see ``store.commit``).
    """
    from sage_tfx.privacy import Ledger

    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    spec, bound = _checked_spec(
        ledger_location, stream, inputs, block_by, time_column, window, user_column, shards, hash_key
    )
    files, options = _beam_inputs(inputs, beam_args)
    with Ledger.open(ledger_location) as ledger:
        ledger.stream(stream)  # the stream must exist before data arrives
        staging = check_staging_location(data_root, stream, staging_location)  # before anything is created
        created = missing_dirs(data_root, stream)
        created_staging = missing_staging_dirs(staging)
        run_dir = new_run_dir(data_root, stream)
        stage, left = run_dir, None
        ok = False
        try:
            if staging is not None:
                stage = new_staged_run(staging)
            schema, fmts = plan_schema(files, fmt, data_root, stream, spec, bound)
            columns = describe_columns(files[0], fmts[files[0]], schema)
            run_key = sealed.new_run_key()
            _say(progress, f"ingest: {len(files)} file(s) -> stream {stream} ({spec.describe()}), staging {stage}")
            _run_job(options, files, fmts, schema, batch_rows, spec, stage, compresslevel, stream, run_key, bound)
            parts = read_parts(stage, run_key)
            result = commit(
                ledger,
                stream,
                data_root,
                run_dir,
                parts,
                spec,
                schema,
                allow_duplicate_of=allow_duplicate_of,
                run_key=run_key,
                staged_run=stage,
            )
            ok = True
        finally:
            left = _clean_up(run_dir, stage, ok, created, created_staging)
    return _summed_up(result, stage if left else None, columns, progress)


def _beam_inputs(inputs: list[str], beam_args: Iterable[str] | None) -> tuple[list[str], object]:
    """The input files, resolved, and the job's Beam options (the driver's own FileSystems calls see them too)."""
    from apache_beam.io.filesystems import FileSystems

    # Beam logs a worker's exception with its traceback before re-raising it; bad input is reported once, below.
    logging.getLogger("apache_beam.runners.common").addFilter(_not_input_errors)
    options = beam_options(beam_args, None)
    FileSystems.set_options(options)  # the driver's own FileSystems calls (inputs, staging) see e.g. --s3_* too
    files = resolve_inputs(inputs)
    return files, beam_options(beam_args, len(files))


def _summed_up(result: dict, staging_left: str | None, columns, progress: bool) -> dict:
    """``commit``'s result with the staged run left behind (if any), the columns and the block count; said."""
    if staging_left:
        result["staging_left"] = staging_left
    result["columns"] = columns
    result["blocks"] = len(result["added"]) + len(result["unchanged"])
    _say(progress, f"ingest: {len(result['added'])} block(s) added, {len(result['unchanged'])} already present")
    return result


def _checked_spec(
    ledger_location: str,
    stream: str,
    inputs: list[str],
    block_by: str,
    time_column: str | None,
    window: str | None,
    user_column: str | None,
    shards: int | None,
    hash_key: str | None,
) -> tuple:
    """The block spec and the stream's unit bound, refused before Beam loads (seconds of imports) for bad block
    options and a missing local input: ``(spec, bound)``."""
    from sage_tfx.privacy import Ledger

    if block_by != "user" or user_column:  # (user shards without a column shard by the stream's unit, if any)
        make_spec(block_by, stream, time_column, window, user_column, shards, hash_key)
    local = [i for i in inputs if not is_url(i)]
    if local:
        resolve_inputs(local)
    with Ledger.open(ledger_location) as ledger:  # the stream's privacy unit: its rows are bounded (units.py)
        bound = units.stream_bound(ledger, stream)
    spec = make_spec(
        block_by, stream, time_column, window, units.unit_user_column(bound, user_column), shards, hash_key
    )
    return spec, bound


def _run_job(
    options,
    files: list[str],
    fmts: dict,
    schema,
    batch_rows: int,
    spec,
    stage: str,
    compresslevel: int,
    stream: str,
    run_key: bytes,
    bound,
) -> None:
    """The Beam job: every file read, typed and written as sealed parts under ``stage``, then the part list.

    Raises:
        InputError: bad input (a runner-wrapped worker error surfaces its cause's message).
    """
    import apache_beam as beam

    _, IngestFile = _dofns()
    try:
        p = beam.Pipeline(options=options)
        # a unit stream's files go to one writer together: a unit's rows are bounded over all of them
        _ = (
            p
            | "Files" >> beam.Create(files if bound is None else [files])
            | "IngestFiles"
            >> beam.ParDo(
                IngestFile(
                    fmts,
                    schema,
                    batch_rows,
                    spec.column if spec.by == "time" else None,
                    stage,
                    spec,
                    compresslevel,
                    stream,
                    run_key,
                    bound,
                )
            )
            | "AllParts" >> beam.combiners.ToList()
            | "PartList" >> beam.Map(_PartList(stage, run_key))
        )
        _run(p)
    except InputError:
        raise
    except Exception as exc:  # a runner wraps worker errors; surface the cause's message
        raise InputError(_root_message(exc)) from None


def _clean_up(run_dir: str, stage: str, ok: bool, created: list, created_staging: list) -> str | None:
    """Remove the run folder and a staged run; after an error also the folders this ingest created. Returns why
    a staged run could not be removed (None if it was, or there was none)."""
    left = None
    remove_run_dir(run_dir)
    if stage != run_dir:
        left = remove_staged_run(stage)
        if left:
            print(
                f"sage ingest: warning: the staged run {stage} could not be removed ({left}): delete it "
                "by hand. Its part files are sealed under this run's key, which sage never stores",
                file=sys.stderr,
                flush=True,
            )
    if not ok:
        remove_empty_dirs(created_staging)
        remove_empty_dirs(created)
    return left


def ingest_batches(ledger, stream, data_root, batches, spec, schema, allow_duplicate_of=()):
    """In-process ingest of RecordBatches (no Beam): the same bound, writer and commit as ``ingest``."""
    bound = units.stream_bound(ledger, stream)
    if bound is not None:  # refused before anything is created: a shard column other than the unit's
        units.unit_user_column(bound, spec.column if spec.by == "user" else None)
    created = missing_dirs(data_root, stream)
    run_dir = new_run_dir(data_root, stream)
    ok = False
    try:
        schema = check_stream_config(data_root, stream, schema, spec)
        run_key = sealed.new_run_key()
        writer = BlockWriter(run_dir, spec, schema, stream=stream, run_key=run_key)
        units.check_schema(bound, schema)
        for batch in batches if bound is None else bound.keep(list(batches), spec):
            writer.add(batch)
        result = commit(
            ledger,
            stream,
            data_root,
            run_dir,
            writer.close(),
            spec,
            schema,
            allow_duplicate_of=allow_duplicate_of,
            run_key=run_key,
        )
        ok = True
        return result
    finally:
        remove_run_dir(run_dir)
        if not ok:
            remove_empty_dirs(created)


class _PartList:
    """The last step of the ingest job: write the run's part list, sealed under the run key."""

    def __init__(self, run, run_key):
        self.run, self.run_key = run, run_key

    def __call__(self, parts):
        write_parts(self.run, parts, self.run_key)


def _run(pipeline):
    """Run and wait; then close the runner's client if it holds one (the DaskRunner leaves its Client open)."""
    result = pipeline.run()
    try:
        result.wait_until_finish()
    except BaseException:  # a failed or interrupted (Ctrl-C) job: stop its workers before staging is deleted
        try:
            result.cancel()
        except Exception:  # finished already, or a runner that cannot cancel (the in-process DirectRunner)
            pass
        raise
    finally:
        client = getattr(result, "client", None)
        if client is not None:
            client.close()


def _not_input_errors(record):
    return not (record.exc_info and isinstance(record.exc_info[1], InputError))


def _root_message(exc):
    """The innermost InputError/ValueError message of a (runner-wrapped) exception."""

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
