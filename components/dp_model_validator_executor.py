"""DPModelValidator executor: verify the grant, then validate the model on the eval split with a Sage SLA.

The steps (the plan, the release, the report, and the order of work the privacy argument depends on) are in
components/validation_steps.py, which imports neither TFX nor Beam, so that the confined child validating a
model again (``pipelines.confined``) runs the same steps without loading them; this module adds TFX's artifacts.

docs/validation.md, "The DPModelValidator component".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from sage_tfx.components._grant import GrantedExecutor
from sage_tfx.components.validation_steps import (  # noqa: F401 (the steps' names, re-exported)
    SAVED_MODEL_FILE,
    STAGE,
    ServingModel,
    ValidatorConfigError,
    custom_losses,
    make_validator,
    model_digest,
    model_outputs,
    per_example_values,
    split_records,
    split_values,
    validate_model,
    validation_computation,
    validation_plan,
    validation_report,
    write_result,
)
from sage_tfx.release.blessing import write_blessing

if TYPE_CHECKING:
    from tfx.types.artifact import Artifact


class Executor(GrantedExecutor, base_executor.BaseExecutor):
    def Do(
        self,
        input_dict: dict[str, list[Artifact]],
        output_dict: dict[str, list[Artifact]],
        exec_properties: dict[str, Any],
    ) -> None:
        # The one door (one ledger connection for the run): the grant is verified, and the budget and the
        # data's provenance are checked, before a single record is read.
        with self.CheckGrant(exec_properties) as run:
            self._run(run, input_dict, output_dict, exec_properties)

    def _run(self, run, input_dict, output_dict, exec_properties):

        from tfx.utils import path_utils

        grant = run.grant
        plan = validation_plan(exec_properties, grant)
        make_validator(plan)  # a bad parameter fails here, before any record is read
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        run.check_read_under(examples, "validate only data the grant covers")
        run.check_examples_data(examples, "DPModelValidator")
        model = artifact_utils.get_single_instance(input_dict["model"])
        model_path = path_utils.serving_model_path(model.uri, path_utils.is_old_model_artifact(model))

        result, computation = validate_model(run, plan, model_path, lambda split: split_records(examples, split))
        report = validation_report(result, plan, grant, computation, model_uri=model.uri, examples_uri=examples.uri)
        blessing = artifact_utils.get_single_instance(output_dict["blessing"])
        write_blessing(blessing.uri, model.uri, model.id, result.accepted, artifact=blessing)
        write_result(artifact_utils.get_single_instance(output_dict["validation_result"]), report)
