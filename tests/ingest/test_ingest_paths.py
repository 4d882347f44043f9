"""Every ingest path types a CSV alike: `sage ingest`, `sage stream replay --input` and `sage serve --input`.

The same trips in two streams of one ledger would get a fresh budget in the second; the ledger refuses it by
content digest. A replay that typed the CSV's int columns as floats wrote other digests and was let through.
Ingest also prints how it typed every column (an ISO date-time column becomes unix seconds), and what its help
says is refused and rounded holds.
"""

import os

import pytest

from sage_tfx.cli import main
from sage_tfx.ingest import access, layout
from sage_tfx.ingest.records import decode
from sage_tfx.privacy import Ledger
from tests.ingest.test_ingest_inputs import env  # noqa: F401 (a fixture)
from tests.privacy.test_ledger_bad_input import dump

T0 = 1600000000  # 2020-09-13T12:26:40Z
# Columns of every kind a CSV reader infers: int, float, text, bool, an ISO date and ISO date-times (not the time).
TRIPS = (
    "t,fare,miles,company,paid,day,pickup,dropoff\n"
    f"{T0},12,1.5,Flash Cab,true,2020-09-13,2020-09-13T12:20:00Z,2020-09-13 12:30:00\n"
    f"{T0 + 60},7,0.8,Blue Ribbon,false,2020-09-13,2020-09-13T12:21:30+02:00,2020-09-13 12:40:00\n"
    f"{T0 + 86400},30,9.25,Flash Cab,true,2020-09-14,2020-09-14T08:00:00Z,2020-09-14 08:10:00\n"
)


@pytest.fixture
def trips(env):  # noqa: F811
    """test_ingest_inputs' ledger (streams "s" and "other") and TRIPS as a CSV file."""
    path = env["tmp"] / "trips.csv"
    path.write_text(TRIPS)
    return dict(env, csv=str(path))


def _ingest(env, stream):  # noqa: F811
    return main(
        [
            "ingest",
            "--db",
            env["db"],
            "--stream",
            stream,
            "--input",
            env["csv"],
            "--data-root",
            env["data"],
            "--time-column",
            "t",
            "--window",
            "1d",
            "--quiet",
        ]
    )


def _replay(env, stream):  # noqa: F811
    return main(
        [
            "stream",
            "replay",
            "--db",
            env["db"],
            "--stream",
            stream,
            "--input",
            env["csv"],
            "--data-root",
            env["data"],
            "--time-column",
            "t",
            "--window",
            "1d",
        ]
    )


def _serve(env, stream):  # noqa: F811
    return main(
        [
            "serve",
            "--db",
            env["db"],
            "--stream",
            stream,
            "--input",
            env["csv"],
            "--data-root",
            env["data"],
            "--time-column",
            "t",
            "--window",
            "1d",
            "--pipeline",
            "a=taxi_regression:600000",
            "--work-dir",
            str(env["tmp"] / "work"),
        ]
    )


PATHS = {"ingest": _ingest, "replay": _replay, "serve": _serve}


@pytest.mark.parametrize(
    "first, second", [("ingest", "replay"), ("ingest", "serve"), ("replay", "ingest"), ("replay", "serve")]
)
def test_the_same_csv_through_another_path_into_a_second_stream_is_refused(trips, capsys, first, second):
    env = trips  # noqa: F811
    assert PATHS[first](env, "s") == 0, capsys.readouterr().err
    with Ledger.open(env["db"]) as ledger:
        assert len(ledger.blocks("s")) == 2
    capsys.readouterr()
    before = dump(env["db"])
    assert PATHS[second](env, "other") == 2
    err = capsys.readouterr().err
    assert "already registered as block '2020-09-13.1d' of stream 's'" in err, err
    assert "--allow-duplicate-of-stream s" in err and "Traceback" not in err
    assert dump(env["db"]) == before  # nothing registered, claimed or charged
    assert not os.path.exists(os.path.join(env["data"], "other"))


def test_ingest_and_replay_store_the_same_types_and_records(tmp_path):
    """Into two fresh ledgers: the same schema and the same decoded records, block by block."""
    path = tmp_path / "trips.csv"
    path.write_text(TRIPS)
    seen = {}
    for name, run in (("ingest", _ingest), ("replay", _replay)):
        env = dict(db=str(tmp_path / f"{name}.db"), data=str(tmp_path / name), csv=str(path), tmp=tmp_path)  # noqa: F811
        with Ledger.open(env["db"], create=True) as ledger:
            ledger.create_stream("s", 1.0, 1e-6)
        assert run(env, "s") == 0
        schema = layout.stream_config(env["data"], "s")["schema"]
        with Ledger.open(env["db"]) as ledger:
            blocks = [b.id for b in ledger.blocks("s")]
            rows = [
                sorted(
                    map(
                        str,
                        decode(
                            list(access.read_block_records(ledger, env["data"], "s", [b], purpose="test")), schema
                        ).to_pylist(),
                    )
                )
                for b in blocks
            ]
        seen[name] = (schema, blocks, rows)
    assert seen["ingest"] == seen["replay"]
    schema = seen["ingest"][0]
    assert schema == {
        "t": "int",
        "fare": "int",
        "miles": "float",
        "company": "bytes",
        "paid": "int",
        "day": "bytes",
        "pickup": "int",
        "dropoff": "int",
    }


@pytest.mark.parametrize("path", ["ingest", "replay"])
def test_ingest_prints_how_it_typed_every_column(trips, capsys, path):
    env = trips  # noqa: F811
    assert PATHS[path](env, "s") == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(lines) == {"t", "fare", "miles", "company", "paid", "day", "pickup", "dropoff"}, out
    assert "int" in lines["t"] and "the time column" in lines["t"]
    for name in ("pickup", "dropoff"):
        assert "ISO 8601 date-times converted to unix seconds" in lines[name] and "read as UTC" in lines[name]
    assert "ISO 8601 dates (no time) kept as text YYYY-MM-DD" in lines["day"]
    assert "true/false stored as 1/0" in lines["paid"]
    assert "32-bit floats" in lines["miles"] and "exact within +-2^53" in lines["fare"]
    with Ledger.open(env["db"]) as ledger:  # what the lines say is what is stored
        block = ledger.blocks("s")[0].id
        rows = decode(
            list(access.read_block_records(ledger, env["data"], "s", [block], purpose="test")),
            layout.stream_config(env["data"], "s")["schema"],
        ).to_pylist()
    by_time = {r["t"][0]: r for r in rows}
    assert by_time[T0]["pickup"] == [T0 - 400] and by_time[T0 + 60]["pickup"] == [T0 - 7510]  # +02:00 -> UTC
    assert by_time[T0]["dropoff"] == [T0 + 200]  # no offset: read as UTC
    assert by_time[T0]["day"] == [b"2020-09-13"] and by_time[T0]["paid"] == [1] and by_time[T0 + 60]["paid"] == [0]


def test_what_the_help_says_is_rounded_and_refused_holds(trips, capsys):
    env = trips  # noqa: F811
    path = env["tmp"] / "big.csv"
    path.write_text(f"t,exact,approx\n{T0},33554433,33554433.0\n{T0 + 1},9007199254740991,17031832200.0\n")
    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "33554433 is stored as 33554432" in help_text and "17031832200.0 as 17031832576.0" in help_text
    assert "an int of 2^53 or more in magnitude" in help_text and "exact below 2^53 in magnitude" in help_text
    assert "ISO 8601 date-times become int unix seconds" in help_text
    env["csv"] = str(path)
    assert _ingest(env, "s") == 0
    schema = layout.stream_config(env["data"], "s")["schema"]
    assert schema == {"t": "int", "exact": "int", "approx": "float"}
    with Ledger.open(env["db"]) as ledger:
        rows = decode(
            list(access.read_block_records(ledger, env["data"], "s", [ledger.blocks("s")[0].id], purpose="test")),
            schema,
        ).to_pylist()
    by_time = {r["t"][0]: r for r in rows}
    assert by_time[T0]["exact"] == [33554433] and by_time[T0 + 1]["exact"] == [9007199254740991]
    assert by_time[T0]["approx"] == [33554432.0] and by_time[T0 + 1]["approx"] == [17031832576.0]
    beyond = env["tmp"] / "beyond.csv"
    beyond.write_text(f"t,exact,approx\n{T0 + 2},9007199254740993,1.0\n")
    env["csv"] = str(beyond)
    before = dump(env["db"])
    assert _ingest(env, "s") == 2
    assert "column 'exact', row 1" in capsys.readouterr().err and dump(env["db"]) == before
