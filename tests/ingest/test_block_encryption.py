"""Blocks encrypted at rest: reads are gated by a charged, signed grant by construction.

No TensorFlow except the last test (a real TFX run: raw copies in the work folder are gone when it ends).
"""

import gzip
import hashlib
import json
import os
import shutil
import stat

import pytest

from sage_tfx.data.taxi import TIME_COLUMN, load_taxi
from sage_tfx.ingest import access, layout, sealed
from sage_tfx.ingest.pipeline import ingest_batches, make_spec
from sage_tfx.ingest.records import InputError, decode, read_tfrecords, schema_of, write_tfrecords
from sage_tfx.privacy import GrantError, Ledger
from sage_tfx.privacy.grants import sign

ROWS = 2000


@pytest.fixture()
def world(tmp_path):
    """Stream a: the first 2,000 real taxi trips in daily blocks; stream b: the next 2,000 (other records)."""
    db, data = str(tmp_path / "ledger.db"), str(tmp_path / "data")
    table = load_taxi("simple")
    a, b = table.slice(0, ROWS), table.slice(ROWS, ROWS)
    ledger = Ledger.open(db, create=True)
    for name, rows in (("a", a), ("b", b)):
        ledger.create_stream(name, 10.0, 1e-5)
        ingest_batches(
            ledger, name, data, rows.to_batches(), make_spec("time", name, TIME_COLUMN, "1d"), schema_of(rows.schema)
        )
    yield dict(db=db, data=data, ledger=ledger, a=a, b=b, tmp=tmp_path)
    ledger.close()


def _biggest(ledger, stream):
    return max(ledger.blocks(stream), key=lambda blk: ledger.private_row_count(stream, blk.id)).id


def _files(data, stream, block):
    return layout.block_files(data, stream, block)


def test_a_block_read_without_a_grant_is_ciphertext(world):
    data, ledger, rows = world["data"], world["ledger"], world["a"]
    blocks = ledger.blocks("a")
    # With the key (trusted code) the files give back every record; without it, the bytes below are all there is.
    records = list(access.read_block_records(ledger, data, "a", [blk.id for blk in blocks], purpose="test"))
    assert len(records) == ROWS == sum(ledger.private_row_count("a", blk.id) for blk in blocks)
    companies = {c for c in rows.column("company").to_pylist() if c and len(c) > 8}
    assert companies  # known raw values to look for
    on_disk = b""
    # the data root and the stream's folder are private too (data roots 0700, files 0600)
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.dirname(layout.block_dir(data, "a", blocks[0].id))).st_mode) == 0o700
    for blk in blocks:
        folder = layout.block_dir(data, "a", blk.id)
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        manifest = json.load(open(os.path.join(folder, layout.BLOCK_FILE)))
        assert "rows" not in json.dumps(manifest)  # no row count beside the data
        for path in _files(data, "a", blk.id):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            raw = open(path, "rb").read()
            on_disk += raw
            assert raw.startswith(sealed.MAGIC)  # no gzip stream to open
            with pytest.raises(OSError):
                gzip.decompress(raw)
            with pytest.raises(InputError):  # a TFRecord reader finds no records: the framing is encrypted
                list(read_tfrecords(path))
            from apache_beam.io.tfrecordio import _TFRecordUtil

            with open(path, "rb") as f, pytest.raises(Exception):  # noqa: B017
                _TFRecordUtil.read_record(f)
    # No raw record, no raw value, and no encoded record's frame is on disk.
    assert not any(rec in on_disk for rec in records)
    assert not any(c.encode() in on_disk for c in companies)
    # The sizes tell only a size rounded to 4 KiB: a one-record block and a big block's part may look alike.
    sizes = {os.path.getsize(p) for blk in blocks for p in _files(data, "a", blk.id)}
    full = sealed.CHUNK + 28  # nonce + chunk + tag
    lasts = [(s - 12) - (s - 13) // full * full for s in sizes]
    assert all((last - 28) % sealed.PAD == 0 for last in lasts)


def test_a_grant_on_one_stream_cannot_read_another_streams_block(world, tmp_path):
    data, ledger = world["data"], world["ledger"]
    mine, theirs = _biggest(ledger, "a"), _biggest(ledger, "b")
    grant = ledger.request("p", "a", blocks=[mine], epsilon=0.5)
    assert len(list(access.grant_blocks(ledger, data, grant.to_json())[1][0].records())) > 0  # the grant works
    ours, other = layout.block_dir(data, "a", mine), layout.block_dir(data, "b", theirs)

    # 1. stream b's whole block folder moved in place of stream a's block, its manifest edited to name a's block
    shutil.rmtree(ours)
    shutil.copytree(other, ours)
    manifest_path = os.path.join(ours, layout.BLOCK_FILE)
    manifest = json.load(open(manifest_path))
    assert manifest["stream"] == "b"
    with pytest.raises(sealed.SealedError, match="is for block .* of stream 'b'"):
        access.grant_blocks(ledger, data, grant.to_json())
    manifest.update(stream="a", block=mine)
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(sealed.SealedError, match="does not authenticate under this block's key"):
        access.grant_blocks(ledger, data, grant.to_json())

    # 2. even with a's own key handed over, b's files do not decrypt as a's block (stream and block are bound)
    key = ledger.keyring.block_key("a", mine)
    dek_guess = sealed.unwrap(
        json.load(open(os.path.join(other, layout.BLOCK_FILE))), ledger.keyring.block_key("b", theirs), "b's manifest"
    )  # (trusted code only: b's own key)
    path = _files(data, "b", theirs)[0]
    with pytest.raises(sealed.SealedError, match="fails authentication"):
        list(sealed.read_file(path, dek_guess, "a", mine))
    with pytest.raises(sealed.SealedError, match="does not authenticate"):
        sealed.unwrap(json.load(open(os.path.join(other, layout.BLOCK_FILE))), key, "b's manifest under a's key")


def test_a_flipped_byte_is_refused_naming_the_file(world):
    data, ledger = world["data"], world["ledger"]
    block = _biggest(ledger, "a")
    path = _files(data, "a", block)[0]
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0x01
    open(path, "wb").write(bytes(raw))
    grant = ledger.request("p", "a", blocks=[block], epsilon=0.5)
    _, blocks = access.grant_blocks(ledger, data, grant.to_json())
    got = []
    with pytest.raises(sealed.SealedError, match=f"block file {path} does not match the digest recorded at ingest"):
        for rec in blocks[0].records():
            got.append(rec)
    assert got == []  # refused before a record was yielded
    # Its recorded digest edited to match: the manifest no longer authenticates.
    manifest_path = os.path.join(layout.block_dir(data, "a", block), layout.BLOCK_FILE)
    manifest = json.load(open(manifest_path))

    manifest["files"][0]["sha256"] = hashlib.sha256(bytes(raw)).hexdigest()
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(sealed.SealedError, match="does not authenticate"):
        access.grant_blocks(ledger, data, grant.to_json())


def test_paths_escaping_the_block_folder_are_refused(world):
    data, ledger = world["data"], world["ledger"]
    mine, neighbour = [blk.id for blk in ledger.blocks("a")][:2]
    grant = ledger.request("p", "a", blocks=[mine], epsilon=0.5)
    folder = layout.block_dir(data, "a", mine)
    manifest_path = os.path.join(folder, layout.BLOCK_FILE)
    original = open(manifest_path).read()
    target = os.path.basename(_files(data, "a", neighbour)[0])
    for name in (f"../{neighbour}/{target}", "..", "/etc/passwd"):
        manifest = json.loads(original)
        manifest["files"][0]["name"] = name
        json.dump(manifest, open(manifest_path, "w"))
        with pytest.raises(sealed.SealedError, match="not a plain file name"):
            access.grant_blocks(ledger, data, grant.to_json())
    # A block file replaced by a symlink to a file outside the folder (the manifest untouched)
    open(manifest_path, "w").write(original)
    part = _files(data, "a", mine)[0]
    os.remove(part)
    os.symlink(_files(data, "a", neighbour)[0], part)
    with pytest.raises(sealed.SealedError, match="resolves outside its block folder"):
        access.grant_blocks(ledger, data, grant.to_json())
    # A block folder that is a symlink to another block's folder
    os.remove(part)
    shutil.rmtree(folder)
    os.symlink(layout.block_dir(data, "a", neighbour), folder)
    with pytest.raises(sealed.SealedError, match="a symlink"):
        access.grant_blocks(ledger, data, grant.to_json())


def test_forged_unsigned_or_uncharged_grants_get_no_keys(world, tmp_path):
    ledger, data = world["ledger"], world["data"]
    blocks = [blk.id for blk in ledger.blocks("a")]
    grant = ledger.request("p", "a", blocks=blocks[:2], epsilon=0.5)
    body = json.loads(grant.to_json())
    unsigned = dict(body, signature="")
    widened = dict(body, blocks=blocks)  # more blocks than were charged, old signature
    uncharged = dict(body, blocks=blocks)  # validly signed, but the ledger never charged or recorded it
    uncharged["signature"] = sign(ledger.keyring, {k: v for k, v in uncharged.items() if k != "signature"})
    other = ledger.request("p", "b", blocks=[ledger.blocks("b")[0].id], epsilon=0.5)
    cases = {
        "unsigned": (unsigned, "forged"),
        "widened": (widened, "forged"),
        "uncharged": (uncharged, "differs from the ledger's record"),
        "fabricated": (
            dict(
                uncharged,
                id="g-never-made",
                signature=sign(
                    ledger.keyring, {k: v for k, v in dict(uncharged, id="g-never-made").items() if k != "signature"}
                ),
            ),
            "unknown",
        ),
        "other stream": (json.loads(other.to_json()), "is for stream 'b'"),
    }
    for _case, (forged, message) in cases.items():
        with pytest.raises(GrantError, match=message):
            access.grant_block_keys(ledger, json.dumps(forged), stream="a")
    with pytest.raises(GrantError):
        access.grant_blocks(ledger, data, None)
    _, keys = access.grant_block_keys(ledger, grant.to_json(), stream="a")  # the real grant: its blocks' keys only
    assert sorted(keys) == sorted(blocks[:2])


def test_unencrypted_blocks_are_refused_then_encrypted_by_reingesting(world):
    """A block folder as an older version wrote it (plain gzip TFRecord) is not read; ingesting the same
    input again re-writes it encrypted, nothing registered or charged."""
    data, ledger, rows = world["data"], world["ledger"], world["a"]
    block = _biggest(ledger, "a")
    records = list(access.read_block_records(ledger, data, "a", [block], purpose="test"))
    folder = layout.block_dir(data, "a", block)
    manifest = json.load(open(os.path.join(folder, layout.BLOCK_FILE)))
    shutil.rmtree(folder)
    os.makedirs(folder)
    write_tfrecords(os.path.join(folder, "part-old-00000.tfrecord.gz"), records)
    json.dump(
        {
            "stream": "a",
            "block": block,
            "digest": manifest["digest"],
            "files": ["part-old-00000.tfrecord.gz"],
            "start": manifest["start"],
            "end": manifest["end"],
        },
        open(os.path.join(folder, layout.BLOCK_FILE), "w"),
    )
    with pytest.raises(sealed.SealedError, match="stored unencrypted .* ingesting the same input again"):
        list(access.read_block_records(ledger, data, "a", [block], purpose="test"))
    before = [(blk.id, blk.spent) for blk in ledger.blocks("a")]
    result = ingest_batches(
        ledger, "a", data, rows.to_batches(), make_spec("time", "a", TIME_COLUMN, "1d"), schema_of(rows.schema)
    )
    assert result["added"] == [] and result["encrypted"] == [block]
    assert [(blk.id, blk.spent) for blk in ledger.blocks("a")] == before
    schema = layout.stream_config(data, "a")["schema"]

    def rows_of(recs):  # tf.Example bytes may order their map differently: compare the decoded rows
        return sorted(map(str, decode(list(recs), schema).to_pylist()))

    assert rows_of(access.read_block_records(ledger, data, "a", [block], purpose="test")) == rows_of(records)
    assert all(p.endswith(sealed.SUFFIX) for p in _files(data, "a", block))


# ---------------------------------------------------------------- the pipeline work folder (TFX)
def _raw_files(root):
    return sorted(
        os.path.join(d, f)
        for d, _, fs in os.walk(root)
        for f in fs
        if f.startswith(("data_tfrecord", "transformed_examples"))
    )


_SEEN = {}


def _inspect(examples):
    """A TFX component (made in the test: TFX's decorator wants a module-level function) after BlockExampleGen."""
    _SEEN["files"] = _raw_files(examples.uri)
    _SEEN["modes"] = {stat.S_IMODE(os.stat(p).st_mode) for p in _SEEN["files"]}
    _SEEN["dirs"] = {stat.S_IMODE(os.stat(d).st_mode) for d, _, _ in os.walk(examples.uri)}
    if _SEEN["fail"]:
        raise RuntimeError("a component failed after BlockExampleGen wrote its copies")


@pytest.mark.tf
@pytest.mark.parametrize("outcome", ["success", "failure"])
def test_raw_copies_in_the_work_folder_are_gone_when_the_run_ends(world, tmp_path, outcome):
    """BlockExampleGen's plain copies exist during the run (0600 in 0700 folders) and are removed when it
    ends, whether the run succeeds or fails; MLMD marks them DELETED so TFX's cache cannot reuse them."""
    from ml_metadata.metadata_store import metadata_store
    from tfx.dsl.component.experimental.annotations import InputArtifact
    from tfx.dsl.component.experimental.decorators import component
    from tfx.orchestration import pipeline as tfx_pipeline
    from tfx.types import standard_artifacts

    from sage_tfx.components.block_example_gen import BlockExampleGen
    from sage_tfx.pipelines._runner import PipelineConfig, make_run_iteration, metadata_config

    seen = _SEEN
    seen.clear()
    seen["fail"] = outcome == "failure"
    _inspect.__annotations__ = {"examples": InputArtifact[standard_artifacts.Examples]}
    Inspect = component(_inspect)

    ledger, data = world["ledger"], world["data"]
    grant = ledger.request("p", "a", blocks=[blk.id for blk in ledger.blocks("a")], epsilon=0.5)
    config = PipelineConfig(
        name="scrub", ledger=world["db"], stream="a", data_root=data, work_dir=str(tmp_path / "work"), target=1.0
    )

    def build(config, grant, split, eta, iteration):
        gen = BlockExampleGen(
            ledger=config.ledger, data_root=config.data_root, stream=config.stream, grant=grant.to_json()
        )
        return tfx_pipeline.Pipeline(
            pipeline_name=config.name,
            pipeline_root=config.pipeline_root,
            components=[gen, Inspect(examples=gen.outputs["examples"])],
            enable_cache=True,
            metadata_connection_config=metadata_config(config.metadata_path),
        )

    run = make_run_iteration(build, config)
    with pytest.raises(Exception, match="recorded no validation result" if outcome == "success" else "failed"):
        run(grant, None, 0.05, 1)
    assert seen["files"] and seen["modes"] == {0o600} and seen["dirs"] == {0o700}
    assert stat.S_IMODE(os.stat(config.pipeline_root).st_mode) == 0o700
    assert all(not os.path.exists(p) for p in seen["files"])
    assert _raw_files(config.pipeline_root) == []
    store_ = metadata_store.MetadataStore(metadata_config(config.metadata_path))
    examples = store_.get_artifacts_by_type("Examples")
    assert examples and all(a.state == a.DELETED for a in examples)
