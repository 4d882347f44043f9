"""The privacy ledger's functional behaviour, the same tests on SQLite and PostgreSQL (``ledger_url``).

Budgets use binary-exact numbers (0.25, 0.5, ...) wherever the test asserts
equality, so sums are exact in floating point and equality is the right check.
"""

import json
import os
import random
import subprocess
import sys

import pytest

from sage_tfx.privacy import BlockRetired, BudgetRefused, Grant, GrantError, Ledger, LedgerError, curves
from sage_tfx.privacy.allocation import get_policy
from sage_tfx.privacy.grants import sign

DAY = 86400.0


def make_ledger(location, blocks=4, epsilon=1.0, delta=1e-5, **stream_kwargs):
    ledger = Ledger.open(location, create=True)
    ledger.create_stream("s", epsilon, delta, **stream_kwargs)
    for i in range(blocks):
        ledger.add_block("s", f"b{i}", start=i * DAY, end=(i + 1) * DAY, rows=1000 + i)
    return ledger


def spent(ledger, stream="s"):
    return {b.id: b.spent for b in ledger.blocks(stream)}


def sage(*args):
    return subprocess.run([sys.executable, "-m", "sage_tfx", *args], capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------ composition
def test_basic_composition_adds_up_per_block(ledger_url):
    ledger = make_ledger(ledger_url)
    g1 = ledger.request("p", "s", blocks=["b0", "b1"], epsilon=0.25, delta=2.5e-6)
    g2 = ledger.request("p", "s", blocks=["b1", "b2"], epsilon=0.5)
    assert g1.blocks == ("b0", "b1") and g1.epsilon == 0.25 and g1.delta == 2.5e-6
    assert g2.blocks == ("b1", "b2") and g2.epsilon == 0.5 and g2.delta == 0.0
    assert spent(ledger) == {"b0": (0.25, 2.5e-6), "b1": (0.75, 2.5e-6), "b2": (0.5, 0.0), "b3": (0.0, 0.0)}

    status = {b["id"]: b for b in ledger.status("s")["blocks"]}
    assert status["b1"]["epsilon_spent"] == 0.75 and status["b1"]["epsilon_remaining"] == 0.25
    assert status["b3"]["epsilon_remaining"] == 1.0 and status["b0"]["delta_spent"] == 2.5e-6

    # b1 has 0.25 left: 0.375 is refused, and the refusal names b1 and what it lacked.
    with pytest.raises(BudgetRefused) as refused:
        ledger.request("p", "s", blocks=["b1", "b3"], epsilon=0.375)
    assert set(refused.value.shortfalls) == {"b1"}
    assert "0.375 asked" in refused.value.shortfalls["b1"] and "0.25 left" in refused.value.shortfalls["b1"]
    # Exactly the remainder fits (<=, not <).
    ledger.request("p", "s", blocks=["b1"], epsilon=0.25)
    assert ledger.block("s", "b1").spent == (1.0, 2.5e-6)

    # Delta is a budget of its own: 1e-5 - 2.5e-6 left on b0.
    with pytest.raises(BudgetRefused) as refused:
        ledger.request("p", "s", blocks=["b0"], epsilon=0.125, delta=8e-6)
    assert "delta" in refused.value.shortfalls["b0"]
    assert ledger.audit().ok


def test_refusal_on_one_block_changes_no_block(ledger_url, raw_sql):
    ledger = make_ledger(ledger_url)
    ledger.request("p", "s", blocks=["b0"], epsilon=0.75)
    tables = ("blocks", "grants", "log", "reservations", "pipelines")
    before = {t: sorted(map(repr, raw_sql(ledger_url, f"SELECT * FROM {t}"))) for t in tables}
    with pytest.raises(BudgetRefused) as refused:
        ledger.request("q", "s", blocks=["b1", "b2", "b0", "b3"], epsilon=0.5)
    assert set(refused.value.shortfalls) == {"b0"}
    after = {t: sorted(map(repr, raw_sql(ledger_url, f"SELECT * FROM {t}"))) for t in tables}
    assert after == before
    assert spent(ledger) == {"b0": (0.75, 0.0), "b1": (0.0, 0.0), "b2": (0.0, 0.0), "b3": (0.0, 0.0)}


# ------------------------------------------------------------------ retirement and fresh blocks
def test_retired_block_is_never_offered_again(ledger_url):
    ledger = make_ledger(ledger_url, min_epsilon=0.125)
    ledger.request("p", "s", blocks=["b1"], epsilon=0.875)
    assert ledger.block("s", "b1").state == "active"  # 0.125 left: a min_epsilon query still fits
    ledger.request("p", "s", blocks=["b2"], epsilon=0.9375)
    b2 = ledger.block("s", "b2")  # 0.0625 left < min_epsilon: useless, so retired
    assert b2.state == "retired" and b2.retired is not None
    ledger.request("p", "s", blocks=["b1"], epsilon=0.125)
    assert ledger.block("s", "b1").state == "retired"

    with pytest.raises(BlockRetired, match="b1"):
        ledger.request("p", "s", blocks=["b0", "b1"], epsilon=0.01)
    with pytest.raises(BlockRetired, match="b2"):
        ledger.request("p", "s", blocks=["b2"], epsilon=0.01)
    # A window over all four days offers only the active blocks.
    grant = ledger.request("p", "s", window=(0, 4 * DAY), epsilon=0.25)
    assert grant.blocks == ("b0", "b3")
    assert ledger.window_blocks("s", 0, 4 * DAY) == ["b0", "b3"]
    assert ledger.available_epsilon("p", "s", ["b1"]) == 0.0
    assert [b.id for b in ledger.blocks("s", state="retired")] == ["b1", "b2"]
    status = {b["id"]: b for b in ledger.status("s")["blocks"]}
    assert status["b2"]["state"] == "retired" and status["b2"]["epsilon_remaining"] == 0.0
    assert ledger.status("s")["retired_blocks"] == 2
    assert ledger.audit().ok


def test_new_blocks_arrive_fresh_after_old_ones_retire(ledger_url):
    ledger = make_ledger(ledger_url, blocks=2)
    ledger.request("p", "s", blocks=["b0", "b1"], epsilon=1.0)
    assert {b.state for b in ledger.blocks("s")} == {"retired"}
    with pytest.raises(LedgerError, match="no active blocks"):
        ledger.request("p", "s", window=(0, 2 * DAY), epsilon=0.1)
    fresh = ledger.add_block("s", "b2", start=2 * DAY, end=3 * DAY)
    assert fresh.state == "active" and fresh.spent == (0.0, 0.0)
    assert ledger.available_epsilon("p", "s", ["b2"]) == 1.0
    grant = ledger.request("p", "s", window=(0, 3 * DAY), epsilon=1.0, delta=1e-6)
    assert grant.blocks == ("b2",)
    assert ledger.audit().ok


# ------------------------------------------------------------------ grants
def test_grants_are_signed_and_verified(ledger_url, tmp_path):
    ledger = make_ledger(ledger_url)
    ledger.create_stream("other", 1.0, 1e-5)
    ledger.add_block("other", "o0")
    grant = ledger.request("p", "s", blocks=["b0", "b2"], epsilon=0.5, delta=1e-6, meta={"iteration": 1})
    assert len(grant.signature) == 64
    assert ledger.verify(grant) == grant
    assert ledger.verify(grant.to_json(), stream="s", epsilon=0.5, delta=1e-6) == grant
    assert ledger.get_grant(grant.id) == grant
    assert [g.id for g in ledger.grants("s")] == [grant.id]

    body = json.loads(grant.to_json())
    for field, value in [
        ("epsilon", 1.0),
        ("blocks", ["b0", "b1", "b2"]),
        ("stream", "other"),
        ("pipeline", "q"),
        ("cost", [0.0, 0.0]),
        ("meta", {"iteration": 2}),
    ]:
        with pytest.raises(GrantError, match="forged"):
            ledger.verify(json.dumps(dict(body, **{field: value})))
    with pytest.raises(GrantError, match="forged"):
        ledger.verify(json.dumps(dict(body, signature="0" * 64)))
    with pytest.raises(GrantError, match="no grant"):
        ledger.verify(None)
    with pytest.raises(GrantError, match="malformed"):
        ledger.verify("{not json")
    # Signed by another ledger (another secret): forged here.
    with pytest.MonkeyPatch.context() as mp:  # its own key file beside it, whatever SAGE_KEY_FILE says
        mp.delenv("SAGE_KEY_FILE", raising=False)
        foreign = make_ledger(str(tmp_path / "foreign.db"))
    with pytest.raises(GrantError, match="forged"):
        ledger.verify(foreign.request("p", "s", blocks=["b0"], epsilon=0.5))
    # Correctly signed (as a holder of the key could) but never charged by this ledger: unknown.
    unknown = Grant.from_json(dict(body, id="g-000000000000000000000000"))
    unknown = Grant(**{**unknown.__dict__, "signature": sign(ledger.keyring, unknown.body())})
    with pytest.raises(GrantError, match="unknown"):
        ledger.verify(unknown)
    # A grant of stream s does not open stream "other", nor cover more than it was charged.
    with pytest.raises(GrantError, match="not 'other'"):
        ledger.verify(grant, stream="other")
    with pytest.raises(GrantError, match="covers epsilon"):
        ledger.verify(grant, epsilon=0.75)
    with pytest.raises(GrantError, match="covers delta"):
        ledger.verify(grant, delta=1e-5)


# ------------------------------------------------------------------ reservations (paper §3.3)
def reserved(raw_sql, location, block):
    return {
        p: (json.loads(r), json.loads(u))
        for p, r, u in raw_sql(location, "SELECT pipeline, reserved, used FROM reservations WHERE block = ?", (block,))
    }


def test_block_budget_is_split_among_waiting_pipelines(ledger_url, raw_sql):
    ledger = make_ledger(ledger_url, blocks=1)  # b0 arrives with nobody waiting: all of it is pool
    ledger.register("s", "p1")
    ledger.register("s", "p2")
    ledger.add_block("s", "b1", start=DAY, end=2 * DAY)
    assert reserved(raw_sql, ledger_url, "b1") == {"p1": ([0.5, 5e-6], [0.0, 0.0]), "p2": ([0.5, 5e-6], [0.0, 0.0])}
    assert reserved(raw_sql, ledger_url, "b0") == {}

    # p1 draws on its own reservation first...
    ledger.request("p1", "s", blocks=["b1"], epsilon=0.375)
    assert reserved(raw_sql, ledger_url, "b1")["p1"] == ([0.5, 5e-6], [0.375, 0.0])
    # ...then on the pool, which is empty on b1: the rest is p2's.
    with pytest.raises(BudgetRefused) as refused:
        ledger.request("p1", "s", blocks=["b1"], epsilon=0.25)
    assert "reserved for other waiting pipelines" in refused.value.shortfalls["b1"]
    with pytest.raises(BudgetRefused):  # a pipeline that did not wait gets only the pool
        ledger.request("late", "s", blocks=["b1"], epsilon=0.125)
    # b0's budget is all pool: anyone may use it, and it is not charged to a reservation.
    ledger.request("late", "s", blocks=["b0"], epsilon=0.5)
    ledger.request("p2", "s", blocks=["b1"], epsilon=0.5)
    assert reserved(raw_sql, ledger_url, "b1")["p2"] == ([0.5, 5e-6], [0.5, 0.0])
    grant_logs = [
        json.loads(body)
        for kind, body in raw_sql(ledger_url, "SELECT kind, body FROM log ORDER BY seq")
        if kind == "grant"
    ]
    assert [g["sources"] for g in grant_logs] == [["own"], ["pool"], ["own"]]
    assert ledger.audit().ok


def test_finish_redistributes_the_unused_reservation(ledger_url, raw_sql):
    ledger = make_ledger(ledger_url, blocks=0)
    for p in ("p1", "p2", "p3"):
        ledger.register("s", p)
    ledger.add_block("s", "b0", start=0, end=DAY)
    third = 1.0 / 3
    assert reserved(raw_sql, ledger_url, "b0")["p1"][0][0] == third
    ledger.request("p1", "s", blocks=["b0"], epsilon=0.125)
    ledger.finish("s", "p1", "ACCEPT")
    after = reserved(raw_sql, ledger_url, "b0")
    assert after["p1"] == ([0.125, 0.0], [0.125, 0.0])  # keeps exactly what it used
    leftover = third - 0.125
    for p in ("p2", "p3"):
        assert after[p][0][0] == third + leftover / 2
    assert ledger.available_epsilon("p2", "s", ["b0"]) == pytest.approx(third + leftover / 2, abs=1e-4)
    with pytest.raises(LedgerError, match="already finished"):
        ledger.request("p1", "s", blocks=["b0"], epsilon=0.01)
    # The last waiting pipeline inherits everything unused.
    ledger.finish("s", "p2", "TIMEOUT")
    assert reserved(raw_sql, ledger_url, "b0")["p3"][0][0] == pytest.approx(1.0 - 0.125, abs=1e-12)
    ledger.request("p3", "s", blocks=["b0"], epsilon=0.875 - 1e-9)
    assert [p["state"] for p in ledger.pipelines("s")] == ["done", "done", "waiting"]
    assert ledger.audit().ok


@pytest.mark.parametrize("policy", ["conserve", "aggressive"])
def test_policy_decides_how_much_of_a_reservation_to_plan(ledger_url, policy):
    ledger = make_ledger(ledger_url, blocks=0, policy=policy)
    ledger.register("s", "p1")
    ledger.register("s", "p2")
    ledger.add_block("s", "b0", start=0, end=DAY)
    available = ledger.available_epsilon("p1", "s", ["b0"])
    planned = get_policy(ledger.stream("s").policy).plan_epsilon(available, start_epsilon=0.0625)
    if policy == "conserve":
        assert planned == 0.0625  # start small, double on RETRY
    else:
        assert planned == pytest.approx(0.5, abs=1e-4)  # the whole reservation at once
        assert planned <= 0.5
    ledger.request("p1", "s", blocks=["b0"], epsilon=planned)  # what is planned is always granted


# ------------------------------------------------------------------ RDP accounting
SIGMA, Q, STEPS = 1.1, 0.01, 1000
EPS_G, DELTA_G, DELTA_RUN = 5.0, 1e-5, 1e-6


def test_rdp_stream_fits_many_dpsgd_runs_where_basic_refuses(ledger_url):
    """One DP-SGD run (sigma=1.1, q=0.01, 1000 steps) is (1.798, 1e-5)-DP or (2.127, 1e-6)-DP per dp_accounting.

    On a stream with global (epsilon=5, delta=1e-5):
    * basic composition charges each run its (epsilon, delta): at (2.127, 1e-6) per run, 2 runs fit
      (4.254 <= 5), the 3rd is refused. No choice of per-run delta fits 3: even all of delta_g for one
      run costs epsilon 1.798 > 5/3.
    * the RDP filter composes the runs' curves, each order converting at delta_g / 12 (its conversion delta split
      over the 12 orders: filters.RdpFilter): 6 runs fit (6 runs are (4.761, 1e-5 / 12)-DP by dp_accounting),
      the 7th is refused (7 runs would be (5.178, 1e-5 / 12)-DP).
    """
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    orders = curves.DEFAULT_ORDERS
    curve = curves.dpsgd_curve(SIGMA, Q, STEPS)
    eps_run, _ = compute_epsilon(orders, curve, DELTA_RUN)
    eps_run_all_delta, _ = compute_epsilon(orders, curve, DELTA_G)
    assert round(eps_run, 3) == 2.127 and round(eps_run_all_delta, 3) == 1.798
    assert 2 * eps_run <= EPS_G < 3 * eps_run and 3 * eps_run_all_delta > EPS_G
    per_order = DELTA_G / len(orders)
    eps_6, _ = compute_epsilon(orders, [6 * c for c in curve], per_order)
    eps_7, _ = compute_epsilon(orders, [7 * c for c in curve], per_order)
    assert round(eps_6, 3) == 4.761 and round(eps_7, 3) == 5.178

    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("basic", EPS_G, DELTA_G, accounting="basic")
    # charged curves only: a stream that spends no delta on queries (query_delta_share 0) converts at all of it
    ledger.create_stream("rdp", EPS_G, DELTA_G, accounting="rdp", query_delta_share=0)
    for stream in ("basic", "rdp"):
        for i in range(4):
            ledger.add_block(stream, f"b{i}", start=i * DAY, end=(i + 1) * DAY)
    blocks = ["b0", "b1", "b2", "b3"]

    basic_grants = []
    with pytest.raises(BudgetRefused):
        for _ in range(3):
            basic_grants.append(ledger.request("p", "basic", blocks=blocks, curve=curve, delta=DELTA_RUN))
    assert len(basic_grants) == 2
    assert all(g.epsilon == eps_run and g.delta == DELTA_RUN for g in basic_grants)  # charged exactly
    assert all(ledger.block("basic", b).spent == (2 * eps_run, 2 * DELTA_RUN) for b in blocks)

    rdp_grants = []
    with pytest.raises(BudgetRefused):
        for _ in range(7):
            rdp_grants.append(ledger.request("p", "rdp", blocks=blocks, curve=curve))
    assert len(rdp_grants) == 6
    assert rdp_grants[0].converted_epsilon == compute_epsilon(orders, curve, DELTA_G)[0]  # for information
    assert rdp_grants[0].epsilon == curves.pure_epsilon(curve, orders)  # what its stages may spend
    # The ledger's per-block guarantee is what dp_accounting says of the 6 composed runs at delta_g / 12.
    for b in blocks:
        status = ledger.block("rdp", b)
        composed = status.spent[1:]
        assert compute_epsilon(orders, composed, per_order)[0] <= EPS_G
        assert compute_epsilon(orders, composed, per_order)[0] == pytest.approx(eps_6, rel=1e-12)
    assert ledger.audit().ok


def test_rdp_stream_charges_plain_epsilon_queries_with_the_pure_dp_curve(ledger_url):
    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("r", 1.0, 1e-6, accounting="rdp")
    ledger.add_block("r", "b0")
    grant = ledger.request("p", "r", blocks=["b0"], epsilon=0.25, delta=1e-8)
    expected = curves.pure_dp_curve(0.25)
    assert grant.cost == (1e-8,) + expected
    assert ledger.block("r", "b0").spent == (1e-8,) + expected


def test_rdp_to_dp_matches_dp_accounting_exactly_on_random_curves():
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rng = random.Random(20240301)
    orders = curves.DEFAULT_ORDERS
    for _ in range(2000):
        # Values above delta^2, where dp_accounting does not take its KL shortcut (see rdp_to_dp).
        curve = [rng.uniform(1e-3, 20.0) for _ in orders]
        delta = 10 ** rng.uniform(-12, -2)
        assert curves.rdp_to_dp(orders, curve, delta) == compute_epsilon(orders, curve, delta), (curve, delta)
    # Below it, dp_accounting may report a smaller epsilon; ours is never smaller (conservative).
    tiny = [1e-14] * len(orders)
    assert curves.rdp_to_dp(orders, tiny, 1e-3)[0] >= compute_epsilon(orders, tiny, 1e-3)[0]


def test_mechanism_curves_are_dp_accountings():
    import dp_accounting

    orders = curves.DEFAULT_ORDERS
    assert curves.gaussian_curve(2.0) == pytest.approx([a / (2 * 4.0) for a in orders], rel=1e-12)
    accountant = dp_accounting.rdp.RdpAccountant(list(orders))
    accountant.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), STEPS
        )
    )
    curve = curves.dpsgd_curve(SIGMA, Q, STEPS)
    assert curves.rdp_to_dp(orders, curve, DELTA_G)[0] == accountant.get_epsilon(DELTA_G)
    # A Laplace query of epsilon e is e-DP: its curve converts to at most e (+ the conversion slack).
    lap = curves.laplace_curve(0.5)
    assert all(0 < v <= 0.5 + 1e-12 for v in lap)
    assert all(v <= p + 1e-12 for v, p in zip(lap, curves.pure_dp_curve(0.5)))


# ------------------------------------------------------------------ audit
def honest_ledger(location):
    ledger = make_ledger(location)
    ledger.register("s", "p1")
    ledger.register("s", "p2")
    ledger.add_block("s", "b4", start=4 * DAY, end=5 * DAY)
    for i in range(6):
        ledger.request("p1" if i % 2 else "p2", "s", blocks=[f"b{i % 5}", f"b{(i + 1) % 5}"], epsilon=0.125, delta=1e-7)
    ledger.request("p2", "s", blocks=["b0"], epsilon=0.5)  # b0: 3 x 0.125 + 0.5 = 0.875
    ledger.close()


def audit_cli(location):
    out = sage("ledger", "audit", "--db", location, "--json")
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else out.stderr)


def test_audit_passes_on_an_honest_ledger(ledger_url):
    honest_ledger(ledger_url)
    rc, report = audit_cli(ledger_url)
    assert rc == 0, report
    assert report["ok"] and report["grants"] == 7 and report["blocks"] == 5 and report["problems"] == []
    out = sage("ledger", "audit", "--db", ledger_url)
    assert out.returncode == 0 and out.stdout.startswith("audit OK"), out.stdout + out.stderr


def _grant_log_row(raw_sql, location):
    return raw_sql(location, "SELECT seq, body FROM log WHERE kind = 'grant' ORDER BY seq LIMIT 1")[0]


def _tamper_log_body(raw_sql, location):
    seq, body = _grant_log_row(raw_sql, location)
    data = json.loads(body)
    data["cost"] = [c / 2 for c in data["cost"]]  # pretend the grant cost half as much
    raw_sql(
        location,
        "UPDATE log SET body = ? WHERE seq = ?",
        (json.dumps(data, sort_keys=True, separators=(",", ":")), seq),
    )
    return "hash chain broken"


def _tamper_block_spent(raw_sql, location):
    raw_sql(location, "UPDATE blocks SET spent = ? WHERE id = 'b0'", (json.dumps([0.0, 0.0]),))
    return "block 'b0' of stream 's': table says spent=(0.0, 0.0)"


def _delete_log_row(raw_sql, location):
    seq, _ = _grant_log_row(raw_sql, location)
    raw_sql(location, "DELETE FROM log WHERE seq = ?", (seq,))
    return f"expected sequence number {seq}"


def _delete_last_log_row(raw_sql, location):
    raw_sql(location, "DELETE FROM log WHERE seq = (SELECT max(seq) FROM log)")
    return "is in the table but not in the log"


def _rechain_after_overspend(raw_sql, location):
    """A forger who recomputes the hash chain but cannot sign: a raised grant cost is caught by replay."""
    from sage_tfx.privacy.ledger import GENESIS, chain_hash

    rows = raw_sql(location, "SELECT seq, kind, body FROM log ORDER BY seq")
    prev = GENESIS
    for seq, kind, body in rows:
        if kind == "grant" and '"epsilon":0.5,' in body:
            data = json.loads(body)
            data["cost"][0] = 0.0  # hide the big grant's epsilon from the replay
            body = json.dumps(data, sort_keys=True, separators=(",", ":"))
        digest = chain_hash(prev, seq, kind, body)
        raw_sql(location, "UPDATE log SET body = ?, prev = ?, hash = ? WHERE seq = ?", (body, prev, digest, seq))
        prev = digest
    return "invalid signature"


@pytest.mark.parametrize(
    "tamper", [_tamper_log_body, _tamper_block_spent, _delete_log_row, _delete_last_log_row, _rechain_after_overspend]
)
def test_audit_detects_tampering(ledger_url, raw_sql, tamper):
    honest_ledger(ledger_url)
    assert audit_cli(ledger_url)[0] == 0
    expected = tamper(raw_sql, ledger_url)
    rc, report = audit_cli(ledger_url)
    assert rc == 1, report
    assert not report["ok"]
    assert any(expected in p for p in report["problems"]), report["problems"]
    out = sage("ledger", "audit", "--db", ledger_url)
    assert out.returncode == 1 and out.stdout.startswith("audit FAILED"), out.stdout + out.stderr


def test_audit_detects_overspending_after_the_stream_table_is_edited(ledger_url, raw_sql):
    """Someone raises the global epsilon in the streams table: the ledger then grants past the budget
    the log recorded for the stream, and the audit's replay (which trusts the log alone) flags it."""
    honest_ledger(ledger_url)  # b0 has spent 0.875 of 1.0
    raw_sql(ledger_url, "UPDATE streams SET epsilon = 2.0 WHERE name = 's'")
    ledger = Ledger.open(ledger_url)
    ledger.request("p2", "s", blocks=["b0"], epsilon=0.5)
    ledger.close()
    rc, report = audit_cli(ledger_url)
    assert rc == 1, report
    assert any("overspent block 'b0'" in p for p in report["problems"]), report["problems"]
    assert any("block 'b0' of stream 's' exceeds the global budget" in p for p in report["problems"])


# ------------------------------------------------------------------ the benchmark runs (figures are not asserted)
@pytest.mark.slow  # a benchmark at its smallest sizes: about 20 s
def test_bench_ledger_reports_its_figures(tmp_path):
    # add_blocks on a 2,000-block old stream (the default 100,000 takes minutes: a figure, not a check)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sage_tfx",
            "bench",
            "ledger",
            "--json",
            "--grants",
            "6",
            "--blocks",
            "4",
            "--writers",
            "1,2",
            "--repeats",
            "1",
            "--choose-blocks",
            "60",
            "--growth-blocks",
            "2000",
            "--growth-batch",
            "100",
            "--db-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    for key in ("grants_per_second", "baseline_transactions_per_second", "ratio"):
        assert figures[key] > 0 and figures["writers"]["1"][key] == figures[key]
        assert figures["writers"]["2"][key] > 0
    assert figures["audit_ok"] is True and figures["blocks_per_grant"] == 4
    # the three head-file sync modes measured in the run, the default (use) the headline, each audited
    assert figures["head_sync"] == "use" and set(figures["by_head_sync"]) == {"use", "commit", "group"}
    assert figures["by_head_sync"]["use"]["ratio"] == figures["ratio"]
    assert all(m["audit_ok"] is True and m["ratio"] > 0 for m in figures["by_head_sync"].values())
    for accounting in ("basic", "rdp"):
        choice = figures["choose_blocks"][accounting]
        assert choice["same_values"] is True and choice["speedup"] > 0 and 0 < choice["active_blocks"] <= 60
    storage = figures["storage"]  # what fsync costs on this storage, next to the figures
    assert storage["fsync_page_ms"] > 0 and storage["head_file_write_ms"] > 0 and 0 < storage["ratio_ceiling"] < 1
    assert storage["fsync_page_ms_range"][0] <= storage["fsync_page_ms"] <= storage["fsync_page_ms_range"][1]
    assert "fsync" in storage["note"] and figures["filesystem"] in storage["note"]
    growth = figures["add_blocks"]
    assert (growth["old_blocks"], growth["batch"], growth["audit_ok"]) == (2000, 100, True)
    assert growth["ms_per_block_young"] > 0 and growth["ms_per_block_old"] > 0 and growth["ratio"] > 0
    assert os.listdir(tmp_path) == []  # the run's databases (and the storage note's files) are removed


def test_audit_reports_a_stream_budget_raised_behind_the_ledgers_back(tmp_path):
    from sage_tfx.privacy import Ledger

    ledger = Ledger.open(tmp_path / "l.db", create=True)
    ledger.create_stream("s", 1.0, 1e-6)
    assert ledger.audit().ok
    with ledger._store.transaction() as tx:
        tx.run("UPDATE streams SET epsilon = 5.0 WHERE name = 's'")
    report = ledger.audit()
    assert not report.ok
    assert any("stream 's'" in p and "epsilon" in p and "5.0" in p for p in report.problems), report.problems
