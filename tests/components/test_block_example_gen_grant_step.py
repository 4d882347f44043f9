"""BlockExampleGen's executor on the shared grant step (components/_grant.py ``GrantedExecutor.CheckGrant``):
one ledger connection per run for the grant check, the key door (``access.grant_blocks``) and the DP record
count, as the DPTransform, DPTrainer and DPModelValidator executors (tests/components/test_grant_step.py).
"""

import os

import pytest

import sage_tfx  # noqa: F401  (before TensorFlow)
from sage_tfx.privacy import GrantError, Ledger
from tests.components.test_block_example_gen import _check_output, _run_executor, world  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.tf


@pytest.fixture
def opens(monkeypatch):
    """Counts Ledger.open calls (the real open runs)."""
    calls = []
    real = Ledger.open.__func__

    def counted(cls, *args, **kwargs):
        calls.append(str(args[0] if args else kwargs.get("location")))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(Ledger, "open", classmethod(counted))
    return calls


def test_one_ledger_connection_per_run_with_a_dp_count(world, tmp_path, opens):  # noqa: F811
    from sage_tfx.components._grant import GrantedExecutor
    from sage_tfx.components.block_example_gen_executor import Executor

    assert issubclass(Executor, GrantedExecutor)
    g = world["counted"]  # its split has a count stage: the run opens that release too
    examples = _run_executor(world, g.to_json(), tmp_path)
    assert opens == [world["db"]]  # before: one for the check, one for the keys, one for the count
    assert examples.get_float_custom_property("dp_record_count_epsilon") == pytest.approx(0.1)
    _check_output(world, examples, g)


def test_a_refused_grant_opens_the_ledger_once_and_reads_nothing(world, tmp_path, opens):  # noqa: F811

    with pytest.raises(GrantError, match="is for stream 'other', not 'taxi'"):
        _run_executor(world, world["other"].to_json(), tmp_path)
    assert opens == [world["db"]]
    assert os.listdir(tmp_path / "examples") == []
