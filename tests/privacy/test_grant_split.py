"""What each stage may spend under a grant, enforced where the ledger signs and where it releases.

Findings of the review this answers (each test below failed on the code before it):
1. a grant without a split let three stages each spend the whole grant;
2. a split composing to more than the charge was signed and honoured;
3. a second computation under the same grant and stage drew the same noise (an exact leak).
The same tests run on SQLite and PostgreSQL (``ledger_url``).
"""

import json

import pytest

from sage_tfx.privacy import BudgetSplit, ChargeRule, GrantError, Ledger, LedgerError, stage_budget
from sage_tfx.privacy.grants import sign
from sage_tfx.privacy.store import SCHEMA_VERSION

DAY = 86400.0


def make_ledger(location, blocks=3):
    ledger = Ledger.open(location, create=True)
    ledger.create_stream("s", 1.0, 1e-5)
    for i in range(blocks):
        ledger.add_block("s", f"b{i}", start=i * DAY, end=(i + 1) * DAY, rows=100)
    return ledger


def spent(ledger):
    return {b.id: b.spent for b in ledger.blocks("s")}


# ------------------------------------------------------------------ the rule, in one home
def test_rules_compose_stages():
    par = BudgetSplit(0.1, 0.05, 0.3, 0.35, 1e-6, ChargeRule.PARALLEL.value, rejection=0.1)
    assert par.charged_epsilon == pytest.approx(0.1 + 0.05 + max(0.3 + 0.1, 0.35))
    total = BudgetSplit(0.1, 0.05, 0.3, 0.35, 1e-6, ChargeRule.SUM.value, rejection=0.1)
    assert total.charged_epsilon == pytest.approx(0.9)
    assert par.stage_budget("training") == (0.3, 1e-6) and par.stage_budget("validation") == (0.35, 0.0)
    assert par.composed({"training": 0.3}) == pytest.approx(0.3)
    with pytest.raises(LedgerError, match="'nope'"):
        BudgetSplit(0.1, 0, 0.1, 0.1, 0, "nope")
    with pytest.raises(LedgerError, match="-0.1"):
        BudgetSplit(-0.1, 0, 0.1, 0.1, 0, ChargeRule.SUM.value)
    with pytest.raises(LedgerError, match="nan"):
        BudgetSplit(0.1, 0, float("nan"), 0.1, 0, ChargeRule.SUM.value)


def test_split_from_the_command_line():
    split = BudgetSplit.parse("preprocessing=0.1, training=0.3,validation=0.1", delta=1e-8)
    assert (split.preprocessing, split.training, split.validation, split.count) == (0.1, 0.3, 0.1, 0.0)
    assert split.rule == ChargeRule.SUM.value and split.delta == 1e-8
    assert BudgetSplit.parse("training=0.3,validation=0.3,rule=parallel").charged_epsilon == pytest.approx(0.3)
    for bad, named in [
        ("trainng=0.3", "'trainng'"),
        ("training", "'training'"),
        ("training=x", "'x'"),
        ("training=0.1,training=0.2", "twice"),
        ("rule=parallel", "names no stage"),
        ("training=0.1,rule=max", "'max'"),
    ]:
        with pytest.raises(LedgerError, match=named):
            BudgetSplit.parse(bad)


# ------------------------------------------------------------------ the split is checked where it is signed
def test_request_refuses_a_split_above_the_charge(ledger_url):
    ledger = make_ledger(ledger_url)
    before = spent(ledger)
    entries = len(ledger.log_entries())
    over = {"preprocessing": 5.0, "training": 5.0, "validation": 5.0, "delta": 1e-6, "rule": ChargeRule.SUM.value}
    with pytest.raises(LedgerError, match="composes to epsilon 15"):
        ledger.request("p", "s", blocks=["b0"], epsilon=0.1, delta=1e-6, meta={"split": over})
    with pytest.raises(LedgerError, match="split delta"):
        ledger.request(
            "p",
            "s",
            blocks=["b0"],
            epsilon=0.5,
            delta=1e-7,
            split=BudgetSplit(0.1, 0, 0.2, 0.2, 1e-6, ChargeRule.PARALLEL.value),
        )
    with pytest.raises(LedgerError, match="unknown field"):
        ledger.request("p", "s", blocks=["b0"], epsilon=0.5, meta={"split": {"train": 0.1, "rule": "x"}})
    with pytest.raises(LedgerError, match="a stage of the split"):
        ledger.request("p", "s", blocks=["b0"], epsilon=0.5, meta={"count_epsilon": 0.1})
    with pytest.raises(LedgerError, match="does not match"):
        ledger.request("p", "s", blocks=["b0"], epsilon=0.5, rule="pre+max(train,val)")
    assert spent(ledger) == before and len(ledger.log_entries()) == entries  # nothing changed


def test_components_recheck_a_split_the_ledger_would_not_sign(ledger_url):
    """A grant signed with an over-charged split (as a ledger holding the key could) is refused at every stage."""
    ledger = make_ledger(ledger_url)
    grant = ledger.request(
        "p", "s", blocks=["b0"], epsilon=0.5, split=BudgetSplit(0.1, 0.0, 0.4, 0.4, 0.0, ChargeRule.PARALLEL.value)
    )
    assert stage_budget(grant, "training") == (0.4, 0.0)
    body = grant.body()
    body["meta"]["split"]["training"] = 5.0
    forged = type(grant)(**{**grant.__dict__, "meta": body["meta"]})
    with pytest.raises(GrantError, match="composes to epsilon 5.1"):
        stage_budget(forged, "training")


# ------------------------------------------------------------------ a split-less grant is single-stage
def test_a_grant_without_split_pays_for_one_stage(ledger_url):
    ledger = make_ledger(ledger_url)
    grant = ledger.request("p", "s", blocks=["b0", "b1"], epsilon=0.5, delta=1e-6)
    assert grant.rule == "single"
    first = ledger.release(grant, "preprocessing", "graph-1", 0.5)
    assert not first.reopened
    for stage in ("training", "validation", "count"):
        with pytest.raises(GrantError, match="single-stage"):
            ledger.release(grant, stage, "model-1", 0.5)
    assert ledger.release(grant, "preprocessing", "graph-1", 0.5).reopened  # the same release, again
    assert [(r.stage, r.epsilon) for r in ledger.releases(grant.id)] == [("preprocessing", 0.5)]
    assert ledger.audit().ok


def test_each_stage_within_its_share(ledger_url):
    ledger = make_ledger(ledger_url)
    split = BudgetSplit.for_epsilon(1.0, 1e-6, preprocessing_share=0.25, count_share=0.0, rejection_share=0.5)
    grant = ledger.request("p", "s", blocks=["b0"], epsilon=1.0, delta=1e-6, split=split)
    with pytest.raises(GrantError, match="covers only"):
        ledger.release(grant, "preprocessing", "graph", 0.5)
    with pytest.raises(GrantError, match="covers only"):
        ledger.release(grant, "validation", "model", 0.01, delta=1e-9)  # delta is training's alone
    ledger.release(grant, "preprocessing", "graph", 0.25)
    ledger.release(grant, "training", "module", 0.375, delta=1e-6)
    ledger.release(grant, "rejection", "model", 0.375)
    ledger.release(grant, "validation", "model", 0.75)
    report = ledger.audit()
    assert report.ok, report.problems


def test_preprocessing_delta_is_its_own_share_and_adds_to_training_delta(ledger_url):
    """DP vocabularies need a delta at preprocessing: the split carries it beside training's, the grant's delta
    must cover their sum (basic composition), each stage is held to its own, and the audit recomputes both."""
    split = BudgetSplit.for_epsilon(1.0, 1e-6, preprocessing_share=0.25, count_share=0.0, preprocessing_delta=1e-7)
    assert split.total_delta == pytest.approx(1.1e-6)
    assert split.stage_budget("preprocessing") == (0.25, 1e-7) and split.stage_budget("training")[1] == 1e-6
    assert BudgetSplit.from_meta({"split": split.to_dict()}) == split
    # a split without one is stored as before the field existed (old grants and fingerprints unchanged)
    assert "preprocessing_delta" not in BudgetSplit.for_epsilon(1.0, 1e-6).to_dict()
    # on the command line the grant's delta is given: preprocessing_delta is taken out of it
    parsed = BudgetSplit.parse("preprocessing=0.1,training=0.3,preprocessing_delta=1e-8", delta=1e-7)
    assert parsed.stage_budget("preprocessing") == (0.1, 1e-8) and parsed.total_delta == pytest.approx(1e-7)
    assert parsed.stage_budget("training")[1] == pytest.approx(9e-8)
    for bad, named in [
        ("preprocessing_delta=1.5", "preprocessing_delta 1.5 is more"),
        ("preprocessing_delta=-1e-9", "-1e-9"),
        ("preprocessing_delta=x", "'x'"),
        ("preprocessing_delta=1e-3", "more than the grant's delta 0.0001"),
    ]:
        with pytest.raises(LedgerError, match=named):
            BudgetSplit.parse("training=0.1," + bad, delta=1e-4)

    ledger = make_ledger(ledger_url)
    before = spent(ledger)
    with pytest.raises(LedgerError, match=r"split delta training's 1e-06 \+ preprocessing's 1e-07 is more than"):
        ledger.request("p", "s", blocks=["b0"], epsilon=1.0, delta=1e-6, split=split)  # delta covers training's only
    assert spent(ledger) == before
    grant = ledger.request("p", "s", blocks=["b0"], epsilon=1.0, delta=split.total_delta, split=split)
    with pytest.raises(GrantError, match=r"covers only \(epsilon=0.25, delta=1e-07\) for preprocessing"):
        ledger.release(grant, "preprocessing", "graph", 0.25, delta=2e-7)
    ledger.release(grant, "preprocessing", "graph", 0.25, delta=1e-7)
    ledger.release(grant, "training", "module", 0.75, delta=1e-6)
    report = ledger.audit()
    assert report.ok, report.problems


# --------------------------------------------------------------- one release per grant, stage, computation
def test_a_second_computation_is_refused_before_anything_is_drawn(ledger_url):
    ledger = make_ledger(ledger_url)
    grant = ledger.request(
        "p", "s", blocks=["b0"], epsilon=1.0, split=BudgetSplit(0.5, 0.0, 0.5, 0.5, 0.0, ChargeRule.PARALLEL.value)
    )
    ledger.release(grant, "validation", "model-a", 0.5)
    with pytest.raises(GrantError, match="different release"):
        ledger.release(grant, "validation", "model-b", 0.5)
    with pytest.raises(GrantError, match="different release"):
        ledger.release(grant, "validation", "model-a", 0.25)  # another epsilon is another mechanism
    assert ledger.release(grant, "validation", "model-a", 0.5).reopened
    assert [r.computation for r in ledger.releases(grant.id)] == ["model-a"]
    with pytest.raises(LedgerError, match="stage 'training_'"):
        ledger.release(grant, "training_", "x", 0.1)
    with pytest.raises(GrantError, match="forged"):
        ledger.release(json.dumps(dict(json.loads(grant.to_json()), epsilon=9.0)), "training", "x", 0.1)


# ------------------------------------------------------------------ the audit recomputes what the stages spent
def _append_release(ledger, grant, stage, epsilon):
    """Write a release behind the ledger's checks, as a buggy or older writer could: table and chained log."""
    body = {
        "grant": grant.id,
        "stream": grant.stream,
        "pipeline": grant.pipeline,
        "stage": stage,
        "computation": f"forged-{stage}",
        "epsilon": epsilon,
        "delta": 0.0,
    }
    with ledger._store.transaction() as tx:
        tx.run(
            "INSERT INTO releases (grant_id, stage, stream, pipeline, computation, epsilon, delta, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (grant.id, stage, grant.stream, grant.pipeline, body["computation"], epsilon, 0.0, 0.0),
        )
        ledger._log(tx, "release", body, at=0.0)  # the row's time: only the budget is wrong


def test_audit_fails_when_the_stages_spent_more_than_the_charge(ledger_url):
    ledger = make_ledger(ledger_url)
    single = ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
    for stage in ("preprocessing", "training", "validation"):  # the review's case: 3 x 0.5 under a 0.5 grant
        _append_release(ledger, single, stage, 0.5)
    problems = ledger.audit().problems
    assert any("single-stage" in p and single.id in p for p in problems), problems

    grant = ledger.request(
        "q", "s", blocks=["b1"], epsilon=0.5, split=BudgetSplit(0.1, 0.0, 0.2, 0.2, 0.0, ChargeRule.SUM.value)
    )
    _append_release(ledger, grant, "training", 0.3)
    problems = ledger.audit().problems
    assert any("more than its share" in p and grant.id in p for p in problems), problems
    assert not any("overspent" in p for p in problems)  # the blocks' filters alone do not see it


def test_audit_sees_a_release_missing_from_the_log(ledger_url):
    ledger = make_ledger(ledger_url)
    grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
    with ledger._store.transaction() as tx:
        tx.run(
            "INSERT INTO releases (grant_id, stage, stream, pipeline, computation, epsilon, delta, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (grant.id, "training", "s", "p", "c", 0.5, 0.0, 0.0),
        )
    assert any("in the table but not in the log" in p for p in ledger.audit().problems)


def test_a_version_1_ledger_is_migrated(tmp_path):
    path = str(tmp_path / "old.db")
    ledger = make_ledger(path)
    with ledger._store.transaction() as tx:
        tx.run("DROP TABLE releases")
        tx.run("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    ledger.close()
    Ledger.upgrade(path, progress=lambda line: None)
    ledger = Ledger.open(path)
    grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5)
    assert not ledger.release(grant, "training", "c", 0.5).reopened
    with ledger._store.transaction(write=False) as tx:
        assert tx.one("SELECT value FROM meta WHERE key = 'schema_version'")[0] == str(SCHEMA_VERSION)
    assert ledger.audit().ok


def test_every_component_door_rechecks_the_split(ledger_url):
    """A grant re-signed with an over-charged split (as a holder of the ledger's key could write it) passes
    the signature check but is refused at check_grant, the door of every data-reading component."""
    from sage_tfx.components._grant import check_grant
    from sage_tfx.privacy import Grant
    from sage_tfx.privacy.chain import canonical

    ledger = make_ledger(ledger_url)
    grant = ledger.request(
        "p", "s", blocks=["b0"], epsilon=0.5, split=BudgetSplit(0.1, 0.0, 0.4, 0.4, 0.0, ChargeRule.PARALLEL.value)
    )
    assert check_grant(ledger_url, grant.to_json()).id == grant.id
    body = grant.body()
    body["meta"]["split"]["training"] = 5.0
    forged = Grant.from_json(body)
    forged = Grant(**{**forged.__dict__, "signature": sign(ledger.keyring, forged.body())})
    with ledger._store.transaction() as tx:
        tx.run(
            "UPDATE grants SET body = ?, signature = ? WHERE id = ?",
            (canonical(forged.body()), forged.signature, grant.id),
        )
    with pytest.raises(GrantError, match="composes to epsilon 5.1"):
        check_grant(ledger_url, forged.to_json())
    assert any("differs from the log" in p or "differ" in p for p in ledger.audit().problems)


def test_the_door_the_release_and_the_audit_share_one_stage_budget_comparison(ledger_url):
    """``split.over_budget`` is the one comparison: at a stage's share plus half the float slack the component
    door, ``Ledger.release`` and the audit all pass it; at twice the slack all three refuse it."""
    from sage_tfx.privacy import require_budget
    from sage_tfx.privacy.split import SLACK, over_budget

    ledger = make_ledger(ledger_url)
    split = BudgetSplit(0.1, 0.0, 0.2, 0.2, 0.0, ChargeRule.SUM.value)
    inside, outside = 0.2 * (1 + SLACK / 2), 0.2 * (1 + 2 * SLACK)
    assert not over_budget(inside, 0.0, (0.2, 0.0)) and over_budget(outside, 0.0, (0.2, 0.0))
    assert over_budget(0.2, 1e-305, (0.2, 0.0))  # any delta over a pure share, however small
    grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5, split=split)
    require_budget(grant, "training", inside)
    ledger.release(grant, "training", "model", inside)
    with pytest.raises(GrantError, match="covers only"):
        require_budget(grant, "rejection", outside)
    with pytest.raises(GrantError, match="covers only"):
        ledger.release(grant, "rejection", "model", outside)
    assert ledger.audit().ok
    _append_release(ledger, grant, "rejection", outside)
    assert any("more than its share" in p and "'rejection'" in p for p in ledger.audit().problems)


def test_a_grant_naming_an_unregistered_block_is_refused_by_the_one_check(ledger_url, tmp_path):
    """``grants.require_registered``: every door (components, the key door, the grant server) asks it."""
    from sage_tfx.ingest.access import grant_block_keys
    from sage_tfx.privacy.grants import registered_blocks, require_registered

    ledger = make_ledger(ledger_url)
    grant = ledger.request("p", "s", blocks=["b0", "b2"], epsilon=0.5)
    require_registered(ledger, grant)
    assert registered_blocks(ledger, grant) == ["b0", "b2"]
    other = make_ledger(str(tmp_path / "other.db"), blocks=2)  # the same stream, without block b2
    assert registered_blocks(other, grant) == ["b0"]
    with pytest.raises(GrantError, match=r"names block\(s\) not registered in stream 's': b2: no keys given"):
        require_registered(other, grant, ": no keys given")
    assert grant_block_keys(ledger, grant)[1].keys() == {"b0", "b2"}
