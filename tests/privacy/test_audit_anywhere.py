"""`sage ledger audit` on a copy it cannot write: a read-only mount, a full disk. The audit opens the ledger
read-only (``Ledger.open(read_only=True)``, ``SqliteStore._open_read_only``): no migration, no WAL or SHM file,
no head-file write, and it still checks everything, the head anchor included. Before, the audit's open switched the
database to WAL (creating ``-wal``/``-shm`` files) and exited 2 ("cannot write", "disk I/O error").

The read-only mount and the full disk are real: a bind mount ``-o ro`` and a small filled tmpfs, each in a private
mount namespace (``unshare -m``: root, as in CI). SQLite, no TensorFlow."""

import hashlib
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys

import pytest

from sage_tfx.privacy import Ledger, LedgerError
from tests.helpers.head_file import backup, restore
from tests.privacy.test_tamper import honest, t_block_rows_edited, t_last_grant_truncated


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    monkeypatch.delenv("SAGE_KEY_FILE", raising=False)


def _namespace(script, timeout=300):
    """Run the shell ``script`` in a private mount namespace (its mounts vanish with it)."""
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", "set -e\n" + script], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    """Skip unless this host lets the tests mount in a private namespace (root with unshare, as CI runs)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a read-only copy and a full tmpfs in a namespace")
    probe = tmp_path_factory.mktemp("probe")
    done = _namespace(f"mount --bind -o ro {probe} {probe}\n! touch {probe}/x 2>/dev/null")
    if done.returncode != 0:
        pytest.skip(f"cannot mount in a private namespace here: {done.stderr.strip()}")


def _audit_command(path):
    return f"{shlex.quote(sys.executable)} -m sage_tfx ledger audit --db {shlex.quote(path)}"


def _snapshot(folder):
    """{file name: SHA-256} of every file in ``folder``."""
    return {
        name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
        for name in sorted(os.listdir(folder))
    }


def _copy(tmp_path, name="copy", tamper=None):
    """An honest ledger (tests/privacy/test_tamper.py: streams, blocks, grants, releases, a finish) and its key and head
    file, in a folder of their own, then ``tamper(path, last grant)`` if given; returns (folder, ledger path in it,
    what the tamper's audit problem says)."""
    folder = tmp_path / name
    folder.mkdir()
    path = str(folder / "ledger.db")
    grant = honest(path)
    return str(folder), path, tamper(path, grant) if tamper else None


def _audit_read_only_mount(folder, path):
    """`sage ledger audit` of ``path`` with ``folder`` bind-mounted read-only (a write there must fail first)."""
    q = shlex.quote(folder)
    return _namespace(f"mount --bind -o ro {q} {q}\n! touch {q}/probe 2>/dev/null\n{_audit_command(path)}")


def test_the_audit_of_a_read_only_mount_reports_ok_and_writes_nothing(tmp_path, mounts):
    folder, path, _ = _copy(tmp_path)
    before = _snapshot(folder)
    assert not any(name.endswith(("-wal", "-shm")) for name in before)
    done = _audit_read_only_mount(folder, path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "audit OK" in done.stdout, done.stdout
    assert _snapshot(folder) == before  # the same files, byte for byte: no -wal, -shm, head or lock file


@pytest.mark.parametrize(
    "tamper", [t_block_rows_edited, t_last_grant_truncated], ids=["table_edited", "last_grant_truncated"]
)
def test_the_audit_of_a_read_only_mount_still_catches_a_tamper(tmp_path, mounts, tamper):
    folder, path, found = _copy(tmp_path, tamper=tamper)
    before = _snapshot(folder)
    done = _audit_read_only_mount(folder, path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "audit FAILED" in done.stdout and found in done.stdout, done.stdout
    assert _snapshot(folder) == before


def test_a_rolled_back_copy_is_named_by_the_read_only_audit(tmp_path, mounts):
    """The head anchor is checked read-only too: an old copy of the database beside the newer head file."""
    folder, path, _ = _copy(tmp_path)
    old = str(tmp_path / "old.db")
    backup(path, old)
    with Ledger.open(path) as ledger:
        ledger.request("p", "s", blocks=["b0"], epsilon=0.1)
    restore(path, old)
    before = _snapshot(folder)
    done = _audit_read_only_mount(folder, path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the database was rolled back or its tail cut" in done.stdout, done.stdout
    assert _snapshot(folder) == before


def test_the_audit_on_a_full_disk_reports_ok_and_catches_a_tamper(tmp_path, mounts):
    """An honest copy and a tampered one on a tmpfs filled to its last byte, each audited; their files' bytes are
    listed from inside the namespace (the tmpfs vanishes with it)."""
    copies = {"honest": _copy(tmp_path, "honest"), "tampered": _copy(tmp_path, "tampered", t_block_rows_edited)}
    before = {name: _snapshot(folder) for name, (folder, _, _) in copies.items()}
    disk = tmp_path / "disk"
    disk.mkdir()
    d = shlex.quote(str(disk))
    size_k = sum(os.path.getsize(os.path.join(copies[c][0], n)) for c in before for n in before[c]) // 1024 + 256
    audits = "".join(
        f"""
echo "-- {name}"
cp -rp {shlex.quote(folder)} {d}/{name}
"""
        for name, (folder, _, _) in copies.items()
    )
    audits += f"dd if=/dev/zero of={d}/filler bs=1k 2>/dev/null || true\n"
    audits += f"test \"$(df --output=avail {d} | tail -1 | tr -d ' ')\" = 0\n"
    for name in copies:
        audits += f"""echo "== {name}"
{_audit_command(f"{disk}/{name}/ledger.db")} || echo "exit $?"
(cd {d}/{name} && sha256sum *)
"""
    done = _namespace(f"mount -t tmpfs -o size={size_k}k tmpfs {d}\n" + audits)
    assert done.returncode == 0, done.stdout + done.stderr
    parts = dict(part.split("\n", 1) for part in done.stdout.split("== ")[1:])
    for name, out in parts.items():
        hashes = dict(
            reversed(line.split("  "))
            for line in out.splitlines()
            if line[:64].isalnum() and len(line.split("  ")) == 2 and len(line.split("  ")[0]) == 64
        )
        assert hashes == before[name], out  # nothing written on the full disk: the same files, byte for byte
    assert "audit OK" in parts["honest"] and "exit" not in parts["honest"], done.stdout + done.stderr
    assert "audit FAILED" in parts["tampered"] and "exit 1" in parts["tampered"], done.stdout + done.stderr
    assert copies["tampered"][2] in parts["tampered"], parts["tampered"]


def test_a_read_only_open_refuses_every_write_and_sees_a_live_ledger(tmp_path):
    """In use by a writer (its -wal file exists): read through the WAL, never written; a ledger that a writer
    opens during an unlocked (immutable) read is refused, not misread."""
    path = str(tmp_path / "ledger.db")
    honest(path)
    with Ledger.open(path) as writer:
        writer.request("p", "s", blocks=["b0"], epsilon=0.05)  # committed in the -wal file, not yet checkpointed
        assert os.path.exists(path + "-wal")
        with Ledger.open(path, read_only=True) as reader:
            assert reader.audit().ok
            assert len(reader.grants("s")) == len(writer.grants("s"))
            with pytest.raises(LedgerError, match="read-only"):
                reader.request("p", "s", blocks=["b0"], epsilon=0.05)
    assert not os.path.exists(path + "-wal")
    reader = Ledger.open(path, read_only=True)  # no -wal: an unlocked, immutable read
    try:
        conn = sqlite3.connect(path)  # a writer opens it meanwhile
        conn.execute("UPDATE blocks SET n_rows = n_rows WHERE id = 'b0'")
        conn.commit()
        with pytest.raises(LedgerError, match="run the audit again"):
            reader.audit()
        conn.close()
    finally:
        reader.close()


def test_a_read_only_open_never_migrates(tmp_path):
    """A ledger of an older schema is refused read-only, naming the fix (`sage ledger upgrade`), its bytes
    unchanged."""
    from sage_tfx.privacy.store import SCHEMA_VERSION

    folder, path, _ = _copy(tmp_path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION - 1),))
    conn.commit()
    conn.close()
    before = _snapshot(folder)
    with pytest.raises(LedgerError, match="upgrade it once .* with: sage ledger upgrade --db"):
        Ledger.open(path, read_only=True)
    assert _snapshot(folder) == before
    with pytest.raises(LedgerError, match="cannot create"):
        Ledger.open(path, create=True, read_only=True)
