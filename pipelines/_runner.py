"""Run one privacy-adaptive iteration as one TFX pipeline run, and read back its outcome.

Each iteration builds the pipeline anew with the grant as an execution parameter of every data-reading
component, runs it on ``LocalDagRunner`` or ``BeamDagRunner`` (Beam options pass through), and reads the
DPModelValidator's result for that grant from MLMD. TFX caching is on: a re-run under the same grant reuses
finished components and their noise.
Raw-record artifacts are written 0600 under a 0700 root and scrubbed when a run ends (``scrub_raw_artifacts``).

docs/security.md, "The pipeline work folder".
"""

import json
import os
import tempfile
import threading
from dataclasses import dataclass, field

from sage_tfx.pipelines.work_folder import (  # noqa: F401 (folder_names, ...: re-exported)
    KEPT_ARTIFACTS,
    RAW_OUTPUTS,
    WHEELS,
    folder_names,
    inside_root,
    is_url,
    keep_declared_outputs,
    make_private_dir,
    metadata_config,
    scrub_raw_artifacts,
)

RUNNERS = ("local", "beam")
# TFX's orchestrators keep process-wide state and are not safe to run concurrently in one process:
# iterators run in threads of one process (sage_tfx.adaptive.platform.Platform) take turns. `sage serve`
# runs each pipeline in its own worker process instead (sage_tfx.adaptive.workers), where this lock is
# never contended, so its pipelines' TFX runs go at once.
_TFX_LOCK = threading.Lock()


@dataclass
class PipelineConfig:
    """Everything a ready pipeline factory needs besides the grant; built once per `sage run`."""

    name: str
    ledger: str
    stream: str
    data_root: str
    work_dir: str
    target: float
    confidence: float = 0.95
    serving_dir: str | None = None
    runner: str = "local"
    beam_pipeline_args: list = field(default_factory=list)
    model: str | None = None
    hparams: dict = field(default_factory=dict)
    # BlockExampleGen's staging_location (docs/scale_out.md, "BlockExampleGen on remote workers"): None leaves it
    # to the Beam --temp_location of beam_pipeline_args, if any.
    staging_location: str | None = None
    # Where the pipelines' TFX roots live (docs/scale_out.md, "The pipeline root on a URL filesystem"): a local
    # folder or a URL of a filesystem TFX's file layer has (gs://, s3://, hdfs://, file://, ram://); this
    # pipeline's root is ARTIFACT_ROOT/NAME. None: WORK_DIR/tfx.
    artifact_root: str | None = None
    # The MLMD SQLite file: always a local path (SQLite does not work on an object store). None:
    # WORK_DIR/tfx/NAME/metadata.sqlite, local whatever the pipeline root.
    metadata_file: str | None = None

    def __post_init__(self):
        if self.runner not in RUNNERS:
            raise ValueError(f"runner {self.runner!r} is unknown: use one of {', '.join(RUNNERS)}")
        self.work_dir = os.path.abspath(self.work_dir)
        # absolute: a confined child runs in a folder of its own, where a relative path names nothing
        self.data_root = self.data_root if is_url(self.data_root) else os.path.abspath(self.data_root)
        if self.staging_location is not None and not is_url(self.staging_location):
            self.staging_location = os.path.abspath(self.staging_location)
        self.serving_dir = os.path.abspath(self.serving_dir or os.path.join(self.work_dir, "serving"))
        if self.artifact_root is not None:
            self.artifact_root = (
                self.artifact_root.rstrip("/") if is_url(self.artifact_root) else os.path.abspath(self.artifact_root)
            )
        if self.metadata_file is not None:
            if is_url(self.metadata_file):
                raise ValueError(
                    f"metadata path {self.metadata_file!r} is a URL: MLMD's SQLite file must be a local "
                    "path (SQLite does not work on an object store); give a local file, or leave it "
                    "out for WORK_DIR/tfx/NAME/metadata.sqlite"
                )
            self.metadata_file = os.path.abspath(self.metadata_file)

    @property
    def remote_root(self):
        """Whether the pipeline root is a URL (no local chmod, every access through TFX's file layer)."""
        return is_url(self.pipeline_root)

    @property
    def pipeline_root(self):
        if self.artifact_root is None:
            return os.path.join(self.work_dir, "tfx", self.name)
        if is_url(self.artifact_root):
            return f"{self.artifact_root}/{self.name}"
        return os.path.join(self.artifact_root, self.name)

    @property
    def metadata_path(self):
        return self.metadata_file or os.path.join(self.work_dir, "tfx", self.name, "metadata.sqlite")


def check_pipeline_root(root):
    """``root`` (a `--pipeline-root`) checked before anything is charged: a local folder comes back absolute; a URL
    must have a scheme both TFX's file layer (``tf.io.gfile``) and Beam's FileSystems can use, and be reachable
    (a folder is created there). ValueError naming the value and the fix otherwise."""
    if not is_url(root):
        return os.path.abspath(root)
    import tensorflow as tf
    from apache_beam.io.filesystems import FileSystems

    import sage_tfx.components._gfile_beam  # noqa: F401  (Beam's ram:// and file:// filesystems)

    try:
        FileSystems.get_filesystem(root)
    except Exception as exc:  # ValueError (no such scheme), BeamIOError (its client library is missing)
        raise ValueError(
            f"--pipeline-root {root!r} has no Beam filesystem ({exc}): give a local folder or a URL "
            "of a filesystem both TensorFlow and Beam have (gs://; s3:// and hdfs:// with their "
            "filesystem packages installed; file://, ram:// in one process)"
        ) from None
    try:
        tf.io.gfile.makedirs(root)
        if not tf.io.gfile.isdir(root):
            raise OSError("not a folder after makedirs")
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"--pipeline-root {root!r} cannot be used: {type(exc).__name__}: {first}. Give a URL of a "
            "filesystem TensorFlow has (gs://; s3:// with tensorflow-io; file://, ram://) that this "
            "host can reach and write, or a local folder"
        ) from None
    return root.rstrip("/")


def check_writable_folder(path, flag):
    """Refuse (ValueError naming ``flag``, the value and the fix) a local folder the run could not write: a path
    that is, or lies under, a file, or whose nearest existing folder this process cannot create files in (a probe
    file is created there and removed: nothing is left). A missing folder is fine: the run creates it."""
    path = os.path.abspath(path)
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == path else f"lies under the file {existing!r}"
        raise ValueError(f"{flag} {path!r} {where}: give a folder (it is created if missing)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".sage-probe-", dir=existing)
    except OSError as exc:
        raise ValueError(
            f"{flag} {path!r} cannot be written ({existing}: {exc.strerror}): give a folder this user can write"
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_stream_schema(data_root, stream, sla, name, schema=None) -> dict:
    """The stream's schema ({column: kind}), checked before anything is charged (ValueError naming the value and the
    fix): the data root holds the stream (its ``_stream.json``; ``schema`` given: the caller has it already, e.g.
    `sage serve` before its replay wrote any block), and pipeline ``name``'s SLA label is one of its columns
    (unless the model derives it: ``label_signature``)."""
    from sage_tfx.components.transform_utils import stream_schema
    from sage_tfx.ingest.layout import STREAM_FILE, stream_dir

    if schema is None:
        where = os.path.join(stream_dir(data_root, stream), STREAM_FILE)
        try:
            schema = stream_schema(data_root, stream)
        except (OSError, ValueError):
            raise ValueError(
                f"--data-root {data_root!r} holds no stream {stream!r} ({where} is missing or "
                "unreadable): give the --data-root `sage ingest` wrote the stream to"
            ) from None
    if sla.label_signature is None and sla.label not in schema:
        raise ValueError(
            f"pipeline {name!r}: its SLA label {sla.label!r} is not a column of stream {stream!r} "
            f"(columns: {', '.join(sorted(schema))}): name one of them in the pipeline's SLA(label=...)"
        )
    return schema


def check_run_folders(config) -> None:
    """The folders a run of ``config`` writes, checked before anything is charged (``check_writable_folder``): the
    work folder, the serving folder, the MLMD file's folder and a local pipeline root."""
    folders = [
        ("--work-dir", config.work_dir),
        ("--serving-dir", config.serving_dir),
        ("the folder of --metadata-path", os.path.dirname(config.metadata_path)),
    ]
    if config.artifact_root is not None and not is_url(config.artifact_root):
        folders.append(("--pipeline-root", config.artifact_root))
    for flag, folder in folders:
        check_writable_folder(folder, flag)


def run_tfx(pipeline, runner):
    with _TFX_LOCK:
        old_umask = os.umask(0o077)  # what the run writes (raw copies among it): 0600 files, 0700 folders
        try:
            _run_tfx(pipeline, runner)
        finally:
            os.umask(old_umask)


def _run_tfx(pipeline, runner):
    if runner == "beam":
        from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

        BeamDagRunner().run(pipeline)
    else:
        from tfx.orchestration.local.local_dag_runner import LocalDagRunner

        LocalDagRunner().run(pipeline)


# Beam's in-process runners: their workers are this process, which has imported the module files already.
IN_PROCESS_RUNNERS = ("directrunner", "direct", "bundlebaseddirectrunner", "switchingdirectrunner")


def runs_on_remote_workers(beam_args):
    """Whether ``beam_args`` run Beam jobs in worker processes other than this one: a runner other than the
    DirectRunner (PortableRunner, Flink, Spark, Dataflow, Dask...), or the DirectRunner's multi_processing mode.
    Those workers import what a job pickled by module name, so module files must travel."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    options = PipelineOptions(list(beam_args))
    if options.view_as(DirectOptions).direct_running_mode == "multi_processing":
        return True
    runner = options.view_as(StandardOptions).runner
    if runner is None:
        return False
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1].lower() not in IN_PROCESS_RUNNERS


def stage_user_modules(pipeline, pipeline_root):
    """Package each Beam component's module file into a wheel under PIPELINE_ROOT/_wheels and stage it with the
    component's Beam jobs (docs/scale_out.md, "PortableRunner with an external worker pool").

    As TFX's own Transform does (``tfx.components.util.udf_utils``): the wheel holds the ``.py`` files of the
    module's folder, named by a hash of their contents; the component's ``module_path`` becomes
    ``MODULE@WHEEL`` and its ``module_file`` is cleared, so the executor imports the module by name from the wheel
    (installed into a temporary folder) and the pickled functions refer to it by that name; ``--extra_package=
    WHEEL`` is added to the Beam args of every Beam component of the run, so the workers of each job install the
    wheels before they unpickle anything. That flag also stops TFX from building and staging an sdist of TFX itself with every job
    (``tfx.utils.dependency_utils.make_beam_dependency_flags``): the workers must already hold the launcher's
    stack (TFX, TensorFlow, sage-tfx). Returns the wheels' paths.
    """
    from tfx.components.util import udf_utils
    from tfx.dsl.components.base.base_beam_component import BaseBeamComponent

    from sage_tfx.components.dp_transform_executor import stdout_to_stderr

    beam_components = [c for c in pipeline.components if isinstance(c, BaseBeamComponent)]
    wheels = []
    for component in beam_components:
        props = component.spec.exec_properties
        module_file = props.get("module_file")
        if isinstance(module_file, str) and module_file and "module_path" in props:
            with stdout_to_stderr():  # setup.py bdist_wheel's chatter
                wheel, key = udf_utils.package_user_module_file(component.id, module_file, pipeline_root)
            props["module_path"], props["module_file"] = key, None
            wheels.append(wheel)
    if wheels:  # every Beam job of the run stages them (small): no job falls back to TFX's sdist of itself
        flags = [f"--extra_package={wheel}" for wheel in sorted(set(wheels))]
        for component in beam_components:
            component.with_beam_pipeline_args(flags)
    return wheels


GFILE_BEAM_PLUGIN = "sage_tfx.components._gfile_beam"


def register_url_filesystems_on_workers(pipeline):
    """Add ``--beam_plugins=sage_tfx.components._gfile_beam`` to every Beam component's args, so that the SDK
    workers of a remote runner import it (``sdk_worker_main`` imports each beam plugin at start) and have the
    ``file://`` and ``ram://`` Beam filesystems the launcher registered by importing it: without it a worker that
    writes Examples under a ``file://`` pipeline root fails with "Unable to get filesystem" (docs/scale_out.md,
    "The pipeline root on a URL filesystem"). gs://, s3:// and hdfs:// are Beam's own; the flag is harmless there."""
    from tfx.dsl.components.base.base_beam_component import BaseBeamComponent

    for component in pipeline.components:
        if isinstance(component, BaseBeamComponent):
            component.with_beam_pipeline_args([f"--beam_plugins={GFILE_BEAM_PLUGIN}"])


def validation_result(metadata_path, grant_id, root=None):
    """The DPModelValidator result (dict from its result.json) recorded for ``grant_id``, or None. ``root``: the
    local pipeline root the result must lie in (RuntimeError for a result outside it or reached through a symbolic
    link: a confined run's MLMD may point anywhere)."""
    from ml_metadata.metadata_store import metadata_store

    store = metadata_store.MetadataStore(metadata_config(metadata_path))
    found = [
        a
        for a in store.get_artifacts_by_type("SageValidationResult")
        if a.custom_properties["grant_id"].string_value == grant_id and a.state == a.LIVE
    ]
    if not found:
        return None
    latest = max(found, key=lambda a: a.id)
    if root is not None and not is_url(root) and not inside_root(os.path.join(latest.uri, "result.json"), root):
        raise RuntimeError(
            f"the validation result under grant {grant_id} is not a file inside the pipeline root "
            f"{root}: it was not written by DPModelValidator"
        )
    if root is not None and not is_url(root):  # a local file: read without importing TensorFlow
        with open(os.path.join(latest.uri, "result.json")) as f:
            return json.load(f)
    from tfx.dsl.io import fileio  # the validator wrote it with TF's file system layer: a URL pipeline root

    with fileio.open(os.path.join(latest.uri, "result.json")) as f:
        return json.loads(f.read())


def make_run_iteration(build_pipeline, config, execute=None):
    """A ``run_iteration(grant, split, eta, iteration)`` for SageIterator over a pipeline factory.

    ``build_pipeline(config, grant, split, eta, iteration)`` returns a TFX Pipeline
    whose DPModelValidator validates under ``grant``. ``execute(grant, split, eta, iteration)`` builds and runs it
    and returns the validation result it trusts, or None (default: ``run_built`` in this process, its outcome then
    read from MLMD; ``sage run`` runs it in a confined child and validates its model in another,
    ``pipelines.confined``); the pipeline root is made private and scrubbed here, before and after.
    """
    from sage_tfx.adaptive import IterationResult

    if execute is None:

        def execute(grant, split, eta, iteration):
            run_built(build_pipeline, config, grant, split, eta, iteration)

    def run_iteration(grant, split, eta, iteration):
        prepare_pipeline_root(config)
        try:
            result = execute(grant, split, eta, iteration)
        finally:
            scrub_raw_artifacts(config)  # the run ended (ACCEPT, RETRY, REJECT or an error): no raw copy stays
        if result is None:  # run in this process: its validator's result, from MLMD
            result = validation_result(config.metadata_path, grant.id, config.pipeline_root)
        if result is None:
            raise RuntimeError(f"the pipeline run under grant {grant.id} recorded no validation result")
        bound = result.get("bound")  # None when the noisy count was not positive
        return IterationResult(
            str(result["outcome"]), bound=None if bound is None else float(bound), details={"validation": result}
        )

    return run_iteration


def prepare_pipeline_root(config):
    """Make the pipeline root (and the MLMD folder) private (0700) and scrub what a run killed outright left."""
    if config.remote_root:  # Beam's ram:// and file:// filesystems (gs://, s3://, hdfs:// are Beam's own)
        import sage_tfx.components._gfile_beam  # noqa: F401
    # WORK_DIR/tfx/NAME or ARTIFACT_ROOT/NAME, and its parent (WORK_DIR itself is left as it is)
    make_private_dir(config.artifact_root or os.path.dirname(config.pipeline_root))
    make_private_dir(config.pipeline_root)
    if config.metadata_file is None and config.artifact_root is not None:  # MLMD stays in WORK_DIR/tfx/NAME, 0700
        make_private_dir(os.path.dirname(os.path.dirname(config.metadata_path)))
        make_private_dir(os.path.dirname(config.metadata_path))
    scrub_raw_artifacts(config)  # left by a run killed outright


def run_built(build_pipeline, config, grant, split, eta, iteration):
    """Build the iteration's TFX pipeline with ``build_pipeline`` and run it (module files staged for remote Beam
    workers): the part of an iteration that runs user code."""
    if config.remote_root:
        import sage_tfx.components._gfile_beam  # noqa: F401
    pipeline = build_pipeline(config, grant, split, eta, iteration)
    if runs_on_remote_workers(config.beam_pipeline_args):  # either orchestrator hands them to Beam components
        stage_user_modules(pipeline, config.pipeline_root)
        if config.remote_root:
            register_url_filesystems_on_workers(pipeline)
    run_tfx(pipeline, config.runner)
