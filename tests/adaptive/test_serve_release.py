"""`sage serve --release NAME=STRATEGY:FILE` (the release strategies from `sage serve`): a strategy is a
serve participant in its own worker process, releasing for every new block after each replay step through
`sage release`'s own code, charging each block its whole bound once before reading it; a killed strategy worker
is restarted and resumes under its grants; bad --release values exit 2 with the ledger and data root unchanged.

No TFX here: strategy-only serve runs (the TFX side of `sage serve` is tests/adaptive/test_serve_parallel.py's). The data
are the first real taxi days of the tfx wheel's shipped CSV, replayed as daily blocks."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from sage_tfx.privacy import Ledger
from tests.helpers.kill import kill_serve_worker

PY = sys.executable
DAYS = 3
CONTINUAL = {
    "label": "tips",
    "features": ["fare", "trip_miles"],
    "scales": [100, 30],
    "intercept": True,
    "loss": "logistic",
    "positive_above": 2,
    "epsilon": 0.3,
    "delta": 1e-7,
    "rows_per_block": 100,
}
GROWTH = {"column": "fare", "bound": 100, "rows_per_block": 100, "epsilon": 0.4, "gamma": 0.5}


def _days_csv(path, days=DAYS):
    """The rows of the first ``days`` days (UTC) of the shipped taxi CSV (real rows, nothing generated)."""
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path

    table = pcsv.read_csv(taxi_csv_path("simple"))
    day = pc.divide(pc.cast(table[TIME_COLUMN], "int64"), 86400).to_numpy(zero_copy_only=False)
    keep = np.isin(day, np.unique(day)[:days])
    pcsv.write_csv(table.filter(keep), path)
    return path


@pytest.fixture(scope="module")
def replay_input(tmp_path_factory):
    return _days_csv(tmp_path_factory.mktemp("serve_release") / "days.csv")


def _init(tmp_path):
    db = tmp_path / "ledger.db"
    init = subprocess.run(
        [PY, "-m", "sage_tfx", "ledger", "init", "--db", db, "--stream", "taxi", "--epsilon", "1", "--delta", "1e-6"],
        capture_output=True,
        text=True,
    )
    assert init.returncode == 0, init.stderr
    return db


def _options(tmp_path, name, options):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(options))
    return path


def _serve_cmd(db, data, replay_input, *extra):
    return [
        PY,
        "-m",
        "sage_tfx",
        "serve",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--input",
        replay_input,
        "--time-column",
        "trip_start_timestamp",
        "--window",
        "1d",
        "--initial-blocks",
        "1",
        "--blocks-per-step",
        "1",
        *map(str, extra),
    ]


def _grants(db, pipeline):
    with Ledger.open(db) as ledger:
        return [g for g in ledger.grants("taxi") if g.pipeline == pipeline]


def _blocks(db):
    with Ledger.open(db) as ledger:
        return [(b.id, b.created) for b in ledger.blocks("taxi")]


def _check_one_grant_per_block(db, pipeline, epsilon, delta):
    """Every block charged exactly once for ``pipeline``, in one one-block grant of the strategy's whole bound, each
    charged after its block was registered (the replay added it, then the strategy asked for it)."""
    blocks = _blocks(db)
    grants = _grants(db, pipeline)
    assert sorted(b for g in grants for b in g.blocks) == sorted(b for b, _ in blocks), (grants, blocks)
    created = dict(blocks)
    with Ledger.open(db) as ledger:
        for g in grants:
            assert len(g.blocks) == 1 and g.epsilon == pytest.approx(epsilon) and g.delta == pytest.approx(delta), g
            assert g.created >= created[g.blocks[0]], g  # charged after the block arrived
            # what was computed from the block was released under its recorded grant, after the charge
            opened = ledger.releases(g.id)
            assert opened and all(r.created >= g.created for r in opened), (g, opened)
    return grants


def test_strategies_release_every_block_after_each_replay_step(tmp_path, replay_input):
    """Two strategies (continual logistic release, BBScheduler growth) and no pipeline: every replayed block is
    charged each strategy's bound once, in order, right after the replay step that added it, and released under
    that grant."""
    db, data = _init(tmp_path), tmp_path / "data"
    cont, grow = _options(tmp_path, "cr", CONTINUAL), _options(tmp_path, "gr", GROWTH)
    proc = subprocess.run(
        _serve_cmd(db, data, replay_input, "--release", f"cr=continual:{cont}", "--release", f"gr=growth:{grow}"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "audit: OK" in out
    blocks = [b for b, _ in _blocks(db)]
    assert len(blocks) == DAYS
    assert f"cr: RELEASED continual: {DAYS} block(s) charged and released, 0 resumed without a charge" in out, out
    assert f"gr: RELEASED growth: {DAYS} block(s) charged and released, 0 resumed without a charge" in out, out
    _check_one_grant_per_block(db, "cr", 0.3, 1e-7)
    _check_one_grant_per_block(db, "gr", 0.4, 0.0)
    with Ledger.open(db) as ledger:
        for b in ledger.blocks("taxi"):  # both charges and nothing else: 0.3 + 0.4 of the block's 1.0
            assert b.spent[0] == pytest.approx(0.7), b
        assert {p["name"]: p["state"] for p in ledger.pipelines("taxi")} == {"cr": "waiting", "gr": "waiting"}
    # Step by step: block k's release lines come after the replay step that added it and before the next step.
    lines = out.splitlines()
    added = {}
    for i, line in enumerate(lines):
        m = re.match(r"\[replay\] (?:step \d+: 1 new block\(s\) (\S+);|1 initial block\(s\) up to (\S+))", line)
        if m:
            added[m.group(1) or m.group(2)] = i
    assert sorted(added) == sorted(blocks), lines
    steps = sorted(added.values())
    for name, tag in (("cr", "continual"), ("gr", "growth:scheduler")):
        for block in blocks:
            at = [i for i, line in enumerate(lines) if line.startswith(f"[{name}] [{tag}] block {block}: ")]
            assert len(at) == 1 and "charged eps" in lines[at[0]], (name, block, lines)
            later = [s for s in steps if s > added[block]]
            assert added[block] < at[0] < (later[0] if later else len(lines)), (name, block, lines)


@pytest.mark.slow  # about 40 s: the replay is paced at 8 s a step so the kill lands mid-stream
def test_a_killed_strategy_worker_restarts_and_resumes_under_its_grants(tmp_path, replay_input):
    """SIGKILL the strategy's worker after its first grants: serve reports it, restarts it, and the new worker
    replays the blocks already granted with no new charge, then releases the rest; one grant per block. Then
    `sage release` on the same pipeline (the same code path) resumes every block under its grant: no charge."""
    db, data = _init(tmp_path), tmp_path / "data"
    cont = _options(tmp_path, "cr", CONTINUAL)
    cmd = _serve_cmd(db, data, replay_input, "--release", f"cr=continual:{cont}", "--step-seconds", "8")

    def charged(lines):
        charged_before = len(_grants(db, "cr"))
        assert 1 <= charged_before < DAYS
        return charged_before

    code, lines, pid, charged_before = kill_serve_worker(  # the worker, once its first block is charged and released
        cmd,
        "cr",
        lambda lines: any(line.startswith("[cr] [continual] block ") for line in lines),
        "the strategy never released a block",
        charged,
        poll=0.2,
    )
    out = "\n".join(lines)
    assert code == 0, out
    assert f"[cr] worker (pid {pid}) died (killed by SIGKILL (signal 9)); restarting (1/3)" in out, out
    assert out.count("[cr] worker started") == 2, out
    resumed = re.findall(
        r"\[cr\] \[continual\] block \S+: t=\d+ kind=\S+ resumed \(grant (\S+), nothing charged\)", out
    )
    assert len(resumed) >= charged_before, out  # the restarted worker replayed every granted block
    _check_one_grant_per_block(db, "cr", 0.3, 1e-7)  # and never charged one twice
    assert "cr: RELEASED continual:" in out and "audit: OK" in out, out
    with Ledger.open(db) as ledger:
        assert ledger.audit().ok
    # `sage release` on the same pipeline resumes every block under its grant: nothing charged, the same models.
    again = subprocess.run(
        [
            PY,
            "-m",
            "sage_tfx",
            "release",
            "continual",
            "--db",
            db,
            "--stream",
            "taxi",
            "--data-root",
            data,
            "--pipeline",
            "cr",
            "--label",
            "tips",
            "--features",
            "fare,trip_miles",
            "--scales",
            "100,30",
            "--intercept",
            "--loss",
            "logistic",
            "--positive-above",
            "2",
            "--epsilon",
            "0.3",
            "--delta",
            "1e-7",
            "--rows-per-block",
            "100",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["charged_blocks"] == 0 and summary["resumed_blocks"] == DAYS and summary["audit_ok"]
    assert [m["block"] for m in summary["models"]] == [b for b, _ in _blocks(db)], summary["models"]
    assert len(_grants(db, "cr")) == DAYS  # no second charge


BAD = [
    (["--release", "cr=sliding:{cont}"], "strategy 'sliding' is unknown"),
    (["--release", "cr=continual"], "must look like NAME=STRATEGY:FILE"),
    (["--release", "cr=continual:{missing}"], "the file cannot be read"),
    (["--release", "cr=continual:{notjson}"], "the file is not JSON"),
    (["--release", "cr=continual:{withdb}"], "option 'db' is given by `sage serve` itself"),
    (["--release", "cr=continual:{badcol}"], "column 'no_such_column' is not in stream 'taxi'"),
    (["--release", "cr=continual:{bad_eps}"], "-0.5"),
    (["--release", "cr=continual:{typo}"], "unrecognized arguments: --epsilonn"),
    (["--release", "cr=continual:{cont}", "--release", "cr=growth:{grow}"], "names must be unique"),
    (["--release", "cr=growth:{cont}"], "--release cr=growth:"),
    ([], "give at least one --pipeline"),
]


@pytest.mark.parametrize("extra, named", BAD)
def test_bad_release_values_exit_2_with_nothing_written(tmp_path, replay_input, extra, named):
    db, data = _init(tmp_path), tmp_path / "data"
    files = {
        "cont": _options(tmp_path, "cont", CONTINUAL),
        "grow": _options(tmp_path, "grow", GROWTH),
        "missing": tmp_path / "missing.json",
        "withdb": _options(tmp_path, "withdb", {**CONTINUAL, "db": "x"}),
        "badcol": _options(tmp_path, "badcol", {**CONTINUAL, "features": ["fare", "no_such_column"]}),
        "bad_eps": _options(tmp_path, "bad_eps", {**CONTINUAL, "epsilon": -0.5}),
        "typo": _options(tmp_path, "typo", {**CONTINUAL, "epsilonn": 0.3}),
    }
    (tmp_path / "notjson.json").write_text("{label: tips")
    files["notjson"] = tmp_path / "notjson.json"
    extra = [e.format(**files) for e in extra]
    proc = subprocess.run(_serve_cmd(db, data, replay_input, *extra), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr, proc.stderr
    with Ledger.open(db) as ledger:
        assert ledger.grants() == [] and ledger.blocks("taxi") == [] and ledger.pipelines("taxi") == []
    assert not data.exists() or not any(data.iterdir())


def test_a_strategy_name_running_elsewhere_is_refused(tmp_path, replay_input):
    """A name another process holds (here: this test's claim, as a running `sage release` or `sage serve` holds
    it) is refused by serve --release and by sage release, before anything is registered or charged."""
    from tests.conftest import replay_taxi_days

    db, data = replay_taxi_days(tmp_path, 1)
    cont = _options(tmp_path, "cr", CONTINUAL)
    release = [
        PY,
        "-m",
        "sage_tfx",
        "release",
        "growth",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--pipeline",
        "cr",
        "--column",
        "fare",
        "--bound",
        "100",
        "--rows-per-block",
        "100",
        "--epsilon",
        "0.4",
    ]
    with Ledger.open(db) as holder:
        holder.claim("taxi", ["cr"])
        for cmd in (_serve_cmd(db, data, replay_input, "--release", f"cr=continual:{cont}"), release):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 2, proc.stdout + proc.stderr
            assert "'cr'" in proc.stderr and "another process" in proc.stderr, proc.stderr
        assert holder.grants() == [] and holder.pipelines("taxi") == []
    ok = subprocess.run(release, capture_output=True, text=True, timeout=300)  # the claim dropped: it runs
    assert ok.returncode == 0 and len(_grants(db, "cr")) == 1, ok.stdout + ok.stderr
