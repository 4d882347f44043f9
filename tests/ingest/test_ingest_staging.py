"""`sage ingest --staging-location`: the Beam workers need not share the launcher's disk.

Workers write the sealed part files and the sealed part list under a fresh run of the staging
location through Beam's FileSystems; the driver copies what it commits into the data root (O_EXCL, 0600,
sizes and SHA-256 checked against the part list) and deletes the staged run (docs/scale_out.md,
docs/security.md "Staging outside the data root").

- a local staging folder apart from the data root gives the same blocks, counts and records as the default;
- an object-store-shaped Beam filesystem (``sagetest://``, below: no directories, no O_EXCL, no file modes)
  as staging location and input URL glob: the same again; the part list there is sealed (no row counts or
  digests in the clear); a part or the part list altered in the store is refused with nothing registered;
- a staging URL of an unknown scheme is refused naming the value, changing nothing;
- (slow) the Beam workers run in a mount namespace where the ledger and the data root are an empty read-only
  tmpfs (``portable_cluster(worker_prefix=["unshare", "-m", ...])``, PortableRunner with an EXTERNAL worker
  pool): the taxi CSV gives the same blocks, row counts and decrypted records as the in-process DirectRunner;
  the control, the same workers with the default staging under the data root, fails naming --staging-location
  and registers nothing.
"""

import collections
import os
import shutil
import stat
import subprocess
import time

import pytest
from apache_beam.io.filesystem import BeamIOError, FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem

from sage_tfx.ingest import layout, sealed, staging, store
from sage_tfx.ingest.access import read_block_records
from sage_tfx.ingest.blocks import TimeBlocks
from sage_tfx.ingest.pipeline import ingest
from sage_tfx.ingest.records import InputError, decode, infer_schema, read_batches
from sage_tfx.privacy import Ledger
from tests.privacy.test_ledger_bad_input import dump

T0 = 1600000000  # 2020-09-13T12:26:40Z
SCHEME = "sagetest"


# ------------------------------------------------------------------ an object-store-shaped Beam filesystem
class DirStore(LocalFileSystem):
    """``sagetest://KEY``: objects kept as files under ``DirStore.root`` (set by the ``store_root`` fixture).

    Shaped like an object store for the code under test: no directories (``has_dirs`` is False: listing is by
    key prefix, a key's "folders" appear and vanish with its objects), objects are created with plain
    ``open(..., "wb")`` (no O_EXCL, the process umask's modes), nothing can be locked or renamed atomically
    across objects. Beam finds it by its scheme (a FileSystem subclass), in this process only: the tests that
    use it run on the in-process DirectRunner.
    """

    root = None

    @classmethod
    def scheme(cls):
        return SCHEME

    def _local(self, url):
        if not url.startswith(f"{SCHEME}://"):
            raise ValueError(f"{url!r} is not a {SCHEME}:// URL")
        return os.path.join(self.root, url[len(f"{SCHEME}://") :])

    def join(self, basepath, *paths):
        return "/".join([basepath.rstrip("/")] + [p.strip("/") for p in paths])

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def _url_dirname(self, url_or_path):
        return self.split(url_or_path)[0]

    def has_dirs(self):
        return False

    def mkdirs(self, path):
        pass

    def _list(self, dir_or_prefix):
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                local = os.path.join(dirpath, name)
                url = f"{SCHEME}://" + os.path.relpath(local, self.root).replace(os.sep, "/")
                if url.startswith(dir_or_prefix):
                    yield FileMetadata(url, os.path.getsize(local), os.path.getmtime(local))

    def create(self, path, mime_type="application/octet-stream", compression_type=None):
        local = self._local(path)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        return open(local, "wb")

    def open(self, path, mime_type="application/octet-stream", compression_type=None):
        return open(self._local(path), "rb")

    def exists(self, path):
        return os.path.isfile(self._local(path))

    def size(self, path):
        return os.path.getsize(self._local(path))

    def last_updated(self, path):
        return os.path.getmtime(self._local(path))

    def metadata(self, path):
        local = self._local(path)
        if not os.path.isfile(local):
            raise BeamIOError(f"no object {path}")
        return FileMetadata(path, os.path.getsize(local), os.path.getmtime(local))

    def delete(self, paths):
        missing = {}
        for path in paths:
            local = self._local(path)
            if not os.path.isfile(local):
                missing[path] = FileNotFoundError(path)
                continue
            os.remove(local)
            folder = os.path.dirname(local)
            while folder != self.root and not os.listdir(folder):  # no empty "folders" in an object store
                os.rmdir(folder)
                folder = os.path.dirname(folder)
        if missing:
            raise BeamIOError("Delete operation failed", missing)


@pytest.fixture
def store_root(tmp_path):
    DirStore.root = str(tmp_path / "objects")
    os.makedirs(DirStore.root)
    yield DirStore.root
    DirStore.root = None


# ------------------------------------------------------------------ helpers
def _rows(table):
    cols = table.to_pydict()
    return collections.Counter(tuple((k, repr(cols[k][i])) for k in sorted(cols)) for i in range(table.num_rows))


def _ledger(path, streams=("s",)):
    with Ledger.open(str(path), create=True) as ledger:
        for s in streams:
            ledger.create_stream(s, 1.0, 1e-6)
    return str(path)


def _blocks(db, data, stream="s"):
    """{block id: exact row count}, {block id: its decrypted records as a multiset of rows}."""
    with Ledger.open(db) as ledger:
        counts = {b.id: ledger.private_row_count(stream, b.id) for b in ledger.blocks(stream)}
        schema = layout.stream_config(data, stream)["schema"]
        records = {
            b: _rows(decode(list(read_block_records(ledger, data, stream, [b], purpose="test")), schema))
            for b in counts
        }
    return counts, records


def _small_csvs(folder, n_files=2, rows=120):
    """``n_files`` CSVs of ``rows`` rows each over 3 days (a few blocks, more than one part per block)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for f in range(n_files):
        lines = ["t,x,s"] + [f"{T0 + (f * rows + i) * 1800},{f * rows + i},v{i % 7}" for i in range(rows)]
        path = os.path.join(folder, f"part{f}.csv")
        with open(path, "w") as out:
            out.write("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def _ingest_small(tmp_path, name, inputs, **kw):
    db, data = _ledger(tmp_path / f"{name}.db"), str(tmp_path / f"{name}-data")
    result = ingest(db, "s", inputs, data, time_column="t", window="1d", progress=False, **kw)
    return result, db, data


def _tree(root):
    """Every path under ``root`` with its mode and size (and a file's bytes): a data root's full state."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            content = open(p, "rb").read() if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(p, root)] = (stat.S_IMODE(st.st_mode), st.st_size, content)
    return out


@pytest.fixture
def reference(tmp_path):
    """The small CSVs ingested with the default staging (DATA_ROOT/s/_staging), in process."""
    inputs = _small_csvs(str(tmp_path / "in"))
    result, db, data = _ingest_small(tmp_path, "default", inputs)
    counts, records = _blocks(db, data)
    assert sum(counts.values()) == 240 and len(counts) >= 3
    return inputs, result, counts, records


def _same(got_result, got_db, got_data, reference):
    _, result, counts, records = reference
    assert sorted(got_result["added"]) == sorted(result["added"]) and got_result["unchanged"] == []
    got_counts, got_records = _blocks(got_db, got_data)
    assert got_counts == counts
    assert got_records == records


def _modes_are_private(data):
    for dirpath, dirs, files in os.walk(data):
        for d in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, d)).st_mode) == 0o700, os.path.join(dirpath, d)
        for f in files:
            if f.endswith(sealed.SUFFIX) or f == layout.BLOCK_FILE:
                assert stat.S_IMODE(os.stat(os.path.join(dirpath, f)).st_mode) == 0o600, os.path.join(dirpath, f)


# ------------------------------------------------------------------ fast tests
def test_staging_in_a_local_folder_apart_from_the_data_root(tmp_path, reference):
    inputs = reference[0]
    staging = tmp_path / "elsewhere" / "staging"  # created by the ingest, 0700
    result, db, data = _ingest_small(tmp_path, "local", inputs, staging_location=str(staging))
    _same(result, db, data, reference)
    _modes_are_private(data)
    assert stat.S_IMODE(os.stat(staging).st_mode) == 0o700
    assert os.listdir(staging) == []  # the staged run is deleted after the commit
    assert os.listdir(os.path.join(data, "s", layout.STAGING)) == [".commit.lock"]  # the local commit run is gone

    # the same input again: nothing added, nothing copied or left anywhere
    again = ingest(db, "s", inputs, data, time_column="t", window="1d", progress=False, staging_location=str(staging))
    assert again["added"] == [] and sorted(again["unchanged"]) == sorted(result["added"])
    assert os.listdir(staging) == []


def test_staging_location_inside_or_around_the_data_root_is_refused(tmp_path, reference):
    inputs = reference[0]
    db, data = _ledger(tmp_path / "l.db"), str(tmp_path / "d")
    before = dump(db)
    for location, text in [
        (os.path.join(data, "stage"), "inside the data root"),
        (str(tmp_path), "holds the data root"),
    ]:
        with pytest.raises(InputError) as err:
            ingest(db, "s", inputs, data, time_column="t", window="1d", progress=False, staging_location=location)
        assert repr(location) in str(err.value) and text in str(err.value), str(err.value)
        assert "nothing was changed" in str(err.value)
        assert dump(db) == before and not os.path.exists(data)
    # the default folder given explicitly is the default
    result = ingest(
        db,
        "s",
        inputs,
        data,
        time_column="t",
        window="1d",
        progress=False,
        staging_location=os.path.join(data, "s", layout.STAGING),
    )
    assert sorted(result["added"]) == sorted(reference[1]["added"])


def test_unknown_staging_scheme_is_refused_naming_it_and_changes_nothing(tmp_path, reference, capsys):
    from sage_tfx.cli import build_parser

    inputs = reference[0]
    db, data = _ledger(tmp_path / "l.db"), str(tmp_path / "d")
    ingest(db, "s", inputs[:1], data, time_column="t", window="1d", progress=False)  # a stream with blocks
    before_db, before_data = dump(db), _tree(data)
    bad = "nosuchfs://bucket/staging"
    args = build_parser("ingest").parse_args(
        [
            "ingest",
            "--db",
            db,
            "--stream",
            "s",
            "--input",
            inputs[1],
            "--data-root",
            data,
            "--time-column",
            "t",
            "--window",
            "1d",
            "--staging-location",
            bad,
            "--quiet",
        ]
    )
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert f"staging location {bad!r}" in err and "'nosuchfs'" in err, err
    assert "gs://" in err and "folder outside the data root" in err, err  # the fix
    assert dump(db) == before_db
    assert _tree(data) == before_data


def test_object_store_staging_and_url_inputs(tmp_path, reference, store_root):
    """Inputs as a URL glob and staging at a URL, both through Beam's FileSystems (``DirStore``)."""
    for path in reference[0]:
        os.makedirs(os.path.join(store_root, "in"), exist_ok=True)
        shutil.copy(path, os.path.join(store_root, "in", os.path.basename(path)))
    result, db, data = _ingest_small(tmp_path, "url", f"{SCHEME}://in/part*.csv", staging_location=f"{SCHEME}://stage/")
    _same(result, db, data, reference)
    _modes_are_private(data)  # copied into the data root with the local guarantees
    assert sorted(os.listdir(store_root)) == ["in"]  # the staged run is deleted: no sealed leftovers

    # a missing URL input names the pattern; nothing changes
    before = dump(db)
    with pytest.raises(InputError, match=f"input '{SCHEME}://in/nothing\\*.csv' does not exist"):
        ingest(db, "s", f"{SCHEME}://in/nothing*.csv", data, time_column="t", window="1d", progress=False)
    assert dump(db) == before


def _stage_by_hand(db, data, inputs, run, run_key):
    """Write parts and the part list to a staged run as the ingest's workers do (BlockWriter, write_parts)."""
    spec = TimeBlocks("t", "1d")
    schema = infer_schema(inputs[0], "csv")
    parts = []
    for path in inputs:
        writer = store.BlockWriter(run, spec, schema, stream="s", run_key=run_key)
        for batch in read_batches(path, "csv", schema):
            writer.add(batch)
        parts.extend(writer.close())
    staging.write_parts(run, parts, run_key)
    return spec, schema


def _commit_staged(db, data, run, spec, schema, run_key):
    with Ledger.open(db) as ledger:
        local = staging.new_run_dir(data, "s")
        try:
            parts = staging.read_parts(run, run_key)
            return store.commit(ledger, "s", data, local, parts, spec, schema, run_key=run_key, staged_run=run)
        finally:
            staging.remove_run_dir(local)


def test_part_altered_in_the_object_store_is_refused_at_commit(tmp_path, reference, store_root):
    db, data = _ledger(tmp_path / "l.db"), str(tmp_path / "d")
    run, run_key = f"{SCHEME}://stage/{'a' * 32}", sealed.new_run_key()
    spec, schema = _stage_by_hand(db, data, reference[0], run, run_key)
    block = sorted(b for b in os.listdir(os.path.join(store_root, "stage", "a" * 32)) if b != staging.PARTS_FILE)[0]
    folder = os.path.join(store_root, "stage", "a" * 32, block)
    victim = os.path.join(folder, sorted(os.listdir(folder))[0])
    raw = bytearray(open(victim, "rb").read())
    raw[100] ^= 1
    open(victim, "wb").write(bytes(raw))
    before = dump(db)
    with pytest.raises(InputError, match="altered or damaged in the staging location; nothing was registered"):
        _commit_staged(db, data, run, spec, schema, run_key)
    assert dump(db) == before
    assert [b for b in os.listdir(os.path.join(data, "s")) if not b.startswith("_")] == []  # no block moved in

    raw[100] ^= 1  # restored: the same staged run commits
    open(victim, "wb").write(bytes(raw))
    result = _commit_staged(db, data, run, spec, schema, run_key)
    assert sorted(result["added"]) == sorted(reference[1]["added"])
    assert staging.remove_staged_run(run) is None and os.listdir(store_root) == []


def test_part_list_is_sealed_and_an_edited_one_is_refused(tmp_path, reference, store_root):
    db, data = _ledger(tmp_path / "l.db"), str(tmp_path / "d")
    run, run_key = f"{SCHEME}://stage/{'b' * 32}", sealed.new_run_key()
    _stage_by_hand(db, data, reference[0], run, run_key)
    listing = os.path.join(store_root, "stage", "b" * 32, staging.PARTS_FILE)
    body = bytearray(open(listing, "rb").read())
    parts = staging.read_parts(run, run_key)
    assert sum(p["rows"] for p in parts) == 240
    for p in parts:  # the store sees no row count, digest or file hash of the list
        assert p["digest"].encode() not in body and p["sha256"].encode() not in body and b'"rows"' not in body
    with pytest.raises(InputError, match="does not authenticate under this run's key"):
        staging.read_parts(run, sealed.new_run_key())  # another run's key
    body[-1] ^= 1
    open(listing, "wb").write(bytes(body))
    with pytest.raises(InputError, match="does not authenticate under this run's key.*nothing was registered"):
        staging.read_parts(run, run_key)
    assert staging.remove_staged_run(run) is None and os.listdir(store_root) == []


def test_stale_runs_at_a_staging_url_are_removed_live_ones_kept(store_root):

    old, young = f"{SCHEME}://stage/{'c' * 32}", f"{SCHEME}://stage/{'d' * 32}"
    for run in (old, young):
        path = os.path.join(store_root, "stage", run.rsplit("/", 1)[1], "blk", "part-x.sealed")
        os.makedirs(os.path.dirname(path))
        open(path, "wb").write(b"sealed")
    not_a_run = os.path.join(store_root, "stage", "keep-me.txt")  # only run-id names are ever removed
    open(not_a_run, "w").write("x")
    past = time.time() - staging.REMOTE_STALE_SECONDS - 60
    for dirpath, _, files in os.walk(os.path.join(store_root, "stage", "c" * 32)):
        for f in files:
            os.utime(os.path.join(dirpath, f), (past, past))
    os.utime(not_a_run, (past, past))
    assert staging.clean_stale_remote_runs(f"{SCHEME}://stage") == ["c" * 32]
    assert sorted(os.listdir(os.path.join(store_root, "stage"))) == ["d" * 32, "keep-me.txt"]


# ------------------------------------------------------------------ the workers without the launcher's disk (slow)
TAXI_ROWS = 15_002


def _ingest_taxi(root, name, beam_args, staging_location=None):
    from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path

    os.makedirs(root, exist_ok=True)
    db, data = _ledger(os.path.join(root, f"{name}.db"), ("taxi",)), os.path.join(root, f"{name}-data")
    result = ingest(
        db,
        "taxi",
        taxi_csv_path("simple"),
        data,
        time_column=TIME_COLUMN,
        window="1d",
        beam_args=beam_args,
        progress=False,
        staging_location=staging_location,
    )
    counts, records = _blocks(db, data, "taxi")
    return result, counts, records


def _mount_ns(pid):
    return os.readlink(f"/proc/{pid}/ns/mnt")


@pytest.mark.slow
def test_workers_in_a_mount_namespace_without_the_data_root(tmp_path):
    """The Beam workers (an EXTERNAL worker pool and its SDK workers, in a mount namespace of their own) see an
    empty tmpfs where the ledger, its key file and the data root are; only the staging folder and the input
    are shared. The ingest matches the in-process DirectRunner's blocks, row counts and records."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("needs root and util-linux's unshare and nsenter (a mount namespace for the workers)")
    from sage_tfx.clusters import portable_cluster
    from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path

    reference = _ingest_taxi(str(tmp_path / "ref"), "direct", [])
    hidden, staging = tmp_path / "hidden", tmp_path / "staging"
    hidden.mkdir()
    prefix = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs -o ro,size=1m,mode=0700 tmpfs "$0" && exec "$@"',
        str(hidden),
    ]
    with portable_cluster(workers=2, worker_prefix=prefix) as cluster:
        pool = [pid for pid in cluster.pids if _mount_ns(pid) != _mount_ns("self")]
        assert len(pool) == 1, "the worker pool runs in a mount namespace of its own"
        got = _ingest_taxi(str(hidden), "ns", cluster.beam_args, staging_location=str(staging))
        seen = subprocess.run(
            ["nsenter", "-t", str(pool[0]), "-m", "ls", "-A", str(hidden)], capture_output=True, text=True, check=True
        )
        assert seen.stdout == "", f"the workers see {seen.stdout!r} in the data root's folder"

        # the control: with the default staging (under the data root) the same workers cannot deliver their parts
        db = _ledger(hidden / "control.db", ("taxi",))
        before = dump(db)
        with pytest.raises(
            InputError, match="does not exist on the Beam worker .* --staging-location .*nothing was registered"
        ):
            ingest(
                db,
                "taxi",
                taxi_csv_path("simple"),
                str(hidden / "control-data"),
                time_column=TIME_COLUMN,
                window="1d",
                beam_args=cluster.beam_args,
                progress=False,
            )
        assert dump(db) == before
    assert {"ns-data", "ns.db", "ns.db.key"} <= set(os.listdir(hidden))  # what the driver wrote there
    result, counts, records = got
    _, want_counts, want_records = reference
    assert sorted(result["added"]) == sorted(want_counts) and result["unchanged"] == []
    assert counts == want_counts and sum(counts.values()) == TAXI_ROWS
    for block, want in want_records.items():
        assert records[block] == want, block
    assert os.listdir(staging) == []  # the staged run was deleted
