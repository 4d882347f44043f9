"""A stage calibrated to the privacy unit gets its whole share; every other stage stays at epsilon / K.

The exploit as the ledger allowed it before: nothing said which release was calibrated to the unit, so the only
safe budget on a unit stream was the per-row one. Now a release names the unit column it was calibrated to
(``Ledger.release(..., per_unit=C)``): the ledger lets it spend the stage's whole share only for the validator's
stages and the grant's own unit, refuses the rest before anything is recorded, and the audit replays the claim
from the signed log. No TensorFlow.
"""

import json
import sqlite3

import pytest

from sage_tfx.privacy import BudgetSplit, GrantError, Ledger, stage_budget
from sage_tfx.privacy.unit_share import PER_UNIT_KEY

UNIT, K = "company", 5


def _world(path, unit=UNIT):
    ledger = Ledger.open(path, create=True)
    if unit is None:
        ledger.create_stream("s", 1.0, 1e-6)
    else:
        ledger.create_stream("s", 1.0, 1e-6, privacy_unit=unit, max_rows_per_unit=K)
    ledger.add_block("s", "b0", start=0.0, end=86400.0, rows=100, digest="aa")
    split = BudgetSplit.for_epsilon(0.5, 1e-7, rejection_share=0.2)
    grant = ledger.request("p", "s", blocks=["b0"], epsilon=0.5, delta=1e-7, split=split)
    return ledger, grant, split


def _release_entries(path):
    with sqlite3.connect(path) as conn:
        return [json.loads(b) for (b,) in conn.execute("SELECT body FROM log WHERE kind = 'release' ORDER BY seq")]


def test_the_validators_stages_take_their_whole_share_per_unit_and_the_audit_replays_it(tmp_path):
    path = str(tmp_path / "l.db")
    ledger, grant, split = _world(path)
    with ledger:
        with pytest.raises(GrantError, match="covers only"):  # the whole share, per row: refused, nothing recorded
            ledger.release(grant, "validation", "c", split.validation)
        assert ledger.releases(grant.id) == []
        ledger.release(grant, "validation", "c", split.validation, per_unit=UNIT)
        ledger.release(grant, "rejection", "c", split.rejection, per_unit=UNIT)
        ledger.release(grant, "training", "t", *stage_budget(grant, "training"))  # per row: epsilon / K
        report = ledger.audit()
        assert report.ok, report.problems
    entries = _release_entries(path)
    assert [e.get(PER_UNIT_KEY) for e in entries] == [UNIT, UNIT, None]


@pytest.mark.parametrize(
    "unit, stage, per_unit, match",
    [
        (UNIT, "validation", "taxi_id", "is not the grant's privacy unit 'company'"),
        (UNIT, "preprocessing", UNIT, "stage 'preprocessing' has no mechanism calibrated to the unit"),
        (UNIT, "training", UNIT, "stage 'training' has no mechanism calibrated to the unit"),
        (None, "validation", UNIT, "its stream's unit is the row"),
    ],
)
def test_a_per_unit_claim_the_grant_does_not_support_is_refused_before_anything_is_recorded(
    tmp_path, unit, stage, per_unit, match
):
    path = str(tmp_path / "l.db")
    ledger, grant, split = _world(path, unit)
    with ledger:
        with pytest.raises(GrantError, match=match):
            ledger.release(grant, stage, "c", 0.001, per_unit=per_unit)
        assert ledger.releases(grant.id) == []
        assert ledger.audit().ok


def _forge_release(ledger, grant, stage, epsilon, per_unit):
    """What a sage that skipped the check (or a writer holding the key) records: the release row and its signed
    log entry, as ``releases.open_release`` writes them."""
    from sage_tfx.privacy.store import sql

    with ledger._store.transaction() as tx:
        tx.run(sql.RELEASE_INSERT, (grant.id, stage, grant.stream, grant.pipeline, "c", epsilon, 0.0, 1.0))
        body = {
            "grant": grant.id,
            "stream": grant.stream,
            "pipeline": grant.pipeline,
            "stage": stage,
            "computation": "c",
            "epsilon": epsilon,
            "delta": 0.0,
        }
        ledger._log(tx, "release", body if per_unit is None else {**body, PER_UNIT_KEY: per_unit}, at=1.0)


@pytest.mark.parametrize(
    "stage, per_unit, problem",
    [
        ("validation", None, "more than its share"),  # the whole share with no per-unit calibration
        ("validation", "taxi_id", "is not the grant's privacy unit 'company'"),
        ("preprocessing", UNIT, "stage 'preprocessing' has no mechanism calibrated to the unit"),
    ],
)
def test_the_audit_flags_a_whole_share_release_without_a_valid_per_unit_claim(tmp_path, stage, per_unit, problem):
    path = str(tmp_path / "l.db")
    ledger, grant, split = _world(path)
    with ledger:
        _forge_release(ledger, grant, stage, getattr(split, stage), per_unit)
        report = ledger.audit()
    assert not report.ok and any(problem in p for p in report.problems), report.problems


def test_the_per_unit_flag_edited_in_the_log_is_caught(tmp_path):
    path = str(tmp_path / "l.db")
    ledger, grant, split = _world(path)
    with ledger:
        ledger.release(grant, "validation", "c", split.validation, per_unit=UNIT)
    with sqlite3.connect(path) as conn:  # drop the flag, as a writer without the key can
        seq, body = conn.execute("SELECT seq, body FROM log WHERE kind = 'release'").fetchone()
        edited = {k: v for k, v in json.loads(body).items() if k != PER_UNIT_KEY}
        conn.execute("UPDATE log SET body = ? WHERE seq = ?", (json.dumps(edited, sort_keys=True), seq))
    with Ledger.open(path, check_head=False) as ledger:
        report = ledger.audit()
    assert not report.ok and any("chain" in p for p in report.problems), report.problems
