"""DPTransform: tf.Transform under a grant, with Sage's DP analyzers (paper List. 1).

Input: ``examples`` (an Examples artifact read under the grant, e.g. BlockExampleGen's: train/eval splits
of gzipped tf.Example TFRecords). Execution parameters:

- ``grant`` (JSON, or a RuntimeParameter of type str) and ``ledger`` (location);
- the user's ``preprocessing_fn(inputs, custom_config)``: ``module_file`` (a path; ``preprocessing_fn`` may
  then name the function), ``module_path`` (an importable module), or ``preprocessing_fn`` alone (a dotted
  path). The one-argument TFX form ``preprocessing_fn(inputs)`` is accepted too; what it spends is traced
  and checked like any other;
- ``custom_config`` (JSON object) for the function; DPTransform adds the budget under
  ``custom_config["sage"]["preprocessing_epsilon"]`` (read it with ``PreprocessingBudget.from_custom_config``);
- the raw schema: ``schema`` ({feature: "int" | "float" | "bytes"} as JSON) or ``data_root`` (+ ``stream``,
  default the grant's) to read the stream's ``_stream.json``. Every raw feature parses as a
  ``tf.io.VarLenFeature`` (a SparseTensor), as TFX parses features of optional presence; densify with
  ``sage_tfx.components.transform_utils.fill_in_missing(x, public_default)``;
- ``splits_config`` ({"analyze": [...], "transform": [...]}, as TFX's SplitsConfig; default: analyze
  train, transform every split).

Before it reads a record, the executor verifies the grant, checks the Examples were read under it, traces
the function on placeholders and refuses it if it uses a non-DP tf.Transform analyzer or spends more than
the grant's preprocessing share (``meta["split"]["preprocessing"]``; the whole grant if it has no split, and
then no other stage may spend it), then opens the preprocessing release with the ledger for the traced graph:
a different preprocessing_fn under the same grant is refused before any noise is drawn.

Outputs, in TFX Transform's layout: ``transform_graph`` (TransformGraph: ``transform_fn/``,
``transformed_metadata/``, ``metadata/``; read it with ``tft.TFTransformOutput(uri)``) and
``transformed_examples`` (Examples: ``Split-<name>/transformed_examples-*.gz``, ``split_names`` set).
Both carry MLMD custom properties ``grant_id``, ``release_computation`` (the release's fingerprint, part of
DPTrainer's), ``preprocessing_epsilon`` (the epsilon spent) and
``privacy_spent`` (exact JSON: epsilon, share, per-analyzer spends, analyze splits); the transformed
examples also keep the input's lineage (``stream``, ``block_ids``, ``charge``, ``split_rule``,
``dp_record_count``...).

Privacy: see ``dp_transform_executor``: the analysis over the analyze splits is one (epsilon_spent, 0)-DP
release, its noise seeded from the ledger per grant, so re-runs reproduce it at no extra cost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components._spec import GRANT_PARAMETERS, grant_parameters
from sage_tfx.components.dp_transform_executor import Executor

if TYPE_CHECKING:
    from tfx.orchestration.data_types import RuntimeParameter
    from tfx.proto import transform_pb2
    from tfx.types.channel import BaseChannel

    from sage_tfx.privacy import Grant


class DPTransformSpec(ComponentSpec):
    PARAMETERS = {
        **GRANT_PARAMETERS,
        "module_file": ExecutionParameter(type=str, optional=True),
        "module_path": ExecutionParameter(type=str, optional=True),
        "preprocessing_fn": ExecutionParameter(type=str, optional=True),
        "custom_config": ExecutionParameter(type=str, optional=True),
        "schema": ExecutionParameter(type=str, optional=True),
        "data_root": ExecutionParameter(type=str, optional=True),
        "stream": ExecutionParameter(type=str, optional=True),
        "splits_config": ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {"examples": ChannelParameter(type=standard_artifacts.Examples)}
    OUTPUTS = {
        "transform_graph": ChannelParameter(type=standard_artifacts.TransformGraph),
        "transformed_examples": ChannelParameter(type=standard_artifacts.Examples),
    }


def _json_param(name, value):
    """dicts (and protos, e.g. TFX's SplitsConfig) become JSON; strings, None and RuntimeParameters pass."""
    if hasattr(value, "ListFields"):
        from google.protobuf import json_format

        value = json_format.MessageToDict(value)
    if not isinstance(value, dict):
        return value
    try:
        return json.dumps(value, sort_keys=True)
    except TypeError as exc:
        raise ValueError(f"DPTransform {name}={value!r} is not JSON-serializable: {exc}") from None


class DPTransform(base_beam_component.BaseBeamComponent):
    """tf.Transform with Sage's DP analyzers under a grant; outputs as TFX's Transform. See the module docstring."""

    SPEC_CLASS = DPTransformSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(
        self,
        examples: BaseChannel,
        ledger: str,
        grant: Grant | str | RuntimeParameter | None = None,
        module_file: str | None = None,
        module_path: str | None = None,
        preprocessing_fn: str | None = None,
        custom_config: dict[str, Any] | None = None,
        schema: Mapping[str, str] | None = None,
        data_root: str | None = None,
        stream: str | None = None,
        splits_config: Mapping[str, Any] | transform_pb2.SplitsConfig | None = None,
    ) -> None:
        """Construct a DPTransform component.

        Args:
          examples: A Channel of type ``standard_artifacts.Examples`` read under ``grant``
            (e.g. ``gen.outputs["examples"]``).
          ledger: The ledger's location (a file path or a ``postgresql://`` URL, without a password).
          grant: A ``Grant``, its JSON, or a RuntimeParameter of type str.
          module_file: A Python file defining the preprocessing function (named ``preprocessing_fn``, or by
            the ``preprocessing_fn`` argument).
          module_path: A module path (``pkg.module``) defining ``preprocessing_fn``.
          preprocessing_fn: The function's dotted path, or its name in ``module_file``.
          custom_config: A JSON-serializable dict handed to the preprocessing function.
          schema: {feature: kind} of the raw records; give it or ``data_root``.
          data_root: The stream's data folder, whose stored schema is used; give it or ``schema``.
          stream: The stream whose schema ``data_root`` holds (default: the grant's).
          splits_config: A dict or TFX's ``transform_pb2.SplitsConfig``: the splits analyzed and transformed.

        Raises:
          ValueError: Both or neither of ``module_file`` and ``module_path`` (with no ``preprocessing_fn``) are
            given, or not exactly one of ``schema`` and ``data_root``.
          LedgerError: ``ledger`` holds a password (``check_location``).
        """
        if module_file is not None and module_path is not None:
            raise ValueError("give module_file or module_path, not both")
        if module_file is None and module_path is None and preprocessing_fn is None:
            raise ValueError("give module_file, module_path or preprocessing_fn")
        if (schema is None) == (data_root is None):
            raise ValueError("give exactly one of schema ({feature: kind}) or data_root (+ stream)")
        super().__init__(
            spec=DPTransformSpec(
                **grant_parameters(grant, ledger),
                module_file=None if module_file is None else str(module_file),
                module_path=module_path,
                preprocessing_fn=preprocessing_fn,
                custom_config=_json_param("custom_config", custom_config),
                schema=_json_param("schema", schema),
                data_root=None if data_root is None else str(data_root),
                stream=stream,
                splits_config=_json_param("splits_config", splits_config),
                examples=examples,
                transform_graph=channel.Channel(type=standard_artifacts.TransformGraph),
                transformed_examples=channel.Channel(type=standard_artifacts.Examples),
            )
        )
