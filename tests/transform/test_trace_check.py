"""The checked trace of a preprocessing_fn: row-local outside the DP analyzers (synthetic batches), and
every later trace compared with it (sage_tfx/transform/trace_check.py).

DPTransform runs these checks before any record is read (tests/components/test_dp_transform_component.py runs them
through the executor); here each rule is exercised on the checks themselves, on placeholders and synthetic
rows only.
"""

import importlib.util
import os

import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)

pytestmark = pytest.mark.tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = {"miles": "float", "hour": "int", "company": "bytes"}
EPS = 0.5


def _plan(fn, schema=SCHEMA, delta=0.0):
    """What DPTransform's plan does: the planning trace, then the checked (reference) trace."""
    from sage_tfx.components.dp_transform_executor import check_reference_trace, trace_spend
    from sage_tfx.components.transform_utils import raw_feature_spec
    from sage_tfx.transform import budget_custom_config

    config = budget_custom_config(EPS, delta=delta)
    _, _, spends, _ = trace_spend(fn, raw_feature_spec(schema), config, 0)
    return check_reference_trace(fn, config, schema, spends)


def _dense(inputs):
    import tensorflow as tf

    from sage_tfx.components.transform_utils import fill_in_missing

    return (
        fill_in_missing(inputs["miles"], 0.0),
        tf.clip_by_value(fill_in_missing(inputs["hour"], 0), 0, 23),
        fill_in_missing(inputs["company"], ""),
    )


def _row_local_fns():
    import tensorflow as tf

    from sage_tfx.transform import (
        apply_public_vocabulary,
        dp_compute_and_apply_vocabulary,
        dp_group_by_mean,
        dp_histogram,
        dp_scale_to_z_score,
        one_hot,
    )

    def per_row(inputs, custom_config):
        miles, hour, company = _dense(inputs)
        w = tf.constant([[1.0, 2.0, 3.0]])
        return {
            "proj": tf.matmul(tf.stack([miles, miles * 2, miles - 1], axis=1), tf.transpose(w)),
            "hot": one_hot(apply_public_vocabulary(company, ["a", "b"]), 3),
            "sum_over_features": tf.reduce_sum(tf.stack([miles, tf.cast(hour, tf.float32)], axis=1), axis=1),
            "sparse": inputs["miles"],
            "hour": hour,
        }

    def analyzers(inputs, custom_config):
        miles, hour, company = _dense(inputs)
        eps = custom_config["sage"]["preprocessing_epsilon"] / 4
        delta = custom_config["sage"]["preprocessing_delta"]
        counts = dp_histogram(hour, eps, num_buckets=24)
        return {
            "speed": dp_group_by_mean(hour, miles, 24, eps, 100.0),
            "z": dp_scale_to_z_score(miles, eps, 100.0),
            "company": dp_compute_and_apply_vocabulary(company, eps, delta),
            # post-processing of a released table, reduced over the TABLE's axis: not a batch reduction
            "share": tf.gather(counts / tf.maximum(tf.reduce_sum(counts), 1.0), hour),
        }

    return {"per-row ops": per_row, "DP analyzers and their post-processing": analyzers}


@pytest.mark.parametrize("name", ["per-row ops", "DP analyzers and their post-processing"])
def test_row_local_functions_pass(name):
    signature = _plan(_row_local_fns()[name], delta=1e-7)
    assert all(dp for _, dp in signature.analyzers)


def _shipped(path):
    spec = importlib.util.spec_from_file_location(f"shipped_{abs(hash(path))}", os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.preprocessing_fn


@pytest.mark.parametrize(
    "path",
    [
        "examples/taxi_preprocessing.py",
        "examples/taxi_fare/preprocessing.py",
        "pipelines/modules/taxi_preprocessing.py",
        "examples/flights/preprocessing.py",
    ],
)
def test_the_shipped_preprocessing_fns_pass(path):
    from sage_tfx.data.flights import FLIGHTS_SCHEMA
    from sage_tfx.data.taxi import TAXI_SCHEMA

    schema = FLIGHTS_SCHEMA if "flights" in path else TAXI_SCHEMA
    kinds = {name: "bytes" if kind == "string" else kind for name, kind in schema.items()}
    assert _plan(_shipped(path), kinds).spends


def _mixing_fns():
    import tensorflow as tf

    from sage_tfx.transform import dp_mean

    def centred(inputs, custom_config):
        miles, _, _ = _dense(inputs)
        return {"centred": miles - tf.reduce_mean(miles)}

    def per_batch_size(inputs, custom_config):
        miles, _, _ = _dense(inputs)
        return {"per_batch": miles / tf.cast(tf.shape(miles)[0], tf.float32)}

    def rank(inputs, custom_config):
        miles, _, _ = _dense(inputs)
        return {"rank": tf.argsort(tf.argsort(miles))}

    def previous_row(inputs, custom_config):
        miles, _, _ = _dense(inputs)
        return {"delta": miles - tf.roll(miles, 1, axis=0)}

    def batch_gram(inputs, custom_config):
        miles, _, _ = _dense(inputs)
        column = tf.reshape(miles, [-1, 1])
        return {
            "gram": tf.reshape(tf.matmul(tf.matmul(column, column, transpose_a=True), column, transpose_b=True), [-1])
        }

    def batch_sum_into_dp_mean(inputs, custom_config):  # every row carries the batch total into the analyzer
        miles, _, _ = _dense(inputs)
        return {"m": dp_mean(tf.reduce_sum(miles) + 0.0 * miles, EPS, 100.0) + 0.0 * miles}

    def random(inputs, custom_config):
        miles, _, _ = _dense(inputs)
        return {"noisy": miles + tf.random.uniform(tf.shape(miles))}

    return {
        "centred": (centred, "output 'centred' changes with the other rows"),
        "per batch size": (per_batch_size, "output 'per_batch' changes with the other rows"),
        "rank": (rank, "output 'rank' changes with the other rows"),
        "previous row": (previous_row, "output 'delta' changes with the other rows"),
        "batch gram": (batch_gram, "output 'gram' changes with the other rows"),
        "batch sum into dp_mean": (batch_sum_into_dp_mean, "input 'add:0' of the DP analyzer 'dp_mean' changes"),
        "random": (random, "differs between two runs of the same synthetic batch"),
    }


@pytest.mark.parametrize(
    "name", ["centred", "per batch size", "rank", "previous row", "batch gram", "batch sum into dp_mean", "random"]
)
def test_row_mixing_is_refused_naming_the_output(name):
    from sage_tfx.transform.errors import RowMixing

    fn, message = _mixing_fns()[name]
    with pytest.raises(RowMixing, match=message):
        _plan(fn)


def test_a_function_that_changes_after_the_planning_trace_is_refused():
    """The planning trace calls dp_mean, every later one the exact tft.mean (a counter in the function)."""
    import tensorflow_transform as tft

    from sage_tfx.transform import dp_mean
    from sage_tfx.transform.errors import TraceMismatch

    calls = []

    def switches(inputs, custom_config):
        calls.append(1)
        miles, _, _ = _dense(inputs)
        return {"centred": miles - (dp_mean(miles, EPS, 100.0) if len(calls) == 1 else tft.mean(miles))}

    with pytest.raises(TraceMismatch, match="'ExtractCombineMergeOutputs\\[mean#mean_and_var\\]'.*not differentially"):
        _plan(switches)


def test_every_later_trace_is_compared_with_the_checked_one():
    """TracedFn (what tf.Transform calls) refuses a trace whose operations, constants or spends differ."""
    import tensorflow as tf

    from sage_tfx.transform import dp_mean
    from sage_tfx.transform.errors import TraceMismatch
    from sage_tfx.transform.trace_check import TracedFn, reference_trace, type_specs

    state = {"mode": "plain"}

    def fn(inputs, custom_config):
        miles, _, _ = _dense(inputs)
        out = {"m": dp_mean(miles, EPS if state["mode"] != "spend" else EPS / 2, 100.0) + 0.0 * miles}
        if state["mode"] == "centred":
            out["x"] = miles - tf.reduce_mean(miles)
        elif state["mode"] == "constant":
            out["x"] = miles * 3.0
        else:
            out["x"] = miles * 2.0
        return out

    specs = type_specs(SCHEMA)
    expected, _ = reference_trace(fn, {}, SCHEMA)
    traced = TracedFn(fn, {}, SCHEMA, expected)

    def trace():  # as tf.Transform traces it for its analysis
        from tensorflow_transform import annotators, graph_context, impl_helper

        context = graph_context.TFGraphContext(module_to_export=tf.Module(), temp_dir=None, evaluated_replacements=None)
        with annotators.object_tracker_scope(annotators.ObjectTracker()):
            impl_helper.get_traced_transform_fn(traced, specs, context).get_concrete_function()

    trace()  # the same function traces to the same signature
    for mode, message in (
        ("centred", r"ops: \[\('Mean', 1\)"),
        ("constant", "constants: 1 added, 1 gone"),
        ("spend", r"spends: \[\('dp_mean', 0.25"),
    ):
        state["mode"] = mode
        with pytest.raises(TraceMismatch, match=message):
            trace()


def test_tf_transform_runs_an_honest_multi_phase_function_through_every_check(tmp_path, monkeypatch):
    """Every trace tf.Transform makes of an ordinary function passes: its budget helper, a DP vocabulary, a DP
    scaler, and a second-phase analyzer whose input depends on a released mean (traced once more per phase in a
    Beam step, with the released values as constants, and checked there against a check trace on synthetic
    rows)."""
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    from sage_tfx.transform import (
        PreprocessingBudget,
        budget_custom_config,
        dp_compute_and_apply_vocabulary,
        dp_mean,
        dp_scale_to_z_score,
        noise_seed,
        trace_check,
    )
    from sage_tfx.transform.trace_check import TracedFn, check_row_local, reference_trace

    checked_in_beam = []  # the row checks of the traces made with released values as constants
    monkeypatch.setattr(trace_check, "check_row_local", lambda *a: checked_in_beam.append(check_row_local(*a)))

    def fn(inputs, custom_config):
        budget = PreprocessingBudget.from_custom_config(custom_config)
        eps_mean, eps_spread, eps_vocab, eps_z = budget.split(4)
        miles, _, company = _dense(inputs)
        mean = dp_mean(miles, eps_mean, 10.0)
        spread = dp_mean(tf.abs(miles - mean), eps_spread, 10.0, name="spread")  # second phase
        return {
            "c": (miles - mean) / (spread + 1.0),
            "z": dp_scale_to_z_score(miles, eps_z, 10.0),
            "id": dp_compute_and_apply_vocabulary(company, eps_vocab, budget.delta),
        }

    kinds = {"miles": "float", "hour": "int", "company": "bytes"}
    config = budget_custom_config(EPS, delta=1e-7)
    expected, concrete = reference_trace(fn, config, kinds)
    check_row_local(concrete, kinds)
    spec = {
        "miles": tf.io.VarLenFeature(tf.float32),
        "hour": tf.io.VarLenFeature(tf.int64),
        "company": tf.io.VarLenFeature(tf.string),
    }
    rows = [{"miles": [float(i % 7)], "hour": [i % 24], "company": [b"a" if i % 3 else b"b"]} for i in range(300)]
    with tft_beam.Context(temp_dir=str(tmp_path)), noise_seed(5):
        (data, _), _ = (rows, tft.DatasetMetadata.from_feature_spec(spec)) | tft_beam.AnalyzeAndTransformDataset(
            TracedFn(fn, config, kinds, expected)
        )
    assert len(data) == 300 and {r["id"] for r in data} == {0, 1}
    # phase 2's analyzer inputs (the mean released), the transform graph and its schema (everything released)
    assert len(checked_in_beam) >= 3
