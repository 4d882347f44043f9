"""Loopback clusters for running sage's Beam jobs on distributed runners.

``portable_cluster`` (a Beam job service and an EXTERNAL SDK worker pool whose workers boot through
``sage_tfx.beam_boot``) and ``dask_cluster`` (a ``distributed.LocalCluster`` for Beam's DaskRunner): each a
context manager that starts its processes on 127.0.0.1, waits until they answer and stops them on exit.
``python -m sage_tfx.clusters job-service --port P`` is the job service ``portable_cluster`` starts. This
module never imports TensorFlow. Details: docs/scale_out.md, "PortableRunner with an external worker pool"
("The loopback clusters").
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

HOST = "127.0.0.1"
BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "beam_boot.py")  # the workers' boot program
START_TIMEOUT = 120.0  # seconds for a process to answer on its port (a loaded 2-core machine is slow to import)


@dataclass(frozen=True)
class PortableCluster:
    """A running Beam job service and EXTERNAL worker pool (``portable_cluster``).

    ``job_endpoint``: the job service's ``host:port`` (Beam's ``--job_endpoint``). ``worker_address``: the
    worker pool's ``host:port`` (Beam's ``--environment_config`` with ``--environment_type=EXTERNAL``).
    ``workers``: the SDK workers a job gets per stage. ``beam_args``: the Beam options a job needs to run
    on this cluster. ``pids``: the launched processes (worker pool, job service); ``log_dir``: the folder of
    their output (``worker_pool.log``, ``job_service.log``), removed on exit.
    """

    job_endpoint: str
    worker_address: str
    workers: int
    beam_args: list[str] = field(default_factory=list)
    pids: tuple[int, ...] = ()
    log_dir: str = ""

    @property
    def worker_log(self) -> str:
        """The worker pool's output so far: Beam's pool logs each worker it starts, and sage_tfx/beam_boot.py
        each worker's pid and the packages it installed (``beam_boot: worker ID (pid PID) installed [...]``)."""
        try:
            with open(os.path.join(self.log_dir, "worker_pool.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""


@dataclass(frozen=True)
class DaskCluster:
    """A running ``distributed.LocalCluster`` (``dask_cluster``): ``address`` is its scheduler's address
    (``tcp://127.0.0.1:PORT``, for ``sage ingest --runner dask --dask-address``); ``cluster`` the
    LocalCluster itself."""

    address: str
    cluster: object


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((HOST, port)) == 0


def _tail(path: str, limit: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies, dead but not yet reaped by an init that
    does not reap, do not count)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group of ``proc`` (started in a session of its own: the SDK workers are in it);
    SIGKILL what still runs after ``grace`` seconds."""
    pgid = proc.pid  # a session leader's group id is its pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                break
            time.sleep(0.1)
        else:
            continue
        break
    proc.wait()


def _environment() -> dict[str, str]:
    """The launcher's environment with this interpreter's folder first on PATH: Beam's worker pool starts
    each SDK worker as ``python -c ...`` (found on PATH), which must be this Python with sage_tfx installed."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _launch(name: str, command: Sequence[str], log_dir: str, started: list, umask: int = -1) -> tuple:
    """Start ``command`` in a session of its own (with ``umask`` if >= 0), stdout and stderr to
    LOG_DIR/NAME.log."""
    log_path = os.path.join(log_dir, f"{name.replace(' ', '_')}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_environment(),
            start_new_session=True,
            umask=umask,
        )
    started.append(proc)
    return name, command, proc, log_path


def _wait(launched: tuple, port: int) -> None:
    """Wait until ``port`` answers; RuntimeError with the process's output if it exits or does not answer
    within START_TIMEOUT."""
    name, command, proc, log_path = launched
    deadline = time.monotonic() + START_TIMEOUT
    while not _answers(port):
        if proc.poll() is not None:
            raise RuntimeError(
                f"the {name} ({' '.join(command)}) exited with status {proc.returncode} before "
                f"answering on {HOST}:{port}; its output:\n{_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the {name} ({' '.join(command)}) did not answer on {HOST}:{port} within "
                f"{START_TIMEOUT:g} s; its output:\n{_tail(log_path)}"
            )
        time.sleep(0.2)


@contextlib.contextmanager
def portable_cluster(*, workers: int = 2, worker_prefix: Sequence[str] = ()) -> Iterator[PortableCluster]:
    """Start a Beam job service and an EXTERNAL SDK worker pool on loopback; yield a ``PortableCluster``.

    The job service (``python -m sage_tfx.clusters job-service``: Beam's local job service running each
    stage on ``--sdk_worker_parallelism`` workers) runs jobs submitted with ``cluster.beam_args``; for each
    job it asks the worker pool (``python -m apache_beam.runners.worker.worker_pool_main``) for ``workers``
    SDK workers, which the pool starts as processes of their own (as Flink, Spark and Dataflow start Python
    workers from an SDK container's worker pool), through ``sage_tfx/beam_boot.py`` (``--container_executable``:
    each worker installs what its job staged, e.g. ``--extra_package`` wheels, into a temporary folder of its
    own), under umask 077 (the workers write raw records). ``worker_prefix`` is put before the worker pool's command
    (e.g. ``["unshare", "-m", ...]`` to run the pool and its workers in a mount namespace of their own); its
    processes must keep the pool's process group. Both are started in sessions of their own, with their output
    in a temporary folder; on exit both process groups (workers included) get SIGTERM, then SIGKILL.
    docs/scale_out.md, "PortableRunner with an external worker pool".
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers={workers!r} is invalid: give the number of SDK workers, an integer >= 1")
    if isinstance(worker_prefix, str):
        raise ValueError(
            f"worker_prefix={worker_prefix!r} must be a sequence of arguments, e.g. ['unshare', '-m'], not one string"
        )
    started: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="sage-portable-") as log_dir:
        try:
            job_port, pool_port = _free_port(), _free_port()
            while pool_port == job_port:
                pool_port = _free_port()
            pool = _launch(
                "worker pool",
                [
                    *worker_prefix,
                    sys.executable,
                    "-m",
                    "apache_beam.runners.worker.worker_pool_main",
                    f"--service_port={pool_port}",
                    f"--container_executable={BOOT}",
                ],
                log_dir,
                started,
                umask=0o077,
            )
            service = _launch(
                "job service",
                [sys.executable, "-m", "sage_tfx.clusters", "job-service", f"--port={job_port}"],
                log_dir,
                started,
            )
            _wait(pool, pool_port)  # both import Beam at once
            _wait(service, job_port)
            job_endpoint, worker_address = f"{HOST}:{job_port}", f"{HOST}:{pool_port}"
            beam_args = [
                "--runner=PortableRunner",
                f"--job_endpoint={job_endpoint}",
                "--environment_type=EXTERNAL",
                f"--environment_config={worker_address}",
                f"--sdk_worker_parallelism={workers}",
            ]
            yield PortableCluster(
                job_endpoint=job_endpoint,
                worker_address=worker_address,
                workers=workers,
                beam_args=beam_args,
                pids=tuple(p.pid for p in started),
                log_dir=log_dir,
            )
        finally:
            for proc in reversed(started):
                _stop(proc)


@contextlib.contextmanager
def dask_cluster(*, workers: int = 2) -> Iterator[DaskCluster]:
    """Start a ``distributed.LocalCluster`` of ``workers`` single-threaded worker processes on loopback (no
    dashboard); yield a ``DaskCluster`` (its ``address`` is the scheduler's); close it on exit.
    docs/scale_out.md."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers={workers!r} is invalid: give the number of Dask workers, an integer >= 1")
    try:
        import distributed
    except ImportError:
        raise RuntimeError(
            "dask_cluster needs the distributed package (in requirements.lock): run `make` or "
            "install requirements.lock into this environment"
        ) from None
    cluster = distributed.LocalCluster(
        n_workers=workers, processes=True, threads_per_worker=1, host=HOST, dashboard_address=None
    )
    try:
        yield DaskCluster(address=cluster.scheduler_address, cluster=cluster)
    finally:
        cluster.close()


# ----------------------------------------------------------------------------------------- the job service


def _parallel_job_servicer(staging_dir: str | None):
    """Beam's LocalJobServicer whose jobs run each stage on ``--sdk_worker_parallelism`` SDK workers (Beam
    2.77's BeamJob builds its FnApiRunner with one worker whatever the job's options say)."""
    from apache_beam.options.pipeline_options import PortableOptions
    from apache_beam.portability.api import beam_job_api_pb2
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    class ParallelBeamJob(local_job_service.BeamJob):
        def _invoke_runner(self):
            self.set_state(beam_job_api_pb2.JobState.RUNNING)
            runner = fn_runner.FnApiRunner(provision_info=self._provision_info)
            # FnApiRunner.run_pipeline sets this from --direct_num_workers; run_via_runner_api (the job service's
            # entry) leaves it at 1
            runner._num_workers = max(
                1, int(self.pipeline_options().view_as(PortableOptions).sdk_worker_parallelism or 1)
            )
            return runner.run_via_runner_api(self._pipeline_proto, self.pipeline_options())

    return local_job_service.LocalJobServicer(staging_dir, beam_job_type=ParallelBeamJob)


def _job_service_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sage_tfx.clusters job-service",
        description="Beam's local job service, running each stage on --sdk_worker_parallelism SDK workers",
    )
    parser.add_argument("--port", type=int, required=True, help="the port of the job API, on 127.0.0.1")
    parser.add_argument(
        "--staging-dir", default=None, help="where jobs' artifacts are staged (default: a temporary folder)"
    )
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO)
    servicer = _parallel_job_servicer(args.staging_dir)
    port = servicer.start_grpc_server(args.port)
    logging.info("job service on %s:%s", HOST, port)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        servicer.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "job-service":
        print("usage: python -m sage_tfx.clusters job-service --port PORT [--staging-dir DIR]", file=sys.stderr)
        return 2
    return _job_service_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
