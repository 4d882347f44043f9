"""A pipeline definition bound to its run settings, and the Sage iterator that runs it.

``build_runner`` binds a ``SagePipeline`` to a ``PipelineConfig`` (a ``PipelineRunner``: ``run_iteration`` for the
iterator, the checks made before any charge); ``make_iterator`` builds the ``SageIterator`` of a runner from a
``RunSettings``. `sage run`, `sage serve`'s workers and the demo all go through these two (docs/your_pipeline.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sage_tfx.privacy.vocabulary import BlockState


class PipelineRunner:
    """A SagePipeline bound to its config: ``run_iteration`` for the iterator, and the checks made before a charge.

    With ``spec`` each iteration runs in a confined child (``pipelines.confined``) that may reach none of
    ``secrets``: docs/security.md.

    Args:
        pipeline: the ``SagePipeline``.
        config: its ``PipelineConfig`` (the ledger, stream, data root, work dir, target, ...).
        spec: the pipeline as ``sage run`` names it (``load_pipeline``), or None to run iterations in this process.
        secrets: the ledger's secret files (``ledger_secrets``), none of which a confined child may reach.

    Raises:
        ValueError: an unknown model family, a run folder that is a file or not writable, or a folder given to the
            child that holds a secret; before any charge.
    """

    def __init__(self, pipeline, config, spec=None, secrets=()):
        from sage_tfx.pipelines._runner import check_run_folders, make_run_iteration

        pipeline.model_family(config.model)  # bad input fails here, before any spend
        check_run_folders(config)  # a --work-dir that is a file, a folder this user cannot write
        self.pipeline, self.config = pipeline, config
        execute = None
        if spec is not None:
            from sage_tfx.pipelines.confined import confined_execute

            execute = confined_execute(spec, pipeline, config, secrets)
        self.run_iteration = make_run_iteration(pipeline.build_pipeline, config, execute)

    def check_stream(self, schema: dict | None = None) -> None:
        """Refuse a stream the data root lacks, or whose columns lack the SLA label (``check_stream_schema``).

        Args:
            schema: the stream's schema when the caller has it already, or None to read it.

        Raises:
            ValueError: naming the value and the fix.
        """
        from sage_tfx.pipelines._runner import check_stream_schema

        config = self.config
        check_stream_schema(config.data_root, config.stream, self.pipeline.sla, config.name, schema)

    def check_blocks(self, ledger, blocks=None) -> None:
        """Refuse blocks that cannot be read from the data root (``sage_tfx.ingest.access.check_blocks``).

        Called once before the run registers or charges anything, and again right before each charge.

        Args:
            ledger: the open ``Ledger``.
            blocks: the block ids to check, or None for every active block of the stream.

        Raises:
            RefusedBeforeCharge: naming the block and the fix.
        """
        from sage_tfx.ingest import access, sealed
        from sage_tfx.privacy.errors import RefusedBeforeCharge

        if blocks is None:
            blocks = [b.id for b in ledger.blocks(self.config.stream, BlockState.ACTIVE)]
        try:
            access.check_blocks(ledger, self.config.data_root, self.config.stream, blocks)
        except sealed.SealedError as exc:
            raise RefusedBeforeCharge(
                f"--data-root {self.config.data_root!r}: {exc}. Nothing was charged for this "
                "iteration: give the --data-root `sage ingest` wrote the stream to, or restore "
                "the block folder"
            ) from None

    def request(self) -> dict:
        """What an ACCEPT of this runner certifies (``SagePipeline.certificate_request``), signed into each grant."""
        config = self.config
        return self.pipeline.certificate_request(config.target, config.confidence, config.model, config.hparams)


def build_runner(
    definition,
    db: str,
    stream: str,
    data_root: str,
    work_dir: str,
    target: float,
    *,
    confidence: float = 0.95,
    serving_dir: str | None = None,
    runner: str = "local",
    beam_args: Sequence[str] = (),
    model: str | None = None,
    name: str | None = None,
    staging_location: str | None = None,
    pipeline_root: str | None = None,
    metadata_path: str | None = None,
    spec: str | None = None,
    secrets: Sequence[str] = (),
) -> PipelineRunner:
    """The ``PipelineRunner`` of a pipeline on a ledger's stream, validated against ``target``.

    Args:
        definition: the ``SagePipeline``.
        db: the ledger's location.
        stream: the stream's name.
        data_root: the folder holding the stream's blocks.
        work_dir: the folder of its TFX runs' files.
        target: the SLA target.
        confidence: the SLA's confidence (eta = 1 - confidence).
        serving_dir: where an ACCEPTed model is pushed (None: none).
        runner: "local" or "beam".
        beam_args: the Beam pipeline options of its TFX runs.
        model: the model family (None: the pipeline's first).
        name: the pipeline name in the ledger (None: its own).
        staging_location: BlockExampleGen's staging location for remote Beam workers.
        pipeline_root: the folder or URL the pipeline's TFX root goes under (None: WORK_DIR/tfx).
        metadata_path: its local MLMD SQLite file (``{name}`` is replaced by the pipeline name).
        spec: the pipeline as ``sage run`` names it, to run its iterations confined (``PipelineRunner``).
        secrets: the ledger's secret files, none of which a confined iteration may reach.

    Returns:
        The ``PipelineRunner``.

    Raises:
        ValueError: naming the bad value and the fix (before anything is charged).
    """
    from sage_tfx.pipelines._runner import PipelineConfig

    name = name or definition.name
    config = PipelineConfig(
        name=name,
        ledger=db,
        stream=stream,
        data_root=data_root,
        work_dir=work_dir,
        target=target,
        confidence=confidence,
        serving_dir=serving_dir,
        runner=runner,
        beam_pipeline_args=list(beam_args),
        model=model,
        staging_location=staging_location,
        artifact_root=pipeline_root,
        metadata_file=metadata_path.replace("{name}", name) if metadata_path else None,
    )
    return PipelineRunner(definition, config, spec, secrets)


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What a run asks of the Sage iterator beyond the pipeline's own defaults (``iterator_defaults``); with those
    and the confidence, ``make_iterator`` builds its ``sage_tfx.adaptive.IteratorSettings``.

    Args:
        max_iterations: the attempts one run may charge (>= 1).
        max_seconds: TIMEOUT after this wall time (> 0), or None for no time limit.
        epsilon_start: the first attempt's epsilon, or None for the pipeline's default.
        min_window: the first attempt's window in blocks, or None for the pipeline's default.
        rejection_share: the training side's share paid to the REJECT test, or None for the pipeline's default.

    Raises:
        ValueError: naming the bad value and the fix, when built (before anything is charged); the iterator checks
        the rest (epsilon_start against the stream's budget, the shares) when ``make_iterator`` builds it.
    """

    max_iterations: int = 10
    max_seconds: float | None = None
    epsilon_start: float | None = None
    min_window: int | None = None
    rejection_share: float | None = None

    def __post_init__(self):
        if isinstance(self.max_iterations, bool) or not isinstance(self.max_iterations, int) or self.max_iterations < 1:
            raise ValueError(f"max_iterations {self.max_iterations!r} is invalid: give an integer >= 1")
        if self.max_seconds is not None and not (math.isfinite(self.max_seconds) and self.max_seconds > 0):
            raise ValueError(
                f"max_seconds {self.max_seconds!r} is invalid: give a number of seconds > 0 (or None for no time limit)"
            )

    def overrides(self) -> dict:
        """The settings that replace the pipeline's defaults (those given)."""
        given = {
            "epsilon_start": self.epsilon_start,
            "min_window": self.min_window,
            "rejection_share": self.rejection_share,
        }
        return {k: v for k, v in given.items() if v is not None}


def make_iterator(
    definition,
    ledger,
    runner: PipelineRunner,
    settings: RunSettings,
    progress: Callable[[str], None] = print,
    wait_for_blocks=None,
):
    """The ``SageIterator`` of a `sage run`/`sage serve` pipeline, its grants signed with the runner's request.

    Args:
        definition: the ``SagePipeline`` (its ``iterator_defaults``).
        ledger: the open ``Ledger``.
        runner: the pipeline's ``PipelineRunner`` (``build_runner``).
        settings: what the run asks beyond the pipeline's defaults.
        progress: called with each progress line.
        wait_for_blocks: ``wait_for_blocks(timeout) -> bool``, called when the stream has too few blocks with
            budget (False: no more will come), or None to end in TIMEOUT then.

    Returns:
        The ``SageIterator``.

    Raises:
        RequestMismatch: the pipeline name was run for another target, SLA, model or definition (a LedgerError:
            exit 2, nothing registered or charged).
    """
    from sage_tfx.adaptive import IteratorSettings, SageIterator

    options = IteratorSettings(
        **{**definition.iterator_defaults(), **settings.overrides()},
        eta=1 - runner.config.confidence,
        max_iterations=settings.max_iterations,
        max_seconds=settings.max_seconds,
    )
    return SageIterator(
        ledger,
        runner.config.stream,
        runner.config.name,
        runner.run_iteration,
        settings=options,
        wait_for_blocks=wait_for_blocks,
        progress=progress,
        request=runner.request(),
        check_blocks=lambda blocks: runner.check_blocks(ledger, blocks),
    )
