"""An ``rdp`` stream admits a query when SOME order fits; each order converts at its even part of the conversion delta.

The filter theorem (Feldman & Zrnic 2021) holds for one order with its budget fixed in advance; letting each path use
whichever order still fits is paid for by a union bound over the k orders (``filters.RdpFilter``'s docstring): each
order converts at delta_c / k. Streams stored before schema 8 converted every order at all of delta_c; they keep that
rule (``split_orders`` NULL), so their grants still audit.

* a new stream's per-order terms are the conversion at delta_c / k, and it admits exactly what dp_accounting's
  conversion at delta_c / k allows (tests/privacy/test_rdp_delta_split.py counts DP-SGD runs);
* a stream stored before schema 8 migrates to NULL, keeps every order at all of delta_c (17 charges of 0.05 fit on a
  (1, 1e-6) block where the split admits 16) and its ledger audits;
* the audit replays the rule from the stream's log entry and catches a table edited behind the log's back
  (tests/privacy/test_rdp_delta_split.py, with the delta split);
* the array form (``budget_arrays.BudgetArrays``) answers as the scalar filter under both rules.
"""

import numpy as np
import pytest

from sage_tfx.privacy import BlockRetired, BudgetRefused, Ledger, curves, filters
from sage_tfx.privacy.budget_arrays import BudgetArrays


def _charges_that_fit(ledger, stream, epsilon):
    n = 0
    with pytest.raises((BudgetRefused, BlockRetired)):  # refused, or retired once no query fits any more
        for _ in range(100):
            ledger.request("p", stream, blocks=["b0"], epsilon=epsilon)
            n += 1
    return n


def test_each_order_converts_at_its_part_of_the_conversion_delta():
    filt = filters.make_filter("rdp", 1.0, 1e-6)
    k, conversion = len(filt.orders), 1e-6 * (1 - filters.DEFAULT_QUERY_DELTA_SHARE)
    assert filt.split_orders and filt.delta_per_order == conversion / k
    assert filt.terms == tuple(curves.conversion_term(a, conversion / k) for a in filt.orders)
    older = filters.make_filter("rdp", 1.0, 1e-6, None, filters.DEFAULT_QUERY_DELTA_SHARE, False)
    assert older.terms == tuple(curves.conversion_term(a, conversion) for a in older.orders)
    # the union bound's price at each order: log(k) / (alpha - 1) more conversion
    for alpha, new, old in zip(filt.orders, filt.terms, older.terms):
        assert new - old == pytest.approx(np.log(k) / (alpha - 1), rel=1e-9)


def test_a_stream_stored_before_schema_8_keeps_its_rule_and_audits(tmp_path, monkeypatch):
    from tests.helpers.old_streams import stream_stored_before

    path = str(tmp_path / "v7.db")  # the filter sage built before schema 8: every order at all of delta_c
    stream_stored_before(
        path, monkeypatch, 7, "split_orders", lambda real, *a: real(*a[:5], split_orders=False), "old", 1.0, 1e-6
    )
    with Ledger.open(path) as ledger:
        s = ledger.stream("old")
        assert s.split_orders is None and not s.filter().split_orders and s.query_delta_share == 0.5
        new = ledger.create_stream("new", 1.0, 1e-6, accounting="rdp")
        assert new.split_orders == 1 and ledger.status("new")["split_orders"] == 1
        for stream in ("old", "new"):
            ledger.add_block(stream, "b0")
        assert (_charges_that_fit(ledger, "old", 0.05), _charges_that_fit(ledger, "new", 0.05)) == (17, 16)
        report = ledger.audit()
        assert report.ok, report.problems


@pytest.mark.parametrize("split_orders", [True, False])
def test_the_array_form_answers_as_the_scalar_filter(split_orders):
    rng = np.random.default_rng(11)
    filt = filters.make_filter("rdp", 2.0, 1e-5, None, 0.5, split_orders)
    spent = {
        f"b{i}": (float(rng.choice([0.0, 1e-6, 4.9e-6])),) + tuple(float(x) for x in rng.uniform(0, 1.5, 12))
        for i in range(200)
    }
    blocks = list(spent)
    answers = []
    for delta in (0.0, 1e-6):
        arrays = BudgetArrays(filt, "p", spent, blocks, {}, delta)
        for eps in (0.01, 0.3, 1.0):
            want = [filt.admits(spent[b], filt.cost(epsilon=eps, delta=delta)) for b in blocks]
            assert arrays.admits(arrays.cost(eps)).tolist() == want
            answers += want
    assert any(answers) and not all(answers)
