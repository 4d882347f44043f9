"""BlockExampleGen executor: verify the grant, then copy exactly its blocks into train/eval splits.

It gets the keys of exactly the grant's blocks (``access.grant_blocks``), checks every block's manifest,
paths and file digests, decrypts, and writes the plain TFRecords TFX reads (files 0600, folders 0700),
removed with the run's other raw artifacts when the run ends. With a staging location, workers without the
launcher's disk read staged copies of the sealed files under the same checks, holding only the grant's data keys.

Records go to splits by the grant's signed rule (components/granted_reads.py, which also reads them back
without TFX or Beam for the confined child that validates a model again).

docs/security.md, "Blocks at rest, and reads gated by a grant"; docs/scale_out.md, "BlockExampleGen on
remote workers".
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils

from sage_tfx.components._grant import DATA_PROPERTY, SPLIT_RULE_PROPERTY, GrantedExecutor
from sage_tfx.components.granted_reads import (  # noqa: F401 (re-exported)
    DEFAULT_SPLITS,
    granted_records,
    granted_splits,
    parse_splits,
    split_bounds,
    split_index,
)
from sage_tfx.ingest.layout import STAGED_PREFIX

if TYPE_CHECKING:
    from tfx.types.artifact import Artifact


STAGING_LOCATION_KEY = "staging_location"  # the optional execution property (components/block_example_gen.py)
FILE_PREFIX = "data_tfrecord"


def _read_sealed_dofn():
    import apache_beam as beam

    class ReadSealed(beam.DoFn):
        """(stream, block, path or staged URL, bytes, sha256, manifest file name) -> the file's records, checked
        and decrypted (sealed.read_file, the same checks for a local path and a FileSystems URL)."""

        def __init__(self, deks) -> None:
            self._deks = deks  # in memory only (pickled with the DoFn for the runner)

        def process(self, task):
            from sage_tfx.ingest.sealed import SealedError, is_url, read_file

            stream, block, path, size, sha256, name = task
            if not is_url(path) and not os.path.exists(path):
                raise SealedError(
                    f"block file {path} does not exist on the Beam worker: the workers do not see "
                    "the launcher's data root. Give the run a staging location every worker can "
                    "read (sage run --staging-location URL_OR_DIR, or the Beam --temp_location); "
                    "nothing of it was read"
                )
            yield from read_file(path, self._deks[block], stream, block, size, sha256, name=name)

    return ReadSealed


def _ReadSealed(deks):
    return _read_sealed_dofn()(deks)


def _make_private(root):
    """chmod 0700 every folder and 0600 every file under ``root`` (local paths only: a URL's access is the object
    store's, docs/scale_out.md)."""
    if "://" in str(root) or not os.path.isdir(root):
        return
    os.chmod(root, 0o700)
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            os.chmod(os.path.join(folder, d), 0o700)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o600)


def staging_location(exec_properties: Mapping[str, Any], beam_pipeline_args: Sequence[str] | None) -> str | None:
    """The staging location of a run: the ``staging_location`` exec property, else the Beam ``--temp_location``
    (None: the workers read the data root's files directly, so they must see the launcher's disk)."""
    location = exec_properties.get(STAGING_LOCATION_KEY)
    if location:
        return str(location)
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

    return PipelineOptions(list(beam_pipeline_args or [])).view_as(GoogleCloudOptions).temp_location or None


def staged_run(location: str) -> str:
    """A fresh run folder under the staging location (a Beam FileSystems path); SealedError for a location
    Beam has no filesystem for."""
    from apache_beam.io.filesystems import FileSystems

    from sage_tfx.ingest.sealed import SealedError

    if FileSystems.get_scheme(location) is None:
        location = os.path.abspath(location)
    try:
        FileSystems.get_filesystem(location)
    except ValueError as exc:
        raise SealedError(
            f"staging location {location!r} has no Beam filesystem ({exc}): give a local folder or "
            "a URL of a filesystem Beam has (gs://, s3://, hdfs://...); nothing was read"
        ) from None
    return FileSystems.join(location, STAGED_PREFIX + uuid.uuid4().hex)


def stage_files(blocks: Sequence[Any], run: str, tasks: Any) -> None:
    """Copy the sealed files of ``blocks`` (opened ``sealed.Block``) to ``run`` through Beam's FileSystems,
    appending (stream, block, staged path, bytes, sha256, manifest name) to ``tasks`` as each is created.

    The copies are ciphertext; the workers check them (sizes, SHA-256, chunk authentication) as if they were
    the data root's. The caller deletes the run (``unstage``) whatever happens."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    for b in blocks:
        names = b.file_names()
        for stream, block, path, size, sha256 in b.file_tasks():
            staged = FileSystems.join(run, stream, block, names[path])
            tasks.append((stream, block, staged, size, sha256, names[path]))
            with (
                open(path, "rb") as src,
                FileSystems.create(
                    staged, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED
                ) as dst,
            ):
                while chunk := src.read(1 << 20):
                    dst.write(chunk)


def unstage(run: str, tasks: Any) -> None:
    """Delete a staged run (its files, then its folder where the filesystem has folders); errors are ignored
    for files already gone."""
    from apache_beam.io.filesystems import FileSystems

    paths = [t[2] for t in tasks]
    if paths:
        try:
            FileSystems.delete(paths)
        except Exception:  # some already gone: delete the rest one by one
            for path in paths:
                try:
                    FileSystems.delete([path])
                except Exception:
                    pass
    try:
        if FileSystems.exists(run):
            FileSystems.delete([run])
    except Exception:
        pass


class Executor(GrantedExecutor, base_beam_executor.BaseBeamExecutor):
    """Verify the grant (``GrantedExecutor.CheckGrant``: one ledger connection for the run), get exactly its
    blocks' keys, open its DP record count, then read and split the blocks in one Beam job."""

    def Do(
        self,
        input_dict: dict[str, list[Artifact]],
        output_dict: dict[str, list[Artifact]],
        exec_properties: dict[str, Any],
    ) -> None:
        from sage_tfx.ingest.access import grant_blocks

        # The grant is checked with the ledger before a single record is read; one connection serves the key
        # door and the DP count too.
        with self.CheckGrant(exec_properties, stream=exec_properties.get("stream")) as run:
            splits = granted_splits(exec_properties.get("splits"), run.grant)
            data = run.data_digest()
            # The keys of the grant's blocks, and only those: signature and charge re-checked by the key door itself.
            _, blocks = grant_blocks(
                run.ledger, exec_properties["data_root"], exec_properties.get("grant"), stream=run.grant.stream
            )
            released = run.released_record_count()
        self._read_blocks(output_dict, exec_properties, run.grant, splits, blocks, released, data)

    def _read_blocks(self, output_dict, exec_properties, grant, splits, blocks, released, data):
        import apache_beam as beam

        tasks = [(*t, b.file_names()[t[2]]) for b in blocks for t in b.file_tasks()]
        deks = {b.block: b.dek for b in blocks}

        examples = artifact_utils.get_single_instance(output_dict["examples"])
        names = [name for name, _ in splits]
        examples.split_names = artifact_utils.encode_split_names(names)
        bounds = split_bounds(splits)
        location = staging_location(exec_properties, self._beam_pipeline_args)
        staged, staged_tasks = (staged_run(location) if location else None), []
        old_umask = os.umask(0o077)  # the raw copies (and local staged ciphertext): 0600 files in 0700 folders
        try:
            if staged is not None:
                stage_files(blocks, staged, staged_tasks)
                tasks = staged_tasks
            with self._make_beam_pipeline() as p:
                records = p | "GrantedFiles" >> beam.Create(tasks) | "Read" >> beam.ParDo(_ReadSealed(deks))
                parts = records | "Split" >> beam.Partition(
                    lambda rec, n, b=tuple(bounds): split_index(rec, b), len(names)
                )
                for name, part in zip(names, parts):
                    uri = artifact_utils.get_split_uri([examples], name)
                    _ = part | f"Write[{name}]" >> beam.io.WriteToTFRecord(
                        os.path.join(uri, FILE_PREFIX), file_name_suffix=".gz"
                    )
        finally:
            os.umask(old_umask)
            if staged is not None:
                unstage(staged, staged_tasks)
        _make_private(examples.uri)

        from tfx.components.util import examples_utils
        from tfx.proto import example_gen_pb2

        examples_utils.set_payload_format(examples, example_gen_pb2.PayloadFormat.FORMAT_TF_EXAMPLE)
        examples_utils.set_file_format(examples, "tfrecords_gzip")
        examples.set_string_custom_property("grant_id", grant.id)
        examples.set_string_custom_property("stream", grant.stream)
        examples.set_string_custom_property("block_ids", json.dumps(list(grant.blocks)))
        examples.set_int_custom_property("block_count", len(grant.blocks))
        examples.set_float_custom_property("epsilon", grant.epsilon)
        examples.set_float_custom_property("delta", grant.delta)
        # MLMD 1.17's SQLite store keeps only ~6 decimals of a double (1e-7 reads back as 0.0): exact values here.
        examples.set_string_custom_property(
            "charge",
            json.dumps(
                {"epsilon": grant.epsilon, "delta": grant.delta, "accounting": grant.accounting, "rule": grant.rule}
            ),
        )
        examples.set_string_custom_property(SPLIT_RULE_PROPERTY, json.dumps(dict(splits)))
        examples.set_string_custom_property(DATA_PROPERTY, data)
        if released is not None:
            value, eps = released
            examples.set_float_custom_property("dp_record_count", value)
            examples.set_float_custom_property("dp_record_count_epsilon", eps)
