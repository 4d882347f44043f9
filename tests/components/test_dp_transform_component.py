"""DPTransform: refusals before any record is read, noise once per key seeded by the grant, TFX layout,
and the component in real TFX pipelines (BlockExampleGen -> DPTransform) on LocalDagRunner and BeamDagRunner.

Data: the real Chicago taxi trips of the tfx wheel (15,002), ingested into a ledger in 30-day blocks; every
grant covers all blocks. The preprocessing_fn is examples/taxi_preprocessing.py (the paper's List. 1).
"""

import json
import os
import shutil
import sqlite3
import textwrap

import numpy as np
import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.privacy import GrantError, Ledger
from sage_tfx.transform import BudgetExceeded, MissingBudget
from tests.helpers.taxi_world import block_examples as _block_examples
from tests.helpers.taxi_world import ingest_taxi, relabelled

pytestmark = pytest.mark.tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAXI_MODULE = os.path.join(ROOT, "examples", "taxi_preprocessing.py")
PRE_EPS = 0.5
SPLIT = {
    "preprocessing": PRE_EPS,
    "count": 0.0,
    "training": 1.0,
    "validation": 1.0,
    "delta": 1e-6,
    "rule": "pre+count+max(train+reject,val)",
}
SMALL_SPLIT = dict(SPLIT, preprocessing=0.05)
VOCAB_DELTA = 1e-7
VOCAB_SPLIT = dict(SPLIT, preprocessing_delta=VOCAB_DELTA)  # preprocessing has a delta: DP vocabularies run
HOURS = 24


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dptx")
    db, data = str(root / "ledger.db"), str(root / "data")
    ledger = Ledger.open(db, create=True)
    ledger.create_stream("taxi", 100.0, 1e-4, max_epsilon=100.0)
    ingest_taxi(ledger, data, "simple")
    blocks = [b.id for b in ledger.blocks("taxi")]

    def grant(split):
        charge = split["preprocessing"] + max(split["training"], split["validation"])
        return ledger.request(
            "p1",
            "taxi",
            blocks=blocks,
            epsilon=charge,
            delta=split["delta"] + split.get("preprocessing_delta", 0.0),
            meta={"split": split},
        )

    grants = {
        "a": grant(SPLIT),
        "b": grant(SPLIT),
        "small": grant(SMALL_SPLIT),
        "traced": grant(SPLIT),
        "mixed5": grant(SPLIT),
        "mixed6": grant(SPLIT),
        "zero": grant(dict(SPLIT, preprocessing=0.0)),
        "vocab": grant(VOCAB_SPLIT),
    }
    # A copy of the ledger (same secret) charges a grant the real ledger never charged.
    with sqlite3.connect(db) as src, sqlite3.connect(str(root / "copy.db")) as dst:
        src.backup(dst)
    shutil.copy(f"{db}.key", root / "copy.db.key")  # the same key beside it (its own head file); mode 0600 kept
    shutil.copy(f"{db}.key.head", root / "copy.db.key.head")  # a copy goes with its head (Ledger.open checks it)
    with Ledger.open(str(root / "copy.db")) as copy:
        grants["unknown"] = copy.request(
            "p1", "taxi", blocks=blocks[:2], epsilon=1.5, delta=SPLIT["delta"], meta={"split": SPLIT}
        )
    yield dict(root=root, db=db, data=data, ledger=ledger, grants=grants)
    ledger.close()


@pytest.fixture(scope="module")
def examples(world):
    """BlockExampleGen's output under a grant of ``world``, made on first use. A grant with grant a's blocks and
    meta (its split, so its record split) reads the same records (the same ``data_digest``): its output is grant
    a's, marked as read under it (``relabelled``), as BlockExampleGen would write it again."""
    made = {}

    def get(key):
        if key not in made:
            grant, a = world["grants"][key], world["grants"]["a"]
            if key != "a" and (grant.blocks, grant.meta) == (a.blocks, a.meta):
                made[key] = relabelled(get("a"), grant)
            else:
                made[key] = _block_examples(world["db"], world["data"], grant, world["root"] / f"examples_{key}")
        return made[key]

    return get


def _run(world, tmp_path, grant, examples, **params):
    """Run the executor directly; return (transform_graph, transformed_examples)."""
    from tfx.types import standard_artifacts

    from sage_tfx.components.dp_transform_executor import Executor

    graph, transformed = standard_artifacts.TransformGraph(), standard_artifacts.Examples()
    graph.uri, transformed.uri = str(tmp_path / "transform_graph"), str(tmp_path / "transformed_examples")
    os.makedirs(graph.uri, exist_ok=True)
    os.makedirs(transformed.uri, exist_ok=True)
    props = {"grant": grant, "ledger": world["db"], "module_file": TAXI_MODULE, "data_root": world["data"]}
    props.update(params)
    Executor().Do({"examples": [examples]}, {"transform_graph": [graph], "transformed_examples": [transformed]}, props)
    return graph, transformed


# ------------------------------------------------------------------ reading outputs


def _records(folder):
    import tensorflow as tf

    files = sorted(os.path.join(folder, f) for f in os.listdir(folder))
    return [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]


def _transformed(graph_uri, transformed, split):
    """{feature: np.array} of one split of the transformed examples, parsed with the graph's output spec."""
    import tensorflow as tf
    import tensorflow_transform as tft

    spec = tft.TFTransformOutput(graph_uri).transformed_feature_spec()
    folder = os.path.join(transformed.uri, f"Split-{split}")
    assert all(f.startswith("transformed_examples") and f.endswith(".gz") for f in os.listdir(folder))
    parsed = tf.io.parse_example(_records(folder), spec)
    return {k: v.numpy() for k, v in parsed.items()}


def _table(columns):
    """{hour: the single hour_of_day_speed every row of that hour got} (asserts it is single)."""
    table = {}
    for hour, speed in zip(columns["hour_of_day"], columns["hour_of_day_speed"]):
        table.setdefault(int(hour), set()).add(float(speed))
    assert all(len(v) == 1 for v in table.values()), {h: len(v) for h, v in table.items()}
    return {h: v.pop() for h, v in table.items()}


def _raw_train(examples):
    """(hour, miles, seconds) arrays of the raw train records, missing values filled as the module does."""
    import tensorflow as tf

    folder = os.path.join(examples.uri, "Split-train")
    spec = {
        "trip_start_hour": tf.io.FixedLenFeature([], tf.int64, 0),
        "trip_miles": tf.io.FixedLenFeature([], tf.float32, 0.0),
        "trip_seconds": tf.io.FixedLenFeature([], tf.int64, 0),
    }
    parsed = tf.io.parse_example(_records(folder), spec)
    return (
        parsed["trip_start_hour"].numpy(),
        parsed["trip_miles"].numpy().astype(np.float64),
        parsed["trip_seconds"].numpy().astype(np.float64),
    )


def _served_table(graph_uri):
    """hour_of_day_speed for hours 0..23 through the transform graph (as at serving), from new raw records."""
    import tensorflow as tf
    import tensorflow_transform as tft

    out = tft.TFTransformOutput(graph_uri)
    records = []
    for hour in range(HOURS):
        ex = tf.train.Example()
        ex.features.feature["trip_start_hour"].int64_list.value.append(hour)
        ex.features.feature["trip_miles"].float_list.value.append(2.0)
        ex.features.feature["trip_seconds"].int64_list.value.append(600)
        records.append(ex.SerializeToString())
    raw = tf.io.parse_example(records, out.raw_feature_spec())
    result = out.transform_raw_features(raw)
    return dict(zip(range(HOURS), result["hour_of_day_speed"].numpy().astype(float).tolist()))


def _spent(artifact):
    return json.loads(artifact.get_string_custom_property("privacy_spent"))


# ------------------------------------------------------------------ transform_utils


def test_fill_in_missing_and_schema():
    import tensorflow as tf

    from sage_tfx.components.transform_utils import SchemaError, fill_in_missing, parse_schema, raw_feature_spec

    # rows 0 and 2 have a value, row 1 none, row 3 two values (the first is kept)
    x = tf.SparseTensor(indices=[[0, 0], [2, 0], [3, 0], [3, 1]], values=[5, 7, 8, 9], dense_shape=[4, 2])
    assert fill_in_missing(x, -1).numpy().tolist() == [5, -1, 7, 8]
    empty = tf.SparseTensor(indices=tf.zeros([0, 2], tf.int64), values=tf.zeros([0], tf.float32), dense_shape=[3, 0])
    assert fill_in_missing(empty, 0.5).numpy().tolist() == [0.5, 0.5, 0.5]
    words = tf.SparseTensor(indices=[[1, 0]], values=["a"], dense_shape=[2, 1])
    assert fill_in_missing(words, "").numpy().tolist() == [b"", b"a"]
    assert fill_in_missing(tf.constant([[1.0], [2.0]]), 0.0).numpy().tolist() == [1.0, 2.0]
    with pytest.raises(SchemaError, match="default_value 0"):
        fill_in_missing(words, 0)
    spec = raw_feature_spec({"a": "int", "b": "float", "c": "bytes"})
    assert [(type(v).__name__, v.dtype) for v in spec.values()] == [
        ("VarLenFeature", tf.int64),
        ("VarLenFeature", tf.float32),
        ("VarLenFeature", tf.string),
    ]
    for bad, message in (('{"a": "str"}', "'str'"), ("[1]", r"\[1\]"), ("{", "not JSON"), ({}, "non-empty")):
        with pytest.raises(SchemaError, match=message):
            parse_schema(bad)


# ------------------------------------------------------------------ refusals, before any record is read


def _module(tmp_path, name):
    """A module file holding MODULES[name] (one file per module: the loader caches by path)."""
    body = MODULES[name]
    path = tmp_path / f"module_{abs(hash(name))}.py"
    path.write_text(
        "import sage_tfx\nimport tensorflow as tf\nimport tensorflow_transform as tft\n"
        "from sage_tfx.transform import PreprocessingBudget, dp_group_by_mean, dp_mean\n"
        "from sage_tfx.components.transform_utils import fill_in_missing\n\n" + textwrap.dedent(body)
    )
    return str(path)


HOUR_SPEED = """
    def _hour_speed(inputs):
        hour = tf.clip_by_value(fill_in_missing(inputs["trip_start_hour"], 0), 0, 23)
        return hour, fill_in_missing(inputs["trip_miles"], 0.0)
"""
MODULES = {
    "hard-coded 0.1": HOUR_SPEED
    + """
    def preprocessing_fn(inputs):  # TFX's one-argument form, epsilon written in the code
        hour, miles = _hour_speed(inputs)
        return {"s": dp_group_by_mean(hour, miles, 24, 0.1, 100.0)}
""",
    "asks twice its budget": HOUR_SPEED
    + """
    def preprocessing_fn(inputs, custom_config):
        budget = PreprocessingBudget.from_custom_config(custom_config)
        hour, miles = _hour_speed(inputs)
        return {"s": dp_group_by_mean(hour, miles, 24, 2 * budget.epsilon, 100.0)}
""",
    "exact tft.mean": HOUR_SPEED
    + """
    def preprocessing_fn(inputs, custom_config):
        hour, miles = _hour_speed(inputs)
        return {"s": dp_mean(miles, 0.1, 100.0) + 0 * miles, "centred": miles - tft.mean(miles)}
""",
    "own seed": HOUR_SPEED
    + """
    def preprocessing_fn(inputs, custom_config):
        hour, miles = _hour_speed(inputs)
        return {"s": dp_group_by_mean(hour, miles, 24, 0.1, 100.0, seed=1)}
""",
    # Each call of the function is a trace: DPTransform plans on the first, tf.Transform traces it again.
    "tft.mean after the planning trace": HOUR_SPEED
    + """
    CALLS = []

    def preprocessing_fn(inputs, custom_config):
        CALLS.append(1)
        hour, miles = _hour_speed(inputs)
        mean = dp_mean(miles, 0.5, 100.0) if len(CALLS) == 1 else tft.mean(miles)
        return {"centred": miles - mean}
""",
    "row mixing after the checked trace": HOUR_SPEED
    + """
    CALLS = []

    def preprocessing_fn(inputs, custom_config):
        CALLS.append(1)
        hour, miles = _hour_speed(inputs)
        centred = miles - tf.reduce_mean(miles) if len(CALLS) > 2 else miles - 0.0
        return {"s": dp_group_by_mean(hour, miles, 24, 0.1, 100.0), "centred": centred}
""",
    # Calls 1-4: DPTransform's plan and tf.Transform's traces while the pipeline is built; 5: tf.Transform's trace
    # for the analyzers' inputs, in a Beam step; 6: the transform graph's, in a Beam step after the analysis.
    **{
        f"row mixing from call {n}": HOUR_SPEED
        + f"""
    CALLS = []

    def preprocessing_fn(inputs, custom_config):
        CALLS.append(1)
        hour, miles = _hour_speed(inputs)
        centred = miles - tf.reduce_mean(miles) if len(CALLS) >= {n} else miles - 0.0
        return {{"s": dp_group_by_mean(hour, miles, 24, 0.1, 100.0), "centred": centred}}
"""
        for n in (5, 6)
    },
    "batch-centred": HOUR_SPEED
    + """
    def preprocessing_fn(inputs, custom_config):
        hour, miles = _hour_speed(inputs)
        return {"s": dp_group_by_mean(hour, miles, 24, 0.1, 100.0), "centred": miles - tf.reduce_mean(miles)}
""",
    "batch total into the analyzer": HOUR_SPEED
    + """
    def preprocessing_fn(inputs, custom_config):
        hour, miles = _hour_speed(inputs)
        return {"s": dp_group_by_mean(hour, tf.reduce_sum(miles) + 0.0 * miles, 24, 0.1, 100.0)}
""",
    "vocabulary, delta written in the code": """
    from sage_tfx.transform import dp_compute_and_apply_vocabulary

    def preprocessing_fn(inputs):
        return {"c": dp_compute_and_apply_vocabulary(fill_in_missing(inputs["company"], ""), 0.1, 1e-6)}
""",
    "vocabulary from the budget": """
    from sage_tfx.transform import dp_compute_and_apply_vocabulary

    def preprocessing_fn(inputs, custom_config):
        budget = PreprocessingBudget.from_custom_config(custom_config)
        eps_company, eps_payment = budget.split(2)
        delta_company, delta_payment = budget.split_delta(weights=[3, 1])
        return {"company": dp_compute_and_apply_vocabulary(fill_in_missing(inputs["company"], ""), eps_company,
                                                           delta_company, num_oov_buckets=1),
                "payment": dp_compute_and_apply_vocabulary(fill_in_missing(inputs["payment_type"], ""),
                                                           eps_payment, delta_payment, num_oov_buckets=1),
                "payment_raw": fill_in_missing(inputs["payment_type"], "")}
""",
}


def _unreadable_examples(tmp_path, grant_id, world=None):
    """An Examples artifact whose records are garbage: reading any of them fails with another error. With
    ``world``, it carries BlockExampleGen's lineage for the world's grant ``grant_id`` (its split rule and data
    digest), so only the refusal under test stops the run."""
    from tfx.types import standard_artifacts

    from sage_tfx.components._grant import data_digest

    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "garbage_examples")
    for split in ("train", "eval"):
        os.makedirs(os.path.join(examples.uri, f"Split-{split}"))
        with open(os.path.join(examples.uri, f"Split-{split}", "data_tfrecord-00000-of-00001.gz"), "wb") as f:
            f.write(b"not a gzip file, not a TFRecord")
    examples.split_names = json.dumps(["train", "eval"])
    examples.set_string_custom_property("grant_id", grant_id)
    grant = next((g for g in (world or {}).get("grants", {}).values() if g.id == grant_id), None)
    if grant is not None and grant.id != world["grants"]["unknown"].id:
        examples.set_string_custom_property("split_rule", json.dumps({"train": 9, "eval": 1}))
        examples.set_string_custom_property("data_digest", data_digest(world["ledger"], grant))
    return examples


def _refusal(world, tmp_path, case):
    from sage_tfx.components.dp_transform_executor import NonPrivateAnalyzer, TransformConfigError
    from sage_tfx.transform.errors import RowMixing, TraceMismatch

    g = world["grants"]
    forged = json.loads(g["a"].to_json())
    forged["meta"]["split"]["preprocessing"] = 5.0  # altered after signing
    cases = {  # name: (grant JSON, examples read under, params, error, message)
        "no grant": (None, g["a"].id, {}, GrantError, "no grant given"),
        "forged grant": (json.dumps(forged), g["a"].id, {}, GrantError, "forged"),
        "unknown grant": (g["unknown"].to_json(), g["unknown"].id, {}, GrantError, "unknown to this ledger"),
        "examples of another grant": (g["a"].to_json(), g["b"].id, {}, GrantError, "read under grant"),
        "share smaller than the spend": (
            g["small"].to_json(),
            g["small"].id,
            {"module_file": _module(tmp_path, "hard-coded 0.1")},
            GrantError,
            "covers only",
        ),
        "asks more than its budget": (
            g["a"].to_json(),
            g["a"].id,
            {"module_file": _module(tmp_path, "asks twice its budget")},
            BudgetExceeded,
            "more than its grant of 0.5",
        ),
        "non-DP analyzer": (
            g["a"].to_json(),
            g["a"].id,
            {"module_file": _module(tmp_path, "exact tft.mean")},
            NonPrivateAnalyzer,
            "not differentially private",
        ),
        "own seed": (
            g["a"].to_json(),
            g["a"].id,
            {"module_file": _module(tmp_path, "own seed")},
            NonPrivateAnalyzer,
            "seed=1 was given",
        ),
        "no preprocessing share": (g["zero"].to_json(), g["zero"].id, {}, MissingBudget, "no preprocessing budget"),
        "budget in custom_config": (
            g["a"].to_json(),
            g["a"].id,
            {"custom_config": json.dumps({"sage": {"preprocessing_epsilon": 9.0}})},
            TransformConfigError,
            "sets 'sage'",
        ),
        "a DP vocabulary under a grant with no preprocessing delta": (
            g["a"].to_json(),
            g["a"].id,
            {"module_file": _module(tmp_path, "vocabulary, delta written in the code")},
            GrantError,
            r"asks for \(epsilon=0.1, delta=1e-06\).*covers only \(epsilon=0.5, delta=0\)",
        ),
        "a DP vocabulary asking a delta of a budget without one": (
            g["a"].to_json(),
            g["a"].id,
            {"module_file": _module(tmp_path, "vocabulary from the budget")},
            BudgetExceeded,
            "no delta to split",
        ),
        # The landed check traced the function once; tf.Transform's own trace then baked the exact tft.mean.
        "tft.mean after the planning trace": (
            g["a"].to_json(),
            g["a"].id,
            {"module_file": _module(tmp_path, "tft.mean after the planning trace")},
            TraceMismatch,
            r"'ExtractCombineMergeOutputs\[mean#mean_and_var\]', which is not differentially",
        ),
        # Refused at tf.Transform's analysis trace, while the Beam pipeline is built (under its own grant: the
        # release is opened first).
        "row mixing after the checked trace": (
            g["traced"].to_json(),
            g["traced"].id,
            {"module_file": _module(tmp_path, "row mixing after the checked trace")},
            TraceMismatch,
            r"traced differently from the trace DPTransform checked \(ops: \[\('Mean', 1\)\]",
        ),
        "batch-centred": (
            g["a"].to_json(),
            g["a"].id,
            {"module_file": _module(tmp_path, "batch-centred")},
            RowMixing,
            "the output 'centred' changes with the other rows of its batch",
        ),
        "batch total into the analyzer": (
            g["a"].to_json(),
            g["a"].id,
            {"module_file": _module(tmp_path, "batch total into the analyzer")},
            RowMixing,
            "the input 'add:0' of the DP analyzer 'dp_group_by_mean' changes with the other rows",
        ),
        "a DP vocabulary asking more delta than the grant's": (
            g["vocab"].to_json(),
            g["vocab"].id,
            {"module_file": _module(tmp_path, "vocabulary, delta written in the code")},
            GrantError,
            r"covers only \(epsilon=0.5, delta=1e-07\)",
        ),
    }
    return cases[case]


REFUSALS = [
    "no grant",
    "forged grant",
    "unknown grant",
    "examples of another grant",
    "share smaller than the spend",
    "asks more than its budget",
    "non-DP analyzer",
    "own seed",
    "no preprocessing share",
    "budget in custom_config",
    "a DP vocabulary under a grant with no preprocessing delta",
    "a DP vocabulary asking a delta of a budget without one",
    "a DP vocabulary asking more delta than the grant's",
    "tft.mean after the planning trace",
    "row mixing after the checked trace",
    "batch-centred",
    "batch total into the analyzer",
]


@pytest.mark.parametrize("case", REFUSALS)
def test_refuses_before_reading(world, tmp_path, case):
    grant_json, read_under, params, error, message = _refusal(world, tmp_path, case)
    examples = _unreadable_examples(tmp_path, read_under, world)
    with pytest.raises(error, match=message):
        _run(world, tmp_path, grant_json, examples, **params)
    # Nothing read (the records are garbage: reading them fails otherwise), nothing written.
    assert os.listdir(tmp_path / "transform_graph") == [] and os.listdir(tmp_path / "transformed_examples") == []


@pytest.mark.parametrize(
    "call, error, message",
    [
        (5, "TraceMismatch", r"differently from the trace DPTransform checked \(ops: \[\('Mean', 1\)\] added"),
        (6, "RowMixing", "the output 'centred' changes with the other rows of its batch"),
    ],
)
def test_a_function_that_mixes_rows_only_in_a_beam_trace_is_refused_before_any_output(
    world, examples, tmp_path, call, error, message
):
    """tf.Transform traces the function again in Beam steps: for the analyzers' inputs (call 5) and, after the
    analysis, with the noisy tables as constants for the transform graph it saves (call 6). A function that
    batch-centres a feature only from such a call on (a call counter) passed every landed check, and the
    transformed records and the served graph were batch-centred. Those traces are checked too (call 6 against
    a check trace under the same tables, run on synthetic rows): refused before any output is written."""
    from sage_tfx.transform import errors

    grant = world["grants"][f"mixed{call}"]
    with pytest.raises(getattr(errors, error), match=message):
        _run(
            world,
            tmp_path,
            grant.to_json(),
            examples(f"mixed{call}"),
            module_file=_module(tmp_path, f"row mixing from call {call}"),
        )
    assert not os.path.exists(tmp_path / "transform_graph" / "transform_fn")
    assert not [f for _, _, files in os.walk(tmp_path / "transformed_examples") for f in files]


def test_the_share_covers_exactly_what_the_function_spends(world, tmp_path):
    """The 0.1 the hard-coded module spends is refused under a 0.05 share and passes the check under 0.5."""
    from sage_tfx.components.dp_transform_executor import preprocessing_plan

    props = {"module_file": _module(tmp_path, "hard-coded 0.1"), "data_root": world["data"]}
    examples = _unreadable_examples(tmp_path, "x")
    plan = preprocessing_plan(props, world["grants"]["a"], examples, grant_seed=0)
    assert plan["epsilon"] == pytest.approx(0.1) and plan["share"] == PRE_EPS
    assert plan["custom_config"] == {"sage": {"preprocessing_epsilon": PRE_EPS}}
    assert (plan["analyze"], plan["transform"]) == (["train"], ["train", "eval"])
    with pytest.raises(GrantError, match="covers only"):
        preprocessing_plan(props, world["grants"]["small"], examples, grant_seed=0)


def test_dp_vocabularies_run_under_a_grant_whose_split_gives_preprocessing_a_delta(world, examples, tmp_path):
    """tft.compute_and_apply_vocabulary's DP counterpart inside DPTransform: the delta comes from the split's
    preprocessing_delta through the PreprocessingBudget, the ledger records it with the release, and the ids
    are a function of each row's own value and the released vocabulary."""
    from sage_tfx.privacy import BudgetSplit

    grant = world["grants"]["vocab"]
    assert BudgetSplit.from_meta(grant.meta).total_delta == pytest.approx(SPLIT["delta"] + VOCAB_DELTA)
    graph, transformed = _run(
        world, tmp_path, grant.to_json(), examples("vocab"), module_file=_module(tmp_path, "vocabulary from the budget")
    )
    spent = _spent(graph)
    assert spent["delta"] == pytest.approx(VOCAB_DELTA) and spent["epsilon"] == pytest.approx(PRE_EPS)
    assert [a[2] for a in spent["analyzers"]] == pytest.approx([0.75 * VOCAB_DELTA, 0.25 * VOCAB_DELTA])
    (release,) = [r for r in world["ledger"].releases(grant.id) if r.stage == "preprocessing"]
    assert (release.epsilon, release.delta) == (pytest.approx(PRE_EPS), pytest.approx(VOCAB_DELTA))
    out = _transformed(graph.uri, transformed, "train")
    ids_of = {}
    for raw, i in zip(out["payment_raw"], out["payment"]):
        ids_of.setdefault(raw, set()).add(int(i))
    assert all(len(ids) == 1 for ids in ids_of.values()), ids_of  # one id per value
    # the two payment types of thousands of rows pass any threshold: ids 0 and 1, by noisy count
    assert {next(iter(ids_of[b"Cash"])), next(iter(ids_of[b"Credit Card"]))} == {0, 1}
    assert out["company"].min() >= 0


# ------------------------------------------------------------------ noise once, seeded by the grant


@pytest.fixture(scope="module")
def run_a(world, examples, tmp_path_factory):
    """The taxi module run by the executor under grant a."""
    return _run(world, tmp_path_factory.mktemp("run_a"), world["grants"]["a"].to_json(), examples("a"))


def test_noise_once_per_key_and_layout(world, examples, run_a):
    graph, transformed = run_a
    assert json.loads(transformed.split_names) == ["train", "eval"]
    assert sorted(os.listdir(graph.uri)) == ["metadata", "transform_fn", "transformed_metadata"]
    train, evals = (_transformed(graph.uri, transformed, s) for s in ("train", "eval"))
    assert set(train) == {"dist_scaled", "hour_of_day", "hour_of_day_speed", "trip_seconds"}
    table = _table(train)
    assert sorted(table) == list(range(HOURS))
    # The eval split and serving (new records through the graph) read the same noisy table.
    assert all(table[h] == v for h, v in _table(evals).items())
    assert _served_table(graph.uri) == pytest.approx(table, rel=0, abs=0)
    assert all(0.0 <= v <= 1.0 for v in table.values())
    assert np.all((train["dist_scaled"] >= 0) & (train["dist_scaled"] <= 1))

    # Accuracy against the exact clipped means of the train records. Per hour, with n rows, the error of
    # (S + Ls) / (n + Lc) is at most (|Ls| + |Lc|) / (n - |Lc|) for S <= n; Ls, Lc ~ Laplace(2/eps) = Lap(4),
    # and P(|Lap(4)| > 80) = e^-20: the bound below fails with probability < 48 e^-20 < 1e-7.
    hours, miles, seconds = _raw_train(examples("a"))
    mph = np.clip(miles / (np.maximum(seconds, 1.0) / 3600.0), 0.0, 100.0) / 100.0
    for h in range(HOURS):
        n = int(np.sum(hours == h))
        assert n > 100
        assert abs(table[h] - mph[hours == h].mean()) <= 160.0 / (n - 80) + 1e-6, (h, n)
    # The label passes through clipped to [0, 3 h], in seconds (float32 sums: compare relatively).
    assert train["trip_seconds"].sum() == pytest.approx(np.clip(seconds, 0, 10800).sum(), rel=1e-5)
    assert len(train["trip_seconds"]) == len(seconds)

    for artifact in (graph, transformed):
        assert artifact.get_string_custom_property("grant_id") == world["grants"]["a"].id
        assert artifact.get_float_custom_property("preprocessing_epsilon") == pytest.approx(PRE_EPS)
        spent = _spent(artifact)
        assert spent["epsilon"] == PRE_EPS and spent["analyze_splits"] == ["train"]
        assert spent["analyzers"] == [["dp_group_by_mean", PRE_EPS]]
    assert transformed.get_string_custom_property("split_rule") == json.dumps({"train": 9, "eval": 1})


def _train_table(run):
    graph, transformed = run
    return _table(_transformed(graph.uri, transformed, "train"))


@pytest.mark.slow
def test_other_grant_other_noise(world, examples, run_a, tmp_path):
    """Another grant on the same blocks draws independent noise. (The same grant run again draws the same noise:
    test_in_local_dag_runner and test_in_beam_dag_runner_with_runtime_parameter run it again and compare with
    run_a.)"""
    other = _run(world, tmp_path / "other", world["grants"]["b"].to_json(), examples("b"))
    first = _train_table(run_a)
    # Another grant: independent noise. Lap(4)/~500 moves each mean by ~1e-2; all 24 must differ.
    second = _train_table(other)
    same = {h: (first[h], second[h]) for h in range(HOURS) if not abs(second[h] - first[h]) > 1e-6}
    assert not same, f"hours whose mean two grants' noise left equal (first, second): {same}"


def test_an_edited_function_under_the_same_grant_is_refused_before_any_noise(world, examples, run_a, tmp_path):
    """Re-running an edited preprocessing_fn under the same grant drew the same noise,
    so the difference of the two noisy tables was a difference of data alone. The traced graph is the
    computation's fingerprint: a different one is refused before the analysis runs."""
    with pytest.raises(GrantError, match="already released its preprocessing stage.*different release"):
        _run(
            world,
            tmp_path,
            world["grants"]["a"].to_json(),
            examples("a"),
            module_file=_module(tmp_path, "hard-coded 0.1"),
        )
    assert not os.path.exists(tmp_path / "transform_graph" / "transform_fn")
    (release,) = world["ledger"].releases(world["grants"]["a"].id)
    assert (release.stage, release.epsilon) == ("preprocessing", PRE_EPS)


def test_the_fingerprint_is_the_traced_graph(world, tmp_path):
    """The same function traced three times in one process (TensorFlow's name counters move between traces)
    gives one fingerprint; another function, or another custom_config, gives another."""
    from sage_tfx.components.dp_transform_executor import preprocessing_plan

    examples = _unreadable_examples(tmp_path, "x")
    props = {"module_file": TAXI_MODULE, "data_root": world["data"]}
    same = {preprocessing_plan(props, world["grants"]["a"], examples, grant_seed=s)["computation"] for s in (1, 2, 3)}
    assert len(same) == 1
    edited = preprocessing_plan(
        dict(props, module_file=_module(tmp_path, "hard-coded 0.1")), world["grants"]["a"], examples, grant_seed=1
    )["computation"]
    configured = preprocessing_plan(
        dict(props, custom_config=json.dumps({"x": 1})), world["grants"]["a"], examples, grant_seed=1
    )["computation"]
    assert len(same | {edited, configured}) == 3


def test_component_parameters():
    from tfx.proto import transform_pb2
    from tfx.types import channel, standard_artifacts

    from sage_tfx.components.dp_transform import DPTransform

    examples = channel.Channel(type=standard_artifacts.Examples)
    t = DPTransform(
        examples=examples,
        ledger="l.db",
        grant='{"id": "g"}',
        module_file=TAXI_MODULE,
        schema={"trip_miles": "float"},
        custom_config={"k": 1},
        splits_config=transform_pb2.SplitsConfig(analyze=["train", "eval"], transform=["eval"]),
    )
    props = t.exec_properties
    assert json.loads(props["splits_config"]) == {"analyze": ["train", "eval"], "transform": ["eval"]}
    assert json.loads(props["schema"]) == {"trip_miles": "float"} and json.loads(props["custom_config"]) == {"k": 1}
    assert set(t.outputs) == {"transform_graph", "transformed_examples"}
    with pytest.raises(ValueError, match="exactly one of schema"):
        DPTransform(examples=examples, ledger="l.db", module_file=TAXI_MODULE)
    with pytest.raises(ValueError, match="module_file, module_path or preprocessing_fn"):
        DPTransform(examples=examples, ledger="l.db", data_root="d")


def test_splits_config_and_schema_parameter(world, tmp_path):
    """Analyze both splits (each record then pays the preprocessing epsilon once: one query over their union);
    the raw schema given as a parameter instead of the stream's _stream.json."""
    from sage_tfx.components.dp_transform_executor import TransformConfigError, preprocessing_plan

    examples = _unreadable_examples(tmp_path, "x")
    props = {
        "module_file": TAXI_MODULE,
        "schema": json.dumps({"trip_start_hour": "int", "trip_miles": "float", "trip_seconds": "int"}),
        "splits_config": json.dumps({"analyze": ["train", "eval"]}),
    }
    plan = preprocessing_plan(props, world["grants"]["a"], examples, grant_seed=0)
    assert plan["analyze"] == ["train", "eval"] and plan["epsilon"] == PRE_EPS
    for bad, message in (({"analyze": ["test"]}, "analyze split 'test'"), ({"other": 1}, "keys analyze")):
        with pytest.raises(TransformConfigError, match=message):
            preprocessing_plan(dict(props, splits_config=json.dumps(bad)), world["grants"]["a"], examples, 0)
    with pytest.raises(TransformConfigError, match="exactly one of schema"):
        preprocessing_plan(dict(props, data_root=world["data"]), world["grants"]["a"], examples, 0)
    with pytest.raises(TransformConfigError, match="key 'trip_seconds'"):  # a feature the schema lacks
        preprocessing_plan(dict(props, schema='{"trip_miles": "float"}'), world["grants"]["a"], examples, 0)


# ------------------------------------------------------------------ in TFX pipelines


def _pipeline(world, root, grant, name):
    from tfx.orchestration import metadata, pipeline

    from sage_tfx.components.block_example_gen import BlockExampleGen
    from sage_tfx.components.dp_transform import DPTransform

    gen = BlockExampleGen(ledger=world["db"], data_root=world["data"], stream="taxi", grant=grant)
    transform = DPTransform(
        examples=gen.outputs["examples"],
        ledger=world["db"],
        grant=grant,
        module_file=TAXI_MODULE,
        data_root=world["data"],
    )
    return pipeline.Pipeline(
        pipeline_name=name,
        pipeline_root=str(root / "pipeline_root"),
        components=[gen, transform],
        metadata_connection_config=metadata.sqlite_metadata_connection_config(str(root / "mlmd.sqlite")),
        enable_cache=False,
    )


def _mlmd_outputs(root):
    from tfx.orchestration import metadata
    from tfx.types import artifact_utils, standard_artifacts

    config = metadata.sqlite_metadata_connection_config(str(root / "mlmd.sqlite"))
    found = {}
    with metadata.Metadata(config) as m:
        for cls in (standard_artifacts.TransformGraph, standard_artifacts.Examples):
            for a in m.store.get_artifacts_by_type(cls.TYPE_NAME):
                artifact_type = m.store.get_artifact_types_by_id([a.type_id])[0]
                found.setdefault(cls.TYPE_NAME, []).append(artifact_utils.deserialize_artifact(artifact_type, a))
    (graph,) = found["TransformGraph"]
    transformed = [e for e in found["Examples"] if e.has_custom_property("preprocessing_epsilon")]
    assert len(found["Examples"]) == 2 and len(transformed) == 1
    return graph, transformed[0]


def _check_pipeline_outputs(world, run_a, root):
    graph, transformed = _mlmd_outputs(root)
    assert graph.get_string_custom_property("grant_id") == world["grants"]["a"].id
    assert _spent(transformed)["epsilon"] == PRE_EPS
    table = _table(_transformed(graph.uri, transformed, "train"))
    _table(_transformed(graph.uri, transformed, "eval"))
    # The same grant in a pipeline reproduces the noisy table of the direct executor run: the same seeds and the
    # same records; the exact per-hour sums are float64 sums whose order may differ between runs, so the float32
    # means agree to rounding (not necessarily bit for bit).
    assert table == pytest.approx(_train_table(run_a), rel=1e-6, abs=1e-7)


@pytest.mark.slow
def test_in_local_dag_runner(world, run_a, tmp_path):
    from tfx.orchestration.local.local_dag_runner import LocalDagRunner

    LocalDagRunner().run(_pipeline(world, tmp_path, world["grants"]["a"], "dptx-local"))
    _check_pipeline_outputs(world, run_a, tmp_path)


@pytest.mark.slow
def test_in_beam_dag_runner_with_runtime_parameter(world, run_a, tmp_path):
    from tfx.orchestration import data_types
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    grant = data_types.RuntimeParameter(name="grant", ptype=str, default=world["grants"]["a"].to_json())
    BeamDagRunner().run(_pipeline(world, tmp_path, grant, "dptx-beam"))
    _check_pipeline_outputs(world, run_a, tmp_path)
