"""The head file (``<key file>.head``, 0600, beside the key file; docs/security.md): per ledger, the last log entry
this host committed, its sequence number and keyed chain value (``HeadFile``). A database behind it was truncated;
see ``audit.py``. ``HeadSync`` says when a commit's head is made durable.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import hmac
import json
import logging
import os
import stat
import struct
import sys
import threading
import time
import weakref
from enum import StrEnum
from json.encoder import encode_basestring_ascii as _json_string
from typing import Any

from .errors import LedgerError, LedgerUpgradeNeeded
from .keys import KeyFileError, fsync_dir

ENV_HEAD_SYNC = "SAGE_HEAD_SYNC"
GROUP_INTERVAL_S = 0.05  # HeadSync.GROUP: the head file is made durable at most this long after a commit


class HeadSync(StrEnum):
    """When the head file is made durable after a committed ledger write (``SAGE_HEAD_SYNC``; docs/security.md).

    ``use`` (the default): a grant's head (``Ledger.request``) is written to the head file's third slot
    before the grant returns, without a sync: it is then in the operating system's page cache, which a
    killed process does not lose, and the audit reads it. It is made durable before the grant is first
    USED: ``Ledger.verify``, the door before any block of it is opened and any executor works under it,
    writes the log's last entry into a durable slot (one ``fdatasync``) first; every other write (draws,
    releases, blocks, outcomes, ...) is durable before it returns, as in ``commit``, and so is a grant's
    head once any later write, a ``close`` or a normal exit made the head durable. What a power loss or an
    operating-system crash can lose is the head of grants returned but not yet used: a truncation of
    exactly those grants leaves a ledger that an honest crash just before their commits leaves too, with
    nothing read under them (their blocks were never opened) and their budget back as if never granted.
    Every truncation below an entry anything depended on is caught as in ``commit`` (docs/security.md).
    ``commit``: every write's head durable before the write returns (one ``fdatasync`` per grant besides
    the database's own).
    ``group``: by a background thread, at most ``GROUP_INTERVAL_S`` later, one durable write for every
    commit of that interval (group commit), and at once when the process exits normally or the head is
    read (`HeadFile.get`, so an audit in the same process sees every commit of it). What ``group`` gives
    up: a process killed, or a machine losing power, within that interval leaves the head BEHIND the log by
    the entries of the interval, whether they were used or not. The audit accepts a log ahead of its head
    when the extra entries verify under the key (a writer without the key cannot append them; a note says
    how many), so nothing is reported falsely; but a truncation of exactly those entries by someone with
    write access to the database and not to the key file would then go undetected. The ledger's own
    commits (budget spent, grants) are as durable in every mode.
    """
    USE = "use"
    COMMIT = "commit"
    GROUP = "group"


def head_sync_mode(value: str | None = None) -> HeadSync:
    """``value``, else $SAGE_HEAD_SYNC, else ``use``; KeyFileError naming a bad value and the choices."""
    raw = value if value is not None else os.environ.get(ENV_HEAD_SYNC) or HeadSync.USE
    try:
        return HeadSync(str(raw).strip().lower())
    except ValueError:
        source = "head_sync" if value is not None else ENV_HEAD_SYNC
        raise KeyFileError(f"{source}={raw!r} is not a head-file sync mode: use one of "
                           f"{', '.join(m.value for m in HeadSync)} (docs/security.md)") from None


def warn_head_write(path: str, exc: BaseException) -> None:
    """A head-file write that failed after its commit (or before a grant's use): the commit stands and the grant is
    given; the audit will say the head lags the log (docs/security.md)."""
    logging.getLogger(__name__).warning("sage ledger: could not update head file %s: %s", path, exc)


HEAD_MAGIC = b"SAGEHD02"  # the first bytes of every slot of the two-slot head file (an old head file is JSON: "{")
HEAD_SLOT_BYTES = 4096  # the smallest slot: one page; a bigger head doubles it (HeadFile._replace)
_SLOT_HEADER = struct.Struct(">8sIQI")  # magic, slot size, generation, payload length
_SLOT_DIGEST = 32  # SHA-256 of header + payload, after the payload
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


def _slot_bytes(slot_size, generation, payload):
    """One slot: header, payload (the heads as JSON), SHA-256 of both, zeros up to ``slot_size``."""
    head = _SLOT_HEADER.pack(HEAD_MAGIC, slot_size, generation, len(payload)) + payload
    return (head + hashlib.sha256(head).digest()).ljust(slot_size, b"\0")


def _heads_payload(heads):
    """``json.dumps(heads, sort_keys=True, separators=(",", ":")).encode()``, byte for byte, at a third of its cost.

    An entry of the form this module writes ({"chain": text, "seq": int}, a text ledger id) is formatted directly
    (ASCII-escaped as json.dumps escapes text by default; keys in sorted order); anything else (a form another
    version wrote) goes through json.dumps. tests/privacy/test_head_file_payload.py compares the two on odd ids and entries.
    """
    parts = []
    for ledger_id in sorted(heads):
        entry = heads[ledger_id]
        if (type(ledger_id) is str and type(entry) is dict and len(entry) == 2 and type(entry.get("seq")) is int
                and type(entry.get("chain")) is str):
            parts.append(f'{_json_string(ledger_id)}:{{"chain":{_json_string(entry["chain"])},"seq":{entry["seq"]}}}')
        else:
            parts.append(json.dumps({ledger_id: entry}, sort_keys=True, separators=(",", ":"))[1:-1])
    return ("{" + ",".join(parts) + "}").encode()


def _slot_size_for(payload):
    size = HEAD_SLOT_BYTES
    while size < _SLOT_HEADER.size + len(payload) + _SLOT_DIGEST:
        size *= 2
    return size


def _parse_slot(data, slot_size):
    """(generation, heads) of one slot, or None if it is not intact (torn by a crash mid-write, or never written)."""
    if len(data) < _SLOT_HEADER.size:
        return None
    magic, size, generation, length = _SLOT_HEADER.unpack_from(data)
    end = _SLOT_HEADER.size + length
    if magic != HEAD_MAGIC or size != slot_size or end + _SLOT_DIGEST > slot_size:
        return None
    if not hmac.compare_digest(hashlib.sha256(data[:end]).digest(), data[end:end + _SLOT_DIGEST]):
        return None
    try:
        heads = json.loads(data[_SLOT_HEADER.size:end].decode())
    except ValueError:
        return None
    return (generation, heads) if isinstance(heads, dict) else None


class _Identity:
    """What ``_identify`` tells of a path: ``st_dev``, ``st_ino``, ``st_mode`` and ``st_size``, as ``os.stat``'s."""
    __slots__ = ("st_dev", "st_ino", "st_mode", "st_size")

    def __init__(self, dev, ino, mode, size) -> None:
        self.st_dev, self.st_ino, self.st_mode, self.st_size = dev, ino, mode, size


class _Statx(ctypes.Structure):  # struct statx (linux/stat.h), 256 bytes
    _fields_ = [("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32), ("attributes", ctypes.c_uint64),
                ("nlink", ctypes.c_uint32), ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
                ("mode", ctypes.c_uint16), ("spare0", ctypes.c_uint16), ("ino", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("blocks", ctypes.c_uint64), ("attributes_mask", ctypes.c_uint64),
                ("times", ctypes.c_uint64 * 8), ("rdev_major", ctypes.c_uint32), ("rdev_minor", ctypes.c_uint32),
                ("dev_major", ctypes.c_uint32), ("dev_minor", ctypes.c_uint32), ("spare", ctypes.c_uint64 * 14)]


_STATX_ASK = 0x1 | 0x2 | 0x100 | 0x200  # STATX_TYPE | STATX_MODE | STATX_INO | STATX_SIZE: no timestamp
_AT_FDCWD, _AT_SYMLINK_NOFOLLOW = -100, 0x100
_O_NOATIME = getattr(os, "O_NOATIME", 0)


def _load_statx():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):  # a libc without statx (glibc < 2.28, musl < 1.2.5)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_Statx)]
    fn.restype = ctypes.c_int
    return fn


_statx = _load_statx()


def _identify(path):
    """The file at ``path`` (not following a symbolic link), as ``os.stat`` would give it, WITHOUT asking for its
    timestamps: FileNotFoundError if there is none.

    Why not ``os.stat``: on Linux 6.13 and later (multigrain timestamps) a stat that reports ctime/mtime marks the
    inode so that the next write takes a fine-grained timestamp and dirties the inode, which made every head-file
    write's ``fdatasync`` slower (0.03-0.05 ms of about 0.15 on this machine's ext4: docs/BENCHMARKS.md, the
    ledger's throughput). ``statx`` asking for type, mode, inode and size only does not. Where statx is missing
    (another OS, an old libc or kernel, a sandbox refusing it), ``os.stat``."""
    global _statx
    if _statx is not None:
        buf = _Statx()
        if _statx(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_ASK, ctypes.byref(buf)) == 0:
            return _Identity(os.makedev(buf.dev_major, buf.dev_minor), buf.ino, buf.mode, buf.size)
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
            raise OSError(err, os.strerror(err), path)  # ENOENT gives a FileNotFoundError (PEP 3151)
        _statx = None  # this system cannot: os.stat from now on
    st = os.stat(path, follow_symlinks=False)
    return _Identity(st.st_dev, st.st_ino, st.st_mode, st.st_size)


def _open_head(path):
    """The head file's descriptor, read-write, never through a symbolic link, without access-time updates (each
    would dirty the inode a commit's ``fdatasync`` then waits on) where the OS allows it (the owner's file)."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)
    if _O_NOATIME:
        try:
            return os.open(path, flags | _O_NOATIME)
        except PermissionError:  # O_NOATIME needs the file's owner: open as before
            pass
    return os.open(path, flags)


HEAD_DURABLE_SLOTS = 2  # slots A and B: written in place, each write fdatasync'd before the flock is released
HEAD_LAZY_SLOT = 2  # slot C, after them (HeadSync.USE): a grant's head, written without a sync


def _is_slot_size(size):
    """Slot sizes are HEAD_SLOT_BYTES times a power of two (``_slot_size_for``): so a file of two slots (a power
    of two pages) and one of three (three times one) never have the same length."""
    pages, rest = divmod(size, HEAD_SLOT_BYTES)
    return rest == 0 and pages >= 1 and pages & (pages - 1) == 0


class _HeadState:
    """A head file's content as parsed: the heads (of the newest intact slot), and where the next in-place write goes
    (``slot_size`` None: an old JSON file). ``count``: the file's slots (2, or 3 with slot C); ``durable``: the index
    of the newest intact slot among A and B (None if neither is), whose heads are ``durable_heads`` and generation
    ``durable_generation``: what the file holds durably, where slot C may hold more, not yet synced."""
    __slots__ = ("heads", "slot_size", "generation", "newest", "count", "durable", "durable_heads",
                 "durable_generation")

    def __init__(self, heads, slot_size=None, generation=0, newest=None, count=HEAD_DURABLE_SLOTS, durable=None,
                 durable_heads=None, durable_generation=0) -> None:
        self.heads, self.slot_size, self.generation, self.newest = heads, slot_size, generation, newest
        self.count, self.durable = count, durable
        self.durable_heads = heads if durable_heads is None else durable_heads
        self.durable_generation = generation if durable_heads is None else durable_generation


def _parse_head_file(data, path, old_form=False):
    """A head file's bytes -> _HeadState; KeyFileError if no slot is intact. The JSON form of older versions is read
    only with ``old_form`` (``sage ledger upgrade``, which rewrites it: ``HeadFile.upgrade_form``); otherwise it is
    refused with ``LedgerUpgradeNeeded`` naming the command."""
    if data[:1] == b"{":  # written by sage before the two-slot form: one JSON map, replaced atomically
        if not old_form:
            raise LedgerUpgradeNeeded(
                f"head file {path} is in the JSON form of an older sage-tfx: nothing was written; upgrade it once "
                f"with: sage ledger upgrade --db LEDGER --key-file {path.removesuffix('.head')} (its ledger's "
                "location), then retry")
        try:
            heads = json.loads(data.decode())
            if not isinstance(heads, dict):
                raise ValueError("not a map")
        except ValueError:
            raise KeyFileError(f"head file {path} is malformed (not the JSON sage writes)") from None
        return _HeadState(heads)
    slots, slot_size, count = [], None, HEAD_DURABLE_SLOTS
    for count in (HEAD_DURABLE_SLOTS, HEAD_DURABLE_SLOTS + 1):  # A and B; or A, B and C (HeadSync.USE)
        slot_size = len(data) // count
        if len(data) == count * slot_size and _is_slot_size(slot_size):
            slots = [(_parse_slot(data[i * slot_size:(i + 1) * slot_size], slot_size), i) for i in range(count)]
            slots = [(slot[0], i, slot[1]) for slot, i in slots if slot is not None]
            break
    if not slots:
        raise KeyFileError(f"head file {path} is malformed ({len(data)} bytes and no intact slot: not a head file "
                           "sage writes); restore it from backup, or move it away and audit (the audit will say the "
                           "ledger has no head record)")
    generation, newest, heads = max(slots)
    durable = [slot for slot in slots if slot[1] < HEAD_DURABLE_SLOTS]
    durable_generation, durable_index, durable_heads = max(durable) if durable else (0, None, {})
    return _HeadState(heads, slot_size, generation, newest, count, durable_index, durable_heads, durable_generation)


class _HeadFds:
    """The lock file's and the head file's descriptors a HeadFile keeps open between writes (closed when it goes)."""

    def __init__(self) -> None:
        self.lock = self.data = None
        self.inode = None  # (st_dev, st_ino) of the head file ``data`` is open on
        self.raw = None  # that file's bytes as of this process's last read or write of it
        self.state = None  # ... and as parsed
        self.synced = -1  # the newest generation in that file when this process last made it durable

    def close_data(self):
        if self.data is not None:
            with contextlib.suppress(OSError):
                os.close(self.data)
        self.data = self.inode = self.raw = self.state = None
        self.synced = -1

    def close(self):
        self.close_data()
        if self.lock is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock)
            self.lock = None


class HeadFile:
    """``<key file>.head``: {ledger id: {"seq": n, "chain": value}} of the last entry this host committed.

    Two fixed-size slots (A at offset 0, B at offset ``slot size``; each a header with a generation number and
    the payload's length, the heads as JSON, and a SHA-256 of both). A durable write merges its update into the
    newest intact slot's heads, only forwards (two writers finishing out of order never move it back), and
    overwrites the older of A and B in place (``pwrite``) with the next generation, then ``fdatasync``: one
    durable write per commit, all under an flock of ``<head>.lock``. A reader takes the intact slot with the
    highest generation. A crash mid-write can tear only the slot being written; the other one still holds the
    previous head (the log is then ahead of the head, which the audit accepts when the extra entries verify
    under the key; docs/security.md). A head too big for its slots and a missing file are written whole instead: a
    temporary file with bigger slots fsync'd, renamed, its folder fsync'd. A head file in the JSON form of older
    versions is refused (``LedgerUpgradeNeeded``) but by ``sage ledger upgrade``, which rewrites it
    (``upgrade_form``).

    ``HeadSync.USE`` adds a third slot, C, after B: a grant's head is written there in place WITHOUT a sync
    (``advance(..., until_use=True)``): in the page cache, so a killed process loses nothing and every reader
    sees it, and made durable by the next durable write (which copies the newest heads, C's included, into
    A or B) or by ``make_durable`` before the grant's first use. A and B are never written without a sync, so
    a power loss can lose or tear only C, and the newest intact slot of A and B is still the last durable head.
    A two-slot file gains its third slot on the first such write (written whole, once).

    ``sync`` (a `HeadSync`, default $SAGE_HEAD_SYNC, else ``use``) says when: at each ``advance`` (``commit``;
    ``use`` for every write but a grant's), or by a background thread that writes the newest pending head of
    each ledger at most ``GROUP_INTERVAL_S`` later (``group``: one durable write for all the commits of the
    interval; flushed at normal exit and before every read through ``get``).
    """

    old_form = False  # the JSON form of older versions is read (``sage ledger upgrade`` alone sets it)

    def __init__(self, path: str, sync: str | None = None) -> None:
        self.path = path
        self.sync = head_sync_mode(sync)
        self._pending: dict[str, tuple[int, str]] = {}  # ledger id -> (seq, chain), HeadSync.GROUP only
        self._unsynced = False  # HeadSync.USE: this process wrote slot C since its last durable write
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._io = threading.Lock()  # one writer per HeadFile at a time (its threads share one flock'd descriptor)
        self._fds = _HeadFds()
        self._fds_pid = os.getpid()
        # closed when this HeadFile goes (not at interpreter exit: a group writer may still be writing then)
        weakref.finalize(self, self._fds.close).atexit = False
        if self.sync is not HeadSync.COMMIT:
            _FLUSHED_AT_EXIT.add(self)

    def close(self) -> None:
        """Close the descriptors kept open between writes (the next write opens them again)."""
        with self._io:
            self._fds.close()

    def read(self) -> dict[str, dict[str, Any]]:
        """The recorded heads, {} if the file does not exist; KeyFileError if it is unreadable or too open."""
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise KeyFileError(f"cannot read head file {self.path}: {exc.strerror}") from None
        try:
            self._check_mode(os.fstat(fd))
            data = b""
            while chunk := os.read(fd, 1 << 20):
                data += chunk
        finally:
            os.close(fd)
        return _parse_head_file(data, self.path, self.old_form).heads

    def _check_mode(self, st):
        if st.st_mode & 0o022:
            raise KeyFileError(f"head file {self.path} is writable by group or others: fix: chmod 600 {self.path}")

    def get(self, ledger_id: str) -> dict[str, Any] | None:
        """The recorded head of ``ledger_id`` (None if none), after writing this process's pending heads."""
        self.flush()
        return self.read().get(ledger_id)

    def upgrade_form(self) -> bool:
        """``sage ledger upgrade``: a head file in the JSON form of older versions rewritten in the slot form, every
        ledger's head unchanged (durable: a temporary file fsync'd, renamed). False if it is not in that form."""
        try:
            with open(self.path, "rb") as f:
                if f.read(1) != b"{":
                    return False
        except FileNotFoundError:
            return False
        self.old_form = True
        try:
            self._write({})
        finally:
            self.old_form = False
        return True

    def advance(self, ledger_id: str, seq: int, chain: str, reset: bool = False, until_use: bool = False) -> None:
        """Record (seq, chain) for ``ledger_id`` if ``seq`` is beyond what is recorded (or ``reset``: a new ledger).

        ``commit`` mode, and every ``reset``: durable before this returns. ``use`` mode: durable before this
        returns too, unless ``until_use`` (a grant's commit): then written to slot C unsynced, made durable
        before the grant's first use (``make_durable``). ``group`` mode: queued for the background writer (the
        newest seq per ledger wins), durable within ``GROUP_INTERVAL_S``.
        """
        update = {ledger_id: (int(seq), chain)}
        if reset or self.sync is HeadSync.COMMIT or (self.sync is HeadSync.USE and not until_use):
            self._write(update, reset=reset)
            if self.sync is HeadSync.USE:
                self._unsynced = False  # the durable write carried slot C's heads into A or B
            return
        if self.sync is HeadSync.USE:
            self._unsynced = True
            self._write(update, lazy=True)
            return
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's queue and thread are the parent's
                self._pending, self._thread, self._pid = {}, None, os.getpid()
            current = self._pending.get(ledger_id)
            if current is None or int(seq) > current[0]:
                self._pending[ledger_id] = (int(seq), chain)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=f"sage-head-file {self.path}", daemon=True)
                self._thread.start()
            self._wake.notify()

    def make_durable(self, ledger_id: str, seq: int, chain: str) -> None:
        """Before a grant's first use (``Ledger.verify``, ``use`` mode): the head of ``ledger_id`` durable in slot A
        or B and at least (seq, chain) (the log's last entry, at or after the grant's). Writes the newest heads
        (slot C's, forwards) into a durable slot when those lag; otherwise makes the file durable unless this
        process already did since that slot was written (a writer killed between its write and its sync leaves
        a slot nobody made durable)."""
        self._write({ledger_id: (int(seq), chain)}, sync_unknown=True)

    def flush(self) -> None:
        """Write this process's pending heads now: ``group`` mode's queue, ``use`` mode's unsynced slot C (copied
        into a durable slot); in ``commit`` mode there is nothing to do."""
        if self.sync is HeadSync.USE:
            if self._unsynced:
                self._write({})
                self._unsynced = False
            return
        with self._lock:
            if self._pid != os.getpid():
                self._pending, self._thread, self._pid = {}, None, os.getpid()
            pending, self._pending = self._pending, {}
        if pending:
            self._write(pending)

    def _run(self):
        """The ``group`` writer: wait for a pending head, let the interval's commits gather, write them once."""
        while True:
            with self._lock:
                if not self._pending and not self._wake.wait(timeout=1.0) and not self._pending:
                    self._thread = None  # idle for a second: exit; the next advance starts a new writer
                    return
            time.sleep(GROUP_INTERVAL_S)
            try:
                self.flush()
            except (OSError, LedgerError) as exc:  # as Ledger._advance_head: the commits stand, the head lags
                warn_head_write(self.path, exc)

    def _write(self, updates, reset=False, lazy=False, sync_unknown=False):
        """Merge ``updates`` {ledger id: (seq, chain)} into the file, forwards only (unless ``reset``).

        Durable (the default): into the older of slots A and B, fdatasync'd, when the merged heads (the newest
        slot's, C's included, with ``updates``) are beyond what A and B hold; with ``sync_unknown``, otherwise
        the file is fdatasync'd unless this process did so since A's or B's newest write. ``lazy``: into slot C,
        unsynced (``HeadSync.USE``), when ``updates`` move the newest heads forwards."""

        with self._io:
            fds = self._fds
            if self._fds_pid != os.getpid():  # a forked child shares the parent's descriptions (and flock): its own
                fds.close()
                self._fds_pid = os.getpid()
            if fds.lock is None:
                fds.lock = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
                _keep_open(self)
            fcntl.flock(fds.lock, fcntl.LOCK_EX)
            try:
                state = self._load_locked(fds)
                heads = dict(state.heads)
                changed = False
                for ledger_id, (seq, chain) in updates.items():
                    current = heads.get(ledger_id)
                    if not reset and current is not None and int(current.get("seq", 0)) >= seq:
                        continue
                    heads[ledger_id] = {"seq": int(seq), "chain": chain}
                    changed = True
                old_form = state.slot_size is None and bool(state.heads)  # JSON (upgrade_form): rewritten whole
                if not (changed if lazy else changed or heads != state.durable_heads or old_form):
                    if sync_unknown and state.slot_size is not None and state.durable_generation > fds.synced:
                        _fdatasync(fds.data)  # A's or B's newest was written by a process that did not say it synced
                        fds.synced = state.generation
                    return
                payload = _heads_payload(heads)
                generation = state.generation + 1
                count = HEAD_DURABLE_SLOTS + 1 if lazy else max(state.count, HEAD_DURABLE_SLOTS)
                if state.slot_size is None or _slot_size_for(payload) > state.slot_size or count > state.count:
                    self._replace(fds, max(_slot_size_for(payload), state.slot_size or 0), generation, payload,
                                  heads, count)
                    return
                slot = _slot_bytes(state.slot_size, generation, payload)
                if lazy:  # slot C, in place, no sync: A and B keep the last durable head
                    target, durable, durable_heads, durable_generation = (HEAD_LAZY_SLOT, state.durable,
                                                                          state.durable_heads, state.durable_generation)
                else:  # the older of A and B: the newest intact one of them is never touched
                    target = 1 - state.durable if state.durable is not None else 0
                    durable, durable_heads, durable_generation = target, heads, generation
                offset = target * state.slot_size
                os.pwrite(fds.data, slot, offset)
                if not lazy:
                    _fdatasync(fds.data)  # the file's size never changes here: its data alone is made durable
                    fds.synced = generation
                fds.raw = fds.raw[:offset] + slot + fds.raw[offset + state.slot_size:]
                fds.state = _HeadState(heads, state.slot_size, generation, target, state.count, durable,
                                       durable_heads, durable_generation)
            except BaseException:
                fds.close_data()  # re-read from the file next time
                raise
            finally:
                fcntl.flock(fds.lock, fcntl.LOCK_UN)

    def _load_locked(self, fds):
        """The file's current content (under the flock): parsed again only if its bytes changed since we saw them."""
        try:
            st = _identify(self.path)
        except FileNotFoundError:
            fds.close_data()
            return _HeadState({})
        if stat.S_ISLNK(st.st_mode):
            raise KeyFileError(f"cannot open head file {self.path}: it is a symbolic link (give the real file)")
        self._check_mode(st)
        if fds.data is None or fds.inode != (st.st_dev, st.st_ino):  # replaced by a writer (bigger slots, migration)
            fds.close_data()
            try:
                fds.data = _open_head(self.path)
            except OSError as exc:
                raise KeyFileError(f"cannot open head file {self.path}: {exc.strerror}") from None
            st = os.fstat(fds.data)
            self._check_mode(st)
            fds.inode = (st.st_dev, st.st_ino)
        raw = os.pread(fds.data, max(st.st_size, 0) + 1, 0)
        if raw != fds.raw or fds.state is None:
            fds.raw, fds.state = raw, _parse_head_file(raw, self.path, self.old_form)
        return fds.state

    def _replace(self, fds, slot_size, generation, payload, heads, count=HEAD_DURABLE_SLOTS):
        """Write the file anew (slot A this head, the other ``count - 1`` slots empty): temporary file fsync'd,
        renamed, folder fsync'd."""
        folder = os.path.dirname(self.path) or "."
        tmp = f"{self.path}.tmp{os.getpid()}.{threading.get_ident()}"
        data = _slot_bytes(slot_size, generation, payload) + bytes(slot_size * (count - 1))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(folder)
        fds.close_data()
        fds.data = _open_head(self.path)
        st = os.fstat(fds.data)
        fds.inode, fds.raw, fds.synced = (st.st_dev, st.st_ino), data, generation
        fds.state = _HeadState(heads, slot_size, generation, 0, count, 0, heads, generation)


MAX_OPEN_HEAD_FILES = 32  # HeadFiles of one process keeping descriptors open; beyond it the oldest close theirs
_OPEN_HEADS: list = []  # weak references to them, oldest first
_OPEN_HEADS_LOCK = threading.Lock()


def _keep_open(head):
    """Note that ``head`` keeps descriptors open; close those of the oldest beyond MAX_OPEN_HEAD_FILES.

    A Ledger that is closed but not yet collected still holds its HeadFile: without this bound a process opening
    ledgers in a loop would hold two descriptors per ledger until the garbage collector ran. A HeadFile whose
    descriptors were closed opens them again at its next write (one open: the head is re-read under the flock).
    """
    with _OPEN_HEADS_LOCK:
        _OPEN_HEADS[:] = [ref for ref in _OPEN_HEADS if ref() is not None and ref() is not head]
        _OPEN_HEADS.append(weakref.ref(head))
        excess, _OPEN_HEADS[:] = _OPEN_HEADS[:-MAX_OPEN_HEAD_FILES], _OPEN_HEADS[-MAX_OPEN_HEAD_FILES:]
    for ref in excess:
        other = ref()
        if other is not None and other is not head and other._io.acquire(blocking=False):  # busy: left open
            try:
                other._fds.close()
            finally:
                other._io.release()


_FLUSHED_AT_EXIT: weakref.WeakSet = weakref.WeakSet()  # the live HeadSync.GROUP and .USE head files of this process


@atexit.register
def _flush_at_exit():
    for head in list(_FLUSHED_AT_EXIT):
        try:
            head.flush()
        except (OSError, LedgerError) as exc:
            warn_head_write(head.path, exc)
