"""`sage serve`'s Beam options (issue 12): --runner, --staging-location and the Beam pipeline options after a
bare -- are `sage run`'s (sage_tfx/cli/run.py ``beam_options``) and reach every pipeline's BlockExampleGen.

Fast: a parsed `sage serve` command line -> its workers' specs -> the pipeline a worker builds (the worker's own
``build_worker_runner``) -> TFX's compiled IR: BlockExampleGen's ``staging_location`` execution property and the
Beam args of its executor spec. Bad staging locations are refused (exit 2) before any pipeline is registered.
"""
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

    argv = ["serve", "--db", str(tmp_path / "ledger.db"), "--stream", "s", "--data-root", str(tmp_path / "data"),
            "--input", "trips.csv", "--time-column", "t", "--pipeline", "a=taxi_regression:600000",
            "--pipeline", "b=taxi_regression:300000:dnn", "--runner", "beam", *extra]
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

    from sage_tfx.adaptive.workers import build_worker_runner
    from sage_tfx.cli.run import beam_options
    from sage_tfx.cli.serve import worker_specs

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
        compiler.Compiler().compile(runner.pipeline.build_pipeline(runner.config, grant, None, 0.05, 1)))
    assert "staging_location" not in params
    assert all(option in args_of_gen for option in BEAM)
    assert not any(a.startswith("--temp_location") for a in args_of_gen)


@pytest.mark.parametrize("extra, beam, message", [
    (["--staging-location", "nosuchfs://bucket/s"], [], "--staging-location 'nosuchfs://bucket/s' has no Beam "
                                                        "filesystem"),
    (["--staging-location", "/tmp/sage-a"], ["--temp_location=/tmp/sage-b"],
     "--staging-location '/tmp/sage-a' and the Beam option '--temp_location=/tmp/sage-b' disagree"),
])
def test_serve_refuses_a_bad_staging_location_before_registering_anything(tmp_path, extra, beam, message):
    with Ledger.open(tmp_path / "ledger.db", create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
    proc = subprocess.run([sys.executable, "-m", "sage_tfx", "serve", "--db", tmp_path / "ledger.db", "--stream", "s",
                           "--data-root", tmp_path / "data", "--input", tmp_path / "none.csv", "--time-column", "t",
                           "--pipeline", "a=taxi_regression:600000", *extra, "--", *beam],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    with Ledger.open(tmp_path / "ledger.db") as ledger:
        assert ledger.pipelines("s") == []  # nothing registered (nor claimed, nor charged)
        assert ledger.audit().ok
    assert not os.path.exists(tmp_path / "data")
