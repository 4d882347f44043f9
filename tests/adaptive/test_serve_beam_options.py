"""`sage serve`'s Beam options: --runner, --staging-location and the Beam pipeline options after a
bare -- are `sage run`'s (sage_tfx/cli/run.py ``beam_options``) and reach every pipeline's BlockExampleGen.

Fast: a parsed `sage serve` command line -> its workers' specs -> the pipeline a worker builds (the worker's own
``build_worker_runner``) -> TFX's compiled IR: BlockExampleGen's ``staging_location`` execution property and the
Beam args of its executor spec. Bad staging locations are refused (exit 2) before any pipeline is registered.
"""

import json
import os
import subprocess
import sys

import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.privacy import Ledger

DAY = 86400.0
BEAM = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _serve_args(tmp_path, *extra, beam=()):
    from sage_tfx.cli import build_parser

    argv = [
        "serve",
        "--db",
        str(tmp_path / "ledger.db"),
        "--stream",
        "s",
        "--data-root",
        str(tmp_path / "data"),
        "--input",
        "trips.csv",
        "--time-column",
        "t",
        "--pipeline",
        "a=taxi_regression:600000",
        "--pipeline",
        "b=taxi_regression:300000:dnn",
        "--runner",
        "beam",
        *extra,
    ]
    args = build_parser("serve").parse_args(argv)
    args.extra_args = list(beam)  # what sage_tfx.cli.main passes after a bare --
    return args


def _grant(tmp_path):
    with Ledger.open(tmp_path / "ledger.db", create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        for i in range(4):
            ledger.add_block("s", f"b{i}", start=i * DAY, end=(i + 1) * DAY, rows=100)
        return ledger.request("a", "s", blocks=["b0", "b1"], epsilon=0.5, delta=1e-7)


def _block_example_gen_node(compiled):
    from tfx.proto.orchestration import executable_spec_pb2, pipeline_pb2

    (node,) = [n.pipeline_node for n in compiled.nodes if n.pipeline_node.node_info.id == "BlockExampleGen"]
    params = {k: v.field_value.string_value for k, v in node.parameters.parameters.items()}
    config = pipeline_pb2.IntermediateDeploymentConfig()
    compiled.deployment_config.Unpack(config)
    spec = executable_spec_pb2.BeamExecutableSpec()
    config.executor_specs["BlockExampleGen"].Unpack(spec)
    return params, list(spec.beam_pipeline_args)


@pytest.mark.tf
def test_serve_passes_beam_options_and_staging_location_to_block_example_gen(tmp_path):
    from tfx.dsl.compiler import compiler

    from sage_tfx.cli.run import beam_options
    from sage_tfx.cli.serve import worker_specs
    from sage_tfx.pipelines.workers import build_worker_runner

    staging = tmp_path / "staging"
    args = _serve_args(tmp_path, "--staging-location", str(staging), beam=BEAM)
    beam_args, location = beam_options(args)
    specs = worker_specs(args, beam_args, location)
    assert [s.name for s in specs] == ["a", "b"]
    grant = _grant(tmp_path)
    for spec in specs:
        assert spec.staging_location == str(staging) and spec.runner == "beam"
        definition, runner = build_worker_runner(spec)  # what the worker process builds from its spec
        assert runner.config.staging_location == str(staging)
        pipeline = runner.pipeline.build_pipeline(runner.config, grant, None, 0.05, 1)
        params, args_of_gen = _block_example_gen_node(compiler.Compiler().compile(pipeline))
        assert params["staging_location"] == str(staging)
        assert params["data_root"] == str(tmp_path / "data")
        for option in [*BEAM, f"--temp_location={staging}"]:  # the Beam options, and --temp_location kept
            assert option in args_of_gen, (option, args_of_gen)

    # Without --staging-location: no staging_location property (the executor falls back to --temp_location).
    args = _serve_args(tmp_path, beam=BEAM)
    (spec, _) = worker_specs(args, *beam_options(args))
    _, runner = build_worker_runner(spec)
    params, args_of_gen = _block_example_gen_node(
        compiler.Compiler().compile(runner.pipeline.build_pipeline(runner.config, grant, None, 0.05, 1))
    )
    assert "staging_location" not in params
    assert all(option in args_of_gen for option in BEAM)
    assert not any(a.startswith("--temp_location") for a in args_of_gen)


@pytest.mark.parametrize(
    "extra, beam, message",
    [
        (
            ["--staging-location", "nosuchfs://bucket/s"],
            [],
            "--staging-location 'nosuchfs://bucket/s' has no Beam filesystem",
        ),
        (
            ["--staging-location", "/tmp/sage-a"],
            ["--temp_location=/tmp/sage-b"],
            "--staging-location '/tmp/sage-a' and the Beam option '--temp_location=/tmp/sage-b' disagree",
        ),
    ],
)
def test_serve_refuses_a_bad_staging_location_before_registering_anything(tmp_path, extra, beam, message):
    with Ledger.open(tmp_path / "ledger.db", create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "serve",
            "--db",
            tmp_path / "ledger.db",
            "--stream",
            "s",
            "--data-root",
            tmp_path / "data",
            "--input",
            tmp_path / "none.csv",
            "--time-column",
            "t",
            "--pipeline",
            "a=taxi_regression:600000",
            *extra,
            "--",
            *beam,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    with Ledger.open(tmp_path / "ledger.db") as ledger:
        assert ledger.pipelines("s") == []  # nothing registered (nor claimed, nor charged)
        assert ledger.audit().ok
    assert not os.path.exists(tmp_path / "data")


@pytest.mark.slow
@pytest.mark.tf
def test_serve_runs_pipelines_on_multi_processing_workers_with_a_staging_dir_and_a_url_root(tmp_path):
    """One `sage serve` run (one replay, one iteration per pipeline) holding what three end-to-end serve tests
    checked apart, each a whole TFX iteration on the same 256 replayed taxi days:

    - Beam options: the pipelines' Beam jobs run on the DirectRunner's multi_processing workers (other
      processes: module files travel as wheels), BlockExampleGen staging the granted sealed files under
      --staging-location: the staging_location recorded on BlockExampleGen's MLMD executions, the staged runs
      deleted, the audit OK and no block over budget (was test_serve_runs_an_iteration_on_multi_processing_
      workers_with_a_staging_dir);
    - the pipeline root on a URL (docs/scale_out.md, "The pipeline root on a URL filesystem"): --pipeline-root
      file://... and --metadata-path mlmd/{name}.sqlite reach each worker process: artifacts under URL/NAME, MLMD
      at the given local path (nothing under WORK_DIR/tfx), the raw Examples scrubbed and DELETED in MLMD (was
      tests/pipelines/test_url_pipeline_root.py::test_serve_runs_its_worker_on_a_url_root_with_mlmd_at_metadata_path);
    - several pipelines on one replayed stream: easy (target 3,000,000 s^2) ACCEPTs, hard (100,000 s^2, out of the
      model's reach) TIMEs OUT, the first block's reservation split two ways (was tests/pipelines/test_sage_run.py::
      test_sage_serve_runs_several_pipelines_on_one_replayed_stream);
    - each pipeline's TFX run in its own worker process, at the same time as the other's: the
      spans of the two pipelines' MLMD executions overlap by more than half the shorter one (with --parallel 1
      the second run would start after the first), each pipeline granted once, the audit OK and no block over
      budget (was tests/adaptive/test_serve_parallel.py::test_two_pipelines_run_their_tfx_iterations_at_once, which ran
      the same serve of easy and hard on the same 256 days without the Beam options);
    - module files on the multi_processing workers: each pipeline's preprocessing module packaged as one wheel
      under URL/NAME/_wheels and installed while DPTransform's job runs (before: ModuleNotFoundError 'user_module_0'
      in DPTransform's job), no wheel-build or pip output on stdout (was tests/pipelines/test_runners.py::
      test_sage_run_on_direct_runner_multi_processing, a `sage run` of the same options through the same
      pipelines/_runner.py; `sage run -- BEAM_OPTIONS`: test_sage_run_on_portable_runner_with_external_workers).
    """
    from ml_metadata.metadata_store import metadata_store
    from tfx.dsl.io import fileio

    from sage_tfx.data.taxi import taxi_csv_path
    from sage_tfx.pipelines._runner import metadata_config

    db, staging = tmp_path / "ledger.db", tmp_path / "staging"
    root = f"file://{tmp_path / 'object-store'}"
    staging.mkdir()
    init = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "ledger",
            "init",
            "--db",
            db,
            "--stream",
            "taxi",
            "--epsilon",
            "1",
            "--delta",
            "1e-6",
        ],
        capture_output=True,
        text=True,
    )
    assert init.returncode == 0, init.stderr
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "serve",
            "--db",
            db,
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
            "--initial-blocks",
            "256",
            "--blocks-per-step",
            "256",
            "--pipeline",
            "easy=taxi_regression:3000000",
            "--pipeline",
            "hard=taxi_regression:100000",
            "--max-iterations",
            "1",
            "--rejection-share",
            "0",
            "--work-dir",
            tmp_path / "work",
            "--staging-location",
            staging,
            "--pipeline-root",
            root,
            "--metadata-path",
            tmp_path / "mlmd" / "{name}.sqlite",
            "--",
            *BEAM,
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "easy: ACCEPT after 1 iteration(s)" in proc.stdout and "audit: OK" in proc.stdout, proc.stdout
    assert "hard: TIMEOUT after 1 iteration(s)" in proc.stdout, proc.stdout
    assert "Successfully installed" not in proc.stdout and "bdist_wheel" not in proc.stdout, proc.stdout
    assert not (tmp_path / "work" / "tfx").exists()  # the MLMD files went to --metadata-path
    spans = {}
    for name in ("easy", "hard"):
        store = metadata_store.MetadataStore(metadata_config(str(tmp_path / "mlmd" / f"{name}.sqlite")))
        runs = store.get_executions()
        assert runs, name
        spans[name] = (min(e.create_time_since_epoch for e in runs), max(e.last_update_time_since_epoch for e in runs))
        gens = [e for e in runs if "BlockExampleGen" in e.type]
        assert gens and all(e.custom_properties["staging_location"].string_value == str(staging) for e in gens)
        artifacts = store.get_artifacts()
        assert artifacts and all(a.uri.startswith(f"{root}/{name}/") for a in artifacts), [a.uri for a in artifacts]
        by_type = {t.id: t.name for t in store.get_artifact_types()}
        examples = [a for a in artifacts if by_type[a.type_id] == "Examples"]
        assert len(examples) == 2 and all(a.state == a.DELETED and not fileio.exists(a.uri) for a in examples)
        (wheel,) = os.listdir(tmp_path / "object-store" / name / "_wheels")  # the preprocessing module
        assert wheel.startswith("tfx_user_code_DPTransform-") and wheel.endswith("-py3-none-any.whl"), wheel
    assert os.listdir(staging) == []  # the staged runs were deleted
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
        budget = ledger.stream("taxi").epsilon
        assert all(b.spent[0] <= budget + 1e-9 for b in ledger.blocks("taxi"))
        assert len(ledger.history("taxi", "easy")) == 1 and len(ledger.history("taxi", "hard")) == 1
        first = [e for e in ledger.log_entries() if e[2] == "reserve"][0]
        assert json.loads(first[3])["pipelines"] == ["easy", "hard"]  # the first block split two ways
    # The two TFX runs went at once, each in its own worker process (ms since the epoch).
    (easy, hard) = spans["easy"], spans["hard"]
    overlap = min(easy[1], hard[1]) - max(easy[0], hard[0])
    assert overlap > 0.5 * min(easy[1] - easy[0], hard[1] - hard[0]), (easy, hard)
