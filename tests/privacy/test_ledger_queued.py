"""The queued policies (DPF-N, DPF-T, DPack) in the ledger, on SQLite and PostgreSQL (docs/scheduling_policies.md).

A refused request is recorded as the pipeline's demand in the transaction that refuses it; every scheduling
point (request, add_blocks, register, finish) runs ``allocation.QueuedAllocation.schedule`` over the pending
demands; an admitted demand is charged at once and its grant handed to the pipeline's next identical request.
Each test ends with the audit, which replays demands and admissions from the log.
"""

import json
import multiprocessing
import os
import random
import time

import pytest

from sage_tfx.privacy import BlockRetired, BudgetRefused, Ledger, LedgerError, LedgerUpgradeNeeded
from sage_tfx.privacy.store import SCHEMA_VERSION
from tests.helpers.kill import kill_after_first_ack
from tests.privacy.test_ledger_concurrency import assert_ledger_consistent


def make(location, policy="dpf-n", **params):
    ledger = Ledger.open(location, create=True)
    ledger.create_stream("s", 1.0, 1e-6, policy=policy, policy_params=params or None, min_epsilon=0.01)
    return ledger


def spent(ledger, block):
    return ledger.block("s", block).spent[0]


def demands(ledger):
    with ledger.store.transaction(write=False) as tx:
        return {
            r[0]: (json.loads(r[1]), r[2], r[3])
            for r in tx.all("SELECT pipeline, blocks, state, grant_id FROM demands WHERE stream = 's'")
        }


def log_kinds(ledger, kind):
    return [json.loads(body) for _seq, _ts, k, body, _p, _h in ledger.log_entries() if k == kind]


def test_dpf_n_queues_a_demand_and_grants_it_on_arrivals_all_or_nothing(ledger_url):
    ledger = make(ledger_url, n=4)
    ledger.add_blocks("s", [{"id": "b0"}, {"id": "b1"}])
    ledger.register("s", "p")  # one arrival on both blocks: 1/4 unlocked
    ledger.add_block("s", "b2")  # arrives after p: nothing unlocked on it yet
    with pytest.raises(BudgetRefused, match="waits in the dpf-n queue") as refused:
        ledger.request("p", "s", blocks=["b0", "b2"], epsilon=0.25)
    assert set(refused.value.shortfalls) == {"b2"}  # b0 fits alone: all-or-nothing keeps it uncharged
    assert spent(ledger, "b0") == spent(ledger, "b2") == 0.0
    assert demands(ledger) == {"p": (["b0", "b2"], "pending", None)}
    ledger.register("s", "q")  # an arrival: b2 has 1/4 unlocked now, b0 2/4
    # admitted at q's registration: charged on both blocks at once, BEFORE p asks again (charge before read)
    assert (spent(ledger, "b0"), spent(ledger, "b1"), spent(ledger, "b2")) == (0.25, 0.0, 0.25)
    (pending,) = demands(ledger).values()
    assert pending[1] == "admitted"
    grant = ledger.request("p", "s", blocks=["b0", "b2"], epsilon=0.25)  # collected: nothing charged again
    assert grant.id == pending[2] and ledger.verify(grant) == grant
    assert spent(ledger, "b0") == 0.25 and demands(ledger) == {}
    assert [a["admitted"] for a in log_kinds(ledger, "admit")] == [[["p", grant.id]]]
    assert log_kinds(ledger, "collect") == [{"stream": "s", "pipeline": "p", "grant": grant.id}]
    # a demand that fits now is granted at once, and nothing ever exceeds what is unlocked (2/4 on b0)
    assert ledger.request("q", "s", blocks=["b0"], epsilon=0.25).blocks == ("b0",)
    with pytest.raises(BudgetRefused):
        ledger.request("q2", "s", blocks=["b0"], epsilon=0.01)
    assert spent(ledger, "b0") == 0.5
    report = ledger.audit()
    assert report.ok, report.problems


def test_dpf_t_grants_a_waiting_demand_when_a_block_arrives_later(ledger_url):
    lifetime = 20.0  # seconds: the refusal below holds unless this process stalls for 4 s between two calls
    # (2 s of slack is thin on a loaded machine or in a process whose modules are not compiled yet)
    ledger = make(ledger_url, "dpf-t", lifetime=lifetime)
    ledger.add_block("s", "b0", created=time.time() - 0.3 * lifetime)  # 30% of its budget unlocked by age
    with pytest.raises(BudgetRefused, match="waits in the dpf-t queue"):
        ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
    assert spent(ledger, "b0") == 0.0
    time.sleep(0.25 * lifetime)  # >= 55% unlocked now, but nobody asked: still pending
    assert demands(ledger)["p"][1] == "pending"
    ledger.add_block("s", "b1")  # a scheduling point: the demand is admitted and charged
    assert spent(ledger, "b0") == 0.5 and demands(ledger)["p"][1] == "admitted"
    grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
    assert grant.epsilon == 0.5 and spent(ledger, "b0") == 0.5
    (admit,) = log_kinds(ledger, "admit")
    assert grant.created == admit["now"]  # charged at admission, not at collection
    report = ledger.audit()
    assert report.ok, report.problems


@pytest.mark.parametrize("policy", ["dpf-n", "dpack"])
def test_pending_demands_are_admitted_in_the_policys_order(ledger_url, policy):
    """Four shares of b0 unlock one per arrival. The big demand came first, but the two small ones (smaller
    dominant share; for DPack higher efficiency) are admitted first and leave no room for it: FCFS would grant
    it first."""
    ledger = make(ledger_url, policy, n=4)
    for pipeline in ("big", "small1", "small2"):  # registered before b0 arrives: no share of it unlocked
        ledger.register("s", pipeline)
    ledger.add_block("s", "b0")
    for pipeline, epsilon in [("big", 0.5), ("small1", 0.25), ("small2", 0.25)]:
        with pytest.raises(BudgetRefused):
            ledger.request(pipeline, "s", blocks=["b0"], epsilon=epsilon)
    ledger.register("s", "a1")
    ledger.register("s", "a2")  # 2/4 unlocked: room for big alone, or for both small ones
    assert [a["admitted"][0][0] for a in log_kinds(ledger, "admit")] == ["small1", "small2"]
    assert demands(ledger)["big"][1] == "pending" and spent(ledger, "b0") == 0.5
    ledger.finish("s", "big", "TIMEOUT")  # a finished pipeline's demand is withdrawn
    assert "big" not in demands(ledger)
    report = ledger.audit()
    assert report.ok, report.problems


def test_rdp_stream_under_dpack(ledger_url):
    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("s", 1.0, 1e-6, accounting="rdp", policy="dpack", policy_params={"n": 2})
    ledger.add_block("s", "b0")
    with pytest.raises(BudgetRefused):
        ledger.request("p", "s", blocks=["b0"], epsilon=0.8, delta=1e-8)
    ledger.register("s", "a")
    ledger.register("s", "b")
    grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.8, delta=1e-8)
    assert ledger.verify(grant) == grant and ledger.audit().ok


def test_a_request_that_changes_its_demand_replaces_it_and_an_uncollected_grant_stays_charged(ledger_url):
    ledger = make(ledger_url, n=2)
    ledger.add_block("s", "b0")
    with pytest.raises(BudgetRefused):
        ledger.request("p", "s", blocks=["b0"], epsilon=0.4)
    ledger.register("s", "a")  # 1/2 unlocked: admitted, charged
    assert demands(ledger)["p"][1] == "admitted"
    with pytest.raises(BudgetRefused):  # another demand: the admitted one is replaced, still charged
        ledger.request("p", "s", blocks=["b0"], epsilon=0.3)
    assert demands(ledger)["p"][1] == "pending" and spent(ledger, "b0") == 0.4
    (old,) = [g for g in ledger.grants("s") if g.pipeline == "p"]
    assert [g.id for g, _outcome, _details in ledger.history("s", "p")] == [old.id]
    report = ledger.audit()
    assert report.ok, report.problems


def test_bad_input_leaves_the_ledger_unchanged(ledger_url):
    ledger = make(ledger_url, n=2)
    ledger.add_block("s", "b0")
    before = len(ledger.log_entries())
    for params, needle in [
        ({"n": 0}, "n=0"),
        ({"n": True}, "n=True"),
        ({"lifetime": 5}, "parameters"),
        ("n=5", "give a dict"),
    ]:
        with pytest.raises(LedgerError, match=needle):
            ledger.create_stream("t", 1.0, 1e-6, policy="dpf-n", policy_params=params)
    with pytest.raises(LedgerError, match="lifetime=inf"):
        ledger.create_stream("t", 1.0, 1e-6, policy="dpf-t", policy_params={"lifetime": float("inf")})
    with pytest.raises(LedgerError):  # unknown block: no demand recorded
        ledger.request("p", "s", blocks=["b0", "nope"], epsilon=0.5)
    with pytest.raises(LedgerError, match="below"):  # under the grant floor: no demand recorded
        ledger.request("p", "s", blocks=["b0"], epsilon=1e-6)
    assert len(ledger.log_entries()) == before and demands(ledger) == {}
    assert [s.name for s in ledger.streams()] == ["s"]
    assert ledger.audit().ok


# ------------------------------------------------------------------------------------------------- audit
def _rechain(ledger, seq, body):
    """Rewrite log entry ``seq``'s body and re-chain every entry after it WITH the key (what only a holder of the
    key, or a bug in the ledger, could write): the chain verifies, so only the replay can object."""
    from sage_tfx.privacy.chain import canonical

    entries = ledger.log_entries()
    with ledger.store.transaction() as tx:
        prev = None
        for s, ts, kind, text, _prev, value in entries:
            if s >= seq:
                text = canonical(body) if s == seq else text
                value = ledger.keyring.chain_value(prev, s, kind, text, ts)
                tx.run("UPDATE log SET body = ?, prev = ?, hash = ? WHERE seq = ?", (text, prev, value, s))
            prev = value


def test_audit_catches_an_admission_out_of_the_policys_order(ledger_url):
    ledger = make(ledger_url, n=4)
    ledger.add_block("s", "b0")
    for pipeline, epsilon in [("big", 0.5), ("small", 0.25)]:
        with pytest.raises(BudgetRefused):
            ledger.request(pipeline, "s", blocks=["b0"], epsilon=epsilon)
    ledger.register("s", "a1")  # 1/4 unlocked: small admitted
    assert ledger.audit().ok
    ((seq, body),) = [(e[0], json.loads(e[3])) for e in ledger.log_entries() if e[2] == "admit"]
    assert body["admitted"][0][0] == "small"
    # the admission claims 'big' was admitted (0.5 > the 0.25 unlocked) with small's grant
    _rechain(ledger, seq, dict(body, admitted=[["big", body["admitted"][0][1]]]))
    problems = ledger.audit().problems
    assert any("scheduler at time" in p and "admits ['small']" in p for p in problems), problems


@pytest.mark.parametrize(
    "sql, needle",
    [
        ("UPDATE blocks SET arrivals = arrivals + 1", "pipeline arrivals since it arrived"),
        ("DELETE FROM demands", "demand of pipeline 'big'"),
        ("UPDATE demands SET seq = 0", "demand of pipeline 'big'"),
    ],
)
def test_audit_catches_tampered_queue_tables(ledger_url, sql, needle):
    ledger = make(ledger_url, n=4)
    ledger.add_block("s", "b0")
    with pytest.raises(BudgetRefused):
        ledger.request("big", "s", blocks=["b0"], epsilon=0.5)
    ledger.register("s", "a1")
    assert ledger.audit().ok
    with ledger.store.transaction() as tx:
        tx.run(sql)
    problems = ledger.audit().problems
    assert any(needle in p for p in problems), problems


def test_a_schema_4_ledger_opens_unchanged_and_stays_valid(ledger_url):
    with Ledger.open(ledger_url, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-6)
        ledger.add_block("s", "b0")
        ledger.register("s", "p")
        grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
        with ledger.store.transaction() as tx:  # back to schema 4: no demands table, policy_params, arrivals
            for sql in (
                "DROP TABLE demands",
                "ALTER TABLE streams DROP COLUMN policy_params",
                "ALTER TABLE blocks DROP COLUMN arrivals",
                "UPDATE meta SET value = '4' WHERE key = 'schema_version'",
            ):
                tx.run(sql)
    with pytest.raises(LedgerUpgradeNeeded, match="sage ledger upgrade"):
        Ledger.open(ledger_url)
    Ledger.upgrade(ledger_url, progress=lambda line: None)
    with Ledger.open(ledger_url) as ledger:
        assert ledger.verify(grant) == grant and ledger.stream("s").policy_params is None
        with ledger.store.transaction(write=False) as tx:
            assert tx.one("SELECT value FROM meta WHERE key = 'schema_version'")[0] == str(SCHEMA_VERSION) == "10"
        assert ledger.audit().ok
        ledger.create_stream("q", 1.0, 1e-6, policy="dpf-n", policy_params={"n": 3})
        ledger.add_block("q", "b0")
        with pytest.raises(BudgetRefused):
            ledger.request("p", "q", blocks=["b0"], epsilon=0.5)
        assert ledger.audit().ok


# ------------------------------------------------------------------------------- concurrency and kill -9
def queue_worker(location, index, seed, seconds, ack_path):
    """Jobs one after another for ``seconds`` from the worker's start (not its launch: spawning is slow under
    load), each a new pipeline (an arrival): register, then repeat one request until it is granted (collected)
    or 2 s pass (then finish TIMEOUT, withdrawing it). Every grant handed over is appended to ``ack_path``
    (fsync) only after request returned."""
    rng = random.Random(seed)
    ledger = Ledger.open(location)
    deadline = time.time() + seconds
    with open(ack_path, "a") as ack:
        job = 0
        while time.time() < deadline:
            job += 1
            name = f"w{index}-{job}"
            ledger.register("s", name)
            active = [b.id for b in ledger.blocks("s", state="active") if not b.id.startswith("m")]
            if not active:
                time.sleep(0.05)
                continue
            blocks = rng.sample(active, min(len(active), rng.randint(1, 4)))
            # exact binary sums: a block fills to exactly 1.0 and retires
            epsilon, give_up = rng.choice((0.125, 0.25)), time.time() + 2.0
            outcome = "TIMEOUT"
            while time.time() < min(give_up, deadline):
                try:
                    grant = ledger.request(name, "s", blocks=blocks, epsilon=epsilon, delta=rng.choice((0.0, 1e-9)))
                except BudgetRefused:
                    time.sleep(0.01)
                    continue
                except BlockRetired:
                    break
                ack.write(grant.to_json() + "\n")
                ack.flush()
                os.fsync(ack.fileno())
                outcome = "ACCEPT"
                break
            ledger.finish("s", name, outcome)
    ledger.close()


def _acks(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            for line in f.read().split("\n")[:-1]:
                out[json.loads(line)["id"]] = line
    return out


def _setup_queue(location, blocks=4):
    with Ledger.open(location, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-5, policy="dpf-n", policy_params={"n": 6}, min_epsilon=0.02)
        ledger.add_blocks("s", [{"id": f"b{i:02d}"} for i in range(blocks)])


def _check_queue_ledger(location, acknowledged):
    blocks, grants = assert_ledger_consistent(location, "s", acknowledged)  # audit OK, no overspend, exact sums
    with Ledger.open(location) as ledger:
        admits = log_kinds(ledger, "admit")
    by_other = sum(1 for a in admits for p, _g in a["admitted"] if p != a["collected"])
    return blocks, grants, by_other


def test_queued_stream_never_overspends_under_concurrent_writers(ledger_url, tmp_path):
    _setup_queue(ledger_url)
    ack_dir = tmp_path / "acks"
    ack_dir.mkdir()
    with Ledger.open(ledger_url) as ledger:
        # One demand that only ANOTHER process can admit: on block m0 (no worker asks for m-blocks) after one
        # arrival 1/6 of it is unlocked (< 0.25); a worker's first register unlocks 2/6 and admits it there.
        ledger.add_blocks("s", [{"id": "m0"}])
        ledger.register("s", "main")
        with pytest.raises(BudgetRefused):
            ledger.request("main", "s", blocks=["m0"], epsilon=0.25)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=queue_worker, args=(ledger_url, i, 500 + i, 12.0, str(ack_dir / f"{i}.txt")))
        for i in range(4)
    ]  # 12 s each from its own start: spawning is slow under load
    for p in procs:
        p.start()
    with Ledger.open(ledger_url) as ledger:  # new data arrives meanwhile
        for i in range(4):
            time.sleep(2.0)
            ledger.add_block("s", f"n{i}")
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    acknowledged = _acks(str(ack_dir))
    with Ledger.open(ledger_url) as ledger:  # the admitted demand is collected by its identical request
        grant = ledger.request("main", "s", blocks=["m0"], epsilon=0.25)
        acknowledged[grant.id] = grant.to_json()
        ledger.finish("s", "main", "ACCEPT")
    blocks, grants, by_other = _check_queue_ledger(ledger_url, acknowledged)
    assert len(acknowledged) >= 10, len(acknowledged)
    assert by_other >= 1, "no demand was admitted at another process's scheduling point: the queue went untested"
    assert any(b.state == "retired" for b in blocks.values()), "no block ran out: the budget check went untested"


def test_queued_stream_survives_sigkill(ledger_url, tmp_path):
    _setup_queue(ledger_url)
    ack_dir = tmp_path / "acks"
    ack_dir.mkdir()
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random(11)
    for round_no in range(2):
        procs = [
            ctx.Process(
                target=queue_worker,
                args=(
                    ledger_url,
                    10 * round_no + i,
                    900 + 10 * round_no + i,
                    120.0,
                    str(ack_dir / f"{round_no}-{i}.txt"),
                ),
            )
            for i in range(3)
        ]
        paths = [str(ack_dir / f"{round_no}-{i}.txt") for i in range(3)]
        # the workers get going (one acknowledged grant), then each is killed at random
        kill_after_first_ack(procs, paths, rng, settle=(0.5, 2.0), spacing=0.3)
        with Ledger.open(ledger_url) as ledger:
            ledger.add_block("s", f"r{round_no}")
    acknowledged = _acks(str(ack_dir))
    assert len(acknowledged) >= 3, len(acknowledged)
    _check_queue_ledger(ledger_url, acknowledged)
    with Ledger.open(ledger_url) as ledger:  # it still works: a fresh block, fully unlocked after n arrivals
        ledger.add_block("s", "after")
        for i in range(6):
            ledger.register("s", f"late{i}")
        grant = ledger.request("late0", "s", blocks=["after"], epsilon=1.0)
        assert ledger.verify(grant) == grant and ledger.audit().ok


@pytest.mark.parametrize("accounting", ["basic", "rdp"])
def test_availability_answers_what_fits_the_unlocked_budget(ledger_url, accounting):
    """available_per_block / available_epsilon on a queued stream: the largest epsilon that fits unlocked minus
    spent (and the filter), within the bisection's tolerance; each answer is granted at once, a little more
    is queued."""
    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("s", 1.0, 1e-6, accounting=accounting, policy="dpf-n", policy_params={"n": 4})
    ledger.add_blocks("s", [{"id": "b0"}, {"id": "b1"}])
    ledger.register("s", "a")  # 1/4 of b0 and b1 unlocked
    ledger.add_block("s", "b2")  # nothing of b2 unlocked
    ledger.request("a", "s", blocks=["b1"], epsilon=0.1, delta=1e-8)
    tol = 1e-4
    per_block = ledger.available_per_block("p", "s", delta=1e-8, tolerance=tol)
    assert per_block["b2"] == 0.0
    if accounting == "basic":  # closed form: unlocked 0.25 minus spent
        assert 0.25 - tol <= per_block["b0"] <= 0.25 and 0.15 - tol <= per_block["b1"] <= 0.15
    assert per_block["b1"] < per_block["b0"]
    assert ledger.available_epsilon("p", "s", ["b0", "b1"], delta=1e-8, tolerance=tol) == per_block["b1"]
    for block in ("b0", "b1"):
        with pytest.raises(BudgetRefused):
            ledger.request(f"over-{block}", "s", blocks=[block], epsilon=per_block[block] + 2 * tol, delta=1e-8)
        assert ledger.request(f"at-{block}", "s", blocks=[block], epsilon=per_block[block], delta=1e-8)
    assert ledger.audit().ok
