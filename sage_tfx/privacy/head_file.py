"""The head file (``<key file>.head``, 0600, beside the key file; docs/security.md): per ledger, the last log entry
this host committed, its sequence number and keyed chain value (``HeadFile``). A database behind it was truncated;
see ``audit.py``. ``HeadSync`` says when a commit's head is made durable.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import stat
import threading
import time
import weakref
from enum import StrEnum
from typing import Any

from .errors import LedgerError
from .head_slots import (  # noqa: F401 (HEAD_MAGIC, HEAD_SLOT_BYTES: re-exported)
    HEAD_DURABLE_SLOTS,
    HEAD_LAZY_SLOT,
    HEAD_MAGIC,
    HEAD_SLOT_BYTES,
    _heads_payload,
    _HeadState,
    _parse_head_file,
    _slot_bytes,
    _slot_size_for,
)
from .head_stat import _identify, _open_head
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
        raise KeyFileError(
            f"{source}={raw!r} is not a head-file sync mode: use one of "
            f"{', '.join(m.value for m in HeadSync)} (docs/security.md)"
        ) from None


def warn_head_write(path: str, exc: BaseException) -> None:
    """A head-file write that failed after its commit (or before a grant's use): the commit stands and the grant is
    given; the audit will say the head lags the log (docs/security.md)."""
    logging.getLogger(__name__).warning("sage ledger: could not update head file %s: %s", path, exc)


_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


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
                    self._replace(
                        fds, max(_slot_size_for(payload), state.slot_size or 0), generation, payload, heads, count
                    )
                    return
                slot = _slot_bytes(state.slot_size, generation, payload)
                if lazy:  # slot C, in place, no sync: A and B keep the last durable head
                    target, durable, durable_heads, durable_generation = (
                        HEAD_LAZY_SLOT,
                        state.durable,
                        state.durable_heads,
                        state.durable_generation,
                    )
                else:  # the older of A and B: the newest intact one of them is never touched
                    target = 1 - state.durable if state.durable is not None else 0
                    durable, durable_heads, durable_generation = target, heads, generation
                offset = target * state.slot_size
                os.pwrite(fds.data, slot, offset)
                if not lazy:
                    _fdatasync(fds.data)  # the file's size never changes here: its data alone is made durable
                    fds.synced = generation
                fds.raw = fds.raw[:offset] + slot + fds.raw[offset + state.slot_size :]
                fds.state = _HeadState(
                    heads, state.slot_size, generation, target, state.count, durable, durable_heads, durable_generation
                )
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
