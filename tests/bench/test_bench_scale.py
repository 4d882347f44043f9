"""sage bench scale: argument checks, the input split, the block comparison and the ACCEPT count (fast), and a
tiny end-to-end ingest run on the in-process DirectRunner and a 2-worker Dask LocalCluster (slow). Checks the
JSON keys and that the values are sane, never speed."""

import argparse
import contextlib
import json
import types

import pytest

from sage_tfx.bench import scale as bench


def _parse(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rows", "0"], "--rows must be >= 1, got 0"),
        (["--warm-rows", "1"], "--warm-rows must be >= 2, got 1"),
        (["--rows", "5", "--files", "6"], r"--files \(6\) must be at most --rows \(5\)"),
        (["--setups", "direct,spark"], "'spark' is not one of"),
        (["--setups", "direct,direct"], "distinct"),
    ],
)
def test_bad_arguments_name_the_value(argv, message):
    with pytest.raises(SystemExit, match=message):
        bench.run(_parse(*argv))


@pytest.mark.parametrize("value, message", [("1,x", "'x' is not a whole number >= 1"), ("0,2", "'0' is not")])
def test_a_bad_serve_parallel_is_a_usage_error(capsys, value, message):
    with pytest.raises(SystemExit) as exc:
        _parse("--serve-parallel", value)
    assert exc.value.code == 2 and f"argument --serve-parallel: {value!r}: {message}" in capsys.readouterr().err


def test_inputs_split_consecutive_rows_over_files(tmp_path):
    import pyarrow.csv as pacsv

    from sage_tfx.data.generator import TaxiGenerator

    paths = bench.write_inputs(str(tmp_path), 1_001, 3, 400, seed=5)
    tables = [pacsv.read_csv(p) for p in paths]
    assert [t.num_rows for t in tables] == [333, 334, 334]
    whole = [ts for t in tables for ts in t.column("trip_start_timestamp").to_pylist()]
    want = TaxiGenerator(seed=5, rows_per_day=400).table(1_001).column("trip_start_timestamp").to_pylist()
    assert whole == want  # the generator's rows, in order, each once
    assert all(g == 1 for t in tables for g in t.column("generated").to_pylist())


def test_compare_blocks_names_the_setup_and_the_block():
    want = {"2017-01-01": (10, "aa"), "2017-01-02": (5, "bb")}
    bench.compare_blocks("x", dict(want), want)
    with pytest.raises(RuntimeError, match=r"setup dask2 .*different rows/digest \[\('2017-01-02', \(5, 'cc'\)"):
        bench.compare_blocks("dask2", {"2017-01-01": (10, "aa"), "2017-01-02": (5, "cc")}, want)
    with pytest.raises(RuntimeError, match=r"missing \['2017-01-02'\]"):
        bench.compare_blocks("dask2", {"2017-01-01": (10, "aa")}, want)


def test_portable_setup_passes_the_clusters_beam_args(monkeypatch):
    clusters = pytest.importorskip("sage_tfx.clusters")

    seen = {}

    @contextlib.contextmanager
    def fake(*, workers):
        seen["workers"] = workers
        yield types.SimpleNamespace(beam_args=["--runner=PortableRunner", "--job_endpoint=127.0.0.1:1"])

    monkeypatch.setattr(clusters, "portable_cluster", fake)
    with bench._setup("portable2", 2) as beam_args:
        assert beam_args == ["--runner=PortableRunner", "--job_endpoint=127.0.0.1:1"] and seen == {"workers": 2}


def test_outcomes_are_counted_from_the_ledger(tmp_path):
    from sage_tfx.privacy import Ledger

    db = str(tmp_path / "ledger.db")
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("taxi", 3.0, 1e-6)
        ledger.add_block("taxi", "b1", start=1_483_228_800, end=1_483_315_200)
        for name in ("p1", "p2", "p3"):
            ledger.register("taxi", name)
        ledger.record_outcome(ledger.request("p1", "taxi", blocks=["b1"], epsilon=0.1).id, "ACCEPT")
        ledger.record_outcome(ledger.request("p2", "taxi", blocks=["b1"], epsilon=0.1).id, "RETRY")
        ledger.request("p2", "taxi", blocks=["b1"], epsilon=0.1)  # running or killed: no outcome yet
    assert bench.count_outcomes(db, "taxi") == {"p1": ["ACCEPT"], "p2": ["RETRY", None], "p3": []}


@pytest.mark.slow
def test_tiny_run_keys_and_sanity():
    pytest.importorskip("sage_tfx.clusters")  # the Dask setup's launcher
    figures = bench.run(_parse("--tiny", "--setups", "direct,dask2"))
    json.dumps(figures)  # --json can print it
    assert "GENERATED" in figures["data"] and figures["tiny"] is True and "serve" not in figures
    assert figures["code"].endswith("sage_tfx")
    assert figures["machine_start"]["cores"] >= 1 and len(figures["machine_end"]["load_average"]) == 3
    ing = figures["ingest"]
    assert ing["baseline"] == "direct" and ing["rows"] == bench.TINY["rows"] and ing["files"] == bench.TINY["files"]
    assert ing["blocks"] == bench.TINY["rows"] // bench.TINY["rows_per_day"]
    assert list(ing["setups"]) == ["direct", "dask2"]
    for _name, s in ing["setups"].items():
        assert s["same_blocks_rows_digests_as_baseline"] is True
        assert len(s["seconds_all"]) == len(s["rows_per_second_all"]) == len(s["ratio_all"]) == 1
        assert s["rows_per_second"] == pytest.approx(ing["rows"] / s["seconds_all"][0], rel=1e-2)
        assert s["start_seconds"] >= 0 and s["warmup_seconds"] > 0
    assert ing["setups"]["direct"]["ratio"] == 1.0 and ing["setups"]["direct"]["beam_args"] == []
    dask = ing["setups"]["dask2"]
    assert dask["ratio"] == pytest.approx(
        dask["rows_per_second"] / ing["setups"]["direct"]["rows_per_second"], rel=2e-2
    )
    assert "--runner=dask" in dask["beam_args"]
