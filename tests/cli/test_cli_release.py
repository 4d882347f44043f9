"""`sage release continual|incremental-regression` (sage_tfx/cli/release.py) as a subprocess on REAL taxi days.

The ledger is real (SQLite, tmp_path); the blocks are real taxi days replayed as sealed daily blocks
(tests/conftest.py's replay_taxi_days; the stream's budget is epsilon 1, delta 1e-6 per block)."""

import json

import pytest

from sage_tfx.privacy import Ledger
from sage_tfx.privacy.digests import bound_to_data
from tests.conftest import replay_taxi_days
from tests.helpers.cli import sage

EPS, DELTA = 0.5, 1e-7
FEATURES = ["--label", "tips", "--features", "fare,trip_miles", "--scales", "100,30", "--intercept"]


def continual(db, data, *extra, pipeline="cr", epsilon=EPS):
    return sage(
        "release",
        "continual",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--pipeline",
        pipeline,
        *FEATURES,
        "--loss",
        "logistic",
        "--positive-above",
        2,
        "--epsilon",
        epsilon,
        "--delta",
        DELTA,
        "--rows-per-block",
        100,
        *extra,
    )


def snapshot(db):
    with Ledger.open(db) as ledger:
        return (
            [g.id for g in ledger.grants()],
            [(b["id"], b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("taxi")["blocks"]],
            len(ledger.releases()),
        )


def spent(db, pipeline=None):
    """{block: (epsilon, delta)} summed over the grants (of ``pipeline``), as the ledger charged them."""
    with Ledger.open(db) as ledger:
        out = {}
        for g in ledger.grants("taxi"):
            if pipeline is None or g.pipeline == pipeline:
                for b in g.blocks:
                    e, d = out.get(b, (0.0, 0.0))
                    out[b] = (e + g.epsilon, d + g.delta)
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    db, data = replay_taxi_days(root, 3)
    return root, str(db), str(data)


@pytest.mark.slow(weight=20)  # 26 s alone at load 6
def test_continual_charges_each_block_once_and_resumes(world):
    root, db, data = world
    push, serve = root / "push", root / "serve"
    sla = ["--sla-target", 0.8, "--sla-epsilon", 0.25, "--push-dir", push, "--serving-dir", serve]
    first = continual(db, data, *sla, "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    with Ledger.open(db) as ledger:
        blocks = [b.id for b in ledger.blocks("taxi")]
    assert len(blocks) == 3 and [m["block"] for m in out["models"]] == blocks
    assert [m["t"] for m in out["models"]] == [1, 2, 3] and all(m["charged"] for m in out["models"])
    assert out["charged_blocks"] == 3 and out["resumed_blocks"] == 0 and out["audit_ok"]
    assert all(len(m["weights"]) == 3 and m["sla"] in ("ACCEPT", "REJECT", "RETRY") for m in out["models"])
    progress = first.stderr.splitlines()  # with --json the progress lines go to stderr
    assert progress[0].startswith(f"[continual] block {blocks[0]}: t=1 kind=base charged eps 0.5 ")
    assert all(f"wrote {push}/model-00000" in line for line in progress)
    # the Pusher convention: every model has a ModelBlessing, blessed iff its SLA check ACCEPTed, and only the
    # blessed ones are pushed (serving dir version = t)
    for m in out["models"]:
        blessing = json.loads((push / f"blessing-{m['t']:06d}" / "blessing.json").read_text())
        assert blessing["blessed"] == m["blessed"] == (m["sla"] == "ACCEPT")
        assert blessing["current_model"] == m["model"] == str(push / f"model-{m['t']:06d}")
        assert (m["pushed"] == str(serve / str(m["t"]))) == (m["sla"] == "ACCEPT")
    assert sorted(p.name for p in serve.iterdir()) == [str(m["t"]) for m in out["models"] if m["sla"] == "ACCEPT"]
    # per block: exactly ONE grant of this pipeline, charged the whole per-record bound (the parallel split's
    # max(training 0.5, validation 0.25) = 0.5), as the ledger's per-block spend shows
    assert spent(db, "cr") == {b: (pytest.approx(EPS), pytest.approx(DELTA)) for b in blocks}
    with Ledger.open(db) as ledger:
        status = {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("taxi")["blocks"]}
        assert status == {b: (pytest.approx(EPS), pytest.approx(DELTA)) for b in blocks}
        releases = ledger.releases()
        assert sorted(r.stage for r in releases) == ["training"] * 3 + ["validation"] * 3
        # each block's release: the strategy's computation on that block's registered content
        assert {r.grant_id: r.computation for r in releases if r.stage == "training"} == {
            g.id: bound_to_data(out["fingerprint"], ledger, g) for g in ledger.grants("taxi") if g.pipeline == "cr"
        }
        assert ledger.audit().ok
    assert (push / "model-000003" / "Format-Serving" / "weights.npy").exists()

    # a restart: everything is replayed under the existing grants; nothing is charged, the models are the same
    before = snapshot(db)
    again = continual(db, data, *sla, "--json")
    assert again.returncode == 0, again.stderr
    out2 = json.loads(again.stdout)
    assert snapshot(db) == before
    assert out2["charged_blocks"] == 0 and out2["resumed_blocks"] == 3
    assert [m["weights"] for m in out2["models"]] == [m["weights"] for m in out["models"]]
    assert "resumed (grant " in again.stderr and "charged eps" not in again.stderr

    # the stream grows by a day: only the new block is charged, the old ones are not charged again
    with Ledger.open(db) as ledger:
        from sage_tfx.data.taxi import TIME_COLUMN, taxi_csv_path
        from sage_tfx.ingest.replay import Replay

        Replay.from_file(ledger, "taxi", data, taxi_csv_path("simple"), TIME_COLUMN, "1d").run(steps=1)
        blocks = [b.id for b in ledger.blocks("taxi")]
    grown = continual(db, data, *sla)
    assert grown.returncode == 0, grown.stderr
    lines = grown.stdout.splitlines()
    assert sum("charged eps" in line for line in lines) == 1 and f"block {blocks[3]}: t=4 kind=base" in lines[3]
    assert spent(db, "cr") == {b: (pytest.approx(EPS), pytest.approx(DELTA)) for b in blocks}
    assert sage("ledger", "audit", "--db", db).returncode == 0

    # the same pipeline with other parameters: refused, naming them, before any charge (a second instance
    # on the same blocks would be a charge the analysis did not count)
    before = snapshot(db)
    other = continual(db, data, *sla, epsilon=0.4)
    assert other.returncode == 2 and "--pipeline 'cr' already released on stream 'taxi'" in other.stderr
    assert "epsilon=0.5" in other.stderr and "epsilon=0.4" in other.stderr and snapshot(db) == before


@pytest.mark.parametrize(
    "args,named",
    [
        (["--window", 0], "window 0 is invalid"),
        (["--epsilon", -1], "epsilon -1.0 is invalid"),
        (["--features", "fare,nope"], "column 'nope' is not in stream 'taxi'"),
        (["--features", "fare,payment_type"], "column 'payment_type' is bytes, not numeric"),
        (["--scales", "100"], "--scales '100' has 1 value(s) for 2 feature(s)"),
        (["--sla-target", 0.8], "--sla-target and --sla-epsilon go together"),
        (["--push-dir", "/proc/no/such"], "--push-dir '/proc/no/such' cannot be created"),
        (["--serving-dir", "/tmp/x"], "--serving-dir '/tmp/x' needs --push-dir"),
        (["--sla-target", 0.8, "--sla-epsilon", 2.0], "validation_epsilon 2.0 is larger than epsilon"),
        (["--loss", "softmax"], "--loss softmax needs --classes K: give the number of classes"),
        (["--classes", 3], "--classes 3 is for --loss softmax: drop --classes or give --loss softmax"),
        (["--loss", "softmax", "--classes", 1], "--classes 1 is invalid: give the number of classes, an integer >= 2"),
        (["--sampling", "bernoulli"], "invalid choice: 'bernoulli'"),
    ],
)
def test_bad_input_exits_2_naming_the_value_with_nothing_charged(world, args, named):
    root, db, data = world
    before = snapshot(db)
    proc = continual(db, data, *args, pipeline="bad")  # argparse: a flag given again overrides the default's
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert named in proc.stderr and proc.stdout == ""
    assert snapshot(db) == before  # nothing charged, no release opened


def test_softmax_with_sampling_from_the_command_line(tmp_path):
    """A multiclass (softmax) continual release from `sage release`, sampled: the label (trip_start_hour / 6,
    rounded, a class 0..3) and K = 4 declared; each block is charged once, the weights are d x K, and a rerun
    with another K is another computation, refused before any charge. (Its own ledger: the module's `world`
    blocks are spent by the other tests.)"""
    db, data = (str(p) for p in replay_taxi_days(tmp_path, 2))
    args = ["--label", "trip_start_hour", "--label-scale", 6, "--loss", "softmax", "--classes", 4]
    first = continual(db, data, *args, "--sampling", "poisson", "--json", pipeline="mc")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["params"]["loss"] == "softmax" and out["params"]["classes"] == 4
    assert out["params"]["sampling"] == "poisson" and out["audit_ok"]
    assert all(len(m["weights"]) == 3 * 4 for m in out["models"])  # (fare, miles, intercept) x 4 classes
    blocks = [m["block"] for m in out["models"]]
    assert spent(db, "mc") == {b: (pytest.approx(EPS), pytest.approx(DELTA)) for b in blocks}
    before = snapshot(db)
    other = continual(db, data, *args[:-1], 5, "--sampling", "poisson", pipeline="mc")
    assert other.returncode == 2 and "classes=4" in other.stderr and "classes=5" in other.stderr
    assert snapshot(db) == before


def test_incremental_regression_once_and_resume(world):
    root, db, data = world
    cmd = [
        "release",
        "incremental-regression",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--pipeline",
        "ir",
        *FEATURES,
        "--label-scale",
        20,
        "--epsilon",
        0.3,
        "--delta",
        DELTA,
        "--horizon",
        8,
        "--json",
    ]
    first = sage(*cmd)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    with Ledger.open(db) as ledger:
        blocks = [b.id for b in ledger.blocks("taxi")]
    assert [m["block"] for m in out["models"]] == blocks and out["charged_blocks"] == len(blocks)
    assert out["params"]["horizon"] == 8 and out["params"]["levels"] == 4 and out["audit_ok"]
    assert spent(db, "ir") == {b: (pytest.approx(0.3), pytest.approx(DELTA)) for b in blocks}
    assert "[incremental-regression] block " in first.stderr
    before = snapshot(db)
    again = sage(*cmd)
    assert again.returncode == 0, again.stderr
    assert snapshot(db) == before and json.loads(again.stdout)["resumed_blocks"] == len(blocks)
    assert [m["weights"] for m in json.loads(again.stdout)["models"]] == [m["weights"] for m in out["models"]]
    bad = sage(*[("0" if x == 8 else x) for x in cmd])
    assert bad.returncode == 2 and "horizon=0 is invalid" in bad.stderr and snapshot(db) == before


def test_help():
    for sub in ("continual", "incremental-regression"):
        proc = sage("release", sub, "--help")
        assert proc.returncode == 0 and "--epsilon" in proc.stdout and "--features" in proc.stdout


@pytest.mark.slow  # about 15 s more on the shared 2 cores; the file's other tests stay under 60 s together
def test_sliding_window_releases_the_window_and_resumes(world):
    root, db, data = world
    run = lambda: continual(  # noqa: E731
        db,
        data,
        "--window",
        2,
        "--loss",
        "squared",
        "--label-scale",
        20,
        "--json",
        pipeline="sw",
        epsilon=0.15,
    )
    first = run()
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    with Ledger.open(db) as ledger:
        blocks = [b.id for b in ledger.blocks("taxi")]
    assert out["strategy"] == "continual-sliding-window" and out["charged_blocks"] == len(blocks) >= 3
    assert [m["window_blocks"] for m in out["models"]] == [blocks[max(0, t - 2) : t] for t in range(1, len(blocks) + 1)]
    assert spent(db, "sw") == {b: (pytest.approx(0.15), pytest.approx(DELTA)) for b in blocks}
    assert "[sliding-window] block " in first.stderr and out["audit_ok"]
    before = snapshot(db)
    again = run()
    assert again.returncode == 0 and snapshot(db) == before
    assert [m["weights"] for m in json.loads(again.stdout)["models"]] == [m["weights"] for m in out["models"]]


def test_a_refused_or_failed_block_maps_to_its_exit_code(capsys):
    """The step every strategy runs per block: a budget refusal is REFUSED (exit 3), any other sage-tfx error FAILED
    (exit 1)."""
    import sys

    from sage_tfx.cli._exits import EXIT_FAILED, EXIT_REFUSED
    from sage_tfx.cli.release import EXIT_CODES
    from sage_tfx.privacy.errors import BudgetRefused, LedgerError
    from sage_tfx.release.session import SessionStatus, step

    def refused(block):
        raise BudgetRefused("taxi", "cr", {block: "epsilon 0.5 > 0.1 left"})

    def failed(block):
        raise LedgerError("the grant is gone")

    def warn(line):
        print(line, file=sys.stderr)

    assert (
        step(refused, "b1", warn) == (None, SessionStatus.REFUSED) and EXIT_CODES[SessionStatus.REFUSED] == EXIT_REFUSED
    )
    assert step(failed, "b2", warn) == (None, SessionStatus.FAILED) and EXIT_CODES[SessionStatus.FAILED] == EXIT_FAILED
    assert step(lambda block: block.upper(), "b3", warn) == ("B3", None)
    err = capsys.readouterr().err
    assert "b1: epsilon 0.5 > 0.1 left" in err and "error: block b2: the grant is gone" in err
