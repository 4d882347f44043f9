"""DPTrainer: TFX's Trainer convention (a module file's ``run_fn(fn_args)``) under a grant's training share.

It trains on the Examples read under the grant (BlockExampleGen's or DPTransform's) and writes a standard Model
and a ModelRun. The executor refuses, before reading any data, a grant that is not genuine, Examples not of its
records and a budget above the training share; after ``run_fn`` it re-accounts the spend the module reported and
deletes a model outside the asked budget (``dp_trainer_executor``).

``fn_args``, parameters and outputs: docs/your_pipeline.md, "Inside `run_fn`: `fn_args` and `trainer_utils`".
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import trainer_pb2
from tfx.types import channel, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components._spec import GRANT_PARAMETERS, grant_parameters
from sage_tfx.components.dp_trainer_executor import Executor

if TYPE_CHECKING:
    from tfx.orchestration.data_types import RuntimeParameter
    from tfx.types.channel import BaseChannel

    from sage_tfx.privacy import Grant


class DPTrainerSpec(ComponentSpec):
    PARAMETERS = {
        **GRANT_PARAMETERS,
        "module_file": ExecutionParameter(type=str, optional=True),
        "module_path": ExecutionParameter(type=str, optional=True),
        "run_fn": ExecutionParameter(type=str, optional=True),
        "train_args": ExecutionParameter(type=trainer_pb2.TrainArgs, optional=True),
        "eval_args": ExecutionParameter(type=trainer_pb2.EvalArgs, optional=True),
        "custom_config": ExecutionParameter(type=str, optional=True),
        "epsilon": ExecutionParameter(type=float, optional=True),
        "delta": ExecutionParameter(type=float, optional=True),
        "public_num_examples": ExecutionParameter(type=int, optional=True),
    }
    INPUTS = {
        "examples": ChannelParameter(type=standard_artifacts.Examples),
        "transform_graph": ChannelParameter(type=standard_artifacts.TransformGraph, optional=True),
        "schema": ChannelParameter(type=standard_artifacts.Schema, optional=True),
    }
    OUTPUTS = {
        "model": ChannelParameter(type=standard_artifacts.Model),
        "model_run": ChannelParameter(type=standard_artifacts.ModelRun),
    }


class DPTrainer(base_component.BaseComponent):
    """Trains a DP model with a module file's ``run_fn(fn_args)`` within the grant's training share."""

    SPEC_CLASS = DPTrainerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(Executor)

    def __init__(
        self,
        examples: BaseChannel,
        ledger: str,
        grant: Grant | str | RuntimeParameter | None = None,
        module_file: str | None = None,
        module_path: str | None = None,
        run_fn: str | None = None,
        transform_graph: BaseChannel | None = None,
        schema: BaseChannel | None = None,
        train_args: trainer_pb2.TrainArgs | None = None,
        eval_args: trainer_pb2.EvalArgs | None = None,
        custom_config: dict[str, Any] | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        public_num_examples: int | None = None,
    ) -> None:
        """Construct a DPTrainer component.

        Args:
          examples: A Channel of type ``standard_artifacts.Examples`` read under ``grant`` (BlockExampleGen's
            ``examples``, or DPTransform's ``transformed_examples``).
          ledger: The ledger's location (a file path or a ``postgresql://`` URL, without a password).
          grant: A ``Grant``, its JSON, or a RuntimeParameter of type str.
          module_file: A Python file defining ``run_fn(fn_args)``, as TFX's Trainer.
          module_path: A module path (``pkg.module``) defining ``run_fn``, as TFX's Trainer.
          run_fn: The dotted path of the training function, as TFX's Trainer.
          transform_graph: An optional Channel of type ``standard_artifacts.TransformGraph`` (DPTransform's).
          schema: An optional Channel of type ``standard_artifacts.Schema``.
          train_args: ``trainer_pb2.TrainArgs``; its splits are the training splits (default: train).
          eval_args: ``trainer_pb2.EvalArgs`` (default: eval).
          custom_config: A JSON-serializable dict handed to ``run_fn`` as ``fn_args.custom_config``.
          epsilon: Spend at most this of the grant's training share (more is refused before any read).
          delta: As ``epsilon``, for delta.
          public_num_examples: A public training-set size, used only when the grant released no DP record count.

        Raises:
          ValueError: Not exactly one of ``module_file``, ``module_path`` or ``run_fn`` is given, or
            ``custom_config`` is not a dict.
          LedgerError: ``ledger`` holds a password (``check_location``).
        """
        if sum(x is not None for x in (module_file, module_path, run_fn)) != 1:
            raise ValueError("give exactly one of module_file, module_path or run_fn")
        if custom_config is not None and not isinstance(custom_config, dict):
            raise ValueError(f"custom_config must be a dict, got {type(custom_config).__name__}")
        super().__init__(
            spec=DPTrainerSpec(
                **grant_parameters(grant, ledger),
                module_file=None if module_file is None else str(module_file),
                module_path=module_path,
                run_fn=run_fn,
                train_args=train_args or trainer_pb2.TrainArgs(),
                eval_args=eval_args or trainer_pb2.EvalArgs(),
                custom_config=json.dumps(custom_config) if custom_config is not None else None,
                epsilon=epsilon,
                delta=delta,
                public_num_examples=public_num_examples,
                examples=examples,
                transform_graph=transform_graph,
                schema=schema,
                model=channel.Channel(type=standard_artifacts.Model),
                model_run=channel.Channel(type=standard_artifacts.ModelRun),
            )
        )
