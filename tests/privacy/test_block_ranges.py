"""A grant's blocks read and written by id range (privacy/block_ranges.py) where they lie next to each other in the
store: the same rows, values, states and log as the ``IN``-list path, on random block sets with gaps, mixed states
and ids whose text order is not their number order, on both backends; ranges never reach another stream's blocks.

Budgets are binary-exact (0.25, 0.5, ...) so equality is the right check.
"""

import random

import pytest

from sage_tfx.privacy import BlockRetired, BudgetRefused, Ledger, UnknownBlock, block_ranges, requests

# text order is not number order ("b10" < "b2"), and other ids sort between them
IDS = [f"b{i}" for i in range(40)] + ["b1a", "b2-x", "c0", "c1", "c2", "a9"]


def _ledger(location):
    ledger = Ledger.open(location, create=True)
    for stream in ("r", "i", "other"):  # "r" by ranges, "i" by IN lists, "other" holds the same ids
        ledger.create_stream(stream, 1.0, 1e-5, min_epsilon=0.25)
        ledger.add_blocks(stream, [{"id": b} for b in IDS])
    return ledger


def _table(ledger, stream):
    return {b.id: (b.spent, b.state, b.retired is None) for b in ledger.blocks(stream)}


def test_ranged_and_in_list_grants_leave_the_same_ledger(ledger_url, monkeypatch):
    ranged, refused, mixed = [], 0, 0

    def ranged_on_r(tx, stream, ids):  # stream "i" keeps the IN lists: the path before ranges
        got = None if stream == "i" else block_ranges.ranged_budgets(tx, stream, ids)
        ranged.append(got is not None)
        return got

    monkeypatch.setattr(requests, "ranged_budgets", ranged_on_r)
    ledger = _ledger(ledger_url)
    rng = random.Random(7)
    for n in range(40):
        active = sorted(b for b, (_, state, _) in _table(ledger, "r").items() if state == "active")
        if not active:
            break
        if n % 3 == 0:  # a window of consecutive ids in text order, one id left out: a gap
            start = rng.randrange(len(active))
            chosen = active[start : start + rng.randint(2, 20)]
            chosen = [b for b in chosen if b != rng.choice(chosen)] or chosen
        else:
            chosen = rng.sample(active, rng.randint(1, len(active)))
        rng.shuffle(chosen)
        epsilon = rng.choice([0.25, 0.5])
        table = _table(ledger, "r")
        mixed += len({table[b][0] for b in chosen}) > 1
        outcomes = []
        for stream in ("r", "i"):
            try:
                outcomes.append(list(ledger.request(f"p{n}", stream, blocks=chosen, epsilon=epsilon).blocks))
            except BudgetRefused as exc:  # too little left on some block: refused alike, nothing charged
                outcomes.append(str(exc).replace("'r'", "'i'"))
        assert outcomes[0] == outcomes[1]
        refused += isinstance(outcomes[0], str)
        assert _table(ledger, "r") == _table(ledger, "i")
    assert mixed and refused  # grants over blocks in several states (several UPDATE groups), and refusals
    assert all(v == (0.0, 0.0) for v in (spent for spent, _, _ in _table(ledger, "other").values()))
    assert sum(ranged) >= 20  # the range path ran for most of stream r's grants
    assert sum(e[2] == "grant" for e in ledger.log_entries()) == 2 * (len(ranged) // 2 - refused) > 10
    report = ledger.audit()
    assert report.ok, report.problems
    ledger.close()


def test_set_spent_writes_exactly_the_named_blocks_by_runs(ledger_url):
    ledger = _ledger(ledger_url)
    rng = random.Random(11)
    for _ in range(30):
        ids = rng.sample(IDS, rng.randint(1, len(IDS)))
        with ledger.store.transaction() as tx:
            tx.range_reserved = False
            found, reservations = block_ranges.ranged_budgets(tx, "r", IDS)
            assert reservations == {} and set(found) == set(IDS)
            block_ranges.set_spent(tx, "r", ["[0.5, 0.0]", "active", None], ids, found)
            spent = dict(tx.all("SELECT id, spent FROM blocks WHERE stream = 'r'"))
            assert {b for b, v in spent.items() if v == "[0.5, 0.0]"} == set(ids)
            assert all(
                v == "[0.0, 0.0]" for v in dict(tx.all("SELECT id, spent FROM blocks WHERE stream = 'other'")).values()
            )
            tx.run("UPDATE blocks SET spent = '[0.0, 0.0]' WHERE stream = 'r'")
    ledger.close()


def test_runs_follow_the_stores_order_and_break_at_gaps():
    found = {b: ("active", "[0.0]", place) for place, b in enumerate(["a", "b", "c", "d", "e"])}
    assert block_ranges.runs(["e", "a", "b", "d"], found) == [["a", "b"], ["d", "e"]]
    unknown = {b: ("active", "[0.0]", None) for b in "abc"}
    assert block_ranges.runs(["c", "a"], unknown) == [["c"], ["a"]]  # places unknown: each alone, in given order


def test_a_range_past_its_row_limit_or_with_unknown_ids_falls_back(ledger_url):
    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("s", 1.0, 1e-5, min_epsilon=0.25)
    ledger.add_blocks("s", [{"id": f"b{i:03d}"} for i in range(block_ranges.RANGE_SLACK + 10)])
    with ledger.store.transaction() as tx:
        tx.range_reserved = False
        far_apart = ["b000", f"b{block_ranges.RANGE_SLACK + 9:03d}"]  # 40 rows between them, 2 asked
        assert block_ranges.ranged_budgets(tx, "s", far_apart) is None
        assert block_ranges.ranged_budgets(tx, "s", ["b000", "b001", "nope"]) is None
        tx.range_reserved = True  # a reservation in the range: the IN lists read blocks with reservations
        assert block_ranges.ranged_budgets(tx, "s", ["b000", "b001"]) is None
    ledger.request("p", "s", blocks=far_apart, epsilon=0.25)  # charged through the IN lists
    assert {b.id: b.spent for b in ledger.blocks("s")}["b000"] == (0.25, 0.0)
    with pytest.raises(UnknownBlock, match="nope"):
        ledger.request("p", "s", blocks=["b000", "b001", "nope"], epsilon=0.25)
    ledger.request("p", "s", blocks=["b002", "b003"], epsilon=1.0)  # both retire
    with pytest.raises(BlockRetired, match="b002"):
        ledger.request("p", "s", blocks=["b001", "b002"], epsilon=0.25)
    assert ledger.audit().ok
    ledger.close()
