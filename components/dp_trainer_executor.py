"""DPTrainer executor: verify the grant and the training share, run ``run_fn(fn_args)``, audit the spend.

Nothing is read before the grant, the Examples' lineage and the asked budget are checked and the training
release is opened with the ledger. ``run_fn`` then trains inside ``sage_tfx.models.training_seed`` (the seed
never reaches the module); the spend it reports is re-accounted, and on any failure the model is deleted. A
re-opened release copies its first, kept model instead of training again. The audit bounds what the DP models
spend; it does not stop a module written to leak data (module files must train through sage_tfx's DP models).

The steps: docs/models.md, "The DPTrainer executor, step by step".
"""

from __future__ import annotations

import ast
import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from sage_tfx.components._grant import GrantedExecutor, computation_digest, released_record_count
from sage_tfx.components.dp_transform_executor import COMPUTATION_PROPERTY
from sage_tfx.components.user_modules import load_user_fn, sibling_sources
from sage_tfx.privacy import GrantError, grant_split, require_budget, require_side, stage_budget
from sage_tfx.privacy.checks import number
from sage_tfx.privacy.vocabulary import Side, Stage

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from tfx.types.artifact import Artifact

    from sage_tfx.components._grant import GrantRun
    from sage_tfx.models.seeding import TrainingBlock
    from sage_tfx.privacy import Grant

STAGE = Stage.TRAINING
# Execution parameters that define the training computation (the grant and the ledger are not part of it).
COMPUTATION_PROPERTIES = ("custom_config", "train_args", "eval_args", "epsilon", "delta", "public_num_examples")
RELATIVE_SLACK = 1e-6  # float round-off allowed when re-accounting a calibrated spend


class SpendError(GrantError):
    """The model spent more than the grant's training share, or reported no spend / a leaking count."""


def training_share(grant: Grant) -> tuple[float, float]:
    """(epsilon, delta) the training stage may spend under a verified grant: its share of the signed split,
    or the whole of a single-stage grant (then no other stage may spend it: ``Ledger.release``)."""
    return stage_budget(grant, STAGE)


def asked_budget(exec_properties: Mapping[str, Any], grant: Grant) -> tuple[float, float]:
    """The (epsilon, delta) the run may spend: the training share, or less if the component asks less.

    Refused before any data is read if it asks more than the share, or the share is empty.
    """
    share_eps, share_delta = training_share(grant)
    epsilon = exec_properties.get("epsilon")
    delta = exec_properties.get("delta")
    epsilon, delta = (
        number(
            share if value is None else value,
            f"DPTrainer {name}",
            error=ValueError,
            low=0.0,
            message="{what}={value!r} is invalid: must be {rule}",
        )
        for name, value, share in (("epsilon", epsilon, share_eps), ("delta", delta, share_delta))
    )
    if epsilon <= 0:
        raise GrantError(f"grant {grant.id!r} leaves no training budget (epsilon {epsilon:.6g})")
    require_budget(grant, STAGE, epsilon, delta)
    return epsilon, delta


def training_count(
    ledger: GrantRun, grant: Grant, examples: Artifact, train_splits: Sequence[str], public_num_examples: int | None
) -> tuple[int | None, str | None]:
    """(num_examples for calibration, its source): the DP count of the training splits, or a public number.

    The DP count covers every split of the grant; the training splits' share of it uses the public hash
    bucket split rule of the Examples (``split_rule``), a post-processing of the DP count. Without a rule
    the whole count is used (an over-estimate only shrinks the expected batch; the DP-SGD guarantee holds
    whatever the true count). None when neither a DP count nor a public number exists.
    """
    released = released_record_count(ledger, grant)
    if released is not None:
        value, _ = released
        rule = examples.get_string_custom_property("split_rule") if examples.has_custom_property("split_rule") else ""
        fraction = 1.0
        if rule:
            buckets = json.loads(rule)
            fraction = sum(buckets.get(s, 0) for s in train_splits) / sum(buckets.values())
        return max(1, int(round(value * fraction))), "dp_record_count"
    if public_num_examples is not None:
        count = int(public_num_examples)
        if count < 1:
            raise ValueError(f"public_num_examples={public_num_examples!r} is invalid: must be >= 1")
        return count, "public"
    return None, None


def module_source(run_fn: Callable[..., Any]) -> str | bytes:
    """The bytes of ``run_fn``'s source file, or its compiled code object if it has none (e.g. a built-in)."""

    try:
        with open(inspect.getsourcefile(run_fn), "rb") as f:
            return f.read()
    except (TypeError, OSError):
        import marshal

        return marshal.dumps(run_fn.__code__)


def _numbers_in(value):
    """Every number (not a bool) in a JSON value, as floats."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, (int, float)):
        return {float(value)}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return set().union(*(_numbers_in(v) for v in value)) if value else set()
    return set()


def public_numbers(
    source: str | bytes, custom_config: Mapping[str, Any] | None, num_examples: int | None
) -> frozenset[float]:
    """The numbers a DP fit's batch size and epochs (and an adaptive clip's parameters) may take under this run
    (``training_seed(public=...)``): the numeric constants of the module's source (``source``: its bytes, or a
    list of the bytes of it and of the files beside it, which it may import), the numbers of ``custom_config``,
    the DP models' defaults (and AdaptiveClip's),
    and ``trainer_utils.batch_size`` of each of them at the DP (or public) count ``num_examples``. All are
    public: the source and custom_config are part of the training computation, the count is DP."""

    from sage_tfx.components import trainer_utils
    from sage_tfx.models import make_private
    from sage_tfx.models.dpsgd_models import DPLogisticRegressor, _DPSGDEstimator
    from sage_tfx.privacy.adaptive_clip import IMBALANCED, AdaptiveClip

    numbers = _numbers_in(custom_config)
    for text in source if isinstance(source, list) else [source]:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, TypeError):  # compiled code: no constants to read
            continue
        numbers |= {
            float(n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)
        }
    for fn, names in (
        (make_private, ("batch_size", "epochs")),
        (_DPSGDEstimator.__init__, ("batch_size", "epochs")),
        (trainer_utils.batch_size, ("default",)),
    ):
        parameters = inspect.signature(fn).parameters
        numbers |= {float(parameters[name].default) for name in names}
    numbers.add(float(DPLogisticRegressor.DEFAULT_BATCH_SIZE))
    numbers |= set(AdaptiveClip().public_numbers().values()) | set(IMBALANCED.public_numbers().values())
    if num_examples is not None:
        args = SimpleNamespace(num_examples=num_examples)
        numbers |= {float(trainer_utils.batch_size(args, {"batch_size": w})) for w in list(numbers) if w >= 1}
    return frozenset(numbers)


def training_computation(
    exec_properties: Mapping[str, Any],
    run_fn: Callable[..., Any],
    input_dict: Mapping[str, list[Artifact]],
    budget: tuple[float, float],
    data: Mapping[str, Any] | None = None,
) -> str:
    """The training release's fingerprint: the module's source, run_fn's name, the parameters that shape the
    run (``COMPUTATION_PROPERTIES``), the budget, the release the transform graph came from, and the records
    it reads (``data``: ``GrantRun.release_data`` of the training splits)."""
    source = module_source(run_fn)
    graphs = [
        g.get_string_custom_property(COMPUTATION_PROPERTY)
        for g in input_dict.get("transform_graph") or []
        if g.has_custom_property(COMPUTATION_PROPERTY)
    ]
    params = {k: exec_properties.get(k) for k in COMPUTATION_PROPERTIES}
    params = {k: v if v is None or isinstance(v, (str, int, float)) else proto_json(v) for k, v in params.items()}
    siblings = [part for name, text in sibling_sources(run_fn) for part in (name, text)]  # what it may import
    return computation_digest(
        "DPTrainer/v1",
        source,
        getattr(run_fn, "__qualname__", ""),
        params,
        list(budget),
        graphs,
        *([] if data is None else [data]),
        *siblings,
    )


# ------------------------------------------------------------------------------------------- the audit


def _gaussian_multipliers(event):
    """Noise multipliers if ``event`` is a composition of plain Gaussian mechanisms, else None."""
    import dp_accounting

    if isinstance(event, dp_accounting.GaussianDpEvent):
        return [event.noise_multiplier]
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner = _gaussian_multipliers(event.event)
        return None if inner is None else inner * int(event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        out = []
        for e in event.events:
            inner = _gaussian_multipliers(e)
            if inner is None:
                return None
            out.extend(inner)
        return out
    return None


def audit_spend(report: Mapping[str, Any], budget: tuple[float, float], num_examples: int | None) -> tuple[float, str]:
    """Check a spend report against the run's (epsilon, delta); return (audited epsilon, accounting).

    Compositions of Gaussian mechanisms (AdaSSP's grid-Gaussian releases) are accounted by their RDP curve, the
    only guarantee their proof gives (``gaussian.rdp_event_epsilon``), whatever accountant the report names.
    Anything else (DP-SGD's Poisson-sampled Gaussian) goes through dp_accounting's RDP accountant, or PLD if the
    model used PLD.
    """
    from sage_tfx.components.trainer_utils import event_from_json
    from sage_tfx.privacy import gaussian
    from sage_tfx.privacy.dpsgd import event_epsilon

    epsilon, delta = budget
    try:
        spent_eps, spent_delta = float(report["epsilon"]), float(report["delta"])
        event = event_from_json(report["dp_event"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SpendError(f"the spend report is malformed ({exc}): it needs epsilon, delta and dp_event") from None
    if not (math.isfinite(spent_eps) and spent_eps >= 0 and 0 <= spent_delta < 1):
        raise SpendError(f"the model reports (epsilon={spent_eps!r}, delta={spent_delta!r}): not a valid spend")
    if spent_eps > epsilon * (1 + 1e-9) or spent_delta > delta * (1 + 1e-9):
        raise SpendError(
            f"the model spent (epsilon={spent_eps:.6g}, delta={spent_delta:.3g}) but the grant's "
            f"training share allows (epsilon={epsilon:.6g}, delta={delta:.3g})"
        )
    reported_n = report.get("num_examples")
    if reported_n is not None and (num_examples is None or int(reported_n) != int(num_examples)):
        # the reported value is not echoed: it may be the exact count the run_fn must never use
        raise SpendError(
            f"the model calibrated its noise with another num_examples than the run's DP (or public) "
            f"count {num_examples}: use fn_args.num_examples, never the exact count"
        )

    accounting = report.get("accountant") or "rdp"
    if accounting not in ("rdp", "pld"):
        raise SpendError(f"accountant {accounting!r} is unknown: use 'rdp' or 'pld'")
    if _gaussian_multipliers(event):  # AdaSSP's grid-Gaussian releases: proven through their Renyi divergences only
        audited, accounting = gaussian.rdp_event_epsilon(event, spent_delta), "rdp"
    else:
        audited = event_epsilon(event, spent_delta, accounting) if spent_delta > 0 else math.inf
    if not audited <= epsilon * (1 + RELATIVE_SLACK):
        raise SpendError(
            f"re-accounting the model's DpEvent ({accounting}) gives epsilon={audited:.6g} at "
            f"delta={spent_delta:.3g}, above the training share epsilon={epsilon:.6g}"
        )
    return audited, accounting


def audit_fits(block: TrainingBlock, budget: tuple[float, float]) -> tuple[float, float]:
    """(epsilon, delta) of every DP fit of the run composed (basic composition), checked against the share.

    ``block``: the run's ``TrainingBlock``; its filter already refused any fit past the share before it read
    anything, so this re-checks the composition of what the fits reported. A run that reports a spend but
    fitted no sage_tfx DP model under the grant's seed is refused: its model was not trained by one.
    """
    if not block.fits:
        raise SpendError(
            "run_fn reported a spend but fitted no sage_tfx DP model in its own thread under the "
            "grant's training seed: train with sage_tfx.models (DP models or make_private)"
        )
    epsilon, delta = block.composed()
    if epsilon > budget[0] * (1 + RELATIVE_SLACK) or delta > budget[1] * (1 + RELATIVE_SLACK):
        raise SpendError(
            f"the run's {len(block.fits)} DP fits compose to (epsilon={epsilon:.6g}, delta={delta:.3g}), "
            f"above the training share (epsilon={budget[0]:.6g}, delta={budget[1]:.3g})"
        )
    return epsilon, delta


def collect_report(returned: Any, model_run_dir: str) -> dict[str, Any] | None:
    """The spend report: ``privacy_spent.json`` in model_run_dir, else what run_fn returned."""
    from sage_tfx.components.trainer_utils import read_report, spent_report

    report = read_report(model_run_dir)
    if report is not None:
        return report
    if returned is not None:
        try:
            return spent_report(returned)
        except ValueError as exc:
            raise SpendError(f"run_fn returned {type(returned).__name__} without a usable spend: {exc}") from None
    raise SpendError(
        "run_fn reported no privacy spend: call sage_tfx.components.trainer_utils.report_spent("
        "fn_args, model) or return the fitted DP model"
    )


def _discard(paths):
    import tensorflow as tf

    for path in paths:
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)


# ------------------------------------------------------------------------------------------- fn_args


def make_fn_args(
    input_dict: dict[str, list[Artifact]], output_dict: dict[str, list[Artifact]], exec_properties: dict[str, Any]
) -> Any:
    """TFX's own ``FnArgs`` (train/eval files, data_accessor, transform graph, serving/run dirs, custom
    config...), as TFX's Trainer builds it; the privacy fields are added by the executor."""
    from tfx.components.trainer import fn_args_utils
    from tfx.utils import path_utils

    props = dict(exec_properties)
    props["train_args"] = proto_json(props.get("train_args"))
    props["eval_args"] = proto_json(props.get("eval_args"))
    props["custom_config"] = props.get("custom_config") or "null"
    fn_args = fn_args_utils.get_common_fn_args(input_dict, props)
    if fn_args.custom_config is not None and not isinstance(fn_args.custom_config, dict):
        raise ValueError(f"custom_config must be a JSON object, got {fn_args.custom_config!r}")
    model_uri = artifact_utils.get_single_uri(output_dict["model"])
    fn_args.serving_model_dir = path_utils.serving_model_dir(model_uri)
    fn_args.eval_model_dir = path_utils.eval_model_dir(model_uri)
    fn_args.model_run_dir = artifact_utils.get_single_uri(output_dict["model_run"])
    fn_args.transform_output = fn_args.transform_graph_path
    fn_args.schema_file = fn_args.schema_path
    return fn_args


def proto_json(value: Message | str | None) -> str:
    """A proto execution parameter as JSON (TFX hands them over as JSON strings, tests may pass messages)."""
    if value is None or value == "":
        return "{}"
    if isinstance(value, str):
        return value
    from tfx.utils import proto_utils

    return proto_utils.proto_to_json(value)


def hide_test_records(fn_args: Any, grant: Grant) -> None:
    """Under a parallel grant ``run_fn`` gets no eval files (``fn_args.eval_files`` empty): its test records are
    charged for the validator's ACCEPT test only, so training (early stopping, model selection) may not read
    them; ``trainer_utils.load_examples(..., split="eval")`` then refuses. Other grants keep TFX's eval files."""
    split = grant_split(grant)
    if split is not None and split.parallel:
        fn_args.eval_files = []


def train_split_names(exec_properties: Mapping[str, Any]) -> list[str]:
    from tfx.proto import trainer_pb2
    from tfx.utils import proto_utils

    args = trainer_pb2.TrainArgs()
    proto_utils.json_to_proto(proto_json(exec_properties.get("train_args")), args)
    return list(args.splits) or ["train"]


class Executor(GrantedExecutor, base_executor.BaseExecutor):
    def Do(
        self,
        input_dict: dict[str, list[Artifact]],
        output_dict: dict[str, list[Artifact]],
        exec_properties: dict[str, Any],
    ) -> None:
        # The one door (one ledger connection for the run): the grant, its provenance and the training
        # budget are checked before any read.
        with self.CheckGrant(exec_properties) as run:
            self._run(run, input_dict, output_dict, exec_properties)

    def _run(self, run, input_dict, output_dict, exec_properties):
        grant = run.grant
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        for item in [examples] + list(input_dict.get("transform_graph") or []):
            run.check_read_under(
                item,
                "train only on data read under the grant",
                what=f"the {item.type_name} artifact was made",
                required=item is examples,
            )
        run.check_examples_data(examples, "DPTrainer")
        train_splits = train_split_names(exec_properties)
        require_side(grant, train_splits, Side.TRAINING, "DPTrainer (train_args.splits)")
        budget = asked_budget(exec_properties, grant)
        num_examples, count_source = training_count(
            run.ledger, grant, examples, train_splits, exec_properties.get("public_num_examples")
        )

        fn_args = make_fn_args(input_dict, output_dict, exec_properties)
        hide_test_records(fn_args, grant)
        fn_args.privacy_budget = budget
        fn_args.num_examples = num_examples
        fn_args.grant_id = grant.id
        fn_args.stream = grant.stream
        run_fn = load_user_fn(exec_properties, "run_fn")  # its folder importable: run_fn may import siblings
        # One release per grant: another module or configuration under this grant is refused here.
        computation = training_computation(exec_properties, run_fn, input_dict, budget, run.release_data(train_splits))
        seed = run.open_release(STAGE, computation, *budget)

        model = artifact_utils.get_single_instance(output_dict["model"])
        model_run = artifact_utils.get_single_instance(output_dict["model_run"])
        kept = kept_release_dir(model.uri, grant.id, computation)
        released = restore_release(kept, model.uri, model_run.uri)  # a re-opened release: its first model
        if released is None:
            public = public_numbers(
                [module_source(run_fn), *(data for _, data in sibling_sources(run_fn))],
                fn_args.custom_config,
                num_examples,
            )
            record, report = train_and_audit(
                run_fn, fn_args, seed, budget, num_examples, public, [model.uri, model_run.uri]
            )
            record.update(
                {
                    "grant_id": grant.id,
                    "stream": grant.stream,
                    "num_examples": num_examples,
                    "num_examples_source": count_source,
                    "training_share_epsilon": budget[0],
                    "training_share_delta": budget[1],
                }
            )
            keep_release(kept, model.uri, model_run.uri, record, report)
        else:
            record, report = released
        write_spend_properties(model, record, report)
        write_spend_properties(model_run, record, report)


def train_and_audit(
    run_fn: Callable[..., Any],
    fn_args: Any,
    seed: int,
    budget: tuple[float, float],
    num_examples: int | None,
    public: frozenset[float],
    outputs: Mapping[str, Artifact],
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Run ``run_fn`` under the grant's training seed, share and ``public`` numbers (``public_numbers``),
    audit its spend; return (record, report).

    On any failure what run_fn wrote (``outputs``) is deleted: an unaudited model never leaves the executor.
    """
    try:
        from sage_tfx.models import training_seed

        with training_seed(seed, share=budget, public=public) as block:  # the ledger seed (128 bits), the filter
            returned = run_fn(fn_args)
        report = collect_report(returned, fn_args.model_run_dir)
        audited, accounting = audit_spend(report, budget, num_examples)
        composed = audit_fits(block, budget)
        import tensorflow as tf

        if not tf.io.gfile.exists(fn_args.serving_model_dir):
            raise RuntimeError(f"run_fn wrote no model to fn_args.serving_model_dir ({fn_args.serving_model_dir})")
    except Exception:
        _discard(outputs)
        raise
    record = {
        "epsilon_spent": composed[0],
        "delta_spent": composed[1],
        "audited_epsilon": audited,
        "accounting": accounting,
        "fits": [{"model": f.model, "epsilon": f.charged()[0], "delta": f.charged()[1]} for f in block.fits],
        "mechanism": report.get("mechanism", ""),
        "noise_multiplier": report.get("noise_multiplier"),
        "steps": report.get("steps"),
    }
    return record, report


# ------------------------------------------------------------------------------------------- the kept release

KEPT_RECORD = "release.json"  # written last: a kept release without it is incomplete and ignored


def kept_release_dir(model_uri: str, grant_id: str, computation: str) -> str:
    """Where the first model of a training release is kept: beside the Model artifacts of the component
    (TFX: ``<pipeline root>/<component>/model/.released/...``), named by the grant and the computation."""
    return "/".join([model_uri.rstrip("/").rsplit("/", 1)[0], ".released", f"{grant_id}-{computation[:32]}"])


def _copy_tree(src, dst):
    import tensorflow as tf

    for folder, _, files in tf.io.gfile.walk(src):
        target = dst + folder[len(src) :]
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(f"{folder}/{name}", f"{target}/{name}", overwrite=True)


def keep_release(
    kept: str, model_uri: str, model_run_uri: str, record: Mapping[str, Any], report: Mapping[str, Any]
) -> None:
    """Copy the audited model and run folder to ``kept``, then its record (the marker that it is complete)."""
    import tensorflow as tf

    if tf.io.gfile.exists(kept):
        tf.io.gfile.rmtree(kept)  # an incomplete copy of a killed run
    _copy_tree(model_uri, f"{kept}/model")
    _copy_tree(model_run_uri, f"{kept}/model_run")
    with tf.io.gfile.GFile(f"{kept}/{KEPT_RECORD}", "w") as f:
        f.write(json.dumps({"record": record, "report": report}, sort_keys=True))


def restore_release(kept: str, model_uri: str, model_run_uri: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The kept first model of this training release copied into the new outputs: (record, report), or None
    if the release has no complete kept model (its first run). DP-SGD is not bit-for-bit reproducible (thread
    scheduling, a model's unseeded initial weights), so a re-opened release re-uses the model it released
    instead of training a second, different one under the same noise seed."""
    import tensorflow as tf

    if not tf.io.gfile.exists(f"{kept}/{KEPT_RECORD}"):
        return None
    _copy_tree(f"{kept}/model", model_uri)
    _copy_tree(f"{kept}/model_run", model_run_uri)
    with tf.io.gfile.GFile(f"{kept}/{KEPT_RECORD}") as f:
        kept_json = json.loads(f.read())
    return kept_json["record"], kept_json["report"]


def write_spend_properties(artifact: Artifact, record: Mapping[str, Any], report: Mapping[str, Any]) -> None:
    """MLMD custom properties; ``privacy_spent`` holds the exact figures and the DpEvent as JSON (MLMD's
    SQLite store keeps only ~6 decimals of a double)."""
    for key in ("grant_id", "stream", "accounting", "mechanism"):
        artifact.set_string_custom_property(key, str(record[key]))
    for key in ("epsilon_spent", "delta_spent", "training_share_epsilon", "training_share_delta"):
        artifact.set_float_custom_property(key, float(record[key]))
    if record["noise_multiplier"] is not None:
        artifact.set_float_custom_property("noise_multiplier", float(record["noise_multiplier"]))
    if record["steps"] is not None:
        artifact.set_int_custom_property("steps", int(record["steps"]))
    if record["num_examples"] is not None:
        artifact.set_int_custom_property("num_examples", int(record["num_examples"]))
        artifact.set_string_custom_property("num_examples_source", record["num_examples_source"])
    artifact.set_string_custom_property("privacy_spent", json.dumps(dict(record, report=report), sort_keys=True))
