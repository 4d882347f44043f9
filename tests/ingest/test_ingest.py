"""Ingest into blocks: real taxi rows by day, idempotence, crash recovery, user shards, formats, replay, bad input."""

import datetime as dt
import os
import stat

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from sage_tfx.data.taxi import TIME_COLUMN, load_taxi, taxi_csv_path
from sage_tfx.ingest import layout
from sage_tfx.ingest.access import read_block_records
from sage_tfx.ingest.blocks import UserShards, parse_window
from sage_tfx.ingest.pipeline import ingest, ingest_batches, make_spec
from sage_tfx.ingest.records import InputError, decode, encode, schema_of, write_tfrecords
from sage_tfx.ingest.replay import Replay
from sage_tfx.privacy import Ledger


@pytest.fixture
def env(tmp_path):
    db = str(tmp_path / "ledger.db")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("taxi", 1.0, 1e-6)
    return dict(db=db, data=str(tmp_path / "data"), tmp=tmp_path)


def _rows(ledger, stream):
    return sum(ledger.private_row_count(stream, b.id) for b in ledger.blocks(stream))


def test_real_taxi_by_day_with_beam_is_exact_and_idempotent(env):
    real = load_taxi("simple")
    days = len(np.unique(real.column(TIME_COLUMN).to_numpy() // 86400))
    first = ingest(
        env["db"], "taxi", taxi_csv_path("simple"), env["data"], time_column=TIME_COLUMN, window="1d", progress=False
    )
    assert len(first["added"]) == days  # one block per distinct calendar day present
    with Ledger.open(env["db"]) as ledger:
        blocks = ledger.blocks("taxi")
        assert len(blocks) == days and _rows(ledger, "taxi") == real.num_rows  # counts add up exactly
        assert all(b.spent == (0.0, 0.0) for b in blocks)
        b = blocks[0]
        assert b.id == "2013-01-01.1d" and (b.start, b.end) == (1356998400.0, 1357084800.0)
        on_disk = sum(1 for _ in read_block_records(ledger, env["data"], "taxi", [b.id], purpose="test"))
        assert on_disk == ledger.private_row_count("taxi", b.id)
    again = ingest(
        env["db"], "taxi", taxi_csv_path("simple"), env["data"], time_column=TIME_COLUMN, window="1d", progress=False
    )
    assert again["added"] == [] and len(again["unchanged"]) == days
    with Ledger.open(env["db"]) as ledger:
        assert len(ledger.blocks("taxi")) == days and _rows(ledger, "taxi") == real.num_rows
    assert os.listdir(os.path.join(env["data"], "taxi", layout.STAGING)) == [".commit.lock"]


def _spec():
    return make_spec("time", "taxi", TIME_COLUMN, "1d")


def test_crash_between_rename_and_register_is_recovered(env, monkeypatch):
    table = load_taxi("simple").slice(0, 2000)
    with Ledger.open(env["db"]) as ledger:
        schema = schema_of(table.schema)

        def crash(*a, **k):
            raise RuntimeError("power cut")

        monkeypatch.setattr(ledger, "add_blocks", crash)
        with pytest.raises(RuntimeError):
            ingest_batches(ledger, "taxi", env["data"], table.to_batches(), _spec(), schema)
        monkeypatch.undo()
        assert ledger.blocks("taxi") == []  # renamed directories exist but nothing is visible
        left = [d for d in os.listdir(os.path.join(env["data"], "taxi")) if not d.startswith("_")]
        assert left
        result = ingest_batches(ledger, "taxi", env["data"], table.to_batches(), _spec(), schema)
        assert sorted(result["added"]) == sorted(left)
        assert _rows(ledger, "taxi") == 2000
        # Different rows for a registered block are refused, and nothing new is registered.
        changed = table.slice(0, 1999)
        with pytest.raises(InputError, match="already registered with different records"):
            ingest_batches(ledger, "taxi", env["data"], changed.to_batches(), _spec(), schema)
        assert _rows(ledger, "taxi") == 2000


def test_user_shards_keyed_hash_independent_of_other_records(env):
    table = load_taxi("simple").slice(0, 3000)
    spec = make_spec("user", "taxi", user_column="company", shards=8)
    with Ledger.open(env["db"]) as ledger:
        ledger.create_stream("users", 1.0, 1e-6)
        clean = table.filter(table.column("company").is_valid())
        result = ingest_batches(
            ledger,
            "users",
            env["data"],
            clean.to_batches(max_chunksize=700),
            make_spec("user", "users", user_column="company", shards=8),
            schema_of(clean.schema),
        )
        blocks = ledger.blocks("users")
        assert len(blocks) == len(result["added"]) <= 8
        assert {b.shard for b in blocks} <= set(range(8))
        assert _rows(ledger, "users") == clean.num_rows
    # A user's shard is a function of its own value only.
    one = spec.keys(pa.record_batch({"company": pa.array(["Acme"])}))[0]
    many = spec.keys(pa.record_batch({"company": pa.array(["x", "Acme", "y"] * 5)}))
    assert many[1] == one == UserShards("company", 8, "taxi").shard_of("Acme")
    assert UserShards("company", 8, "other key").shard_of("Acme") in range(8)
    with pytest.raises(InputError, match="empty in 1 record"):
        spec.keys(pa.record_batch({"company": pa.array(["a", None])}))


@pytest.mark.parametrize("fmt", ["csv", "parquet", "tfrecord"])
def test_three_input_formats_give_the_same_blocks(env, fmt):
    table = load_taxi("simple").slice(0, 1500)
    path = str(env["tmp"] / f"in.{fmt}")
    if fmt == "csv":
        pacsv.write_csv(table, path)
    elif fmt == "parquet":
        pq.write_table(table, path)
    else:
        from sage_tfx.ingest.records import schema_of

        write_tfrecords(path, encode(table.combine_chunks().to_batches()[0], schema_of(table.schema)))
    ingest(env["db"], "taxi", path, env["data"], time_column=TIME_COLUMN, window="1d", progress=False)
    with Ledger.open(env["db"]) as ledger:
        assert _rows(ledger, "taxi") == 1500
        assert len(ledger.blocks("taxi")) == len(np.unique(table.column(TIME_COLUMN).to_numpy() // 86400))
        first = ledger.blocks("taxi")[0]
        recs = list(read_block_records(ledger, env["data"], "taxi", [first.id], purpose="test"))
    back = decode(recs, layout.stream_config(env["data"], "taxi")["schema"])
    assert all(first.start <= v[0] < first.end for v in back.column(TIME_COLUMN).to_pylist())


def test_iso_timestamps_and_hour_windows(env):
    ts = [dt.datetime(2020, 1, 1, h, 5, tzinfo=dt.UTC) for h in (0, 0, 1, 5)]
    table = pa.table({"when": [t.strftime("%Y-%m-%dT%H:%M:%S") for t in ts], "x": [1.0, 2.0, 3.0, 4.0]})
    path = str(env["tmp"] / "iso.csv")
    pacsv.write_csv(table, path)
    ingest(env["db"], "taxi", path, env["data"], time_column="when", window="1h", progress=False)
    with Ledger.open(env["db"]) as ledger:
        assert [b.id for b in ledger.blocks("taxi")] == [
            "2020-01-01T00:00.1h",
            "2020-01-01T01:00.1h",
            "2020-01-01T05:00.1h",
        ]


def _bad(env, **kw):
    args = dict(time_column=TIME_COLUMN, window="1d", progress=False)
    args.update(kw)
    path = args.pop("path", taxi_csv_path("simple"))
    data = args.pop("data", env["data"])
    ingest(env["db"], "taxi", path, data, **args)


@pytest.mark.parametrize(
    "case,message",
    [
        ("missing time column", "time column 'no_such' is not in the input"),
        ("unparseable timestamps", "unparseable timestamp 'yesterday'"),
        ("empty input", "input is empty"),
        ("window of 0", "window '0d' is invalid"),
        ("data root not writable", "is not writable"),
    ],
)
def test_bad_input_registers_nothing(env, case, message):
    kw = {}
    if case == "missing time column":
        kw["time_column"] = "no_such"
    elif case == "unparseable timestamps":
        path = str(env["tmp"] / "bad.csv")
        pacsv.write_csv(pa.table({"t": ["2020-01-01T00:00:00", "yesterday"], "x": [1, 2]}), path)
        kw.update(path=path, time_column="t")
    elif case == "empty input":
        path = str(env["tmp"] / "empty.csv")
        with open(path, "w") as f:
            f.write("trip_start_timestamp,fare\n")
        kw["path"] = path
    elif case == "window of 0":
        kw["window"] = "0d"
    else:
        ro = env["tmp"] / "readonly"
        ro.mkdir()
        os.chmod(ro, stat.S_IRUSR | stat.S_IXUSR)
        # root may write through chmod: then use sysfs, which nobody may create directories in
        kw["data"] = str(ro) if not os.access(str(ro), os.W_OK) else "/sys/sage-test-data-root"
    with pytest.raises(InputError, match=message):
        _bad(env, **kw)
    with Ledger.open(env["db"]) as ledger:
        assert ledger.blocks("taxi") == []


def test_window_parsing():
    assert parse_window("1d") == 86400 and parse_window("6h") == 21600 and parse_window("90s") == 90
    for bad in ("0d", "-1h", "1y", "", "d", "0.5s"):
        with pytest.raises(InputError, match="window"):
            parse_window(bad)


def test_replay_grows_block_by_block_with_zero_spend(env):
    with Ledger.open(env["db"]) as ledger:
        replay = Replay.from_file(ledger, "taxi", env["data"], taxi_csv_path("simple"), TIME_COLUMN, "1d")
        total = replay.remaining
        clocks = []
        for n in range(1, 6):
            step = replay.step()
            clocks.append(step.clock)
            status = ledger.status("taxi")
            assert len(status["blocks"]) == n  # one fresh block per step
            assert status["blocks"][-1]["id"] == step.block and status["blocks"][-1]["epsilon_spent"] == 0.0
            assert not step.generated
        assert clocks == sorted(clocks) and replay.remaining == total - 5
        # A new replay resumes after what is registered; real-time mode sleeps between blocks.
        again = Replay.from_file(ledger, "taxi", env["data"], taxi_csv_path("simple"), TIME_COLUMN, "1d")
        assert again.remaining == total - 5
        steps = again.run(steps=2, realtime=True, speedup=86400 * 50)
        assert [s.added for s in steps] == [True, True] and len(ledger.blocks("taxi")) == 7


def test_replay_of_generated_rows_is_labelled(env):
    from sage_tfx.data.generator import TaxiGenerator

    table = TaxiGenerator(seed=3, rows_per_day=500).table(1500)
    with Ledger.open(env["db"]) as ledger:
        steps = Replay(ledger, "taxi", env["data"], table, TIME_COLUMN, "1d").run()
        assert [s.generated for s in steps] == [True] * 3 and _rows(ledger, "taxi") == 1500
    assert layout.stream_config(env["data"], "taxi")["schema"]["generated"] == "int"


def test_cli_ingest_and_replay(env, capsys):
    from sage_tfx.cli import main

    rc = main(
        [
            "ingest",
            "--db",
            env["db"],
            "--stream",
            "taxi",
            "--input",
            taxi_csv_path("simple"),
            "--data-root",
            env["data"],
            "--block-by",
            "time",
            "--time-column",
            TIME_COLUMN,
            "--window",
            "1w",
            "--direct_num_workers=1",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "block(s) added" in out
    rc = main(
        [
            "ingest",
            "--db",
            env["db"],
            "--stream",
            "taxi",
            "--input",
            taxi_csv_path("simple"),
            "--data-root",
            env["data"],
            "--time-column",
            TIME_COLUMN,
            "--window",
            "0d",
        ]
    )
    assert rc == 2 and "window '0d' is invalid" in capsys.readouterr().err
    replay = [
        "stream",
        "replay",
        "--db",
        env["db"],
        "--data-root",
        env["data"],
        "--generated-rows",
        "100",
        "--rows-per-day",
        "50",
    ]
    rc = main(replay + ["--stream", "taxi", "--window", "1d"])
    assert rc == 2 and "blocked by" in capsys.readouterr().err  # the stream keeps one block rule (weekly)
    with Ledger.open(env["db"]) as ledger:
        ledger.create_stream("gen", 1.0, 1e-6)
    rc = main(replay + ["--stream", "gen", "--window", "1d"])
    captured = capsys.readouterr()
    assert rc == 0 and "(GENERATED)" in captured.out and "GENERATED taxi-like data" in captured.err
