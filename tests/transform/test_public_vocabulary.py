"""apply_public_vocabulary and one_hot (sage_tfx/transform/lookup.py): eager, inside tf.Transform graphs
(TF2 and compat.v1, a vocabulary that is a list, a tf.constant or an analyzer's output), and through the
DPTransform component on the real taxi trips (it is not an analyzer: DPTransform lets it through)."""

import json
import os
import tempfile

import numpy as np
import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.transform import DPTransformError

pytestmark = pytest.mark.tf

CARRIERS = ["AA", "DL", "UA", "WN"]


def _tf():
    import tensorflow as tf

    return tf


def _expected(values, vocab, num_oov_buckets=1, default_value=-1):
    """The rule written out in Python: index in vocab, else len(vocab) + hash bucket (or the default)."""
    tf = _tf()
    out = []
    for v in values:
        if v in vocab:
            out.append(vocab.index(v))
        elif num_oov_buckets == 0:
            out.append(default_value)
        else:
            text = v if isinstance(v, str) else str(v)
            out.append(len(vocab) + int(tf.strings.to_hash_bucket_fast([text], num_oov_buckets).numpy()[0]))
    return out


# ---------------------------------------------------------------- eager


@pytest.mark.parametrize("oov", [0, 1, 3])
def test_string_ids_and_oov(oov):
    from sage_tfx.transform import apply_public_vocabulary

    values = ["DL", "AA", "ZZ", "WN", "", "B6", "UA", "AA"]
    ids = apply_public_vocabulary(_tf().constant(values), CARRIERS, num_oov_buckets=oov, default_value=-7)
    assert ids.dtype.name == "int64"
    assert ids.numpy().tolist() == _expected(values, CARRIERS, oov, -7)
    assert ids.numpy()[:2].tolist() == [1, 0]


def test_vocabulary_as_bytes_numpy_or_a_tensor_gives_the_same_ids():
    from sage_tfx.transform import apply_public_vocabulary

    tf = _tf()
    x = tf.constant(["UA", "XX", "AA", "WN"])
    want = apply_public_vocabulary(x, CARRIERS).numpy().tolist()
    for vocab in ([c.encode() for c in CARRIERS], np.array(CARRIERS), tf.constant(CARRIERS)):
        assert apply_public_vocabulary(x, vocab).numpy().tolist() == want


def test_integer_column_with_an_integer_vocabulary():
    from sage_tfx.transform import apply_public_vocabulary

    tf = _tf()
    vocab = [19393, 19790, 20304, 20366]  # e.g. DOT carrier ids
    values = [20304, 1, 19393, 20366, 19790, -5]
    for dtype in (tf.int32, tf.int64):
        ids = apply_public_vocabulary(tf.constant(values, dtype), vocab, num_oov_buckets=2)
        assert ids.numpy().tolist() == _expected(values, vocab, 2)
    ids = apply_public_vocabulary(tf.constant(values, tf.int64), np.array(vocab), num_oov_buckets=0)
    assert ids.numpy().tolist() == [2, -1, 0, 3, 1, -1]


def test_sparse_and_ragged_keep_their_structure():
    from sage_tfx.transform import apply_public_vocabulary

    tf = _tf()
    sparse = tf.SparseTensor([[0, 0], [2, 0]], tf.constant(["WN", "QQ"]), [3, 1])
    out = apply_public_vocabulary(sparse, CARRIERS, num_oov_buckets=0)
    assert isinstance(out, tf.SparseTensor)
    assert out.values.numpy().tolist() == [3, -1] and out.dense_shape.numpy().tolist() == [3, 1]
    ragged = tf.ragged.constant([["AA", "UA"], [], ["DL"]])
    out = apply_public_vocabulary(ragged, CARRIERS)
    assert out.to_list() == [[0, 2], [], [1]]


def test_run_time_vocabulary_uses_the_sorted_search_and_agrees_with_the_table():
    """A vocabulary tensor whose value is unknown at trace time (as an analyzer's output is) is searched,
    not tabled; on 20,000 values (half in a 5,000-value vocabulary, half out) both give the same ids."""
    from sage_tfx.transform import apply_public_vocabulary

    tf = _tf()
    rng = np.random.default_rng(0)
    vocab = [f"v{i}" for i in rng.permutation(10_000)[:5_000]]
    values = [f"v{i}" for i in rng.integers(0, 10_000, 20_000)]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def run_time(x, v):
        assert tf.get_static_value(v) is None  # the search path
        return apply_public_vocabulary(x, v, num_oov_buckets=4)

    searched = run_time(tf.constant(values), tf.constant(vocab)).numpy()
    tabled = apply_public_vocabulary(tf.constant(values), vocab, num_oov_buckets=4).numpy()
    assert np.array_equal(searched, tabled)
    index = {v: i for i, v in enumerate(vocab)}
    assert all(searched[j] == index[v] for j, v in enumerate(values) if v in index)
    assert np.all(searched[[v not in index for v in values]] >= len(vocab))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64)])
    def run_time_int(x, v):
        return apply_public_vocabulary(x, v, num_oov_buckets=0)

    ints = run_time_int(tf.constant([7, 3, 99, 3], tf.int64), tf.constant([3, 5, 7], tf.int64)).numpy()
    assert ints.tolist() == [2, 0, -1, 0]
    # an empty run-time vocabulary: everything out of vocabulary, nothing fails
    empty = run_time(tf.constant(["a", "b"]), tf.constant([], tf.string)).numpy()
    assert np.all((empty >= 0) & (empty < 4))


def test_errors_name_the_bad_value():
    from sage_tfx.transform import apply_public_vocabulary, one_hot

    tf = _tf()
    s, i = tf.constant(["AA"]), tf.constant([1], tf.int64)
    with pytest.raises(DPTransformError, match=r"duplicates \[b'AA'\]"):
        apply_public_vocabulary(s, ["AA", "DL", "AA"])
    with pytest.raises(DPTransformError, match="must not be empty"):
        apply_public_vocabulary(s, [])
    with pytest.raises(DPTransformError, match=r"tf.strings.as_string"):
        apply_public_vocabulary(i, CARRIERS)
    with pytest.raises(DPTransformError, match=r"dtype string .* vocabulary of ints"):
        apply_public_vocabulary(s, [1, 2])
    with pytest.raises(DPTransformError, match=r"all strings or all integers, got \['int', 'str'\]"):
        apply_public_vocabulary(s, ["AA", 3])
    with pytest.raises(DPTransformError, match="single value 'AA'"):
        apply_public_vocabulary(s, "AA")
    with pytest.raises(DPTransformError, match="num_oov_buckets must be an integer >= 0, got -1"):
        apply_public_vocabulary(s, CARRIERS, num_oov_buckets=-1)
    with pytest.raises(DPTransformError, match="must be 1-D"):
        apply_public_vocabulary(s, tf.constant([["AA"]]))
    with pytest.raises(DPTransformError, match="float32"):
        apply_public_vocabulary(s, tf.constant([1.0]))
    with pytest.raises(DPTransformError, match="depth must be an integer >= 1, got 0"):
        one_hot(i, 0)
    with pytest.raises(DPTransformError, match="integer tensor, got dtype float32"):
        one_hot(tf.constant([1.0]), 3)
    with pytest.raises(DPTransformError, match=r"shape \(2, 2\)"):
        one_hot(tf.constant([[1, 2], [0, 1]]), 3)


def test_one_hot_matches_tf_one_hot_and_out_of_range_is_zeros():
    from sage_tfx.transform import apply_public_vocabulary, one_hot

    tf = _tf()
    ids = apply_public_vocabulary(tf.constant(["WN", "??", "AA"]), CARRIERS, num_oov_buckets=1)
    hot = one_hot(ids, len(CARRIERS) + 1)
    assert hot.dtype.name == "float32" and hot.shape == (3, 5)
    assert hot.numpy().tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, 0, 1], [1, 0, 0, 0, 0]]
    column = one_hot(tf.constant([[2], [-1], [7]], tf.int32), 3)  # [batch, 1] ids; -1 and 7 are outside
    assert column.numpy().tolist() == [[0, 0, 1], [0, 0, 0], [0, 0, 0]]
    assert np.array_equal(one_hot(tf.constant([0, 2]), 3).numpy(), tf.one_hot([0, 2], 3).numpy())


# ---------------------------------------------------------------- inside tf.Transform


def _fixed_vocabulary_analyzer(x, values):
    """A (non-DP, test-only) analyzer whose output is a fixed vocabulary: a tensor known only at run time."""
    import apache_beam as beam
    import tensorflow_transform as tft

    tf = _tf()

    class _Fixed(beam.PTransform):
        def expand(self, pcoll):
            return (
                pcoll
                | beam.combiners.Count.Globally()
                | beam.Map(lambda _: np.array([v.encode() for v in values], dtype=object)),
            )

    (vocab,) = tft.experimental.ptransform_analyzer(
        inputs=[x], ptransform=_Fixed(), output_dtypes=[tf.string], output_shapes=[[None]]
    )
    return vocab


@pytest.mark.parametrize("compat_v1", [False, True], ids=["tf2", "compat_v1"])
def test_inside_analyze_and_transform_dataset(compat_v1):
    """A list, a tf.constant built inside the preprocessing_fn and an analyzer's output tensor as the vocabulary,
    string and integer columns, through tft_beam.AnalyzeAndTransformDataset; the saved transform graph then
    maps new rows (serving) the same way."""
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    from sage_tfx.transform import apply_public_vocabulary, one_hot

    tf = _tf()
    late = ["WN", "AA"]  # the analyzer's vocabulary: a different order from CARRIERS

    def preprocessing_fn(inputs):
        c, n = inputs["carrier"], inputs["code"]
        listed = apply_public_vocabulary(c, CARRIERS)
        return {
            "listed": listed,
            "constant": apply_public_vocabulary(c, tf.constant(CARRIERS), num_oov_buckets=0),
            "analyzed": apply_public_vocabulary(c, _fixed_vocabulary_analyzer(c, late), num_oov_buckets=2),
            "code": apply_public_vocabulary(n, [10, 20, 30], num_oov_buckets=0, default_value=9),
            "hot": one_hot(listed, len(CARRIERS) + 1),
        }

    carriers = ["AA", "DL", "UA", "WN", "B6", "AA", "WN", "NK"] * 5
    codes = [10, 20, 30, 40] * 10
    rows = [{"carrier": c, "code": n} for c, n in zip(carriers, codes)]
    spec = {"carrier": tf.io.FixedLenFeature([], tf.string), "code": tf.io.FixedLenFeature([], tf.int64)}
    with tempfile.TemporaryDirectory() as tmp:
        with tft_beam.Context(temp_dir=tmp, force_tf_compat_v1=compat_v1):
            (out, _), transform_fn = (
                rows,
                tft.DatasetMetadata.from_feature_spec(spec),
            ) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn)
            _ = transform_fn | tft_beam.WriteTransformFn(tmp)
        assert [r["listed"] for r in out] == _expected(carriers, CARRIERS)
        assert [r["constant"] for r in out] == _expected(carriers, CARRIERS, 0)
        assert [r["analyzed"] for r in out] == _expected(carriers, late, 2)
        assert [r["code"] for r in out] == [0, 1, 2, 9] * 10
        assert [list(r["hot"]).index(1.0) for r in out] == _expected(carriers, CARRIERS)
        served = tft.TFTransformOutput(tmp).transform_features_layer()(
            {"carrier": tf.constant(["UA", "NK", "WN"]), "code": tf.constant([30, 11, 10], tf.int64)}
        )
        assert served["listed"].numpy().tolist() == _expected(["UA", "NK", "WN"], CARRIERS)
        assert served["analyzed"].numpy().tolist() == _expected(["UA", "NK", "WN"], late, 2)
        assert served["code"].numpy().tolist() == [2, 9, 0]


# ---------------------------------------------------------------- through DPTransform

PAYMENTS = ["Cash", "Credit Card", "No Charge", "Dispute"]  # public: the payment types a taxi meter offers
MODULE = """
import sage_tfx
import tensorflow as tf
from sage_tfx.components.transform_utils import fill_in_missing
from sage_tfx.transform import PreprocessingBudget, apply_public_vocabulary, dp_group_by_mean, one_hot

PAYMENTS = {!r}


def preprocessing_fn(inputs, custom_config):
    budget = PreprocessingBudget.from_custom_config(custom_config)
    payment = fill_in_missing(inputs["payment_type"], "")
    ids = apply_public_vocabulary(payment, PAYMENTS, num_oov_buckets=1)
    miles = fill_in_missing(inputs["trip_miles"], 0.0)
    return {{"payment": ids, "payment_raw": payment, "payment_hot": one_hot(ids, len(PAYMENTS) + 1),
            "payment_miles": dp_group_by_mean(ids, miles, len(PAYMENTS) + 1, budget.epsilon, 50.0)}}
""".format(PAYMENTS)  # noqa: UP032


def test_through_the_dp_transform_component(tmp_path):
    """A preprocessing_fn that looks payment types up in a public vocabulary (and one-hot encodes them) runs
    through DPTransform's executor under a grant: the lookup is not an analyzer, only dp_group_by_mean spends."""
    import tensorflow as tf
    import tensorflow_transform as tft
    from tfx.types import standard_artifacts

    from sage_tfx.components.dp_transform_executor import Executor
    from sage_tfx.privacy import Ledger
    from tests.helpers.taxi_world import block_examples, ingest_taxi

    split = {
        "preprocessing": 0.5,
        "count": 0.0,
        "training": 1.0,
        "validation": 1.0,
        "delta": 1e-6,
        "rule": "pre+count+max(train+reject,val)",
    }
    db, data = str(tmp_path / "ledger.db"), str(tmp_path / "data")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("taxi", 100.0, 1e-4, max_epsilon=100.0)
        ingest_taxi(ledger, data, "simple")
        blocks = [b.id for b in ledger.blocks("taxi")]
        grant = ledger.request("p1", "taxi", blocks=blocks, epsilon=1.5, delta=1e-6, meta={"split": split})
    examples = block_examples(db, data, grant, tmp_path / "examples")
    module = tmp_path / "payment_module.py"
    module.write_text(MODULE)
    graph, transformed = standard_artifacts.TransformGraph(), standard_artifacts.Examples()
    graph.uri, transformed.uri = str(tmp_path / "transform_graph"), str(tmp_path / "transformed_examples")
    os.makedirs(graph.uri), os.makedirs(transformed.uri)
    Executor().Do(
        {"examples": [examples]},
        {"transform_graph": [graph], "transformed_examples": [transformed]},
        {"grant": grant.to_json(), "ledger": db, "module_file": str(module), "data_root": data},
    )

    spent = json.loads(graph.get_string_custom_property("privacy_spent"))
    assert spent["analyzers"] == [["dp_group_by_mean", 0.5]]
    output = tft.TFTransformOutput(graph.uri)
    folder = os.path.join(transformed.uri, "Split-train")
    records = [
        r.numpy()
        for r in tf.data.TFRecordDataset(
            sorted(os.path.join(folder, f) for f in os.listdir(folder)), compression_type="GZIP"
        )
    ]
    out = {k: v.numpy() for k, v in tf.io.parse_example(records, output.transformed_feature_spec()).items()}
    raw = [v.decode() for v in out["payment_raw"]]
    assert len(raw) > 10_000 and {"Cash", "Credit Card"} <= set(raw)
    assert out["payment"].tolist() == _expected(raw, PAYMENTS)
    assert np.array_equal(out["payment_hot"].argmax(axis=1), out["payment"])
    assert np.all(out["payment_hot"].sum(axis=1) == 1.0)
    served = output.transform_raw_features(
        {
            "payment_type": tf.sparse.from_dense(tf.constant([["Dispute"], ["Cash"]])),
            "trip_miles": tf.sparse.from_dense(tf.constant([[1.0], [2.0]])),
        }
    )
    assert served["payment"].numpy().tolist() == [3, 0]
