"""DPTransform: tf.Transform under a grant, with Sage's DP analyzers (paper List. 1).

It runs the user's ``preprocessing_fn`` on the Examples read under the grant and writes what TFX's Transform
writes (``transform_graph``, ``transformed_examples``). Before a record is read, the executor refuses a function
that uses a non-DP analyzer or spends more than the grant's preprocessing share; the analysis is then one DP
release whose noise the ledger seeds per grant, so a re-run reproduces it at no extra cost.

Parameters, checks, outputs and lineage: docs/dp_preprocessing.md, "The DPTransform component".
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
