"""sage_tfx.clusters (docs/scale_out.md, "PortableRunner with an external worker pool"): the loopback portable
cluster runs a Beam job on 2 SDK worker processes of its EXTERNAL worker pool (seen as 2 distinct PIDs in a
DoFn, none of them the launcher's, the job service's or the pool's), and stops every process it started.
Plus the upstream limitation the cluster's job service works around: Beam 2.77's own local job service runs
each stage on one SDK worker whatever the job asks for."""

import base64
import hashlib
import importlib
import os
import sys
import time
import zipfile

import pytest

from sage_tfx.clusters import dask_cluster, portable_cluster


def make_wheel(folder, module, source):
    """A pure-Python wheel holding one module (what Beam's --extra_package stages)."""

    dist = f"{module}-0.1.dist-info"
    files = {
        f"{module}.py": source.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: sage-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    digest = {n: base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode() for n, d in files.items()}
    files[f"{dist}/RECORD"] = (
        "".join(f"{n},sha256={digest[n]},{len(d)}\n" for n, d in files.items()) + f"{dist}/RECORD,,\n"
    ).encode()
    path = os.path.join(folder, f"{module}-0.1-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


PROBE = "import os\n\ndef where():\n    return os.getpid(), __file__\n"


def _pids(beam_args, n=40, module=None):
    """Run a job of ``n`` elements with ``beam_args``; {pid: elements processed there}, from Beam counters
    (namespace sage_pids) read back through the job service: nothing is written to a shared disk. With
    ``module`` (the name of a module whose ``where()`` gives (pid, __file__)), the DoFn imports it and the
    keys are (pid, the module's file)."""
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions

    def mark(x):

        from apache_beam.metrics.metric import Metrics

        time.sleep(0.02)  # keeps one worker from finishing its half before the other starts
        where = importlib.import_module(module).where() if module else (os.getpid(), "")
        Metrics.counter("sage_pids", "%d:%s" % where).inc()  # noqa: UP031
        return x

    p = beam.Pipeline(options=PipelineOptions(list(beam_args)))
    _ = p | beam.Create(list(range(n))) | beam.Map(mark)
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_namespace("sage_pids"))["counters"]
    found = {}
    for c in counters:
        pid, file = c.key.metric.name.split(":", 1)
        found[(int(pid), file) if module else int(pid)] = c.committed
    return found


def _stopped(pid):
    """Gone, or a zombie (dead; reparented to an init that may not reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_portable_cluster_runs_a_job_on_two_worker_processes_and_stops_them(tmp_path):
    """Two SDK worker processes share the elements; each imports a module the launcher never imported, from
    the wheel the job staged with --extra_package (fetched over the artifact service and installed into the
    worker's own folder by sage_tfx/beam_boot.py)."""

    wheel = make_wheel(str(tmp_path), "sage_probe_module", PROBE)
    with portable_cluster(workers=2) as cluster:
        assert cluster.beam_args[:4] == [
            "--runner=PortableRunner",
            f"--job_endpoint={cluster.job_endpoint}",
            "--environment_type=EXTERNAL",
            f"--environment_config={cluster.worker_address}",
        ]
        assert "--sdk_worker_parallelism=2" in cluster.beam_args
        seen = _pids(cluster.beam_args + [f"--extra_package={wheel}"], module="sage_probe_module")
        pids = {pid for pid, _ in seen}
        assert sum(seen.values()) == 40
        assert len(pids) == 2, seen  # two SDK workers shared the elements
        assert os.getpid() not in pids and not pids & set(cluster.pids)
        for pid, file in seen:
            assert os.getpgid(pid) == os.getpgid(cluster.pids[0])  # children of the worker pool, in its group
            assert file.endswith(os.path.join("site", "sage_probe_module.py")) and str(tmp_path) not in file
        assert "sage_probe_module" not in sys.modules
    assert all(_stopped(pid) for pid in [*cluster.pids, *pids])
    assert not any(os.path.exists(os.path.dirname(file)) for _, file in seen)  # workers' folders removed


def test_bad_arguments_are_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"workers=0 is invalid"):
        with portable_cluster(workers=0):
            pass
    with pytest.raises(ValueError, match=r"worker_prefix='unshare -m' must be a sequence"):
        with portable_cluster(worker_prefix="unshare -m"):
            pass
    with pytest.raises(ValueError, match=r"workers=-1 is invalid"):
        with dask_cluster(workers=-1):
            pass


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="upstream: Beam 2.77's local job service (apache_beam/runners/portability/"
    "local_job_service.py BeamJob._invoke_runner) builds its FnApiRunner with one worker and "
    "run_via_runner_api never reads --sdk_worker_parallelism or --direct_num_workers; "
    "sage_tfx.clusters' job service sets the worker count",
)
def test_beams_own_local_job_service_runs_one_worker():
    from apache_beam.runners.portability import local_job_service

    servicer = local_job_service.LocalJobServicer()  # Beam's own, in this process, with the cluster's worker pool
    port = servicer.start_grpc_server(0)
    try:
        with portable_cluster(workers=2) as cluster:
            args = [a for a in cluster.beam_args if not a.startswith("--job_endpoint=")]
            pids = _pids(args + [f"--job_endpoint=localhost:{port}", "--direct_num_workers=2"])
    finally:
        servicer.stop()
    assert len(pids) == 2, pids


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    raises=ModuleNotFoundError,
    reason="upstream: Beam 2.77's worker pool without --container_executable (apache_beam/runners/"
    "worker/worker_pool_main.py StartWorker, use_process) starts a bare `python -c SdkHarness(...)` "
    "that installs none of the job's staged packages (--extra_package): ModuleNotFoundError in "
    "the worker. portable_cluster's pool runs its workers through sage_tfx/beam_boot.py",
)
def test_beams_bare_process_worker_pool_ignores_extra_packages(tmp_path, monkeypatch):

    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    wheel = make_wheel(str(tmp_path), "sage_probe_module_bare", PROBE)
    address, pool = BeamFnExternalWorkerPoolServicer.start(use_process=True)  # Beam's own, in this process
    servicer = local_job_service.LocalJobServicer()
    port = servicer.start_grpc_server(0)
    try:
        _pids(
            [
                "--runner=PortableRunner",
                f"--job_endpoint=localhost:{port}",
                "--environment_type=EXTERNAL",
                f"--environment_config={address}",
                f"--extra_package={wheel}",
            ],
            n=4,
            module="sage_probe_module_bare",
        )
    except RuntimeError as exc:  # the job's failure, with the worker's traceback in its message
        if "No module named 'sage_probe_module_bare'" in str(exc):
            raise ModuleNotFoundError("the worker did not install the staged wheel") from exc
        raise
    finally:
        servicer.stop()
        pool.stop(0)
