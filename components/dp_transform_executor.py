"""DPTransform executor: verify the grant, trace the preprocessing_fn, then run tf.Transform on Beam.

Order of work, on which the privacy argument depends: verify the grant and the Examples' lineage; trace the
function on placeholders and refuse a non-DP analyzer or a spend above the preprocessing share; open the
preprocessing release with the ledger for the traced graph; only then read records. The analysis is ONE
(epsilon_spent, delta_spent)-DP release over the analyze splits, its noise seeded from the ledger per grant
(re-runs reproduce it); the transform phase releases nothing new.

The full argument: docs/dp_preprocessing.md, "The DPTransform component".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils

from sage_tfx.components._grant import GrantedExecutor, canonical_graph_text, computation_digest
from sage_tfx.privacy import require_budget, stage_budget
from sage_tfx.privacy.errors import SageError
from sage_tfx.privacy.vocabulary import Stage
from sage_tfx.transform.errors import NonPrivateAnalyzer  # raised here, and by noise_seed for an explicit seed=

if TYPE_CHECKING:
    from tfx.types.artifact import Artifact

    from sage_tfx.privacy import Grant

STAGE = Stage.PREPROCESSING
PLANNING_SEED = 0  # traces the function for the plan and its fingerprint; the release's seed runs the analysis
COMPUTATION_PROPERTY = "release_computation"  # the fingerprint of the release an artifact came from
TRANSFORMED_EXAMPLES_PREFIX = "transformed_examples"  # TFX Transform's file prefix
TEMP_DIR = ".temp_path"  # inside the transform graph's URI while the analysis runs, as TFX's Transform
# Lineage of the input Examples copied onto the transformed ones (a DPTrainer checks grant_id, split_rule and
# data_digest).
_STRING_LINEAGE = ("stream", "block_ids", "charge", "split_rule", "data_digest")
_NUMBER_LINEAGE = ("block_count", "dp_record_count", "dp_record_count_epsilon")


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point this process's stdout (file descriptor 1, which subprocesses inherit) at stderr while inside: the
    wheel build and pip install of a packaged module print there, and `sage run` keeps stdout for its progress
    lines."""

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


class TransformConfigError(SageError, ValueError):
    """A bad DPTransform parameter; the message names it."""


# ---------------------------------------------------------------- parameters


def parse_custom_config(text: str | None) -> dict[str, Any]:
    """The user's custom_config (JSON object); it may not set the budget section Sage fills from the grant."""
    from sage_tfx.transform import BUDGET_KEY

    if text is None or text == "":
        return {}
    try:
        config = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        raise TransformConfigError(f"custom_config {text!r} is not JSON") from None
    if not isinstance(config, dict):
        raise TransformConfigError(f"custom_config {text!r} must be a JSON object")
    if BUDGET_KEY in config:
        raise TransformConfigError(
            f"custom_config sets {BUDGET_KEY!r} ({config[BUDGET_KEY]!r}): DPTransform sets "
            "it from the grant's preprocessing share, never from user configuration"
        )
    return config


def parse_splits_config(text: str | None, input_splits: Sequence[str]) -> tuple[list[str], list[str]]:
    """(analyze splits, transform splits): default analyze ["train"], transform every input split.

    ``text`` is JSON like TFX's SplitsConfig: {"analyze": [...], "transform": [...]}.
    """
    config = {}
    if text:
        try:
            config = json.loads(text)
        except ValueError:
            raise TransformConfigError(f"splits_config {text!r} is not JSON") from None
        if not isinstance(config, dict) or set(config) - {"analyze", "transform"}:
            raise TransformConfigError(f"splits_config {text!r} must be an object with keys analyze / transform")
    analyze = list(config.get("analyze") or ["train"])
    transform = list(config.get("transform") or input_splits)
    for role, names in (("analyze", analyze), ("transform", transform)):
        for name in names:
            if name not in input_splits:
                raise TransformConfigError(f"{role} split {name!r} is not in the Examples (splits: {input_splits})")
        if len(set(names)) != len(names):
            raise TransformConfigError(f"{role} splits {names!r} name a split twice")
    return analyze, transform


def raw_schema(exec_properties: Mapping[str, Any], grant: Grant) -> dict[str, str]:
    """{feature: kind} from the ``schema`` parameter, or from DATA_ROOT/STREAM/_stream.json."""
    from sage_tfx.components.transform_utils import parse_schema, stream_schema

    schema, data_root = exec_properties.get("schema"), exec_properties.get("data_root")
    if (schema is None) == (data_root is None):
        raise TransformConfigError(
            f"give exactly one of schema (JSON {{feature: kind}}) or data_root (got "
            f"schema={schema!r}, data_root={data_root!r})"
        )
    if schema is not None:
        return parse_schema(schema)
    return stream_schema(data_root, exec_properties.get("stream") or grant.stream)


def load_preprocessing_fn(exec_properties: Mapping[str, Any]) -> Callable[..., Any]:
    """The user's function: ``module_file`` (+ optional function name in ``preprocessing_fn``),
    ``module_path``, or ``preprocessing_fn`` as a dotted path, as TFX's Transform takes them; a module file may
    import the files beside it (``user_modules.load_user_fn``)."""
    from sage_tfx.components.user_modules import load_user_fn

    given = [k for k in ("module_file", "module_path") if exec_properties.get(k)]
    if len(given) > 1 or not (given or exec_properties.get("preprocessing_fn")):
        raise TransformConfigError(
            "give exactly one of module_file, module_path, or preprocessing_fn (a dotted "
            f"path); got {', '.join(given) or 'none'}"
        )
    return load_user_fn(exec_properties, "preprocessing_fn")


# ---------------------------------------------------------------- the DP analyzers of the traced function


def check_traced_analyzers(graph: Any) -> None:
    """Refuse a traced preprocessing_fn whose tf.Transform analyzers are not all seeded Sage DP analyzers.

    Every analyzer output is a tensor tf.Transform will replace by a statistic of the data; only the
    outputs of ``sage_tfx.transform``'s DP analyzers (a full-pass PTransform adding Laplace noise) may be.
    The refusal names the DP counterpart of the refused analyzer when there is one.
    """

    from tensorflow_transform import analyzer_nodes

    from sage_tfx.transform import analyzers

    # tft function or inner analyzer (the parts of a label like "ExtractCombineMergeOutputs[scale_to_z_score#
    # mean_and_var]", outermost first) -> what to use instead.
    counterparts = {
        "scale_to_z_score": "sage_tfx.transform.dp_scale_to_z_score(x, epsilon, value_range)",
        "mean": "sage_tfx.transform.dp_mean(x, epsilon, value_range)",
        "var": "sage_tfx.transform.dp_variance(x, epsilon, value_range)",
        "scale_to_z_score_per_key": "sage_tfx.transform.dp_mean_per_key / dp_group_by_mean",
        "mean_and_var_per_key": "sage_tfx.transform.dp_mean_per_key / dp_group_by_mean",
        "mean_and_var": "sage_tfx.transform.dp_scale_to_z_score (or dp_mean / dp_variance)",
        "scale_to_0_1": "sage_tfx.transform.dp_scale_to_0_1(x, epsilon, value_range)",
        "scale_by_min_max": "sage_tfx.transform.dp_scale_to_0_1(x, epsilon, value_range) (then rescale)",
        "min": "sage_tfx.transform.dp_scale_to_0_1 or dp_quantiles (a DP low quantile; an exact min is not DP)",
        "max": "sage_tfx.transform.dp_scale_to_0_1 or dp_quantiles (a DP high quantile; an exact max is not DP)",
        "min_and_max": "sage_tfx.transform.dp_scale_to_0_1 (or dp_quantiles for DP low/high quantiles)",
        "bucketize": "sage_tfx.transform.dp_bucketize(x, num_buckets, epsilon, value_range)",
        "quantiles": "sage_tfx.transform.dp_quantiles(x, num_buckets, epsilon, value_range) (or dp_bucketize)",
        "compute_and_apply_vocabulary": "sage_tfx.transform.dp_compute_and_apply_vocabulary(x, epsilon, delta, "
        "top_k=...) (or count a public vocabulary with dp_histogram(x, epsilon, "
        "vocabulary=[...]))",
        "vocabulary": "sage_tfx.transform.dp_vocabulary(x, epsilon, delta, top_k=...)",
        "sum": "sage_tfx.transform.dp_sum_per_key (one key for a total) or dp_mean",
        "size": "sage_tfx.transform.dp_count_per_key (one key for the row count)",
        "count_per_key": "sage_tfx.transform.dp_count_per_key or dp_histogram",
    }
    for sink in graph.get_collection(analyzer_nodes.TENSOR_REPLACEMENTS):
        op = sink.future.parent_operation.operation_def
        ptransform = getattr(op, "ptransform", None)
        if not isinstance(op, analyzer_nodes.PTransform) or not isinstance(ptransform, analyzers._NoiseOnce):
            label = str(op.label)
            inside = re.search(r"\[(.*)\]", label)
            parts = inside.group(1).split("#") if inside else [label]
            use = next((counterparts[p] for p in parts if p in counterparts), None)
            instead = (
                f"Use its DP counterpart {use} instead"
                if use
                else "Use sage_tfx.transform's DP analyzers (dp_mean, dp_group_by_mean, dp_histogram, ...)"
            )
            raise NonPrivateAnalyzer(
                f"the preprocessing_fn uses the tf.Transform analyzer {op.label!r} (output {sink.tensor.name!r}), "
                "which is not differentially private: its exact statistic would be baked into the transform "
                f"graph. {instead}, or public constants (e.g. scale with public bounds instead of "
                "tft.scale_to_0_1)"
            )
        if getattr(ptransform, "_seed", None) is None:
            raise NonPrivateAnalyzer(f"the DP analyzer {op.label!r} was not seeded from the grant")


# ---------------------------------------------------------------- the plan, made before any record is read


def trace_spend(
    preprocessing_fn: Callable[..., Any],
    feature_spec: Mapping[str, Any],
    custom_config: Mapping[str, Any],
    grant_seed: int,
) -> tuple[float, float, list[Any], Any]:
    """Trace the function once on placeholders (no data): (total epsilon, total delta, [Spend], graph digest)
    after checking its analyzers. The digest (SHA-256 of the traced graph, serialized deterministically) identifies the
    computation: the same function over the same schema traces to the same graph."""

    from tensorflow_transform import impl_helper

    from sage_tfx.transform import call_preprocessing_fn, noise_seed
    from sage_tfx.transform.budget import requested_spends

    try:
        with noise_seed(grant_seed):
            graph, _, _ = impl_helper.trace_preprocessing_function(
                lambda inputs: call_preprocessing_fn(preprocessing_fn, inputs, custom_config),
                feature_spec,
                use_tf_compat_v1=True,
            )
    except KeyError as exc:  # most often a feature the raw schema lacks
        raise TransformConfigError(
            f"the preprocessing_fn failed on key {exc.args[0]!r} while traced; the raw "
            f"features are {sorted(feature_spec)}"
        ) from exc
    check_traced_analyzers(graph)
    spends = requested_spends(graph)
    return (
        math.fsum(s.epsilon for s in spends),
        math.fsum(s.delta for s in spends),
        spends,
        computation_digest(canonical_graph_text(graph.as_graph_def())),
    )


def preprocessing_plan(
    exec_properties: Mapping[str, Any], grant: Grant, examples: Artifact, grant_seed: int
) -> dict[str, Any]:
    """Everything the run needs, checked against the verified grant before any record is read.

    Raises TransformConfigError / SchemaError (bad parameter), NonPrivateAnalyzer, BudgetExceeded (the
    function's own PreprocessingBudget) or GrantError (it spends more than the preprocessing share, in
    epsilon or in delta).
    """
    from sage_tfx.components.transform_utils import raw_feature_spec, schema_proto
    from sage_tfx.transform import budget_custom_config

    input_splits = artifact_utils.decode_split_names(examples.split_names)
    analyze, transform = parse_splits_config(exec_properties.get("splits_config"), input_splits)
    schema = raw_schema(exec_properties, grant)
    user_config = parse_custom_config(exec_properties.get("custom_config"))
    share, share_delta = stage_budget(grant, STAGE)
    # A zero share passes no budget: a function that asks for one then fails with MissingBudget.
    custom_config = budget_custom_config(share, user_config, delta=share_delta) if share > 0 else user_config
    preprocessing_fn = load_preprocessing_fn(exec_properties)
    spent, spent_delta, spends, graph_digest = trace_spend(
        preprocessing_fn, raw_feature_spec(schema), custom_config, grant_seed
    )
    trace = check_reference_trace(preprocessing_fn, custom_config, schema, spends)
    require_budget(grant, STAGE, spent, spent_delta)
    computation = computation_digest("DPTransform/v1", graph_digest, custom_config, analyze, _analyzer_list(spends))
    return {
        "preprocessing_fn": preprocessing_fn,
        "custom_config": custom_config,
        "schema": schema_proto(schema),
        "analyze": analyze,
        "transform": transform,
        "share": share,
        "share_delta": share_delta,
        "epsilon": spent,
        "delta": spent_delta,
        "spends": spends,
        "computation": computation,
        "trace": trace,
        "kinds": schema,
    }


def check_reference_trace(
    preprocessing_fn: Callable[..., Any], custom_config: dict[str, Any], schema: dict[str, str], spends: Sequence[Any]
) -> Any:
    """Trace the function again as tf.Transform will (TF2 mode, no data), check that this trace spends what the
    planning trace spent and that it transforms each row on its own (``trace_check.check_row_local`` on
    synthetic rows), and return its signature: every trace tf.Transform makes is compared with it
    (``trace_check.TracedFn``). Raises TraceMismatch or RowMixing before any record is read."""
    from sage_tfx.transform.errors import TraceMismatch
    from sage_tfx.transform.trace_check import check_row_local, reference_trace

    signature, concrete = reference_trace(preprocessing_fn, custom_config, schema)
    planned = tuple((s.analyzer, s.epsilon, s.delta) for s in spends)
    if signature.spends != planned:
        raise TraceMismatch(
            f"the preprocessing_fn spent {list(signature.spends)} when traced again, but "
            f"{list(planned)} when DPTransform planned it: tf.Transform calls it several times, and "
            "each call must build the same computation (remove counters or global flags)"
        )
    check_row_local(concrete, schema)
    return signature


def _analyzer_list(spends):
    """[[analyzer, epsilon], ...], with the delta as a third entry where an analyzer spends one (so a plan
    without a DP vocabulary keeps the fingerprint it had before deltas were recorded)."""
    return [[s.analyzer, s.epsilon] + ([s.delta] if s.delta else []) for s in spends]


# ---------------------------------------------------------------- outputs


def _spend_record(grant, plan):
    return {
        "grant_id": grant.id,
        "stream": grant.stream,
        "epsilon": plan["epsilon"],
        "delta": plan["delta"],
        "preprocessing_share": plan["share"],
        "preprocessing_delta_share": plan["share_delta"],
        "analyzers": _analyzer_list(plan["spends"]),
        "analyze_splits": plan["analyze"],
        "transform_splits": plan["transform"],
        "composition": "basic (sum over the DP analyzers)",
        "computation": plan["computation"],
    }


def record_spend(artifact: Artifact, record: Mapping[str, Any]) -> None:
    artifact.set_string_custom_property("grant_id", record["grant_id"])
    artifact.set_string_custom_property(COMPUTATION_PROPERTY, record["computation"])
    artifact.set_float_custom_property("preprocessing_epsilon", record["epsilon"])
    # MLMD's SQLite store keeps ~6 decimals of a double: the exact figures as JSON.
    artifact.set_string_custom_property("privacy_spent", json.dumps(record, sort_keys=True))


def copy_lineage(source: Artifact, target: Artifact) -> None:
    for key in _STRING_LINEAGE:
        if source.has_custom_property(key):
            target.set_string_custom_property(key, source.get_string_custom_property(key))
    for key in _NUMBER_LINEAGE:
        if source.has_custom_property(key):
            value = source.get_custom_property(key)
            if isinstance(value, int):
                target.set_int_custom_property(key, value)
            else:
                target.set_float_custom_property(key, float(value))


class _EncodeExamples:
    """(RecordBatch, passthrough) -> serialized tf.Examples of the transformed schema (as TFX's Transform)."""

    def __init__(self, schema_bytes) -> None:
        self._schema_bytes = schema_bytes
        self._encoder = None

    def __call__(self, batch_and_passthrough):
        if self._encoder is None:
            from tensorflow_metadata.proto.v0 import schema_pb2
            from tfx_bsl.coders import example_coder

            self._encoder = example_coder.RecordBatchToExamplesEncoder(schema_pb2.Schema.FromString(self._schema_bytes))
        record_batch, _ = batch_and_passthrough
        return self._encoder.encode(record_batch)

    def __getstate__(self):
        return {"_schema_bytes": self._schema_bytes, "_encoder": None}


class Executor(GrantedExecutor, base_beam_executor.BaseBeamExecutor):
    def Do(
        self,
        input_dict: dict[str, list[Artifact]],
        output_dict: dict[str, list[Artifact]],
        exec_properties: dict[str, Any],
    ) -> None:
        # The one door (one ledger connection for the run): grant, provenance, analyzers and budget are all
        # checked before a record is read.
        with self.CheckGrant(exec_properties, stream=exec_properties.get("stream") or None) as run:
            self._run(run, input_dict, output_dict, exec_properties)

    def _run(self, run, input_dict, output_dict, exec_properties):
        grant = run.grant
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        run.check_read_under(examples, "preprocess only data the grant covers")
        run.check_examples_data(examples, "DPTransform")
        # The plan traces the function with a placeholder seed: no seed enters the traced graph, so the
        # fingerprint is the same, and the grant's seed is handed out only once the release is open.
        with stdout_to_stderr():  # a packaged module is pip-installed here (pipelines/_runner.py stage_user_modules)
            plan = preprocessing_plan(exec_properties, grant, examples, PLANNING_SEED)
        # ... of these records: the grant's blocks, split by its signed rule, the analyze splits.
        plan["computation"] = computation_digest(plan["computation"], run.release_data(plan["analyze"]))
        # One release per grant: a different preprocessing_fn (another traced graph) under this grant is
        # refused here, before the analysis draws any noise.
        grant_seed = run.open_release(STAGE, plan["computation"], plan["epsilon"], plan["delta"])

        graph = artifact_utils.get_single_instance(output_dict["transform_graph"])
        transformed = artifact_utils.get_single_instance(output_dict["transformed_examples"])
        wheels = self._stage_module_wheel(exec_properties)
        with self._local_worker_path(wheels):
            self._run_transform(examples, graph, transformed, plan, grant_seed)

        from tfx.components.util import examples_utils
        from tfx.proto import example_gen_pb2

        examples_utils.set_payload_format(transformed, example_gen_pb2.PayloadFormat.FORMAT_TF_EXAMPLE)
        examples_utils.set_file_format(transformed, "tfrecords_gzip")
        copy_lineage(examples, transformed)
        record = _spend_record(grant, plan)
        record_spend(graph, record)
        record_spend(transformed, record)

    def _stage_module_wheel(self, exec_properties):
        """A module packaged as a wheel (``module_path`` MODULE@WHEEL, as TFX's Transform gets it: see
        pipelines/_runner.py ``stage_user_modules``) travels with the Beam job (``--extra_package``), so the
        workers import it by name; docs/scale_out.md, "PortableRunner with an external worker pool"."""
        from tfx.components.util import udf_utils
        from tfx.utils import io_utils

        _, wheels = udf_utils.decode_user_module_key(exec_properties.get("module_path"))
        wheels = [io_utils.ensure_local(wheel) for wheel in wheels]
        for wheel in wheels:
            flag = f"--extra_package={wheel}"
            if flag not in self._beam_pipeline_args:
                self._beam_pipeline_args.append(flag)
        return wheels

    @contextlib.contextmanager
    def _local_worker_path(self, wheels):
        """On the DirectRunner's multi_processing mode the workers are subprocesses of this process, which install
        nothing a job stages: the wheels are installed into a temporary folder on PYTHONPATH while the job runs
        (TFX's ``udf_utils.TempPipInstallContext``, as TFX's Transform does), so the workers find the module."""
        from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
        from tfx.components.util import udf_utils

        mode = PipelineOptions(list(self._beam_pipeline_args)).view_as(DirectOptions).direct_running_mode
        if not wheels or mode != "multi_processing":
            yield
            return
        context = udf_utils.TempPipInstallContext(list(wheels))
        with stdout_to_stderr():  # pip's output
            context.__enter__()
        try:
            yield
        finally:
            context.__exit__(None, None, None)

    def _run_transform(self, examples, graph, transformed, plan, grant_seed):
        import apache_beam as beam
        import tensorflow as tf
        import tensorflow_transform as tft
        import tensorflow_transform.beam as tft_beam
        from tfx_bsl.public import tfxio

        from sage_tfx.transform import noise_seed
        from sage_tfx.transform.trace_check import TracedFn

        # Every trace tf.Transform makes is compared with the checked one (refused if it differs).
        preprocessing_fn = TracedFn(plan["preprocessing_fn"], plan["custom_config"], plan["kinds"], plan["trace"])

        def source(split):
            pattern = os.path.join(artifact_utils.get_split_uri([examples], split), "*")
            return tfxio.TFExampleRecord(
                pattern, schema=plan["schema"], telemetry_descriptors=["sage_tfx", "DPTransform"]
            )

        transformed.split_names = artifact_utils.encode_split_names(plan["transform"])
        temp_dir = os.path.join(graph.uri, TEMP_DIR)
        try:
            with self._make_beam_pipeline() as pipeline:
                # tf.Transform traces the function here, at construction: each analyzer then fixes its seed.
                with tft_beam.Context(temp_dir=temp_dir), noise_seed(grant_seed):
                    adapter_config = source(plan["analyze"][0]).TensorAdapterConfig()
                    analyze = [pipeline | f"ReadAnalyze[{s}]" >> source(s).BeamSource() for s in plan["analyze"]]
                    analyze = analyze[0] if len(analyze) == 1 else analyze | "FlattenAnalyze" >> beam.Flatten()
                    transform_fn = (analyze, adapter_config) | "Analyze" >> tft_beam.AnalyzeDataset(preprocessing_fn)
                    _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(graph.uri)
                    _ = tft.DatasetMetadata(plan["schema"]) | "WriteRawMetadata" >> tft_beam.WriteMetadata(
                        os.path.join(graph.uri, tft.TFTransformOutput.RAW_METADATA_DIR), pipeline
                    )
                    encode = _EncodeExamples(transform_fn[1].schema.SerializeToString())
                    for split in plan["transform"]:
                        data = pipeline | f"ReadTransform[{split}]" >> source(split).BeamSource()
                        rows, _ = (
                            (data, adapter_config),
                            transform_fn,
                        ) | f"Transform[{split}]" >> tft_beam.TransformDataset(output_record_batches=True)
                        out = os.path.join(
                            artifact_utils.get_split_uri([transformed], split), TRANSFORMED_EXAMPLES_PREFIX
                        )
                        _ = (
                            rows
                            | f"Encode[{split}]" >> beam.FlatMap(encode)
                            | f"Write[{split}]" >> beam.io.WriteToTFRecord(out, file_name_suffix=".gz")
                        )
        finally:  # the job's temporary files, also after a refused trace (a leftover is harmless)
            try:
                if tf.io.gfile.exists(temp_dir):
                    tf.io.gfile.rmtree(temp_dir)
            except tf.errors.OpError:
                pass
