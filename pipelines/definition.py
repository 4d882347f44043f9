"""Your own privacy-adaptive pipeline: its SLA, its module files, its model families and its components.

A pipeline file (any name) defines one ``SagePipeline``::

    from sage_tfx.pipelines import SLA, SagePipeline

    PIPELINE = SagePipeline(
        name="taxi_fare",
        sla=SLA(metric="mse", label="fare", loss_bound=30.0 ** 2),  # squared errors clipped at $30^2
        preprocessing_module="preprocessing.py",  # preprocessing_fn(inputs, custom_config), beside this file
        trainer_module="trainer.py",              # run_fn(fn_args), beside this file
        models=("linear", "dnn"),                 # --model picks one; the first is the default
        defaults={"epsilon_start": 0.5, "min_window": 128},
    )

and ``sage run path/to/pipeline.py --db ... --stream ... --data-root ... --target 120`` drives it to
ACCEPT, REJECT or TIMEOUT exactly as it drives the built-in pipelines (which are defined with this same
API: ``sage_tfx.pipelines.taxi_regression``). ``sage run`` also takes a dotted module path.

Each iteration is one TFX pipeline, by default (paper List. 1)::

    BlockExampleGen -> DPTransform -> DPTrainer -> DPModelValidator -> Pusher

built by ``SagePipeline.standard_components``. To add or replace components, give ``components``: a
function of the ``StandardComponents`` returning the list to run, e.g.
``components=lambda c: [c.example_gen, c.trainer, c.validator, c.pusher]`` (no preprocessing: give no
``preprocessing_module`` then) or a list with your own Pusher. Every data-reading Sage component gets the
iteration's grant and checks it before it reads (docs/block_composition.md, "What a grant pays for").
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
    """What the validator certifies: ``metric`` of the model on ``label`` (a raw column of the stream), with
    per-example losses clipped to ``[0, loss_bound]`` (a PUBLIC bound: the validator's noise and
    concentration terms scale with it; docs/validation.md). Accuracy has no bound; log_loss defaults to
    ln(1e7), its largest value with probabilities kept in [1e-7, 1 - 1e-7]. ``label_threshold`` derives a
    binary label (1 where the raw label exceeds it, e.g. arr_delay > 15). Metric ``custom``: your own
    per-example loss, ``loss_function`` (default ``per_example_loss``) of (labels, signature outputs) in the
    Python file ``loss_module`` (relative to the pipeline file), clipped to [0, loss_bound].
    ``label_signature``: read ``label`` from that signature of the trained model instead of the raw record,
    as TFMA's ``preprocessing_function_names`` (e.g. ``label="tips_xf", label_signature="transform_features"``:
    the label your preprocessing_fn derives, such as TFX's taxi "big tipper" tips > 0.2 * fare)."""

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
            raise PipelineDefinitionError(f"SLA metric {self.metric!r} is unknown: use one of "
                                          f"{', '.join(m.value for m in Metric)}") from None
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
                raise PipelineDefinitionError(f"SLA metric {metric.value!r} needs loss_bound: a public bound B on "
                                              "each example's loss (losses are clipped to [0, B])")
            bound = positive(bound, "SLA loss_bound", error=PipelineDefinitionError, allow_bool=True,
                             message="{what} {value!r} must be {rule}", not_number="{what} {value!r} is not a number")
        object.__setattr__(self, "loss_bound", bound)
        if self.label_threshold is not None:
            threshold = number(self.label_threshold, "SLA label_threshold", error=PipelineDefinitionError,
                               allow_bool=True, message="{what} {value!r} must be a finite number")
            object.__setattr__(self, "label_threshold", threshold)
        if self.label_signature is not None and (not isinstance(self.label_signature, str)
                                                 or not self.label_signature.strip()):
            raise PipelineDefinitionError(f"SLA label_signature {self.label_signature!r} must name a signature of "
                                          "the trained model, e.g. 'transform_features'")
        if (metric is Metric.CUSTOM) != (self.loss_module is not None):
            raise PipelineDefinitionError(f"SLA loss_module {self.loss_module!r}: metric 'custom' needs one (the "
                                          "Python file of your per-example loss), the other metrics take none")

    def check_target(self, target: float) -> float:
        """The target as a float; ValueError naming it when it can never be met, or is always met."""
        metric = Metric(self.metric)
        what, not_number = f"{metric.value} target", "{what} {value!r} is not a number"
        if metric is Metric.ACCURACY:
            return number(target, what, error=ValueError, low=0.0, high=1.0, low_open=True, high_open=True,
                          allow_bool=True, not_number=not_number,
                          message="{what} {value!r} can never be met meaningfully: it must lie {rule}")
        value = positive(target, what, error=ValueError, allow_bool=True, not_number=not_number,
                         message="{what} {value!r} can never be met: it must be a positive number")
        if value >= self.loss_bound:
            raise ValueError(f"{metric.value} target {value!r} is at least the loss bound {self.loss_bound:g}: "
                             "every model meets it, so there is nothing to validate")
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
    """The five components of an iteration, wired together (``SagePipeline.standard_components``)."""

    example_gen: object
    transform: object | None
    trainer: object
    validator: object
    pusher: object

    def as_list(self) -> list:
        return [c for c in (self.example_gen, self.transform, self.trainer, self.validator, self.pusher)
                if c is not None]


def _iterator_settings() -> set:
    from sage_tfx.adaptive import IteratorSettings

    return set(IteratorSettings.names() - {"eta", "max_iterations", "max_seconds", "eval_share"})


@dataclass(frozen=True)
class SagePipeline:
    """A privacy-adaptive pipeline, as a user defines it in a pipeline file (see the module docstring).

    ``preprocessing_module`` / ``trainer_module``: TFX module files (``preprocessing_fn`` / ``run_fn``),
    absolute or relative to ``base_dir`` (default: the directory of the file that defines the pipeline,
    set when ``sage run`` loads it). ``models``: the model families the trainer module understands, passed
    to it as ``custom_config["model"]`` (``sage run --model``; the first is the default). ``defaults``:
    SageIterator settings (``epsilon_start``, ``min_window``, ``rejection_share``, ...). ``trainer_config``:
    more of the trainer's ``custom_config``. ``components``: a function of the ``StandardComponents``
    returning the components to run (default: all five). ``eval_share``: the share of each window's records
    the validator's ACCEPT test reads (the test side of the record split signed into every grant,
    ``sage_tfx.privacy.eval_share_split``; default None: the platform's 1 in 10); the rest is training's.
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
            raise PipelineDefinitionError(f"defaults name unknown iterator setting(s) {unknown}: use "
                                          f"{', '.join(sorted(_iterator_settings()))}")
        if self.eval_share is not None:
            eval_share_split(self.eval_share, error=PipelineDefinitionError)  # names a bad value before any spend
        if self.components is not None and not callable(self.components):
            raise PipelineDefinitionError(f"components {self.components!r} must be a function of the "
                                          "StandardComponents returning the list of components")
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
        return self.sla.check_target(target)

    def model_family(self, model: str | None = None) -> str | None:
        """``model`` (``sage run --model``) or the first of ``models``; ValueError naming an unknown one."""
        if model is None:
            return self.models[0] if self.models else None
        if model not in self.models:
            known = ", ".join(self.models) if self.models else "none: it declares no models"
            raise ValueError(f"model {model!r} is unknown for {self.name}: use one of {known}")
        return model

    def module_path(self, role: str) -> str | None:
        """The absolute path of the ``trainer_module``, ``preprocessing_module`` or the SLA's ``loss_module``
        (None if not given)."""
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
        return self if self.base_dir is not None else replace(self, base_dir=os.path.abspath(base_dir))

    def with_source_file(self, path: str | None) -> SagePipeline:
        if self.source_file is not None or path is None:
            return self
        return replace(self, source_file=os.path.abspath(path))

    def certificate_request(self, target: float, confidence: float, model: str | None = None,
                            hparams: dict | None = None) -> dict:
        """What an ACCEPT of this pipeline certifies, as the JSON the iterator signs into each grant and compares
        with a later run of the same pipeline name: the target and confidence, the SLA (metric, label, loss bound,
        label threshold and signature, loss function), the model family, and ``definition``, a SHA-256 over the
        files that define the pipeline (its pipeline file, trainer, preprocessing and loss modules) and the
        trainer's configuration."""
        sla = self.sla
        return {"target": float(target), "confidence": float(confidence), "metric": sla.metric, "label": sla.label,
                "loss_bound": sla.loss_bound, "label_threshold": sla.label_threshold,
                "label_signature": sla.label_signature, "loss_function": sla.loss_function,
                "model": self.model_family(model), "definition": self.definition_digest(hparams)}

    def definition_digest(self, hparams: dict | None = None) -> str:
        """SHA-256 (hex) of the pipeline file's, the module files' contents, the other ``.py`` files of the
        modules' folders (a module may import them: ``components.user_modules``) and the trainer's
        configuration."""
        modules = {role: self.module_path(role) for role in ("trainer_module", "preprocessing_module", "loss_module")}
        files = {"pipeline_file": self.source_file, **modules}
        contents = {role: _file_digest(path) for role, path in files.items() if path is not None}
        folders = sorted({os.path.dirname(os.path.abspath(p)) for p in modules.values() if p is not None})
        beside = [[[os.path.basename(f), _file_digest(f)] for f in python_files(folder)] for folder in folders]
        config = json.dumps({"files": contents, "trainer_config": self.trainer_config, "hparams": hparams or {},
                             "models": list(self.models), "beside_modules": beside}, sort_keys=True, default=repr)
        return hashlib.sha256(config.encode()).hexdigest()

    # ------------------------------------------------------------------ the TFX pipeline of one iteration
    def standard_components(self, config, grant, eta) -> StandardComponents:
        """BlockExampleGen -> DPTransform -> DPTrainer -> DPModelValidator -> Pusher under ``grant``."""
        from tfx.components.pusher.component import Pusher
        from tfx.proto import pusher_pb2

        from sage_tfx.components.block_example_gen import BlockExampleGen
        from sage_tfx.components.dp_model_validator import DPModelValidator
        from sage_tfx.components.dp_trainer import DPTrainer
        from sage_tfx.components.dp_transform import DPTransform

        grant_json = grant.to_json()
        gen = BlockExampleGen(ledger=config.ledger, data_root=config.data_root, stream=config.stream,
                              grant=grant_json, staging_location=getattr(config, "staging_location", None))
        transform = None
        trainer_inputs = {"examples": gen.outputs["examples"]}
        if self.preprocessing_module is not None:
            transform = DPTransform(examples=gen.outputs["examples"], module_file=self.module_path(
                "preprocessing_module"), ledger=config.ledger, grant=grant_json, data_root=config.data_root,
                stream=config.stream)
            trainer_inputs = {"examples": transform.outputs["transformed_examples"],
                              "transform_graph": transform.outputs["transform_graph"]}
        custom_config = {**self.trainer_config, **config.hparams}
        model = self.model_family(config.model)
        if model is not None:
            custom_config = {"model": model, **custom_config}
        trainer = DPTrainer(**trainer_inputs, module_file=self.module_path("trainer_module"), ledger=config.ledger,
                            grant=grant_json, custom_config=custom_config)
        validator = DPModelValidator(model=trainer.outputs["model"], examples=gen.outputs["examples"],
                                     ledger=config.ledger, grant=grant_json,
                                     **self.validator_properties(config, grant, eta))
        pusher = Pusher(model=trainer.outputs["model"], model_blessing=validator.outputs["blessing"],
                        push_destination=pusher_pb2.PushDestination(
                            filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=config.serving_dir)))
        return StandardComponents(gen, transform, trainer, validator, pusher)

    def validator_properties(self, config, grant, eta) -> dict:
        """DPModelValidator's test under ``grant`` (its parameters but the ledger, grant and inputs): this
        pipeline's SLA at ``config.target`` and ``eta``; the REJECT test on the train split when the grant pays for
        it (its split's rejection stage). The launcher validates a confined run's model with the same
        (``pipelines.confined``)."""
        from sage_tfx.privacy import grant_split

        split = grant_split(grant)
        return {"metric": self.sla.metric, "target": config.target, "label_key": self.sla.label,
                "loss_bound": None if self.sla.metric == Metric.ACCURACY.value else self.sla.loss_bound, "eta": eta,
                "train_split": "train" if split is not None and split.rejection > 0 else None,
                "label_threshold": self.sla.label_threshold, "loss_module": self.module_path("loss_module"),
                "loss_function": self.sla.loss_function, "label_signature": self.sla.label_signature}

    def build_pipeline(self, config, grant, split, eta, iteration):
        """The TFX Pipeline of one iteration under ``grant`` (cached by its inputs, so a resumed iteration reuses
        what finished before a kill, with the noise it drew)."""
        from tfx.orchestration import pipeline as tfx_pipeline

        from sage_tfx.pipelines._runner import metadata_config

        standard = self.standard_components(config, grant, eta)
        components = standard.as_list() if self.components is None else list(self.components(standard))
        if not components:
            raise PipelineDefinitionError(f"pipeline {self.name!r}: its components function returned no component")
        return tfx_pipeline.Pipeline(
            pipeline_name=config.name, pipeline_root=config.pipeline_root, components=components,
            enable_cache=True, metadata_connection_config=metadata_config(config.metadata_path),
            beam_pipeline_args=list(config.beam_pipeline_args))
