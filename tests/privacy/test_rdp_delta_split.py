"""An ``rdp`` stream's delta is split once, when the stream is made (``filters.RdpFilter``, docs/block_composition.md):
``query_delta_share`` of it for the approximate-DP queries' deltas, the rest for converting the Rényi sum at a FIXED
delta. Converting at the delta a path has left (the rule before schema 7) makes the per-order budget depend on
deltas chosen after seeing outputs, which the filter proofs do not cover; streams made before keep that legacy rule
(their grants still audit) and say so.

* the default split (0.5): the queries' deltas stop at half the stream's delta, and curves are admitted exactly as
  far as dp_accounting's conversion at the other half allows (split evenly over the orders);
* ``query_delta_share=0``: a curves-only stream, converting at all of its delta (split over the orders); a charge
  with a delta is refused;
* bad shares are refused before anything is written, naming the value (``sage ledger init`` too);
* a stream stored before schema 7 (no share) migrates to NULL and keeps the legacy rule, and its ledger audits;
* the audit replays the split from the stream's log entry and catches a table edited behind the log's back;
* the array form (``budget_arrays.BudgetArrays``) answers as the scalar filter, under both rules.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from sage_tfx.privacy import BlockRetired, BudgetRefused, Ledger, LedgerError, curves, filters
from sage_tfx.privacy.budget_arrays import BudgetArrays

SIGMA, Q, STEPS = 1.1, 0.01, 1000
EPS_G, DELTA_G = 5.0, 1e-5


def _runs_that_fit(ledger, stream, blocks, curve):
    grants = []
    with pytest.raises(BudgetRefused):
        for _ in range(50):
            grants.append(ledger.request("p", stream, blocks=blocks, curve=curve))
    return len(grants)


def test_the_default_split_caps_query_deltas_at_half_and_converts_curves_at_the_other_half(ledger_url):
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    ledger = Ledger.open(ledger_url, create=True)
    s = ledger.create_stream("r", EPS_G, DELTA_G, accounting="rdp")
    assert s.query_delta_share == filters.DEFAULT_QUERY_DELTA_SHARE == 0.5
    assert ledger.status("r")["query_delta_share"] == 0.5
    ledger.create_stream("c", EPS_G, DELTA_G, accounting="rdp", query_delta_share=0)
    for stream in ("r", "c"):
        ledger.add_block(stream, "b0")
        ledger.add_block(stream, "b1")
    # (epsilon, delta) charges: their deltas sum to at most half of 1e-5, whatever the epsilons
    for _ in range(5):
        ledger.request("p", "r", blocks=["b0"], epsilon=0.01, delta=1e-6)
    with pytest.raises(BudgetRefused, match=r"may sum to 0.5 of the stream's delta 1e-05"):
        ledger.request("p", "r", blocks=["b0"], epsilon=0.01, delta=1e-6)
    with pytest.raises(BudgetRefused, match="curves-only stream"):
        ledger.request("p", "c", blocks=["b0"], epsilon=0.01, delta=1e-9)
    # DP-SGD curves: as many runs as dp_accounting converts within EPS_G at the fixed conversion delta
    orders, curve = curves.DEFAULT_ORDERS, curves.dpsgd_curve(SIGMA, Q, STEPS)

    def fit(delta):
        return max(n for n in range(1, 50) if compute_epsilon(orders, [n * c for c in curve], delta)[0] <= EPS_G)

    k = len(orders)  # each order converts at its even part of the conversion delta (the union bound over the orders)
    assert (fit(DELTA_G / 2 / k), fit(DELTA_G / k)) == (6, 6)  # the query share costs no run of six here
    assert _runs_that_fit(ledger, "r", ["b1"], curve) == fit(DELTA_G / 2 / k)
    assert _runs_that_fit(ledger, "c", ["b1"], curve) == fit(DELTA_G / k)
    assert ledger.audit().ok


@pytest.mark.parametrize("share", [1.0, -0.1, float("nan"), "half", True])
def test_a_bad_share_is_refused_naming_it_and_nothing_is_written(tmp_path, share):
    path = str(tmp_path / "l.db")
    with Ledger.open(path, create=True) as ledger:
        with pytest.raises(LedgerError, match=r"query_delta_share .* is invalid: give 0 <= share < 1"):
            ledger.create_stream("r", 1.0, 1e-6, accounting="rdp", query_delta_share=share)
        with pytest.raises(LedgerError, match="is for an 'rdp' stream"):
            ledger.create_stream("b", 1.0, 1e-6, query_delta_share=0.5)
        assert ledger.streams() == []


def test_sage_ledger_init_takes_the_share_and_refuses_a_bad_one_leaving_no_file(tmp_path):
    good, bad = tmp_path / "good.db", tmp_path / "bad.db"
    cmd = [sys.executable, "-m", "sage_tfx", "ledger", "init", "--stream", "s", "--epsilon", "1", "--delta", "1e-6"]
    out = subprocess.run(
        [*cmd, "--db", good, "--accounting", "rdp", "--query-delta-share", "0"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "accounting=rdp, query_delta_share=0," in out.stdout
    with Ledger.open(str(good)) as ledger:
        assert ledger.stream("s").query_delta_share == 0.0
    out = subprocess.run(
        [*cmd, "--db", bad, "--accounting", "rdp", "--query-delta-share", "1.5"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "query_delta_share 1.5 is invalid" in out.stderr, out.stderr
    assert not bad.exists() and not os.path.exists(f"{bad}.key")


def test_a_stream_stored_before_schema_7_keeps_the_legacy_rule_and_audits(tmp_path, monkeypatch):
    """A legacy stream (made the way sage made rdp streams before: no share stored, none in its log entry), in a
    schema-6 file: it migrates to a NULL share, keeps converting at the delta left (nine or ten 1e-6 charges fit
    under 1e-5, by float rounding, where the split allows five) and its ledger audits."""
    from tests.helpers.old_streams import stream_stored_before

    path = str(tmp_path / "v6.db")  # the filter sage built before schema 7: no delta split
    stream_stored_before(
        path, monkeypatch, 6, "query_delta_share", lambda real, *a: real(*a[:4], None), "old", 1.0, 1e-5
    )
    with Ledger.open(path) as ledger:
        s = ledger.stream("old")
        assert s.query_delta_share is None and s.filter().terms is None
        ledger.add_block("old", "b0")
        charged = 0
        with pytest.raises((BudgetRefused, BlockRetired)):  # refused, or retired once no query fits any more
            for _ in range(20):
                ledger.request("p", "old", blocks=["b0"], epsilon=0.001, delta=1e-6)
                charged += 1
        assert charged in (9, 10)  # the deltas up to (almost) all of 1e-5, as before (the split stops at five)
        assert ledger.audit().ok
        new = ledger.create_stream("new", 1.0, 1e-5, accounting="rdp")
        assert new.query_delta_share == 0.5  # streams made now split their delta


@pytest.mark.parametrize("column, edit", [("query_delta_share", "0.75"), ("split_orders", "NULL")])
def test_the_audit_replays_the_split_and_catches_a_table_edit(ledger_url, column, edit):
    """The stream's delta split, and its split over the orders (tests/privacy/test_rdp_order_split.py), replayed from its
    log entry: a table edited behind the log's back is named."""
    from tests.conftest import raw_connection

    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("r", 1.0, 1e-6, accounting="rdp", query_delta_share=0.25)
    ledger.add_block("r", "b0")
    ledger.request("p", "r", blocks=["b0"], epsilon=0.1, delta=2e-7)
    assert ledger.audit().ok
    conn = raw_connection(ledger_url)
    cur = conn.cursor()
    cur.execute(f"UPDATE streams SET {column} = {edit} WHERE name = 'r'")
    conn.commit()
    conn.close()
    problems = Ledger.open(ledger_url).audit().problems
    assert any("stream 'r'" in p and column in p for p in problems), problems


@pytest.mark.parametrize("share", [None, 0.0, 0.5, 0.9])
def test_the_array_form_answers_as_the_scalar_filter_under_both_rules(share):
    rng = np.random.default_rng(7)
    filt = filters.make_filter("rdp", 2.0, 1e-5, None, share)
    spent = {}
    for i in range(200):
        delta_spent = float(rng.choice([0.0, 1e-6, 3e-6, 4.9e-6, 5e-6, 8e-6]))
        rdp_spent = tuple(float(x) for x in rng.uniform(0, 1.5, len(filt.orders)))
        spent[f"b{i}"] = (delta_spent,) + rdp_spent
    blocks, answers = list(spent), []
    for delta in (0.0, 1e-7, 1e-6):
        arrays = BudgetArrays(filt, "p", spent, blocks, {}, delta)
        for eps in (0.01, 0.3, 1.0):
            got = arrays.admits(arrays.cost(eps))
            want = [filt.admits(spent[b], filt.cost(epsilon=eps, delta=delta)) for b in blocks]
            assert got.tolist() == want
            answers += want
    assert any(answers) and not all(answers)  # both answers occur: the comparison can fail
