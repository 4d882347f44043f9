"""The default head-file sync mode, ``use`` (head_file.HeadSync.USE; docs/security.md, "When the head file is made
durable"): a grant's head goes to the head file's third slot (C) without a sync before the grant returns, and into a
durable slot (A or B, fdatasync'd) before the grant's first use (``Ledger.verify``); every other write's head is
durable before the write returns.

Checked on real SQLite ledgers and real files. A power loss is modelled by what it can leave on disk: the durable
slots as they are (every write to them was synced before the writer released the lock) and slot C as it was before
its unsynced write (or torn); a truncation "by someone who can write the database and not the key file" by putting
back a copy of the database taken before the grant (a consistent earlier state, which the replay cannot tell from a
crash before the grant's commit). What is claimed, and checked:
* a used grant's truncation is caught after a power loss, as in ``commit`` mode;
* a killed writer (SIGKILL, the page cache intact) loses no head: its grant's truncation is caught;
* an unused grant whose head a power loss lost can be truncated unnoticed, and then it is refused at the door:
  nothing was, or can be, read under it (the state an honest crash before its commit leaves).
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from sage_tfx.privacy import GrantError, Ledger, LedgerRollback, head_slots
from sage_tfx.privacy import head_file as head_module
from sage_tfx.privacy.head_file import ENV_HEAD_SYNC, HeadFile, HeadSync
from tests.helpers.head_file import backup, last_seq, restore, small_ledger

SLOT = head_module.HEAD_SLOT_BYTES
C = head_module.HEAD_LAZY_SLOT


def _state(path):
    with open(path, "rb") as f:
        return head_slots._parse_head_file(f.read(), path)


def _newest_seq(state, ledger_id):
    return state.heads[ledger_id]["seq"]


def _durable_seq(state, ledger_id):
    return state.durable_heads.get(ledger_id, {}).get("seq", 0)


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch):
    monkeypatch.delenv(ENV_HEAD_SYNC, raising=False)  # the default, whatever the caller's environment says


def test_use_is_the_default_and_a_grant_is_durable_before_its_first_use(tmp_path):
    ledger = small_ledger(tmp_path / "l.db")
    assert ledger.head_file.sync is HeadSync.USE and head_module.head_sync_mode() is HeadSync.USE
    path, me = ledger.head_file.path, ledger.ledger_id
    setup = last_seq(ledger)
    assert _durable_seq(_state(path), me) == setup  # stream and blocks: durable before each write returned
    grant = ledger.request("p", "s", blocks=["b0", "b1"], epsilon=1.0)
    state = _state(path)
    assert state.count == 3 and os.path.getsize(path) == 3 * SLOT  # the file gained slot C (written whole, once)
    second = ledger.request("p", "s", blocks=["b2"], epsilon=1.0)
    last = last_seq(ledger)
    state = _state(path)
    assert state.newest == C and _newest_seq(state, me) == last  # the grant's head: in slot C ...
    assert _durable_seq(state, me) < last  # ... not yet in a durable slot
    report = ledger.audit()  # reads the head (the newest slot) after making this process's heads durable
    assert report.ok and not report.notes, (report.problems, report.notes)
    ledger.request("p", "s", blocks=["b3"], epsilon=1.0)
    last = last_seq(ledger)
    assert _durable_seq(_state(path), me) < last
    assert ledger.verify(second).id == second.id  # the door: the log's last entry durable first
    state = _state(path)
    assert _durable_seq(state, me) == last and state.newest != C
    assert ledger.verify(grant).id == grant.id
    ledger.close()


@pytest.mark.parametrize("verifier_mode", ["commit", "group"])
def test_a_verifier_in_another_mode_still_makes_the_grant_durable_first(tmp_path, verifier_mode):
    """The executor that verifies may run with another SAGE_HEAD_SYNC than the process that granted."""
    ledger = small_ledger(tmp_path / "l.db")
    path, me = ledger.head_file.path, ledger.ledger_id
    ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    grant = ledger.request("p", "s", blocks=["b1"], epsilon=1.0)
    last = last_seq(ledger)
    assert _durable_seq(_state(path), me) < last
    with Ledger.open(tmp_path / "l.db", head_sync=verifier_mode) as verifier:
        verifier.verify(grant.to_json())
        assert _durable_seq(_state(path), me) == last
    ledger.close()


def test_every_write_but_a_grant_is_durable_before_it_returns(tmp_path):
    ledger = small_ledger(tmp_path / "l.db")
    path, me = ledger.head_file.path, ledger.ledger_id
    ledger.request("p", "s", blocks=["b0"], epsilon=1.0)  # the first grant gives the file slot C (durably)
    ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    assert _durable_seq(_state(path), me) < last_seq(ledger)
    ledger.add_block("s", "b9")  # a write that is not a grant: durable at once, carrying the grant's head with it
    assert _durable_seq(_state(path), me) == last_seq(ledger)
    ledger.request("p", "s", blocks=["b1"], epsilon=1.0)
    ledger.close()  # a normal close makes the last grant's head durable too
    assert _durable_seq(_state(path), me) == _newest_seq(_state(path), me)


@pytest.mark.parametrize("lost", ["unwritten", "torn"])
@pytest.mark.parametrize("used", [True, False])
def test_after_a_power_loss_a_used_grant_s_truncation_is_caught_and_an_unused_one_cannot_be_read(tmp_path, used, lost):
    path = tmp_path / "l.db"
    ledger = small_ledger(path)
    me, head_path = ledger.ledger_id, ledger.head_file.path  # noqa: F841
    ledger.request("p", "s", blocks=["b0"], epsilon=1.0)  # the file has its three slots from here on
    before_grant = tmp_path / "before.db"
    backup(path, before_grant)
    with open(head_path, "rb") as f:
        head_before = f.read()
    grant = ledger.request("p", "s", blocks=["b1", "b2"], epsilon=2.0)
    grant_seq = last_seq(ledger)
    if used:
        ledger.verify(grant)  # e.g. BlockExampleGen's door, before any block is opened
    with open(head_path, "rb") as f:
        at_power_loss = f.read()
    ledger.close()
    # what a power loss leaves: slots A and B as they were (always synced), slot C's unsynced write lost or torn
    slot_c = head_before[C * SLOT : (C + 1) * SLOT] if lost == "unwritten" else bytes(SLOT)
    on_disk = at_power_loss[: C * SLOT] + slot_c
    # ... and someone who can write the database and not the key file puts back the database before the grant
    restore(path, before_grant)
    with open(head_path, "wb") as f:
        f.write(on_disk)
    if used:  # the head says the grant's entry: the log behind it is refused at open, before any write
        with pytest.raises(LedgerRollback, match=f"recorded entry {grant_seq}"):
            Ledger.open(path)
    with Ledger.open(path, check_head=not used) as ledger:
        report = ledger.audit()
        if used:  # ... and caught by the audit
            assert not report.ok
            assert any(f"recorded entry {grant_seq}" in p for p in report.problems), report.problems
        else:  # the state an honest crash before the grant's commit leaves; the grant opens nothing
            assert report.ok, report.problems
            assert [b.spent[0] for b in ledger.blocks("s")][:3] == [1.0, 0.0, 0.0]
            with pytest.raises(GrantError, match="never charged|unknown|not recorded"):
                ledger.verify(grant)


def test_a_killed_writer_loses_no_grant_head(tmp_path):
    """SIGKILL right after the grant returns (no flush, no exit handler): the head is in the page cache, the audit
    reads it, and the grant's truncation is caught."""
    path = tmp_path / "l.db"
    with small_ledger(path) as ledger:
        ledger.request("p", "s", blocks=["b3"], epsilon=1.0)  # the file has its three slots from here on
    before_grant = tmp_path / "before.db"
    backup(path, before_grant)
    with Ledger.open(path) as ledger:
        me = ledger.ledger_id
    child = textwrap.dedent(f"""
        import os, signal
        from sage_tfx.privacy import Ledger
        ledger = Ledger.open({str(path)!r})
        ledger.request("p", "s", blocks=["b0", "b1"], epsilon=1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {k: v for k, v in os.environ.items() if k != ENV_HEAD_SYNC}
    proc = subprocess.run([sys.executable, "-c", child], env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    with Ledger.open(path) as ledger:
        last = last_seq(ledger)
        state = _state(ledger.head_file.path)
        assert state.newest == C and _newest_seq(state, me) == last > _durable_seq(state, me)  # never synced
        report = ledger.audit()
        assert report.ok and not report.notes, (report.problems, report.notes)
    restore(path, before_grant)
    with pytest.raises(LedgerRollback, match=f"recorded entry {last}"):
        Ledger.open(path)
    with Ledger.open(path, check_head=False) as ledger:
        report = ledger.audit()
        assert not report.ok and any(f"recorded entry {last}" in p for p in report.problems), report.problems


@pytest.mark.parametrize("tear", ["zeros", "half", "old generation"])  # half: cut inside the payload
def test_a_torn_or_stale_slot_c_falls_back_to_the_durable_head(tmp_path, tear):
    path = str(tmp_path / "k.key.head")
    head = HeadFile(path, "use")
    head.advance("L", 1, "c1")  # a new file: durable, whole
    head.advance("L", 2, "c2", until_use=True)  # three slots now, written whole (durable)
    head.advance("L", 3, "c3", until_use=True)  # slot C, unsynced
    with open(path, "rb") as f:
        stale = f.read()[C * SLOT :]
    head.advance("L", 4, "c4", until_use=True)
    with open(path, "rb") as f:
        data = f.read()
    assert HeadFile(path, "commit").read()["L"]["seq"] == 4
    new = data[C * SLOT :]
    slot_c = {"zeros": bytes(SLOT), "half": new[:60] + bytes(SLOT - 60), "old generation": stale}[tear]
    with open(path, "r+b") as f:
        f.seek(C * SLOT)
        f.write(slot_c)
    expected = 3 if tear == "old generation" else 2  # a stale slot C is an earlier head: newer than A and B's
    assert HeadFile(path, "commit").read()["L"]["seq"] == expected
    head.advance("L", 5, "c5")  # a durable write goes on from there, into the older of A and B
    state = _state(path)
    assert state.durable_heads["L"]["seq"] == 5 and state.newest in (0, 1)


def test_make_durable_syncs_a_slot_this_process_did_not_and_only_once(tmp_path, monkeypatch):
    syncs = []
    real = head_module._fdatasync
    monkeypatch.setattr(head_module, "_fdatasync", lambda fd: (syncs.append(fd), real(fd)))
    path = str(tmp_path / "k.key.head")
    writer, reader = HeadFile(path, "use"), HeadFile(path, "use")  # two descriptors, as two processes
    writer.advance("L", 1, "c1")
    writer.advance("L", 2, "c2")  # in place into A or B, synced by the writer
    syncs.clear()
    reader.make_durable("L", 2, "c2")  # the reader does not know the writer synced (it may have been killed)
    assert len(syncs) == 1
    reader.make_durable("L", 2, "c2")
    assert len(syncs) == 1  # it synced since that slot was written
    writer.advance("L", 3, "c3", until_use=True)  # slot C: the durable slots lag
    reader.make_durable("L", 3, "c3")
    assert len(syncs) == 2 and _state(path).durable_heads["L"]["seq"] == 3
    reader.make_durable("L", 4, "c4")  # beyond everything recorded (another host's entry, say): written durably
    assert len(syncs) == 3 and _state(path).durable_heads["L"] == {"seq": 4, "chain": "c4"}


def test_a_commit_mode_writer_keeps_slot_c_and_never_goes_back(tmp_path):
    path = str(tmp_path / "k.key.head")
    lazy, durable = HeadFile(path, "use"), HeadFile(path, "commit")
    lazy.advance("L", 1, "c1")
    lazy.advance("L", 5, "c5", until_use=True)
    durable.advance("M", 1, "m1")  # merges slot C's newer head of L into a durable slot
    state = _state(path)
    assert state.count == 3 and state.durable_heads == {"L": {"seq": 5, "chain": "c5"}, "M": {"seq": 1, "chain": "m1"}}
    durable.advance("L", 4, "c4")  # behind: nothing written
    assert HeadFile(path, "commit").read()["L"]["seq"] == 5
    lazy.advance("L", 6, "c6", until_use=True)
    assert HeadFile(path, "commit").read() == {"L": {"seq": 6, "chain": "c6"}, "M": {"seq": 1, "chain": "m1"}}


def test_a_head_file_that_cannot_be_written_at_first_use_is_warned_about_and_the_grant_still_given(tmp_path, caplog):
    """As a failed head write after a commit: the grant was charged and is given, and the warning names the file and
    the fix (here: a head file opened to others, which every write refuses)."""
    ledger = small_ledger(tmp_path / "l.db")
    ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    grant = ledger.request("p", "s", blocks=["b1"], epsilon=1.0)
    os.chmod(ledger.head_file.path, 0o664)
    with caplog.at_level("WARNING", logger="sage_tfx.privacy.head_file"):
        assert ledger.verify(grant).id == grant.id
    assert any(
        "could not update head file" in r.getMessage() and "chmod 600" in r.getMessage() for r in caplog.records
    ), caplog.records
    os.chmod(ledger.head_file.path, 0o600)
    ledger.close()
