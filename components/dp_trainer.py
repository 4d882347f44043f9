"""DPTrainer: TFX's Trainer convention (a module file's ``run_fn(fn_args)``) under a grant's training share.

Inputs: ``examples`` (Examples read under the grant: BlockExampleGen's, or DPTransform's
``transformed_examples``), optional ``transform_graph`` (a tf.Transform output, e.g. DPTransform's) and
optional ``schema``. Execution parameters: ``grant`` (JSON, or a RuntimeParameter of type str), ``ledger``
(location), ``module_file`` / ``module_path`` / ``run_fn`` (as TFX's Trainer), ``train_args`` /
``eval_args`` (``trainer_pb2`` protos; default splits train / eval), ``custom_config`` (dict), optional
``epsilon`` / ``delta`` (spend less than the training share; more is refused) and ``public_num_examples``
(a public training-set size, used only when the grant released no DP record count).

``fn_args`` is TFX's ``FnArgs`` (train_files, eval_files (empty under a parallel grant: its test records are
the validator's alone), data_accessor, transform_graph_path /
transform_output, schema_path, serving_model_dir, model_run_dir, custom_config, ...) plus:
  * ``privacy_budget``: (epsilon, delta), the grant's training share (from its signed split), assigned at
    run time: module files never hard-code it;
  * ``num_examples``: the training splits' share of the ledger's DP record count (or the public number;
    None if neither): what DP-SGD calibrates on, never the exact count;
  * ``seed``: derived from the ledger secret for (grant, "training"): a re-run under the same grant
    trains the same model, so resuming costs no extra privacy. Secret: never write it out;
  * ``grant_id``, ``stream``.

Outputs: standard ``model`` (Model; the SavedModel in ``Format-Serving``) and ``model_run`` (ModelRun,
holding ``privacy_spent.json``). Both carry MLMD custom properties ``grant_id``, ``stream``,
``epsilon_spent``, ``delta_spent``, ``accounting`` (``rdp`` / ``pld`` for DP-SGD, ``rdp`` for AdaSSP's
grid-Gaussian releases), ``mechanism``, ``noise_multiplier``, ``steps`` (DP-SGD), ``num_examples`` with
``num_examples_source``, ``training_share_epsilon`` / ``_delta``, and ``privacy_spent`` (exact JSON with the
DpEvent).

The executor refuses to run, before reading any data, without a genuine grant, on Examples read under
another grant or not of its records (``split_rule`` / ``data_digest``), on a test-side split among
``train_args.splits`` under a parallel grant, or when asked for more than the training share; after ``run_fn`` it re-accounts the spend
the module reported (``trainer_utils.report_spent`` or the returned model) and deletes the model if it is
outside the asked budget (sage_tfx.components.dp_trainer_executor).
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
