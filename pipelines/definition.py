"""Your own privacy-adaptive pipeline: its SLA, its module files, its model families and its components.

A pipeline file defines one `SagePipeline`; ``sage run`` drives it to ACCEPT, REJECT or TIMEOUT as it drives the
built-in pipelines. Each iteration runs BlockExampleGen -> DPTransform -> DPTrainer -> DPModelValidator ->
Pusher under the iteration's grant, which every data-reading component checks before it reads: docs/your_pipeline.md,
"The pipeline file"; docs/block_composition.md, "What a grant pays for".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sage_tfx.components.user_modules import python_files
from sage_tfx.privacy.checks import number, positive
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.split import DEFAULT_RECORD_SPLIT, eval_share_split
from sage_tfx.privacy.vocabulary import LOG_LOSS_FLOOR, Metric


class PipelineDefinitionError(SageError, ValueError):
    """A pipeline definition, or the file that holds it, is unusable; the message names what and where."""


@dataclass(frozen=True)
class SLA:
    """What the validator certifies: ``metric`` of the model on ``label``, losses clipped to a public bound.

    The validator's noise and concentration terms scale with ``loss_bound`` (docs/validation.md); choosing it and
    the other fields: docs/your_pipeline.md, "The pipeline file".

    Args:
        metric: a `Metric` value: mse, mae, log_loss, accuracy or custom.
        label: the raw column of the stream the validator reads as the label.
        loss_bound: the PUBLIC bound B each example's loss is clipped to ([0, B]); required but for accuracy
            (which takes none) and log_loss (default ln(1e7), its largest value with probabilities kept in
            [1e-7, 1 - 1e-7]).
        label_threshold: derive a binary label, 1 where the raw label exceeds it (e.g. arr_delay > 15), or None.
        loss_module: for metric custom only: the Python file (relative to the pipeline file) of your
            per-example loss of (labels, signature outputs).
        loss_function: the loss's name in loss_module; None for ``per_example_loss``.
        label_signature: read ``label`` from this signature of the trained model instead of the raw record
            (TFMA's ``preprocessing_function_names``, e.g. ``"transform_features"``), or None.

    Raises:
        PipelineDefinitionError: an unknown metric, a missing or misplaced bound, threshold, signature or loss
            module; the message names the field and the fix.
    """

    metric: str
    label: str
    loss_bound: float | None = None
    label_threshold: float | None = None
    loss_module: str | None = None
    loss_function: str | None = None
    label_signature: str | None = None

    def __post_init__(self):
        try:
            metric = Metric(str(self.metric).strip().lower())
        except ValueError:
            raise PipelineDefinitionError(
                f"SLA metric {self.metric!r} is unknown: use one of {', '.join(m.value for m in Metric)}"
            ) from None
        object.__setattr__(self, "metric", metric.value)
        if not isinstance(self.label, str) or not self.label:
            raise PipelineDefinitionError(f"SLA label {self.label!r} must name the label column")
        bound = self.loss_bound
        if metric is Metric.ACCURACY:
            if bound is not None:
                raise PipelineDefinitionError(f"SLA loss_bound {bound!r} does not apply to accuracy: leave it out")
        else:
            if bound is None and metric is Metric.LOG_LOSS:
                bound = math.log(1.0 / LOG_LOSS_FLOOR)
            if bound is None:
                raise PipelineDefinitionError(
                    f"SLA metric {metric.value!r} needs loss_bound: a public bound B on "
                    "each example's loss (losses are clipped to [0, B])"
                )
            bound = positive(
                bound,
                "SLA loss_bound",
                error=PipelineDefinitionError,
                allow_bool=True,
                message="{what} {value!r} must be {rule}",
                not_number="{what} {value!r} is not a number",
            )
        object.__setattr__(self, "loss_bound", bound)
        if self.label_threshold is not None:
            threshold = number(
                self.label_threshold,
                "SLA label_threshold",
                error=PipelineDefinitionError,
                allow_bool=True,
                message="{what} {value!r} must be a finite number",
            )
            object.__setattr__(self, "label_threshold", threshold)
        if self.label_signature is not None and (
            not isinstance(self.label_signature, str) or not self.label_signature.strip()
        ):
            raise PipelineDefinitionError(
                f"SLA label_signature {self.label_signature!r} must name a signature of "
                "the trained model, e.g. 'transform_features'"
            )
        if (metric is Metric.CUSTOM) != (self.loss_module is not None):
            raise PipelineDefinitionError(
                f"SLA loss_module {self.loss_module!r}: metric 'custom' needs one (the "
                "Python file of your per-example loss), the other metrics take none"
            )

    def check_target(self, target: float) -> float:
        """The target as a float, refused when it can never be met or is always met.

        Args:
            target: the SLA target: an accuracy in (0, 1), or a loss in (0, loss_bound).

        Returns:
            The target as a float.

        Raises:
            ValueError: a target that is not a number, can never be met, or every model meets; names it.
        """
        metric = Metric(self.metric)
        what, not_number = f"{metric.value} target", "{what} {value!r} is not a number"
        if metric is Metric.ACCURACY:
            return number(
                target,
                what,
                error=ValueError,
                low=0.0,
                high=1.0,
                low_open=True,
                high_open=True,
                allow_bool=True,
                not_number=not_number,
                message="{what} {value!r} can never be met meaningfully: it must lie {rule}",
            )
        value = positive(
            target,
            what,
            error=ValueError,
            allow_bool=True,
            not_number=not_number,
            message="{what} {value!r} can never be met: it must be a positive number",
        )
        if value >= self.loss_bound:
            raise ValueError(
                f"{metric.value} target {value!r} is at least the loss bound {self.loss_bound:g}: "
                "every model meets it, so there is nothing to validate"
            )
        return value


def _file_digest(path: str) -> str | None:
    """SHA-256 (hex) of a file's bytes; None if it cannot be read (a module file is checked before any spend)."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


@dataclass
class StandardComponents:
    """The five components of an iteration, wired together (``SagePipeline.standard_components``).

    Args:
        example_gen: the BlockExampleGen.
        transform: the DPTransform, or None for a pipeline without a preprocessing module.
        trainer: the DPTrainer.
        validator: the DPModelValidator.
        pusher: TFX's Pusher, gated by the validator's blessing.
    """

    example_gen: object
    transform: object | None
    trainer: object
    validator: object
    pusher: object

    def as_list(self) -> list:
        return [
            c for c in (self.example_gen, self.transform, self.trainer, self.validator, self.pusher) if c is not None
        ]


def _iterator_settings() -> set:
    from sage_tfx.adaptive import IteratorSettings

    return set(IteratorSettings.names() - {"eta", "max_iterations", "max_seconds", "eval_share"})


@dataclass(frozen=True)
class SagePipeline:
    """A privacy-adaptive pipeline, as a user defines it in a pipeline file.

    Every field is checked when the pipeline file loads, before anything is charged: docs/your_pipeline.md,
    "The pipeline file".

    Args:
        name: the pipeline's name in the ledger (the ledger's rule for names).
        sla: what the validator certifies.
        trainer_module: the TFX module file holding ``run_fn``, absolute or relative to ``base_dir``.
        preprocessing_module: the TFX module file holding ``preprocessing_fn``, or None for no DPTransform.
        models: the model families the trainer module understands, passed as ``custom_config["model"]``
            (``sage run --model``; the first is the default).
        defaults: SageIterator settings (``epsilon_start``, ``min_window``, ``rejection_share``, ...).
        trainer_config: more of the trainer's ``custom_config``.
        components: a function of the `StandardComponents` returning the components to run; None for all five.
        base_dir: the folder relative module paths start from; None for the pipeline file's (set by ``sage run``).
        source_file: the file that defines the pipeline (set by ``load_pipeline``): part of its digest.
        eval_share: the share of each window's records the validator's ACCEPT test reads (signed into every
            grant's record split, ``sage_tfx.privacy.eval_share_split``); None for the platform's 1 in 10.

    Raises:
        PipelineDefinitionError: a bad field; the message names it and the fix.
    """

    name: str
    sla: SLA
    trainer_module: str
    preprocessing_module: str | None = None
    models: tuple = ()
    defaults: dict = field(default_factory=dict)
    trainer_config: dict = field(default_factory=dict)
    components: Callable[[StandardComponents], list] | None = None
    base_dir: str | None = None
    source_file: str | None = None  # the file that defines it (set by ``load_pipeline``): part of its digest
    eval_share: float | None = None

    def __post_init__(self):
        from sage_tfx.privacy.checks import check_name  # the ledger's own rule for pipeline names

        try:
            check_name(self.name, "pipeline name")
        except ValueError as exc:
            raise PipelineDefinitionError(str(exc)) from None
        if not isinstance(self.sla, SLA):
            raise PipelineDefinitionError(f"sla {self.sla!r} must be an SLA(metric=..., label=..., loss_bound=...)")
        models = (self.models,) if isinstance(self.models, str) else tuple(self.models)
        if any(not isinstance(m, str) or not m for m in models):
            raise PipelineDefinitionError(f"models {self.models!r} must be names of model families (strings)")
        object.__setattr__(self, "models", models)
        unknown = sorted(set(self.defaults) - _iterator_settings())
        if unknown:
            raise PipelineDefinitionError(
                f"defaults name unknown iterator setting(s) {unknown}: use {', '.join(sorted(_iterator_settings()))}"
            )
        if self.eval_share is not None:
            eval_share_split(self.eval_share, error=PipelineDefinitionError)  # names a bad value before any spend
        if self.components is not None and not callable(self.components):
            raise PipelineDefinitionError(
                f"components {self.components!r} must be a function of the "
                "StandardComponents returning the list of components"
            )
        for role in ("trainer_module", "preprocessing_module"):
            value = getattr(self, role)
            if value is not None and (not isinstance(value, str) or not value):
                raise PipelineDefinitionError(f"{role} {value!r} must be the path of a module file")

    # ------------------------------------------------------------------ what sage run asks of a pipeline
    def iterator_defaults(self) -> dict:
        """The SageIterator settings of this pipeline: ``defaults`` and, when given, ``eval_share``."""
        return {**self.defaults, **({} if self.eval_share is None else {"eval_share": self.eval_share})}

    def record_split(self):
        """The ``RecordSplit`` its grants sign: ``eval_share``'s, else the platform's default."""
        return DEFAULT_RECORD_SPLIT if self.eval_share is None else eval_share_split(self.eval_share)

    def check_target(self, target: float) -> float:
        """The target as a float, checked against the SLA (`SLA.check_target`).

        Args:
            target: the SLA target.

        Returns:
            The target as a float.

        Raises:
            ValueError: a target that can never be met, or that every model meets.
        """
        return self.sla.check_target(target)

    def model_family(self, model: str | None = None) -> str | None:
        """The model family an iteration trains.

        Args:
            model: the family asked for (``sage run --model``), or None for the first of ``models``.

        Returns:
            The family, or None when the pipeline declares none and none is asked for.

        Raises:
            ValueError: a family the pipeline does not declare; names the known ones.
        """
        if model is None:
            return self.models[0] if self.models else None
        if model not in self.models:
            known = ", ".join(self.models) if self.models else "none: it declares no models"
            raise ValueError(f"model {model!r} is unknown for {self.name}: use one of {known}")
        return model

    def module_path(self, role: str) -> str | None:
        """The absolute path of a module file of the pipeline.

        Args:
            role: ``"trainer_module"``, ``"preprocessing_module"`` or ``"loss_module"`` (the SLA's).

        Returns:
            The absolute path (relative paths start at ``base_dir``, else the working directory), or None if the
            pipeline gives no such module.
        """
        path = self.sla.loss_module if role == "loss_module" else getattr(self, role)
        if path is None:
            return None
        if not os.path.isabs(path):
            path = os.path.join(self.base_dir or os.getcwd(), path)
        return os.path.abspath(path)

    def check_files(self) -> None:
        """Refuse (PipelineDefinitionError naming it) a module file that does not exist: before any spend."""
        for role in ("preprocessing_module", "trainer_module", "loss_module"):
            path = self.module_path(role)
            if path is not None and not os.path.isfile(path):
                raise PipelineDefinitionError(f"pipeline {self.name!r}: {role} {path!r} does not exist")

    def with_base_dir(self, base_dir: str) -> SagePipeline:
        """This pipeline with ``base_dir`` set, unless it already has one.

        Args:
            base_dir: the folder relative module paths start from.

        Returns:
            A copy with the absolute ``base_dir``, or this pipeline if it had one.
        """
        return self if self.base_dir is not None else replace(self, base_dir=os.path.abspath(base_dir))

    def with_source_file(self, path: str | None) -> SagePipeline:
        """This pipeline with ``source_file`` set, unless it already has one.

        Args:
            path: the file that defines the pipeline, or None.

        Returns:
            A copy with the absolute ``source_file``, or this pipeline if it had one or path is None.
        """
        if self.source_file is not None or path is None:
            return self
        return replace(self, source_file=os.path.abspath(path))

    def certificate_request(
        self, target: float, confidence: float, model: str | None = None, hparams: dict | None = None
    ) -> dict:
        """What an ACCEPT of this pipeline certifies, as the JSON the iterator signs into each grant.

        A later run of the same pipeline name must ask for the same certificate.

        Args:
            target: the SLA target.
            confidence: the confidence of the validator's test.
            model: the model family asked for, or None for the default (`model_family`).
            hparams: the trainer's hyperparameters of this run, or None.

        Returns:
            A dict of the target, the confidence, the SLA's fields, the model family and ``definition`` (the
            `definition_digest`).

        Raises:
            ValueError: an unknown model family.
        """
        sla = self.sla
        return {
            "target": float(target),
            "confidence": float(confidence),
            "metric": sla.metric,
            "label": sla.label,
            "loss_bound": sla.loss_bound,
            "label_threshold": sla.label_threshold,
            "label_signature": sla.label_signature,
            "loss_function": sla.loss_function,
            "model": self.model_family(model),
            "definition": self.definition_digest(hparams),
        }

    def definition_digest(self, hparams: dict | None = None) -> str:
        """SHA-256 (hex) of what defines the pipeline.

        Covers the pipeline file's and the module files' contents, the other ``.py`` files of the modules' folders
        (a module may import them: ``components.user_modules``) and the trainer's configuration.

        Args:
            hparams: the trainer's hyperparameters of this run, or None.

        Returns:
            The hex digest.
        """
        modules = {role: self.module_path(role) for role in ("trainer_module", "preprocessing_module", "loss_module")}
        files = {"pipeline_file": self.source_file, **modules}
        contents = {role: _file_digest(path) for role, path in files.items() if path is not None}
        folders = sorted({os.path.dirname(os.path.abspath(p)) for p in modules.values() if p is not None})
        beside = [[[os.path.basename(f), _file_digest(f)] for f in python_files(folder)] for folder in folders]
        config = json.dumps(
            {
                "files": contents,
                "trainer_config": self.trainer_config,
                "hparams": hparams or {},
                "models": list(self.models),
                "beside_modules": beside,
            },
            sort_keys=True,
            default=repr,
        )
        return hashlib.sha256(config.encode()).hexdigest()

    # ------------------------------------------------------------------ the TFX pipeline of one iteration
    def standard_components(self, config, grant, eta) -> StandardComponents:
        """BlockExampleGen -> DPTransform -> DPTrainer -> DPModelValidator -> Pusher under ``grant``.

        Args:
            config: the run's ``PipelineConfig``.
            grant: the iteration's grant.
            eta: the failure probability of the validation.

        Returns:
            The wired `StandardComponents` (``transform`` None without a preprocessing module).
        """
        from tfx.components.pusher.component import Pusher
        from tfx.proto import pusher_pb2

        from sage_tfx.components.block_example_gen import BlockExampleGen
        from sage_tfx.components.dp_model_validator import DPModelValidator
        from sage_tfx.components.dp_trainer import DPTrainer
        from sage_tfx.components.dp_transform import DPTransform

        grant_json = grant.to_json()
        gen = BlockExampleGen(
            ledger=config.ledger,
            data_root=config.data_root,
            stream=config.stream,
            grant=grant_json,
            staging_location=getattr(config, "staging_location", None),
        )
        transform = None
        trainer_inputs = {"examples": gen.outputs["examples"]}
        if self.preprocessing_module is not None:
            transform = DPTransform(
                examples=gen.outputs["examples"],
                module_file=self.module_path("preprocessing_module"),
                ledger=config.ledger,
                grant=grant_json,
                data_root=config.data_root,
                stream=config.stream,
            )
            trainer_inputs = {
                "examples": transform.outputs["transformed_examples"],
                "transform_graph": transform.outputs["transform_graph"],
            }
        custom_config = {**self.trainer_config, **config.hparams}
        model = self.model_family(config.model)
        if model is not None:
            custom_config = {"model": model, **custom_config}
        trainer = DPTrainer(
            **trainer_inputs,
            module_file=self.module_path("trainer_module"),
            ledger=config.ledger,
            grant=grant_json,
            custom_config=custom_config,
        )
        validator = DPModelValidator(
            model=trainer.outputs["model"],
            examples=gen.outputs["examples"],
            ledger=config.ledger,
            grant=grant_json,
            **self.validator_properties(config, grant, eta),
        )
        pusher = Pusher(
            model=trainer.outputs["model"],
            model_blessing=validator.outputs["blessing"],
            push_destination=pusher_pb2.PushDestination(
                filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=config.serving_dir)
            ),
        )
        return StandardComponents(gen, transform, trainer, validator, pusher)

    def validator_properties(self, config, grant, eta) -> dict:
        """DPModelValidator's test under ``grant``: its parameters but the ledger, grant and inputs.

        This pipeline's SLA at ``config.target`` and ``eta``, and the REJECT test on the train split when the
        grant's split pays for it. The launcher validates a confined run's model with the same
        (``pipelines.confined``).

        Args:
            config: the run's ``PipelineConfig``.
            grant: the iteration's grant.
            eta: the failure probability of the validation.

        Returns:
            The DPModelValidator keyword arguments.
        """
        from sage_tfx.privacy import grant_split

        split = grant_split(grant)
        return {
            "metric": self.sla.metric,
            "target": config.target,
            "label_key": self.sla.label,
            "loss_bound": None if self.sla.metric == Metric.ACCURACY.value else self.sla.loss_bound,
            "eta": eta,
            "train_split": "train" if split is not None and split.rejection > 0 else None,
            "label_threshold": self.sla.label_threshold,
            "loss_module": self.module_path("loss_module"),
            "loss_function": self.sla.loss_function,
            "label_signature": self.sla.label_signature,
        }

    def build_pipeline(self, config, grant, split, eta, iteration):
        """The TFX Pipeline of one iteration under ``grant``.

        Cached by its inputs, so a resumed iteration reuses what finished before a kill, with the noise it drew.

        Args:
            config: the run's ``PipelineConfig``.
            grant: the iteration's grant.
            split: the iteration's budget split (the grant carries it; unused here).
            eta: the failure probability of the validation.
            iteration: the iteration's index (unused here).

        Returns:
            The ``tfx.orchestration.pipeline.Pipeline``.

        Raises:
            PipelineDefinitionError: the ``components`` function returned no component.
        """
        from tfx.orchestration import pipeline as tfx_pipeline

        from sage_tfx.pipelines._runner import metadata_config

        standard = self.standard_components(config, grant, eta)
        components = standard.as_list() if self.components is None else list(self.components(standard))
        if not components:
            raise PipelineDefinitionError(f"pipeline {self.name!r}: its components function returned no component")
        return tfx_pipeline.Pipeline(
            pipeline_name=config.name,
            pipeline_root=config.pipeline_root,
            components=components,
            enable_cache=True,
            metadata_connection_config=metadata_config(config.metadata_path),
            beam_pipeline_args=list(config.beam_pipeline_args),
        )
