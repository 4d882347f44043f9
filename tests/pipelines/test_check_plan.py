"""Know before you spend: the attempts a stream's budget allows (``plan_attempts``), a target a constant predictor
meets refused before any charge, several targets from one estimate, ``eval_share`` signed into every grant, and
the dry run's generated labels, all on a real ledger (no TensorFlow, except BlockExampleGen's split reader)."""

import json
import math
import os

import pytest

from sage_tfx.adaptive import IterationResult, IteratorSettings, SageIterator, plan_attempts
from sage_tfx.pipelines import SLA, SagePipeline
from sage_tfx.pipelines.check import (
    TrivialTarget,
    check_targets,
    estimate_accept,
    generated_rows,
    stream_plan,
    trivial_baseline,
)
from sage_tfx.pipelines.definition import PipelineDefinitionError
from sage_tfx.privacy import DEFAULT_RECORD_SPLIT, GrantError, Ledger, LedgerError, eval_share_split, record_split
from tests.helpers.cli import sage as _sage
from tests.helpers.ledgers import daily_ledger

DAY = 86400.0
MSE = SLA(metric="mse", label="fare", loss_bound=900.0)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_ledger(tmp_path, blocks=29, epsilon=1.0, policy="conserve"):
    return daily_ledger(tmp_path, blocks, epsilon=epsilon, delta=1e-6, rows=100, ids="b{:02d}", policy=policy)


def always_retry(calls):
    def run(grant, split, eta, iteration):
        calls.append(grant)
        return IterationResult("RETRY", bound=1.0)

    return run


@pytest.mark.parametrize(
    "policy,epsilon_start,min_window",
    [
        ("conserve", 0.125, 8),
        ("conserve", 0.5, 29),
        ("conserve", 0.25, 4),
        ("aggressive", 0.125, 8),
    ],
)
def test_the_plan_is_what_the_iterator_charges_when_every_attempt_retries(tmp_path, policy, epsilon_start, min_window):
    """On a 29-block stream of global epsilon 1, the attempts ``plan_attempts`` lists (read from the ledger,
    nothing charged) are exactly those the real iterator charges when each one ends in RETRY (epsilon, window,
    blocks), and then the run ends in TIMEOUT: the plan's RETRY count is the budget's."""
    ledger = make_ledger(tmp_path, policy=policy)
    settings = {"epsilon_start": epsilon_start, "min_window": min_window}
    plan = stream_plan(ledger, "s", "p", settings)
    assert ledger.grants("s") == []  # planning reads only
    calls, lines = [], []
    result = SageIterator(
        ledger, "s", "p", always_retry(calls), settings=IteratorSettings(**settings), progress=lines.append
    ).run()
    assert result.outcome == "TIMEOUT"
    charged = [(it.epsilon, len(it.blocks), tuple(it.blocks)) for it in result.iterations]
    planned = [(a.epsilon, a.window, a.blocks) for a in plan.attempts]
    assert [e for e, _, _ in charged] == pytest.approx([e for e, _, _ in planned], rel=1e-3)
    assert [(w, b) for _, w, b in charged] == [(w, b) for _, w, b in planned]
    assert plan.retries == len(result.iterations) - 1
    assert "waiting" not in "\n".join(lines) and "does not wait" in lines[-1]


def test_a_window_the_stream_cannot_fill_is_said_before_the_run(tmp_path):
    """init-pipeline's old min_window 64 on a 29-block stream: no attempt can run. The plan says so; the iterator
    ends at once in TIMEOUT, charging nothing, and its message no longer says "waiting" (sage run never waits)."""
    ledger = make_ledger(tmp_path)
    plan = stream_plan(ledger, "s", "p", {"epsilon_start": 0.25, "min_window": 64})
    assert plan.attempts == () and plan.retries == 0 and "fewer than 64 block(s)" in plan.describe()
    lines = []
    result = SageIterator(
        ledger,
        "s",
        "p",
        always_retry([]),
        settings=IteratorSettings(epsilon_start=0.25, min_window=64),
        progress=lines.append,
    ).run()
    assert result.outcome == "TIMEOUT" and ledger.grants("s") == []
    assert lines == [lines[-1]] and "TIMEOUT: fewer than 64 blocks" in lines[0] and "does not wait" in lines[0]


def test_the_estimate_lists_only_attempts_the_budget_allows(tmp_path):
    """Before: the estimate listed epsilon 0.5, 1, 2 and 4 on a stream of global epsilon 1 (2 and 4 can never
    run). At the plan's attempts it lists those the budget allows, each with its attempt's eta."""
    ledger = make_ledger(tmp_path)
    settings = {"epsilon_start": 0.5, "min_window": 8}
    assert [r.epsilon for r in estimate_accept(MSE, 300.0, settings=settings).rows] == [0.5, 1.0, 2.0, 4.0]
    plan = stream_plan(ledger, "s", "p", settings)
    estimate = estimate_accept(MSE, 300.0, settings=settings, attempts=plan.attempts)
    assert [(r.attempt, r.epsilon) for r in estimate.rows] == [(1, 0.5), (2, 0.5)]
    assert all(r.epsilon <= 1.0 for r in estimate.rows)
    assert estimate.rows[1].eta_accept < estimate.rows[0].eta_accept  # eta_2 < eta_1: more rows at the same eps
    assert estimate.rows[1].test_rows > estimate.rows[0].test_rows


def test_plan_attempts_on_a_dict():
    available = {f"b{i}": 1.0 for i in range(29)}
    plan = plan_attempts(available, epsilon_start=0.125, min_window=8)
    assert [(a.epsilon, a.window) for a in plan.attempts] == [(0.125, 8), (0.25, 8), (0.5, 8), (0.5, 16)]
    assert plan.retries == 3 and "fewer than 32 block(s)" in plan.stop
    assert len(plan_attempts(available, epsilon_start=0.125, min_window=1, max_iterations=2).attempts) == 2


# ---------------------------------------------------------------- a constant predictor's metric


def test_trivial_baselines_from_a_public_prior():
    accuracy, log_loss = SLA(metric="accuracy", label="y"), SLA(metric="log_loss", label="y")
    assert trivial_baseline(accuracy, positive_rate=0.12).value == pytest.approx(0.88)
    h = -0.12 * math.log(0.12) - 0.88 * math.log(0.88)
    assert trivial_baseline(log_loss, positive_rate=0.12).value == pytest.approx(h)
    assert trivial_baseline(MSE, label_std=15.0).value == 225.0 and not trivial_baseline(MSE, label_std=15.0).exact
    assert trivial_baseline(SLA(metric="mae", label="y", loss_bound=10.0), label_std=15.0).value == 10.0
    assert trivial_baseline(MSE) is None
    with pytest.raises(ValueError, match="--positive-rate 0.3 is for binary labels"):
        trivial_baseline(MSE, positive_rate=0.3)
    with pytest.raises(ValueError, match="--label-std 2.0 is for mse and mae.*--positive-rate"):
        trivial_baseline(accuracy, label_std=2.0)
    with pytest.raises(ValueError, match="--positive-rate 1.5"):
        trivial_baseline(accuracy, positive_rate=1.5)
    # the first user's table: 12% positives. Accuracy 0.85 is below the majority class; log loss 0.3 is not
    with pytest.raises(TrivialTarget, match=r"target\(s\) 0.85 are met by a constant predictor.*0.88"):
        check_targets(accuracy, [0.85, 0.9], trivial_baseline(accuracy, positive_rate=0.12))
    assert check_targets(accuracy, [0.85], trivial_baseline(accuracy, positive_rate=0.12), True) == [0.85]
    assert check_targets(log_loss, [0.3], trivial_baseline(log_loss, positive_rate=0.12)) == [0.3]


@pytest.fixture()
def fare_stream(tmp_path):
    """A small ingested taxi stream (20 daily blocks) and its ledger."""
    from sage_tfx.data.taxi import taxi_csv_path
    from sage_tfx.ingest.replay import Replay

    db, data = tmp_path / "ledger.db", tmp_path / "data"
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("taxi", 1.0, 1e-6)
        Replay.from_file(ledger, "taxi", str(data), taxi_csv_path("simple"), "trip_start_timestamp", "1d").run(steps=20)
    return db, data


def test_a_trivial_target_is_refused_before_any_charge(fare_stream):
    """`sage run --target 300 --label-std 15`: the mean predictor's MSE is at most 225, so target 300 certifies
    nothing a model learned. Before: the run charged its first grant. Now: exit 2 naming it, nothing charged;
    --allow-trivial-target lets --check estimate it; several targets come from one --check (--estimate-only:
    no dry run), at the attempts the ledger allows."""
    db, data = fare_stream
    example = os.path.join(ROOT, "examples", "taxi_fare", "pipeline.py")
    common = ["--db", db, "--stream", "taxi", "--data-root", data]
    out = _sage("run", example, *common, "--target", "300", "--label-std", "15", "--max-iterations", "1")
    assert out.returncode == 2 and "target(s) 300 are met by a constant predictor" in out.stderr, out.stderr[-2000:]
    assert "--allow-trivial-target" in out.stderr
    with Ledger.open(db) as ledger:
        assert ledger.grants("taxi") == []
    out = _sage(
        "run",
        example,
        *common,
        "--target",
        "300,100",
        "--check",
        "--estimate-only",
        "--label-std",
        "15",
        "--allow-trivial-target",
        "--min-window",
        "8",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "2 attempt(s) (epsilon per block on blocks: 0.5 on 8, 0.5 on 16), so 1 RETRY(s)" in text
    assert "estimate for target 300" in text and "estimate for target 100" in text
    assert "the target is met by it" in text and "the target asks more than it" in text
    assert "epsilon 1 per block" not in text and "epsilon 2 per block" not in text
    out = _sage("run", example, *common, "--target", "300,100", "--max-iterations", "1")
    assert out.returncode == 2 and "several are for --check" in out.stderr
    out = _sage("run", example, *common, "--target", "100", "--estimate-only")
    assert out.returncode == 2 and "--estimate-only is for --check" in out.stderr
    out = _sage("run", example, *common, "--target", "100", "--check", "--estimate-only", "--name", "../x")
    assert out.returncode == 2 and "--name '../x' is invalid" in out.stderr
    with Ledger.open(db) as ledger:
        assert ledger.grants("taxi") == []


# ---------------------------------------------------------------- eval_share


@pytest.mark.tf
def test_eval_share_is_signed_into_every_grant_and_read_by_blockexamplegen(tmp_path):
    """SagePipeline(eval_share=0.2): the iterator signs train 4 / eval 1 buckets into each grant; BlockExampleGen
    splits by it and refuses its old default under that grant; the estimate's rows use the 1 in 5 share."""
    from sage_tfx.components.block_example_gen_executor import granted_splits

    ledger = make_ledger(tmp_path, blocks=4)
    pipeline = SagePipeline(
        name="p", sla=MSE, trainer_module="t.py", eval_share=0.2, defaults={"epsilon_start": 0.25, "min_window": 2}
    )
    calls = []
    SageIterator(
        ledger,
        "s",
        "p",
        always_retry(calls),
        settings=IteratorSettings(max_iterations=2, **pipeline.iterator_defaults()),
    ).run()
    assert len(calls) == 2
    for grant in calls:
        verified = ledger.verify(grant.to_json())
        assert verified.meta["records"] == {
            "buckets": [["train", 4], ["eval", 1]],
            "training": ["train"],
            "test": ["eval"],
        }
        assert record_split(verified).test_share == 0.2 and pipeline.record_split() == record_split(verified)
        assert granted_splits(None, verified) == [("train", 4), ("eval", 1)]
        with pytest.raises(GrantError, match="differ from the record split signed"):
            granted_splits(json.dumps({"train": 9, "eval": 1}), verified)
    estimate = estimate_accept(MSE, 300.0, settings=pipeline.iterator_defaults())
    default = estimate_accept(MSE, 300.0, settings=pipeline.defaults)
    assert estimate.eval_share == 0.2 and default.eval_share == 0.1
    for row, old in zip(estimate.rows, default.rows):
        assert row.test_rows == old.test_rows and row.rows == 5 * row.test_rows and old.rows == 10 * old.test_rows


def test_no_eval_share_keeps_the_default_record_split(tmp_path):
    ledger = make_ledger(tmp_path, blocks=2)
    calls = []
    SageIterator(
        ledger, "s", "p", always_retry(calls), settings=IteratorSettings(max_iterations=1, epsilon_start=0.25)
    ).run()
    assert calls[0].meta["records"] == DEFAULT_RECORD_SPLIT.to_dict()


@pytest.mark.parametrize(
    "value,named",
    [
        (0.0, "eval_share 0.0 is invalid"),
        (1.0, "eval_share 1.0 is invalid"),
        (-0.2, "eval_share -0.2"),
        (0.123, "eval_share 0.123 is invalid: records are split into whole hash buckets.*e.g. 0.12"),
        ("0.2", "eval_share '0.2'"),
        (float("nan"), "eval_share nan"),
        (True, "eval_share True"),
    ],
)
def test_bad_eval_shares_are_named_before_any_charge(tmp_path, value, named):
    with pytest.raises(PipelineDefinitionError, match=named):
        SagePipeline(name="p", sla=MSE, trainer_module="t.py", eval_share=value)
    ledger = make_ledger(tmp_path, blocks=2)
    with pytest.raises(LedgerError, match=named):
        SageIterator(ledger, "s", "p", always_retry([]), settings=IteratorSettings(eval_share=value))
    assert ledger.grants("s") == []
    with pytest.raises(PipelineDefinitionError, match="unknown iterator setting"):  # one home: the field
        SagePipeline(name="p", sla=MSE, trainer_module="t.py", defaults={"eval_share": 0.2})


def test_eval_share_fractions():
    assert eval_share_split(0.1) == DEFAULT_RECORD_SPLIT
    assert eval_share_split(0.15).splits == {"train": 17, "eval": 3}
    assert eval_share_split(1 / 3).splits == {"train": 2, "eval": 1}


# ---------------------------------------------------------------- the dry run's generated rows


@pytest.mark.parametrize("metric", ["accuracy", "log_loss"])
def test_generated_labels_are_binary_for_binary_metrics(metric):
    """Before: log_loss got labels 0..23 and the validator refused them ("is not 0 or 1")."""
    table = generated_rows({"y": "int", "x": "float"}, {"by": "user", "column": "x", "shards": 2}, "y", metric, 2, 500)
    assert set(table.column("y").to_pylist()) == {0, 1}


def test_init_pipeline_fits_the_window_to_the_stream_and_states_the_plan(fare_stream, tmp_path):
    """Before: `sage init-pipeline` wrote min_window 64 for a 20-block stream, so `sage run` ended at once in
    TIMEOUT. Now the window is at most the stream's blocks (from the data root, or the ledger with --db), and
    with --db the comment states the attempts and RETRYs the budget allows, which the pipeline's own settings
    reproduce."""
    from sage_tfx.pipelines import load_pipeline

    db, data = fare_stream
    out = _sage(
        "init-pipeline",
        tmp_path / "mine",
        "--label",
        "fare",
        "--metric",
        "mse",
        "--loss-bound",
        "900",
        "--data-root",
        data,
        "--stream",
        "taxi",
        "--db",
        db,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    text = (tmp_path / "mine" / "pipeline.py").read_text()
    assert "'min_window': 20" in text and "The stream had 20 block(s)" in text
    assert "2 attempt(s) (epsilon per block on blocks: 0.25 on 20, 0.5 on 20), so 1 RETRY(s)" in " ".join(
        line.strip().lstrip("# ") for line in text.splitlines()
    )
    definition = load_pipeline(str(tmp_path / "mine" / "pipeline.py"))
    with Ledger.open(db) as ledger:
        assert stream_plan(ledger, "taxi", "mine", definition.iterator_defaults()).retries == 1
        assert ledger.grants("taxi") == []
    out = _sage(
        "init-pipeline",
        tmp_path / "other",
        "--label",
        "fare",
        "--metric",
        "mse",
        "--loss-bound",
        "900",
        "--data-root",
        data,
        "--stream",
        "taxi",
    )
    assert out.returncode == 0 and "'min_window': 20" in (tmp_path / "other" / "pipeline.py").read_text()


@pytest.mark.slow
@pytest.mark.tf
def test_check_runs_a_log_loss_pipeline_and_keeps_its_candidate_model(fare_stream, tmp_path):
    """`sage run --check` on a log_loss pipeline (a template on the taxi stream). Before: the generated labels
    were 0..23 and the validator failed ("is not 0 or 1"), and --work-dir was ignored (the model thrown away).
    Now the dry run ends in an outcome, the candidate SavedModel is under WORK_DIR/check/NAME/model, and the
    real ledger has no grant."""
    db, data = fare_stream
    out = _sage(
        "init-pipeline",
        tmp_path / "ll",
        "--label",
        "trip_start_hour",
        "--metric",
        "log_loss",
        "--data-root",
        data,
        "--stream",
        "taxi",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    work = tmp_path / "work"
    out = _sage(
        "run",
        tmp_path / "ll" / "pipeline.py",
        "--check",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--work-dir",
        work,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "check OK: ll ran end to end" in out.stdout and "is not 0 or 1" not in out.stdout + out.stderr
    model = work / "check" / "ll" / "model"
    assert (model / "saved_model.pb").is_file() and f"kept in {model}" in out.stdout
    with Ledger.open(db) as ledger:
        assert ledger.grants("taxi") == []


def test_a_scheduled_pipeline_signs_its_eval_share_into_each_run_grant(tmp_path):
    """`sage run --schedule` draws run grants (ScheduledPipeline.for_runner passes the pipeline's eval_share):
    each signs the same record split as the Sage iterator's grants, and the audit passes."""
    from sage_tfx.release.growth import BBScheduler, SchedulerParams
    from sage_tfx.release.scheduled_pipeline import ScheduledPipeline

    ledger = make_ledger(tmp_path, blocks=4)
    calls = []
    schedule = BBScheduler(SchedulerParams(epsilon=0.5, delta=1e-7, gamma=1.0, t0=2, composition="basic"))
    ScheduledPipeline(ledger, "s", "p", schedule, always_retry(calls), eval_share=0.2).advance()
    assert len(calls) == 2
    for grant in calls:
        assert record_split(ledger.verify(grant.to_json())) == eval_share_split(0.2)
    assert ledger.audit().ok
    with pytest.raises(LedgerError, match="eval_share 2 is invalid"):
        ScheduledPipeline(ledger, "s", "q", schedule, always_retry([]), eval_share=2)


def test_check_says_a_pipeline_name_with_iterations_resumes(fare_stream, tmp_path):
    """The plan starts at epsilon_start; a name that has iterations resumes after them instead, and --check says so
    (read from the ledger's history, nothing written)."""
    db, data = fare_stream
    example = os.path.join(ROOT, "examples", "taxi_fare", "pipeline.py")
    with Ledger.open(db) as ledger:
        SageIterator(
            ledger,
            "taxi",
            "taxi_fare",
            always_retry([]),
            settings=IteratorSettings(epsilon_start=0.25, min_window=4, max_iterations=1),
        ).run()
        before = len(ledger.log_entries())
    out = _sage(
        "run",
        example,
        "--check",
        "--estimate-only",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--target",
        "100",
        "--min-window",
        "4",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pipeline 'taxi_fare' has 1 iteration(s) already: a run resumes after them" in out.stdout
    with Ledger.open(db) as ledger:
        assert len(ledger.log_entries()) == before
