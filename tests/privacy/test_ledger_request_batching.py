"""``Ledger.request`` writes a grant's blocks in grouped statements (one UPDATE per distinct new value) and parses a
stream row once per distinct row: the same charges, states, reservations and log as block by block, on both
backends, and a stream row changed behind the ledger's back is never served from the parse cache.

Budgets are binary-exact (0.25, 0.5, ...) so equality is the right check.
"""

import pytest

from sage_tfx.privacy import BudgetRefused, Ledger


def _ledger(location):
    ledger = Ledger.open(location, create=True)
    ledger.create_stream("s", 1.0, 1e-5, min_epsilon=0.25)
    for i in range(6):
        ledger.add_block("s", f"b{i}")
    return ledger


def test_mixed_block_states_get_their_own_values_in_few_statements(ledger_url):
    ledger = _ledger(ledger_url)
    ledger.request("q", "s", blocks=["b0", "b1"], epsilon=0.5)  # b0, b1 half spent, from the pool
    ledger.register("s", "p")
    ledger.add_blocks("s", [{"id": "b6"}, {"id": "b7"}])  # p waits: b6, b7 are reserved for it
    order = ["b7", "b2", "b0", "b6", "b5", "b1", "b3", "b4"]  # not in key order: the grant keeps its order
    before = ledger.store.statements
    grant = ledger.request("p", "s", blocks=order, epsilon=0.5)
    statements = ledger.store.statements - before
    assert list(grant.blocks) == order
    blocks = {b.id: b for b in ledger.blocks("s")}
    assert {b: blocks[b].spent for b in blocks} == {
        "b0": (1.0, 0.0),
        "b1": (1.0, 0.0),
        "b2": (0.5, 0.0),
        "b3": (0.5, 0.0),
        "b4": (0.5, 0.0),
        "b5": (0.5, 0.0),
        "b6": (0.5, 0.0),
        "b7": (0.5, 0.0),
    }
    # b0, b1 cannot admit min_epsilon 0.25 more: retired, with the grant's time; the rest stay active
    assert {b for b in blocks if blocks[b].state == "retired"} == {"b0", "b1"}
    assert all(blocks[b].retired == grant.created for b in ("b0", "b1"))
    assert all(blocks[b].retired is None for b in blocks if b not in ("b0", "b1"))
    with ledger.store.transaction(write=False) as tx:
        used = dict(tx.all("SELECT block, used FROM reservations WHERE stream = 's' AND pipeline = 'p'"))
    assert {b: tuple(float(x) for x in v.strip("[]").split(",")) for b, v in used.items()} == {
        "b6": (0.5, 0.0),
        "b7": (0.5, 0.0),
    }  # drawn from p's own reservation; the others from the pool
    entries = [e for e in ledger.log_entries() if e[2] in ("grant", "retire")]
    assert [e[2] for e in entries[-2:]] == ["grant", "retire"] and '"blocks":["b0","b1"]' in entries[-1][3]
    assert '"sources":["own","pool","pool","own","pool","pool","pool","pool"]' in entries[-2][3]
    # stream with the pipeline's state and the log head (one read), blocks with their reservations (one read),
    # 1 reservation UPDATE, 2 block UPDATEs (retired, active), grant, 2 log entries: not one statement per block
    assert statements <= 8, statements
    report = ledger.audit()
    assert report.ok, report.problems
    ledger.close()


def test_statements_per_grant_do_not_grow_with_its_blocks(ledger_url):
    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("s", 1.0, 1e-5)
    ledger.add_blocks("s", [{"id": f"b{i:03d}"} for i in range(64)])
    counts = {}
    for n in (64, 2):  # every block of each grant in one state: one block UPDATE
        before = ledger.store.statements
        ledger.request("p", "s", blocks=[f"b{i:03d}" for i in range(n)], epsilon=0.25)
        counts[n] = ledger.store.statements - before
    # stream with the pipeline's state and the log head (one read), blocks with their reservations (one read),
    # 1 block UPDATE, grant, log entry
    assert counts[64] == counts[2] <= 5, counts
    assert ledger.audit().ok
    ledger.close()


def test_a_stream_row_changed_behind_the_ledgers_back_is_read_afresh(ledger_url):
    ledger = _ledger(ledger_url)
    ledger.request("p", "s", blocks=["b0"], epsilon=0.5)  # the row (epsilon 1.0) is parsed and cached
    with ledger.store.transaction() as tx:
        tx.run("UPDATE streams SET epsilon = 0.5 WHERE name = 's'")
    assert ledger.stream("s").epsilon == 0.5
    with pytest.raises(BudgetRefused):  # under the row as it is now: b1 has 0.5, the request asks 0.75
        ledger.request("p", "s", blocks=["b1"], epsilon=0.75)
    assert {b.id: b.spent for b in ledger.blocks("s")}["b1"] == (0.0, 0.0)
    ledger.close()
