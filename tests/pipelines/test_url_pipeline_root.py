"""The TFX pipeline root on a URL filesystem, the MLMD store local (docs/scale_out.md, "The pipeline root on
a URL filesystem").

- (slow, tf; in tests/pipelines/test_sage_run.py::test_one_iteration_runs_the_whole_tfx_pipeline_under_its_grant, one
  run shared with its lineage checks) a whole taxi iteration by `sage run taxi_regression --pipeline-root
  file://...` (a URL: TFX's file layer and Beam through ``components/_gfile_beam.py``, no chmod): it reaches a
  validation outcome, every artifact MLMD records is under the URL, the MLMD SQLite file is the only file in the
  local work dir, the raw Examples under the URL are gone and DELETED in MLMD, the Model and validation result
  are there, the audit passes;
- (slow, tf) BlockExampleGen's Beam job writes its Examples to a ram:// root (TensorFlow's in-process store, no
  local disk), the next component reads them there, the scrub removes them;
- (xfail, upstream) why a whole iteration cannot run on ram://: its folder rename loses the files;
- a --pipeline-root with a scheme neither TensorFlow nor Beam has, or one TensorFlow cannot reach, and a URL
  --metadata-path, exit 2 naming the value, with the ledger unchanged (nothing charged);
- the config: the default MLMD file stays in WORK_DIR whatever the root; `sage serve` needs {name} in a
  --metadata-path shared by several pipelines and hands both to each worker;
- the scrub on a URL root removes the Examples folders (and those of cut-short runs) through TFX's file layer,
  never a folder reached by "..";
- Beam's TFRecord write/read on ram:// through the bridge; make_private_dir: 0700 locally, no chmod on a URL;
- `sage serve`: a --metadata-path without {name} for two pipelines, or a bad root, exits 2 before anything is
  registered. (Its whole iterations on a file:// root with MLMD at --metadata-path {name}: one `sage serve` run
  shared with the Beam options' and several pipelines' checks, tests/adaptive/test_serve_beam_options.py::
  test_serve_runs_pipelines_on_multi_processing_workers_with_a_staging_dir_and_a_url_root.)
"""

import argparse
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from sage_tfx.privacy import Ledger


@pytest.fixture(scope="module")
def taxi_stream(taxi_stream_300):
    """A ledger and data root holding the first 300 real taxi days (about 3,000 trips) as daily blocks
    (conftest's session-wide ``taxi_stream_300``, replayed once per test process)."""
    return taxi_stream_300


def _copy_stream(taxi_stream, tmp_path):

    db, data = taxi_stream
    shutil.copy(db, tmp_path / "ledger.db")
    shutil.copy(f"{db}.key", tmp_path / "ledger.db.key")
    shutil.copy(f"{db}.key.head", tmp_path / "ledger.db.key.head")  # a copy goes with its head (Ledger.open checks it)
    return str(tmp_path / "ledger.db"), str(data)


def _dump(db):
    with Ledger.open(db) as ledger:
        return [ledger.log_entries(), [g.to_json() for g in ledger.grants()]]


def _sage(*args):
    from sage_tfx.cli import main

    return main([str(a) for a in args])


def test_config_keeps_mlmd_local_whatever_the_root(tmp_path):
    from sage_tfx.pipelines._runner import PipelineConfig

    local = PipelineConfig(name="p", ledger="l", stream="s", data_root="d", work_dir=str(tmp_path), target=1.0)
    assert local.pipeline_root == str(tmp_path / "tfx" / "p") and not local.remote_root
    assert local.metadata_path == str(tmp_path / "tfx" / "p" / "metadata.sqlite")  # as before
    url = PipelineConfig(
        name="p",
        ledger="l",
        stream="s",
        data_root="d",
        work_dir=str(tmp_path),
        target=1.0,
        artifact_root="gs://bucket/roots/",
    )
    assert url.pipeline_root == "gs://bucket/roots/p" and url.remote_root
    assert url.metadata_path == str(tmp_path / "tfx" / "p" / "metadata.sqlite")
    mine = PipelineConfig(
        name="p",
        ledger="l",
        stream="s",
        data_root="d",
        work_dir=str(tmp_path),
        target=1.0,
        artifact_root="s3://b/r",
        metadata_file="m.sqlite",
    )
    assert mine.metadata_path == os.path.abspath("m.sqlite")
    with pytest.raises(ValueError, match="'gs://b/m.sqlite' is a URL"):
        PipelineConfig(
            name="p",
            ledger="l",
            stream="s",
            data_root="d",
            work_dir=str(tmp_path),
            target=1.0,
            metadata_file="gs://b/m.sqlite",
        )


def test_config_paths_are_absolute_for_the_confined_child(tmp_path, monkeypatch):
    """`sage run --data-root data` (relative) named nothing in the confined child, which runs in a folder of its
    own: every local path of the config is absolute, URLs stay as given."""
    from sage_tfx.pipelines._runner import PipelineConfig

    monkeypatch.chdir(tmp_path)
    config = PipelineConfig(
        name="p", ledger="l", stream="s", data_root="data", work_dir="work", target=1.0, staging_location="stage"
    )
    assert (config.data_root, config.work_dir, config.staging_location) == (
        str(tmp_path / "data"),
        str(tmp_path / "work"),
        str(tmp_path / "stage"),
    )
    remote = PipelineConfig(
        name="p", ledger="l", stream="s", data_root="data", work_dir="work", target=1.0, staging_location="gs://b/stage"
    )
    assert remote.staging_location == "gs://b/stage"


def test_serve_needs_name_in_a_shared_metadata_path_and_hands_both_to_workers(tmp_path):
    from sage_tfx.cli.run import root_options
    from sage_tfx.cli.serve import worker_specs

    args = argparse.Namespace(pipeline_root=str(tmp_path / "roots"), metadata_path=str(tmp_path / "m.sqlite"))
    with pytest.raises(ValueError, match="m.sqlite.*shared by the pipelines a, b: put \\{name\\}"):
        root_options(args, ["a", "b"])
    args.metadata_path = str(tmp_path / "mlmd" / "{name}.sqlite")
    roots = root_options(args, ["a", "b"])
    assert roots == (str(tmp_path / "roots"), str(tmp_path / "mlmd" / "{name}.sqlite"))
    serve = argparse.Namespace(
        pipelines=[("a", "taxi_regression", 1e6, None), ("b", "taxi_regression", 2e6, None)],
        db="l.db",
        stream="s",
        data_root="d",
        work_dir=str(tmp_path / "w"),
        confidence=0.95,
        runner="local",
        max_iterations=1,
        rejection_share=None,
    )
    specs = worker_specs(serve, roots=roots)
    assert [(s.pipeline_root, s.metadata_path) for s in specs] == [roots, roots]
    from sage_tfx.pipelines.workers import build_worker_runner

    pytest.importorskip("tfx")
    configs = [build_worker_runner(s)[1].config for s in specs]
    assert [c.metadata_path for c in configs] == [str(tmp_path / "mlmd" / f"{n}.sqlite") for n in "ab"]
    assert [c.pipeline_root for c in configs] == [str(tmp_path / "roots" / n) for n in "ab"]


@pytest.mark.tf
@pytest.mark.parametrize(
    "root, message",
    [
        ("nosuchfs://bucket/roots", "--pipeline-root 'nosuchfs://bucket/roots' has no Beam filesystem"),
        # Beam has s3://, TensorFlow 2.21 does not (without tensorflow-io): TFX could not write its artifacts there
        ("s3://bucket/roots", "--pipeline-root 's3://bucket/roots' cannot be used: UnimplementedError"),
        # both have gs://, but this host reaches no GCS (no network here; elsewhere: no such bucket, or no credentials)
        (
            "gs://sage-tfx-no-such-bucket-0/roots",
            "--pipeline-root 'gs://sage-tfx-no-such-bucket-0/roots' cannot be used",
        ),
    ],
)
def test_a_bad_pipeline_root_exits_2_naming_it_before_any_charge(taxi_stream, tmp_path, capsys, root, message):
    db, data = _copy_stream(taxi_stream, tmp_path)
    before = _dump(db)
    code = _sage(
        "run",
        "taxi_regression",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--target",
        1e5,
        "--work-dir",
        tmp_path / "work",
        "--pipeline-root",
        root,
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert _dump(db) == before and not (tmp_path / "work").exists()


def test_a_url_metadata_path_exits_2_naming_it(taxi_stream, tmp_path, capsys):
    db, data = _copy_stream(taxi_stream, tmp_path)
    before = _dump(db)
    code = _sage(
        "run",
        "taxi_regression",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--target",
        1e5,
        "--work-dir",
        tmp_path / "work",
        "--metadata-path",
        "gs://bucket/mlmd.sqlite",
    )
    err = capsys.readouterr().err
    assert code == 2 and "--metadata-path 'gs://bucket/mlmd.sqlite' must be a local file path" in err, err
    assert _dump(db) == before


@pytest.mark.tf
def test_scrub_on_a_url_root_goes_through_tfx_file_layer(tmp_path):
    """Examples recorded in MLMD and the Examples folders of a run cut short before MLMD recorded them, under a
    ram:// root: removed; the Model folder stays; the MLMD file is local."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    from tfx.dsl.io import fileio

    from sage_tfx.pipelines._runner import PipelineConfig, metadata_config, scrub_raw_artifacts

    root = f"ram://scrub-{uuid.uuid4().hex}"
    config = PipelineConfig(
        name="p", ledger="l", stream="s", data_root="d", work_dir=str(tmp_path), target=1.0, artifact_root=root
    )
    base = config.pipeline_root
    recorded, cut_short, model = (
        f"{base}/BlockExampleGen/examples/1",
        f"{base}/DPTransform/transformed_examples/7",
        f"{base}/DPTrainer/model/3",
    )
    for folder in (recorded, cut_short, model):
        fileio.makedirs(f"{folder}/Split-train")
        with fileio.open(f"{folder}/Split-train/data.gz", "wb") as f:
            f.write(b"raw")
    store = metadata_store.MetadataStore(metadata_config(config.metadata_path))
    kind = store.put_artifact_type(metadata_store_pb2.ArtifactType(name="Examples"))
    outside = f"{root}/elsewhere/x"  # reached from the root only by a ".." segment: never removed
    fileio.makedirs(outside)
    with fileio.open(f"{outside}/keep", "wb") as f:
        f.write(b"not ours")
    live = metadata_store_pb2.Artifact.LIVE
    store.put_artifacts(
        [metadata_store_pb2.Artifact(type_id=kind, uri=uri, state=live) for uri in (recorded, f"{base}/../elsewhere/x")]
    )
    removed = scrub_raw_artifacts(config)
    assert sorted(removed) == sorted([recorded, cut_short])
    assert not fileio.exists(recorded) and not fileio.exists(cut_short)
    assert fileio.exists(f"{model}/Split-train/data.gz") and fileio.exists(f"{outside}/keep")
    assert [a.state for a in store.get_artifacts_by_type("Examples")] == [metadata_store_pb2.Artifact.DELETED] * 2
    assert os.path.isfile(config.metadata_path) and config.metadata_path.startswith(str(tmp_path))


_SEEN = {}


def _inspect(examples):
    """A TFX component (TFX's decorator wants a module-level function) after BlockExampleGen: what is under the
    ram:// Examples artifact while the run goes on."""
    import tensorflow as tf

    _SEEN["uri"] = examples.uri
    _SEEN["files"] = sorted(f"{d}/{f}" for d, _, fs in tf.io.gfile.walk(examples.uri) for f in fs)
    _SEEN["records"] = sum(1 for f in _SEEN["files"] for _ in tf.data.TFRecordDataset(f, compression_type="GZIP"))


@pytest.mark.slow  # one Beam job and a TFX run, ~40 s on 2 shared cores
@pytest.mark.tf
def test_block_example_gen_writes_to_a_ram_url_root_and_the_scrub_removes_it(taxi_stream, tmp_path):
    """ram:// is not the local disk: BlockExampleGen's Beam job writes its Examples there (Beam through
    components/_gfile_beam.py), the component after it reads them there, nothing but the MLMD file is written to
    the work dir, and when the run ends the scrub removes them from ram:// and marks them DELETED."""
    import tensorflow as tf
    from ml_metadata.metadata_store import metadata_store
    from tfx.dsl.component.experimental.annotations import InputArtifact
    from tfx.dsl.component.experimental.decorators import component
    from tfx.orchestration import pipeline as tfx_pipeline
    from tfx.types import standard_artifacts

    from sage_tfx.components.block_example_gen import BlockExampleGen
    from sage_tfx.pipelines._runner import PipelineConfig, make_run_iteration, metadata_config

    db, data = _copy_stream(taxi_stream, tmp_path)
    _SEEN.clear()
    _inspect.__annotations__ = {"examples": InputArtifact[standard_artifacts.Examples]}
    Inspect = component(_inspect)
    with Ledger.open(db) as ledger:
        blocks = [b.id for b in ledger.blocks("taxi")][:64]
        grant = ledger.request("p", "taxi", blocks=blocks, epsilon=0.5, delta=1e-7)
        rows = sum(ledger.private_row_count("taxi", b) for b in blocks)
    root = f"ram://sage-{uuid.uuid4().hex}/roots"
    config = PipelineConfig(
        name="p",
        ledger=db,
        stream="taxi",
        data_root=data,
        work_dir=str(tmp_path / "work"),
        target=1.0,
        artifact_root=root,
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

    with pytest.raises(RuntimeError, match="recorded no validation result"):  # no validator in this pipeline
        make_run_iteration(build, config)(grant, None, 0.05, 1)
    assert _SEEN["uri"].startswith(f"{root}/p/BlockExampleGen/examples/")
    assert _SEEN["files"] and _SEEN["records"] == rows  # every granted record, in the ram:// store
    assert not tf.io.gfile.exists(_SEEN["uri"])  # scrubbed
    work = tmp_path / "work"
    assert [os.path.join(d, f) for d, _, fs in os.walk(work) for f in fs] == [config.metadata_path]
    store = metadata_store.MetadataStore(metadata_config(config.metadata_path))
    examples = store.get_artifacts_by_type("Examples")
    assert [a.uri for a in examples] == [_SEEN["uri"]] and examples[0].state == examples[0].DELETED


@pytest.mark.tf
@pytest.mark.xfail(
    strict=True,
    reason="upstream: TensorFlow's ram:// filesystem renames a folder without its "
    "contents, and tf.Transform's WriteTransformFn renames its output folders "
    "with tf.io.gfile.rename, so DPTransform's transform graph is empty on ram://",
)
def test_ram_directory_rename_keeps_its_files():
    """Why a whole taxi iteration cannot run on ram:// (the full run above uses file://; gs://, whose TensorFlow
    client renames folders object by object, is the one to use on Dataflow)."""
    import tensorflow as tf

    base = f"ram://rename-{uuid.uuid4().hex}"
    tf.io.gfile.makedirs(f"{base}/a/sub")
    with tf.io.gfile.GFile(f"{base}/a/sub/file", "w") as f:
        f.write("x")
    tf.io.gfile.rename(f"{base}/a", f"{base}/b")
    assert tf.io.gfile.exists(f"{base}/b/sub/file")


@pytest.mark.tf
def test_make_private_dir_local_0700_url_no_chmod(tmp_path):
    from tfx.dsl.io import fileio

    from sage_tfx.pipelines._runner import make_private_dir

    local = tmp_path / "roots" / "p"
    os.umask(old := os.umask(0o022))  # the test process's umask, restored: the 0700 comes from make_private_dir  # noqa: F841
    make_private_dir(str(local))
    assert oct(os.stat(local).st_mode & 0o777) == "0o700"
    url = f"ram://private-{uuid.uuid4().hex}/roots/p"
    make_private_dir(url)
    assert fileio.isdir(url)


@pytest.mark.tf
def test_beam_reads_and_writes_gzip_tfrecords_on_ram_through_gfile():
    """components/_gfile_beam.py: Beam's WriteToTFRecord / ReadFromTFRecord (gzip, temp folder then rename, as
    BlockExampleGen and DPTransform use them) on a ram:// path, read back by TensorFlow itself."""
    import apache_beam as beam
    import tensorflow as tf

    import sage_tfx.components._gfile_beam  # noqa: F401

    base = f"ram://beam-{uuid.uuid4().hex}"
    records = [f"record {i}".encode() for i in range(500)]
    with beam.Pipeline() as p:
        _ = p | beam.Create(records) | beam.io.WriteToTFRecord(f"{base}/out/data", file_name_suffix=".gz")
    files = tf.io.gfile.glob(f"{base}/out/data*.gz")
    assert files and all(not f.startswith(f"{base}/out/.temp") for f in files)
    got = sorted(r.numpy() for f in files for r in tf.data.TFRecordDataset(f, compression_type="GZIP"))
    assert got == sorted(records)
    from apache_beam.testing.util import assert_that, equal_to

    with beam.Pipeline() as p:
        assert_that(p | beam.io.ReadFromTFRecord(f"{base}/out/data*.gz"), equal_to(records))
    assert [d for d in tf.io.gfile.listdir(f"{base}/out") if "temp" in d] == []  # Beam's temp folder removed


def _serve(tmp_path, *extra, timeout=300):

    from sage_tfx.data.taxi import taxi_csv_path

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "serve",
            "--db",
            tmp_path / "ledger.db",
            "--stream",
            "taxi",
            "--data-root",
            tmp_path / "data",
            "--input",
            taxi_csv_path("simple"),
            "--time-column",
            "trip_start_timestamp",
            "--window",
            "1d",
            "--work-dir",
            tmp_path / "work",
            *map(str, extra),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _init(tmp_path):
    with Ledger.open(tmp_path / "ledger.db", create=True) as ledger:
        ledger.create_stream("taxi", 1.0, 1e-6)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--metadata-path", "mlmd.sqlite"], "--metadata-path 'mlmd.sqlite' would be shared by the pipelines a, b"),
        (["--pipeline-root", "nosuchfs://b/r"], "--pipeline-root 'nosuchfs://b/r' has no Beam filesystem"),
    ],
)
def test_serve_refuses_a_shared_metadata_path_or_bad_root_before_registering_anything(tmp_path, extra, message):
    _init(tmp_path)
    proc = _serve(tmp_path, "--pipeline", "a=taxi_regression:600000", "--pipeline", "b=taxi_regression:600000", *extra)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    with Ledger.open(tmp_path / "ledger.db") as ledger:
        assert ledger.pipelines("taxi") == [] and ledger.blocks("taxi") == []  # nothing registered, added, charged
    assert not (tmp_path / "data").exists() and not (tmp_path / "work").exists()
