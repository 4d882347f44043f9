"""``Ledger.available_per_block``, ``available_epsilon`` and the batched ``Ledger.finish``, checked
against the scalar code they replace, on random ledgers, on SQLite and PostgreSQL (``ledger_url``).

A random history mixes pipelines registering at different times, blocks arriving (each split
among the pipelines waiting then), grants drawn on a pipeline's own reservation or the pool
(binary-exact epsilons, which land exactly on the bisection's midpoints, and random ones; RDP
curves on `rdp` streams), pipelines finishing, and blocks retiring. On it:

* ``available_per_block`` equals, block by block and bit for bit, a scalar bisection over the
  filter's own ``admits`` and the request's ``charges.pick_source`` (what ``available_epsilon`` ran per
  block before the array form), and ``available_epsilon`` on that one block;
* ``available_epsilon`` on several blocks equals the scalar bisection over all of them;
* ``finish`` leaves exactly (text for text) the reservations the old per-row algorithm, kept
  here, leaves on an identical stream, with the same audit-log entry;
* the iterator chooses the same blocks as the old newest-first walk.
"""

import json
import math
import random
import socket
import time

import pytest

from sage_tfx.adaptive import IteratorSettings, SageIterator
from sage_tfx.privacy import BudgetRefused, Ledger, LedgerError, filters
from sage_tfx.privacy.charges import pick_source
from sage_tfx.privacy.ledger import OUTCOMES

DAY = 86400.0
PIPELINES = ("p1", "p2", "p3", "p4")
ASKERS = PIPELINES + ("late",)  # "late" never registers: it only ever gets the pool
DELTAS = {"basic": (0.0, 1e-7, 6e-6), "rdp": (0.0, 1e-7, 6e-6)}


def new_stream(ledger, name, accounting):
    if accounting == "basic":
        ledger.create_stream(name, 1.0, 1e-5, min_epsilon=0.0625)
    else:
        ledger.create_stream(name, 4.0, 1e-5, accounting="rdp", min_epsilon=0.25)


def random_charge(rng, accounting, orders):
    if accounting == "rdp" and rng.random() < 0.4:  # a Gaussian-like curve, alpha / (2 sigma^2) per step
        sigma, steps = rng.uniform(2.0, 8.0), rng.randint(1, 30)
        return dict(curve=[steps * a / (2 * sigma**2) for a in orders], delta=rng.choice([0.0, 1e-7]))
    epsilon = rng.choice([0.0625, 0.125, 0.25, 0.5, rng.uniform(0.01, 0.6)])
    if accounting == "rdp":
        epsilon *= 2
    return dict(epsilon=epsilon, delta=rng.choice([0.0, 0.0, 1e-7, 2e-6]))


def random_history(ledger, streams, accounting, rng, steps, finish=None):
    """Apply the same random operations to every stream in ``streams``; ``finish(stream, p, outcome)``."""
    finish = finish or ledger.finish
    orders = ledger.stream(streams[0]).orders
    registered, finished, n_blocks = set(), set(), 0
    for step in range(steps):
        op = rng.choices(["block", "register", "request", "drain", "finish"], [3, 1, 5, 1, 1])[0]
        if step < 2:
            op = "register"
        if op == "block" or n_blocks == 0:
            for s in streams:
                ledger.add_block(s, f"b{n_blocks:03d}", start=n_blocks * DAY, end=(n_blocks + 1) * DAY)
            n_blocks += 1
        elif op == "register" and len(registered) < len(PIPELINES):
            p = rng.choice(sorted(set(PIPELINES) - registered))
            registered.add(p)
            for s in streams:
                ledger.register(s, p)
        elif op == "request":
            ids = [b.id for b in ledger.blocks(streams[0], state="active")]
            if not ids:
                continue
            width = rng.randint(1, min(6, len(ids)))
            start = rng.randrange(len(ids) - width + 1)
            pipeline, charge = rng.choice(ASKERS), random_charge(rng, accounting, orders)
            for s in streams:
                try:
                    ledger.request(pipeline, s, blocks=ids[start : start + width], **charge)
                except (BudgetRefused, LedgerError):  # no budget, or the pipeline has finished
                    pass
        elif op == "drain":  # pipelines in turn spend all they may on one block: the way blocks retire
            ids = [b.id for b in ledger.blocks(streams[0], state="active")]
            block = rng.choice(ids) if ids else None
            for pipeline in rng.sample(ASKERS, rng.randint(1, len(ASKERS))) if ids else ():
                epsilon = ledger.available_epsilon(pipeline, streams[0], [block])
                for s in streams:
                    if epsilon > 0:
                        try:
                            ledger.request(pipeline, s, blocks=[block], epsilon=epsilon)
                        except LedgerError:  # the pipeline has finished, or the block retired
                            pass
        elif op == "finish" and registered - finished:
            p = rng.choice(sorted(registered - finished))
            finished.add(p)
            outcome = rng.choice(OUTCOMES)
            for s in streams:
                finish(s, p, outcome)


def stored_reservations(raw_sql, url, stream):
    """{block: {pipeline: {"reserved", "used"}}}, pipelines in name order (the order the pool is summed in)."""
    out = {}
    for block, pipeline, reserved, used in raw_sql(
        url,
        "SELECT block, pipeline, reserved, used FROM reservations WHERE stream = ? ORDER BY block, pipeline",
        (stream,),
    ):
        out.setdefault(block, {})[pipeline] = {"reserved": json.loads(reserved), "used": json.loads(used)}
    return out


def scalar_available(filt, blocks, reservations, pipeline, delta, tolerance=1e-4):
    """``available_epsilon`` as it was: a scalar bisection over the filter's ``admits`` and the request's rule."""

    def fits(eps):
        cost = filt.cost(epsilon=eps, delta=delta)
        return all(
            filt.admits(b.spent, cost)
            and isinstance(pick_source(filt, b.spent, cost, reservations.get(b.id, {}), pipeline), str)
            for b in blocks
        )

    lo, hi = 0.0, filt.epsilon
    if fits(hi):
        return hi
    while hi - lo > tolerance * filt.epsilon:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# ------------------------------------------------------------------ availability
@pytest.mark.parametrize("accounting", ["basic", "rdp"])
def test_available_per_block_equals_the_scalar_bisection_on_random_ledgers(ledger_url, raw_sql, accounting):
    ledger = Ledger.open(ledger_url, create=True)
    rng = random.Random(f"avail-{accounting}")
    checked = nonzero = partial = 0
    for seed in range(2):
        stream = f"s{seed}"
        new_stream(ledger, stream, accounting)
        random_history(ledger, [stream], accounting, rng, steps=70)
        filt = ledger.stream(stream).filter()
        blocks = ledger.blocks(stream)
        reservations = stored_reservations(raw_sql, ledger_url, stream)
        active = [b for b in blocks if b.state == "active"]
        assert active and len(active) < len(blocks), "the history should leave active and retired blocks"
        for pipeline in ASKERS:
            for delta in DELTAS[accounting]:
                got = ledger.available_per_block(pipeline, stream, delta=delta)
                assert list(got) == [b.id for b in active]  # every active block, oldest first
                for b in active:
                    want = scalar_available(filt, [b], reservations, pipeline, delta)
                    assert got[b.id] == want, (pipeline, delta, b.id, b.spent, reservations.get(b.id))
                    checked += 1
                    nonzero += want > 0
                    partial += 0 < want < filt.epsilon
                # Named blocks: in their order; retired and unknown ones get 0.0, like available_epsilon.
                named = [b.id for b in reversed(blocks)] + ["nope"]
                assert ledger.available_per_block(pipeline, stream, named, delta) == {**{b: 0.0 for b in named}, **got}
                assert list(ledger.available_per_block(pipeline, stream, named, delta)) == named
                for b in rng.sample(blocks, 3) + [None]:
                    one = "nope" if b is None else b.id
                    assert (
                        ledger.available_epsilon(pipeline, stream, [one], delta)
                        == ledger.available_per_block(pipeline, stream, [one], delta)[one]
                    )
                # Several blocks at once: the scalar bisection over all of them.
                width = rng.randint(2, min(5, len(active)))
                start = rng.randrange(len(active) - width + 1)
                window = active[start : start + width]
                assert ledger.available_epsilon(pipeline, stream, [b.id for b in window], delta) == scalar_available(
                    filt, window, reservations, pipeline, delta
                )
    # The random ledgers exercised every case: blocks with nothing, some and all of the budget left.
    assert checked > 200 and nonzero > 20 and partial > 20
    assert ledger.audit().ok


@pytest.mark.parametrize("accounting", ["basic", "rdp"])
def test_the_array_rules_are_the_filters_bit_for_bit(tmp_path, raw_sql, accounting):
    """Cost, RDP slack and the fit decision of ``budget_arrays.BudgetArrays``, against the filter's scalar code, at random
    epsilons (one per block) and at each block's binary-exact and exact-remainder epsilons."""
    from sage_tfx.privacy.budget_arrays import BudgetArrays

    url = str(tmp_path / "l.db")
    ledger = Ledger.open(url, create=True)
    rng = random.Random(f"rules-{accounting}")
    new_stream(ledger, "s", accounting)
    random_history(ledger, ["s"], accounting, rng, steps=70)
    filt = ledger.stream("s").filter()
    blocks = ledger.blocks("s", state="active")
    reservations = stored_reservations(raw_sql, url, "s")
    spent = {b.id: b.spent for b in blocks}
    ids = [b.id for b in blocks]
    for pipeline in ASKERS:
        for delta in DELTAS[accounting]:
            budgets = BudgetArrays(filt, pipeline, spent, ids, reservations, delta)
            for trial in range(40):
                if trial % 2:
                    eps = [rng.uniform(1e-3, filt.epsilon) for _ in blocks]
                else:  # edges: binary-exact values, and what is left on the block to the last bit
                    eps = []
                    for b in blocks:
                        left = max(1e-3, filt.epsilon - b.spent[0])
                        eps.append(
                            rng.choice(
                                [
                                    0.0625,
                                    0.125,
                                    0.25,
                                    0.5,
                                    1.0,
                                    filt.epsilon,
                                    left,
                                    math.nextafter(left, 0),
                                    math.nextafter(left, math.inf),
                                ]
                            )
                        )
                costs = budgets.cost(eps)
                fits = budgets.fits(eps)
                slack = budgets.best_slack(costs) if accounting == "rdp" else None
                for i, b in enumerate(blocks):
                    cost = filt.cost(epsilon=eps[i], delta=delta)
                    assert tuple(costs[i].tolist()) == cost
                    if slack is not None:
                        assert slack[i] == filt._best_slack(b.spent, cost)[0]
                    source = pick_source(filt, b.spent, cost, reservations.get(b.id, {}), pipeline)
                    assert fits[i] == (filt.admits(b.spent, cost) and isinstance(source, str))


def test_what_is_available_is_granted_and_a_step_more_is_not(tmp_path):
    ledger = Ledger.open(str(tmp_path / "l.db"), create=True)
    rng = random.Random(7)
    for accounting in ("basic", "rdp"):
        new_stream(ledger, accounting, accounting)
        random_history(ledger, [accounting], accounting, rng, steps=60)
        tolerance = 1e-4
        for _ in range(12):
            pipeline = rng.choice(ASKERS)
            available = ledger.available_per_block(pipeline, accounting, delta=1e-7, tolerance=tolerance)
            block = rng.choice([b for b, eps in available.items() if eps > 0] or [None])
            if block is None:
                break
            eps = available[block]
            top = ledger.stream(accounting).epsilon
            if eps < top:  # the bisection stopped within tolerance of the largest grantable epsilon
                with pytest.raises((BudgetRefused, LedgerError)):
                    ledger.request(pipeline, accounting, blocks=[block], epsilon=eps + 2 * tolerance * top, delta=1e-7)
            try:
                ledger.request(pipeline, accounting, blocks=[block], epsilon=eps, delta=1e-7)
            except LedgerError as exc:  # only a finished pipeline may be refused this way
                assert "already finished" in str(exc)
    assert ledger.audit().ok


def test_available_per_block_rejects_bad_arguments_naming_them(tmp_path):
    ledger = Ledger.open(str(tmp_path / "l.db"), create=True)
    new_stream(ledger, "s", "basic")
    ledger.add_block("s", "b0", start=0, end=DAY)
    for kwargs, named in [
        (dict(delta=1.5), "1.5"),
        (dict(delta=float("nan")), "nan"),
        (dict(tolerance=0.0), "0.0"),
        (dict(tolerance=-1e-3), "-0.001"),
        (dict(tolerance=float("inf")), "inf"),
    ]:
        for call in (
            lambda: ledger.available_per_block("p", "s", **kwargs),  # noqa: B023
            lambda: ledger.available_epsilon("p", "s", ["b0"], **kwargs),  # noqa: B023
        ):
            with pytest.raises(LedgerError, match=named):
                call()
    with pytest.raises(LedgerError, match="nostream"):
        ledger.available_per_block("p", "nostream")
    assert ledger.available_per_block("p", "s", []) == {}


# ------------------------------------------------------------------ the iterator's choice
def scalar_choose(ledger, filt, reservations, stream, pipeline, delta, epsilon, window):
    """The iterator's old walk: newest first, one scalar availability per block."""
    chosen = []
    for block in reversed(ledger.blocks(stream, state="active")):
        if scalar_available(filt, [block], reservations, pipeline, delta) >= epsilon:
            chosen.append(block.id)
            if len(chosen) == window:
                return list(reversed(chosen))
    return None


@pytest.mark.parametrize("accounting", ["basic", "rdp"])
def test_the_iterator_chooses_the_blocks_the_old_walk_chose(tmp_path, raw_sql, accounting):
    url = str(tmp_path / "l.db")
    ledger = Ledger.open(url, create=True)
    rng = random.Random(f"choose-{accounting}")
    new_stream(ledger, "s", accounting)
    random_history(ledger, ["s"], accounting, rng, steps=80)
    filt = ledger.stream("s").filter()
    reservations = stored_reservations(raw_sql, url, "s")
    n_active = len(ledger.blocks("s", state="active"))
    found = 0
    for pipeline in ASKERS:
        iterator = SageIterator(
            ledger, "s", pipeline, lambda *a: None, settings=IteratorSettings(epsilon_start=0.125, delta=1e-7)
        )
        per_block = ledger.available_per_block(pipeline, "s", delta=1e-7)
        # Ties with a block's exact availability are where a difference would show.
        for epsilon in sorted(set(per_block.values()) | {0.0625, 0.125, 0.3})[:12]:
            if epsilon <= 0:
                continue
            for window in (1, 2, 3, n_active // 2, n_active, n_active + 1):
                chosen = iterator.choose_blocks(epsilon, window)
                assert chosen == scalar_choose(ledger, filt, reservations, "s", pipeline, 1e-7, epsilon, window)
                found += chosen is not None
    assert found > 10


# ------------------------------------------------------------------ finish
def old_finish(ledger, stream, pipeline, outcome):
    """``Ledger.finish`` as it was: a SELECT and an UPDATE or INSERT per (block, other waiting pipeline)."""
    if outcome not in OUTCOMES:
        raise LedgerError(f"outcome {outcome!r} is unknown")
    with ledger._store.transaction() as tx:
        s = ledger.stream(stream, tx)
        row = tx.one("SELECT state FROM pipelines WHERE stream = ? AND name = ?", (stream, pipeline))
        if row is None or row[0] != "waiting":
            raise LedgerError(f"pipeline {pipeline!r} is not waiting on stream {stream!r}")
        now = time.time()  # the finish entry's time: the row's display time, bound by the keyed chain
        tx.run(
            "UPDATE pipelines SET state = 'done', outcome = ?, finished = ? WHERE stream = ? AND name = ?",
            (outcome, now, stream, pipeline),
        )
        others = [
            r[0]
            for r in tx.all(
                "SELECT name FROM pipelines WHERE stream = ? AND state = 'waiting' ORDER BY name", (stream,)
            )
        ]
        moved = 0
        for block_id, reserved, used in tx.all(
            "SELECT r.block, r.reserved, r.used FROM reservations r JOIN blocks b"
            " ON b.stream = r.stream AND b.id = r.block"
            " WHERE r.stream = ? AND r.pipeline = ? AND b.state = 'active'",
            (stream, pipeline),
        ):
            reserved, used = json.loads(reserved), json.loads(used)
            leftover = [max(0.0, r - u) for r, u in zip(reserved, used)]
            tx.run(
                "UPDATE reservations SET reserved = ? WHERE stream = ? AND block = ? AND pipeline = ?",
                (json.dumps(used), stream, block_id, pipeline),
            )
            moved += 1
            for other in others:
                share = [x / len(others) for x in leftover]
                cur = tx.one(
                    "SELECT reserved FROM reservations WHERE stream = ? AND block = ? AND pipeline = ?",
                    (stream, block_id, other),
                )
                if cur is None:
                    tx.run(
                        "INSERT INTO reservations (stream, block, pipeline, reserved, used) VALUES (?, ?, ?, ?, ?)",
                        (stream, block_id, other, json.dumps(share), json.dumps(s.filter().zero())),
                    )
                else:
                    tx.run(
                        "UPDATE reservations SET reserved = ? WHERE stream = ? AND block = ? AND pipeline = ?",
                        (json.dumps(filters.add(json.loads(cur[0]), share)), stream, block_id, other),
                    )
        ledger._log(
            tx,
            "finish",
            {"stream": stream, "pipeline": pipeline, "outcome": outcome, "blocks_released": moved, "to": others},
            at=now,
        )


def table(raw_sql, url, sql, stream):
    return sorted(tuple(r) for r in raw_sql(url, sql, (stream,)))


@pytest.mark.parametrize("accounting", ["basic", "rdp"])
def test_finish_leaves_exactly_what_the_per_row_algorithm_left(ledger_url, raw_sql, accounting):
    ledger = Ledger.open(ledger_url, create=True)
    rng = random.Random(f"finish-{accounting}")

    def compare(old, new):
        for sql in (
            "SELECT block, pipeline, reserved, used FROM reservations WHERE stream = ?",
            "SELECT id, state, spent FROM blocks WHERE stream = ?",
            "SELECT name, state, outcome FROM pipelines WHERE stream = ?",
        ):
            assert table(raw_sql, ledger_url, sql, old) == table(raw_sql, ledger_url, sql, new), sql
        logs = [
            json.loads(body)
            for kind, body in raw_sql(ledger_url, "SELECT kind, body FROM log ORDER BY seq")
            if kind == "finish"
        ]
        assert logs[-1] == {**logs[-2], "stream": new}

    def both(stream, pipeline, outcome):  # random_history calls it on "old<r>", then on "new<r>"
        if stream.startswith("old"):
            old_finish(ledger, stream, pipeline, outcome)
        else:
            ledger.finish(stream, pipeline, outcome)
            compare("old" + stream[3:], stream)

    for r in range(3):
        old, new = f"old{r}", f"new{r}"
        new_stream(ledger, old, accounting)
        new_stream(ledger, new, accounting)
        random_history(ledger, [old, new], accounting, rng, steps=60, finish=both)
        # The rest finish too, the last one with nobody left waiting (its leftover goes to the pool).
        for p in ledger.pipelines(new):
            if p["state"] == "waiting":
                both(old, p["name"], "TIMEOUT")
                both(new, p["name"], "TIMEOUT")
    assert sum(kind == "finish" for (kind,) in raw_sql(ledger_url, "SELECT kind FROM log")) >= 20
    assert ledger.audit().ok


def test_finish_redistributes_with_the_same_audit_entry_and_reconciles(ledger_url, raw_sql):
    ledger = Ledger.open(ledger_url, create=True)
    new_stream(ledger, "s", "basic")
    random_history(ledger, ["s"], "basic", random.Random(11), steps=80, finish=lambda *args: None)
    known = {p["name"] for p in ledger.pipelines("s")}
    for p in PIPELINES:
        if p not in known:
            ledger.register("s", p)
    for i in range(2):  # every waiting pipeline holds a share of these
        ledger.add_block("s", f"extra{i}", start=(1000 + i) * DAY, end=(1001 + i) * DAY)
    waiting = [p["name"] for p in ledger.pipelines("s") if p["state"] == "waiting"]
    assert len(waiting) >= 2
    ledger.finish("s", waiting[0], "ACCEPT")
    kind, body = raw_sql(ledger_url, "SELECT kind, body FROM log ORDER BY seq DESC LIMIT 1")[0]
    body = json.loads(body)
    assert kind == "finish" and body["pipeline"] == waiting[0] and body["to"] == sorted(waiting[1:])
    held = raw_sql(
        ledger_url,
        "SELECT count(*) FROM reservations r JOIN blocks b ON b.stream = r.stream AND"
        " b.id = r.block WHERE r.stream = 's' AND r.pipeline = ? AND b.state = 'active'",
        (waiting[0],),
    )[0][0]
    assert body["blocks_released"] == held >= 2
    assert ledger.audit().ok


def test_finish_is_one_transaction_a_failure_changes_nothing(ledger_url, raw_sql, monkeypatch):
    ledger = Ledger.open(ledger_url, create=True)
    new_stream(ledger, "s", "basic")
    for p in ("p1", "p2", "p3"):
        ledger.register("s", p)
    for i in range(3):
        ledger.add_block("s", f"b{i}", start=i * DAY, end=(i + 1) * DAY)
    ledger.request("p1", "s", blocks=["b0", "b1"], epsilon=0.125)
    tables = ("reservations", "pipelines", "log", "blocks")
    before = {t: sorted(map(repr, raw_sql(ledger_url, f"SELECT * FROM {t}"))) for t in tables}
    log = Ledger._log

    def failing_log(self, tx, kind, body, text=None, at=None):  # fails after every reservation write, before commit
        if kind == "finish":
            raise RuntimeError("injected failure")
        return log(self, tx, kind, body, text, at)

    monkeypatch.setattr(Ledger, "_log", failing_log)
    with pytest.raises(RuntimeError, match="injected"):
        ledger.finish("s", "p1", "ACCEPT")
    assert {t: sorted(map(repr, raw_sql(ledger_url, f"SELECT * FROM {t}"))) for t in tables} == before
    monkeypatch.setattr(Ledger, "_log", log)
    ledger.finish("s", "p1", "ACCEPT")
    assert ledger.audit().ok


@pytest.mark.postgres
def test_postgres_connections_send_statements_without_delay(postgres_url):
    """TCP_NODELAY: without it a statement over pg8000's 8 KiB buffer (finish's batched upserts) waits
    ~40 ms for the server's delayed ACK (Nagle's algorithm)."""

    with Ledger.open(postgres_url, create=True) as ledger:
        sock = ledger._store._conn._usock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
