"""The iterator always ends: ACCEPT, REJECT or TIMEOUT in a bounded number of ledger requests (no TensorFlow).

Under the aggressive policy the iterator asked max(previous epsilon,
what the window offers); a later window offering less was refused, and the
refusal was retried unchanged forever (no TIMEOUT without ``max_seconds``).
These tests drive both policies through shrinking availability (another
pipeline spending between steps, blocks retiring), several pipelines sharing a
stream, refusals injected by a concurrent writer right before the charge, and a
stale availability read, on a real SQLite ledger. Every run is watched by a
request counter that FAILS the test past a limit instead of hanging, so the old
livelock shows up as ``Runaway``, not as a stuck test run.

Also: what a failed run leaves in the append-only log holds
no data value.
"""

import json
import random
import shutil
import sqlite3
import threading

import pytest

from sage_tfx.adaptive import IterationResult, IteratorSettings, SageIterator
from sage_tfx.privacy import BlockRetired, BudgetRefused, Ledger, LedgerError, RecordError
from tests.helpers.ledgers import daily_ledger

DAY = 86400.0
POLICIES = ("conserve", "aggressive")
LIMIT = 60  # request calls after which a run counts as a livelock (every bound below is far under it)


class Runaway(AssertionError):
    """The iterator kept calling the ledger past any bound it documents: the livelock."""


def make_ledger(tmp_path, policy, blocks=8, rows=1000, epsilon=1.0, min_epsilon=None):
    return daily_ledger(
        tmp_path, blocks, epsilon=epsilon, delta=1e-6, rows=rows, ids="b{:02d}", policy=policy, min_epsilon=min_epsilon
    )


class Watched:
    """A real ledger as the iterator sees it, with every ``request`` counted (the ledger itself is untouched).

    ``before_request(kwargs)`` runs between the iterator's availability read and its charge: the window in
    which a concurrent writer can take the budget. ``stale_from``, another ``Ledger`` opened on a snapshot
    of this one, answers the availability reads (a reader that lags the writers); ``request`` still decides
    on the live ledger. Past ``limit`` request calls the run is a livelock: ``Runaway`` fails the test.
    """

    def __init__(self, ledger, limit=LIMIT, before_request=None, stale_from=None):
        self.ledger, self.limit, self.before_request, self.stale_from = ledger, limit, before_request, stale_from
        self.calls = []  # (choice, refused) per request call; a choice is (blocks, epsilon)

    def __getattr__(self, name):
        return getattr(self.ledger, name)

    @property
    def requests(self):
        return [choice for choice, _refused in self.calls]

    @property
    def refused(self):
        return [choice for choice, refused in self.calls if refused]

    def asked_again_after_refusal(self):
        """Choices requested again after the ledger refused them (the livelock's signature; must be none)."""
        return [c for i, (c, refused) in enumerate(self.calls) if refused and c in self.requests[i + 1 :]]

    def available_per_block(self, *args, **kwargs):
        return (self.stale_from or self.ledger).available_per_block(*args, **kwargs)

    def available_epsilon(self, *args, **kwargs):
        return (self.stale_from or self.ledger).available_epsilon(*args, **kwargs)

    def request(self, pipeline, stream, **kwargs):
        if len(self.calls) >= self.limit:
            raise Runaway(
                f"{len(self.calls)} request calls by {pipeline!r}, {len(self.refused)} refused; "
                f"the last refused choice: {self.refused[-1:]}"
            )
        choice = (tuple(kwargs.get("blocks") or ()), kwargs.get("epsilon"))
        if self.before_request is not None:
            self.before_request(kwargs)
        try:
            grant = self.ledger.request(pipeline, stream, **kwargs)
        except (BudgetRefused, BlockRetired):
            self.calls.append((choice, True))
            raise
        self.calls.append((choice, False))
        return grant


def snapshot(ledger_path, copy_path):
    """A consistent copy of a SQLite ledger file, opened as a Ledger: what a lagging reader sees."""
    with sqlite3.connect(ledger_path) as src, sqlite3.connect(copy_path) as dst:
        src.backup(dst)
    shutil.copy(f"{ledger_path}.key", f"{copy_path}.key")  # the ledger's key beside the copy (mode 0600 kept)
    shutil.copy(f"{ledger_path}.key.head", f"{copy_path}.key.head")  # and its head (Ledger.open checks it)
    return Ledger.open(copy_path)


def power_rule(ledger, need):
    """A stand-in for the TFX run: ACCEPT once grant epsilon x granted rows reaches ``need``."""

    def run(grant, split, eta, iteration):
        rows = sum(ledger.private_row_count(grant.stream, b) for b in grant.blocks)
        power = grant.epsilon * rows
        return IterationResult("ACCEPT" if power >= need else "RETRY", bound=1.0 / power)

    return run


def always_retry(grant, split, eta, iteration):
    return IterationResult("RETRY", bound=1.0)


def spend_all_left(ledger, pipeline, blocks, fraction=1.0):
    """Another pipeline charges ``fraction`` of what it may take on ``blocks`` (its own grant, if any)."""
    left = ledger.available_epsilon(pipeline, "s", list(blocks), 1e-8)
    if left * fraction > 1e-3:
        ledger.request(pipeline, "s", blocks=list(blocks), epsilon=left * fraction, delta=1e-8)


# ------------------------------------------------------------------ the reported livelock
def test_regression_aggressive_window_offering_less_than_the_last_epsilon(tmp_path):
    """The reported scenario: iteration 1 takes all of b07 (epsilon 1); while it runs, another pipeline spends
    half of b05 and b06; after RETRY the window doubles to b05..b06, which offer 0.5. The old iterator asked
    max(1.0, 0.5) = 1.0 there, was refused, and asked the same again forever."""
    real = make_ledger(tmp_path, "aggressive")
    ledger = Watched(real)

    def run(grant, split, eta, iteration):
        if iteration == 1:
            real.request("other", "s", blocks=["b05", "b06"], epsilon=0.5, delta=1e-8)
            return IterationResult("RETRY", bound=1.0)
        return IterationResult("ACCEPT", bound=0.1)

    result = SageIterator(ledger, "s", "a", run).run()
    assert result.outcome == "ACCEPT"
    assert [(it.blocks, round(it.epsilon, 3)) for it in result.iterations] == [
        (("b07",), 1.0),
        (("b05", "b06"), 0.5),
    ]  # takes what the window offers NOW
    assert len(ledger.requests) == 2 and ledger.refused == []
    assert real.audit().ok


def test_regression_aggressive_share_below_epsilon_start(tmp_path):
    """The same livelock on the first step: nine pipelines share every block, so each may take 1/9 < 0.125
    (epsilon_start). The old iterator asked max(0.125, 1/9) and was refused forever."""
    real = Ledger.open(tmp_path / "ledger.db", create=True)
    real.create_stream("s", 1.0, 1e-6, policy="aggressive", min_epsilon=0.01)
    for i in range(9):
        real.register("s", f"p{i}")
    for i in range(4):
        real.add_block("s", f"b{i:02d}", start=i * DAY, end=(i + 1) * DAY, rows=1000)
    ledger = Watched(real)
    result = SageIterator(
        ledger, "s", "p0", power_rule(real, need=100), settings=IteratorSettings(epsilon_start=0.125)
    ).run()
    assert result.outcome == "ACCEPT"
    assert result.iterations[0].epsilon == pytest.approx(1 / 9, rel=1e-3)
    assert ledger.refused == []


# ------------------------------------------------------------------ refusals by a concurrent writer
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("refuse_first", [1, 3, 10_000])
def test_a_writer_spending_before_each_charge_never_livelocks(tmp_path, policy, refuse_first):
    """A rival spends on the chosen blocks between the iterator's read and its charge, for the first
    ``refuse_first`` requests (10_000: always). Each refused choice is never asked again; the run ends within
    max_iterations + max_refusals requests."""
    real = make_ledger(tmp_path, policy, blocks=30)
    calls = []

    def rival(kwargs):
        calls.append(kwargs)
        if len(calls) <= refuse_first:  # leave less than asked on the newest chosen block
            block = kwargs["blocks"][-1]
            left = real.available_epsilon("rival", "s", [block], 1e-8)
            take = left - kwargs["epsilon"] / 2
            if take > 1e-3:
                real.request("rival", "s", blocks=[block], epsilon=take, delta=1e-8)

    ledger = Watched(real, before_request=rival)
    iterator = SageIterator(
        ledger, "s", "a", power_rule(real, need=1200), settings=IteratorSettings(max_iterations=6, max_refusals=4)
    )
    result = iterator.run()
    assert result.outcome in ("ACCEPT", "TIMEOUT")
    assert len(ledger.requests) <= 6 + 4
    assert len(ledger.refused) <= 4
    assert ledger.asked_again_after_refusal() == []  # never the same refused choice twice
    if refuse_first == 10_000:
        assert result.outcome == "TIMEOUT" and len(ledger.refused) == 4 and result.iterations == []
    else:
        assert result.outcome == "ACCEPT" and len(ledger.refused) == refuse_first
    assert real.pipelines("s")[0]["state"] == "done"
    assert real.audit().ok


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("waits", [False, True])
def test_a_stale_availability_read_is_not_asked_again(tmp_path, policy, waits):
    """The reader lags: it still offers b07 after a rival retired it. The refused choice is not asked again
    (the stale read offers nothing else): TIMEOUT at once without wait_for_blocks, or after max_idle_waits
    waits in which nothing changed."""
    real = make_ledger(tmp_path, policy)
    lagging = snapshot(tmp_path / "ledger.db", tmp_path / "lagging.db")  # taken before the rival spends
    real.request("rival", "s", blocks=["b07"], epsilon=1.0, delta=1e-8)  # retires b07
    ledger = Watched(real, stale_from=lagging)
    iterator_waits = []

    def wait_for_blocks(timeout):
        iterator_waits.append(timeout)
        if len(iterator_waits) > 1000:
            raise Runaway("wait_for_blocks called 1000 times with nothing arriving")
        return True

    result = SageIterator(
        ledger,
        "s",
        "a",
        always_retry,
        settings=IteratorSettings(delta=1e-8, max_idle_waits=3),
        wait_for_blocks=wait_for_blocks if waits else None,
    ).run()
    assert result.outcome == "TIMEOUT" and result.iterations == []
    assert len(ledger.requests) == len(ledger.refused) == 1
    assert len(iterator_waits) == (3 if waits else 0)
    assert iterator_waits == [None] * len(iterator_waits)  # max_seconds unset: no deadline to pass on


# ------------------------------------------------------------------ shrinking availability, waiting
@pytest.mark.parametrize("policy", POLICIES)
def test_another_pipeline_spending_between_steps_and_blocks_retiring(tmp_path, policy):
    """While each iteration runs, another pipeline takes most of what is left on the newest active blocks
    (retiring some). The iterator keeps choosing from what is left and ends within its bounds."""
    real = make_ledger(tmp_path, policy, blocks=12)

    def run(grant, split, eta, iteration):
        active = [b.id for b in real.blocks("s", state="active")][-3:]
        for block in active:
            spend_all_left(real, "other", [block], fraction=0.9)
        return IterationResult("RETRY", bound=1.0)

    ledger = Watched(real)
    result = SageIterator(ledger, "s", "a", run, settings=IteratorSettings(max_iterations=8)).run()
    assert result.outcome == "TIMEOUT"
    assert len(ledger.requests) <= 8 + 10 and ledger.refused == []
    assert real.audit().ok


@pytest.mark.parametrize("policy", POLICIES)
def test_waiting_with_nothing_arriving_times_out(tmp_path, policy):
    """The ``blocks is None`` path: too few blocks for the window, and wait_for_blocks says True forever while
    nothing arrives. max_idle_waits idle waits in a row end the run: no request, no spin."""
    real = make_ledger(tmp_path, policy, blocks=1)
    waited = []

    def wait_for_blocks(timeout):
        waited.append(timeout)
        if len(waited) > 1000:
            raise Runaway("wait_for_blocks called 1000 times with nothing arriving")
        return True

    lines = []
    ledger = Watched(real)
    result = SageIterator(
        ledger,
        "s",
        "w",
        always_retry,
        settings=IteratorSettings(min_window=2, max_idle_waits=5),
        wait_for_blocks=wait_for_blocks,
        progress=lines.append,
    ).run()
    assert result.outcome == "TIMEOUT" and ledger.requests == []
    assert len(waited) == 5
    assert any("max_idle_waits" in line for line in lines)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_deadline_is_passed_on_to_wait_for_blocks_as_the_time_left(tmp_path, policy):
    real = make_ledger(tmp_path, policy, blocks=1)
    now = [0.0]
    waited = []

    def wait_for_blocks(timeout):
        waited.append(timeout)
        now[0] += 4.0  # each wait takes 4 s and nothing arrives
        return True

    result = SageIterator(
        real,
        "s",
        "w",
        always_retry,
        settings=IteratorSettings(min_window=2, max_seconds=10.0, max_idle_waits=100),
        wait_for_blocks=wait_for_blocks,
        clock=lambda: now[0],
    ).run()
    assert result.outcome == "TIMEOUT"
    assert waited == [10.0, 6.0, 2.0]


def test_aggressive_below_min_epsilon_waits_then_proceeds_when_budget_is_released(tmp_path):
    """Twenty pipelines share each block: 0.05 each, under min_epsilon 0.1. The aggressive iterator asks for
    nothing and waits; once the others finish, their reservations come back to it and it takes them."""
    real = Ledger.open(tmp_path / "ledger.db", create=True)
    real.create_stream("s", 1.0, 1e-6, policy="aggressive", min_epsilon=0.1)
    for i in range(20):
        real.register("s", f"p{i:02d}")
    for i in range(2):
        real.add_block("s", f"b{i:02d}", start=i * DAY, end=(i + 1) * DAY, rows=1000)
    waited = []

    def wait_for_blocks(timeout):
        waited.append(timeout)
        if len(waited) == 2:
            for i in range(1, 20):
                real.finish("s", f"p{i:02d}", "REJECT")
        return len(waited) < 10

    ledger = Watched(real)
    result = SageIterator(
        ledger,
        "s",
        "p00",
        power_rule(real, need=500),
        settings=IteratorSettings(max_idle_waits=3),
        wait_for_blocks=wait_for_blocks,
    ).run()
    assert result.outcome == "ACCEPT" and len(waited) == 2
    assert ledger.refused == [] and len(ledger.requests) == 1
    assert result.iterations[0].epsilon == pytest.approx(1.0, rel=1e-3)


def test_aggressive_below_min_epsilon_times_out_when_the_stream_ends(tmp_path):
    real = Ledger.open(tmp_path / "ledger.db", create=True)
    real.create_stream("s", 1.0, 1e-6, policy="aggressive", min_epsilon=0.1)
    for i in range(20):
        real.register("s", f"p{i:02d}")
    arrivals = iter(range(5))

    def wait_for_blocks(timeout):  # each new block is split 20 ways too: never enough for min_epsilon
        i = next(arrivals, None)
        if i is None:
            return False
        real.add_block("s", f"b{i:02d}", start=i * DAY, end=(i + 1) * DAY, rows=1000)
        return True

    ledger = Watched(real)
    result = SageIterator(ledger, "s", "p00", always_retry, wait_for_blocks=wait_for_blocks).run()
    assert result.outcome == "TIMEOUT" and ledger.requests == []


# ------------------------------------------------------------------ many writers
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(6))
def test_random_interleavings_of_rivals_end_within_the_bounds(tmp_path, policy, seed):
    """Seeded schedules of what other pipelines do between the read and the charge, and while each run
    goes: spend part of what is left, retire blocks, add blocks, finish. Every run ends within
    max_iterations + max_refusals requests and never asks a refused choice again."""
    rng = random.Random(f"{policy}-{seed}")
    real = make_ledger(tmp_path, policy, blocks=6)
    for name in ("r1", "r2"):
        real.register("s", name)
    added = [0]

    def chaos(*_args):
        for _ in range(rng.randint(0, 3)):
            action = rng.random()
            active = [b.id for b in real.blocks("s", state="active")]
            if action < 0.55 and active:
                blocks = rng.sample(active, min(len(active), rng.randint(1, 3)))
                spend_all_left(real, rng.choice(["r1", "r2", "x"]), blocks, fraction=rng.uniform(0.2, 1.0))
            elif action < 0.85 and added[0] < 6:
                added[0] += 1
                i = 100 + added[0]
                real.add_block("s", f"n{i}", start=i * DAY, end=(i + 1) * DAY, rows=1000)

    def run(grant, split, eta, iteration):
        chaos()
        return power_rule(real, need=rng.choice([600, 1500, 1e9]))(grant, split, eta, iteration)

    def wait_for_blocks(timeout):
        chaos()
        return rng.random() < 0.8

    ledger = Watched(real, before_request=chaos)
    result = SageIterator(
        ledger,
        "s",
        "a",
        run,
        settings=IteratorSettings(max_iterations=5, max_refusals=3, max_idle_waits=4),
        wait_for_blocks=wait_for_blocks,
    ).run()
    assert result.outcome in ("ACCEPT", "REJECT", "TIMEOUT")
    assert len(ledger.requests) <= 5 + 3 and len(ledger.refused) <= 3
    assert ledger.asked_again_after_refusal() == []
    assert real.audit().ok


@pytest.mark.parametrize("policy", POLICIES)
def test_several_pipelines_share_a_stream_in_threads(tmp_path, policy):
    """Four iterators, each in a thread with its own connection, compete for one stream while a replay adds
    blocks; every one ends (joined with a time guard) within its own request bound."""
    location = tmp_path / "ledger.db"
    make_ledger(tmp_path, policy, blocks=4).close()
    arrivals, lock = iter(range(12)), threading.Lock()
    results, watched, errors = {}, {}, {}

    def worker(name, need):
        real = Ledger.open(location)
        try:

            def wait_for_blocks(timeout):
                with lock:
                    i = next(arrivals, None)
                if i is None:
                    return False
                real.add_block("s", f"n{i:02d}", start=(50 + i) * DAY, end=(51 + i) * DAY, rows=1000)
                return True

            watched[name] = ledger = Watched(real)
            results[name] = SageIterator(
                ledger,
                "s",
                name,
                power_rule(real, need),
                settings=IteratorSettings(max_iterations=6, max_refusals=4, max_idle_waits=3),
                wait_for_blocks=wait_for_blocks,
            ).run()
        except BaseException as exc:  # reported below
            errors[name] = exc
        finally:
            real.close()

    needs = {"easy": 300, "medium": 1500, "hard": 4000, "impossible": 1e9}
    threads = [threading.Thread(target=worker, args=item, daemon=True) for item in needs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "an iterator did not end within 120 s"
    assert errors == {}
    assert set(results) == set(needs)
    for name, result in results.items():
        assert result.outcome in ("ACCEPT", "REJECT", "TIMEOUT")
        assert len(watched[name].requests) <= 6 + 4
    assert results["impossible"].outcome == "TIMEOUT"
    with Ledger.open(location) as ledger:
        assert ledger.audit().ok
        assert {p["state"] for p in ledger.pipelines("s")} == {"done"}


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_refusals": 0}, "max_refusals 0"),
        ({"max_refusals": 1.5}, "max_refusals 1.5"),
        ({"max_idle_waits": 0}, "max_idle_waits 0"),
        ({"max_idle_waits": None}, "max_idle_waits None"),
    ],
)
def test_bad_termination_bounds_fail_before_any_charge(tmp_path, kwargs, match):
    ledger = make_ledger(tmp_path, "conserve")
    with pytest.raises(LedgerError, match=match):
        SageIterator(ledger, "s", "p", always_retry, settings=IteratorSettings(**kwargs))
    assert ledger.grants() == [] and ledger.pipelines("s") == []


# ------------------------------------------------------------------ the log keeps no data value
def test_a_failed_run_logs_the_error_type_not_the_data_value(tmp_path):
    ledger = make_ledger(tmp_path, "conserve")
    lines = []

    def leaky(grant, split, eta, iteration):
        raise ValueError("fare 26.853797509226705 is bad")

    with pytest.raises(ValueError, match="26.85"):  # the caller still gets the full exception
        SageIterator(ledger, "s", "p", leaky, progress=lines.append).run()
    ((grant, outcome, details),) = ledger.history("s", "p")
    assert outcome == "FAILED" and details["error"].startswith("ValueError")
    assert not [entry for entry in ledger.log_entries() if "26.85" in entry[3]]
    assert not [line for line in lines if "26.85" in line]
    assert any("FAILED" in line and "ValueError" in line for line in lines)

    def named(grant, split, eta, iteration):
        raise RecordError("fare", 17, "is not finite")

    with pytest.raises(RecordError):
        SageIterator(ledger, "s", "q", named).run()
    ((_grant, outcome, details),) = ledger.history("s", "q")
    assert outcome == "FAILED"
    assert details["error"] == "RecordError: column 'fare': is not finite"  # the index is data too: dropped
    outcomes = [json.loads(entry[3]) for entry in ledger.log_entries() if entry[2] == "outcome"]
    # the index 17 nowhere in an outcome entry but the grant's id (random hex, which holds "17" about 1 time in 12)
    assert outcomes and not any("17" in json.dumps({k: v for k, v in o.items() if k != "grant"}) for o in outcomes)
    assert ledger.audit().ok
