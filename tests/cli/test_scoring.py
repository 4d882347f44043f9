"""`sage score`'s parts without TensorFlow: the non-private baselines, the hold-out overlap check, the training
rows of a grant and their audit entries, and the command's refusals before anything is read. (A real score of
a pushed model: tests/pipelines/test_sage_run.py
::test_a_users_pipeline_file_runs_to_accept_pushes_and_certifies_only_its_request.)"""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from sage_tfx.data.taxi import TIME_COLUMN, load_taxi, taxi_csv_path
from sage_tfx.ingest.pipeline import ingest_batches, make_spec
from sage_tfx.ingest.records import schema_of
from sage_tfx.pipelines import scoring
from sage_tfx.privacy import Ledger


def test_least_squares_and_the_mean_recover_a_linear_label():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 3))
    y = x @ np.array([2.0, -1.0, 0.5]) + 3.0 + rng.normal(scale=0.1, size=2000)
    baselines = scoring.fit_baselines("mse", x, y)
    assert set(baselines) == {"mean_label", "least_squares"}
    z = rng.normal(size=(500, 3))
    truth = z @ np.array([2.0, -1.0, 0.5]) + 3.0
    assert np.max(np.abs(baselines["least_squares"][1](z) - truth)) < 0.05
    assert np.allclose(baselines["mean_label"][1](z), y.mean())


def test_logistic_regression_and_the_majority_class_on_a_binary_label():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4000, 2))
    p = 1 / (1 + np.exp(-(3 * x[:, 0] - 2 * x[:, 1] - 1)))
    y = (rng.random(4000) < p).astype(float)
    accuracy = scoring.fit_baselines("accuracy", x, y)
    fitted = accuracy["logistic_regression"][1](x)
    assert np.mean(np.abs(fitted - p)) < 0.03  # close to the true probabilities
    assert np.all(accuracy["majority_class"][1](x) == float(y.mean() >= 0.5))
    log_loss = scoring.fit_baselines("log_loss", x, y)
    assert np.allclose(log_loss["majority_class"][1](x), y.mean())  # the best constant under log loss


def test_bad_baseline_inputs_name_the_value():
    with pytest.raises(scoring.ScoreError, match="not 2.0"):
        scoring.logistic_regression(np.zeros((3, 1)), np.array([0.0, 1.0, 2.0]))
    with pytest.raises(scoring.ScoreError, match="'custom'"):
        scoring.fit_baselines("custom", np.zeros((3, 1)), np.zeros(3))
    with pytest.raises(scoring.ScoreError, match="no labelled row"):
        scoring.fit_baselines("mse", np.zeros((0, 1)), np.zeros(0))


def test_summary_clips_losses_as_the_sla_measures_them():
    out = scoring.summary(np.array([1.0, 3.0, 100.0]), "mse", 10.0, 5.0)
    assert out["value"] == pytest.approx(14 / 3) and out["unclipped"] == pytest.approx(104 / 3)
    assert out["meets_target"] is True
    assert scoring.summary(np.array([1.0, 0.0]), "accuracy", None, 0.6)["meets_target"] is False


@pytest.fixture()
def world(tmp_path):
    """Stream a: the first 600 real taxi trips in daily blocks; the hold-out: the next 200 as a CSV file."""
    db, data = str(tmp_path / "ledger.db"), str(tmp_path / "data")
    rows = load_taxi("simple").sort_by(TIME_COLUMN)
    ledger = Ledger.open(db, create=True)
    ledger.create_stream("a", 1.0, 1e-5)
    ingest_batches(
        ledger,
        "a",
        data,
        rows.slice(0, 600).to_batches(),
        make_spec("time", "a", TIME_COLUMN, "1d"),
        schema_of(rows.schema),
    )
    yield dict(db=db, data=data, ledger=ledger, rows=rows, tmp=tmp_path)
    ledger.close()


def _held_out_csv(path, times):
    """The lines of the taxi CSV whose trip starts at one of ``times`` (the stream's input format)."""
    with open(taxi_csv_path("simple"), newline="") as f, open(path, "w", newline="") as out:
        reader, writer = csv.reader(f), csv.writer(out)
        header = next(reader)
        writer.writerow(header)
        at = header.index(TIME_COLUMN)
        writer.writerows(r for r in reader if r[at] and int(r[at]) in times)
    return str(path)


def test_the_overlap_check_finds_a_stream_row_in_the_hold_out(world):
    schema = scoring._schema(world["data"], "a")
    blocks = [b.id for b in world["ledger"].blocks("a")]
    stream = scoring.block_rows(world["data"], "a", blocks, ledger=world["ledger"], purpose="test: the stream")
    later = set(world["rows"].column(TIME_COLUMN).to_pylist()[700:800])
    held = scoring.read_held_out(_held_out_csv(world["tmp"] / "held.csv", later), schema)
    assert held.num_rows >= 100 and scoring.overlap_count(stream, held) == 0
    one_more = later | {world["rows"].column(TIME_COLUMN)[10].as_py()}  # a trip the stream holds
    leaky = scoring.read_held_out(_held_out_csv(world["tmp"] / "leaky.csv", one_more), schema)
    assert scoring.overlap_count(stream, leaky) >= 1


@pytest.mark.tf  # the split rule's home, BlockExampleGen's executor, imports TFX
def test_training_rows_are_the_grants_training_side_and_the_read_is_audited(world):
    ledger = world["ledger"]
    blocks = [b.id for b in ledger.blocks("a")][:5]
    grant = ledger.request("p", "a", blocks=blocks, epsilon=0.5)
    every = scoring.block_rows(world["data"], "a", blocks, ledger=ledger, purpose="test: all rows")
    train = scoring.training_rows(world["data"], "a", grant, ledger=ledger, purpose="sage score: test baseline")
    evaluation = scoring.block_rows(world["data"], "a", blocks, split="eval", ledger=ledger, purpose="test: eval")
    assert train.num_rows + evaluation.num_rows == every.num_rows and 0 < evaluation.num_rows < train.num_rows
    assert not scoring.row_key_set(train) & scoring.row_key_set(evaluation)
    reads = ledger.trusted_reads("a")
    assert [r["purpose"] for r in reads][-2:] == ["sage score: test baseline", "test: eval"]
    assert reads[-2]["blocks"] == blocks and ledger.audit().ok


def _sage(*args):
    return subprocess.run(
        [sys.executable, "-m", "sage_tfx", "score", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_sage_score_refuses_before_any_read_naming_the_value(world):
    """No ACCEPT yet, a missing hold-out file, a baseline feature that is no numeric column: exit 2, the value
    named, and no trusted read in the ledger (nothing was decrypted)."""
    later = set(world["rows"].column(TIME_COLUMN).to_pylist()[700:800])
    held = _held_out_csv(world["tmp"] / "held.csv", later)
    common = ["--db", world["db"], "--stream", "a", "--data-root", world["data"], "--work-dir", world["tmp"] / "w"]
    before = world["ledger"].log_entries()
    for args, named in (
        (["taxi_regression", "--held-out", held], "no ACCEPTed 'taxi_regression' grant"),
        (["taxi_regression", "--held-out", world["tmp"] / "nope.csv"], "nope.csv"),
        (["taxi_regression", "--held-out", held, "--features", "trip_miles,company"], "company"),
        (["taxi_regression", "--held-out", held, "--stream", "b"], "'b'"),
    ):
        out = (
            _sage(*args, *common)
            if "--stream" not in args
            else _sage(*args, "--db", world["db"], "--data-root", world["data"])
        )
        assert out.returncode == 2 and named in out.stderr, (args, out.stderr)
    with Ledger.open(world["db"]) as ledger:
        assert ledger.log_entries() == before
    assert json.dumps(before)  # (log entries are plain data)


def test_the_design_matrix_fills_a_missing_value_with_the_training_mean():
    import pyarrow as pa

    def batch(values):
        return pa.RecordBatch.from_arrays(
            [pa.array([[v] if v is not None else [] for v in values], pa.large_list(pa.float32()))], names=["a"]
        )

    x, center, scale = scoring.design_matrix(batch([1.0, 3.0, None]), ["a"])
    assert center.tolist() == [2.0] and x[2, 0] == 0.0 and x[0, 0] == -x[1, 0]
    held, _, _ = scoring.design_matrix(batch([None, 2.0]), ["a"], center, scale)
    assert held.tolist() == [[0.0], [0.0]]
    empty, center, _ = scoring.design_matrix(batch([None, None]), ["a"])  # no value at all: the centre is 0
    assert center.tolist() == [0.0] and empty.tolist() == [[0.0], [0.0]]


def _save_model(path, key_path=None, leak_path=None):
    """A SavedModel whose serving signature takes serialized tf.Examples and predicts 0; with ``key_path`` it
    first copies that file to ``leak_path`` (what a trainer module could build into the graph it exports)."""
    import tensorflow as tf

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(self, examples):
            zeros = tf.zeros_like(tf.strings.length(examples), dtype=tf.float32)
            if key_path is None:
                return {"predictions": zeros}
            with tf.control_dependencies([tf.io.write_file(leak_path, tf.io.read_file(key_path))]):
                return {"predictions": tf.identity(zeros)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def labels(self, examples):  # a label_signature: every record's label is 3
            return {"trip_seconds": tf.fill(tf.shape(examples), 3.0)}

    model = Model()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve, "labels": model.labels})


@pytest.mark.slow(weight=20)  # a confined child loads the model: 28 s alone at load 6
@pytest.mark.tf
def test_the_pushed_model_runs_away_from_the_key(world):
    """A pushed model is a graph user code built: `sage score` runs it in a confined child. A benign model is
    scored (its mse is the mean squared tip); one whose signature copies the ledger's key file to a folder the
    user reads is refused there, and the key is not copied (in the launcher the copy succeeded)."""
    ledger, tmp = world["ledger"], world["tmp"]
    grant = ledger.request("p", "a", blocks=[b.id for b in ledger.blocks("a")][:5], epsilon=0.5)
    ledger.record_outcome(grant.id, "ACCEPT")
    later = set(world["rows"].column(TIME_COLUMN).to_pylist()[700:800])
    held = _held_out_csv(tmp / "held.csv", later)
    benign, hostile = tmp / "benign", tmp / "hostile"
    _save_model(benign / "1", None)
    leak = tmp / "leaked.key"
    _save_model(hostile / "1", ledger.key_file, str(leak))
    report = scoring.score_model(
        ledger, "a", "taxi_regression", held, data_root=world["data"], serving_dir=str(benign), name="p"
    )
    assert report["scores"]["dp_model"]["value"] > 0 and report["held_out_rows_scored"] > 50
    with pytest.raises(ValueError):
        scoring.score_model(
            ledger, "a", "taxi_regression", held, data_root=world["data"], serving_dir=str(hostile), name="p"
        )
    assert not leak.exists()
    assert ledger.audit().ok


@pytest.mark.tf
def test_a_label_signature_derives_the_labels_in_the_confined_child(world):
    """With the SLA's ``label_signature`` the model derives the labels of the hold-out AND of the training rows
    (for the baselines), in the confined child: every label is 3 here, so the model (predicting 0) scores
    mse 9 and the mean-label baseline, fitted on the children's training labels, scores 0."""
    import dataclasses

    from sage_tfx.pipelines import load_pipeline

    ledger, tmp = world["ledger"], world["tmp"]
    grant = ledger.request("p", "a", blocks=[b.id for b in ledger.blocks("a")][:5], epsilon=0.5)
    ledger.record_outcome(grant.id, "ACCEPT")
    held = _held_out_csv(tmp / "held.csv", set(world["rows"].column(TIME_COLUMN).to_pylist()[700:800]))
    _save_model(tmp / "serving" / "1")
    definition = load_pipeline("taxi_regression")
    definition = dataclasses.replace(definition, sla=dataclasses.replace(definition.sla, label_signature="labels"))
    report = scoring.score_model(
        ledger, "a", definition, held, data_root=world["data"], serving_dir=str(tmp / "serving"), name="p"
    )
    assert report["held_out_rows_scored"] == report["held_out_rows"] > 50
    assert report["scores"]["dp_model"]["value"] == pytest.approx(9.0)
    assert report["scores"]["mean_label"]["value"] == pytest.approx(0.0) and report["baseline_rows"] > 20
