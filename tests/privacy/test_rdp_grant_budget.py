"""On an ``rdp`` stream a grant's stages spend what was asked, never the charge converted at the stream's delta.

The filter charges an (epsilon, delta) request the pure-DP curve of epsilon and the delta asked; converted back at the
stream's delta that curve reads as a larger epsilon (0.1875 for 0.05 at delta 1e-6). Grants used to record that
converted figure as their epsilon, and a single-stage grant or a split could then spend it: 17 grants of 0.05 on one
block, each opening a release at 0.1875, composed to epsilon ~3.2 against a global 1.0 while the filter, and the audit,
saw 17 x 0.05. Now:

* the grant records the (epsilon, delta) asked for its stages and the converted figure apart, for information;
* ``Ledger.release`` (and so every component's ``open_release``), ``stage_budget`` and the split check use what was
  asked: the 17 releases at 0.1875 are refused, at 0.05 they open;
* the audit recomputes the stages' budget from each grant's cost and flags a release above it;
* an ``rdp`` grant made before (no ``converted_epsilon``, its epsilon the conversion) still verifies, but its stages
  may spend only what its charge pays for: a single stage that much, a split scaled down to it; the audit replays the
  same cap and lists a release above it, made when the older rule allowed it, as a problem.
"""

import re

import pytest

from sage_tfx.privacy import (
    BudgetRefused,
    BudgetSplit,
    ChargeRule,
    GrantError,
    Ledger,
    LedgerError,
    curves,
    grants,
    stage_budget,
)

EPS_G, DELTA_G, ASKED, GRANTS = 1.0, 1e-6, 0.05, 17


def _rdp_ledger(location):
    ledger = Ledger.open(location, create=True)
    ledger.create_stream("r", EPS_G, DELTA_G, accounting="rdp")
    ledger.add_block("r", "b0", rows=100)
    return ledger


def test_seventeen_grants_of_005_cannot_each_release_the_converted_0_1875(ledger_url):
    from sage_tfx.components._grant import open_release

    ledger = _rdp_ledger(ledger_url)
    issued = []
    with pytest.raises(BudgetRefused):  # as many grants of 0.05 as the block's filter admits
        for _ in range(GRANTS + 1):
            issued.append(ledger.request("p", "r", blocks=["b0"], epsilon=ASKED))
    assert len(issued) >= GRANTS - 1  # 17 before the conversion delta was split over the orders, 16 since
    converted = issued[0].converted_epsilon
    assert converted == pytest.approx(0.1875, abs=1e-3)
    assert len(issued) * converted > 2.5 * EPS_G  # what the stages could release before, composed as pure DP
    for i, grant in enumerate(issued):
        assert (grant.epsilon, grant.delta) == (pytest.approx(ASKED, rel=1e-12), 0.0)
        assert stage_budget(grant, "training") == (grant.epsilon, 0.0)
        with pytest.raises(GrantError, match=r"asks for \(epsilon=0.18\d+.* covers only \(epsilon=0.05"):
            ledger.release(grant, "training", f"model-{i}", converted)
        with pytest.raises(GrantError, match=r"covers only \(epsilon=0.05"):  # a component's door: the same rule
            open_release(ledger, grant, "training", f"model-{i}", converted)
        assert not ledger.release(grant, "training", f"model-{i}", ASKED).reopened
    assert sum(r.epsilon for r in ledger.releases()) == pytest.approx(len(issued) * ASKED)
    assert ledger.audit().ok


def test_a_split_is_checked_against_what_was_asked(ledger_url):
    ledger = _rdp_ledger(ledger_url)
    with pytest.raises(LedgerError, match=r"composes to epsilon 0.15 .* more than the grant charges \(0.05\)"):
        ledger.request(
            "p",
            "r",
            blocks=["b0"],
            epsilon=ASKED,
            split=BudgetSplit(0.0, 0.0, 0.15, 0.15, 0.0, ChargeRule.PARALLEL.value),
        )
    assert ledger.blocks("r")[0].spent == ledger.stream("r").filter().zero()  # nothing charged
    grant = ledger.request(
        "p",
        "r",
        blocks=["b0"],
        epsilon=ASKED,
        delta=1e-8,
        split=BudgetSplit(0.01, 0.0, 0.04, 0.04, 1e-8, ChargeRule.PARALLEL.value),
    )
    assert stage_budget(grant, "training") == (0.04, 1e-8)


def test_a_curve_grant_may_spend_the_largest_pure_epsilon_its_curve_covers(ledger_url):
    ledger = _rdp_ledger(ledger_url)
    orders = ledger.stream("r").orders
    curve = [a / (2 * 20.0**2) for a in orders]  # a Gaussian mechanism's curve, noise multiplier 20
    grant = ledger.request("p", "r", blocks=["b0"], curve=curve)
    assert grant.epsilon < grant.converted_epsilon
    assert all(p <= c * (1 + 1e-12) for p, c in zip(curves.pure_dp_curve(grant.epsilon, orders), curve))
    # no larger epsilon is covered: its pure-DP curve exceeds the charge at some order
    assert any(p > c for p, c in zip(curves.pure_dp_curve(grant.epsilon * 1.001, orders), curve))
    with pytest.raises(GrantError, match="covers only"):
        ledger.release(grant, "training", "gauss", grant.converted_epsilon)


def _append_release(ledger, grant, stage, epsilon):
    """A release written behind the ledger's checks (table and chained log), as a buggy writer could."""
    body = {
        "grant": grant.id,
        "stream": grant.stream,
        "pipeline": grant.pipeline,
        "stage": stage,
        "computation": "forged",
        "epsilon": epsilon,
        "delta": 0.0,
    }
    with ledger._store.transaction() as tx:
        tx.run(
            "INSERT INTO releases (grant_id, stage, stream, pipeline, computation, epsilon, delta, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (grant.id, stage, grant.stream, grant.pipeline, "forged", epsilon, 0.0, 0.0),
        )
        ledger._log(tx, "release", body, at=0.0)  # the row's time: only the budget is wrong


def test_the_audit_flags_a_release_above_what_was_asked(ledger_url):
    ledger = _rdp_ledger(ledger_url)
    grant = ledger.request("p", "r", blocks=["b0"], epsilon=ASKED)
    _append_release(ledger, grant, "training", grant.converted_epsilon)
    problems = ledger.audit().problems
    assert any(grant.id in p and "stage 'training' released (epsilon=0.1875" in p for p in problems), problems


def test_the_audit_flags_a_grant_recording_the_conversion_for_its_stages(ledger_url, monkeypatch):
    """A writer holding the key that records the converted figure as the stages' epsilon (beside it) is caught."""
    ledger = _rdp_ledger(ledger_url)
    with monkeypatch.context() as m:
        m.setattr(
            grants, "grant_budget", lambda filt, cost: (filt.query_epsilon(cost), cost[0], filt.query_epsilon(cost))
        )
        bad = ledger.request("p", "r", blocks=["b0"], epsilon=ASKED)
    problems = ledger.audit().problems
    assert any(bad.id in p and "but its charge pays for (0.05" in p for p in problems), problems


def test_rdp_grants_made_before_cannot_each_release_the_converted_0_1875(ledger_url, monkeypatch):
    """The exploit with grants an older sage made (their epsilon the conversion, no converted_epsilon): each of the
    grants of 0.05 on one block verifies, but a release at its recorded 0.1875 is refused, naming the grant, the
    recorded and the capped epsilon and the fix; a release at what the charge pays for opens, and the audit is OK."""
    from sage_tfx.components._grant import open_release
    from tests.helpers.old_streams import rdp_grant_made_before

    ledger = _rdp_ledger(ledger_url)
    issued = []
    with pytest.raises(BudgetRefused):
        for _ in range(GRANTS + 1):
            issued.append(rdp_grant_made_before(ledger, monkeypatch, "p", "r", blocks=["b0"], epsilon=ASKED))
    assert len(issued) >= GRANTS - 1
    for i, old in enumerate(issued):
        assert old.converted_epsilon is None and "converted_epsilon" not in old.to_json()
        assert old.epsilon == pytest.approx(0.1875, abs=1e-3)
        assert ledger.verify(old.to_json()).epsilon == old.epsilon
        refused = (
            rf"asks for \(epsilon=0.18\d+.* covers only \(epsilon=0.05\b.*grant '{old.id}' is an rdp grant "
            r"made before .* recorded epsilon 0.18\d+ .* pays for epsilon 0.05\b.*request a new grant"
        )
        with pytest.raises(GrantError, match=refused):
            ledger.release(old, "training", f"model-{i}", old.epsilon)
        with pytest.raises(GrantError, match=refused):  # a component's door: the same rule
            open_release(ledger, old, "training", f"model-{i}", old.epsilon)
        assert not ledger.release(old, "training", f"model-{i}", ASKED).reopened
    assert ledger.releases() and sum(r.epsilon for r in ledger.releases()) == pytest.approx(len(issued) * ASKED)
    report = ledger.audit()
    assert report.ok, report.problems
    assert any(
        f"{len(issued)} rdp grant(s) were made before grants recorded what was asked" in n
        and "only what the charge pays for" in n
        for n in report.notes
    ), report.notes


def test_an_older_rdp_split_is_scaled_down_to_what_its_charge_pays_for(ledger_url, monkeypatch):
    """An older rdp grant's split (composing to its recorded 0.1875) keeps its proportions, scaled by 0.05 / 0.1875:
    a stage asking its recorded share is refused, its scaled share opens, and the audit replays the scaled split."""
    from tests.helpers.old_streams import rdp_grant_made_before

    ledger = _rdp_ledger(ledger_url)
    split = BudgetSplit(0.0375, 0.0, 0.1, 0.15, 1e-8, ChargeRule.PARALLEL.value, rejection=0.05)
    old = rdp_grant_made_before(ledger, monkeypatch, "p", "r", blocks=["b0"], epsilon=ASKED, delta=1e-8, split=split)
    assert old.converted_epsilon is None and split.charged_epsilon <= old.epsilon
    factor = ASKED / old.epsilon
    assert stage_budget(old, "training") == (0.1, 1e-8)  # what the grant records: the components plan with it
    with pytest.raises(
        GrantError,
        match=rf"covers only \(epsilon={0.1 * factor:.6g}, delta=1e-08\) for training"
        r": .*its split scaled down to it; request a new grant",
    ):
        ledger.release(old, "training", "model", 0.1, 1e-8)
    for stage, share in (("preprocessing", 0.0375), ("training", 0.1), ("rejection", 0.05), ("validation", 0.15)):
        ledger.release(old, stage, stage, share * factor, 1e-8 if stage == "training" else 0.0)
    assert split.scaled(factor, 1.0).charged_epsilon <= ASKED * (1 + 1e-9)  # the stages compose within the charge
    report = ledger.audit()
    assert report.ok, report.problems


def test_the_audit_lists_a_release_an_older_rdp_grant_made_above_its_charge(ledger_url, monkeypatch):
    """A release at the converted 0.1875 under an older rdp grant, as the sage of that day allowed it: the ledger's
    state is unchanged by this version, but the audit now lists it as a problem (it spent more than the filter
    charged the block), naming the grant, the release and what the charge pays for."""
    from tests.helpers.old_streams import rdp_grant_made_before, release_as_before

    ledger = _rdp_ledger(ledger_url)
    old = rdp_grant_made_before(ledger, monkeypatch, "p", "r", blocks=["b0"], epsilon=ASKED)
    release_as_before(ledger, monkeypatch, old, "training", "old-model", old.epsilon)
    assert ledger.release(old, "training", "old-model", old.epsilon).reopened  # re-opened: nothing new released
    new = ledger.request("p", "r", blocks=["b0"], epsilon=ASKED)
    ledger.release(new, "training", "new-model", ASKED)
    problems = ledger.audit().problems
    assert len(problems) == 1, problems
    assert re.search(
        rf"grant '{old.id}': stage 'training' released \(epsilon=0.18\d+, delta=0\), more than the "
        rf"charge allows \(epsilon=0.05, delta=0\) \(grant '{old.id}' is an rdp grant made before .* recorded "
        r"epsilon 0.18\d+ .* pays for epsilon 0.05\b",
        problems[0],
    ), problems
