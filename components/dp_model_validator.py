"""DPModelValidator: Sage's SLAed validation of a model as a TFX component (paper §3.3).

It tests a trained model against the SLA (``metric``, ``target``) on the eval split read under the grant, and
writes a standard ModelBlessing, blessed ONLY on ACCEPT (what TFX's Pusher reads), beside a SageValidationResult.
Its release is epsilon-DP on the test records, within the validation share the ledger charged to the grant, with
noise seeded by the ledger per grant: a re-run of the same validation releases the same outcome at no cost, and
another model or test under the same grant is refused before any noise is drawn.

Parameters, outputs and the privacy argument: docs/validation.md, "The DPModelValidator component"; how labels
and predictions are read: docs/your_pipeline.md, "The raw-label rule".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import artifact, channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components._spec import GRANT_PARAMETERS, grant_parameters
from sage_tfx.components.dp_model_validator_executor import Executor

if TYPE_CHECKING:
    from tfx.orchestration.data_types import RuntimeParameter
    from tfx.types.channel import BaseChannel

    from sage_tfx.privacy import Grant


class SageValidationResult(artifact.Artifact):
    """A directory holding ``result.json``: one SLAed validation (outcome, bounds, epsilon, eta)."""

    TYPE_NAME = "SageValidationResult"


class DPModelValidatorSpec(ComponentSpec):
    PARAMETERS = {
        **GRANT_PARAMETERS,
        "metric": ExecutionParameter(type=str),
        "target": ExecutionParameter(type=float),
        "label_key": ExecutionParameter(type=str),
        "loss_bound": ExecutionParameter(type=float, optional=True),
        "confidence": ExecutionParameter(type=float, optional=True),
        "eta": ExecutionParameter(type=float, optional=True),
        "attempt": ExecutionParameter(type=int, optional=True),
        "epsilon": ExecutionParameter(type=float, optional=True),
        "eval_split": ExecutionParameter(type=str, optional=True),
        "train_split": ExecutionParameter(type=str, optional=True),
        "prediction_key": ExecutionParameter(type=str, optional=True),
        "label_threshold": ExecutionParameter(type=float, optional=True),
        "label_signature": ExecutionParameter(type=str, optional=True),
        "loss_module": ExecutionParameter(type=str, optional=True),
        "loss_function": ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {
        "model": ChannelParameter(type=standard_artifacts.Model),
        "examples": ChannelParameter(type=standard_artifacts.Examples),
    }
    OUTPUTS = {
        "blessing": ChannelParameter(type=standard_artifacts.ModelBlessing),
        "validation_result": ChannelParameter(type=SageValidationResult),
    }


def _maybe(convert, value):
    """Convert plain values; leave None and RuntimeParameters (resolved at run time) alone."""
    if value is None or not isinstance(value, (int, float, str)):
        return value
    return convert(value)


class DPModelValidator(base_component.BaseComponent):
    """Blesses a model only when Sage's SLAed validation ACCEPTs it; see the module docstring."""

    SPEC_CLASS = DPModelValidatorSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(Executor)

    def __init__(
        self,
        model: BaseChannel,
        examples: BaseChannel,
        ledger: str,
        metric: str,
        target: float | RuntimeParameter,
        label_key: str,
        grant: Grant | str | RuntimeParameter | None = None,
        loss_bound: float | RuntimeParameter | None = None,
        confidence: float | RuntimeParameter | None = None,
        eta: float | RuntimeParameter | None = None,
        attempt: int | RuntimeParameter | None = None,
        epsilon: float | RuntimeParameter | None = None,
        eval_split: str = "eval",
        train_split: str | None = None,
        prediction_key: str | None = None,
        label_threshold: float | RuntimeParameter | None = None,
        loss_module: str | None = None,
        loss_function: str | None = None,
        label_signature: str | None = None,
    ) -> None:
        """Construct a DPModelValidator component.

        Args:
          model: A Channel of type ``standard_artifacts.Model`` (e.g. ``trainer.outputs["model"]``).
          examples: A Channel of type ``standard_artifacts.Examples`` read under ``grant``
            (e.g. ``gen.outputs["examples"]``).
          ledger: The ledger's location (a file path or a ``postgresql://`` URL, without a password).
          metric: What is validated: a ``Metric`` ("accuracy", "mse", "mae", "log_loss", "custom", ...).
          target: The SLA's target (an accuracy to reach, or a loss to stay under).
          label_key: The label's feature name in the examples.
          grant: A ``Grant``, its JSON, or a RuntimeParameter of type str.
          loss_bound: B, the largest loss one record may contribute (losses are clipped to [0, B]).
          confidence: 1 - eta of the SLA (used when ``eta`` is not given).
          eta: The failure probability of this validation (default: from ``confidence`` and ``attempt``).
          attempt: The attempt number i >= 1: eta is shared as eta / (i (i + 1)) over repeated validations.
          epsilon: Spend at most this of the grant's validation share.
          eval_split: The split validated on (the test side of the grant's record split).
          train_split: The training split, for the REJECT test (None: no REJECT test).
          prediction_key: The serving signature's output to read (None: its only or default output).
          label_threshold: Binarise the labels at this value (accuracy of a score).
          loss_module: A Python file defining ``loss_function`` (metric "custom").
          loss_function: The per-example loss's name in ``loss_module``.
          label_signature: A serving signature that computes the labels from the records.

        Raises:
          LedgerError: ``ledger`` holds a password (``check_location``).
        """
        super().__init__(
            spec=DPModelValidatorSpec(
                **grant_parameters(grant, ledger),
                metric=metric,
                target=_maybe(float, target),
                label_key=label_key,
                loss_bound=_maybe(float, loss_bound),
                confidence=_maybe(float, confidence),
                eta=_maybe(float, eta),
                attempt=_maybe(int, attempt),
                epsilon=_maybe(float, epsilon),
                eval_split=eval_split,
                train_split=train_split,
                prediction_key=prediction_key,
                label_threshold=_maybe(float, label_threshold),
                loss_module=loss_module,
                loss_function=loss_function,
                label_signature=label_signature,
                model=model,
                examples=examples,
                blessing=channel.Channel(type=standard_artifacts.ModelBlessing),
                validation_result=channel.Channel(type=SageValidationResult),
            )
        )
