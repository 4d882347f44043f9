"""``Ledger.request`` reads the stream row, the pipeline's state and the log's last entry in ONE statement of its
write transaction, and evaluates each distinct block state once: two ledgers (two connections, as two processes
have) interleaving writes on the same ledger keep one unbroken log chain that the audit verifies, each sees the
other's charges, a pipeline finished through the other ledger is refused, and refusals name every failing block
in the grant's order. Budgets are binary-exact (0.25, 0.5, ...) so equality is the right check.
"""

import json

import pytest

from sage_tfx.privacy import BudgetRefused, Ledger, LedgerError, UnknownStream


def _chain_is_unbroken(ledger):
    entries = ledger.log_entries()
    assert [e[0] for e in entries] == list(range(1, len(entries) + 1))
    assert all(e[4] == p[5] for p, e in zip(entries, entries[1:]))  # each entry's prev is the previous hash
    return entries


def test_two_ledgers_interleaving_writes_keep_one_chain(ledger_url):
    a = Ledger.open(ledger_url, create=True)
    a.create_stream("s", 4.0, 1e-5, min_epsilon=0.25)
    a.add_blocks("s", [{"id": f"b{i}"} for i in range(8)])
    b = Ledger.open(ledger_url)
    blocks = [f"b{i}" for i in range(8)]
    a.request("p", "s", blocks=blocks, epsilon=0.5)  # a's connection wrote the log's last entry
    b.request("q", "s", blocks=blocks[:4], epsilon=0.5)  # b chains to a's entry, not to its own last view
    a.request("p", "s", blocks=blocks, epsilon=0.5)  # and a to b's
    b.register("s", "w")
    b.add_blocks("s", [{"id": "b8"}])  # reserved for w
    a.request("w", "s", blocks=["b8", "b0"], epsilon=0.5)  # a sees b's reservation: b8 from w's own
    b.finish("s", "w", "ACCEPT")
    with pytest.raises(LedgerError, match="already finished"):  # a sees the pipeline b finished
        a.request("w", "s", blocks=["b1"], epsilon=0.25)
    spent = {blk.id: blk.spent[0] for blk in b.blocks("s")}
    assert spent == {"b0": 2.0, "b1": 1.5, "b2": 1.5, "b3": 1.5, "b4": 1.0, "b5": 1.0, "b6": 1.0, "b7": 1.0, "b8": 0.5}
    entries = _chain_is_unbroken(a)
    grant = [e for e in entries if e[2] == "grant"][-1]
    assert '"sources":["own","pool"]' in grant[3]
    for ledger in (a, b):
        report = ledger.audit()
        assert report.ok, report.problems
    # each ledger's head file holds the last entry; the writes through a after b's are what it recorded last
    a.request("p", "s", blocks=["b7"], epsilon=0.25)
    assert a.head_file.read()[a.ledger_id]["seq"] == a.log_entries()[-1][0]
    a.close()
    b.close()


def test_refusal_names_every_failing_block_in_grant_order(ledger_url):
    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("s", 1.0, 1e-5, min_epsilon=0.25)
    ledger.add_blocks("s", [{"id": f"b{i}"} for i in range(5)])
    ledger.request("p", "s", blocks=["b3", "b1"], epsilon=0.5)
    before = [e[0] for e in ledger.log_entries()]
    with pytest.raises(BudgetRefused) as info:
        ledger.request("p", "s", blocks=["b4", "b3", "b0", "b1"], epsilon=0.75)
    assert list(info.value.shortfalls) == ["b3", "b1"]  # the half-spent blocks, in the order asked
    assert [e[0] for e in ledger.log_entries()] == before  # nothing charged or logged
    assert {b.id: b.spent[0] for b in ledger.blocks("s")} == {"b0": 0.0, "b1": 0.5, "b2": 0.0, "b3": 0.5, "b4": 0.0}
    with pytest.raises(UnknownStream, match="streams: s"):  # the one read finds no stream row: named as before
        ledger.request("p", "nope", blocks=["b0"], epsilon=0.5)
    ledger.close()


def test_a_stream_recreated_with_other_parameters_uses_its_new_floor(ledger_url):
    """The grant floor and retirement cost are cached per parsed stream ROW: a changed row is a new parse."""
    ledger = Ledger.open(ledger_url, create=True)
    ledger.create_stream("s", 1.0, 1e-5, min_epsilon=0.25)
    ledger.add_blocks("s", [{"id": "b0"}, {"id": "b1"}])
    ledger.request("p", "s", blocks=["b0"], epsilon=0.25)  # floor min(0.001, 0.25) = 0.001
    ledger.request("p", "s", blocks=["b0"], epsilon=0.01)
    with ledger.store.transaction() as tx:
        tx.run("UPDATE streams SET min_grant_epsilon = 0.1 WHERE name = 's'")
    with pytest.raises(LedgerError, match="minimum grant epsilon 0.1"):
        ledger.request("p", "s", blocks=["b0"], epsilon=0.01)
    ledger.request("p", "s", blocks=["b1"], epsilon=0.1)
    ledger.close()


@pytest.mark.parametrize(
    "stream, meta",
    [
        ("s", {}),
        ("stream-é", {"note": 'ends like a body: ,"stream":"s"}', "stream": "nested", "zz": [1, 2]}),
        ("a.b_c", {"split": {"rule": "single"}, "ü": "\u2603"}),
    ],
)
def test_grant_log_text_is_the_canonical_text_of_the_log_body(stream, meta):
    """The grant's log entry text is spliced from its signed body text: byte for byte what encoding the whole
    log body gives (what the ledger stored before, and what the audit replays)."""
    from sage_tfx.privacy.chain import canonical
    from sage_tfx.privacy.grants import SPLICE_GRANT_LOG, Grant, grant_log_text

    assert SPLICE_GRANT_LOG  # Grant.body's keys still allow the splice: the fast path is the one tested here
    grant = Grant(
        id="g-1",
        stream=stream,
        pipeline="p",
        blocks=("b1", "b0"),
        epsilon=0.5,
        delta=1e-7,
        accounting="basic",
        cost=(0.5, 1e-7),
        rule="single",
        created=1234.5,
        meta=meta,
        signature="ab" * 32,
    )
    sources = ["own", "pool"]
    expected = canonical(dict(grant.body(), signature=grant.signature, sources=sources))
    assert grant_log_text(grant, canonical(grant.body()), sources) == expected


@pytest.mark.parametrize(
    "obj",
    [
        {"b": 1, "a": [1.5, "x\u00e9\n\u2603", None, True, -0.0, 1e300]},
        "stream-é",
        7,
        [],
        {},
        {"k": {"z": 1, "y": [{}, []]}, "1": "one", "10": 2.5},
        {3: "an int key", 1: 2},
        {"nan": float("nan"), "inf": [float("inf"), -float("inf")], "t": (1, 2.0)},
        [{"blocks": [f"b{i:03d}" for i in range(32)], "cost": (1.0, 0.0)}, 1e-320, 12345678901234567890],
    ],
)
def test_canonical_is_the_json_text_every_stored_ledger_holds(obj):
    """``chain.canonical`` (one encoder built once) gives json.dumps(sort_keys, compact separators) character for
    character: the text signed, chained and stored by every earlier version."""

    from sage_tfx.privacy.chain import canonical

    assert canonical(obj) == json.dumps(obj, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize("vector", [(0.0, 0.0), [1.5, 1e-7], (3, 2.5e300, -0.0), (float("inf"),), (), [0.1 + 0.2]])
def test_vector_text_is_the_stored_spent_text(vector):
    """``blocks.vector_text`` (the C encoder built once) gives json.dumps(vector): the spent and used texts every
    earlier version stored, which a grant groups blocks by."""

    from sage_tfx.privacy.blocks import vector_text

    assert vector_text(vector) == json.dumps(vector)
