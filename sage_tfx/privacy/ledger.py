"""The privacy ledger: Sage's block-level access control (paper §3.2-3.3, SAGE_SPEC.md §2-3).

One ledger holds streams. A stream has a global (epsilon, delta) guarantee and a
growing set of disjoint blocks; each block carries a budget filter
(``filters.py``). A pipeline reads data only through a *grant*: ``request``
checks every block of the set and charges all of them in one transaction, all
or nothing, and returns a signed ``Grant`` that data readers verify before they
read a single record. Nothing un-charges a grant. A block whose remaining
budget cannot serve even a ``min_epsilon`` query is retired and never offered
again; new blocks arrive with a fresh budget, so the stream holds its one
guarantee forever.

Allocation across pipelines (paper §3.3, "Block/Conserve" and "Block/Aggressive"):
pipelines ``register`` as waiting; each new block's budget is split evenly
among the pipelines waiting at that moment and reserved for them; a grant draws
on the pipeline's own reservation first, then on the unreserved pool; when a
pipeline ``finish``es, its unused reservation is split among those still
waiting. The stream's policy tells the iterator how to spend a reservation
(the policy's ``plan_epsilon``, ``allocation.get_policy``): conserve starts small and doubles, aggressive takes it all.
What a pipeline could be granted now is ``available_epsilon`` (on a set of
blocks) or ``available_per_block`` (on each block alone, all in one read: how the
iterator chooses blocks); both are advisory, ``request`` decides.

Under a queued policy (DPF-N, DPF-T, DPack: docs/scheduling_policies.md) there are no reservations: a
request the scheduler does not grant at once is recorded as the pipeline's demand, every write that is a
scheduling point runs ``allocation.QueuedAllocation`` over the pending demands, and an admitted demand is
charged at admission and handed to the pipeline's next identical request.

This module is the ``Ledger`` facade: each public method opens one transaction of the store and runs the
steps of the modules below it, which import neither this module nor the audit: ``streams.py`` (a stream's
row, its checks, the grant floor), ``blocks.py`` (a new block's checks and registration, block and
reservation reads), ``charges.py`` (a grant's check and charge under each policy, the queued policies'
demands and scheduling points, a finishing pipeline's reservation moves), ``grants.py`` (``Grant``,
``Release``, signing, a stage's release allowance), ``session.py`` (the key file's source, pipeline claims,
the key migration); every SQL statement is in ``store/sql.py``. The names tests and users import from here
(``Grant``, ``Block``, ``Stream``, ``Release``, ``POLICIES``, ``OUTCOMES``, ...) are re-exported.

Every change is appended to a keyed, hash-chained audit log in the same transaction;
``audit()`` recomputes every table from the log alone.

Keys (docs/security.md): the ledger holds no key. ``Ledger.open(location, key_file=...)`` loads the
master key from a key file outside the database (``keys.py``: ``key_file=``, else $SAGE_KEY_FILE, else
``<sqlite path>.key``; PostgreSQL needs one explicitly); grants are signed with its derived signing key,
release seeds come from its noise key, and the log is chained with its audit key. After every committed
write the log's head (last sequence number and chain value) is written to the head file beside the key
file, outside the database: durable before the write returns, except a grant's (``HeadSync.USE``, the
default), durable before the grant's first use (``verify``). Every open checks the database against that head
and the ledger id its first keyed log entry binds, before any write (``anchor.py``: a rollback, a cut tail, a
changed id or a missing head raises ``LedgerRollback``). A ledger of an older version is refused
(``LedgerUpgradeNeeded``) until ``Ledger.upgrade`` (``sage ledger upgrade``, ``migrations.py``) migrates it.
"""
from __future__ import annotations

import collections.abc
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import anchor as _anchor
from . import blocks as _blocks
from . import charges as _charges
from . import draws as _draws
from . import migrations as _migrations
from .allocation import get_policy
from .audit import audit_ledger
from .blocks import Block  # noqa: F401 (re-exported)
from .budget_arrays import bisect as _bisect
from .chain import GENESIS, TRUSTED_READ, canonical, chain_hash  # noqa: F401 (chain_hash: re-exported)
from .checks import check_name as _check_name
from .checks import finite as _finite
from .errors import (
    BlockRetired,
    BudgetRefused,
    GrantError,
    LedgerError,
    LedgerRollback,
    LedgerUpgradeNeeded,
    PipelineBusy,
    UnknownBlock,
)
from .grants import (
    Grant,
    Release,
    check_grant_copy,
    grant_terms,
    older_rdp,
    signature_ok,
    stage_allowance,
    stage_cap,
)
from .head_file import HeadFile, HeadSync, head_sync_mode, warn_head_write
from .keys import KeyFileError, resolve_key_path
from .session import KeySource as _KeySource
from .session import PipelineClaim, migrate_secret, migration_entry
from .split import STAGES
from .store import check_location, open_store, sql
from .store.base import upgrade_text
from .streams import (  # noqa: F401 (DEFAULT_MIN_GRANT_EPSILON: re-exported)
    DEFAULT_MAX_STREAM_EPSILON,
    DEFAULT_MIN_GRANT_EPSILON,
    Stream,  # noqa: F401 (re-exported)
    check_minimum,
    check_stream_args,
    check_unit,
    check_unit_charge,
    insert_stream,
    parsed_stream,
    read_stream,
    stream_filter,
    stream_status,
)
from .vocabulary import (
    GRANT_OUTCOMES,
    PIPELINE_OUTCOMES,
    Accounting,
    BlockState,
    Composition,
    Outcome,
    PipelineState,
    Policy,
)
from .write import Charge, StreamWrite

if TYPE_CHECKING:
    from .keys import KeyRing
    from .split import BudgetSplit
    from .store import Tx

POLICIES = tuple(Policy)  # members equal their stored strings: "conserve", "aggressive", "dpf-n", ...
OUTCOMES = PIPELINE_OUTCOMES  # "ACCEPT", "REJECT", "TIMEOUT"


def _recorded_grant(grant_id, row):
    """The Grant of a ``sql.GRANT_BODY`` row; GrantError if there is none (never charged by this ledger)."""
    if row is None:
        raise GrantError(f"grant {grant_id!r} is unknown to this ledger")
    return Grant.from_row(*row)


class Ledger:
    """Open with ``Ledger.open(path_or_url, key_file=None)``; ``create=True`` makes a new ledger if none exists.

    Argument order: the stream comes first in the stream-scoped calls (``register(stream, pipeline)``,
    ``finish(stream, pipeline, outcome)``, ``block(stream, block_id)``, ``history(stream, pipeline)``), the
    pipeline first in the pipeline's budget calls (``request(pipeline, stream, ...)``,
    ``available_epsilon(pipeline, stream, blocks)``)."""

    def __init__(self, store, keys, head_sync=None, check_head=True, read_only=False, upgrade=False) -> None:
        """``keys``: the ledger's ``_KeySource`` (use ``Ledger.open``)."""
        self._read_only = read_only
        self._head_sync = head_sync_mode(head_sync)
        self._store = store
        self._claims: list[PipelineClaim] = []  # PipelineClaims of this process (Ledger.claim), released by close()
        self._key_source = keys
        self._legacy_grants: frozenset[str] = frozenset()
        self.migrated_secret = False  # this open (``migrations.upgrade``) moved an older ledger's secret out
        self._anchored = False  # the head file may record this ledger's writes (set by _check_anchor)
        self.anchor_problem = None  # what _check_anchor found (check_head=False): then nothing is written
        with store.transaction(write=False) as tx:
            meta = dict(tx.all(sql.META_ALL))
        if "secret" in meta and "key_id" not in meta:
            if read_only or not upgrade:
                raise LedgerUpgradeNeeded(upgrade_text(store.display, "<9 (its secret is still in the database)"))
            self._keys = self._migrate_secret(meta["secret"])
            self.migrated_secret = True
            with store.transaction(write=False) as tx:
                meta = dict(tx.all(sql.META_ALL))
        else:
            self._keys = keys.keyring()
        if meta.get("key_id") != self._keys.key_id:
            raise KeyFileError(
                f"key file {keys.path} is not the key of ledger {store.display} (key id {self._keys.key_id}, the "
                f"ledger's {meta.get('key_id')}): give this ledger's key file (--key-file PATH or SAGE_KEY_FILE=PATH)")
        self._head = HeadFile(self._keys.head_path, self._head_sync)
        self._head.old_form = upgrade  # its JSON form read, to be rewritten (``migrations.py``)
        store.after_commit = self._advance_head
        self._check_anchor(meta.get("ledger_id") or "", keys.created_ledger, check_head)
        if self._keys.legacy_secret is not None:
            self._legacy_grants = frozenset(self._migration_entry().get("legacy_grants", ()))

    def _check_anchor(self, meta_id, created, check_head):
        """The database against the anchor outside it (``anchor.py``), before any write: the id its keyed ``ledger``
        entry binds, and this host's head. A mismatch raises ``LedgerRollback`` naming what was found and the fix;
        with ``check_head=False`` (the audit, ``reanchor``) it is kept in ``anchor_problem`` instead, and this
        ledger then never writes the head file (a missing head is never recreated) nor binds its id. A ledger
        that passes and has no ``ledger`` entry yet (new, or from an older version) gets it now."""
        self._ledger_id, bound, problem = _anchor.bound_id(self._store, self._keys, meta_id)
        if created:
            self._advance_head((0, GENESIS), reset=True)
        problem = problem or _anchor.head_problem(self._store, self._head.get(self._ledger_id), self._ledger_id,
                                                  self._head.path)
        if problem is None and not bound:
            legacy_until = (self._migration_entry().get("legacy_chain_until", 0)
                            if self._keys.legacy_secret is not None else 0)
            problem = _anchor.unbound_log_problem(self._store, self._keys, legacy_until)
        self.anchor_problem = problem
        if problem is not None:
            if check_head:
                raise LedgerRollback(f"ledger {self._store.display} does not match its anchor: {problem}. "
                                     "Nothing was written. Fix: "
                                     f"{_anchor.fix_text(self._store.display, self._key_source.path)}")
            return
        self._anchored = not self._read_only  # a read-only ledger never writes the head file
        if not bound and not self._read_only:
            _anchor.bind_ledger_id(self._store, self._keys, self._ledger_id, self._log)

    @classmethod
    def reanchor(cls, location: str, reason: str, key_file: str | None = None) -> Ledger:
        """Re-anchor this host's head on the ledger as it is now, on purpose (``anchor.reanchor``): a known-good
        copy restored deliberately, or a host joining a PostgreSQL ledger without a copy of a head file. The keyed
        ``anchor`` entry records ``reason``, the host and the head it replaces; the head file is reset to it.
        Returns the open ledger (audit it: ``ledger.audit()``)."""
        ledger = cls.open(location, key_file=key_file, head_sync=HeadSync.COMMIT, check_head=False)
        try:
            head = ledger._head.get(ledger._ledger_id)
            with ledger._store.transaction(write=False) as tx:
                meta_id = dict(tx.all(sql.META_ALL)).get("ledger_id") or ""
            entry = _anchor.reanchor(ledger._store, ledger._keys, ledger._ledger_id, meta_id, head, reason,
                                     socket.gethostname(), ledger._append)
            ledger._head.advance(ledger._ledger_id, entry[0], entry[1], reset=True)
            ledger._anchored, ledger.anchor_problem = True, None
        except BaseException:
            ledger.close()
            raise
        return ledger

    @classmethod
    def open(cls, location: str, create: bool = False, key_file: str | None = None, *,
             head_sync: HeadSync | str | None = None, check_head: bool = True, read_only: bool = False,
             upgrade: bool = False) -> Ledger:
        """Open the ledger at ``location`` with its key file (``keys.resolve_key_path``: ``key_file``, else
        $SAGE_KEY_FILE, else ``<sqlite path>.key``). ``create=True`` creates the ledger, and its key file
        (mode 0600) if that does not exist yet. ``head_sync`` (``head_file.HeadSync``: ``use``, ``commit`` or
        ``group``; default $SAGE_HEAD_SYNC, else ``use``) says when the audit's head file is made durable
        (docs/security.md). The database is checked against the head file before any write
        (``LedgerRollback`` if it was rolled back, cut, re-identified or replaced); ``check_head=False``
        (the audit) records the problem in ``anchor_problem`` instead and opens a ledger that never writes the
        head file. ``read_only=True`` (``sage ledger audit``: a read-only copy or mount, a full disk) implies
        ``check_head=False`` and writes no byte anywhere: the database is opened read-only (``store/sqlite.py``),
        never migrated, its id never bound, the head file only read; every write is refused. A ledger of an older
        version is refused (``LedgerUpgradeNeeded``) unless ``upgrade`` (``migrations.upgrade`` alone gives it)."""
        if read_only and create:
            raise LedgerError("a read-only open cannot create a ledger: give create=False")
        check_head = check_head and not read_only
        location = check_location(location)  # never a password in a URL: before anything is created
        head_sync = head_sync_mode(head_sync)  # a bad mode is refused before anything is created
        try:
            keys = _KeySource(resolve_key_path(location, key_file), create)
        except KeyFileError as exc:
            if create:
                raise  # before anything is created
            keys = _KeySource(None, create, error=exc)  # PostgreSQL: a connection error is named first
        if keys.path is None:
            pass
        elif os.path.exists(keys.path):
            keys.keyring()  # a key file that is too open or malformed is refused before anything is created
        elif create and not os.path.isdir(os.path.dirname(keys.path)):
            raise KeyFileError(f"cannot create key file {keys.path}: folder {os.path.dirname(keys.path)} does not "
                               "exist (create it, mode 0700, or give another --key-file)")
        try:
            store = open_store(location, create=create, on_create=keys.new_ledger_meta, read_only=read_only,
                               upgrade=upgrade)
        except BaseException:
            keys.undo_created()
            raise
        try:
            return cls(store, keys, head_sync, check_head, read_only, upgrade)
        except BaseException:
            store.close()
            raise

    @classmethod
    def upgrade(cls, location: str, key_file: str | None = None,
                progress: Callable[[str], None] = print) -> int:
        """``sage ledger upgrade``: bring a ledger written by an older sage-tfx to this version, keyed and idempotent
        (``migrations.py``, the one home of every migration); ``progress(text)`` hears each step. Returns how many
        steps ran (0: already up to date, nothing written)."""
        with cls.open(location, key_file=key_file, upgrade=True) as ledger:
            return _migrations.upgrade(ledger, ledger._log, location, progress)

    @property
    def keyring(self) -> KeyRing:
        """The ledger's ``KeyRing`` (derived keys; ``block_key(stream, block)``). TRUSTED CODE ONLY."""
        return self._keys

    @property
    def key_file(self) -> str:
        return self._keys.path

    def _advance_head(self, head, until_use=False, reset=False):
        """After a committed write: record its last log entry in the head file (outside the database); ``until_use``
        (a grant's write, ``HeadSync.USE``): durable before the grant's first use (``verify``), not before now."""
        seq, chain = head
        if not (self._anchored or reset):  # a failed anchor check: never a fresh head for a used ledger
            return
        try:
            self._head.advance(self._ledger_id, seq, chain, reset=reset, until_use=until_use)
        except (OSError, LedgerError) as exc:  # the write is committed: the audit will say the head is behind
            warn_head_write(self._head.path, exc)

    def _migrate_secret(self, secret):
        """Move an older ledger's ``meta.secret`` out of the database (``session.migrate_secret``); the ledger id
        and head file it records are this ledger's from the migration's commit on. Returns the new KeyRing."""
        def adopt(keys, ledger_id):
            self._keys, self._ledger_id = keys, ledger_id
            self._head = HeadFile(keys.head_path, self._head_sync)
            self._anchored = True  # the migration's commit is where an older ledger's head begins
            self._store.after_commit = self._advance_head

        return migrate_secret(self._store, self._key_source, secret, self._log, adopt)

    def _migration_entry(self):
        """The body of the keyed ``keys`` entry a migration wrote ({} if none, or if it does not verify)."""
        return migration_entry(self._store, self._keys)

    @property
    def backend(self) -> str:
        return self._store.kind

    def close(self) -> None:
        for claim in getattr(self, "_claims", ()):
            claim.release()
        try:
            if hasattr(self, "_head"):
                self._head.flush()  # GROUP and USE: this ledger's last head made durable now (commit: nothing)
                self._head.close()  # the descriptors kept open between writes
        except (OSError, LedgerError) as exc:  # as _advance_head: the commits stand, the audit says the head lags
            warn_head_write(self._head.path, exc)
        finally:
            self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------- streams
    check_stream_args = staticmethod(check_stream_args)  # create_stream's checks alone (streams.py)

    def create_stream(self, name: str, epsilon: float, delta: float, *, accounting: Accounting | str = Accounting.BASIC,
                      orders: Sequence[float] | None = None, policy: Policy | str = Policy.CONSERVE,
                      min_epsilon: float | None = None, max_epsilon: float = DEFAULT_MAX_STREAM_EPSILON,
                      min_grant_epsilon: float | None = None, policy_params: dict[str, Any] | None = None,
                      query_delta_share: float | None = None, privacy_unit: str | None = None,
                      max_rows_per_unit: int | None = None) -> Stream:
        """Create a stream with a global (epsilon, delta) guarantee over all its blocks, forever.

        ``policy`` (``Policy``) decides who may spend a block's budget and when (docs/scheduling_policies.md);
        a queued one (dpf-n, dpf-t, dpack) takes ``policy_params`` (``{"n": 50}``, ``{"lifetime": 3600.0}``;
        defaults otherwise), stored with the stream in full so every process applies the same rule.

        ``epsilon`` may be at most ``max_epsilon`` (default 10, ``DEFAULT_MAX_STREAM_EPSILON``);
        ``min_epsilon`` (default epsilon / 100) is the query a block must still admit to stay active;
        every grant must charge at least ``min_grant_epsilon`` (default: 0.001, or ``min_epsilon`` if smaller).
        An ``rdp`` stream splits its delta once, here: ``query_delta_share`` of it (default 0.5; 0 for a stream
        charged curves only) for the approximate-DP queries' deltas, the rest for converting the Rényi sum
        (``filters.RdpFilter``, docs/block_composition.md).
        ``privacy_unit`` (a column of the records) and ``max_rows_per_unit`` K declare whom the guarantee protects:
        every row of a unit, at most K kept per block (``streams.check_unit``; default: unit = row).
        """
        filt, min_epsilon, min_grant = self.check_stream_args(name, epsilon, delta, accounting, orders, policy,
                                                              min_epsilon, max_epsilon, min_grant_epsilon,
                                                              policy_params, query_delta_share, privacy_unit,
                                                              max_rows_per_unit)
        now = time.time()
        with self._store.transaction() as tx:
            insert_stream(tx, self._log, name, accounting, filt, policy, get_policy(policy, policy_params),
                          min_epsilon, min_grant, now, check_unit(privacy_unit, max_rows_per_unit))
        return self.stream(name)

    def stream(self, name: str, tx: Tx | None = None) -> Stream:
        if tx is None:
            with self._store.transaction(write=False) as tx:
                return self.stream(name, tx)
        return read_stream(tx, name)

    def streams(self) -> list[Stream]:
        with self._store.transaction(write=False) as tx:
            return [self.stream(r[0], tx) for r in tx.all(sql.STREAM_NAMES)]

    # ------------------------------------------------------------------ blocks
    def add_block(self, stream: str, block_id: str, *, start: float | None = None, end: float | None = None,
                  shard: int | None = None, rows: int | None = None, created: float | None = None,
                  digest: str | None = None, allow_duplicate_of: Iterable[str] = ()) -> Block:
        """Add a fresh block (zero loss). Its budget is split among the pipelines waiting now.

        ``start``/``end`` (unix seconds) key a time window [start, end); ``shard``
        keys a user shard. ``rows`` is the exact row count, kept inside the ledger;
        ``digest`` the content digest of its records (ingest's), see ``add_blocks``.
        """
        self.add_blocks(stream, [dict(id=block_id, start=start, end=end, shard=shard, rows=rows, created=created,
                                      digest=digest)], allow_duplicate_of=allow_duplicate_of)
        return self.block(stream, block_id)

    def add_blocks(self, stream: str, blocks: Iterable[Mapping[str, Any]], *,
                   allow_duplicate_of: Iterable[str] = ()) -> None:
        """Add many fresh blocks in ONE transaction: all are added, or none (e.g. one ingest's blocks).

        ``blocks`` are dicts with ``id`` and the keyword arguments of ``add_block``. A block whose
        ``digest`` another stream already registered is refused (DuplicateContent: the same records
        would get a fresh budget here), unless that stream is in ``allow_duplicate_of``.
        """
        checked = _blocks.check_new_blocks(blocks)
        allowed = set(allow_duplicate_of or ())
        with self._store.transaction() as tx:
            s = self.stream(stream, tx)
            filt = s.filter()
            _blocks.check_new_ids(tx, stream, checked, allowed)
            waiting = [r[0] for r in tx.all(sql.PIPELINE_WAITING, (stream,))]
            share = s.rules().new_block_shares(filt.capacity, waiting)  # the same for every new block
            write = StreamWrite(tx, self._log, self._keys, s, filt)
            for block in checked:
                _blocks.insert_block(write, block, waiting=waiting, share=share)
            if s.rules().queued:  # a scheduling point (DPF-T: time has passed)
                _charges.schedule(write, time.time())

    def digest_owners(self, digests: Iterable[str], exclude_stream: str | None = None) -> dict[str, list[tuple[str, str]]]:
        """{digest: [(stream, block id), ...]} for the given content digests registered in streams other than
        ``exclude_stream``. TRUSTED CODE ONLY (ingest)."""
        with self._store.transaction(write=False) as tx:
            return _blocks.digest_owners(tx, digests, exclude_stream)

    def block(self, stream: str, block_id: str) -> Block:
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = _blocks.read_blocks(tx, stream, [block_id])
        if not rows:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return rows[block_id]

    def blocks(self, stream: str, state: BlockState | str | None = None) -> list[Block]:
        """The stream's blocks in key order (time or shard), optionally only 'active' or 'retired'."""
        if state is not None and state not in tuple(BlockState):
            raise LedgerError(f"block state {state!r} is unknown: use 'active' or 'retired'")
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = tx.all(sql.BLOCK_ROWS_IN_STATE, (stream, state)) if state else tx.all(sql.BLOCK_ROWS, (stream,))
        return _blocks.block_rows(stream, rows)

    def private_row_count(self, stream: str, block_id: str) -> int | None:
        """The exact row count of a block. TRUSTED CODE ONLY (ingest, data readers' sanity checks).

        Never show this to a pipeline: what a pipeline learns about its data size
        must be the public block count or a DP count charged to its grant.
        """
        with self._store.transaction(write=False) as tx:
            row = tx.one(sql.BLOCK_N_ROWS, (stream, block_id))
        if row is None:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return row[0]

    def block_digest(self, stream: str, block_id: str) -> str | None:
        """The content digest registered for a block at ingest (None for blocks registered without one).

        TRUSTED CODE ONLY (the block readers check the block files against it, docs/security.md).
        """
        with self._store.transaction(write=False) as tx:
            row = tx.one(sql.BLOCK_DIGEST, (stream, block_id))
        if row is None:
            raise UnknownBlock(f"block {block_id!r} does not exist in stream {stream!r}")
        return row[0]

    def record_trusted_read(self, stream: str, blocks: Sequence[str], purpose: str) -> None:
        """Log, in the keyed chain and committed before it returns, that TRUSTED code is about to decrypt
        ``blocks`` of ``stream`` outside any grant (no charge), and why: a ``trusted_read`` entry naming the blocks
        and ``purpose`` (a non-empty text), which ``sage ledger audit`` lists. The block doors call it before they
        derive a key (``ingest.access.trusted_block_keys``). LedgerError / UnknownBlock, nothing written, for an
        empty purpose or a block the stream does not hold."""
        if not isinstance(purpose, str) or not purpose.strip():
            raise LedgerError(f"purpose {purpose!r} must say why trusted code decrypts blocks outside a grant "
                              "(e.g. 'non-private baseline'): it is written to the audit log")
        if isinstance(blocks, str) or not isinstance(blocks, collections.abc.Iterable):
            raise LedgerError(f"blocks {blocks!r} is not a list of block ids: give the blocks it decrypts")
        ids = [str(b) for b in blocks]
        if not ids:
            raise LedgerError("a trusted read names no block: give the blocks it decrypts")
        with self._store.transaction() as tx:
            self.stream(stream, tx)
            missing = sorted(set(ids) - set(_blocks.read_blocks(tx, stream, ids)))
            if missing:
                raise UnknownBlock(f"block(s) {', '.join(map(repr, missing))} do not exist in stream {stream!r}: "
                                   "no key for them")
            self._log(tx, TRUSTED_READ, {"stream": stream, "blocks": ids, "purpose": purpose.strip()})

    def trusted_reads(self, stream: str) -> list[dict[str, Any]]:
        """The ``trusted_read`` log entries of ``stream`` (bodies: stream, blocks, purpose), oldest first."""
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            bodies = [json.loads(r[0]) for r in tx.all(sql.LOG_TRUSTED_READS)]
        return [b for b in bodies if b.get("stream") == stream]

    def window_blocks(self, stream: str, start: float, end: float) -> list[str]:
        """Active blocks whose time window lies inside [start, end)."""
        start, end = _finite(start, "window start", False), _finite(end, "window end", False)
        if not start < end:
            raise LedgerError(f"window [{start}, {end}) is empty: start must be before end")
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            ids = [r[0] for r in tx.all(sql.BLOCK_WINDOW_IDS, (stream, start, end))]
        if not ids:
            raise LedgerError(f"window [{start}, {end}) holds no active blocks of stream {stream!r}")
        return ids

    # --------------------------------------------------------------- pipelines
    def register(self, stream: str, pipeline: str) -> None:
        """Mark a pipeline as waiting: it gets an even share of every block that arrives from now on."""
        _check_name(pipeline, "pipeline name")
        with self._store.transaction() as tx:
            s = self.stream(stream, tx)
            row = tx.one(sql.PIPELINE_STATE_OUTCOME, (stream, pipeline))
            if row is not None:
                if row[0] == PipelineState.WAITING:
                    return
                raise LedgerError(f"pipeline {pipeline!r} already finished on stream {stream!r} with {row[1]}")
            now = time.time()
            tx.run(sql.PIPELINE_INSERT, (stream, pipeline, now))
            self._log(tx, "register", {"stream": stream, "pipeline": pipeline}, at=now)
            if s.rules().queued:  # an arrival: one more share of every live block unlocks (DPF-N, DPack)
                tx.run(sql.BLOCK_COUNT_ARRIVAL, (stream,))
                self._schedule(tx, s, s.filter(), time.time())

    def claim(self, stream: str, pipelines: Iterable[str]) -> PipelineClaim:
        """Claim ``pipelines`` of ``stream`` for this process while it runs them; return a ``PipelineClaim``.

        One process runs a pipeline name at a time: two `sage serve`/`sage run` processes (on one host or on
        several sharing a PostgreSQL ledger) running the same name would charge grants for one pipeline's
        iterations side by side and resume each other's unfinished grant (docs/scale_out.md, "Several hosts
        on one PostgreSQL ledger"). A claim is a lock the holder's exit drops (a PostgreSQL session advisory
        lock, or an flock beside an SQLite ledger), so a killed run's name is free for its restart. Raises
        PipelineBusy, naming the pipeline and who holds it, if another process holds any of them (then none is
        claimed). The claim holds until ``release()`` (or ``with``), the ledger's ``close()`` or the exit.
        """
        names = [_check_name(p, "pipeline name") for p in pipelines]
        self.stream(stream)
        held, busy = [], []
        for name in dict.fromkeys(names):
            handle, holder = self._store.try_claim(f"{stream}\0{name}")
            if handle is None:
                busy.append(f"{name!r} (held by {holder})")
            else:
                held.append(handle)
        if busy:
            for handle in held:
                self._store.release_claim(handle)
            raise PipelineBusy(
                f"pipeline(s) {', '.join(busy)} of stream {stream!r} are being run by another process: one process "
                "runs a pipeline name at a time (else both would charge and resume the same pipeline's grants). "
                "Give this run other names (sage serve --pipeline OTHER=..., sage run --name OTHER), or wait until "
                "that process ends")
        claim = PipelineClaim(self._store, held)
        self._claims.append(claim)
        return claim

    def pipelines(self, stream: str) -> list[dict[str, Any]]:
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            return [dict(zip(("name", "state", "outcome", "registered", "finished"), r))
                    for r in tx.all(sql.PIPELINE_ROWS, (stream,))]

    def finish(self, stream: str, pipeline: str, outcome: Outcome | str) -> None:
        """End a pipeline (ACCEPT, REJECT or TIMEOUT); split its unused reservations among those still waiting."""
        if outcome not in OUTCOMES:
            raise LedgerError(f"outcome {outcome!r} is unknown: use one of {', '.join(OUTCOMES)}")
        _check_name(pipeline, "pipeline name")
        with self._store.transaction() as tx:
            s = self.stream(stream, tx)
            row = tx.one(sql.PIPELINE_STATE, (stream, pipeline))
            if row is None:
                raise LedgerError(f"pipeline {pipeline!r} is not registered on stream {stream!r}")
            if row[0] != PipelineState.WAITING:
                raise LedgerError(f"pipeline {pipeline!r} already finished on stream {stream!r}")
            now = time.time()
            tx.run(sql.PIPELINE_FINISH, (outcome, now, stream, pipeline))
            others = [r[0] for r in tx.all(sql.PIPELINE_WAITING, (stream,))]
            moved = _charges.release_reservations(tx, s, pipeline, others)
            self._log(tx, "finish", {"stream": stream, "pipeline": pipeline, "outcome": outcome,
                                     "blocks_released": moved, "to": others}, at=now)
            if s.rules().queued:  # its demand (pending, or admitted and never collected) is withdrawn
                tx.run(sql.DEMAND_DELETE, (stream, pipeline))
                self._schedule(tx, s, s.filter(), time.time())

    # ------------------------------------------------------------------ grants
    def request(self, pipeline: str, stream: str, *, blocks: Sequence[str] | str | None = None,
                window: tuple[float, float] | None = None, epsilon: float | None = None, delta: float = 0.0,
                curve: Any = None, rule: str | None = None, meta: Mapping[str, Any] | None = None,
                split: BudgetSplit | None = None) -> Grant:
        """Check and charge every block atomically; return a signed Grant, or raise BudgetRefused.

        Give ``blocks`` (ids) or ``window`` ((start, end), all active blocks inside).
        Give ``epsilon`` (and ``delta``) for an (epsilon, delta)-DP query, or an RDP
        ``curve`` (values aligned with the stream's orders, an {order: value} map,
        or a dp_accounting DpEvent). Data may be read only after this returns.

        ``split`` (a ``BudgetSplit``, or its dict in ``meta["split"]``) says what each pipeline
        stage may spend; it must compose, under its rule, to at most the charge (refused
        otherwise, nothing charged). Without one the grant is single-stage: ONE stage may
        spend all of it (``release``). ``rule``, if given, must be the split's rule
        ("single" without a split); the grant records it. ``meta["records"]`` (a ``RecordSplit``'s
        dict) says which records each split holds and which side it is on; a grant with a split
        without one gets the default signed (``split.sign_records``).
        """
        _check_name(pipeline, "pipeline name")
        if (blocks is None) == (window is None):
            raise LedgerError("give either blocks or window, not both and not neither")
        if window is not None:
            try:
                start, end = window
            except (TypeError, ValueError):
                raise LedgerError(f"window {window!r} must be a (start, end) pair") from None
            blocks = self.window_blocks(stream, start, end)
        blocks = _blocks.check_block_set(blocks)
        meta, split, rule = grant_terms(meta, split, rule)
        with self._store.transaction() as tx:
            # One statement reads the stream row, the pipeline's state and the log's last entry (what ``_log``
            # chains the grant's entry to): all three as of this write transaction, which is exclusive (SQLite's
            # write lock, PostgreSQL's meta lock row), so nothing read here is from before another writer's commit.
            row = tx.one(sql.STREAM_REQUEST_READ, (stream, pipeline, stream)) if isinstance(stream, str) else None
            if row is None:
                self.stream(stream, tx)  # raises UnknownStream, naming the streams there are
            w = sql.STREAM_WIDTH
            s = parsed_stream(tuple(row[:w]))
            pipeline_state, tx.log_last = row[w], (row[w + 1], row[w + 2]) if row[w + 1] is not None else None
            tx.head_until_use = True  # HeadSync.USE: its head durable before the grant's first use (verify)
            filt = stream_filter(s)
            try:
                check_unit_charge(s, curve)
                if curve is None and epsilon is None:
                    raise ValueError("give epsilon (and delta) or an RDP curve")
                cost = filt.cost(epsilon=epsilon, delta=delta, curve=curve)
            except ValueError as exc:
                raise LedgerError(str(exc)) from None
            found, reservations = _blocks.block_budgets(tx, stream, blocks)
            missing = [b for b in blocks if b not in found]
            if missing:
                raise UnknownBlock(f"unknown block(s) in stream {stream!r}: {', '.join(map(str, missing))}")
            active = BlockState.ACTIVE.value
            retired = [b for b in blocks if found[b][0] != active]
            if retired:
                raise BlockRetired(f"block(s) {', '.join(retired)} of stream {stream!r} are retired "
                                   "(budget exhausted) and are never offered again")
            check_minimum(filt, s, cost, epsilon if curve is None else None)
            if pipeline_state is not None and pipeline_state != PipelineState.WAITING:
                raise LedgerError(f"pipeline {pipeline!r} already finished on stream {stream!r}")
            write, charge = StreamWrite(tx, self._log, self._keys, s, filt), Charge(pipeline, blocks, cost, rule, meta,
                                                                                    split)
            if s.rules().queued:
                if split is not None:  # checked before the demand is recorded: its grant's split must compose
                    split.check_covered(*filt.spendable(cost))
                grant, refusal = _charges.queued_request(write, charge)
            else:
                grant = _charges.charge_now(write, charge, found, reservations)
                refusal = None
        if refusal:  # after the commit: the demand stays recorded, and the scheduler grants it when it fits
            raise BudgetRefused(stream, pipeline, refusal)
        assert grant is not None  # granted now, or refused above
        return grant

    def _schedule(self, tx, s, filt, now):
        """A queued stream's scheduling point (``charges.schedule``), in the caller's write transaction."""
        return _charges.schedule(StreamWrite(tx, self._log, self._keys, s, filt), now)

    # ------------------------------------------------------------ availability
    def available_epsilon(self, pipeline: str, stream: str, blocks: Sequence[str], delta: float = 0.0, *,
                          tolerance: float = 1e-4) -> float:
        """The largest epsilon a (epsilon, delta) request by ``pipeline`` on ALL of ``blocks`` would be granted now.

        A bisection over epsilon in [0, the stream's epsilon], from below, to within
        ``tolerance`` times the stream's epsilon: the answer itself is granted (unless
        another writer spends first). 0.0 if any block is unknown or retired.
        """
        with self._store.transaction(write=False) as tx:
            s = self.stream(stream, tx)
            _charges.check_availability_args(s.filter(), delta, tolerance)
            budgets = _charges.budgets_on_all(tx, s, pipeline, list(blocks), delta)
        if budgets is None:
            return 0.0
        return float(_bisect(lambda eps: budgets.fits(eps[0]).all().reshape(1), 1, s.epsilon, tolerance)[0])

    def available_per_block(self, pipeline: str, stream: str, blocks: Sequence[str] | None = None,
                            delta: float = 0.0, *, tolerance: float = 1e-4) -> dict[str, float]:
        """{block id: the largest epsilon ``pipeline`` could be granted on that block ALONE now}, in ONE read.

        For every block b this equals ``available_epsilon(pipeline, stream, [b], delta,
        tolerance)`` exactly (the same bisection, run on all blocks at once). ``blocks``
        None: every active block of the stream, in key order (time window or shard),
        oldest first. Given ids map in their order; an unknown or retired block maps to
        0.0, as in ``available_epsilon`` (nothing can be granted on it).
        """
        with self._store.transaction(write=False) as tx:
            s = self.stream(stream, tx)
            _charges.check_availability_args(s.filter(), delta, tolerance)
            blocks, active, budgets = _charges.budgets_per_block(tx, s, pipeline, blocks, delta)
        out = dict.fromkeys(blocks, 0.0)
        out.update(zip(active, _bisect(budgets.fits, len(active), s.epsilon, tolerance).tolist()))
        return out

    def _signature_ok(self, body, signature):
        """``signature`` signs ``body``, or a pre-migration grant's body under the old rule (``grants``)."""
        return signature_ok(self._keys, self._legacy_grants, body, signature)

    def private_seed(self, grant_id: str, purpose: str) -> int:
        """A 128-bit seed only trusted code can derive (HMAC under the key ring's noise key). TRUSTED CODE ONLY.

        A DP release made under a grant draws its noise from this seed, so re-running
        the release under the same grant returns the same value (post-processing, no
        extra privacy loss), while the pipeline, which never sees the secret, cannot
        reproduce the noise. A grant made before the ledger's key migration keeps its old seed (the old
        secret's HMAC), so its re-runs still draw the same noise.
        """
        text = f"seed|{grant_id}|{purpose}".encode()
        return self._keys.seed(text, legacy=grant_id in self._legacy_grants)

    def get_grant(self, grant_id: str) -> Grant:
        with self._store.transaction(write=False) as tx:
            return _recorded_grant(grant_id, tx.one(sql.GRANT_BODY, (grant_id,)))

    def grants(self, stream: str | None = None) -> list[Grant]:
        with self._store.transaction(write=False) as tx:
            if stream is None:
                rows = tx.all(sql.GRANT_BODIES)
            else:
                rows = tx.all(sql.GRANT_STREAM_BODIES, (stream,))
        return [Grant.from_row(*row) for row in rows]

    def verify(self, grant: Grant | str | Mapping[str, Any], *, stream: str | None = None,
               epsilon: float | None = None, delta: float | None = None) -> Grant:
        """Check a grant before reading data; return the ledger's copy (its head made durable first: docs/security.md).

        Raises GrantError if the grant is missing, malformed, forged (bad signature
        or altered fields), unknown (never charged by this ledger), of another
        stream, or covers less than ``epsilon``/``delta``.
        """
        if grant is None or grant == "":
            raise GrantError("no grant given: a pipeline reads data only under a grant from the ledger")
        parsed = Grant.from_json(grant)
        if not self._signature_ok(parsed.body(), parsed.signature):
            raise GrantError(f"grant {parsed.id!r} is forged: its signature does not match its contents")
        with self._store.transaction(write=False) as tx:  # the grant's record and a log tail at or after its entry
            stored, last = _recorded_grant(parsed.id, tx.one(sql.GRANT_BODY, (parsed.id,))), tx.one(sql.LOG_LAST)
        check_grant_copy(parsed, stored, stream, epsilon, delta)
        self._head_before_use(last)
        return stored

    def _head_before_use(self, last):
        """The head file durably at or beyond ``last`` (the log's last entry as of the read that found the grant,
        so at or beyond the grant's own entry) before anything is read under the grant (docs/security.md,
        ``HeadSync.USE``). In every mode: the grant may have been made by a process in ``use`` mode, whose head of
        it may still be in slot C only. A ledger that does not match its anchor reads nothing under a grant."""
        self._refuse_unanchored()
        if last is None:
            return
        try:
            self._head.make_durable(self._ledger_id, last[0], last[1])
        except (OSError, LedgerError) as exc:  # as _advance_head: the audit will say the head is behind
            warn_head_write(self._head.path, exc)

    def release(self, grant: Grant | str | Mapping[str, Any], stage: str, computation: str, epsilon: float,
                delta: float = 0.0) -> Release:
        """Open ``stage``'s one release under ``grant``, BEFORE anything is drawn; return a ``Release``.

        A grant pays for one release per stage, of one computation: the first call records the
        computation's fingerprint (``computation``: e.g. a digest of the traced transform graph, of
        the trainer's module and inputs, or of the validated model) with what the stage may spend.
        Afterwards the same stage and computation is re-opened (``Release.reopened``: a re-run draws
        the same noise from the grant's seed, so it releases nothing new), and a different computation
        is refused with GrantError: two releases under one seed would differ by data alone (their
        difference reveals records exactly), and under two seeds they would spend the stage twice.

        What a stage may spend comes from ``privacy/split.py``: its share of the grant's split, or,
        for a single-stage grant (no split), the whole grant for the FIRST stage that opens a release
        and nothing for any other. An ``rdp`` grant made before grants recorded what was asked (its
        epsilon the conversion) is capped at what its cost pays for (``grants.stage_cap``). The check
        and the record are one transaction, appended to the audit log, so two writers cannot both take
        a stage, and the audit recomputes every grant's spend.
        """
        checked = self.verify(grant)
        if stage not in STAGES:
            raise LedgerError(f"stage {stage!r} is unknown: use one of {', '.join(STAGES)}")
        if not isinstance(computation, str) or not 0 < len(computation) <= 256:
            raise LedgerError(f"computation {computation!r} must be a fingerprint string of 1-256 characters")
        epsilon = _finite(epsilon, "release epsilon", allow_none=False, nonnegative=True)
        delta = _finite(delta, "release delta", allow_none=False, nonnegative=True)
        if not delta < 1:
            raise LedgerError(f"release delta {delta!r} is invalid: need 0 <= delta < 1")
        with self._store.transaction() as tx:
            done = {r[0]: r[1:] for r in tx.all(sql.RELEASE_OF_GRANT, (checked.id,))}
            cap = stage_cap(checked, stream_filter(read_stream(tx, checked.stream))) if older_rdp(checked) else None
            reopened = stage_allowance(checked, stage, done, computation, epsilon, delta, cap)
            if reopened is not None:
                return reopened
            now = time.time()
            tx.run(sql.RELEASE_INSERT,
                   (checked.id, stage, checked.stream, checked.pipeline, computation, epsilon, delta, now))
            self._log(tx, "release", {"grant": checked.id, "stream": checked.stream, "pipeline": checked.pipeline,
                                      "stage": stage, "computation": computation, "epsilon": epsilon,
                                      "delta": delta}, at=now)
        return Release(checked.id, stage, computation, epsilon, delta, now, reopened=False)

    def releases(self, grant_id: str | None = None) -> list[Release]:
        """The releases opened so far (all, or one grant's), oldest first."""
        with self._store.transaction(write=False) as tx:
            rows = tx.all(sql.RELEASE_ROWS_OF_GRANT, (grant_id,)) if grant_id else tx.all(sql.RELEASE_ROWS)
        return [Release(*r, reopened=False) for r in rows]  # type: ignore[misc]  # a row is Release's first six

    def draw(self, lifetime_grants, run, epsilon, delta, *, schedule, split=None, meta=None,
             composition=Composition.BASIC):
        """A run grant of ``run`` at (``epsilon``, ``delta``) over ``lifetime_grants`` (one-block grants, in block
        order, each released once under ``schedule``'s fingerprint), charging no block: its budget is drawn from
        theirs, by ``composition``: "basic" (sums of epsilon and delta) or "zcdp" (approximate zCDP through the
        RDP filter), one per lifetime grant (``draws.py``: the rules and their proofs). Asked again with the same
        arguments, the same grant comes back; BudgetRefused / GrantError otherwise, nothing written."""
        return _draws.draw(self._store, self._log, self._keys, self.signature_ok, lifetime_grants, run, epsilon, delta,
                           schedule=schedule, split=split, meta=meta, composition=composition)

    def draws(self) -> list[tuple]:
        """Every draw row: (lifetime grant, run, run grant, stream, epsilon, delta), by run."""
        with self._store.transaction(write=False) as tx:
            return [tuple(r) for r in tx.all(sql.DRAW_ALL)]

    def record_outcome(self, grant_id: str, outcome: Outcome | str, details: Mapping[str, Any] | None = None) -> None:
        """Record what a pipeline run under ``grant_id`` concluded (ACCEPT, REJECT, RETRY, FAILED).

        One outcome per grant, appended to the audit log: with the grants, it is the
        pipeline's iteration history, from which a killed iterator resumes.
        """
        if outcome not in GRANT_OUTCOMES:
            raise LedgerError(f"outcome {outcome!r} is unknown: use {', '.join(GRANT_OUTCOMES)}")
        if details is not None and not isinstance(details, collections.abc.Mapping):
            raise LedgerError(f"outcome details {details!r} must be a dict (or None)")
        details = dict(details or {})
        try:
            details_text = canonical(details)
        except (TypeError, ValueError) as exc:
            raise LedgerError(f"outcome details {details!r} cannot be written as JSON ({exc})") from None
        with self._store.transaction() as tx:
            row = tx.one(sql.GRANT_OWNER, (grant_id,))
            if row is None:
                raise GrantError(f"grant {grant_id!r} is unknown to this ledger")
            if tx.one(sql.OUTCOME_EXISTS, (grant_id,)):
                raise LedgerError(f"grant {grant_id!r} already has an outcome")
            now = time.time()
            tx.run(sql.OUTCOME_INSERT, (grant_id, row[0], row[1], outcome, details_text, now))
            self._log(tx, "outcome", {"grant": grant_id, "stream": row[0], "pipeline": row[1],
                                      "outcome": outcome, "details": details}, at=now)

    def history(self, stream: str, pipeline: str) -> list[tuple[Grant, str | None, Any]]:
        """The pipeline's grants in order, each with its recorded outcome (None while running or killed)."""
        with self._store.transaction(write=False) as tx:
            self.stream(stream, tx)
            rows = tx.all(sql.GRANT_HISTORY, (stream, pipeline))
        return [(Grant.from_row(body, sig), outcome, json.loads(details) if details else None)
                for body, sig, outcome, details in rows]

    # ------------------------------------------------------------------ status
    def status(self, stream: str) -> dict[str, Any]:
        """A JSON-ready summary: the stream's guarantee and each block's spent and remaining budget."""
        s = self.stream(stream)
        return stream_status(s, self.blocks(stream), self._grant_count(stream), self.pipelines(stream))

    def _grant_count(self, stream):
        with self._store.transaction(write=False) as tx:
            return tx.one(sql.GRANT_COUNT, (stream,))[0]

    # ------------------------------------------------------------------- audit
    def _log(self, tx, kind, body, text=None, at=None):
        """Append ``body`` (its canonical text ``text`` if the caller has it) to the chained log at time ``at``
        (default now: the time a row it writes shows, bound by the chain); refused (the write rolled back) on a
        ledger that does not match its anchor (opened with ``check_head=False``)."""
        self._refuse_unanchored()
        self._append(tx, kind, body, text, at)

    def _refuse_unanchored(self):
        """LedgerRollback if this ledger was opened (``check_head=False``) although it does not match its anchor;
        LedgerError if it was opened ``read_only``."""
        if self._read_only:
            raise LedgerError(f"ledger {self._store.display} is opened read-only (the audit): it writes nothing")
        if self.anchor_problem is not None:
            raise LedgerRollback(f"ledger {self._store.display} does not match its anchor ({self.anchor_problem}): "
                                 "it is opened for the audit only, writes nothing and verifies no grant; fix: "
                                 f"{_anchor.fix_text(self._store.display, self._key_source.path)}")

    def _append(self, tx, kind, body, text=None, at=None):
        """``_log`` without the anchor's guard (``reanchor`` writes its entry through it)."""
        # The entry this write transaction logged last is the log's last one (a write transaction is exclusive).
        # ``request`` reads it with the stream row in its own write transaction (``tx.log_last``).
        last = (getattr(tx, "head", None) or getattr(tx, "log_last", None)
                or tx.one(sql.LOG_LAST))
        seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
        text = canonical(body) if text is None else text
        ts = time.time() if at is None else float(at)
        value = self._keys.chain_value(prev, seq, kind, text, ts)
        tx.run(sql.LOG_INSERT, (seq, ts, kind, text, prev, value))
        tx.head = (seq, value)  # written to the head file once the transaction commits

    def log_entries(self) -> list[tuple]:
        with self._store.transaction(write=False) as tx:
            return tx.all(sql.LOG_ALL)

    def audit(self) -> dict[str, Any]:
        """Recompute every block's loss from the log alone; see ``audit.audit_ledger``."""
        return audit_ledger(self)

    # What the audit reads of a ledger (audit.py imports no ledger name: it is handed the ledger).
    @property
    def store(self):
        """The backend store (``store/``): the audit reads every table through it. TRUSTED CODE ONLY."""
        return self._store

    @property
    def head_file(self):
        """The head file outside the database (``head_file.HeadFile``) recording this ledger's last log entry."""
        return self._head

    @property
    def ledger_id(self) -> str:
        return self._ledger_id

    def migration_entry(self) -> dict[str, Any]:
        """The body of the keyed ``keys`` entry a key migration wrote ({} if none, or if it does not verify)."""
        return self._migration_entry()

    def signature_ok(self, body: Mapping[str, Any], signature: str) -> bool:
        """``signature`` is this ledger's signature of the grant ``body`` (or a pre-migration one it lists)."""
        return self._signature_ok(body, signature)
