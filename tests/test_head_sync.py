"""The head file's two sync modes (keys.HeadSync; docs/security.md): ``commit`` makes the head durable before a
ledger write returns, ``group`` by a background writer within 50 ms, one write for all the commits of the interval.

Checked on real SQLite ledgers: group mode writes the head fewer times than it commits and still ends at the
log's last entry (read through the head file, which flushes first); a process killed with SIGKILL in group mode
leaves a head at most BEHIND the log, which the audit accepts with a note (no false alarm, no overspend), and a
truncated log is still caught once the head was written; a bad mode is refused naming the value.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sage_tfx.privacy import Ledger
from sage_tfx.privacy import keys as keys_module
from sage_tfx.privacy.keys import ENV_HEAD_SYNC, HeadFile, HeadSync, KeyFileError, head_sync_mode


def _ledger(path, blocks=4):
    ledger = Ledger.open(path, create=True)
    ledger.create_stream("s", 1000.0, 1e-6, min_epsilon=1e-6, max_epsilon=1000.0)
    for i in range(blocks):
        ledger.add_block("s", f"b{i}")
    return ledger


def _last_seq(ledger):
    with ledger._store.transaction(write=False) as tx:
        return tx.one("SELECT seq FROM log ORDER BY seq DESC LIMIT 1")[0]


@pytest.mark.parametrize("mode", ["commit", "group"])
def test_the_head_ends_at_the_logs_last_entry_with_fewer_writes_in_group_mode(tmp_path, monkeypatch, mode):
    monkeypatch.setenv(ENV_HEAD_SYNC, mode)
    writes = []
    original = HeadFile._write

    def counting(self, updates, reset=False):
        writes.append(len(updates))
        return original(self, updates, reset=reset)

    monkeypatch.setattr(HeadFile, "_write", counting)
    ledger = _ledger(tmp_path / "l.db")
    assert ledger.head_file.sync is HeadSync(mode)
    before = len(writes)
    commits = 60
    for _ in range(commits):
        ledger.request("p", "s", blocks=["b0", "b1", "b2", "b3"], epsilon=1.0)
    head = ledger.head_file.get(ledger.ledger_id)  # flushes this process's pending head first
    assert head["seq"] == _last_seq(ledger)
    report = ledger.audit()
    assert report.ok, report.problems
    made = len(writes) - before
    if mode == "commit":
        assert made == commits
    else:  # 60 grants of a few ms each: for as many writes, every grant would have to take over 50 ms
        assert 1 <= made < commits, made
    ledger.close()


def test_a_process_killed_in_group_mode_leaves_the_head_behind_and_the_audit_accepts_it(tmp_path):
    path = tmp_path / "l.db"
    _ledger(path).close()
    child = textwrap.dedent(f"""
        import sys
        from sage_tfx.privacy import Ledger
        ledger = Ledger.open({str(path)!r})
        for i in range(10**6):
            ledger.request("p", "s", blocks=["b0", "b1"], epsilon=0.01)
            print(i, flush=True)
    """)
    env = dict(os.environ, **{ENV_HEAD_SYNC: "group"})
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stdout:
            if int(line) >= 200:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with Ledger.open(path) as ledger:
        report = ledger.audit()
        assert report.ok, report.problems
        head = ledger.head_file.get(ledger.ledger_id)
        last = _last_seq(ledger)
        assert 0 < head["seq"] <= last
        if head["seq"] < last:  # the entries of the last interval: accepted, and said
            assert any("after the head file's entry" in n for n in report.notes), report.notes
        granted = len(ledger.grants("s"))
        assert granted >= 200
        spent = {b.id: b.spent[0] for b in ledger.blocks("s")}
        assert spent["b0"] == pytest.approx(0.01 * granted) and spent["b0"] <= 1000.0


def test_group_mode_still_catches_a_truncated_log(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_HEAD_SYNC, "group")
    ledger = _ledger(tmp_path / "l.db")
    for _ in range(5):
        ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    ledger.head_file.flush()
    last = _last_seq(ledger)
    with ledger._store.transaction() as tx:
        tx.run("DELETE FROM log WHERE seq = ?", (last,))
    report = ledger.audit()
    assert not report.ok
    assert any(f"recorded entry {last}" in p for p in report.problems), report.problems
    ledger.close()


def test_the_group_writer_makes_the_head_durable_without_a_read(tmp_path, monkeypatch):
    """No flush, no exit: the background writer alone brings the head file to the last entry (within 50 ms
    of the last commit; polled for up to 30 s on a loaded machine)."""
    monkeypatch.setenv(ENV_HEAD_SYNC, "group")
    ledger = _ledger(tmp_path / "l.db")
    for _ in range(3):
        ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    last = _last_seq(ledger)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(ledger.head_file.path) as f:
            if json.load(f)[ledger.ledger_id]["seq"] == last:
                break
        time.sleep(0.05)
    else:
        pytest.fail("the group writer did not write the head within 30 s")
    ledger.close()


def test_a_bad_mode_is_refused_naming_the_value(monkeypatch):
    monkeypatch.setenv(ENV_HEAD_SYNC, "sometimes")
    with pytest.raises(KeyFileError, match=r"SAGE_HEAD_SYNC='sometimes'.*commit, group"):
        head_sync_mode()
    with pytest.raises(KeyFileError, match=r"head_sync='never'"):
        head_sync_mode("never")
    assert head_sync_mode("GROUP") is HeadSync.GROUP and keys_module.GROUP_INTERVAL_S == 0.05


def test_a_bad_mode_creates_nothing_and_open_takes_the_mode(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_HEAD_SYNC, "sometimes")
    with pytest.raises(KeyFileError, match="SAGE_HEAD_SYNC='sometimes'"):
        Ledger.open(tmp_path / "l.db", create=True)
    with pytest.raises(KeyFileError, match="head_sync='never'"):
        Ledger.open(tmp_path / "l.db", create=True, head_sync="never")
    assert os.listdir(tmp_path) == []  # no ledger, no key file, no head file
    # the argument wins over the environment; close() makes the last head durable at once
    ledger = Ledger.open(tmp_path / "l.db", create=True, head_sync="group")
    assert ledger.head_file.sync is HeadSync.GROUP
    ledger.create_stream("s", 10.0, 1e-6)
    ledger.add_block("s", "b0")
    last = _last_seq(ledger)
    ledger.close()
    with open(str(tmp_path / "l.db") + ".key.head") as f:
        assert json.load(f)[ledger.ledger_id]["seq"] == last
