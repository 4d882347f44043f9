"""A pipeline re-run under a growth schedule: run grants drawn from per-block lifetime grants.

Ledger level, on both backends: ``Ledger.draw`` (privacy/draws.py) and its audit: the draw charges no block, the
same draw again returns the same grant, a run index cannot be drawn twice with another budget (concurrent writers
too), a draw beyond a lifetime grant's (epsilon, delta) is refused, a malformed one too (nothing written), the
audit replays draws and catches tampering, and kill -9 mid-draw leaves an audited ledger. Then the driver
(``ScheduledPipeline``) and `sage run --schedule`, and ONE real TFX pipeline (taxi_regression) through two runs.
"""

import json
import math
import multiprocessing
import os
import random
import re
import shutil
import sys
import time

import numpy as np
import pytest

from sage_tfx.privacy import BudgetRefused, BudgetSplit, GrantError, Ledger, LedgerError
from sage_tfx.privacy import draws as draws_module
from sage_tfx.release.growth import (
    BBImprover,
    BBScheduler,
    GrowthError,
    ImproverParams,
    SchedulerParams,
    charge_lifetime,
    schedule_fingerprint,
)
from tests.helpers.cli import sage as _sage
from tests.helpers.kill import kill_after_first_ack

E, D = 0.5, 1e-7
META = {"strategy": "bbscheduler", "test": 1}
FP = schedule_fingerprint("p", "s", META)


def _ledger(location, blocks=6):
    ledger = Ledger.open(location, create=True)
    ledger.create_stream("s", 1.0, 1e-6)
    for i in range(blocks):
        ledger.add_block("s", f"b{i}")
    return ledger


def _lifetimes(ledger, n, pipeline="p", meta=META, fingerprint=FP):
    return [charge_lifetime(ledger, "s", pipeline, f"b{i}", E, D, meta, fingerprint) for i in range(n)]


def _snapshot(ledger):
    return len(ledger.log_entries()), ledger.draws(), len(ledger.grants("s"))


def test_draw_charges_nothing_and_is_audited(ledger_url):
    with _ledger(ledger_url) as ledger:
        lifes = _lifetimes(ledger, 3)
        spent = {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]}
        split = BudgetSplit.for_epsilon(0.2, 4e-8)
        run = ledger.draw(lifes, 0, split.charged_epsilon, split.total_delta, schedule=FP, split=split, meta={"t": 3})
        assert run.blocks == ("b0", "b1", "b2") and run.pipeline == "p"
        assert run.epsilon == pytest.approx(0.2) and run.delta == pytest.approx(4e-8)
        assert run.meta["draw"] == {"from": [g.id for g in lifes], "run": 0, "schedule": FP, "composition": "basic"}
        assert ledger.verify(run) == run  # an ordinary grant to every reader
        assert {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]} == spent
        assert sorted(ledger.draws()) == sorted((g.id, 0, run.id, "s", run.epsilon, run.delta) for g in lifes)
        # the stages release under it as under any split grant
        ledger.release(run, "training", "train-fp", split.training, split.delta)
        before = _snapshot(ledger)
        again = ledger.draw(
            [g.id for g in lifes], 0, split.charged_epsilon, split.total_delta, schedule=FP, split=split, meta={"t": 3}
        )
        assert again == run and _snapshot(ledger) == before  # the same grant back, nothing written
        assert ledger.release(run, "training", "train-fp", split.training, split.delta).reopened
        second = ledger.draw(lifes, 1, 0.1, 2e-8, schedule=FP)
        report = ledger.audit()
        assert report.ok, report.problems
        assert report.grants == 5
        kinds = [e[2] for e in ledger.log_entries()]
        assert kinds.count("draw") == 2 and second.id != run.id


def test_overdraw_and_second_draw_refused(ledger_url):
    with _ledger(ledger_url) as ledger:
        lifes = _lifetimes(ledger, 2)
        ledger.draw(lifes[:1], 0, 0.3, 5e-8, schedule=FP)
        before = _snapshot(ledger)
        with pytest.raises(GrantError, match="run 0 was already drawn"):
            ledger.draw(lifes[:1], 0, 0.25, 5e-8, schedule=FP)  # the same index, another budget
        with pytest.raises(BudgetRefused, match="b0.*would compose to \\(epsilon 0.6"):
            ledger.draw(lifes, 1, 0.3, 1e-8, schedule=FP)  # b0: 0.3 + 0.3 > 0.5
        with pytest.raises(BudgetRefused, match="delta"):
            ledger.draw(lifes, 1, 0.1, 6e-8, schedule=FP)  # b0: 5e-8 + 6e-8 > 1e-7
        assert _snapshot(ledger) == before
        ledger.draw(lifes, 1, 0.2, 5e-8, schedule=FP)  # exactly what is left on b0: admitted
        with pytest.raises(BudgetRefused, match="b0"):
            ledger.draw(lifes, 2, 1e-6, 0.0, schedule=FP)
        assert ledger.audit().ok


ZE, ZD = 1.0, 1e-6  # the lifetime grants of the "zcdp" draw tests


def _zcdp_fits(epsilons, cap_eps=ZE, cap_delta=ZD):
    """The "zcdp" rule written out (privacy/draws.py): some default order has sum min(e, alpha e^2 / 2) plus the
    conversion term at half the lifetime delta within the lifetime epsilon."""
    from sage_tfx.privacy.curves import DEFAULT_ORDERS

    half = cap_delta / 2
    return any(
        math.fsum(min(e, a * e * e / 2) for e in epsilons) + math.log1p(-1 / a) - math.log(half * a) / (a - 1)
        <= cap_eps
        for a in DEFAULT_ORDERS
    )


def test_zcdp_draws_admitted_to_the_filter_bound(ledger_url):
    """Under "zcdp" the draws of 0.02 fit ~100 times where basic composition fits 50; the one beyond the filter is
    refused with nothing written; the deltas may use half the lifetime delta; the same draw again is the same
    grant; a lifetime grant drawn under one composition refuses the other (both named)."""
    with _ledger(ledger_url) as ledger:
        lifes = [charge_lifetime(ledger, "s", "p", f"b{i}", ZE, ZD, META, FP) for i in range(3)]
        zcdp = dict(schedule=FP, composition="zcdp")
        before = _snapshot(ledger)
        with pytest.raises(BudgetRefused, match="delta 6e-07 over its runs, above the runs' share 5e-07"):
            ledger.draw(lifes[:2], 0, 0.02, 0.6 * ZD, **zcdp)  # <= D: basic would admit it
        with pytest.raises(LedgerError, match="composition 'rdp' is unknown"):
            ledger.draw(lifes[:2], 0, 0.02, 0.0, schedule=FP, composition="rdp")
        assert _snapshot(ledger) == before
        fits = max(n for n in range(1, 400) if _zcdp_fits([0.02] * n))
        assert fits > 2 * int(ZE / 0.02) - 5 and not _zcdp_fits([0.02] * (fits + 1))
        for run in range(fits):
            last = ledger.draw(lifes[:2], run, 0.02, ZD / 400, **zcdp)
        assert last.meta["draw"]["composition"] == "zcdp"
        before = _snapshot(ledger)
        with pytest.raises(BudgetRefused, match="b0.*Renyi filter under composition 'zcdp'"):
            ledger.draw(lifes[:2], fits, 0.02, ZD / 400, **zcdp)
        assert ledger.draw(lifes[:2], fits - 1, 0.02, ZD / 400, **zcdp) == last  # the same draw: the same grant
        with pytest.raises(GrantError, match=f"run {fits - 1} was already drawn"):
            ledger.draw(lifes[:2], fits - 1, 0.02, ZD / 400, schedule=FP)  # the same index under "basic"
        with pytest.raises(GrantError, match="drawn under composition 'zcdp': a draw under 'basic'"):
            ledger.draw(lifes, fits + 1, 1e-6, 0.0, schedule=FP)
        assert _snapshot(ledger) == before
        ledger.draw(lifes[2:], 0, 0.3, 0.0, schedule=FP)  # b2 under basic: then it refuses "zcdp"
        with pytest.raises(GrantError, match="drawn under composition 'basic': a draw under 'zcdp'"):
            ledger.draw(lifes, fits + 1, 1e-6, 0.0, **zcdp)
        zero = charge_lifetime(ledger, "s", "p", "b3", ZE, 0.0, META, FP)
        with pytest.raises(BudgetRefused, match="delta 0: composition 'zcdp' needs a lifetime delta > 0"):
            ledger.draw([zero], 0, 1e-3, 0.0, **zcdp)
        report = ledger.audit()
        assert report.ok, report.problems


def test_malformed_draws_refused_before_anything(ledger_url):
    with _ledger(ledger_url) as ledger:
        lifes = _lifetimes(ledger, 2)
        other = charge_lifetime(ledger, "s", "p", "b2", E, D, {**META, "test": 2}, FP)  # another schedule's meta
        no_release = ledger.request("p", "s", blocks=["b3"], epsilon=E, delta=D, meta=META)
        foreign = charge_lifetime(ledger, "s", "p", "b4", E, D, META, "another-fingerprint")
        wide = ledger.request("p", "s", blocks=["b5", "b0"], epsilon=0.1, meta=META)
        staged = ledger.request(
            "p", "s", blocks=["b5"], epsilon=0.2, delta=D, meta=META, split=BudgetSplit.for_epsilon(0.2, D)
        )
        ledger.release(staged, "training", FP, 0.1, D)
        run = ledger.draw(lifes, 0, 0.1, 0.0, schedule=FP)
        before = _snapshot(ledger)
        cases = [
            ([*lifes, other], "different meta"),
            ([*lifes, no_release], "not the one release of the schedule"),
            ([*lifes, foreign], "not the one release of the schedule"),
            ([wide], "names 2 blocks"),
            ([*lifes, staged], "has a stage split"),
            ([run], "is a run grant itself"),
            (["g-nope"], "unknown"),
            ([lifes[0], lifes[0]], "more than once"),
        ]
        for grants, match in cases:
            with pytest.raises(GrantError, match=match):
                ledger.draw(grants, 5, 0.01, 0.0, schedule=FP)
        for bad, match in [
            (dict(run=-1), "run -1"),
            (dict(epsilon=0.0), "run epsilon 0.0"),
            (dict(delta=1.0), "run delta 1.0"),
            (dict(meta={"draw": 1}), "meta key 'draw'"),
        ]:
            args = dict(run=6, epsilon=0.01, delta=0.0, meta=None) | bad
            with pytest.raises(LedgerError, match=match):
                ledger.draw(lifes, args["run"], args["epsilon"], args["delta"], schedule=FP, meta=args["meta"])
        with pytest.raises(LedgerError, match="composes to epsilon"):  # the split must fit the run's budget
            ledger.draw(lifes, 7, 0.01, 1e-8, schedule=FP, split=BudgetSplit.for_epsilon(0.02, 1e-8))
        assert _snapshot(ledger) == before
        assert ledger.audit().ok


@pytest.mark.parametrize(
    "tamper, match, composition",
    [
        ("UPDATE draws SET epsilon = 0.01 WHERE run = 0", "draw of run 0 from lifetime grant", "basic"),
        ("DELETE FROM draws WHERE run = 1", "is in the log but missing from the table", "basic"),
        ("UPDATE draws SET run = 7 WHERE run = 1", "is in the table but not in the log", "basic"),
        (
            "UPDATE grants SET body = replace(body, '\"run\":0', '\"run\":3') WHERE body LIKE '%\"draw\"%'",
            "the table's record differs from the log's",
            "basic",
        ),
        ("UPDATE draws SET epsilon = 0.3 WHERE run = 1", "draw of run 1 from lifetime grant", "zcdp"),
        (
            'UPDATE log SET body = replace(body, \'"composition":"zcdp"\', \'"composition":"basic"\') '
            "WHERE kind = 'draw'",
            "hash",
            "zcdp",
        ),
        (
            "UPDATE log SET body = replace(body, '\"epsilon\":0.1,', '\"epsilon\":0.3,') WHERE kind = 'draw'",
            "hash",
            "zcdp",
        ),
    ],
)
def test_audit_catches_tampered_draws(ledger_url, raw_sql, tamper, match, composition):
    with _ledger(ledger_url) as ledger:
        lifes = _lifetimes(ledger, 2)
        ledger.draw(lifes, 0, 0.2, 0.0, schedule=FP, composition=composition)
        ledger.draw(lifes, 1, 0.1, 0.0, schedule=FP, composition=composition)
        assert ledger.audit().ok
    raw_sql(ledger_url, tamper)
    with Ledger.open(ledger_url) as ledger:
        report = ledger.audit()
    assert not report.ok and any(match in p for p in report.problems), report.problems


@pytest.mark.parametrize(
    "broken, first, second, match",
    [
        ("overdraws", "basic", ("basic", 0.4), "overdraws block 'b0'.*epsilon 0.6"),
        ("overdraws", "zcdp", ("zcdp", 0.2), "overdraws block 'b0'.*Renyi filter under composition 'zcdp'"),
        ("mixed_compositions", "zcdp", ("basic", 0.01), "drawn under composition 'zcdp': a draw under 'basic'"),
        ("mixed_compositions", "basic", ("zcdp", 0.01), "drawn under composition 'basic': a draw under 'zcdp'"),
    ],
)
def test_audit_recomputes_the_rule_from_the_log(tmp_path, monkeypatch, broken, first, second, match):
    """A writer with the key but a broken check (the rule or the one-composition check switched off) overdraws or
    mixes compositions (a draw whose composition or epsilon is not what the rule admits): the audit's replay says
    so."""
    with _ledger(str(tmp_path / "l.db")) as ledger:
        lifes = _lifetimes(ledger, 1)
        ledger.draw(lifes, 0, 0.2, 0.0, schedule=FP, composition=first)
        assert ledger.audit().ok
        monkeypatch.setattr(draws_module, broken, lambda *a, **k: {} if broken == "overdraws" else [])
        ledger.draw(lifes, 1, second[1], 0.0, schedule=FP, composition=second[0])
        monkeypatch.undo()
        report = ledger.audit()
    assert any(re.search(match, p) for p in report.problems), report.problems


def test_schema_5_ledger_upgrades_through_6_7_8_and_9_to_10(tmp_path, raw_sql):
    location = str(tmp_path / "old.db")
    with _ledger(location) as ledger:
        _lifetimes(ledger, 1)
    raw_sql(location, "DROP TABLE draws")
    raw_sql(location, "UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    assert Ledger.upgrade(location, progress=lambda line: None) == 5  # 5 -> 6 -> 7 -> 8 -> 9, then the times
    with Ledger.open(location) as ledger:
        run = ledger.draw([g for g, _, _ in ledger.history("s", "p")], 0, 0.1, 0.0, schedule=FP)
        assert ledger.draws()[0][2] == run.id
        assert raw_sql(location, "SELECT value FROM meta WHERE key = 'schema_version'") == [("10",)]
        assert ledger.audit().ok


# --------------------------------------------------------------- concurrent writers and kill -9
def _draw_worker(location, lifetime_ids, run, epsilon, composition, out_path, start_at):
    ledger = Ledger.open(location)
    while time.time() < start_at:
        time.sleep(0.001)
    try:
        grant = ledger.draw(lifetime_ids, run, epsilon, 0.0, schedule=FP, composition=composition)
        text = grant.id
    except (GrantError, BudgetRefused) as exc:
        text = "refused: " + str(exc)
    with open(out_path, "w") as f:
        f.write(text)


@pytest.mark.parametrize(
    "case, composition",
    [
        ("same budget", "basic"),
        ("other budgets", "basic"),
        ("same budget", "zcdp"),
        ("other budgets", "zcdp"),
        ("last budget", "basic"),
        ("last budget", "zcdp"),
    ],
)
def test_concurrent_draws_of_one_index(ledger_url, tmp_path, case, composition):
    """Four writers at once: one run index with the same budget (all get the one grant) or other budgets (one
    wins); or four run indices racing for the last budget (2 fit: 0.2 each of E = 0.5 under basic; 0.12 each
    under zcdp, where a third would exceed the filter): never more than fits."""
    with _ledger(ledger_url) as ledger:
        ids = [g.id for g in _lifetimes(ledger, 3)]
    last = case == "last budget"
    if last:
        assert _zcdp_fits([0.12] * 2, E, D) and not _zcdp_fits([0.12] * 3, E, D)
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 3.0
    outs = [str(tmp_path / f"out{i}") for i in range(4)]
    budgets = [
        (i, {"basic": 0.2, "zcdp": 0.12}[composition])
        if last
        else (0, 0.1 if case == "same budget" else 0.1 + 0.01 * i)
        for i in range(4)
    ]
    procs = [
        ctx.Process(target=_draw_worker, args=(ledger_url, ids, *budgets[i], composition, outs[i], start))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    results = [open(o).read() for o in outs]
    won = [r for r in results if not r.startswith("refused")]
    with Ledger.open(ledger_url) as ledger:
        rows = ledger.draws()
        grants = len(won) if last else 1
        assert len({r[2] for r in rows}) == grants and len(rows) == 3 * grants  # one row per lifetime grant
        assert [e[2] for e in ledger.log_entries()].count("draw") == grants
        assert set(won) == {r[2] for r in rows}
        # the same draw gets the same grant back; another budget loses; the last budget goes to two writers
        assert len(won) == {"same budget": 4, "other budgets": 1, "last budget": 2}[case]
        assert ledger.audit().ok


def _draw_loop(location, ack_path, seed):
    rng = random.Random(seed)
    ledger = Ledger.open(location)
    ids = [g.id for g, _, _ in ledger.history("s", "p") if "draw" not in g.meta]
    with open(ack_path, "a") as ack:
        for run in range(seed * 100000, seed * 100000 + 100000):
            grant = ledger.draw(ids, run, rng.choice((1e-4, 2e-4)), 0.0, schedule=FP)
            ack.write(grant.id + "\n")
            ack.flush()
            os.fsync(ack.fileno())


def test_sigkill_mid_draw_leaves_an_audited_ledger(ledger_url, tmp_path):
    with _ledger(ledger_url) as ledger:
        _lifetimes(ledger, 4)
    ctx = multiprocessing.get_context("spawn")
    paths = [str(tmp_path / f"ack{w}") for w in range(3)]
    procs = [ctx.Process(target=_draw_loop, args=(ledger_url, paths[w], w + 1)) for w in range(3)]
    kill_after_first_ack(procs, paths, random.Random(3))
    acked = {line.strip() for p in paths if os.path.exists(p) for line in open(p) if line.strip()}
    with Ledger.open(ledger_url) as ledger:
        report = ledger.audit()
        assert report.ok, report.problems
        rows = ledger.draws()
        by_grant = {}
        for row in rows:
            by_grant.setdefault(row[2], []).append(row)
        assert acked <= set(by_grant)  # every acknowledged draw is there, with all its rows
        assert all(len(v) == 4 for v in by_grant.values())
        assert {g.id for g in ledger.grants("s") if "draw" in g.meta} == set(by_grant)
        ledger.draw(
            [g.id for g, _, _ in ledger.history("s", "p") if "draw" not in g.meta], 10**7, 1e-4, 0.0, schedule=FP
        )  # still works
        assert ledger.audit().ok


# ------------------------------------------------------------------------------------ the driver (Python API)
class _Crash(BaseException):
    """A process killed mid-run: nothing catches it, no outcome is recorded."""


class _Pipeline:
    """A stand-in ``run_iteration`` (a real callable: it records what it was run under) for the driver's logic;
    the real TFX pipeline runs in test_a_tfx_pipeline_runs_under_a_growth_schedule."""

    def __init__(self, crash_at=None, fail_at=None):
        self.calls, self.crash_at, self.fail_at = [], crash_at, fail_at

    def __call__(self, grant, split, eta, iteration):
        from sage_tfx.adaptive import IterationResult

        self.calls.append((grant.id, grant.epsilon, grant.delta, grant.blocks, split, eta, iteration))
        if iteration == self.crash_at:
            self.crash_at = None
            raise _Crash()
        if iteration == self.fail_at:
            raise ValueError("a data value 12.5 in a message")
        return IterationResult("RETRY", bound=float(iteration))


def _driver(ledger, run_iteration, request=None, **params):
    from sage_tfx.release.scheduled_pipeline import ScheduledPipeline

    schedule = BBScheduler(
        SchedulerParams(**({"epsilon": E, "delta": D, "gamma": 1.0, "t0": 2, "composition": "basic"} | params))
    )
    return ScheduledPipeline(ledger, "s", "p", schedule, run_iteration, name="stand-in", request=request), schedule


def test_driver_charges_each_block_once_and_resumes_a_killed_run_under_its_grant(tmp_path):
    with _ledger(str(tmp_path / "l.db"), blocks=8) as ledger:
        pipeline = _Pipeline(crash_at=2)
        driver, schedule = _driver(ledger, pipeline)
        with pytest.raises(_Crash):
            driver.advance()
        assert [c[6] for c in pipeline.calls] == [1, 2] and len(driver.order) == 4  # t = 2: run 0; t = 4: run 1
        crashed = pipeline.calls[1][0]
        driver, _ = _driver(ledger, pipeline)  # a restart: everything recovered from the ledger
        runs = driver.advance()
        assert [(r.epoch, r.t, r.resumed) for r in runs] == [(0, 2, True), (1, 4, False), (2, 8, False)]
        assert [c[6] for c in pipeline.calls] == [1, 2, 2, 3] and pipeline.calls[2][0] == crashed  # same grant
        for call, (epoch, t) in zip(pipeline.calls[2:], [(1, 4), (2, 8)]):
            _, eps, delta, blocks, split, eta, _ = call
            assert eps == pytest.approx(schedule.epsilon_of(epoch)) and delta == pytest.approx(schedule.delta_of(epoch))
            assert blocks == tuple(f"b{i}" for i in range(t)) and split.charged_epsilon == pytest.approx(eps)
            assert eta == pytest.approx(0.05 / ((epoch + 1) * (epoch + 2)))
        status = {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]}
        assert status == {f"b{i}": (E, D) for i in range(8)}  # each block: its lifetime bound, once
        assert [e[2] for e in ledger.log_entries()].count("draw") == 3
        assert ledger.audit().ok
        assert _driver(ledger, pipeline)[0].advance() and len(pipeline.calls) == 4  # all resumed: nothing re-run


def test_driver_records_a_failed_run_without_its_message(tmp_path):
    from sage_tfx.release.scheduled_pipeline import RunFailed

    with _ledger(str(tmp_path / "l.db"), blocks=2) as ledger:
        driver, _ = _driver(ledger, _Pipeline(fail_at=1))
        with pytest.raises(RunFailed, match="ValueError") as info:
            driver.advance()
        assert "12.5" not in str(info.value)
        (failed,) = [(g, o, d) for g, o, d in ledger.history("s", "p") if "draw" in g.meta]
        assert failed[1] == "FAILED" and "12.5" not in json.dumps(failed[2])
        assert _driver(ledger, _Pipeline())[0].advance()[0].resumed  # not re-run


def test_driver_leaves_a_run_stopped_by_a_full_disk_to_resume_under_its_grant(tmp_path):
    """An OSError (ENOSPC) after the draw records no outcome (it was FAILED, its run grant spent): the next
    advance re-runs it under the same run grant, with no second draw."""
    from sage_tfx.privacy.errors import IterationInterrupted

    class _Full(_Pipeline):
        def __call__(self, grant, split, eta, iteration):
            result = super().__call__(grant, split, eta, iteration)
            if len(self.calls) == 1:
                raise OSError(28, "No space left on device")
            return result

    with _ledger(str(tmp_path / "l.db"), blocks=2) as ledger:
        pipeline = _Full()
        with pytest.raises(IterationInterrupted, match="ENOSPC"):
            _driver(ledger, pipeline)[0].advance()
        (stopped,) = [(g, o) for g, o, _d in ledger.history("s", "p") if "draw" in g.meta]
        assert stopped[1] is None
        (run,) = _driver(ledger, pipeline)[0].advance()
        assert not run.resumed and run.grant_id == stopped[0].id and run.outcome == "RETRY"
        assert [c[0] for c in pipeline.calls] == [stopped[0].id] * 2
        assert [e[2] for e in ledger.log_entries()].count("draw") == 1 and ledger.audit().ok


REQUEST = {"target": 0.355, "confidence": 0.95, "metric": "loss", "model": "linear", "definition": "d" * 64}


@pytest.mark.parametrize("changes", [{"target": 0.3}, {"model": "dnn"}, {"definition": "e" * 64}])
def test_driver_refuses_a_name_run_for_another_request_before_anything(tmp_path, changes):
    """The schedule driver's runs sign their request; the same name asked for another target, model or definition
    is refused (the Sage iterator's RequestMismatch, naming the stored and asked values and the fix) with nothing
    charged, drawn or logged; the same request resumes. Without the check the stricter target was run (and a
    stored outcome reported) under the name that certified the other one."""
    from sage_tfx.adaptive.iterator import RequestMismatch

    with _ledger(str(tmp_path / "l.db"), blocks=4) as ledger:
        driver, _ = _driver(ledger, _Pipeline(), request=REQUEST)
        runs = driver.advance(max_runs=1)  # t = 2: run 0 (its outcome RETRY, bound 1)
        assert [r.epoch for r in runs] == [0]
        driver.observe("b2")  # a block charged after the run: the stored bound is still the run's
        (run_grant,) = [g for g, _, _ in ledger.history("s", "p") if "draw" in g.meta]
        assert run_grant.meta["request"] == REQUEST  # signed into the run grant
        before = (ledger.log_entries(), [g.to_json() for g in ledger.grants()], ledger.status("s"))
        pipeline = _Pipeline()
        with pytest.raises(RequestMismatch) as refused:
            _driver(ledger, pipeline, request={**REQUEST, **changes})
        ((key, value),) = changes.items()
        assert f"{key} {REQUEST[key]!r} -> {value!r}" in str(refused.value)
        assert "target 0.355 (bound 1)" in str(refused.value) and "new pipeline name" in str(refused.value)
        assert (ledger.log_entries(), [g.to_json() for g in ledger.grants()], ledger.status("s")) == before
        assert pipeline.calls == []
        again = _driver(ledger, pipeline, request=REQUEST)[0].advance()  # the same request: resumes and goes on
        assert [(r.epoch, r.resumed) for r in again] == [(0, True), (1, False)]
        assert ledger.audit().ok


@pytest.mark.parametrize(
    "params, match",
    [
        ({"composition": None, "delta": 0.0}, "composition None with delta 0.0"),
        ({"composition": "zcdp"}, "BBScheduler .*'composition': 'zcdp'.* has pure runs: .*approximate=True"),
        ({"composition": "basic", "delta": 0.0}, "delta 0.0"),
    ],
)
def test_driver_refuses_schedules_a_pipeline_cannot_run_under(tmp_path, params, match):
    with _ledger(str(tmp_path / "l.db"), blocks=2) as ledger:
        before = _snapshot(ledger)
        with pytest.raises(GrowthError, match=match):
            _driver(ledger, _Pipeline(), **params)
        from sage_tfx.release.scheduled_pipeline import ScheduledPipeline

        with pytest.raises(GrowthError, match="BBImprover .* has pure runs: .*approximate=True"):
            ScheduledPipeline(ledger, "s", "p", BBImprover(ImproverParams(epsilon=E, delta=D)), _Pipeline())
        with pytest.raises(GrowthError, match="approximate runs need composition 'zcdp'"):
            BBScheduler(SchedulerParams(epsilon=E, delta=D, composition="basic"), approximate=True)
        assert _snapshot(ledger) == before


APPROXIMATE = [
    ("bbimprover", lambda e, d: BBImprover(ImproverParams(epsilon=e, delta=d, a=0.1, t0=3), approximate=True)),
    (
        "bbscheduler zcdp",
        lambda e, d: BBScheduler(
            SchedulerParams(epsilon=e, delta=d, gamma=0.2, t0=2, composition="zcdp"), approximate=True
        ),
    ),
]


@pytest.mark.parametrize("name, build", APPROXIMATE)
def test_driver_runs_approximate_schedules_under_zcdp_draws(tmp_path, name, build):
    """BBImprover (a run at every t >= t0) and BBScheduler's zcdp mode over a pipeline: each run drawn under
    "zcdp" at the schedule's (epsilon_i, delta_i), validated at eta / ((i + 1) (i + 2)) by run index; each block
    charged its lifetime (E, D) once; the audit replays the "zcdp" rule."""
    from sage_tfx.release.scheduled_pipeline import ScheduledPipeline

    with _ledger(str(tmp_path / "l.db"), blocks=8) as ledger:
        schedule, pipeline = build(ZE, ZD), _Pipeline()
        runs = ScheduledPipeline(ledger, "s", "p", schedule, pipeline, name="stand-in").advance()
        expected = [(t, *schedule.run_budget(t)) for t in range(1, 9) if schedule.run_budget(t)]
        assert [(r.t, r.epoch) for r in runs] == [(t, i) for t, i, _, _ in expected]
        # bbimprover: t = 3..8; bbscheduler: t = 2, 3, 4, 5, 6, 8, epochs 0, 2, 3, 5, 6, 7 (1 and 2, 4 and 5 merged)
        assert [r.epoch for r in runs] == ([0, 1, 2, 3, 4, 5] if name == "bbimprover" else [0, 2, 3, 5, 6, 7])
        for _run, call, (t, i, eps, delta) in zip(runs, pipeline.calls, expected):
            (grant,) = [g for g in ledger.grants("s") if g.id == call[0]]
            assert grant.meta["draw"]["composition"] == "zcdp" and grant.meta["draw"]["run"] == i
            assert call[1] == pytest.approx(eps, rel=1e-9) and call[2] == pytest.approx(delta, rel=1e-9)
            assert call[3] == tuple(f"b{k}" for k in range(t)) and call[5] == pytest.approx(0.05 / ((i + 1) * (i + 2)))
        status = {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("s")["blocks"]}
        assert status == {f"b{k}": (ZE, ZD) for k in range(8)}
        report = ledger.audit()
        assert report.ok, report.problems


def _admitted_runs(epsilons, deltas, cap_eps=ZE, cap_delta=ZD):
    """How many of the runs (epsilon_i, delta_i), in order, the ledger's "zcdp" rule admits on a lifetime grant
    of (cap_eps, cap_delta): the RDP filter (privacy/filters.py) over the cumulative sums (numpy, exact enough:
    the schedules keep a 1e-9 margin), and the deltas within half the lifetime delta."""
    from sage_tfx.privacy.curves import DEFAULT_ORDERS
    from sage_tfx.privacy.draws import zcdp_filter

    eps = np.asarray(epsilons)
    costs = np.minimum(eps[:, None], np.asarray(DEFAULT_ORDERS)[None, :] * eps[:, None] ** 2 / 2)
    spent = np.vstack([np.zeros(len(DEFAULT_ORDERS)), np.cumsum(costs, axis=0)[:-1]])
    filt, half = zcdp_filter(cap_eps, cap_delta), cap_delta / 2
    assert np.cumsum(deltas)[-1] <= half * (1 + 1e-9)

    def admits(k):
        return filt.admits((half, *spent[k]), (0.0, *costs[k]))

    low, high = 0, len(eps)  # admitted is a prefix (the sums only grow): the first refused run, by bisection
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if admits(mid) else (low, mid)
    return low


@pytest.mark.parametrize("name, build", APPROXIMATE)
def test_approximate_schedules_are_admitted_forever_and_tightly(name, build):
    """A typical schedule's first 10^5 runs (BBScheduler: 200 epochs, their epsilons below 1e-15 by then) are all
    admitted by the ledger's rule; with c 10% larger, a run is refused: the calibration is tight, not just safe."""
    schedule = build(0.8, 1e-6)
    n = 10**5 if name == "bbimprover" else 200
    budgets = (
        [schedule.run_budget(schedule.epoch_start(i)) for i in range(n)]
        if name == "bbimprover"
        else [(i, schedule.epsilon_of(i), schedule.delta_of(i)) for i in range(n)]
    )
    eps, deltas = np.array([b[1] for b in budgets]), np.array([b[2] for b in budgets])
    assert math.fsum(deltas) <= 1e-6 / 2 * (1 + 1e-12)
    assert _admitted_runs(eps, deltas, 0.8, 1e-6) == n
    refused_at = _admitted_runs(1.1 * eps, deltas, 0.8, 1e-6)
    assert refused_at < n, "a 10% larger c is admitted too: the calibration is loose"
    print(f"{name}: c {schedule.c:.6g}, first run epsilon {eps[0]:.4g}; with 1.1 c, run {refused_at} is refused")


# ------------------------------------------------------------------------------------------- sage run --schedule
PY = sys.executable


def _copy_stream(taxi_stream_300, tmp_path):
    db, data = taxi_stream_300
    shutil.copy(db, tmp_path / "ledger.db")
    shutil.copy(f"{db}.key", tmp_path / "ledger.db.key")
    shutil.copy(f"{db}.key.head", tmp_path / "ledger.db.key.head")  # a copy goes with its head (Ledger.open checks it)
    return tmp_path / "ledger.db", data


@pytest.mark.parametrize(
    "strategy, options, message",
    [
        ("bbscheduler", [1], "is not a JSON object of BBScheduler options"),
        ("bbscheduler", {"delta": 1e-7}, "'epsilon' is missing"),
        ("bbscheduler", {"epsilon": -1, "delta": 1e-7}, "epsilon -1"),
        ("bbscheduler", {"epsilon": 0.8, "delta": 0.0}, "delta 0.0"),
        ("bbscheduler", {"epsilon": 0.8, "delta": 0.0, "composition": "zcdp"}, "composition 'zcdp' needs delta > 0"),
        ("bbscheduler", {"epsilon": 0.8, "delta": 1e-7, "gama": 1}, "unknown option(s) ['gama']"),
        ("bbscheduler", {"epsilon": 0.8, "delta": 1e-7, "gamma": 0}, "gamma 0"),
        ("bbscheduler", {"epsilon": 0.8, "delta": 1e-7, "t0": 0}, "t0 0"),
        ("bbimprover", "x", "is not a JSON object of BBImprover options"),
        ("bbimprover", {"epsilon": 0.8}, "'delta' is missing"),
        ("bbimprover", {"epsilon": 0.8, "delta": 1e-7, "gamma": 1}, "unknown option(s) ['gamma']"),
        ("bbimprover", {"epsilon": 0.8, "delta": 1e-7, "a": 0.5}, "a 0.5"),
        ("bbimprover", {"epsilon": 0.8, "delta": 1.0}, "delta 1.0"),
        ("bbimprover", {"epsilon": 0.8, "delta": 1e-7, "t0": 1.5}, "t0 1.5"),
        ("bbimprover", {"epsilon": 1e-3, "delta": 1e-7}, "leaves no Renyi budget at any order"),
        ("growth", {}, "strategy 'growth' is unknown"),
    ],
)
def test_schedule_options_refused_naming_the_value(strategy, options, message):
    from sage_tfx.release.scheduled_pipeline import scheduler_from_options

    with pytest.raises(GrowthError, match="FILE: .*" + re.escape(message)):
        scheduler_from_options(options, "FILE", strategy)


@pytest.mark.parametrize(
    "schedule, options, extra, message",
    [
        ("bbimprover:{file}", {"epsilon": 1}, [], "bbimprover:"),  # the source named, then what is missing:
        ("bbimprover:{file}", {"epsilon": 1}, [], "'delta' is missing"),
        ("bbimprover:{file}", {"epsilon": 1, "delta": 1e-7, "a": 0.75}, [], "a 0.75 is invalid"),
        ("bbimprover:{file}", {"epsilon": 1, "delta": 1e-7}, ["--min-window", "3"], "--min-window 3"),
        ("pmwg:{file}", {"epsilon": 1}, [], "must look like bbscheduler:FILE"),
        ("bbscheduler:{file}", "not json", [], "the file is not JSON"),
        ("bbscheduler:{file}", {"epsilon": 0.8, "delta": 0.0, "composition": "zcdp"}, [], "composition 'zcdp' needs"),
        ("bbscheduler:{file}", {"epsilon": 0.8, "delta": 1e-7}, ["--epsilon-start", "0.5"], "--epsilon-start 0.5"),
    ],
)
def test_sage_run_schedule_bad_values_exit_2_before_any_charge(
    taxi_stream_300, tmp_path, schedule, options, extra, message
):
    db, data = _copy_stream(taxi_stream_300, tmp_path)
    path = tmp_path / "schedule.json"
    if options is not None:
        path.write_text(options if isinstance(options, str) else json.dumps(options))
    with Ledger.open(db) as ledger:
        before = (ledger.log_entries(), [g.to_json() for g in ledger.grants()])
    out = _sage(
        "run",
        "taxi_regression",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--target",
        "1e5",
        "--schedule",
        schedule.format(file=path),
        "--work-dir",
        tmp_path / "work",
        *extra,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr, out.stderr
    with Ledger.open(db) as ledger:
        assert (ledger.log_entries(), [g.to_json() for g in ledger.grants()]) == before


def test_sage_run_schedule_refuses_a_name_run_for_another_target(taxi_stream_300, tmp_path):
    """`sage run --schedule` on a pipeline name whose scheduled run was made for target 1e5 (its request signed into
    the run grant, as `sage run` signs it), asked for target 5e4: exit 2 naming both targets and the fix, before
    anything is charged, drawn or logged."""
    from sage_tfx import pipelines
    from sage_tfx.adaptive import IterationResult
    from sage_tfx.release.scheduled_pipeline import ScheduledPipeline, scheduler_from_options

    db, data = _copy_stream(taxi_stream_300, tmp_path)
    options = {"epsilon": 0.8, "delta": 5e-7, "gamma": 1.0, "t0": 2}
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(options))
    request = pipelines.load_pipeline("taxi_regression").certificate_request(1e5, 0.95)
    with Ledger.open(db) as ledger:  # the first scheduled run (its pipeline stood in for: no TFX here)
        driver = ScheduledPipeline(
            ledger,
            "taxi",
            "taxi_regression",
            scheduler_from_options(options, "test"),
            lambda *a: IterationResult("RETRY", bound=2e5),
            name="tfx:taxi_regression",
            request=request,
        )
        assert len(driver.advance(max_runs=1)) == 1
        before = (ledger.log_entries(), [g.to_json() for g in ledger.grants()])
    out = _sage(
        "run",
        "taxi_regression",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--target",
        "5e4",
        "--schedule",
        f"bbscheduler:{path}",
        "--work-dir",
        tmp_path / "work",
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "target 100000.0 -> 50000.0" in out.stderr and "bound 200000" in out.stderr, out.stderr
    assert "new pipeline name" in out.stderr, out.stderr
    with Ledger.open(db) as ledger:
        assert (ledger.log_entries(), [g.to_json() for g in ledger.grants()]) == before
        assert ledger.audit().ok


@pytest.mark.slow
@pytest.mark.tf
@pytest.mark.parametrize(
    "strategy, options, at",
    [
        ("bbscheduler", {"epsilon": 0.8, "delta": 5e-7, "gamma": 1.0, "t0": 64}, (64, 128)),
        ("bbimprover", {"epsilon": 1.0, "delta": 5e-7, "a": 0.4, "t0": 64}, (64, 65)),
    ],
)
def test_a_tfx_pipeline_runs_under_a_growth_schedule(taxi_stream_300, tmp_path, strategy, options, at):
    """taxi_regression (real taxi days) through two scheduled runs: BBScheduler basic, t0 = 64 blocks, gamma = 1
    (runs at 64 and 128 blocks, draw rule "basic"), or BBImprover, t0 = 64 (runs at 64 and 65 blocks, draw rule
    "zcdp"); the run grants' (epsilon_i, delta_i) the schedule's, each charged block exactly its lifetime (E, D),
    nothing else charged, the audit OK; every component ran under the run grant (the validator's result is
    recorded for it)."""
    from sage_tfx.release.scheduled_pipeline import scheduler_from_options

    db, data = _copy_stream(taxi_stream_300, tmp_path)
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(options))
    started = time.monotonic()
    out = _sage(
        "run",
        "taxi_regression",
        "--db",
        db,
        "--stream",
        "taxi",
        "--data-root",
        data,
        "--target",
        "1e5",
        "--schedule",
        f"{strategy}:{path}",
        "--max-iterations",
        "2",
        "--rejection-share",
        "0",
        "--work-dir",
        tmp_path / "work",
    )
    elapsed = time.monotonic() - started
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    schedule = scheduler_from_options(options, "test", strategy)
    run_lines = [line for line in out.stdout.splitlines() if "] run " in line]
    assert len(run_lines) == 2 and all("-> RETRY" in line for line in run_lines), out.stdout[-3000:]
    assert "blocks " in run_lines[0] and f"({at[0]})" in run_lines[0] and f"({at[1]})" in run_lines[1]
    with Ledger.open(db) as ledger:
        report = ledger.audit()
        assert report.ok, report.problems
        history = ledger.history("taxi", "taxi_regression")
        runs = [(g, o) for g, o, _ in history if "draw" in g.meta]
        lifetimes = [g for g, _, _ in history if "draw" not in g.meta]
        assert [(g.meta["draw"]["run"], len(g.blocks), o) for g, o in runs] == [
            (schedule.run_budget(t)[0], t, "RETRY") for t in at
        ]
        for g, _ in runs:
            _, epsilon_i, delta_i = schedule.run_budget(len(g.blocks))
            assert g.meta["draw"]["composition"] == schedule.draw_composition
            assert g.epsilon == pytest.approx(epsilon_i, rel=1e-12)
            assert g.delta == pytest.approx(delta_i, rel=1e-12)
            assert {r.stage for r in ledger.releases(g.id)} >= {"count", "training", "validation"}
        assert len(lifetimes) == at[1] and all(len(g.blocks) == 1 for g in lifetimes)
        spent = {b["id"]: (b["epsilon_spent"], b["delta_spent"]) for b in ledger.status("taxi")["blocks"]}
        charged = {g.blocks[0] for g in lifetimes}
        assert all(spent[b] == (options["epsilon"], options["delta"]) for b in charged)
        assert all(spent[b] == (0.0, 0.0) for b in spent if b not in charged)  # after the last run: uncharged
    print(f"two scheduled TFX runs ({strategy}) took {elapsed:.0f} s")
