"""`sage release growth|pmwg` (sage_tfx/cli/release.py) as a subprocess on REAL taxi days.

The ledger is real (SQLite, tmp_path); the blocks are the first three real taxi days replayed as sealed daily
blocks (tests/conftest.py's replay_taxi_days; the stream's budget is epsilon 1, delta 1e-6 per block)."""

import json

import pytest

from sage_tfx.privacy import Ledger
from sage_tfx.privacy.digests import bound_to_data
from sage_tfx.release.growth import BBImprover, BBScheduler, ImproverParams, PMWGParams, SchedulerParams
from tests.conftest import replay_taxi_days
from tests.helpers.cli import sage

QUERIES = [
    {"count": {"fare": [0, 10]}},
    {"sum": "fare", "bound": 100, "where": {"trip_miles": [0, 5]}},
    {"count": {"trip_miles": [5, 30]}, "at": 2},
]


def growth(db, data, *extra, pipeline="g", epsilon=0.2):
    return sage(
        "release",
        "growth",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--pipeline",
        pipeline,
        "--column",
        "fare",
        "--bound",
        100,
        "--rows-per-block",
        100,
        "--epsilon",
        epsilon,
        *extra,
    )


def pmwg(db, data, queries, *extra, pipeline="pm", epsilon=0.2):
    return sage(
        "release",
        "pmwg",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--pipeline",
        pipeline,
        "--bins",
        "fare=0:100:10,trip_miles=0:30:6",
        "--queries",
        queries,
        "--rows-per-block",
        100,
        "--epsilon",
        epsilon,
        *extra,
    )


def snapshot(db):
    with Ledger.open(db) as ledger:
        return (
            [g.id for g in ledger.grants()],
            [(b["id"], b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("taxi")["blocks"]],
            len(ledger.releases()),
        )


def spent(db, pipeline):
    """{block: (epsilon, delta)} summed over ``pipeline``'s grants, as the ledger charged them."""
    with Ledger.open(db) as ledger:
        out = {}
        for g in ledger.grants("taxi"):
            if g.pipeline == pipeline:
                for b in g.blocks:
                    e, d = out.get(b, (0.0, 0.0))
                    out[b] = (e + g.epsilon, d + g.delta)
        return out


def blocks_of(db):
    with Ledger.open(db) as ledger:
        return [b.id for b in ledger.blocks("taxi")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("growth")
    db, data = replay_taxi_days(root, 3)
    queries = root / "queries.jsonl"
    queries.write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    return root, str(db), str(data), str(queries)


def test_growth_scheduler_charges_the_bound_once_runs_on_schedule_and_resumes(world):
    root, db, data, _ = world
    first = growth(db, data, "--gamma", 1.0, "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    blocks = blocks_of(db)
    schedule = BBScheduler(SchedulerParams(epsilon=0.2, gamma=1.0))
    plan = {t: schedule.run_at(t) for t in range(1, len(blocks) + 1)}
    assert [b["block"] for b in out["blocks"]] == blocks and out["charged_blocks"] == 3 and out["audit_ok"]
    # gamma 1: runs at t = 1, 2, 4 -> t = 3 keeps the last output
    assert [r["t"] for r in out["runs"]] == [t for t, p in plan.items() if p] == [1, 2]
    assert [r["epsilon_i"] for r in out["runs"]] == [pytest.approx(plan[t][1]) for t in (1, 2)]
    assert out["current"] == out["runs"][-1]["mean"]
    assert "t=3 charged eps 0.2 delta 0 no run" in first.stderr
    # the ledger's per-block spend is the schedule's whole per-record bound, charged once; audit OK
    assert spent(db, "g") == {b: (pytest.approx(0.2), 0.0) for b in blocks}
    with Ledger.open(db) as ledger:
        grants = {g.id: g for g in ledger.grants("taxi")}
        ours = {b["grant"] for b in out["blocks"]}
        assert {r.grant_id: r.computation for r in ledger.releases() if r.grant_id in ours} == {
            g: bound_to_data(out["fingerprint"], ledger, grants[g]) for g in ours
        }
        assert ledger.audit().ok
    assert sage("ledger", "audit", "--db", db).returncode == 0

    # a restart replays under the existing grants: nothing charged, the same outputs (the grants' noise)
    before = snapshot(db)
    again = growth(db, data, "--gamma", 1.0, "--json")
    assert again.returncode == 0, again.stderr
    out2 = json.loads(again.stdout)
    assert snapshot(db) == before and out2["resumed_blocks"] == 3 and out2["charged_blocks"] == 0
    assert out2["runs"] == out["runs"] and "charged eps" not in again.stderr

    # other parameters on the same pipeline: refused (exit 2) before any charge, naming them
    other = growth(db, data, "--gamma", 0.5)
    assert other.returncode == 2 and "gamma=1.0" in other.stderr and "gamma=0.5" in other.stderr
    assert snapshot(db) == before


def test_growth_improver_with_delta_charges_epsilon_and_delta(world):
    root, db, data, _ = world
    proc = growth(db, data, "--schedule", "improver", "--delta", 1e-8, "--a", 0.2, "--json", pipeline="gi", epsilon=0.1)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    blocks = blocks_of(db)
    improver = BBImprover(ImproverParams(epsilon=0.1, delta=1e-8, a=0.2))
    assert [r["t"] for r in out["runs"]] == [1, 2, 3]
    assert [r["epsilon_i"] for r in out["runs"]] == [pytest.approx(improver.epsilon_of(t)) for t in (1, 2, 3)]
    assert spent(db, "gi") == {b: (pytest.approx(0.1), pytest.approx(1e-8)) for b in blocks}
    assert out["audit_ok"] and "[growth:improver] block " in proc.stderr


def test_pmwg_answers_the_declared_stream_charges_once_and_resumes(world):
    root, db, data, queries = world
    first = pmwg(db, data, queries, "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    blocks = blocks_of(db)
    # two standing queries after every block, the third once at t = 2
    assert [(a["t"], a["query"]) for a in out["answers"]] == [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (3, 1), (3, 2)]
    for a in out["answers"]:  # estimates in the query's units: fraction times the public n (times B for sums)
        scale = 100 * a["t"] * (100 if a["query"] == 2 else 1)
        assert a["estimate"] == pytest.approx(a["fraction"] * scale)
    assert spent(db, "pm") == {b: (pytest.approx(0.2), 0.0) for b in blocks} and out["audit_ok"]
    assert out["params"]["strategy"] == "pmwg" and "queries_sha256" in out["params"]["computation"]
    assert "[pmwg] block " in first.stderr and " hard used)" in first.stderr
    # the hard-query budget grows with the declared size n = 100 t: floor(20 (1 + ln t)) (Corollary 16)
    assert "/20 hard used)" in first.stderr.splitlines()[0] and "/33 hard used)" in first.stderr.splitlines()[1]
    assert "/41 hard used)" in first.stderr.splitlines()[2]

    before = snapshot(db)
    again = pmwg(db, data, queries, "--json")
    assert again.returncode == 0, again.stderr
    assert snapshot(db) == before and json.loads(again.stdout)["answers"] == out["answers"]

    # another query stream on the same pipeline is another PMWG run on the same records: refused before a charge
    changed = root / "changed.jsonl"
    changed.write_text(json.dumps({"count": {"fare": [0, 20]}}) + "\n")
    other = pmwg(db, data, changed)
    assert other.returncode == 2 and "already released" in other.stderr and "computation=" in other.stderr
    assert snapshot(db) == before


@pytest.mark.parametrize(
    "extra,named",
    [
        (["--bound", -1], "bound -1.0 is invalid"),
        (["--column", "nope"], "column 'nope' is not in stream 'taxi'"),
        (["--column", "payment_type"], "column 'payment_type' is bytes, not numeric"),
        (["--gamma", 0], "gamma 0.0 is invalid"),
        (["--schedule", "improver"], "delta 0.0 is invalid"),
        (["--rows-per-block", 0], "rows_per_block 0 is invalid"),
        (["--epsilon", 0], "epsilon 0.0 is invalid"),
        (["--composition", "zcdp"], "composition 'zcdp' needs delta > 0"),
        (["--schedule", "improver", "--delta", 1e-8, "--composition", "basic"], "--composition 'basic' is for"),
    ],
)
def test_growth_bad_input_exits_2_with_nothing_charged(world, extra, named):
    root, db, data, _ = world
    before = snapshot(db)
    proc = growth(db, data, *extra, pipeline="bad")
    assert proc.returncode == 2 and named in proc.stderr and proc.stdout == "", (proc.stdout, proc.stderr)
    assert snapshot(db) == before


@pytest.mark.parametrize(
    "lines,extra,named",
    [
        (None, ["--bins", "fare=0:100"], "--bins part 'fare=0:100' is invalid"),
        (None, ["--bins", "fare=5:1:3"], "give finite LO < HI"),
        (None, ["--bins", "nope=0:1:2"], "column 'nope' is not in stream 'taxi'"),
        (['{"count": {"tips": [0, 1]}}'], [], "line 1: column 'tips' is not in --bins"),
        (['{"count": {"fare": [0, 10]}}', "{nope"], [], "--queries line 2 is not JSON"),
        (['{"count": {"fare": [10, 0]}}'], [], "range [10, 0] of 'fare' is invalid"),
        (['{"sum": "fare"}'], [], "bound None is invalid"),
        (['{"count": {"fare": [0, 1]}, "at": 0}'], [], "at 0 is invalid"),
        (['{"count": {}, "sum": "fare"}'], [], "exactly one of"),
        (['{"count": {}, "every": 2}'], [], "unknown key(s) ['every']"),
        ([], [], "holds no query"),
        (None, ["--hard-budget", 0], "hard_budget 0 is invalid"),
        (None, ["--growth-exponent", 2], "growth_exponent 2.0 is invalid"),
        (None, ["--queries", "/no/such/file"], "--queries '/no/such/file' cannot be read"),
        (None, ["--delta", 1.5], "delta 1.5 is invalid"),
        (None, ["--delta=-1e-09"], "delta -1e-09 is invalid"),
    ],
)
def test_pmwg_bad_input_exits_2_with_nothing_charged(world, lines, extra, named):
    root, db, data, queries = world
    if lines is not None:
        queries = root / "bad.jsonl"
        queries.write_text("".join(line + "\n" for line in lines))
    before = snapshot(db)
    proc = pmwg(db, data, queries, *extra, pipeline="bad")
    assert proc.returncode == 2 and named in proc.stderr and proc.stdout == "", (proc.stdout, proc.stderr)
    assert snapshot(db) == before


def test_help():
    for sub, flag in (("growth", "--schedule"), ("pmwg", "--queries")):
        proc = sage("release", sub, "--help")
        assert proc.returncode == 0 and "--epsilon" in proc.stdout and flag in proc.stdout


def test_growth_scheduler_basic_composition_charges_epsilon_and_delta(world):
    root, db, data, _ = world
    proc = growth(db, data, "--delta", 1e-8, "--composition", "basic", "--json", pipeline="gb", epsilon=0.1)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    schedule = BBScheduler(SchedulerParams(epsilon=0.1, delta=1e-8, composition="basic"))
    assert [(r["epsilon_i"], r["delta_i"]) for r in out["runs"]] == [
        (pytest.approx(schedule.run_budget(t)[1]), pytest.approx(schedule.run_budget(t)[2])) for t in (1, 2, 3)
    ]
    assert spent(db, "gb") == {b: (pytest.approx(0.1), pytest.approx(1e-8)) for b in blocks_of(db)}
    assert out["audit_ok"] and " delta_i " in proc.stderr


def test_pmwg_with_delta_charges_epsilon_and_delta_and_signs_it(world):
    # (epsilon, delta) PMWG (Theorem 17) from the command line: every block charged (epsilon, delta) once, the delta
    # signed into the grants' meta; a restart with another delta is another computation, refused before a charge
    root, db, data, queries = world
    proc = pmwg(db, data, queries, "--delta", 1e-8, "--json", pipeline="pmd")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert spent(db, "pmd") == {b: (pytest.approx(0.2), pytest.approx(1e-8)) for b in blocks_of(db)}
    assert out["delta"] == 1e-8 and out["params"]["delta"] == 1e-8 and out["audit_ok"]
    assert "charged eps 0.2 delta 1e-08" in proc.stderr
    with Ledger.open(db) as ledger:
        assert {g.meta["delta"] for g in ledger.grants("taxi") if g.pipeline == "pmd"} == {1e-8}
    # zCDP composition of the rounds: a larger per-round epsilon than the pure run's at the same epsilon
    assert PMWGParams(epsilon=0.2, delta=1e-8).round_scale > PMWGParams(epsilon=0.2).round_scale

    before = snapshot(db)
    other = pmwg(db, data, queries, "--delta", 1e-7, pipeline="pmd")
    assert other.returncode == 2 and "delta=1e-08" in other.stderr and "delta=1e-07" in other.stderr
    assert snapshot(db) == before
