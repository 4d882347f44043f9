"""The privacy ledger, Sage's block-level access control (paper §3.2-3.3): the ``Ledger`` facade.

Each public method opens one transaction of the store and runs the step modules below it (``streams``,
``blocks``, ``requests``, ``charges``, ``releases``, ``pipelines``, ``trusted_reads``, ``grants``, ``session``,
``opening``), which import neither this module nor the audit; every SQL statement is in ``store/sql.py``.
The guarantee, the allocation rules and the key handling: docs/block_composition.md, "The ledger".
"""
from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import anchor as _anchor
from . import blocks as _blocks
from . import charges as _charges
from . import draws as _draws
from . import migrations as _migrations
from . import opening as _opening
from . import pipelines as _pipelines
from . import releases as _releases
from . import requests as _requests
from . import trusted_reads as _trusted_reads
from .allocation import get_policy
from .audit import AuditReport, audit_ledger
from .blocks import Block  # noqa: F401 (re-exported)
from .chain import GENESIS, canonical, chain_hash  # noqa: F401 (chain_hash: re-exported)
from .checks import check_name as _check_name
from .errors import BudgetRefused, GrantError, LedgerError, LedgerRollback, LedgerUpgradeNeeded
from .grants import Grant, Release, check_grant_copy, grant_terms, older_rdp, signature_ok, stage_cap
from .head_file import HeadFile, HeadSync, head_sync_mode, warn_head_write
from .keys import KeyFileError
from .ledger_reads import LedgerReads, recorded_grant
from .session import PipelineClaim, migrate_secret, migration_entry
from .store import check_location, sql
from .store.base import upgrade_text
from .streams import (  # noqa: F401 (re-exported)
    DEFAULT_MAX_STREAM_EPSILON,
    DEFAULT_MIN_GRANT_EPSILON,
    Stream,
    check_stream_args,
    check_unit,
    insert_stream,
    read_stream,
    stream_filter,
    stream_status,
)
from .vocabulary import PIPELINE_OUTCOMES, Accounting, Composition, Outcome, Policy
from .write import Charge, StreamWrite

if TYPE_CHECKING:
    from .keys import KeyRing
    from .split import BudgetSplit

POLICIES = tuple(Policy)  # members equal their stored strings: "conserve", "aggressive", "dpf-n", ...
OUTCOMES = PIPELINE_OUTCOMES  # "ACCEPT", "REJECT", "TIMEOUT"


class Ledger(LedgerReads):
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
        keys = _opening.key_source(location, key_file, create)
        store = _opening.open_checked_store(location, keys, create, read_only, upgrade)
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

    def record_trusted_read(self, stream: str, blocks: Sequence[str], purpose: str) -> None:
        """Log, in the keyed chain and committed before it returns, that TRUSTED code is about to decrypt
        ``blocks`` of ``stream`` outside any grant (no charge), and why: a ``trusted_read`` entry naming the blocks
        and ``purpose`` (a non-empty text), which ``sage ledger audit`` lists. The block doors call it before they
        derive a key (``ingest.access.trusted_block_keys``). LedgerError / UnknownBlock, nothing written, for an
        empty purpose or a block the stream does not hold."""
        ids = _trusted_reads.check_trusted_read(blocks, purpose)
        with self._store.transaction() as tx:
            self.stream(stream, tx)
            _trusted_reads.log_trusted_read(tx, self._log, stream, ids, purpose)

    # --------------------------------------------------------------- pipelines
    def register(self, stream: str, pipeline: str) -> None:
        """Mark a pipeline as waiting: it gets an even share of every block that arrives from now on."""
        _check_name(pipeline, "pipeline name")
        with self._store.transaction() as tx:
            _pipelines.register_pipeline(tx, self._log, self._keys, self.stream(stream, tx), pipeline)

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
        claim = _pipelines.claim_pipelines(self._store, stream, names)
        self._claims.append(claim)
        return claim

    def finish(self, stream: str, pipeline: str, outcome: Outcome | str) -> None:
        """End a pipeline (ACCEPT, REJECT or TIMEOUT); split its unused reservations among those still waiting."""
        _pipelines.check_finish_outcome(outcome)
        _check_name(pipeline, "pipeline name")
        with self._store.transaction() as tx:
            _pipelines.finish_pipeline(tx, self._log, self._keys, self.stream(stream, tx), pipeline, outcome)

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

        Raises:
            LedgerError: bad arguments, a charge under the grant floor, a finished pipeline (nothing charged).
            UnknownStream, UnknownBlock, BlockRetired: naming the stream or the blocks (nothing charged).
            BudgetRefused: a block cannot pay now (under a queued policy the demand stays recorded).
        """
        _check_name(pipeline, "pipeline name")
        blocks = _requests.requested_ids(blocks, window, lambda start, end: self.window_blocks(stream, start, end))
        meta, split, rule = grant_terms(meta, split, rule)
        with self._store.transaction() as tx:
            s, pipeline_state = _requests.read_request(tx, stream, pipeline)
            filt = stream_filter(s)
            cost = _requests.request_cost(s, filt, epsilon, delta, curve)
            found, reservations = _requests.requested_blocks(tx, stream, blocks)
            _requests.check_request(filt, s, cost, epsilon, curve, pipeline, pipeline_state)
            grant, refusal = _requests.charge_request(StreamWrite(tx, self._log, self._keys, s, filt),
                                                      Charge(pipeline, blocks, cost, rule, meta, split),
                                                      found, reservations)
        if refusal:  # after the commit: the demand stays recorded, and the scheduler grants it when it fits
            raise BudgetRefused(stream, pipeline, refusal)
        assert grant is not None  # granted now, or refused above
        return grant

    # ------------------------------------------------------------------ grants
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
            stored, last = recorded_grant(parsed.id, tx.one(sql.GRANT_BODY, (parsed.id,))), tx.one(sql.LOG_LAST)
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
                delta: float = 0.0, per_unit: str | None = None) -> Release:
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
        a stage, and the audit recomputes every grant's spend. On a unit stream a stage gets the per-row budget
        (epsilon / K), unless ``per_unit`` names the grant's unit column: the stage's mechanism is calibrated to
        the unit itself and may spend its whole share, recorded in the release's entry (``unit_share``).

        Raises:
            GrantError: a bad grant, another computation on the stage, or more than the stage may spend.
            LedgerError: an unknown stage, a bad fingerprint, epsilon or delta (nothing recorded).
        """
        checked = self.verify(grant)
        epsilon, delta = _releases.check_release_args(stage, computation, epsilon, delta)
        with self._store.transaction() as tx:
            cap = stage_cap(checked, stream_filter(read_stream(tx, checked.stream))) if older_rdp(checked) else None
            return _releases.open_release(tx, self._log, checked, stage, computation, epsilon, delta, cap, per_unit)

    def draw(self, lifetime_grants: Sequence[Grant | str], run: int, epsilon: float, delta: float, *, schedule: str,
             split: BudgetSplit | None = None, meta: dict[str, Any] | None = None,
             composition: Composition | str = Composition.BASIC) -> Grant:
        """A run grant of ``run`` at (``epsilon``, ``delta``) over ``lifetime_grants`` (one-block grants, in block
        order, each released once under ``schedule``'s fingerprint), charging no block: its budget is drawn from
        theirs, by ``composition``: "basic" (sums of epsilon and delta) or "zcdp" (approximate zCDP through the
        RDP filter), one per lifetime grant (``draws.py``: the rules and their proofs). Asked again with the same
        arguments, the same grant comes back; BudgetRefused / GrantError otherwise, nothing written."""
        return _draws.draw(self._store, self._log, self._keys, self.signature_ok, lifetime_grants, run, epsilon, delta,
                           schedule=schedule, split=split, meta=meta, composition=composition)

    def record_outcome(self, grant_id: str, outcome: Outcome | str, details: Mapping[str, Any] | None = None) -> None:
        """Record what a pipeline run under ``grant_id`` concluded (ACCEPT, REJECT, RETRY, FAILED).

        One outcome per grant, appended to the audit log: with the grants, it is the
        pipeline's iteration history, from which a killed iterator resumes.
        """
        details, details_text = _pipelines.check_outcome(outcome, details)
        with self._store.transaction() as tx:
            _pipelines.insert_outcome(tx, self._log, grant_id, outcome, details, details_text)

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

    def audit(self) -> AuditReport:
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
