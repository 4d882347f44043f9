"""`sage serve --pipeline NAME=PIPELINE:TARGET --schedule NAME=bbscheduler:FILE`: the named pipeline runs
under a growth schedule (BBScheduler) in its own worker, through `sage run --schedule`'s driver
(``ScheduledPipeline``): after each replay step it charges every new block the schedule's lifetime (epsilon, delta)
once, and runs the pipeline when the schedule says. Bad values exit 2 naming the value with nothing written.

The data are the first real taxi days of the tfx wheel's shipped CSV, replayed as daily blocks (tests/
test_serve_release.py's fixture)."""

import re
import subprocess
import time

import pytest

from sage_tfx.privacy import Ledger
from sage_tfx.release.growth import BBScheduler, SchedulerParams
from tests.adaptive.test_serve_release import GROWTH, PY, _blocks, _days_csv, _grants, _init, _options, _serve_cmd
from tests.helpers.kill import kill_serve_worker

DAYS = 30  # about 300 real trips: a scheduled run's eval split (a tenth of the rows) is never empty
FIRST = 20  # the replay starts with this many blocks (--initial-blocks): the first run at t0 = 20
SCHEDULE = {"epsilon": 0.45, "delta": 1e-7, "gamma": 1.0, "t0": FIRST}
PIPELINE = "grow=taxi_regression:300000"


@pytest.fixture(scope="module")
def replay_input(tmp_path_factory):
    return _days_csv(tmp_path_factory.mktemp("serve_schedule") / "days.csv", DAYS)


BAD = [
    (["--schedule", "nope=bbscheduler:{ok}"], "--schedule nope=bbscheduler:", "no --pipeline is named 'nope'"),
    (["--release", "gr=growth:{grow}", "--schedule", "gr=bbscheduler:{ok}"], "'gr' is a --release strategy", ""),
    (["--schedule", "grow=bbscheduler:{notjson}"], "the file is not JSON", "notjson.json"),
    (["--schedule", "grow=bbscheduler:{missing}"], "the file cannot be read", "missing.json"),
    (["--schedule", "grow=bbscheduler:{zcdp}"], "composition 'zcdp' needs delta > 0", "zcdp.json"),
    (["--schedule", "grow=bbscheduler:{typo}"], "unknown option(s) ['epsilonn']", "typo.json"),
    (["--schedule", "grow=bbimprover:{ok}"], "unknown option(s) ['gamma']", "--schedule bbimprover:"),
    (["--schedule", "grow=bbimprover:{improver}"], "a 0.6 is invalid", "improver.json"),
    (["--schedule", "grow=pmwg:{ok}"], "--schedule 'pmwg:", "must look like bbscheduler:FILE"),
    (["--schedule", "grow"], "--schedule 'grow' must look like NAME=bbscheduler:FILE", ""),
    (
        ["--schedule", "grow=bbscheduler:{ok}", "--schedule", "grow=bbscheduler:{ok}"],
        "pipeline 'grow' has a schedule already",
        "",
    ),
]


@pytest.mark.parametrize("extra, named, also", BAD)
def test_bad_schedule_values_exit_2_with_nothing_written(tmp_path, replay_input, extra, named, also):
    """Refused before anything is opened, registered or charged: the ledger holds no block, grant or pipeline and
    its audit passes; the data root is untouched."""
    db, data = _init(tmp_path), tmp_path / "data"
    files = {
        "ok": _options(tmp_path, "ok", SCHEDULE),
        "grow": _options(tmp_path, "gr", GROWTH),
        "missing": tmp_path / "missing.json",
        "zcdp": _options(tmp_path, "zcdp", {**SCHEDULE, "composition": "zcdp", "delta": 0}),
        "improver": _options(tmp_path, "improver", {"epsilon": 0.45, "delta": 1e-7, "a": 0.6}),
        "typo": _options(tmp_path, "typo", {**SCHEDULE, "epsilonn": 0.45}),
    }
    (tmp_path / "notjson.json").write_text("{epsilon: 0.5")
    files["notjson"] = tmp_path / "notjson.json"
    extra = [e.format(**files) for e in extra]
    proc = subprocess.run(
        _serve_cmd(db, data, replay_input, "--pipeline", PIPELINE, *extra), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr and also in proc.stderr, proc.stderr
    with Ledger.open(db) as ledger:
        assert ledger.grants() == [] and ledger.blocks("taxi") == [] and ledger.pipelines("taxi") == []
        assert ledger.audit().ok
    assert not data.exists() or not any(data.iterdir())


def test_serve_schedule_refuses_a_name_run_for_another_target(tmp_path, replay_input):
    """`sage serve --schedule` on a pipeline name whose scheduled run was made for target 300000 (its request signed
    into the run grant, as serve signs it), asked for target 100000: exit 2 naming both targets and the fix, before
    anything is registered, charged, drawn or replayed."""
    from sage_tfx import pipelines
    from sage_tfx.adaptive import IterationResult
    from sage_tfx.release.scheduled_pipeline import ScheduledPipeline, scheduler_from_options

    db, data = _init(tmp_path), tmp_path / "data"
    options = {**SCHEDULE, "t0": 2}
    request = pipelines.load_pipeline("taxi_regression").certificate_request(300000, 0.95)
    with Ledger.open(db) as ledger:  # the first scheduled run of "grow" (its pipeline stood in for: no TFX here)
        for i in range(2):
            ledger.add_block("taxi", f"w{i}", start=i * 86400, end=(i + 1) * 86400, rows=10)
        driver = ScheduledPipeline(
            ledger,
            "taxi",
            "grow",
            scheduler_from_options(options, "test"),
            lambda *a: IterationResult("RETRY", bound=4e5),
            name="tfx:taxi_regression",
            request=request,
        )
        assert len(driver.advance(max_runs=1)) == 1
        before = (ledger.log_entries(), [g.to_json() for g in ledger.grants()], ledger.pipelines("taxi"))
    proc = subprocess.run(
        _serve_cmd(
            db,
            data,
            replay_input,
            "--pipeline",
            "grow=taxi_regression:100000",
            "--schedule",
            f"grow=bbscheduler:{_options(tmp_path, 'ok', options)}",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "target 300000.0 -> 100000.0" in proc.stderr and "bound 400000" in proc.stderr, proc.stderr
    assert "new pipeline name" in proc.stderr, proc.stderr
    with Ledger.open(db) as ledger:
        assert (ledger.log_entries(), [g.to_json() for g in ledger.grants()], ledger.pipelines("taxi")) == before
        assert [b.id for b in ledger.blocks("taxi")] == ["w0", "w1"] and ledger.audit().ok


@pytest.mark.slow
@pytest.mark.tf
def test_a_scheduled_pipeline_runs_in_serve_and_resumes_in_sage_run(tmp_path, replay_input):
    """taxi_regression under BBScheduler basic (t0 = 20, gamma = 0.5: runs at 20 and 30 blocks) beside a growth
    strategy: the worker charges every replayed block the lifetime (epsilon, delta) exactly once, in a one-block grant
    made after the block arrived, runs the TFX pipeline twice under run grants drawn from those lifetimes (the
    schedule's (epsilon_i, delta_i); nothing else charged) and the audit passes. `sage run --schedule` on the same
    pipeline (the same driver) then resumes both runs: no charge, no draw, no TFX run."""
    db, data = _init(tmp_path), tmp_path / "data"
    options = {**SCHEDULE, "gamma": 0.5}
    schedule, grow = _options(tmp_path, "schedule", options), _options(tmp_path, "gr", GROWTH)
    started = time.monotonic()
    proc = subprocess.run(
        _serve_cmd(
            db,
            data,
            replay_input,
            "--pipeline",
            PIPELINE,
            "--schedule",
            f"grow=bbscheduler:{schedule}",
            "--release",
            f"gr=growth:{grow}",
            "--rejection-share",
            "0",
            "--initial-blocks",
            FIRST - 1,
            "--work-dir",
            tmp_path / "work",
        ),
        capture_output=True,
        text=True,
        timeout=900,
    )
    elapsed = time.monotonic() - started
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "under its growth schedule" in out and "audit: OK" in out, out
    assert (
        f"grow: SCHEDULED bbscheduler: 2 scheduled run(s) made, 0 resumed; {DAYS} block(s) charged their "
        "lifetime (epsilon 0.45, delta 1e-07)"
    ) in out, out
    blocks = _blocks(db)
    assert len(blocks) == DAYS
    for t, (block, _) in enumerate(blocks, 1):
        assert f"[grow] block {block}: t={t} charged its lifetime (epsilon 0.45, delta 1e-07)" in out, out
    runs = [line for line in out.splitlines() if line.startswith("[grow] run ")]
    assert len(runs) == 2 and f"({FIRST}), epsilon_i" in runs[0] and f"({DAYS}), epsilon_i" in runs[1], out
    expected = BBScheduler(SchedulerParams(**options, composition="basic"))
    grants = _grants(db, "grow")
    lifetimes = [g for g in grants if "draw" not in g.meta]
    drawn = [g for g in grants if "draw" in g.meta]
    assert sorted(b for g in lifetimes for b in g.blocks) == sorted(b for b, _ in blocks)  # each block once
    created = dict(blocks)
    for g in lifetimes:
        assert len(g.blocks) == 1 and g.epsilon == pytest.approx(0.45) and g.delta == pytest.approx(1e-7), g
        assert g.created >= created[g.blocks[0]], g
    assert [(g.meta["draw"]["run"], len(g.blocks)) for g in drawn] == [(0, FIRST), (1, DAYS)], drawn
    with Ledger.open(db) as ledger:
        for g in drawn:
            epoch = g.meta["draw"]["run"]
            assert g.epsilon == pytest.approx(expected.epsilon_of(epoch), rel=1e-12), g
            assert g.delta == pytest.approx(expected.delta_of(epoch), rel=1e-12), g
            assert {r.stage for r in ledger.releases(g.id)} >= {"count", "training", "validation"}
        assert ledger.audit().ok
        for b in ledger.blocks("taxi"):  # the lifetime and the growth strategy's bound: run grants charge nothing
            assert b.spent[0] == pytest.approx(0.45 + GROWTH["epsilon"]), b
        assert {p["name"] for p in ledger.pipelines("taxi")} == {"grow", "gr"}
    again = subprocess.run(
        [
            PY,
            "-m",
            "sage_tfx",
            "run",
            "taxi_regression",
            "--name",
            "grow",
            "--db",
            db,
            "--stream",
            "taxi",
            "--data-root",
            data,
            "--target",
            "300000",
            "--schedule",
            f"bbscheduler:{schedule}",
            "--rejection-share",
            "0",
            "--work-dir",
            tmp_path / "work",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert f"grow: 0 scheduled run(s) made, 2 resumed; {DAYS} block(s) charged their lifetime" in again.stdout, (
        again.stdout
    )
    assert _grants(db, "grow") == grants  # nothing charged, nothing drawn
    audit = subprocess.run([PY, "-m", "sage_tfx", "ledger", "audit", "--db", db], capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    print(f"sage serve with two scheduled TFX runs took {elapsed:.0f} s")


@pytest.mark.slow
@pytest.mark.tf
def test_a_killed_scheduled_worker_resumes_without_a_second_charge_or_draw(tmp_path, replay_input):
    """SIGKILL the scheduled pipeline's worker during its first run (t0 = 20, --max-iterations 1), after its run grant
    was drawn: serve reports it and restarts it; the new worker recovers the lifetime grants from the ledger (each of
    the 20 blocks charged once) and re-runs run 0 under the SAME run grant (one draw), which then records its
    outcome; the audit passes."""
    db, data = _init(tmp_path), tmp_path / "data"
    schedule = _options(tmp_path, "schedule", SCHEDULE)
    cmd = _serve_cmd(
        db,
        data,
        replay_input,
        "--pipeline",
        PIPELINE,
        "--schedule",
        f"grow=bbscheduler:{schedule}",
        "--max-iterations",
        "1",
        "--rejection-share",
        "0",
        "--initial-blocks",
        FIRST - 1,
        "--work-dir",
        tmp_path / "work",
    )

    def drawn(lines):  # the worker, once block 20 is charged and run 0's grant drawn: its TFX run is under way
        return any(re.match(rf"\[grow\] block \S+: t={FIRST} charged", line) for line in lines) and any(
            "draw" in g.meta for g in _grants(db, "grow")
        )

    def inside_run_0(lines):
        time.sleep(1.5)  # inside run 0 (its TFX run takes several seconds)
        assert not any(line.startswith("[grow] run 0") for line in lines), lines  # not finished yet

    code, lines, pid, _ = kill_serve_worker(
        cmd, "grow", drawn, f"the scheduled worker never drew run 0 at block {FIRST}", inside_run_0
    )
    out = "\n".join(lines)
    assert code == 0, out
    assert f"[grow] worker (pid {pid}) died (killed by SIGKILL (signal 9)); restarting (1/3)" in out, out
    assert out.count("[grow] worker started") == 2, out
    assert "grow: SCHEDULED bbscheduler: 1 scheduled run(s) made, 0 resumed" in out, out
    grants = _grants(db, "grow")
    lifetimes = [g for g in grants if "draw" not in g.meta]
    drawn = [g for g in grants if "draw" in g.meta]
    assert sorted(b for g in lifetimes for b in g.blocks) == sorted(b for b, _ in _blocks(db)[:FIRST])  # once each
    assert len(lifetimes) == FIRST and all(len(g.blocks) == 1 for g in lifetimes), lifetimes
    assert [(g.meta["draw"]["run"], len(g.blocks)) for g in drawn] == [(0, FIRST)], drawn  # one draw
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
        outcomes = [o for g, o, _ in ledger.history("taxi", "grow") if "draw" in g.meta]
        assert outcomes == ["RETRY"], outcomes
