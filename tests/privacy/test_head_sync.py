"""The head file's ``commit`` and ``group`` sync modes (head_file.HeadSync; docs/security.md): ``commit`` makes the head
durable before a ledger write returns, ``group`` by a background writer within 50 ms, one write for all the commits
of the interval; and the two-slot file they write. The default mode, ``use``, is in tests/privacy/test_head_use.py.

Checked on real SQLite ledgers: group mode writes the head fewer times than it commits and still ends at the
log's last entry (read through the head file, which flushes first); a process killed with SIGKILL in group mode
leaves a head at most BEHIND the log, which the audit accepts with a note (no false alarm, no overspend), and a
truncated log is still caught once the head was written; a bad mode is refused naming the value.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from sage_tfx.cli import main
from sage_tfx.privacy import Ledger, LedgerUpgradeNeeded, head_slots
from sage_tfx.privacy import head_file as head_module
from sage_tfx.privacy.head_file import ENV_HEAD_SYNC, HeadFile, HeadSync, head_sync_mode
from sage_tfx.privacy.keys import KeyFileError
from tests.helpers.head_file import last_seq, small_ledger


@pytest.mark.parametrize("mode", ["commit", "group"])
def test_the_head_ends_at_the_logs_last_entry_with_fewer_writes_in_group_mode(tmp_path, monkeypatch, mode):
    monkeypatch.setenv(ENV_HEAD_SYNC, mode)
    writes = []
    original = HeadFile._write

    def counting(self, updates, reset=False):
        writes.append(len(updates))
        return original(self, updates, reset=reset)

    monkeypatch.setattr(HeadFile, "_write", counting)
    ledger = small_ledger(tmp_path / "l.db")
    assert ledger.head_file.sync is HeadSync(mode)
    before = len(writes)
    commits = 60
    for _ in range(commits):
        ledger.request("p", "s", blocks=["b0", "b1", "b2", "b3"], epsilon=1.0)
    head = ledger.head_file.get(ledger.ledger_id)  # flushes this process's pending head first
    assert head["seq"] == last_seq(ledger)
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
    small_ledger(path).close()
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
        last = last_seq(ledger)
        assert 0 < head["seq"] <= last
        if head["seq"] < last:  # the entries of the last interval: accepted, and said
            assert any("after the head file's entry" in n for n in report.notes), report.notes
        granted = len(ledger.grants("s"))
        assert granted >= 200
        spent = {b.id: b.spent[0] for b in ledger.blocks("s")}
        assert spent["b0"] == pytest.approx(0.01 * granted) and spent["b0"] <= 1000.0


def _assert_truncation_caught(ledger, first):
    """Cut the log from entry ``first`` on (behind the ledger's back) and check the audit names that entry."""
    with ledger._store.transaction() as tx:
        tx.run("DELETE FROM log WHERE seq >= ?", (first,))
    report = ledger.audit()
    assert not report.ok
    assert any(f"recorded entry {first}" in p for p in report.problems), report.problems


def test_group_mode_still_catches_a_truncated_log(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_HEAD_SYNC, "group")
    ledger = small_ledger(tmp_path / "l.db")
    for _ in range(5):
        ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    ledger.head_file.flush()
    _assert_truncation_caught(ledger, last_seq(ledger))
    ledger.close()


def test_the_group_writer_makes_the_head_durable_without_a_read(tmp_path, monkeypatch):
    """No flush, no exit: the background writer alone brings the head file to the last entry (within 50 ms
    of the last commit; polled for up to 30 s on a loaded machine)."""
    monkeypatch.setenv(ENV_HEAD_SYNC, "group")
    ledger = small_ledger(tmp_path / "l.db")
    for _ in range(3):
        ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    last = last_seq(ledger)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # the file itself, no flush
        if HeadFile(ledger.head_file.path, "commit").read()[ledger.ledger_id]["seq"] == last:
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
    assert head_sync_mode("GROUP") is HeadSync.GROUP and head_module.GROUP_INTERVAL_S == 0.05


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
    last = last_seq(ledger)
    ledger.close()
    assert HeadFile(str(tmp_path / "l.db") + ".key.head", "commit").read()[ledger.ledger_id]["seq"] == last


# ------------------------------------------------------------------ the two-slot head file (head_file.HeadFile)
def _head_bytes(ledger):
    with open(ledger.head_file.path, "rb") as f:
        return f.read()


def _slot_end(data, offset):
    """Where the meaningful bytes of the slot at ``offset`` end (header, payload, digest; then zero padding)."""
    _magic, _size, _generation, length = head_slots._SLOT_HEADER.unpack_from(data, offset)
    return head_slots._SLOT_HEADER.size + length + head_slots._SLOT_DIGEST


@pytest.mark.parametrize(
    "tear", ["nothing", "header", "half", "all but one byte", "new tail, old head", "garbage after the header"]
)
def test_a_torn_newer_slot_leaves_the_older_head_and_the_audit_accepts_the_log_ahead_of_it(tmp_path, monkeypatch, tear):
    """A crash mid-write (the newer slot partly written) leaves the older slot: the previous head, never a false
    alarm, and a truncation below that head is still caught."""
    monkeypatch.setenv(
        ENV_HEAD_SYNC, "commit"
    )  # every write in place into A or B (use mode: tests/privacy/test_head_use.py)
    ledger = small_ledger(tmp_path / "l.db")
    ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    before, old_seq = _head_bytes(ledger), last_seq(ledger)
    ledger.request("p", "s", blocks=["b1"], epsilon=1.0)
    after, last = _head_bytes(ledger), last_seq(ledger)
    assert len(before) == len(after) == 2 * head_module.HEAD_SLOT_BYTES and last > old_seq
    size = head_module.HEAD_SLOT_BYTES
    written = [i for i in (0, 1) if before[i * size : (i + 1) * size] != after[i * size : (i + 1) * size]]
    assert len(written) == 1  # one slot written in place, the other untouched
    offset = written[0] * size
    old, new = before[offset : offset + size], after[offset : offset + size]
    end = _slot_end(after, offset)
    header = head_slots._SLOT_HEADER.size
    torn = {
        "nothing": old,
        "header": new[:header] + old[header:],
        "half": new[: end // 2] + old[end // 2 :],
        "all but one byte": new[: end - 1] + old[end - 1 :],
        "new tail, old head": old[:header] + new[header:],
        "garbage after the header": new[:header] + bytes(b ^ 0x5A for b in new[header:end]) + new[end:],
    }[tear]
    with open(ledger.head_file.path, "r+b") as f:
        f.seek(offset)
        f.write(torn)
    head = HeadFile(ledger.head_file.path, "commit").read()[ledger.ledger_id]
    # a torn slot identical to the complete write (old and new bytes equal where the tear is) is the new head
    assert head["seq"] == (last if torn == new else old_seq), (tear, head)
    report = ledger.audit()
    assert report.ok, report.problems
    if torn != new:
        assert any(
            f"{last - old_seq} log entr" in n and f"after the head file's entry {old_seq}" in n for n in report.notes
        ), report.notes
    torn_file = _head_bytes(ledger)
    # the next write goes to the torn slot (the other is intact and newest): the head moves on, audit clean
    ledger.request("p", "s", blocks=["b2"], epsilon=1.0)
    assert HeadFile(ledger.head_file.path, "commit").read()[ledger.ledger_id]["seq"] == last_seq(ledger)
    assert ledger.audit().ok
    # never a missed truncation: back to the torn file, the log cut below the surviving head's entry (the new one
    # when the tear changed nothing: "all but one byte" whose last byte the old slot happened to share, 1 in 256)
    with open(ledger.head_file.path, "wb") as f:
        f.write(torn_file)
    _assert_truncation_caught(ledger, last if torn == new else old_seq)
    ledger.close()


OLD_WRITER_OUTPUT = (
    '{{"{other}": {{"chain": "{other_chain}", "seq": 41}}, "{ledger}": {{"chain": "{chain}", "seq": {seq}}}}}'
)
# ^ what HeadFile wrote before the two-slot form (json.dumps(heads, sort_keys=True), replaced atomically), for a
# file holding two ledgers' heads; "{other}" sorts first.
OTHER_LEDGER = "0" * 32


def test_an_old_json_head_file_is_refused_until_upgraded(tmp_path, monkeypatch, capsys):
    """A head file in the JSON form of an older sage: every open refuses it (exit 2, naming `sage ledger upgrade`,
    nothing written); the upgrade rewrites it in slots with every ledger's head unchanged, once."""
    monkeypatch.setenv(
        ENV_HEAD_SYNC, "commit"
    )  # migrated to two slots (use mode's three: tests/privacy/test_head_use.py)
    ledger = small_ledger(tmp_path / "l.db")
    ledger.request("p", "s", blocks=["b0"], epsilon=1.0)
    path = ledger.head_file.path
    current = HeadFile(path, "commit").read()[ledger.ledger_id]
    old_text = OLD_WRITER_OUTPUT.format(
        other=OTHER_LEDGER, other_chain="ab" * 32, ledger=ledger.ledger_id, chain=current["chain"], seq=current["seq"]
    )
    assert old_text == json.dumps(
        {OTHER_LEDGER: {"seq": 41, "chain": "ab" * 32}, ledger.ledger_id: current}, sort_keys=True
    )  # the literal is the old writer's format
    os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, old_text.encode())
    os.close(fd)
    ledger.close()
    db = str(tmp_path / "l.db")
    with pytest.raises(LedgerUpgradeNeeded, match="sage ledger upgrade"):
        Ledger.open(db)
    assert main(["ledger", "audit", "--db", db]) == 2
    assert "JSON form" in capsys.readouterr().err
    with open(path, "rb") as f:
        assert f.read() == old_text.encode()  # nothing written by the refusals
    assert main(["ledger", "upgrade", "--db", db]) == 0
    assert "head file" in capsys.readouterr().err
    assert main(["ledger", "upgrade", "--db", db]) == 0
    assert "already up to date" in capsys.readouterr().err
    heads = HeadFile(path, "commit").read()
    assert heads == {OTHER_LEDGER: {"seq": 41, "chain": "ab" * 32}, ledger.ledger_id: current}
    ledger = Ledger.open(db)
    report = ledger.audit()
    assert report.ok and not report.notes, (report.problems, report.notes)
    ledger.request("p", "s", blocks=["b1"], epsilon=1.0)
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(head_module.HEAD_MAGIC) and len(data) == 2 * head_module.HEAD_SLOT_BYTES
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    heads = HeadFile(path, "commit").read()
    assert heads[OTHER_LEDGER] == {"seq": 41, "chain": "ab" * 32}  # the other ledger's head kept
    assert heads[ledger.ledger_id]["seq"] == last_seq(ledger)
    assert ledger.audit().ok
    last = last_seq(ledger)
    with ledger._store.transaction() as tx:
        tx.run("DELETE FROM log WHERE seq = ?", (last,))
    assert any(f"recorded entry {last}" in p for p in ledger.audit().problems)
    ledger.close()


def test_an_in_place_write_is_one_fdatasync_and_a_head_beyond_its_slot_grows_the_file(tmp_path, monkeypatch):
    syncs = []
    real_fdatasync, real_fsync = head_module._fdatasync, os.fsync
    monkeypatch.setattr(head_module, "_fdatasync", lambda fd: (syncs.append("fdatasync"), real_fdatasync(fd)))
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append("fsync"), real_fsync(fd)))
    path = str(tmp_path / "k.key.head")
    head = HeadFile(path, "commit")
    head.advance("L", 1, "c1")  # a new file: written whole (file fsync'd, folder fsync'd)
    assert syncs == ["fsync", "fsync"]
    inode = os.stat(path).st_ino
    ledgers = [f"ledger-{i:03d}-" + "x" * 80 for i in range(30)]  # ~30 x 190 bytes: beyond one 4 KiB slot, within 8 KiB
    grown_at = None
    for i, name in enumerate(ledgers):
        syncs.clear()
        head.advance(name, i + 1, "c" * 64)
        if os.stat(path).st_size > 2 * head_module.HEAD_SLOT_BYTES and grown_at is None:
            grown_at = i
            assert syncs == ["fsync", "fsync"] and os.stat(path).st_ino != inode  # replaced whole, bigger slots
            inode = os.stat(path).st_ino
        else:
            assert syncs == ["fdatasync"] and os.stat(path).st_ino == inode, (i, syncs)  # one durable write, in place
    assert grown_at is not None and os.stat(path).st_size == 4 * head_module.HEAD_SLOT_BYTES
    heads = HeadFile(path, "commit").read()
    assert len(heads) == 31 and heads["L"] == {"seq": 1, "chain": "c1"}
    assert all(heads[name]["seq"] == i + 1 for i, name in enumerate(ledgers))
    syncs.clear()
    head.advance("L", 1, "c1-again")  # not forwards: nothing written
    assert syncs == [] and HeadFile(path, "commit").read()["L"]["chain"] == "c1"


def test_a_stale_writer_never_moves_the_head_back_and_follows_a_replaced_file(tmp_path):
    path = str(tmp_path / "k.key.head")
    a, b = HeadFile(path, "commit"), HeadFile(path, "commit")  # two descriptors, as two processes
    a.advance("L", 5, "c5")
    b.advance("L", 7, "c7")
    a.advance("L", 6, "c6")  # a's last view said 5: it must see b's 7 and not move back
    assert HeadFile(path, "commit").read()["L"] == {"seq": 7, "chain": "c7"}
    for i in range(60):  # b grows the file: a new file (bigger slots) renamed over the one a has open
        b.advance(f"other-{i:02d}-" + "y" * 100, 1, "c")
    assert os.stat(path).st_size > 2 * head_module.HEAD_SLOT_BYTES
    a.advance("L", 9, "c9")  # written into the new file, keeping b's heads
    heads = HeadFile(path, "commit").read()
    assert heads["L"] == {"seq": 9, "chain": "c9"} and len(heads) == 61
    b.advance("L", 8, "c8")
    assert HeadFile(path, "commit").read()["L"]["seq"] == 9


@pytest.mark.parametrize("mode", ["commit", "use"])
def test_writers_in_several_processes_lose_no_head_and_never_go_back(tmp_path, mode):
    """Three processes advance one shared ledger id (interleaved sequence numbers) and one id each: the file
    ends at the highest of each, so no write was lost to a stale view of the file. In ``use`` mode the writers mix
    grants' unsynced writes (slot C) with durable ones, and each makes its last heads durable as it exits."""
    path = str(tmp_path / "k.key.head")
    HeadFile(path, mode).advance("shared", 0, "c")
    child = textwrap.dedent("""
        import sys
        from sage_tfx.privacy.head_file import HeadFile
        path, me, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        head, lazy = HeadFile(path, mode), mode == "use"
        for i in range(n):
            head.advance("shared", 3 * i + me + 1, f"c{3 * i + me + 1}", until_use=lazy and i % 3 != 0)
            head.advance(f"own-{me}", i + 1, f"o{i + 1}", until_use=lazy and i % 2 == 0)
    """)
    n = 60
    procs = [subprocess.Popen([sys.executable, "-c", child, path, str(me), str(n), mode]) for me in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    heads = HeadFile(path, "commit").read()
    assert heads["shared"] == {"seq": 3 * n, "chain": f"c{3 * n}"}
    assert all(heads[f"own-{me}"] == {"seq": n, "chain": f"o{n}"} for me in range(3))
    with open(path, "rb") as f:
        assert head_slots._parse_head_file(f.read(), path).durable_heads == heads  # durable: synced, or at exit


def test_a_head_file_open_to_others_or_malformed_is_refused_naming_the_fix(tmp_path):
    path = str(tmp_path / "k.key.head")
    head = HeadFile(path, "commit")
    head.advance("L", 1, "c1")
    os.chmod(path, 0o664)
    with pytest.raises(KeyFileError, match=r"writable by group or others: fix: chmod 600"):
        head.advance("L", 2, "c2")
    with pytest.raises(KeyFileError, match=r"writable by group or others: fix: chmod 600"):
        HeadFile(path, "commit").read()
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:  # both slots destroyed
        f.write(bytes(2 * head_module.HEAD_SLOT_BYTES))
    with pytest.raises(KeyFileError, match=r"is malformed .*no intact slot"):
        HeadFile(path, "commit").read()
    with pytest.raises(KeyFileError, match=r"is malformed"):
        head.advance("L", 3, "c3")


def test_a_process_keeps_at_most_max_open_head_files_descriptors_open(tmp_path):
    """Ledgers closed but not yet collected keep their HeadFile: its descriptors are bounded, and a HeadFile whose
    descriptors were closed writes again (forwards only) by opening them anew."""

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    heads = [HeadFile(str(tmp_path / f"h{i}.key.head"), "commit") for i in range(3 * head_module.MAX_OPEN_HEAD_FILES)]
    heads[0].advance("L", 1, "c1")
    start = open_fds()
    for i, head in enumerate(heads[1:]):
        head.advance("L", i + 1, "c")
    assert open_fds() - start <= 2 * head_module.MAX_OPEN_HEAD_FILES
    assert heads[0]._fds.lock is None  # the oldest closed its descriptors
    heads[0].advance("L", 2, "c2")
    heads[0].advance("L", 1, "c1-again")
    assert HeadFile(heads[0].path, "commit").read()["L"] == {"seq": 2, "chain": "c2"}
