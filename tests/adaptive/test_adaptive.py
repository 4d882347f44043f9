"""The privacy-adaptive iterator's control flow on a real ledger (no TensorFlow).

The pipeline run here is a sample-complexity rule (ACCEPT once epsilon x rows
is large enough), the same model the load simulator uses; the end-to-end tests
run real TFX pipelines.
"""

import pytest

from sage_tfx.adaptive import BudgetSplit, IterationResult, IteratorSettings, SageIterator, eta_for_attempt
from sage_tfx.privacy import Ledger, LedgerError
from sage_tfx.validation import ValidationInputError
from tests.helpers.ledgers import daily_ledger

DAY = 86400.0


def make_ledger(tmp_path, blocks=8, rows=1000, epsilon=1.0, policy="conserve"):
    return daily_ledger(tmp_path, blocks, epsilon=epsilon, delta=1e-6, rows=rows, ids="b{:02d}", policy=policy)


class Oracle:
    """ACCEPT once epsilon_train * rows >= need; records every call."""

    def __init__(self, ledger, need, reject_at=None):
        self.ledger, self.need, self.reject_at, self.calls = ledger, need, reject_at, []

    def __call__(self, grant, split, eta, iteration):
        rows = sum(self.ledger.private_row_count(grant.stream, b) for b in grant.blocks)
        self.calls.append((grant.id, split.training, len(grant.blocks), eta, iteration))
        if self.reject_at == iteration:
            return IterationResult("REJECT", bound=9.9)
        power = split.training * rows
        return IterationResult("ACCEPT" if power >= self.need else "RETRY", bound=1.0 / power)


def test_eta_schedule_sums_to_eta():
    assert eta_for_attempt(0.05, 1) == pytest.approx(0.025)
    assert eta_for_attempt(0.05, 2) == pytest.approx(0.05 / 6)
    assert sum(eta_for_attempt(0.05, i) for i in range(1, 10_000)) < 0.05


def test_budget_split_rules():
    s = BudgetSplit.for_epsilon(1.0, 1e-8, preprocessing_share=0.2, count_share=0.05)
    assert (s.preprocessing, s.count, s.rule) == (0.2, 0.05, "pre+count+max(train+reject,val)")
    assert s.training == s.validation == pytest.approx(0.75)
    assert s.charged_epsilon == pytest.approx(1.0)
    t = BudgetSplit.for_epsilon(1.0, 1e-8, preprocessing_share=0.1, count_share=0.0, disjoint_split=False)
    assert t.rule == "pre+count+train+reject+val"
    assert t.preprocessing + t.training + t.validation == pytest.approx(1.0) == t.charged_epsilon
    r = BudgetSplit.for_epsilon(1.0, 1e-8, preprocessing_share=0.2, count_share=0.05, rejection_share=0.2)
    assert (r.training, r.rejection, r.validation) == pytest.approx((0.6, 0.15, 0.75))
    assert r.charged_epsilon == pytest.approx(1.0)
    with pytest.raises(ValueError, match="-1"):
        BudgetSplit.for_epsilon(-1, 1e-8)
    with pytest.raises(ValueError, match="0.9"):
        BudgetSplit.for_epsilon(1.0, 1e-8, preprocessing_share=0.2, count_share=0.9)


def test_doubles_epsilon_then_window_until_accept(tmp_path):
    ledger = make_ledger(tmp_path)
    oracle = Oracle(ledger, need=1500)
    lines = []
    result = SageIterator(
        ledger,
        "s",
        "p",
        oracle,
        settings=IteratorSettings(epsilon_start=0.125, min_window=1, preprocessing_share=0.2),
        progress=lines.append,
    ).run()
    assert result.outcome == "ACCEPT"
    charged = [(it.epsilon, len(it.blocks)) for it in result.iterations]
    # 0.125 -> 0.25 -> 0.5 on one block (training power 94, 188, 375); 1.0 does not fit after 0.875 is
    # spent, so the window doubles: 0.375 x 2000 = 750, then 0.375 x 4000 = 1500 >= 1500.
    assert charged == [(0.125, 1), (0.25, 1), (0.5, 1), (0.5, 2), (0.5, 4)]
    assert [c[3] for c in oracle.calls] == [eta_for_attempt(0.05, i) for i in range(1, 6)]
    assert len(lines) == 5 and all("iteration" in line for line in lines)
    assert ledger.pipelines("s")[0]["outcome"] == "ACCEPT"
    # Ledger charges are exactly the iterations' epsilons, on the newest blocks.
    spent = {b.id: b.spent[0] for b in ledger.blocks("s")}
    assert spent["b07"] == pytest.approx(0.875)
    assert spent["b06"] == spent["b05"] == pytest.approx(1.0)  # windows 2 and 4 both used them: retired
    assert [b.id for b in ledger.blocks("s", state="retired")] == ["b05", "b06"]
    assert ledger.audit().ok


def test_reject_stops_and_timeout_after_max_iterations(tmp_path):
    ledger = make_ledger(tmp_path)
    result = SageIterator(ledger, "s", "r", Oracle(ledger, need=1e12, reject_at=2)).run()
    assert result.outcome == "REJECT" and len(result.iterations) == 2
    result = SageIterator(
        ledger, "s", "t", Oracle(ledger, need=1e12), settings=IteratorSettings(max_iterations=3)
    ).run()
    assert result.outcome == "TIMEOUT" and len(result.iterations) == 3
    assert {p["name"]: p["outcome"] for p in ledger.pipelines("s")} == {"r": "REJECT", "t": "TIMEOUT"}


def test_waits_for_new_blocks_then_times_out_when_the_stream_ends(tmp_path):
    ledger = make_ledger(tmp_path, blocks=1)
    arrivals = iter(range(1, 3))

    def wait(_timeout):
        i = next(arrivals, None)
        if i is None:
            return False
        ledger.add_block("s", f"new{i}", start=(10 + i) * DAY, end=(11 + i) * DAY, rows=1000)
        return True

    result = SageIterator(
        ledger,
        "s",
        "w",
        Oracle(ledger, need=1e12),
        settings=IteratorSettings(min_window=2, max_iterations=50),
        wait_for_blocks=wait,
    ).run()
    assert result.outcome == "TIMEOUT"
    assert {b for it in result.iterations for b in it.blocks} <= {"b00", "new1", "new2"}


def test_resume_after_kill_reuses_the_grant_without_charging_again(tmp_path):
    ledger = make_ledger(tmp_path)
    oracle = Oracle(ledger, need=1500)

    def killed_on_third(grant, split, eta, iteration):
        if iteration == 3:
            raise KeyboardInterrupt  # like kill -9: no outcome is recorded
        return oracle(grant, split, eta, iteration)

    with pytest.raises(KeyboardInterrupt):
        SageIterator(ledger, "s", "p", killed_on_third).run()
    grants_before = [g.id for g, _o, _d in ledger.history("s", "p")]
    assert len(grants_before) == 3
    spent_before = {b.id: b.spent for b in ledger.blocks("s")}

    result = SageIterator(ledger, "s", "p", oracle).run()
    assert result.outcome == "ACCEPT"
    history = ledger.history("s", "p")
    # The third grant was re-run, not re-charged; iteration numbers continue.
    assert [g.id for g, _o, _d in history][:3] == grants_before
    assert oracle.calls[2][0] == grants_before[2]
    assert [g.meta["iteration"] for g, _o, _d in history] == list(range(1, len(history) + 1))
    assert all(outcome is not None for _g, outcome, _d in history)
    spent_after = {b.id: b.spent for b in ledger.blocks("s")}
    extra = sum(it.epsilon * len(it.blocks) for it in result.iterations if not it.resumed)
    assert sum(v[0] for v in spent_after.values()) == pytest.approx(
        sum(v[0] for v in spent_before.values()) + extra
    )  # only the new iterations charged
    # Running it again after ACCEPT spends nothing and reports the recorded result.
    again = SageIterator(ledger, "s", "p", oracle).run()
    assert again.outcome == "ACCEPT" and {b.id: b.spent for b in ledger.blocks("s")} == spent_after
    assert ledger.audit().ok


def test_aggressive_spends_the_whole_allocation_at_once(tmp_path):
    ledger = make_ledger(tmp_path, policy="aggressive")
    result = SageIterator(ledger, "s", "a", Oracle(ledger, need=500)).run()
    assert result.outcome == "ACCEPT"
    assert result.iterations[0].epsilon == pytest.approx(1.0)
    assert [b.state for b in ledger.blocks("s")][-1] == "retired"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"epsilon_start": -0.1}, "-0.1"),
        ({"epsilon_start": float("nan")}, "nan"),
        ({"epsilon_start": 2.0}, "2.0"),
        ({"min_window": 0}, "min_window 0"),
        ({"max_iterations": 0}, "max_iterations 0"),
        ({"delta": 1e-3}, "0.001"),
        # checked by sage_tfx.privacy.checks: a non-number, a fraction or a bool is named, not a TypeError
        (
            {"epsilon_start": "x"},
            r"^epsilon_start 'x' is invalid: must be in \(0, 1\] \(the stream's global epsilon\)$",
        ),
        ({"min_window": 1.5}, r"^min_window 1\.5 is invalid: must be an integer >= 1 \(blocks\)$"),
        ({"max_refusals": True}, r"^max_refusals True is invalid: must be an integer >= 1 \(refused requests"),
        ({"delta": "x"}, r"^iteration delta 'x' is invalid: must be in \[0, "),
        ({"preprocessing_delta": -1e-9}, r"^preprocessing_delta -1e-09 is invalid: must be finite and >= 0$"),
    ],
)
def test_bad_iterator_settings_fail_before_any_charge(tmp_path, kwargs, match):
    ledger = make_ledger(tmp_path)
    with pytest.raises(LedgerError, match=match):
        SageIterator(ledger, "s", "p", Oracle(ledger, need=1), settings=IteratorSettings(**kwargs))
    assert ledger.grants() == [] and ledger.pipelines("s") == []


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"min_window": 0}, LedgerError, r"^min_window 0 is invalid: must be an integer >= 1 \(blocks\)$"),
        ({"max_idle_waits": 2.5}, LedgerError, r"^max_idle_waits 2\.5 is invalid"),
        ({"eval_share": 0.123}, LedgerError, "eval_share 0.123"),
        ({"eta": 1.5}, ValidationInputError, r"^eta 1\.5 must be in \(0, 1\)$"),
    ],
)
def test_settings_the_stream_does_not_decide_are_refused_when_built(kwargs, error, match):
    """No ledger needed: a bad knob is named as soon as the settings are written down."""
    with pytest.raises(error, match=match):
        IteratorSettings(**kwargs)


def test_settings_must_be_iterator_settings(tmp_path):
    ledger = make_ledger(tmp_path)
    with pytest.raises(LedgerError, match=r"settings \{'epsilon_start': 0\.5\} must be an IteratorSettings"):
        SageIterator(ledger, "s", "p", Oracle(ledger, need=1), settings={"epsilon_start": 0.5})
    assert IteratorSettings(min_window=2.0).min_window == 2 and ledger.pipelines("s") == []


def test_unknown_stream_fails_before_any_charge(tmp_path):
    ledger = make_ledger(tmp_path)
    with pytest.raises(LedgerError, match="nope"):
        SageIterator(ledger, "nope", "p", Oracle(ledger, need=1))


def test_platform_serves_several_pipelines_on_one_replayed_stream(tmp_path):
    from sage_tfx.adaptive.platform import PipelineSpec, Platform

    location = tmp_path / "ledger.db"
    with Ledger.open(location, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
    arrivals = iter(range(40))

    def replay_step():
        i = next(arrivals, None)
        if i is None:
            return None
        with Ledger.open(location) as ledger:
            ledger.add_block("s", f"h{i:03d}", start=i * 3600.0, end=(i + 1) * 3600.0, rows=1000)
        return [f"h{i:03d}"]

    oracles = {}

    def spec(name, need):
        def run(grant, split, eta, iteration):
            with Ledger.open(location) as ledger:
                oracles[name] = oracle = oracles.get(name) or Oracle(ledger, need)
                oracle.ledger = ledger
                return oracle(grant, split, eta, iteration)

        return PipelineSpec(name, run, IteratorSettings(epsilon_start=0.1, min_window=1, max_iterations=20))

    lines = []
    platform = Platform(
        location,
        "s",
        [spec("easy", 200), spec("medium", 1500), spec("impossible", 1e9)],
        replay_step,
        progress=lines.append,
    )
    results = platform.run()
    assert not platform.errors
    assert results["easy"].outcome == "ACCEPT" and results["medium"].outcome == "ACCEPT"
    assert results["impossible"].outcome == "TIMEOUT"
    assert any(line.startswith("[replay]") for line in lines)
    with Ledger.open(location) as ledger:
        assert ledger.audit().ok
        # The first block arrived while all three waited: its budget was split three ways.
        first = [e for e in ledger.log_entries() if e[2] == "reserve"][0]
        assert '"pipelines":["easy","impossible","medium"]' in first[3]


def test_run_result_reports_the_largest_per_block_spend_and_the_final_blocks():
    """Iterations on other windows add up per block where they overlap; a sum over iterations would say 1.5."""
    from sage_tfx.adaptive import Iteration, RunResult

    result = RunResult(
        "ACCEPT",
        [
            Iteration(1, "g1", ("b1", "b2"), 0.5, 0.025, "RETRY"),
            Iteration(2, "g2", ("b2", "b3"), 0.25, 0.008, "RETRY"),
            Iteration(3, "g3", ("b3", "b4", "b5"), 0.75, 0.004, "ACCEPT"),
        ],
        "g3",
    )
    assert result.epsilon_per_block() == {"b1": 0.5, "b2": 0.75, "b3": 1.0, "b4": 0.75, "b5": 0.75}
    assert result.max_block_epsilon == 1.0 and result.final_blocks == ("b3", "b4", "b5")
    assert result.describe() == (
        "ACCEPT after 3 iteration(s); this run charged at most epsilon 1 on a block (5 "
        "block(s) charged); the model trained on blocks b3..b5 (3)"
    )
    timeout = RunResult("TIMEOUT", [], None)
    assert timeout.describe() == (
        "TIMEOUT after 0 iteration(s); this run charged at most epsilon 0 on a block (0 block(s) charged)"
    )


def test_the_final_line_reports_the_ledgers_spend_on_the_blocks_and_the_asked_confidence(tmp_path):
    """Another pipeline's charge on the same blocks: this run's own spend (0.5 a block) was the only figure,
    while the blocks stood at 0.75 in the ledger; and the asked confidence beside the eta_i rule."""
    ledger = make_ledger(tmp_path, blocks=4)
    ledger.register("s", "other")
    ledger.request("other", "s", blocks=[f"b{i:02d}" for i in range(4)], epsilon=0.25)
    result = SageIterator(
        ledger,
        "s",
        "p",
        Oracle(ledger, need=100),
        settings=IteratorSettings(epsilon_start=0.5, min_window=4),
        request=_request(0.3),
    ).run()
    assert result.outcome == "ACCEPT" and result.max_block_epsilon == pytest.approx(0.5)
    assert result.ledger_spent == {f"b{i:02d}": pytest.approx(0.75) for i in range(4)}
    line = result.describe()
    assert (
        "this run charged at most epsilon 0.5 on a block (4 block(s) charged), which now stand at epsilon 0.75 "
        "spent in the ledger (every run)" in line
    ), line
    assert "; confidence 0.95 over all iterations (iteration i tested at eta_i = 0.05/(i(i+1))); target 0.3" in line


def _request(target, **changes):
    return {
        "confidence": 0.95,
        "metric": "mse",
        "label": "y",
        "loss_bound": 1.0,
        "label_threshold": None,
        "label_signature": None,
        "loss_function": None,
        "model": "linear",
        "definition": "d" * 64,
        "target": target,
        **changes,
    }


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"target": 0.30}, "target 0.355 -> 0.3"),
        ({"confidence": 0.99}, "confidence 0.95 -> 0.99"),
        ({"loss_bound": 2.0}, "loss_bound 1.0 -> 2.0"),
        ({"label": "z"}, "label 'y' -> 'z'"),
        ({"model": "dnn"}, "model 'linear' -> 'dnn'"),
        ({"definition": "e" * 64}, "definition"),
    ],
)
def test_a_finished_pipeline_asked_another_request_is_refused_before_anything_is_written(tmp_path, changes, named):
    """The certificate: an ACCEPT at target 0.355 certifies 0.355. Asked again for a stricter target (or another
    SLA, model or definition), the iterator used to report the stored ACCEPT as this request's; it is now refused,
    naming the stored target and bound and the fix, with nothing registered, charged or logged."""
    from sage_tfx.adaptive.iterator import RequestMismatch

    ledger = make_ledger(tmp_path)
    first = SageIterator(
        ledger,
        "s",
        "p",
        Oracle(ledger, need=100),
        settings=IteratorSettings(epsilon_start=0.5),
        request=_request(0.355),
    ).run()
    assert first.outcome == "ACCEPT" and first.iterations[-1].bound is not None
    assert first.iterations and all(g.meta["request"] == _request(0.355) for g in ledger.grants())
    log = ledger.log_entries()
    with pytest.raises(RequestMismatch) as refused:
        SageIterator(
            ledger,
            "s",
            "p",
            Oracle(ledger, need=100),
            settings=IteratorSettings(epsilon_start=0.5),
            request={**_request(0.355), **changes},
        ).run()
    message = str(refused.value)
    assert named in message and "finished with ACCEPT" in message and "target 0.355" in message, message
    assert f"bound {first.bound:.6g}" in message and "new pipeline name" in message, message
    assert ledger.log_entries() == log
    same = SageIterator(
        ledger,
        "s",
        "p",
        Oracle(ledger, need=100),
        settings=IteratorSettings(epsilon_start=0.5),
        request=_request(0.355),
    ).run()
    assert same.outcome == "ACCEPT" and ledger.log_entries() == log  # the stored outcome, for the same request
    assert same.describe().endswith(f"; target 0.355, bound {first.bound:.6g}"), same.describe()


def test_an_unfinished_pipeline_resumed_with_another_target_is_refused(tmp_path):
    """A pipeline name killed mid-run (an iteration without an outcome) resumes only for its own request."""
    from sage_tfx.adaptive.iterator import RequestMismatch

    ledger = make_ledger(tmp_path)

    def killed(grant, split, eta, iteration):
        raise KeyboardInterrupt  # the process dies inside the iteration: no outcome recorded

    with pytest.raises(KeyboardInterrupt):
        SageIterator(
            ledger, "s", "p", killed, settings=IteratorSettings(epsilon_start=0.5), request=_request(0.355)
        ).run()
    log = ledger.log_entries()
    with pytest.raises(RequestMismatch, match="has 1 iteration"):
        SageIterator(
            ledger,
            "s",
            "p",
            Oracle(ledger, need=100),
            settings=IteratorSettings(epsilon_start=0.5),
            request=_request(0.3),
        )
    assert ledger.log_entries() == log
    resumed = SageIterator(
        ledger,
        "s",
        "p",
        Oracle(ledger, need=100),
        settings=IteratorSettings(epsilon_start=0.5),
        request=_request(0.355),
    ).run()
    assert resumed.outcome == "ACCEPT" and len(ledger.grants()) == 1


def test_a_finished_pipeline_from_before_requests_were_signed_compares_its_validators_target(tmp_path):
    """Grants without a signed request: the target and metric of the last validator result decide."""
    from sage_tfx.adaptive.iterator import RequestMismatch

    ledger = make_ledger(tmp_path)

    def validated(grant, split, eta, iteration):
        return IterationResult("ACCEPT", bound=0.3415, details={"validation": {"target": 0.355, "metric": "mse"}})

    SageIterator(ledger, "s", "p", validated, settings=IteratorSettings(epsilon_start=0.5)).run()
    with pytest.raises(RequestMismatch, match=r"target 0.355 \(bound 0.3415\); this run asks target 0.355 -> 0.3"):
        SageIterator(ledger, "s", "p", validated, settings=IteratorSettings(epsilon_start=0.5), request=_request(0.3))
    assert (
        SageIterator(ledger, "s", "p", validated, settings=IteratorSettings(epsilon_start=0.5), request=_request(0.355))
        .run()
        .outcome
        == "ACCEPT"
    )


def test_the_platform_reports_a_finished_pipelines_stored_outcome_for_the_same_request(tmp_path):
    """`sage serve` again with a finished pipeline name and its own request: the stored outcome, with its target
    and bound (registering a finished name raised, so the platform could not start)."""
    from sage_tfx.adaptive.platform import PipelineSpec, Platform

    location = tmp_path / "ledger.db"
    with Ledger.open(location, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        for i in range(4):
            ledger.add_block("s", f"h{i}", start=i * 3600.0, end=(i + 1) * 3600.0, rows=1000)

    def accept(grant, split, eta, iteration):
        return IterationResult("ACCEPT", bound=0.25)

    spec = PipelineSpec("p", accept, IteratorSettings(epsilon_start=0.5), request=_request(0.3))
    for _ in range(2):
        platform = Platform(location, "s", [spec], lambda: None, progress=lambda line: None)
        results = platform.run()
        assert not platform.errors and results["p"].outcome == "ACCEPT"
        assert results["p"].describe().endswith("target 0.3, bound 0.25")
    with Ledger.open(location) as ledger:
        assert len(ledger.grants()) == 1 and ledger.audit().ok


class Faulty:
    """The Oracle behind a run that first raises ``error`` after the charge (once)."""

    def __init__(self, oracle, error):
        self.oracle, self.error = oracle, error

    def __call__(self, grant, split, eta, iteration):
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return self.oracle(grant, split, eta, iteration)


def _spent(ledger):
    return {b.id: b.spent for b in ledger.blocks("s")}


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device"),
        FileNotFoundError(2, "No such file"),
        PermissionError(13, "Permission denied"),
    ],
)
def test_an_environment_error_after_the_charge_leaves_the_iteration_resumable(tmp_path, error):
    """An OSError after the charge (a full disk, a folder gone) records no outcome: the grant stays in use, and the
    next run resumes it under the same grant, charging nothing new, as after a kill."""
    from sage_tfx.privacy.errors import IterationInterrupted

    ledger = make_ledger(tmp_path)
    oracle = Oracle(ledger, need=1e9)
    with pytest.raises(IterationInterrupted, match=f"under grant g-.*{type(error).__name__}"):
        SageIterator(ledger, "s", "p", Faulty(oracle, error), settings=IteratorSettings(max_iterations=1)).run()
    ((grant, outcome, _details),) = ledger.history("s", "p")
    assert outcome is None  # not FAILED: nothing says the budget was used
    spent = _spent(ledger)
    result = SageIterator(ledger, "s", "p", oracle, settings=IteratorSettings(max_iterations=1)).run()
    assert [it.grant_id for it in result.iterations] == [grant.id] and result.iterations[0].resumed
    assert [c[0] for c in oracle.calls] == [grant.id]
    assert _spent(ledger) == spent and len(ledger.grants("s")) == 1
    assert [o for _g, o, _d in ledger.history("s", "p")] == ["RETRY"]


@pytest.mark.parametrize(
    "first, then",
    [
        (OSError(28, "No space left on device"), ValueError("a record's value")),
        (ValueError("a record's value"), FileNotFoundError(2, "No such file")),
    ],
)
def test_a_data_error_after_the_charge_is_failed_whatever_it_is_chained_with(tmp_path, first, then):
    """FAILED stays for the errors that may depend on the data: a ValueError raised while handling an OSError, and
    an OSError raised while handling a ValueError (TFX's clean-up after a failed run_fn raises NotFoundError, an
    OSError, while handling the user's error), spend the grant, and the next run moves on to a new one."""
    ledger = make_ledger(tmp_path)

    def run(grant, split, eta, iteration):
        try:
            raise first
        except Exception:
            raise then  # noqa: B904 (chained implicitly, as TFX's clean-up does)

    with pytest.raises(type(then)):
        SageIterator(ledger, "s", "p", run, settings=IteratorSettings(max_iterations=1)).run()
    assert [o for _g, o, _d in ledger.history("s", "p")] == ["FAILED"]


def test_environment_errors_are_told_by_their_type():
    """OSError, a block file missing or altered (SealedError), Beam's RuntimeError re-raise of an OSError, MLMD's
    InternalError (its SQLite file on a full disk) are the environment's; ValueError, KeyError, a RuntimeError of
    user code are not."""
    from sage_tfx.ingest.sealed import SealedError
    from sage_tfx.privacy.errors import environment_error_text, is_environment_error

    def beam_reraise(exn):  # what apache_beam.runners.common.DoFnRunner._reraise_augmented raises for an OSError
        try:
            raise exn
        except Exception:
            new = RuntimeError(f"{type(exn).__name__}: {exn} [while running 'Write']")
            new._tagged_with_step = True
            try:
                raise new
            except RuntimeError as raised:
                return raised

    mlmd = type("InternalError", (Exception,), {"__module__": "ml_metadata.errors"})
    assert is_environment_error(OSError(28, "No space left on device"))
    assert is_environment_error(SealedError("block file x is missing"))
    assert is_environment_error(beam_reraise(OSError(28, "No space left on device")))
    assert is_environment_error(mlmd("database or disk is full"))
    assert not is_environment_error(beam_reraise(ValueError("fare 12.5")))
    assert not any(is_environment_error(e) for e in (ValueError("x"), KeyError("x"), RuntimeError("x")))
    assert environment_error_text(beam_reraise(OSError(28, "No space left on device", "/secret"))) == (
        "OSError: ENOSPC (No space left on device)"
    )
    assert "database" not in environment_error_text(mlmd("database or disk is full"))
