"""`sage serve`'s pipeline participant: one worker process running a pipeline's Sage iterator.

``WorkerSpec`` names the pipeline (picklable); ``worker_main`` is the function its worker process runs (spawn), under
``sage_tfx.adaptive.workers.ProcessPlatform``: it rebuilds the pipeline with ``build_worker_runner`` (the same
``build_runner`` as `sage run`, its iterations confined) and runs its ``SageIterator``, each TFX run waiting for a slot
(``--parallel``) and each wait for blocks on the platform's replay clock.
"""

import os
from dataclasses import dataclass, field

from sage_tfx.adaptive.workers import BlockWaiter, WorkerResult, die
from sage_tfx.privacy import Ledger


@dataclass
class WorkerSpec:
    """What a worker needs to rebuild its pipeline in a fresh process (picklable: names and numbers only)."""

    name: str
    pipeline: str  # built-in name, file path or dotted module path (sage_tfx.pipelines.load_pipeline)
    target: float
    model: str | None
    ledger: str
    stream: str
    data_root: str
    work_dir: str
    confidence: float = 0.95
    runner: str = "local"
    max_iterations: int = 10
    rejection_share: float | None = None
    key_file: str | None = None
    beam_args: list = field(default_factory=list)  # Beam pipeline options of its TFX runs (`sage serve ... -- ARGS`)
    staging_location: str | None = None  # BlockExampleGen's staging location (`sage serve --staging-location`)
    pipeline_root: str | None = None  # folder or URL the TFX roots go under (`--pipeline-root`; None: WORK_DIR/tfx)
    metadata_path: str | None = None  # local MLMD SQLite file, {name} replaced (`--metadata-path`)

    def entry(self):
        """The function this participant's worker process runs."""
        return worker_main


def build_worker_runner(spec):
    """``(definition, PipelineRunner)`` of a ``WorkerSpec``: the pipeline described (a user's file in a confined
    child: ``pipelines.confined.describe``), checked against its target and bound to its config (Beam options and
    staging location included) by ``build_runner`` (as `sage run`), its iterations run confined as `sage run`'s.
    ValueError for bad input (the parent calls it before anything is charged, the worker to run)."""
    from sage_tfx.pipelines.confined import describe, ledger_secrets
    from sage_tfx.pipelines.runner import build_runner

    secrets = ledger_secrets(spec.ledger, spec.key_file)
    definition = describe(spec.pipeline, secrets)
    definition.check_target(spec.target)
    runner = build_runner(
        definition,
        spec.ledger,
        spec.stream,
        spec.data_root,
        spec.work_dir,
        spec.target,
        confidence=spec.confidence,
        runner=spec.runner,
        beam_args=spec.beam_args,
        model=spec.model,
        name=spec.name,
        staging_location=spec.staging_location,
        pipeline_root=spec.pipeline_root,
        metadata_path=spec.metadata_path,
        spec=spec.pipeline,
        secrets=secrets,
    )
    return definition, runner


def worker_main(spec, conn):
    """A worker process: run ``spec``'s iterator, talking to the parent over ``conn``. Module level (spawn)."""
    from sage_tfx.privacy import public_error_text
    from sage_tfx.privacy.errors import RefusedBeforeCharge
    from sage_tfx.privacy.keys import ENV_KEY_FILE

    if spec.key_file:
        os.environ[ENV_KEY_FILE] = spec.key_file
    waiter = BlockWaiter(conn)  # the replay generation this worker last heard of
    raised = [None]  # the exception an iteration raised (the iterator records FAILED on its grant)

    def say(line):
        conn.send(("progress", line))

    try:
        from sage_tfx.pipelines.runner import RunSettings, make_iterator

        definition, runner = build_worker_runner(spec)
        run_iteration = runner.run_iteration

        def run_in_slot(grant, split, eta, iteration):
            conn.send(("acquire", None))
            conn.recv()  # ("slot",): the parent lets at most `parallel` iterations run at once
            try:
                return run_iteration(grant, split, eta, iteration)
            except Exception as exc:
                raised[0] = exc
                raise
            finally:
                conn.send(("release", None))

        runner.run_iteration = run_in_slot
        ledger = Ledger.open(spec.ledger)
        settings = RunSettings(max_iterations=spec.max_iterations, rejection_share=spec.rejection_share)
        iterator = make_iterator(
            definition, ledger, runner, settings, progress=say, wait_for_blocks=lambda _t: waiter.wait(3600.0)
        )
        try:
            result = iterator.run()
        finally:
            ledger.close()
    except Exception as exc:
        text = public_error_text(exc)  # a data path: no value in the text
        # FAILED recorded on the grant, or a block refused before its charge: the pipeline's outcome, not a death
        # (an environment error after the charge, IterationInterrupted, is one: the restarted worker resumes it)
        if exc is raised[0] or isinstance(exc, RefusedBeforeCharge):
            conn.send(("failed", text))
            conn.close()
            return
        die(conn, spec.name, text)
    conn.send(("done", WorkerResult(result.outcome, len(result.iterations), result.describe())))
    conn.close()
