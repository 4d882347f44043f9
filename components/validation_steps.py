"""The model validation's steps, without TFX: its plan, the release, the report; DPModelValidator's executor
(components/dp_model_validator_executor.py) and the confined child that validates a model again
(``pipelines.confined``) both run them, the latter without importing TFX or Beam.

Order of work, on which the privacy argument depends: verify the grant, its validation share and the
Examples' lineage (and the sides of a parallel grant's record split) before a record is read; run the
model's serving signature on the eval split; validate with ``sage_tfx.validation`` under noise seeded from
the ledger per grant; write the ModelBlessing (blessed only on ACCEPT) and the SageValidationResult. Records
are skipped by a fixed rule on each record alone, so sensitivities hold; no exact count is written out.

docs/validation.md, "The DPModelValidator component".
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sage_tfx.components._grant import canonical_saved_model_text, computation_digest
from sage_tfx.components._units import UNIT_PLAN_KEY, require_share, stage_share, unit_plan
from sage_tfx.components.validator_records import (  # noqa: F401 (model_outputs, ...: re-exported)
    ServingModel,
    ValidatorConfigError,
    custom_losses,
    model_outputs,
    per_example_values,
    split_records,
    split_values,
)
from sage_tfx.privacy import GrantError, grant_split, require_side
from sage_tfx.privacy.checks import number, positive
from sage_tfx.privacy.randomness import secure_rng
from sage_tfx.privacy.vocabulary import LOG_LOSS_FLOOR, Metric, Side, Stage

if TYPE_CHECKING:
    from tfx.types.artifact import Artifact

    from sage_tfx.privacy import Grant
    from sage_tfx.validation import DPAccuracyValidator, DPLossValidator

SAVED_MODEL_FILE = "saved_model.pb"  # hashed in canonical form by model_digest
FINGERPRINT_FILE = "fingerprint.pb"  # derived from the other files plus a random uuid: not hashed

METRICS = tuple(m.value for m in Metric)
LOSS_METRICS = tuple(m.value for m in Metric if m.is_loss)  # custom: the user's per-example loss, clipped to [0, B]
DEFAULT_LOSS_FUNCTION = "per_example_loss"
RESULT_FILE = "result.json"
STAGE, REJECT_STAGE = Stage.VALIDATION, Stage.REJECTION  # the ACCEPT test on the test split, the REJECT test on train


def validation_plan(exec_properties: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
    """Everything the validation needs, checked against the verified grant before any data is read.

    Returns a dict: metric, target, loss_bound, epsilon, confidence, eta, attempt, label_key, label_threshold,
    eval_split, train_split, prediction_key, label_signature (when set), and for metric "custom" loss_module,
    loss_function and the module's digest. Raises ValidatorConfigError (bad parameter) or GrantError (over budget, or a REJECT test
    the grant's split does not cover).
    """
    test = _test_settings(exec_properties)
    epsilon, train_split, train_epsilon, eval_split = _stage_budgets(exec_properties, grant)
    confidence = exec_properties.get("confidence")
    confidence = 0.95 if confidence is None else _number("confidence", confidence)
    eta = exec_properties.get("eta")
    eta = None if eta is None else _number("eta", eta)
    attempt = exec_properties.get("attempt")
    attempt = None if attempt is None else int(attempt)
    return {
        "metric": test["metric"],
        "target": test["target"],
        "loss_bound": test["loss_bound"],
        "epsilon": epsilon,
        "confidence": confidence,
        "eta": eta,
        "attempt": attempt,
        "label_key": test["label_key"],
        "eval_split": eval_split,
        "train_split": train_split,
        "train_epsilon": train_epsilon,
        "prediction_key": exec_properties.get("prediction_key") or None,
        "label_threshold": test["label_threshold"],
        **test["extra"],
        **unit_plan(grant),
    }


def _test_settings(exec_properties: Mapping[str, Any]) -> dict[str, Any]:
    """The test's metric, label, target and loss bound checked (``validation_plan``'s first step); ``extra``: the
    custom loss's plan and the label signature, only when set."""
    metric = str(exec_properties.get("metric") or "").strip().lower()
    if metric not in METRICS:
        raise ValidatorConfigError(f"metric {exec_properties.get('metric')!r} must be one of {METRICS}")
    label_key = exec_properties.get("label_key")
    if not label_key:
        raise ValidatorConfigError(f"label_key {label_key!r} must name the label feature")
    target = _number("target", exec_properties.get("target"))
    loss_bound = exec_properties.get("loss_bound")
    if metric in LOSS_METRICS:
        if loss_bound is None and metric == Metric.LOG_LOSS:
            loss_bound = math.log(1.0 / LOG_LOSS_FLOOR)
        if loss_bound is None:
            raise ValidatorConfigError(f"metric {metric!r} needs loss_bound B (losses are clipped to [0, B])")
        loss_bound = _number("loss_bound", loss_bound)
    elif loss_bound is not None:
        raise ValidatorConfigError(f"loss_bound {loss_bound!r} does not apply to metric 'accuracy'")
    custom = custom_loss_plan(metric, exec_properties.get("loss_module"), exec_properties.get("loss_function"))
    label_threshold = exec_properties.get("label_threshold")
    label_threshold = None if label_threshold is None else _number("label_threshold", label_threshold)
    label_signature = exec_properties.get("label_signature") or None
    if label_signature is not None and (not isinstance(label_signature, str) or not label_signature.strip()):
        raise ValidatorConfigError(
            f"label_signature {label_signature!r} must name a signature of the SavedModel (e.g. 'transform_features')"
        )
    return {
        "metric": metric,
        "target": target,
        "loss_bound": loss_bound,
        "label_key": str(label_key),
        "label_threshold": label_threshold,
        # only when set, so a plan without one keeps the fingerprint it had before the option existed
        "extra": {**({"label_signature": label_signature} if label_signature else {}), **custom},
    }


def _stage_budgets(exec_properties: Mapping[str, Any], grant: Grant) -> tuple:
    """(epsilon, train_split, train_epsilon, eval_split): the ACCEPT and REJECT tests' stage budgets and the
    sides of their splits, checked against the grant's signed split (``validation_plan``'s second step)."""
    share, _ = stage_share(grant, STAGE)
    epsilon = exec_properties.get("epsilon")
    epsilon = positive(
        share if epsilon is None else epsilon,
        "epsilon",
        error=ValidatorConfigError,
        message="{what} {value!r} must be {rule}",
        not_number="{what} {value!r} must be a number",
    )
    require_share(grant, STAGE, epsilon)

    train_split = exec_properties.get("train_split") or None
    train_epsilon = None
    if train_split is not None:
        # The REJECT test reads the training records: it is the split's `rejection` stage, charged on the
        # training side of the rule (pre + count + max(train + reject, val) with a per-record split).
        if grant_split(grant) is None:
            raise GrantError(
                f"grant {grant.id!r} is single-stage (no split): it pays for one test, so the REJECT "
                f"test on split {train_split!r} is not covered; charge a split with a rejection stage"
            )
        train_epsilon, _ = stage_share(grant, REJECT_STAGE)
        if not train_epsilon > 0:
            raise GrantError(
                f"grant {grant.id!r}'s split has no rejection stage (epsilon {train_epsilon:g}): the "
                f"REJECT test on split {train_split!r} is not paid for (BudgetSplit rejection_share > 0)"
            )
        require_share(grant, REJECT_STAGE, train_epsilon)

    eval_split = exec_properties.get("eval_split") or "eval"
    require_side(grant, [eval_split], Side.TEST, "the validator's ACCEPT test (eval_split)")
    if train_split is not None:
        require_side(grant, [train_split], Side.TRAINING, "the validator's REJECT test (train_split)")
    return epsilon, train_split, train_epsilon, eval_split


def custom_loss_plan(metric: str, loss_module: str | None, loss_function: str | None) -> dict[str, Any]:
    """For metric "custom": the user's loss module (a Python file), its function's name and the file's digest
    (part of the validation's fingerprint), checked before any data is read; {} for the other metrics."""

    if metric != Metric.CUSTOM:
        if loss_module or loss_function:
            raise ValidatorConfigError(
                f"loss_module {loss_module!r} / loss_function {loss_function!r} apply to metric 'custom' only"
            )
        return {}
    if not loss_module or not os.path.isfile(loss_module):
        raise ValidatorConfigError(
            f"metric 'custom' needs loss_module, the path of a Python file defining "
            f"{DEFAULT_LOSS_FUNCTION}(labels, outputs): got {loss_module!r}"
        )
    with open(loss_module, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    plan = {
        "loss_module": os.path.abspath(loss_module),
        "loss_function": loss_function or DEFAULT_LOSS_FUNCTION,
        "loss_module_digest": digest,
    }
    load_loss_function(plan)  # a module that fails to import, or lacks the function, fails here
    return plan


def load_loss_function(plan: Mapping[str, Any]) -> Callable[..., Any] | None:
    """The user's per-example loss function of a "custom" plan (imported from its file), or None."""

    if not plan.get("loss_module"):
        return None
    spec = importlib.util.spec_from_file_location(f"sage_loss_{plan['loss_module_digest'][:16]}", plan["loss_module"])
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ValidatorConfigError(
            f"loss_module {plan['loss_module']!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
    fn = getattr(module, plan["loss_function"], None)
    if not callable(fn):
        raise ValidatorConfigError(
            f"loss_module {plan['loss_module']!r} defines no function {plan['loss_function']!r}(labels, outputs)"
        )
    return fn


def _number(name, value):
    return number(
        value,
        name,
        error=ValidatorConfigError,
        allow_bool=True,
        message="{what} {value!r} must be {rule}",
        not_number="{what} {value!r} must be a number",
    )


def make_validator(plan: Mapping[str, Any]) -> DPAccuracyValidator | DPLossValidator:
    """The Sage-mode validator of the plan's metric (errors from the library name bad values)."""
    from sage_tfx.validation import DPAccuracyValidator, DPLossValidator

    per_unit = plan.get(UNIT_PLAN_KEY) is not None  # on a unit stream: one record per unit (components/_units.py)
    if plan["metric"] == Metric.ACCURACY:
        return DPAccuracyValidator(
            plan["target"], plan["epsilon"], plan["confidence"], train_epsilon=plan["train_epsilon"], per_unit=per_unit
        )
    return DPLossValidator(
        plan["target"],
        plan["epsilon"],
        plan["confidence"],
        loss_bound=plan["loss_bound"],
        train_epsilon=plan["train_epsilon"],
        per_unit=per_unit,
    )


def model_digest(path: str) -> str:
    """SHA-256 over a SavedModel directory: every file's relative path and bytes, in sorted order, with
    ``saved_model.pb`` in canonical form and ``fingerprint.pb`` left out.

    A resumed iteration re-trains under the same grant and seed (the train stage's release re-opened) and gets
    bit-identical variables and assets, but TensorFlow numbers the exported functions with process-wide counters
    (``__inference_signature_wrapper_7055`` one time, ``_7167`` the next) and ``fingerprint.pb`` holds a random
    uuid and a checksum of ``saved_model.pb``. So ``saved_model.pb`` is hashed as
    ``canonical_saved_model_text`` (the counters ranked, one-to-one: a different graph still gives a different
    digest) and ``fingerprint.pb`` (derived from the other files, plus that uuid) is skipped: the same model
    exported twice has one digest, any change to a variable, asset or the graph gives another
    (tests/components/test_model_digest.py)."""

    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    digest = hashlib.sha256()
    files = sorted(
        os.path.relpath(os.path.join(root, name), path) for root, _, names in tf.io.gfile.walk(path) for name in names
    )
    for rel in files:
        if rel == FINGERPRINT_FILE:
            continue
        with tf.io.gfile.GFile(os.path.join(path, rel), "rb") as f:
            data = f.read()
        if rel == SAVED_MODEL_FILE:
            saved_model = saved_model_pb2.SavedModel()
            saved_model.ParseFromString(data)
            data = canonical_saved_model_text(saved_model)
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def validation_computation(plan: Mapping[str, Any], model_path: str, data: Mapping[str, Any]) -> str:
    """The validation release's fingerprint: the model's digest, every parameter of the test and the records it
    reads (``data``: ``GrantRun.release_data`` of its splits)."""
    return computation_digest("DPModelValidator/v3", model_digest(model_path), plan, data)


# ---------------------------------------------------------------- outputs


def write_result(artifact: Artifact, report: Mapping[str, Any]) -> None:
    import tensorflow as tf

    tf.io.gfile.makedirs(artifact.uri)
    with tf.io.gfile.GFile(os.path.join(artifact.uri, RESULT_FILE), "w") as f:
        f.write(json.dumps(report, indent=2, sort_keys=True))
    artifact.set_string_custom_property("outcome", report["outcome"])
    if report["bound"] is not None:  # undefined when the noisy count was not positive
        artifact.set_float_custom_property("bound", report["bound"])
    artifact.set_string_custom_property("grant_id", report["grant_id"])
    # MLMD's SQLite store keeps ~6 decimals of a double: the exact figures as JSON.
    artifact.set_string_custom_property(
        "result",
        json.dumps(
            {k: report[k] for k in ("outcome", "bound", "epsilon_spent", "eta", "confidence", "target", "metric")}
        ),
    )


def confidence_report(grant: Grant, plan: dict, eta: float) -> dict:
    """result.json's confidence fields: ``confidence`` the one asked (the request signed into the grant by `sage
    run`, else the validator's ``confidence`` property when it chose eta, else 1 - eta), ``eta`` and
    ``test_confidence`` = 1 - eta of this one test, and ``eta_rule`` saying why they differ."""
    request = grant.meta.get("request") or {}
    asked = request.get("confidence")
    if asked is None:
        asked = plan["confidence"] if plan["eta"] is None else 1.0 - eta
    return {
        "confidence": float(asked),
        "eta": eta,
        "test_confidence": 1.0 - eta,
        "eta_rule": "the SLA holds with probability >= confidence over ALL iterations: iteration i tests at "
        "eta_i = (1 - confidence) / (i (i + 1)) (these sum to 1 - confidence), so one test's own "
        "confidence, test_confidence = 1 - eta_i, is higher than the one asked",
    }


def validate_model(run: Any, plan: dict, model_path: str, read_split: Callable[[str], Sequence[bytes]]) -> tuple:
    """(``ValidationResult``, the release's fingerprint): the SavedModel at ``model_path`` validated by ``plan`` under
    ``run``'s grant on the records ``read_split(split)`` gives (serialized tf.Examples of the grant's split).

    One release per grant: validating another model (or with other parameters) under it is refused by the
    ledger before any noise is drawn; the same model and test re-run (a resumed iteration, or the launcher's
    own validation after a confined run: ``pipelines.confined``) re-opens the release and draws the same noise."""
    serving = ServingModel(model_path)
    splits = [plan["eval_split"]] + ([] if plan["train_split"] is None else [plan["train_split"]])
    computation = validation_computation(plan, model_path, run.release_data(splits))
    per_unit = plan.get(UNIT_PLAN_KEY)  # the grant's unit column: the test is calibrated to it, at the whole share
    seed = run.open_release(STAGE, computation, plan["epsilon"], per_unit=per_unit)
    if plan["train_split"] is not None:
        run.open_release(REJECT_STAGE, computation, plan["train_epsilon"], per_unit=per_unit)
    loss_fn = load_loss_function(plan)
    test, units = split_values(serving, read_split(plan["eval_split"]), plan, loss_fn)
    train, train_units = (
        (None, None)
        if plan["train_split"] is None
        else split_values(serving, read_split(plan["train_split"]), plan, loss_fn)
    )
    # the validators' noise: exact grid Laplace from a ChaCha20 generator keyed by the grant's seed
    rng = secure_rng(seed, Stage.VALIDATION.value)
    unit_ids = {} if per_unit is None else {"units": units, "train_units": train_units}
    return make_validator(plan).validate(
        test, train, rng, attempt=plan["attempt"], eta=plan["eta"], **unit_ids
    ), computation


def validation_report(result: Any, plan: dict, grant: Any, computation: str, **uris: str) -> dict:
    """result.json's contents: the result's fields, its bound, the plan's and the grant's, ``uris`` (model_uri,
    examples_uri)."""
    report = result.to_dict()
    key = "upper" if plan["metric"] in LOSS_METRICS else "lower"
    report.update(
        {
            "bound": report["bounds"].get(key),
            "bound_kind": key,
            "metric_name": plan["metric"],
            "grant_id": grant.id,
            "stream": grant.stream,
            "eval_split": plan["eval_split"],
            "train_split": plan["train_split"],
            **uris,
            "validation_share_epsilon": stage_share(grant, STAGE)[0],
            "train_epsilon": plan["train_epsilon"],
            "per_unit": plan.get(UNIT_PLAN_KEY),
            "label_threshold": plan["label_threshold"],
            "loss_module": plan.get("loss_module"),
            "computation": computation,
            **confidence_report(grant, plan, result.eta),
        }
    )
    return report
