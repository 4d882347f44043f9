"""BlockExampleGen executor: verify the grant, then copy exactly its blocks into train/eval splits.

Block files are encrypted at rest (``sage_tfx/ingest/sealed.py``); the executor gets the keys of exactly the
grant's blocks through ``access.grant_blocks`` (a signed grant the ledger recorded when it charged it), checks
every block's manifest, paths and file digests, and decrypts in the read step. Its output is the plain
TFRecords TFX's Transform and Trainer read: files 0600 in 0700 folders (umask 077 while it writes), removed
with the run's other raw artifacts when the run ends (``pipelines/_runner.py``, ``scrub_raw_artifacts``).
"""
import hashlib
import json
import os

from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils

from sage_tfx.components._grant import check_grant, released_record_count

DEFAULT_SPLITS = {"train": 9, "eval": 1}
FILE_PREFIX = "data_tfrecord"


def parse_splits(text):
    """'{"train": 9, "eval": 1}' -> [("train", 9), ("eval", 1)] (positive integer buckets)."""
    try:
        splits = json.loads(text) if text else dict(DEFAULT_SPLITS)
    except ValueError:
        raise ValueError(f"splits {text!r} is not JSON like {json.dumps(DEFAULT_SPLITS)}") from None
    if not isinstance(splits, dict) or not splits:
        raise ValueError(f"splits {text!r} must be a non-empty JSON object of split name -> buckets")
    out = []
    for name, buckets in splits.items():
        if not isinstance(name, str) or not name or "-" in name:
            raise ValueError(f"split name {name!r} is invalid")
        if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets <= 0:
            raise ValueError(f"split {name!r} has {buckets!r} buckets: need an integer > 0")
        out.append((name, buckets))
    return out


def split_index(record, bounds):
    """The split of one record, from a hash of its own bytes (independent of all other records)."""
    bucket = int.from_bytes(hashlib.blake2b(record, digest_size=8).digest(), "big") % bounds[-1]
    for i, bound in enumerate(bounds):
        if bucket < bound:
            return i
    raise AssertionError("unreachable")


def _read_sealed_dofn():
    import apache_beam as beam

    class ReadSealed(beam.DoFn):
        """(stream, block, path, bytes, sha256) -> the file's records, checked and decrypted (sealed.read_file)."""

        def __init__(self, deks):
            self._deks = deks  # in memory only (pickled with the DoFn for the runner)

        def process(self, task):
            from sage_tfx.ingest.sealed import read_file

            stream, block, path, size, sha256 = task
            yield from read_file(path, self._deks[block], stream, block, size, sha256)

    return ReadSealed


def _ReadSealed(deks):
    return _read_sealed_dofn()(deks)


def _make_private(root):
    """chmod 0700 every folder and 0600 every file under ``root`` (local paths only)."""
    if not os.path.isdir(root):
        return
    os.chmod(root, 0o700)
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            os.chmod(os.path.join(folder, d), 0o700)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o600)


class Executor(base_beam_executor.BaseBeamExecutor):

    def Do(self, input_dict, output_dict, exec_properties):
        import apache_beam as beam

        from sage_tfx.ingest.access import grant_blocks
        from sage_tfx.privacy import Ledger

        ledger = exec_properties.get("ledger")
        # The grant is checked with the ledger before a single record is read.
        grant = check_grant(ledger, exec_properties.get("grant"), stream=exec_properties.get("stream"))
        splits = parse_splits(exec_properties.get("splits"))
        # The keys of the grant's blocks, and only those: signature and charge re-checked by the key door itself.
        with Ledger.open(ledger) as opened:
            _, blocks = grant_blocks(opened, exec_properties["data_root"], exec_properties.get("grant"),
                                     stream=grant.stream)
        tasks = [t for b in blocks for t in b.file_tasks()]
        deks = {b.block: b.dek for b in blocks}
        released = released_record_count(ledger, grant)

        examples = artifact_utils.get_single_instance(output_dict["examples"])
        names = [name for name, _ in splits]
        examples.split_names = artifact_utils.encode_split_names(names)
        bounds, total = [], 0
        for _, buckets in splits:
            total += buckets
            bounds.append(total)
        old_umask = os.umask(0o077)  # the raw copies: 0600 files in 0700 folders
        try:
            with self._make_beam_pipeline() as p:
                records = (p | "GrantedFiles" >> beam.Create(tasks)
                           | "Read" >> beam.ParDo(_ReadSealed(deks)))
                parts = records | "Split" >> beam.Partition(lambda rec, n, b=tuple(bounds): split_index(rec, b),
                                                             len(names))
                for name, part in zip(names, parts):
                    uri = artifact_utils.get_split_uri([examples], name)
                    _ = part | f"Write[{name}]" >> beam.io.WriteToTFRecord(
                        os.path.join(uri, FILE_PREFIX), file_name_suffix=".gz")
        finally:
            os.umask(old_umask)
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
        examples.set_string_custom_property("charge", json.dumps({
            "epsilon": grant.epsilon, "delta": grant.delta, "accounting": grant.accounting, "rule": grant.rule}))
        examples.set_string_custom_property("split_rule", json.dumps(dict(splits)))
        if released is not None:
            value, eps = released
            examples.set_float_custom_property("dp_record_count", value)
            examples.set_float_custom_property("dp_record_count_epsilon", eps)
