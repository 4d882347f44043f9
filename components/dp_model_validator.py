"""DPModelValidator: Sage's SLAed validation of a model as a TFX component (paper §3.3).

Inputs: ``model`` (a Model artifact whose serving SavedModel has a ``serving_default`` signature: serialized
tf.Examples as ``examples``, or features by name, as ``sage_tfx.models.export`` writes them) and
``examples`` (an Examples artifact read under the same grant, e.g. by BlockExampleGen; its eval split is the
test set). Execution parameters: the ``grant`` (JSON, or a RuntimeParameter of type str) and the ``ledger``
location; ``metric`` (mse, mae, log_loss, accuracy, custom), ``target``, ``label_key``, ``loss_bound`` B for a loss
(losses are clipped to [0, B]; log_loss defaults to ln(1e7), its maximum with probabilities kept in
[1e-7, 1 - 1e-7]); ``confidence`` (default 0.95) or an explicit ``eta``; ``attempt`` i (eta_i =
eta/(i(i+1)) for repeated validation); ``epsilon`` (default: the grant's validation share; more is refused).

Outputs: ``blessing``, a standard ModelBlessing, blessed ONLY on ACCEPT (BLESSED / NOT_BLESSED file,
``blessed`` = 1 / 0, ``current_model``, ``current_model_id``: what TFX's Pusher reads), and
``validation_result``, a SageValidationResult whose ``result.json`` holds the outcome, the bounds, the
epsilon spent, eta and the confidence (custom properties ``outcome``, ``bound``, ``grant_id``, ``result``).

Privacy: the validator's release is epsilon-DP on the eval records (the clipped loss sum and its complement
B - loss summed, Lap(B/eps) each: the error and correct counts for accuracy; see sage_tfx.validation.noisy),
within the validation share the ledger charged to the grant.
Its noise comes from the ledger's private seed for (grant, "validation"), handed out only after the
executor opened the validation release with the ledger (``Ledger.release``) for this computation: the
digest of the model's SavedModel and every test parameter. Re-running the same validation under the same
grant releases the same values and the same outcome, at no further cost; validating another model, or
with another B or target, under the same grant is refused before any noise is drawn (it would be a
second release the grant did not pay for).

``label_threshold`` (optional) derives a binary label: 1 where the raw label exceeds it, else 0 (e.g. "delayed"
= arr_delay > 15). ``label_signature`` (optional) takes the label from a signature of the model instead, as
TFMA's ``preprocessing_function_names``: e.g. ``"transform_features"`` with ``label_key="tips_xf"`` reads the
transformed label TFX's taxi example computes (tips > 0.2 * fare) from each raw record. Metric ``custom`` takes the
user's bounded per-example loss: ``loss_module`` (a Python file)
defining ``loss_function`` (default ``per_example_loss``) of (labels, signature outputs) -> one loss per
record, clipped to [0, ``loss_bound``] (a public B: the validator's sensitivity); the file's digest is part of
the validation's fingerprint.

``train_split`` (optional; the ready pipelines pass "train") adds the REJECT test on that split's records.
It is the split's ``rejection`` stage (``sage_tfx.privacy.BudgetSplit``): with a per-record train/test
split the ledger charged each block pre + count + max(train + reject, val), so the training records pay
for training and the REJECT test, the test records for the ACCEPT test. It is refused under a
single-stage grant or a split without a rejection stage. Under that parallel rule ``eval_split`` must be on
the test side and ``train_split`` on the training side of the grant's signed record split (refused otherwise,
before any read).
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
