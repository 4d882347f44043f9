"""`sage run --check --target`: the estimate of the rows and epsilon at which the validator's ACCEPT test passes
(pipelines/check.py estimate_accept), checked against the validator's own functions and the validator class."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from sage_tfx.pipelines.check import (
    AcceptEstimate,
    accept_passes,
    describe_estimate,
    estimate_accept,
    iterator_settings,
)
from sage_tfx.pipelines.definition import SLA
from sage_tfx.validation.core import Mode, NoisyTotal
from sage_tfx.validation.noisy import confidence_limit

MSE = SLA(metric="mse", label="fare", loss_bound=900.0)
ACCURACY = SLA(metric="accuracy", label="big_tipper")
CASES = [(MSE, 300.0, None), (MSE, 300.0, 250.0), (ACCURACY, 0.8, None), (ACCURACY, 0.7, 0.75)]


def _limit(sla, n, expected, epsilon, eta):
    """The validator's reported bound (joint_decision's confidence_limit) at n rows whose released sums equal their
    expectations, in the SLA's unit: the upper limit on the loss, or the lower limit on the accuracy."""
    bound, mean, binomial = (
        (1.0, 1.0 - expected, True) if sla.metric == "accuracy" else (sla.loss_bound, expected, False)
    )
    total, complement = NoisyTotal(n * mean, bound / epsilon), NoisyTotal(n * (bound - mean), bound / epsilon)
    limit = confidence_limit(total, complement, bound, eta, Mode.SAGE, -1, binomial)
    return 1.0 - limit if sla.metric == "accuracy" else limit


def _meets(sla, value, target):
    return value >= target if sla.metric == "accuracy" else value <= target


@pytest.mark.parametrize("sla,target,expected", CASES)
def test_estimate_is_where_the_validators_bound_crosses_the_target(sla, target, expected):
    """At the estimated n the validator's bound at the expected metric meets the target; at n - 1 and n/2 it does
    not (so the estimate is the least such n), for each epsilon of the estimate."""
    estimate = estimate_accept(sla, target, expected=expected, settings={"epsilon_start": 0.25})
    assert isinstance(estimate, AcceptEstimate) and len(estimate.rows) == 4
    assert [r.epsilon for r in estimate.rows] == [0.25, 0.5, 1.0, 2.0]
    for row in estimate.rows:
        n = row.test_rows
        assert n is not None and n > 1
        args = dict(
            metric=sla.metric,
            target=target,
            expected=estimate.expected,
            bound=estimate.bound,
            epsilon=row.validation_epsilon,
            eta_accept=row.eta_accept,
        )
        assert accept_passes(n, **args) and not accept_passes(n - 1, **args) and not accept_passes(n // 2, **args)
        at = lambda m: _limit(sla, m, estimate.expected, row.validation_epsilon, row.eta_accept)  # noqa: B023, E731
        # confidence_limit solves for tau to 1e-9 B: compare with that tolerance
        tol = 1e-6 * estimate.bound
        assert _meets(sla, at(n) + (tol if sla.metric == "accuracy" else -tol), target), (row, at(n))
        assert not _meets(sla, at(n - 1) - (tol if sla.metric == "accuracy" else -tol), target), (row, at(n - 1))
        assert not _meets(sla, at(n // 2), target)
        assert row.rows == math.ceil(n / estimate.eval_share - 1e-9)


def test_defaults_and_the_iterators_split():
    """The default guess is half the target (accuracy: half the target's error rate); the split is the iterator's
    (BudgetSplit.for_epsilon with its shares: the ACCEPT test gets all of what preprocessing and the count leave,
    and half of eta_i when a REJECT test runs); eta_i = eta / (i (i+1))."""
    from sage_tfx.privacy import BudgetSplit

    e = estimate_accept(MSE, 300.0)
    assert e.expected == 150.0 and e.expected_is_default
    assert estimate_accept(ACCURACY, 0.8).expected == pytest.approx(0.9)
    s = iterator_settings({})
    first = e.rows[0]
    assert first.epsilon == s["epsilon_start"] and first.attempt == 1
    split = BudgetSplit.for_epsilon(
        first.epsilon,
        0.0,
        s["preprocessing_share"],
        s["count_share"],
        rejection_share=s["rejection_share"],
        disjoint_split=s["disjoint_split"],
    )
    assert first.validation_epsilon == pytest.approx(split.validation)
    assert [r.eta_accept for r in e.rows] == pytest.approx([0.05 / (i * (i + 1)) for i in range(1, 5)])
    with_reject = estimate_accept(MSE, 300.0, settings={"rejection_share": 0.1})
    assert [r.eta_accept for r in with_reject.rows] == pytest.approx([0.025 / (i * (i + 1)) for i in range(1, 5)])
    assert all(a.test_rows >= b.test_rows for a, b in zip(with_reject.rows, e.rows))  # a smaller eta needs more
    # a guess closer to the target needs more rows; out of reach when it nearly meets it
    closer = estimate_accept(MSE, 300.0, expected=280.0)
    assert all(a.test_rows > b.test_rows for a, b in zip(closer.rows, e.rows))
    tight = estimate_accept(MSE, 300.0, expected=299.999)
    assert all(r.test_rows is None for r in tight.rows)
    text = "\n".join(describe_estimate(tight, min_window=4))
    assert "out of reach" in text and "first window is 4 block(s)" in text and "training: not estimated" in text


@pytest.mark.parametrize(
    "sla,target,expected,named",
    [
        (MSE, 300.0, 300.0, "expected loss 300.0 must be in"),
        (MSE, 300.0, -1.0, "expected loss -1.0"),
        (MSE, 300.0, float("nan"), "expected loss nan"),
        (ACCURACY, 0.8, 0.8, "expected accuracy 0.8 must be above"),
        (ACCURACY, 0.8, 1.5, "expected accuracy 1.5"),
        (MSE, 900.0, None, "at least the loss bound"),
        (ACCURACY, 1.0, None, "must lie in"),
    ],
)
def test_bad_guesses_and_targets_are_named(sla, target, expected, named):
    with pytest.raises(ValueError, match=named):
        estimate_accept(sla, target, expected=expected)


def test_the_validator_itself_accepts_above_the_estimate_and_not_below():
    """DPLossValidator / DPAccuracyValidator as DPModelValidator builds them (make_validator), on test sets whose
    mean is exactly the guess, at an epsilon so large that the noise (Lap(B/1e6)) is negligible: ACCEPT at 1.1 n,
    RETRY at 0.9 n. (The estimate's rows shrink from 0.9 n to 1.1 n only through the data, so the validator's own
    decision crosses between them.) With noise this small the accuracy test's binomial tail is a step function of
    the noisy correct count, so a count sitting exactly on a step (0.9 x 44 = 40 correct of 44: the decision then
    follows the sign of noise of order 1e-6, ACCEPT in 3 of 20 noise draws) decides by the draw; the guess 0.85
    puts neither 0.9 n nor 1.1 n on a step (20 of 20 draws each way), as does any real test set's noise."""
    from sage_tfx.validation import DPAccuracyValidator, DPLossValidator

    rng = np.random.default_rng(5)
    for sla, target, expected in ((MSE, 300.0, 150.0), (ACCURACY, 0.8, 0.85)):
        estimate = estimate_accept(sla, target, expected=expected, settings={"epsilon_start": 1e6})
        row = estimate.rows[0]
        for factor, outcome in ((1.1, "ACCEPT"), (0.9, "RETRY")):
            n = int(round(factor * row.test_rows))
            if sla.metric == "accuracy":
                correct = np.zeros(n)
                correct[: int(round(expected * n))] = 1.0
                validator = DPAccuracyValidator(target, row.validation_epsilon)
                result = validator.validate(correct, rng=rng, eta=row.eta_accept)
            else:
                validator = DPLossValidator(target, row.validation_epsilon, loss_bound=sla.loss_bound)
                result = validator.validate(np.full(n, expected), rng=rng, eta=row.eta_accept)
            assert result.outcome.value == outcome, (sla.metric, factor, n, row, result.bounds)


def test_expected_loss_needs_a_target_on_the_command_line(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "run",
            "taxi_regression",
            "--check",
            "--expected-loss",
            "5",
            "--db",
            str(tmp_path / "l.db"),
            "--stream",
            "taxi",
            "--data-root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 2 and "--expected-loss needs --target" in out.stderr, out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.tf
def test_check_prints_the_estimate_after_the_dry_run(tmp_path):
    """`sage run PIPELINE --check --target T --expected-loss L` on a small real stream: the dry run, then the rows
    to ACCEPT at four epsilons, the real ledger untouched; a guess that misses the target fails before the dry
    run (exit 2, named)."""
    from sage_tfx.data.taxi import taxi_csv_path
    from sage_tfx.ingest.replay import Replay
    from sage_tfx.privacy import Ledger

    db, data = tmp_path / "ledger.db", tmp_path / "data"
    with Ledger.open(db, create=True) as ledger:
        ledger.create_stream("taxi", 1.0, 1e-6)
        Replay.from_file(ledger, "taxi", str(data), taxi_csv_path("simple"), "trip_start_timestamp", "1d").run(steps=20)
    example = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "examples",
        "taxi_fare",
        "pipeline.py",
    )
    base = [
        sys.executable,
        "-m",
        "sage_tfx",
        "run",
        example,
        "--check",
        "--db",
        str(db),
        "--stream",
        "taxi",
        "--data-root",
        str(data),
        "--target",
        "300",
        "--work-dir",
        str(tmp_path / "work"),
    ]
    out = subprocess.run(base + ["--expected-loss", "400"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 2 and "expected loss 400.0 must be in [0, target 300)" in out.stderr, out.stderr[-2000:]
    assert "GENERATED rows" not in out.stdout  # refused before the dry run

    def dump():
        with Ledger.open(db) as ledger:
            return [ledger.log_entries(), [g.to_json() for g in ledger.grants()]]

    before = dump()
    out = subprocess.run(base + ["--expected-loss", "150"], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert dump() == before  # a passing check writes nothing to the real ledger either
    lines = [line for line in out.stdout.splitlines() if line.startswith("[check]")]
    text = "\n".join(lines)
    assert "estimate for target 300 (mse" in text and "true loss is 150 (--expected-loss)" in text
    assert sum("test rows = about" in line for line in lines) == 4, text
    assert "blocks: not estimated" in text and "training: not estimated" in text
    assert "check OK" in out.stdout
