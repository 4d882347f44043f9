"""No held-out set of the demo, a bench or a docs example shares a row with what its run ingested or trained on.

- ``make demo`` (sage_tfx.demos.end_to_end, with ``sage_tfx.pipelines.scoring``'s helpers): the held-out trips (from HELD_OUT_FROM on) against the rows its
  replay ingests, replayed here on the real data and read back from the block files (full-row keys: the value
  hash that block digests sum), plus a coarser trip key (timestamp, seconds, miles, fare, census tracts).
  Positive controls: the same comparison catches stream rows passed off as held out, and the trip key
  catches the tfx wheel's ``external`` file, which the demo used to score on although every one of its
  trips is a trip of the replayed file. The demo's accuracy target is above what the majority class reaches
  on the window its first iteration tests and on the held-out trips; `sage demo` refuses a target outside
  (0, 1) before it writes anything.
- ``sage bench dp-quality`` (real trips): its test rows against its training rows.
- ``sage bench validation`` and ``sage bench sample-complexity`` (GENERATED rows): every drawn row is tagged,
  and the held-out rows must be none of the rows any model is fitted or validated on.
No TensorFlow here.
"""

import argparse
import datetime
import os

import numpy as np
import pyarrow as pa
import pytest

from sage_tfx.data.taxi import TRIP_KEY, load_taxi, row_keys, taxi_csv_path
from sage_tfx.demos import end_to_end as demo
from sage_tfx.ingest.records import infer_schema, input_format, read_batches
from sage_tfx.pipelines import scoring


def _read_csv(name):
    path = taxi_csv_path(name)
    fmt = input_format(path)
    return pa.Table.from_batches(list(read_batches(path, fmt, infer_schema(path, fmt))))


def _trip_keys(example_batch):
    """(timestamp, seconds, miles, fare, census tracts) per row, as stored (float32 values)."""
    cols = [example_batch.column(c).to_pylist() for c in TRIP_KEY]
    return {tuple(v[0] if v else None for v in row) for row in zip(*cols)}


@pytest.fixture(scope="module")
def demo_split():
    return demo.stream_and_held_out(data_file=demo.DATA_FILE)


def _majority_accuracy(labels):
    """Accuracy of the constant predictor that always says the more common class of ``labels`` (missing: 0)."""
    rate = float(np.nan_to_num(np.asarray(labels, dtype=float)).mean())
    return max(rate, 1.0 - rate)


def test_demo_held_out_range_is_a_time_range_the_stream_never_holds(demo_split):
    stream, held = demo_split
    cutoff = 1451606400  # 2016-01-01T00:00, the file's clock
    assert demo.HELD_OUT_FROM == "2016-01-01"
    times = {"stream": stream.column(demo.TIME_COLUMN).to_numpy(), "held": held.column(demo.TIME_COLUMN).to_numpy()}
    assert times["stream"].max() < cutoff <= times["held"].min()
    assert (stream.num_rows, held.num_rows) == (14169, 833)
    # A partition of the replayed file by full rows: nothing on both sides, nothing lost.
    stream_keys, held_keys = set(row_keys(stream)), set(row_keys(held))
    assert len(stream_keys) == stream.num_rows and len(held_keys) == held.num_rows
    assert not stream_keys & held_keys
    assert stream_keys | held_keys == set(row_keys(load_taxi("simple")))  # the demo's file: simple's trips, labelled
    assert not set(row_keys(stream, TRIP_KEY)) & set(row_keys(held, TRIP_KEY))
    # The old "held-out" set was no such thing: every external row is a trip of the replayed file.
    external = load_taxi("external")
    assert set(row_keys(external, TRIP_KEY)) <= set(row_keys(load_taxi("simple"), TRIP_KEY))


@pytest.mark.slow  # replays 1,095 daily blocks through the ledger (about 15 s; no TensorFlow)
def test_demo_replay_ingests_no_held_out_row(demo_split, tmp_path):
    from sage_tfx.ingest.layout import stream_config
    from sage_tfx.ingest.replay import Replay
    from sage_tfx.privacy import Ledger

    stream, held = demo_split
    data_root = str(tmp_path / "data")
    with Ledger.open(str(tmp_path / "ledger.db"), create=True) as ledger:
        ledger.create_stream(demo.STREAM, epsilon=1.0, delta=1e-6)
        # The demo's replay exactly (same input, column, window), run to exhaustion as the demo runs it.
        Replay(ledger, demo.STREAM, data_root, stream, demo.TIME_COLUMN, "1d").run()
        blocks = [b.id for b in ledger.blocks(demo.STREAM)]
    assert len(blocks) == 1095 and all(b < demo.HELD_OUT_FROM for b in blocks)
    schema = stream_config(data_root, demo.STREAM)["schema"]
    db = str(tmp_path / "ledger.db")
    ingested = scoring.block_rows(data_root, demo.STREAM, blocks, ledger=db, purpose="test: the held-out split")
    held_rows = scoring.example_rows(held, schema)
    assert ingested.num_rows == stream.num_rows
    # The ingested rows are exactly the stream's rows, and none of the held-out rows.
    ingested_keys, ingested_trips = scoring.row_key_set(ingested), _trip_keys(ingested)
    assert ingested_keys == scoring.row_key_set(scoring.example_rows(stream, schema))
    assert not ingested_keys & scoring.row_key_set(held_rows)
    assert not ingested_trips & _trip_keys(held_rows)
    # The demo's own check, with a positive control in one read of the blocks: the held-out trips plus 500
    # stream rows passed off as held out count exactly those 500. The trip key flags the external file (it
    # lacks the label column, so its full rows cannot match; thousands of its trips do).
    posing = pa.concat_tables([held, stream.slice(0, 500)])
    assert scoring.held_out_overlap(data_root, demo.STREAM, blocks, posing, ledger=db) == 500
    external = _read_csv("external")
    external = external.append_column("big_tipper", pa.nulls(external.num_rows, pa.int64()))
    assert len(ingested_trips & _trip_keys(scoring.example_rows(external, schema))) > 9000
    # The first iteration's window (the newest ITERATOR["min_window"] blocks, as the iterator takes them on the
    # fresh stream; daily blocks cut at midnight of the file's clock): the majority class misses the target there.
    first_day = blocks[-demo.ITERATOR["min_window"]].split(".")[0]
    start = datetime.datetime.fromisoformat(first_day).replace(tzinfo=datetime.UTC).timestamp()
    window = ingested.filter(pa.array(demo._column(ingested, demo.TIME_COLUMN) >= start))
    assert window.num_rows == 6654
    assert _majority_accuracy(demo._column(window, demo.LABEL)) < demo.DEFAULT_TARGET - 0.05


def test_demo_target_is_above_the_majority_class(demo_split):
    """A constant predictor does not meet the demo's accuracy target on the stream or on the held-out trips."""
    stream, held = demo_split
    assert demo.DEFAULT_TARGET == 0.8
    for rows in (stream, held):
        assert _majority_accuracy(rows.column(demo.LABEL).to_numpy(zero_copy_only=False)) < demo.DEFAULT_TARGET
    held_majority = _majority_accuracy(held.column(demo.LABEL).to_numpy(zero_copy_only=False))
    assert round(held_majority, 3) == 0.730  # the figure docs/running.md quotes


def test_bench_dp_quality_test_rows_are_not_training_rows():
    from sage_tfx.bench import dp_quality

    table, train, test = dp_quality.taxi_split(seed=0)
    assert len(train) + len(test) == table.num_rows and not set(train.tolist()) & set(test.tolist())
    keys = row_keys(table)
    assert len(set(keys)) == table.num_rows  # distinct trips: an index split is a row split
    assert not {keys[i] for i in train} & {keys[i] for i in test}
    trips = row_keys(table, TRIP_KEY)
    assert not {trips[i] for i in train} & {trips[i] for i in test}


class _Tagged:
    """Wraps a bench's generator: every drawn row carries a unique ``row_id``; records the ids of the rows each
    feature call sees, split into the held-out rows (those a Task is built with) and all others."""

    def __init__(self, monkeypatch, validation):
        self.next_id, self.held, self.used = 0, set(), set()
        self.in_task = False
        base = validation.TaxiGenerator
        tagger = self

        class Generator(base):
            def draw(self, n, rng):
                rows = super().draw(n, rng)
                rows["row_id"] = np.arange(tagger.next_id, tagger.next_id + n)
                tagger.next_id += n
                return rows

        def recorded(features):
            def wrapper(rows):
                ids = rows["row_id"]  # a KeyError means rows reached the features without their tags
                (tagger.held if tagger.in_task else tagger.used).update(ids.tolist())
                return features(rows)

            return wrapper

        init = validation.Task.__init__

        def task_init(task, *args, **kwargs):
            tagger.in_task = True
            try:
                init(task, *args, **kwargs)
            finally:
                tagger.in_task = False

        monkeypatch.setattr(validation, "TaxiGenerator", Generator)
        monkeypatch.setattr(validation, "regression_xy", recorded(validation.regression_xy))
        monkeypatch.setattr(validation, "classification_xy", recorded(validation.classification_xy))
        monkeypatch.setattr(validation.Task, "__init__", task_init)


def test_bench_validation_held_out_rows_are_never_trained_or_validated_on(monkeypatch):
    from sage_tfx.bench import validation

    tags = _Tagged(monkeypatch, validation)
    parser = argparse.ArgumentParser()
    validation.add_arguments(parser)
    validation.run(
        parser.parse_args(
            [
                "--trials",
                "2",
                "--max-iterations",
                "2",
                "--holdout",
                "3000",
                "--reference-rows",
                "5000",
                "--start-rows",
                "2000",
                "--etas",
                "0.05",
            ]
        )
    )
    assert len(tags.held) == 3000 and len(tags.used) >= 5000 + 2000
    assert not tags.held & tags.used


def test_bench_sample_complexity_held_out_rows_are_never_trained_or_validated_on(monkeypatch):
    from sage_tfx.bench import sample_complexity, validation

    tags = _Tagged(monkeypatch, validation)
    parser = argparse.ArgumentParser()
    sample_complexity.add_arguments(parser)
    sample_complexity.run(
        parser.parse_args(
            [
                "--trials",
                "2",
                "--epsilons",
                "1",
                "--fractions",
                "0.5",
                "--max-rows",
                "4000",
                "--reference-rows",
                "5000",
                "--holdout",
                "3000",
            ]
        )
    )
    assert len(tags.held) == 3000 and len(tags.used) >= 5000 + 4000
    assert not tags.held & tags.used


def test_docs_name_no_unseen_external_trips():
    """The README and the docs never again call the external file's rows unseen, other or extra trips."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pages = [os.path.join(root, "README.md")] + [
        os.path.join(root, "docs", f) for f in sorted(os.listdir(os.path.join(root, "docs"))) if f.endswith(".md")
    ]
    for page in pages:
        text = open(page).read()
        for claim in ("25,002", "10,000 other real trips", "10,000 more", "the demo never read", "9,998 real trips"):
            assert claim not in text, f"{os.path.basename(page)} still says {claim!r}"


def test_demo_baselines_read_payment_type_as_stored(demo_split):
    """The demo's non-private baselines read rows as the blocks store them (strings as bytes): the credit-card
    feature is set where the trip was paid by card, and logistic regression on it alone, fitted on the stream,
    beats the majority class on the held-out trips."""
    from sage_tfx.ingest.records import schema_of

    stream, held = demo_split
    schema = schema_of(stream.schema)
    card = demo.paid_by_card(scoring.example_rows(stream, schema))
    np.testing.assert_array_equal(card, [p == "Credit Card" for p in stream.column("payment_type").to_pylist()])
    labels = stream.column(demo.LABEL).to_numpy(zero_copy_only=False)
    coef = demo.logistic_regression(card[:, None], labels)
    held_card = demo.paid_by_card(scoring.example_rows(held, schema))
    held_labels = held.column(demo.LABEL).to_numpy(zero_copy_only=False)
    accuracy = ((coef[0] * held_card + coef[1] >= 0.0) == held_labels).mean()
    assert accuracy > _majority_accuracy(held_labels) + 0.05


def test_sage_demo_refuses_a_target_outside_0_1_before_touching_anything(tmp_path, capsys):
    """`sage demo --target 500000` (the former MSE target) exits 2 naming the value, and writes nothing."""
    from sage_tfx.cli import main

    out, serving = tmp_path / "out", tmp_path / "serving"
    assert main(["demo", "--target", "500000", "--out", str(out), "--serving-dir", str(serving)]) == 2
    assert "accuracy target 500000.0" in capsys.readouterr().err
    assert not out.exists() and not serving.exists()
