"""The executors' shared grant step (components/_grant.py): one ledger connection per run.

No TensorFlow: GrantedExecutor is a plain mixin; the four executors that use it (BlockExampleGen, DPTransform,
DPTrainer, DPModelValidator) are exercised end to end in their own (TF) tests.
"""

import pytest

from sage_tfx.components import _grant
from sage_tfx.components._grant import GRANT_KEY, LEDGER_KEY, GrantedExecutor, grant_to_json
from sage_tfx.privacy import BudgetSplit, ChargeRule, GrantError, Ledger

DAY = 86400.0


def make_grant(location):
    with Ledger.open(location, create=True) as ledger:
        ledger.create_stream("s", 1.0, 1e-5)
        for i in range(2):
            ledger.add_block("s", f"b{i}", start=i * DAY, end=(i + 1) * DAY, rows=100)
        return ledger.request(
            "p",
            "s",
            blocks=["b0", "b1"],
            epsilon=0.8,
            split=BudgetSplit(0.1, 0.05, 0.3, 0.35, 0.0, ChargeRule.PARALLEL.value),
        )


@pytest.fixture
def opens(monkeypatch):
    """Counts Ledger.open calls (the real open runs)."""
    calls = []
    real = Ledger.open.__func__

    def counted(cls, *args, **kwargs):
        calls.append(args[0] if args else kwargs.get("location"))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(Ledger, "open", classmethod(counted))
    return calls


def test_one_connection_for_check_releases_and_count(ledger_url, opens):
    grant = make_grant(ledger_url)
    opens.clear()
    props = {GRANT_KEY: grant_to_json(grant), LEDGER_KEY: ledger_url}
    with GrantedExecutor().CheckGrant(props, stream="s") as run:
        assert run.grant.id == grant.id and run.location == ledger_url
        seed = run.open_release("training", "model-1", 0.3)
        assert run.open_release("training", "model-1", 0.3) == seed  # a re-run: same release, same seed
        count, eps = run.released_record_count()
        assert eps == pytest.approx(0.05) and count != 200.0  # a DP count (GENERATED noise), never the exact 200
        with pytest.raises(GrantError):  # a second computation under the same stage is still refused
            run.open_release("training", "model-2", 0.3)
    assert opens == [ledger_url]  # before: one open per check, per release and two per record count
    # the per-call functions still take a location (BlockExampleGen's executor uses them) and agree
    assert _grant.open_release(ledger_url, grant, "training", "model-1", 0.3) == seed
    assert _grant.released_record_count(ledger_url, grant) == (count, eps)


def test_check_grant_refuses_before_opening_the_ledger(tmp_path, opens):
    step = GrantedExecutor()
    with pytest.raises(GrantError, match="no grant given"):
        with step.CheckGrant({LEDGER_KEY: str(tmp_path / "l.db")}):
            pass
    with pytest.raises(GrantError, match="no ledger location given"):
        with step.CheckGrant({GRANT_KEY: "{}"}):
            pass
    assert opens == []


def test_check_grant_refuses_another_stream_and_closes(ledger_url):
    grant = make_grant(ledger_url)
    with pytest.raises(GrantError):
        with GrantedExecutor().CheckGrant({GRANT_KEY: grant.to_json(), LEDGER_KEY: ledger_url}, stream="other"):
            pass


def test_grant_to_json():
    class WithJson:
        def to_json(self):
            return '{"id": "g"}'

    assert grant_to_json(WithJson()) == '{"id": "g"}'
    assert grant_to_json(None) is None and grant_to_json('{"a": 1}') == '{"a": 1}'
