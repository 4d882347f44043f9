"""Run one privacy-adaptive iteration as one TFX pipeline run, and read back its outcome.

Each iteration of the Sage iterator builds the pipeline anew with the grant as
an execution parameter of every data-reading component, runs it on
``LocalDagRunner`` or ``BeamDagRunner`` (Beam pipeline options pass through),
then reads the DPModelValidator's result for that grant from MLMD. TFX caching
is on: re-running an iteration under the same grant (after a crash) reuses the
components that already finished, with the DP noise they already drew.
"""
import json
import os
import threading
from dataclasses import dataclass, field

RUNNERS = ("local", "beam")
# TFX's orchestrators keep process-wide state and are not safe to run concurrently in one process;
# `sage serve` runs several iterators in threads, so their TFX runs take turns (each run's Beam jobs
# still use the machine's cores).
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

    def __post_init__(self):
        if self.runner not in RUNNERS:
            raise ValueError(f"runner {self.runner!r} is unknown: use one of {', '.join(RUNNERS)}")
        self.work_dir = os.path.abspath(self.work_dir)
        self.serving_dir = os.path.abspath(self.serving_dir or os.path.join(self.work_dir, "serving"))

    @property
    def pipeline_root(self):
        return os.path.join(self.work_dir, "tfx", self.name)

    @property
    def metadata_path(self):
        return os.path.join(self.work_dir, "tfx", self.name, "metadata.sqlite")


def metadata_config(path):
    from tfx.orchestration import metadata

    os.makedirs(os.path.dirname(path), exist_ok=True)
    return metadata.sqlite_metadata_connection_config(path)


def run_tfx(pipeline, runner):
    with _TFX_LOCK:
        _run_tfx(pipeline, runner)


def _run_tfx(pipeline, runner):
    if runner == "beam":
        from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

        BeamDagRunner().run(pipeline)
    else:
        from tfx.orchestration.local.local_dag_runner import LocalDagRunner

        LocalDagRunner().run(pipeline)


def validation_result(metadata_path, grant_id):
    """The DPModelValidator result (dict from its result.json) recorded for ``grant_id``, or None."""
    from ml_metadata.metadata_store import metadata_store

    store = metadata_store.MetadataStore(metadata_config(metadata_path))
    found = [a for a in store.get_artifacts_by_type("SageValidationResult")
             if a.custom_properties["grant_id"].string_value == grant_id and a.state == a.LIVE]
    if not found:
        return None
    latest = max(found, key=lambda a: a.id)
    with open(os.path.join(latest.uri, "result.json")) as f:
        return json.load(f)


def make_run_iteration(build_pipeline, config):
    """A ``run_iteration(grant, split, eta, iteration)`` for SageIterator over a pipeline factory.

    ``build_pipeline(config, grant, split, eta, iteration)`` returns a TFX Pipeline
    whose DPModelValidator validates under ``grant``.
    """
    from sage_tfx.adaptive import IterationResult

    def run_iteration(grant, split, eta, iteration):
        pipeline = build_pipeline(config, grant, split, eta, iteration)
        run_tfx(pipeline, config.runner)
        result = validation_result(config.metadata_path, grant.id)
        if result is None:
            raise RuntimeError(f"the pipeline run under grant {grant.id} recorded no validation result")
        bound = result.get("bound")  # None when the noisy count was not positive
        return IterationResult(str(result["outcome"]), bound=None if bound is None else float(bound),
                               details={"validation": result})

    return run_iteration
