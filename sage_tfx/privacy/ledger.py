"""The privacy ledger, Sage's block-level access control (paper §3.2-3.3): the ``Ledger`` facade.

On ``LedgerBase`` (``ledger_base.py``: store, keys, head file, keyed log), each public method opens one transaction
of the store and runs the step modules below it (``streams``, ``blocks``, ``requests``, ``charges``, ``releases``,
``pipelines``, ``trusted_reads``, ``grants``, ``session``, ``opening``),
which import neither this module nor the audit; every SQL statement is in ``store/sql.py``.
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
from .chain import GENESIS, chain_hash  # noqa: F401 (re-exported)
from .checks import check_name as _check_name
from .errors import BudgetRefused, GrantError, LedgerError
from .grants import Grant, Release, check_grant_copy, grant_terms, older_rdp, stage_cap
from .head_file import HeadSync, head_sync_mode
from .ledger_base import LedgerBase
from .ledger_reads import recorded_grant
from .session import PipelineClaim
from .store import check_location, sql
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
    from .split import BudgetSplit

POLICIES = tuple(Policy)  # members equal their stored strings: "conserve", "aggressive", "dpf-n", ...
OUTCOMES = PIPELINE_OUTCOMES  # "ACCEPT", "REJECT", "TIMEOUT"


class Ledger(LedgerBase):
    """Open with ``Ledger.open(path_or_url, key_file=None)``; ``create=True`` makes a new ledger if none exists.

    Argument order: the stream comes first in the stream-scoped calls (``register(stream, pipeline)``,
    ``finish(stream, pipeline, outcome)``, ``block(stream, block_id)``, ``history(stream, pipeline)``), the
    pipeline first in the pipeline's budget calls (``request(pipeline, stream, ...)``,
    ``available_epsilon(pipeline, stream, blocks)``)."""

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

        Raises:
            GrantError: a bad grant, another computation on the stage, or more than the stage may spend.
            LedgerError: an unknown stage, a bad fingerprint, epsilon or delta (nothing recorded).
        """
        checked = self.verify(grant)
        epsilon, delta = _releases.check_release_args(stage, computation, epsilon, delta)
        with self._store.transaction() as tx:
            cap = stage_cap(checked, stream_filter(read_stream(tx, checked.stream))) if older_rdp(checked) else None
            return _releases.open_release(tx, self._log, checked, stage, computation, epsilon, delta, cap)

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

    def audit(self) -> AuditReport:
        """Recompute every block's loss from the log alone; see ``audit.audit_ledger``."""
        return audit_ledger(self)





