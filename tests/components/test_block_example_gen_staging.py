"""BlockExampleGen with a staging location: the Beam workers need not see the data root.

The launcher (ledger and data root open to it alone) copies the granted blocks' sealed files to a fresh run
under the staging location (the ``staging_location`` exec property or the Beam ``--temp_location``), the
workers read the copies through Beam's FileSystems with the local reader's checks (``sealed.read_file``),
and the staged run is deleted when the job ends (docs/scale_out.md, "BlockExampleGen on remote workers").

- in process, a local staging folder apart from the data root: the same splits and records as without it,
  the staging folder empty afterwards;
- a staged copy altered, truncated, or moved to another block's name is refused naming the staged file;
- (slow) the Beam workers (PortableRunner, EXTERNAL worker pool) in a mount namespace where the ledger and
  the data root are an empty read-only tmpfs: the same Examples as in process; the control (no staging)
  fails naming --staging-location.
"""

import json
import os
import shutil
import subprocess

import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path
from sage_tfx.ingest import sealed
from sage_tfx.ingest.pipeline import ingest_batches, make_spec
from sage_tfx.ingest.records import infer_schema, read_batches, read_tfrecords
from sage_tfx.privacy import Ledger

pytestmark = pytest.mark.tf


def _world(root):
    """A ledger with the real taxi rows in daily blocks (stream taxi) and a charged grant on 12 of them."""
    db, data = str(root / "ledger.db"), str(root / "data")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("taxi", 10.0, 1e-5)
        path = taxi_csv_path("simple")
        schema = infer_schema(path, "csv")
        ingest_batches(
            ledger,
            "taxi",
            data,
            read_batches(path, "csv", schema),
            make_spec("time", "taxi", TIME_COLUMN, "1d"),
            schema,
        )
        blocks = [b.id for b in ledger.blocks("taxi")][:12]
        grant = ledger.request("p1", "taxi", blocks=blocks, epsilon=0.5, delta=1e-7)
    return dict(db=db, data=data, grant=grant.to_json(), blocks=blocks)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return _world(tmp_path_factory.mktemp("bexs"))


@pytest.fixture(scope="module")
def in_process(world, tmp_path_factory):
    """The reference: the world's Examples from one BlockExampleGen run on the in-process DirectRunner."""
    return _run(world, tmp_path_factory.mktemp("plain"))


def _run(world, out, beam_args=(), **props):
    from tfx.types import standard_artifacts

    from sage_tfx.components.block_example_gen_executor import Executor

    examples = standard_artifacts.Examples()
    examples.uri = str(out)
    os.makedirs(examples.uri, exist_ok=True)
    Executor(Executor.Context(beam_pipeline_args=list(beam_args))).Do(
        {},
        {"examples": [examples]},
        {
            "grant": world["grant"],
            "ledger": world["db"],
            "data_root": world["data"],
            "stream": "taxi",
            "splits": json.dumps({"train": 9, "eval": 1}),
            **props,
        },
    )
    return {
        split: sorted(
            r
            for f in sorted(os.listdir(os.path.join(out, f"Split-{split}")))
            for r in read_tfrecords(os.path.join(out, f"Split-{split}", f))
        )
        for split in ("train", "eval")
    }


@pytest.mark.slow  # two Beam jobs and the module's reference, ~40 s on 2 shared cores
def test_local_staging_folder_gives_the_same_examples(world, in_process, tmp_path):
    want = in_process
    assert len(want["train"]) > 0 and len(want["eval"]) > 0
    staging = tmp_path / "staging"
    staging.mkdir()
    got = _run(world, tmp_path / "staged", beam_args=[f"--temp_location={staging}"])
    assert got == want
    assert os.listdir(staging) == []  # the staged run is deleted
    got = _run(world, tmp_path / "staged2", staging_location=str(staging))  # the exec property
    assert got == want and os.listdir(staging) == []


def test_unknown_staging_scheme_is_refused_naming_it(world, tmp_path):
    with pytest.raises(sealed.SealedError, match="staging location 'nosuchfs://b/s' has no Beam filesystem"):
        _run(world, tmp_path / "x", staging_location="nosuchfs://b/s")


@pytest.mark.parametrize("where", ["local folder", "object-store URL"])
def test_altered_or_moved_staged_files_are_refused_naming_the_file(world, tmp_path, where):
    """The staged copies, in a local folder or behind a Beam FileSystems URL (``sagetest://``, the
    object-store-shaped filesystem of tests/ingest/test_ingest_staging.py, in this process), read by the one reader."""
    from sage_tfx.components.block_example_gen_executor import stage_files, staged_run, unstage
    from sage_tfx.ingest.access import grant_blocks

    with Ledger.open(world["db"]) as ledger:
        _, blocks = grant_blocks(ledger, world["data"], world["grant"], stream="taxi")
    deks = {b.block: b.dek for b in blocks}
    if where == "local folder":
        location, local, left = str(tmp_path / "staging"), (lambda url: url), tmp_path / "staging"
    else:
        from tests.ingest.test_ingest_staging import SCHEME, DirStore

        DirStore.root = str(tmp_path / "objects")
        os.makedirs(DirStore.root)
        location, local, left = f"{SCHEME}://stage", DirStore(None)._local, tmp_path / "objects"
    run, tasks = staged_run(location), []
    try:
        stage_files(blocks[:2], run, tasks)
        (s0, b0, p0, n0, h0, name0), (s1, b1, p1, n1, h1, name1) = tasks[0], tasks[-1]  # noqa: F841
        assert b0 != b1 and sealed.is_url(p0) == (where != "local folder")
        assert len(list(sealed.read_file(p0, deks[b0], s0, b0, n0, h0, name=name0))) > 0  # as staged: readable

        data = bytearray(open(local(p0), "rb").read())
        data[len(data) // 2] ^= 1
        open(local(p0), "wb").write(bytes(data))
        with pytest.raises(sealed.SealedError, match=f"block file {p0} does not match the digest recorded"):
            list(sealed.read_file(p0, deks[b0], s0, b0, n0, h0, name=name0))
        # the chunks themselves are authenticated too (digest check skipped): the flipped bit is found
        with pytest.raises(sealed.SealedError, match=f"block file {p0} fails authentication"):
            list(sealed.read_file(p0, deks[b0], s0, b0, name=name0))

        open(local(p0), "wb").write(bytes(data[: len(data) // 2]))  # truncated
        with pytest.raises(sealed.SealedError, match=f"block file {p0} does not match the digest recorded"):
            list(sealed.read_file(p0, deks[b0], s0, b0, n0, h0, name=name0))

        # block 1's file put in block 0's place: neither its digest nor its chunks (bound to block 1) pass
        shutil.copyfile(local(p1), local(p0))
        with pytest.raises(sealed.SealedError, match=f"block file {p0} does not match the digest recorded"):
            list(sealed.read_file(p0, deks[b0], s0, b0, n0, h0, name=name0))
        with pytest.raises(sealed.SealedError, match=f"block file {p0} fails authentication"):
            list(sealed.read_file(p0, deks[b1], s0, b0, name=name0))
    finally:
        unstage(run, tasks)
        if where != "local folder":
            DirStore.root = None
    assert [f for _, _, files in os.walk(left) for f in files] == []  # no staged file left


def _mount_ns(pid):
    return os.readlink(f"/proc/{pid}/ns/mnt")


@pytest.mark.slow
def test_workers_in_a_mount_namespace_without_the_data_root(world, in_process, tmp_path):
    """The workers see an empty tmpfs where the ledger, its key file and the data root are; only the staging
    folder and the output folder are shared. The Examples match the in-process run's."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        pytest.skip("needs root and util-linux's unshare and nsenter (a mount namespace for the workers)")
    from apache_beam.runners.worker.sdk_worker import SdkHarness  # noqa: F401  (Beam's portable worker present)

    from sage_tfx.clusters import portable_cluster

    hidden, staging = os.path.dirname(world["db"]), tmp_path / "staging"  # the world's ledger, key file, data
    staging.mkdir()
    want = in_process
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
        got = _run(world, tmp_path / "ns", beam_args=[*cluster.beam_args, f"--temp_location={staging}"])
        seen = subprocess.run(
            ["nsenter", "-t", str(pool[0]), "-m", "ls", "-A", str(hidden)], capture_output=True, text=True, check=True
        )
        assert seen.stdout == "", f"the workers see {seen.stdout!r} in the data root's folder"
        assert os.listdir(staging) == []  # the staged run was deleted
        # the control: without a staging location the same workers cannot open the data root's files
        with pytest.raises(Exception, match="does not exist on the Beam worker.*--staging-location"):
            _run(world, tmp_path / "control", beam_args=cluster.beam_args)
    assert got == want
    assert sum(len(v) for v in got.values()) > 0


def test_sage_run_staging_location_is_beams_temp_location():
    from sage_tfx.cli.run import staging_beam_args

    assert staging_beam_args(["--runner=PortableRunner"], "/s") == ["--runner=PortableRunner", "--temp_location=/s"]
    assert staging_beam_args(["--temp_location=/s"], "/s") == ["--temp_location=/s", "--temp_location=/s"]
    assert staging_beam_args(["--x=1"], None) == ["--x=1"]
    with pytest.raises(ValueError, match="--staging-location '/b' and the Beam option '--temp_location=/a' disagree"):
        staging_beam_args(["--temp_location=/a"], "/b")
