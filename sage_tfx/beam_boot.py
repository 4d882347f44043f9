#!/usr/bin/env python
"""A Beam SDK worker boot for worker pools without Beam's SDK container.

Beam's SDK container boot contract (``BOOT --id=... --provision_endpoint=... --artifact_endpoint=...``) in
Python, for a worker pool run from a Python environment that already holds Beam, TFX and sage-tfx: it
fetches the job's staged artifacts over gRPC, installs them into a private temporary folder last on
``sys.path``, runs Beam's ``sdk_worker_main`` and removes the folder when the worker exits. Use as the
worker pool's ``--container_executable``. Steps and usage: docs/scale_out.md, "PortableRunner with an
external worker pool" ("The worker boot").
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence

EXTRA_PACKAGES_FILE = "extra_packages.txt"  # Beam's stager: the --extra_package names, in order
WORKFLOW_TARBALL_FILE = "workflow.tar.gz"  # Beam's stager: the --setup_file package
REQUIREMENTS_FILE = "requirements.txt"


class BootError(RuntimeError):
    """The worker cannot start: the message names the artifact or endpoint and why."""


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="beam_boot.py", description=__doc__.split("\n\n")[0])
    for name in ("id", "logging_endpoint", "artifact_endpoint", "provision_endpoint", "control_endpoint"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--semi_persist_dir", default=None)
    args, _ = parser.parse_known_args(list(argv))  # the contract may grow flags: ignore the ones we do not use
    return args


def _channel(endpoint: str, worker_id: str):
    import grpc
    from apache_beam.runners.worker.worker_id_interceptor import WorkerIdInterceptor

    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    return grpc.intercept_channel(grpc.insecure_channel(endpoint, options=options), WorkerIdInterceptor(worker_id))


def provision_info(args: argparse.Namespace):
    """The job's ProvisionInfo (pipeline options, staged artifacts) from the provision service."""
    from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc

    stub = beam_provision_api_pb2_grpc.ProvisionServiceStub(_channel(args.provision_endpoint, args.id))
    return stub.GetProvisionInfo(beam_provision_api_pb2.GetProvisionInfoRequest()).info


def fetch_artifacts(args: argparse.Namespace, dependencies, staged_dir: str) -> list[str]:
    """Fetch every staged artifact into ``staged_dir`` under its staged name; return the names."""
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_artifact_api_pb2, beam_artifact_api_pb2_grpc, beam_runner_api_pb2
    from apache_beam.utils import proto_utils

    if not dependencies:
        return []
    stub = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(_channel(args.artifact_endpoint, args.id))
    resolved = stub.ResolveArtifacts(
        beam_artifact_api_pb2.ResolveArtifactsRequest(artifacts=list(dependencies))
    ).replacements
    names = []
    for i, dep in enumerate(resolved):
        if dep.role_urn == common_urns.artifact_roles.STAGING_TO.urn:
            name = proto_utils.parse_Bytes(
                dep.role_payload, beam_runner_api_pb2.ArtifactStagingToRolePayload
            ).staged_name
        else:
            name = f"artifact-{i}"
        if not name or os.path.basename(name) != name or name in (".", ".."):
            raise BootError(f"staged artifact name {name!r} is not a plain file name")
        with open(os.path.join(staged_dir, name), "xb") as out:
            for chunk in stub.GetArtifact(beam_artifact_api_pb2.GetArtifactRequest(artifact=dep)):
                out.write(chunk.data)
        names.append(name)
    return names


def _pip(args: Sequence[str], what: str) -> None:
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--no-input", *args]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise BootError(f"installing {what} failed ({' '.join(command)}):\n{done.stdout[-4000:]}")


def install(staged_dir: str, names: Sequence[str], site_dir: str) -> list[str]:
    """Install the staged packages into ``site_dir`` (the steps: docs/scale_out.md, "The worker boot"); return what was installed."""
    installed = []
    packages = []
    if EXTRA_PACKAGES_FILE in names:
        with open(os.path.join(staged_dir, EXTRA_PACKAGES_FILE)) as f:
            packages = [line.strip() for line in f if line.strip()]
        missing = [p for p in packages if p not in names]
        if missing:
            raise BootError(f"{EXTRA_PACKAGES_FILE} names {missing}, which the job did not stage")
    if WORKFLOW_TARBALL_FILE in names:
        packages.append(WORKFLOW_TARBALL_FILE)
    for name in packages:
        path = os.path.join(staged_dir, name)
        if name.endswith(".whl") and name[:-4].endswith("-none-any"):
            with zipfile.ZipFile(path) as wheel:  # a pure-Python wheel is its files: unpacking installs it
                for member in wheel.namelist():
                    target = os.path.realpath(os.path.join(site_dir, member))
                    if not target.startswith(os.path.realpath(site_dir) + os.sep):
                        raise BootError(f"wheel {name!r} holds a path outside its folder: {member!r}")
                wheel.extractall(site_dir)
        else:
            _pip(["--no-build-isolation", "--target", site_dir, path], repr(name))
        installed.append(name)
    if REQUIREMENTS_FILE in names:
        _pip(
            [
                "--no-index",
                "--find-links",
                staged_dir,
                "--target",
                site_dir,
                "-r",
                os.path.join(staged_dir, REQUIREMENTS_FILE),
            ],
            REQUIREMENTS_FILE,
        )
        installed.append(REQUIREMENTS_FILE)
    return installed


def worker_environment(args: argparse.Namespace, info, semi_dir: str) -> dict[str, str]:
    """The environment ``sdk_worker_main`` reads (as Beam's container boot sets it)."""
    from apache_beam.portability.api import endpoints_pb2
    from google.protobuf import json_format, text_format

    def descriptor(url: str) -> str:
        return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url))

    env = dict(os.environ)
    env.update(
        {
            "WORKER_ID": args.id,
            "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options),
            "SEMI_PERSISTENT_DIRECTORY": semi_dir,
            "LOGGING_API_SERVICE_DESCRIPTOR": descriptor(args.logging_endpoint),
            "CONTROL_API_SERVICE_DESCRIPTOR": descriptor(args.control_endpoint),
            "RUNNER_CAPABILITIES": " ".join(info.runner_capabilities),
        }
    )
    if info.HasField("status_endpoint") and info.status_endpoint.url:
        env["STATUS_API_SERVICE_DESCRIPTOR"] = descriptor(info.status_endpoint.url)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    own_dir = args.semi_persist_dir is None
    semi_dir = tempfile.mkdtemp(prefix=f"beam-worker-{args.id}-") if own_dir else args.semi_persist_dir
    try:
        staged_dir, site_dir = os.path.join(semi_dir, "staged"), os.path.join(semi_dir, "site")
        os.makedirs(staged_dir, mode=0o700, exist_ok=True)
        os.makedirs(site_dir, mode=0o700, exist_ok=True)
        info = provision_info(args)
        installed = install(staged_dir, fetch_artifacts(args, info.dependencies, staged_dir), site_dir)
        # SITE goes LAST on the worker's sys.path, where site-packages is for a pip install: a module file of the
        # job named like a module of the stack (e.g. a user's typing.py) does not shadow it
        run = (
            f"import runpy, sys; sys.path.append({site_dir!r}); "
            "runpy.run_module('apache_beam.runners.worker.sdk_worker_main', run_name='__main__', alter_sys=True)"
        )
        worker = subprocess.Popen([sys.executable, "-c", run], env=worker_environment(args, info, semi_dir))
        print(
            f"beam_boot: worker {args.id} (pid {worker.pid}) installed {installed or 'nothing'}",
            file=sys.stderr,
            flush=True,
        )

        def forward(signum, _frame):  # the worker pool stops a worker with SIGTERM
            worker.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        return worker.wait()
    finally:
        if own_dir:
            shutil.rmtree(semi_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
