"""`sage serve --pipeline NAME=PIPELINE:TARGET --schedule NAME=bbscheduler:FILE` (issue 14): the named pipeline runs
under a growth schedule (BBScheduler) in its own worker, through `sage run --schedule`'s driver
(``ScheduledPipeline``): after each replay step it charges every new block the schedule's lifetime (epsilon, delta)
once, and runs the pipeline when the schedule says. Bad values exit 2 naming the value with nothing written.

The data are the first real taxi days of the tfx wheel's shipped CSV, replayed as daily blocks (tests/
test_serve_release.py's fixture)."""
import subprocess

import pytest

from sage_tfx.privacy import Ledger
from test_serve_release import DAYS, PY, GROWTH, _blocks, _days_csv, _grants, _init, _options, _serve_cmd

SCHEDULE = {"epsilon": 0.45, "delta": 1e-7, "gamma": 1.0, "t0": 100}  # t0 beyond the DAYS replayed blocks
PIPELINE = "grow=taxi_regression:300000"


@pytest.fixture(scope="module")
def replay_input(tmp_path_factory):
    return _days_csv(tmp_path_factory.mktemp("serve_schedule") / "days.csv")


BAD = [
    (["--schedule", "nope=bbscheduler:{ok}"], "--schedule nope=bbscheduler:", "no --pipeline is named 'nope'"),
    (["--release", "gr=growth:{grow}", "--schedule", "gr=bbscheduler:{ok}"], "'gr' is a --release strategy", ""),
    (["--schedule", "grow=bbscheduler:{notjson}"], "the file is not JSON", "notjson.json"),
    (["--schedule", "grow=bbscheduler:{missing}"], "the file cannot be read", "missing.json"),
    (["--schedule", "grow=bbscheduler:{zcdp}"], "composition 'zcdp'", "zcdp.json"),
    (["--schedule", "grow=bbscheduler:{typo}"], "unknown option(s) ['epsilonn']", "typo.json"),
    (["--schedule", "grow=bbimprover:{ok}"], "--schedule 'bbimprover:", "must look like bbscheduler:FILE"),
    (["--schedule", "grow"], "--schedule 'grow' must look like NAME=bbscheduler:FILE", ""),
    (["--schedule", "grow=bbscheduler:{ok}", "--schedule", "grow=bbscheduler:{ok}"],
     "pipeline 'grow' has a schedule already", ""),
]


@pytest.mark.parametrize("extra, named, also", BAD)
def test_bad_schedule_values_exit_2_with_nothing_written(tmp_path, replay_input, extra, named, also):
    """Refused before anything is opened, registered or charged: the ledger holds no block, grant or pipeline and
    its audit passes; the data root is untouched."""
    db, data = _init(tmp_path), tmp_path / "data"
    files = {"ok": _options(tmp_path, "ok", SCHEDULE), "grow": _options(tmp_path, "gr", GROWTH),
             "missing": tmp_path / "missing.json", "zcdp": _options(tmp_path, "zcdp", {**SCHEDULE, "composition": "zcdp"}),
             "typo": _options(tmp_path, "typo", {**SCHEDULE, "epsilonn": 0.45})}
    (tmp_path / "notjson.json").write_text("{epsilon: 0.5")
    files["notjson"] = tmp_path / "notjson.json"
    extra = [e.format(**files) for e in extra]
    proc = subprocess.run(_serve_cmd(db, data, replay_input, "--pipeline", PIPELINE, *extra), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr and also in proc.stderr, proc.stderr
    with Ledger.open(db) as ledger:
        assert ledger.grants() == [] and ledger.blocks("taxi") == [] and ledger.pipelines("taxi") == []
        assert ledger.audit().ok
    assert not data.exists() or not any(data.iterdir())


def test_a_scheduled_pipeline_charges_each_block_its_lifetime_once(tmp_path, replay_input):
    """A TFX pipeline under BBScheduler (t0 = 100: beyond the DAYS replayed blocks, so no run is due): its worker
    charges every replayed block the lifetime (epsilon, delta) exactly once, in a one-block grant made after the
    block arrived, draws no run grant, and the audit passes; a --release strategy beside it keeps its own grants."""
    db, data = _init(tmp_path), tmp_path / "data"
    schedule, grow = _options(tmp_path, "schedule", SCHEDULE), _options(tmp_path, "gr", GROWTH)
    proc = subprocess.run(_serve_cmd(db, data, replay_input, "--pipeline", PIPELINE, "--schedule",
                                     f"grow=bbscheduler:{schedule}", "--release", f"gr=growth:{grow}",
                                     "--work-dir", tmp_path / "work"),
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "under its growth schedule" in out and "audit: OK" in out, out
    assert (f"grow: SCHEDULED bbscheduler: 0 scheduled run(s) made, 0 resumed; {DAYS} block(s) charged their lifetime "
            "(epsilon 0.45, delta 1e-07)") in out, out
    blocks = _blocks(db)
    assert len(blocks) == DAYS
    for t, (block, _) in enumerate(blocks, 1):
        assert f"[grow] block {block}: t={t} charged its lifetime (epsilon 0.45, delta 1e-07)" in out, out
    grants = _grants(db, "grow")
    assert sorted(b for g in grants for b in g.blocks) == sorted(b for b, _ in blocks)  # each block once
    created = dict(blocks)
    for g in grants:
        assert len(g.blocks) == 1 and "draw" not in g.meta, g  # lifetime grants only: no run drawn
        assert g.epsilon == pytest.approx(0.45) and g.delta == pytest.approx(1e-7), g
        assert g.created >= created[g.blocks[0]], g
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
        for b in ledger.blocks("taxi"):  # the lifetime and the growth strategy's bound, nothing else
            assert b.spent[0] == pytest.approx(0.45 + GROWTH["epsilon"]), b
        states = {p["name"]: p["state"] for p in ledger.pipelines("taxi")}
        assert set(states) == {"grow", "gr"}, states
    audit = subprocess.run([PY, "-m", "sage_tfx", "ledger", "audit", "--db", db], capture_output=True,
                           text=True)
    assert audit.returncode == 0, audit.stdout + audit.stderr
